//! [`Limiter`]: a quota plus a store; the framework-free entry point.

use std::{fmt, sync::Arc, time::Duration};

use crate::{
    ConfigError, Decision, Error, MemoryStore, Quota,
    headers::Policy,
    keyspace,
    store::{BoxFuture, Store},
};

/// The default bound on every store call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(200);

/// Checks keys against a [`Quota`] in a [`Store`], one atomic decision each.
///
/// Clones are cheap and share one `Arc` of state. Use it directly from
/// business code, or hand it to [`RateLimitLayer`](crate::RateLimitLayer).
/// Needs a Tokio runtime (for the store timeout).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use redis_ratelimit::{Limiter, Quota};
///
/// // 3 coupons per user per day, in memory (see RedisStore for Redis).
/// let limiter = Limiter::builder("3/1d".parse()?)
///     .name("coupons")
///     .prefix("shop")
///     .timeout(Duration::from_millis(100))
///     .build()?;
/// for _ in 0..3 {
///     assert!(limiter.check("user:42", 1).await?.is_allowed());
/// }
/// let denied = limiter.check("user:42", 1).await?;
/// assert!(!denied.is_allowed());
/// assert_eq!(limiter.store_key("user:42"), "shop:fw:coupons:{user:42}");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

struct Inner {
    quota: Quota,
    policy: Arc<Policy>,
    /// `{prefix}:fw:{name}:`, built once.
    key_prefix: String,
    store: Arc<dyn Store>,
    timeout: Duration,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("quota", &self.inner.quota)
            .field("name", &self.inner.policy.name())
            .field("key_prefix", &self.inner.key_prefix)
            .field("store", &self.inner.store)
            .field("timeout", &self.inner.timeout)
            .finish()
    }
}

impl Limiter {
    /// A limiter with default settings and an in-memory store.
    pub fn new(quota: Quota) -> Self {
        Self::builder(quota)
            .build()
            .expect("the default limiter settings are valid")
    }

    /// Starts a [`LimiterBuilder`].
    pub fn builder(quota: Quota) -> LimiterBuilder {
        LimiterBuilder {
            quota,
            name: "default".into(),
            prefix: "rl".into(),
            store: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Checks `key` and, if `cost` fits in the current window, spends it.
    ///
    /// A `cost` of 0 only looks. A denied check spends nothing. A `cost`
    /// above the quota's limit is [`Error::CostExceedsLimit`] without asking
    /// the store. Store failures and the timeout are errors; the tower layer
    /// turns them into its [`OnStoreError`](crate::OnStoreError) policy.
    pub async fn check<K: AsRef<[u8]> + ?Sized>(
        &self,
        key: &K,
        cost: u64,
    ) -> Result<Decision, Error> {
        self.decide(key.as_ref(), cost).await
    }

    /// The same as [`check`](Self::check), as a `'static` future.
    pub(crate) fn decide(
        &self,
        key: &[u8],
        cost: u64,
    ) -> BoxFuture<'static, Result<Decision, Error>> {
        let inner = &self.inner;
        let quota = inner.quota;
        if cost > quota.limit() {
            let err = Error::CostExceedsLimit {
                cost,
                limit: quota.limit(),
            };
            return Box::pin(std::future::ready(Err(err)));
        }
        let state = inner.store.fixed_window(
            self.store_key_bytes(key),
            quota.limit(),
            quota.window_ms(),
            cost,
        );
        let (timeout, policy) = (inner.timeout, inner.policy.clone());
        Box::pin(async move {
            let state = tokio::time::timeout(timeout, state)
                .await
                .map_err(|_| Error::Timeout(timeout))??;
            let reset = Duration::from_millis(state.ttl_ms);
            Ok(Decision::new(
                state.allowed,
                quota,
                state.count,
                reset,
                policy,
            ))
        })
    }

    /// The store key that holds `key`'s counter, e.g.
    /// `rl:fw:default:{203.0.113.9}`; hostile or long keys appear hashed.
    pub fn store_key<K: AsRef<[u8]> + ?Sized>(&self, key: &K) -> String {
        self.store_key_bytes(key.as_ref())
    }

    fn store_key_bytes(&self, key: &[u8]) -> String {
        let mut out = String::with_capacity(self.inner.key_prefix.len() + key.len().min(68) + 2);
        out.push_str(&self.inner.key_prefix);
        keyspace::push_client(&mut out, key);
        out
    }

    /// The quota.
    pub fn quota(&self) -> Quota {
        self.inner.quota
    }

    /// The policy name reported in the `RateLimit` headers.
    pub fn name(&self) -> &str {
        self.inner.policy.name()
    }
}

/// Builds a [`Limiter`]; start with [`Limiter::builder`].
#[must_use]
#[derive(Debug)]
pub struct LimiterBuilder {
    quota: Quota,
    name: String,
    prefix: String,
    store: Option<Arc<dyn Store>>,
    timeout: Duration,
}

impl LimiterBuilder {
    /// The store: a [`RedisStore`](crate::RedisStore), a
    /// [`MemoryStore`] (the default), or your own.
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = Some(Arc::new(store));
        self
    }

    /// The policy name, used in `RateLimit` headers and in store keys
    /// (default `"default"`). Limiters with the same prefix and name share
    /// counters.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
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

    /// Builds the limiter, checking the name, prefix and timeout.
    pub fn build(self) -> Result<Limiter, ConfigError> {
        keyspace::validate("prefix", &self.prefix)?;
        keyspace::validate("name", &self.name)?;
        if self.timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        let key_prefix = format!("{}:fw:{}:", self.prefix, self.name);
        Ok(Limiter {
            inner: Arc::new(Inner {
                quota: self.quota,
                policy: Arc::new(Policy::new(&self.name, self.quota)),
                key_prefix,
                store: self.store.unwrap_or_else(|| Arc::new(MemoryStore::new())),
                timeout: self.timeout,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_rejects_bad_settings() {
        let q = Quota::per_second(1);
        assert!(Limiter::builder(q).prefix("a{b").build().is_err());
        assert!(Limiter::builder(q).name("x y").build().is_err());
        assert!(Limiter::builder(q).timeout(Duration::ZERO).build().is_err());
    }

    #[test]
    fn store_keys_are_prefixed_tagged_and_bounded() {
        let l = Limiter::builder(Quota::per_second(1))
            .prefix("app")
            .name("api")
            .build()
            .unwrap();
        assert_eq!(l.store_key("1.2.3.4"), "app:fw:api:{1.2.3.4}");
        let huge = l.store_key(&vec![b'x'; 1 << 20]);
        assert!(huge.len() < 100, "{huge}");
    }

    #[tokio::test]
    async fn cost_above_limit_is_an_error_and_consumes_nothing() {
        let l = Limiter::new(Quota::per_minute(3));
        let err = l.check("k", 4).await.unwrap_err();
        assert!(
            matches!(err, Error::CostExceedsLimit { cost: 4, limit: 3 }),
            "{err}"
        );
        assert_eq!(l.check("k", 3).await.unwrap().remaining(), 0);
    }
}
