//! [`LimiterBuilder`]: limits, store, timeout, breaker, deny cache, shadow.

use std::{sync::Arc, time::Duration};

use super::{Backend, DEFAULT_TIMEOUT, Inner, Limiter};
use crate::{
    Breaker, ConfigError, MemoryStore, Quota, breaker, deny_cache::DenyCache, headers::Policies,
    keyspace, store::Store,
};

/// The deny cache's default capacity, in denied keys.
pub const DEFAULT_DENY_CACHE: usize = 10_000;

/// The longest the local deny cache repeats a denial by default: 1 s.
const DEFAULT_DENY_CACHE_MAX_AGE: Duration = Duration::from_secs(1);

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
    deny_cache_max_age: Duration,
    shadow_all: bool,
    shadow: Vec<String>,
    /// Whether the first limit was named with [`name`](Self::name).
    named: bool,
    share_counters: bool,
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
            deny_cache_max_age: DEFAULT_DENY_CACHE_MAX_AGE,
            shadow_all: false,
            shadow: Vec::new(),
            named: false,
            share_counters: false,
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

    /// The longest the local deny cache repeats a denial without asking the
    /// store (default 1 s), however long the
    /// denial's `Retry-After`. It bounds how long a change the cache cannot
    /// see (a [`reset`](Limiter::reset) or [`refund`](Limiter::refund) by
    /// another replica, a raised quota) goes unnoticed; shorter costs more
    /// store calls under attack. [`Duration::ZERO`] caches nothing. See
    /// [`deny cache`](crate::Limiter#the-local-deny-cache).
    pub fn deny_cache_max_age(mut self, max_age: Duration) -> Self {
        self.deny_cache_max_age = max_age;
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
    /// (default `"default"`).
    ///
    /// # Which counters a limit uses
    ///
    /// A limit's counters are keyed by the prefix, the algorithm and its
    /// **store name** (see [`Limiter::store_key`]):
    ///
    /// - a limit **named** here or with [`limit`](Self::limit) is keyed by
    ///   its name alone: `rl:fw:login:{203.0.113.9}`. Change its quota (a
    ///   rolling deploy from 5/min to 10/min) and the replicas, old and new,
    ///   keep counting on the same counter;
    /// - the first limit **left unnamed** is keyed by its quota too:
    ///   `rl:fw:default.5-60000:{203.0.113.9}` (count, then window in ms,
    ///   then `-b` and the burst for GCRA). So two unnamed limiters of
    ///   different quotas (a 5/min login route and a 100/min search route on
    ///   one store) never share a counter; its headers still say `default`.
    ///
    /// In one process, building a limiter whose counters a **live** limiter
    /// on the same store already uses (the same prefix, algorithm and store
    /// name; clones of one [`MemoryStore`] or
    /// [`RedisStore`](crate::RedisStore) are the same store) fails with
    /// [`ConfigError::SharedCounters`]. To share on purpose, clone the
    /// limiter (clones share everything), or opt in with
    /// [`share_counters`](Self::share_counters). Dropping every clone of a
    /// limiter frees its names. Replicas (other processes) share counters
    /// by using the same names, as they should.
    ///
    /// ```
    /// use redis_ratelimit::{ConfigError, Limiter, MemoryStore, Quota};
    ///
    /// let store = MemoryStore::new();
    /// let login = Limiter::builder(Quota::per_minute(5)).store(store.clone()).build()?;
    /// let search = Limiter::builder(Quota::per_minute(100)).store(store.clone()).build()?;
    /// assert_ne!(login.store_key("1.2.3.4"), search.store_key("1.2.3.4"));
    ///
    /// let again = Limiter::builder(Quota::per_minute(5)).store(store.clone()).build();
    /// assert!(matches!(again, Err(ConfigError::SharedCounters(_))));
    /// let shared = Limiter::builder(Quota::per_minute(5))
    ///     .store(store)
    ///     .share_counters()
    ///     .build()?;
    /// assert_eq!(shared.store_key("1.2.3.4"), login.store_key("1.2.3.4"));
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.limits[0].0 = name.into();
        self.named = true;
        self
    }

    /// Lets this limiter use counters that another live limiter on the same
    /// store already uses, on purpose (see [`name`](Self::name)); without
    /// it, that is [`ConfigError::SharedCounters`].
    pub fn share_counters(mut self) -> Self {
        self.share_counters = true;
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
        let limits: Vec<_> = self
            .limits
            .iter()
            .enumerate()
            .map(|(i, (name, quota))| {
                let algo = quota.algorithm().key_name();
                let name = match i == 0 && !self.named {
                    true => unnamed(name, *quota),
                    false => name.clone(),
                };
                (*quota, format!("{}:{algo}:{name}:", self.prefix))
            })
            .collect();
        let first = match self.named {
            true => self.limits[0].0.clone(),
            false => unnamed(&self.limits[0].0, self.limits[0].1),
        };
        let shared_tag = (self.limits.len() > 1).then(|| format!("{{{}:{first}}}:", self.prefix));
        // What the guard compares: each limit's keys up to the client part.
        let counters: Vec<String> = limits
            .iter()
            .map(|(_, p)| format!("{p}{}", shared_tag.as_deref().unwrap_or("")))
            .collect();
        let store = self
            .store
            .unwrap_or_else(|| Backend::Memory(MemoryStore::new()));
        // The in-memory store has no use for a deny cache.
        let deny_cache = (self.deny_cache > 0 && !matches!(store, Backend::Memory(_)))
            .then(|| DenyCache::new(self.deny_cache, self.deny_cache_max_age));
        let instance = match &store {
            Backend::Memory(memory) => memory.instance(),
            Backend::Other(store) => store.instance(),
        };
        let inner = Arc::new(Inner {
            limits: limits.into(),
            policies: Arc::new(Policies::new(&self.limits).with_shadow(shadow.collect())),
            shared_tag,
            store,
            timeout: self.timeout,
            breaker: breaker::State::new(self.breaker),
            deny_cache,
        });
        if let Some(instance) = instance {
            super::registry::register(instance, &counters, self.share_counters, &inner)?;
        }
        Ok(Limiter { inner })
    }
}

/// The store name of an unnamed limit: its name and its quota, so that
/// unnamed limits of different quotas never share counters.
fn unnamed(name: &str, quota: Quota) -> String {
    let mut out = format!("{name}.{}-{}", quota.limit(), quota.window_ms());
    if let crate::Algorithm::Gcra { burst } = quota.algorithm() {
        out.push_str(&format!("-b{burst}"));
    }
    out
}
