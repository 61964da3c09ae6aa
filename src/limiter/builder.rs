//! [`LimiterBuilder`]: limits, store, timeout, breaker, deny cache, shadow.

use std::{sync::Arc, time::Duration};

use super::{Backend, DEFAULT_TIMEOUT, Inner, Limiter};
use crate::{
    Breaker, ConfigError, MemoryStore, Quota, breaker, deny_cache::DenyCache, headers::Policies,
    keyspace, store::Store,
};

/// The deny cache's default capacity, in denied keys.
pub const DEFAULT_DENY_CACHE: usize = 10_000;

/// Builds a [`Limiter`]; start with [`Limiter::builder`].
/// Builds a [`Limiter`]; start with [`Limiter::builder`].
#[must_use]
#[derive(Debug)]
pub struct LimiterBuilder {
    limits: Vec<(String, Quota)>,
    prefix: String,
    store: Option<Backend>,
    timeout: Duration,
    breaker: Breaker,
    deny_cache: usize,
    shadow_all: bool,
    shadow: Vec<String>,
}

impl LimiterBuilder {
    pub(super) fn new(quota: Quota) -> Self {
        Self {
            limits: vec![("default".into(), quota)],
            prefix: "rl".into(),
            store: None,
            timeout: DEFAULT_TIMEOUT,
            breaker: Breaker::default(),
            deny_cache: DEFAULT_DENY_CACHE,
            shadow_all: false,
            shadow: Vec::new(),
        }
    }

    /// The circuit breaker in front of the store (default: [`Breaker::new`];
    /// [`Breaker::disabled`] turns it off).
    pub fn breaker(mut self, breaker: Breaker) -> Self {
        self.breaker = breaker;
        self
    }

    /// The local deny cache's capacity in denied keys (default
    /// [`DEFAULT_DENY_CACHE`]); 0 turns it off. Only stores outside the
    /// process use it, not the [`MemoryStore`]. See
    /// [`deny cache`](crate::Limiter#the-local-deny-cache).
    pub fn deny_cache(mut self, capacity: usize) -> Self {
        self.deny_cache = capacity;
        self
    }

    /// Shadow (dry-run) mode for every limit: decisions are made, counted,
    /// logged and reported in headers, but nothing is denied. Each limit then
    /// spends only what it admits, independently of the others.
    pub fn shadow(mut self, enabled: bool) -> Self {
        self.shadow_all = enabled;
        self
    }

    /// Shadow (dry-run) mode for the limit called `name` only: it is decided
    /// and reported, but its denial blocks nothing.
    pub fn shadow_limit(mut self, name: impl Into<String>) -> Self {
        self.shadow.push(name.into());
        self
    }

    /// The store: a [`RedisStore`](crate::RedisStore), a
    /// [`MemoryStore`] (the default), or your own.
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = Some(Backend::new(store));
        self
    }

    /// The first limit's name, used in `RateLimit` headers and in store keys
    /// (default `"default"`). Limiters with the same prefix, limits and names
    /// share counters.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.limits[0].0 = name.into();
        self
    }

    /// Adds a limit: every check must fit in it too. Names must differ.
    pub fn limit(mut self, name: impl Into<String>, quota: Quota) -> Self {
        self.limits.push((name.into(), quota));
        self
    }

    /// The store key prefix (default `"rl"`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The bound on every store call (default [`DEFAULT_TIMEOUT`], 200 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Builds the limiter, checking the names, prefix and timeout.
    pub fn build(self) -> Result<Limiter, ConfigError> {
        keyspace::validate("prefix", &self.prefix)?;
        for (i, (name, _)) in self.limits.iter().enumerate() {
            keyspace::validate("name", name)?;
            if self.limits[..i].iter().any(|(n, _)| n == name) {
                return Err(ConfigError::DuplicateName(name.clone()));
            }
        }
        if self.timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        if let Some(unknown) = self
            .shadow
            .iter()
            .find(|s| !self.limits.iter().any(|(n, _)| n == *s))
        {
            return Err(ConfigError::UnknownLimit(unknown.clone()));
        }
        let shadow = self
            .limits
            .iter()
            .map(|(n, _)| self.shadow_all || self.shadow.contains(n));
        let limits = self.limits.iter().map(|(name, quota)| {
            let algo = quota.algorithm().key_name();
            (*quota, format!("{}:{algo}:{name}:", self.prefix))
        });
        let shared_tag =
            (self.limits.len() > 1).then(|| format!("{{{}:{}}}:", self.prefix, self.limits[0].0));
        let store = self
            .store
            .unwrap_or_else(|| Backend::Memory(MemoryStore::new()));
        // The in-memory store has no use for a deny cache.
        let deny_cache = (self.deny_cache > 0 && !matches!(store, Backend::Memory(_)))
            .then(|| DenyCache::new(self.deny_cache));
        Ok(Limiter {
            inner: Arc::new(Inner {
                limits: limits.collect(),
                policies: Arc::new(Policies::new(&self.limits).with_shadow(shadow.collect())),
                shared_tag,
                store,
                timeout: self.timeout,
                breaker: breaker::State::new(self.breaker),
                deny_cache,
            }),
        })
    }
}
