//! [`Limiter`]: named limits plus a store; the framework-free entry point.

use std::{fmt, sync::Arc, time::Duration};

use crate::{
    ConfigError, Decision, Error, MemoryStore, Quota,
    headers::Policies,
    keyspace,
    store::{BoxFuture, LimitCheck, Store},
};

/// The default bound on every store call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(200);

/// Checks keys against one or more named limits in a [`Store`], one atomic
/// decision each.
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
///
/// Several limits are decided together, all or nothing: a request denied by
/// one limit spends nothing in the others. Each limit may count a different
/// key ([`check_each`](Self::check_each)):
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use redis_ratelimit::{Limiter, Quota};
///
/// let coupons = Limiter::builder(Quota::per_day(1))
///     .name("per-user-day")
///     .limit("total", Quota::per_day(2))
///     .build()?;
/// assert!(coupons.check_each(&["alice", "all"], 1).await?.is_allowed());
/// // Alice's daily coupon is spent: denied, and the total is untouched...
/// let again = coupons.check_each(&["alice", "all"], 1).await?;
/// assert_eq!(again.policy(), "per-user-day");
/// // ...so Bob still gets the last one.
/// assert!(coupons.check_each(&["bob", "all"], 1).await?.is_allowed());
/// assert!(!coupons.check_each(&["carol", "all"], 1).await?.is_allowed());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

struct Inner {
    /// Per limit: its quota and `{prefix}:{algo}:{name}:`, built once.
    limits: Box<[(Quota, String)]>,
    policies: Arc<Policies>,
    /// With several limits: `{<prefix>:<first name>}:`, the shared hash tag.
    shared_tag: Option<String>,
    store: Arc<dyn Store>,
    timeout: Duration,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limits: Vec<_> = self.limits().collect();
        f.debug_struct("Limiter")
            .field("limits", &limits)
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

    /// Starts a [`LimiterBuilder`] whose first limit, named `"default"`, has
    /// `quota`.
    pub fn builder(quota: Quota) -> LimiterBuilder {
        LimiterBuilder {
            limits: vec![("default".into(), quota)],
            prefix: "rl".into(),
            store: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Checks `key` against every limit and, if `cost` fits in all of them,
    /// spends it in all of them.
    ///
    /// A `cost` of 0 only looks. A denied check spends nothing. A `cost`
    /// above a limit's [capacity](Quota::capacity) is
    /// [`Error::CostExceedsLimit`] without asking the store: no wait could
    /// ever admit it. Store failures and the timeout are errors; the layers
    /// turn them into their [`OnStoreError`](crate::OnStoreError) policy.
    pub async fn check<K: AsRef<[u8]> + ?Sized>(
        &self,
        key: &K,
        cost: u64,
    ) -> Result<Decision, Error> {
        self.decide(&[key.as_ref()], cost).await
    }

    /// Like [`check`](Self::check), with one key per limit, in the order
    /// the limits were added (say an IP, an API key and `"global"`).
    ///
    /// Passing a number of keys other than one per limit is
    /// [`Error::KeyCount`].
    pub async fn check_each<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
        cost: u64,
    ) -> Result<Decision, Error> {
        let keys: Vec<&[u8]> = keys.iter().map(AsRef::as_ref).collect();
        self.decide(&keys, cost).await
    }

    /// Decides `cost` for `keys`: one key for every limit, or one per limit.
    pub(crate) fn decide(
        &self,
        keys: &[&[u8]],
        cost: u64,
    ) -> BoxFuture<'static, Result<Decision, Error>> {
        let inner = &self.inner;
        let fail = |e| -> BoxFuture<'static, _> { Box::pin(std::future::ready(Err(e))) };
        let limits = inner.limits.len();
        if keys.len() != 1 && keys.len() != limits {
            let got = keys.len();
            return fail(Error::KeyCount { limits, got });
        }
        let mut checks = Vec::with_capacity(limits);
        for (i, (quota, _)) in inner.limits.iter().enumerate() {
            if cost > quota.capacity() {
                let limit = quota.capacity();
                return fail(Error::CostExceedsLimit { cost, limit });
            }
            let key = self.key_of(i, keys[i.min(keys.len() - 1)]);
            checks.push(LimitCheck { key, quota: *quota });
        }
        let states = inner.store.decide(checks, cost);
        let (timeout, policies) = (inner.timeout, inner.policies.clone());
        Box::pin(async move {
            let states = tokio::time::timeout(timeout, states)
                .await
                .map_err(|_| Error::Timeout(timeout))??;
            if states.len() != limits {
                let reply = format!("{} states for {limits} limits", states.len());
                return Err(Error::UnexpectedReply(reply));
            }
            Ok(Decision::new(states, policies))
        })
    }

    /// The store key that holds `key`'s count for the first limit, e.g.
    /// `rl:fw:default:{203.0.113.9}`; hostile or long keys appear hashed.
    pub fn store_key<K: AsRef<[u8]> + ?Sized>(&self, key: &K) -> String {
        self.key_of(0, key.as_ref())
    }

    /// The store keys of `key` for every limit, in order. With several limits
    /// they share the limiter's hash tag: `rl:fw:second:{rl:second}:alice`.
    pub fn store_keys<K: AsRef<[u8]> + ?Sized>(&self, key: &K) -> Vec<String> {
        let n = self.inner.limits.len();
        (0..n).map(|i| self.key_of(i, key.as_ref())).collect()
    }

    fn key_of(&self, limit: usize, client: &[u8]) -> String {
        let prefix = &self.inner.limits[limit].1;
        let tag = self.inner.shared_tag.as_deref().unwrap_or("");
        let mut out = String::with_capacity(prefix.len() + tag.len() + client.len().min(68) + 2);
        out.push_str(prefix);
        if tag.is_empty() {
            keyspace::push_client(&mut out, client);
        } else {
            out.push_str(tag);
            keyspace::push_escaped(&mut out, client);
        }
        out
    }

    /// The first limit's quota.
    pub fn quota(&self) -> Quota {
        self.inner.limits[0].0
    }

    /// The first limit's name, as reported in the `RateLimit` headers.
    pub fn name(&self) -> &str {
        self.inner.policies.name(0)
    }

    /// Every limit's name and quota, in order.
    pub fn limits(&self) -> impl Iterator<Item = (&str, Quota)> {
        let p = &self.inner.policies;
        (0..self.inner.limits.len()).map(|i| (p.name(i), p.quota(i)))
    }
}

/// Builds a [`Limiter`]; start with [`Limiter::builder`].
#[must_use]
#[derive(Debug)]
pub struct LimiterBuilder {
    limits: Vec<(String, Quota)>,
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
        let limits = self.limits.iter().map(|(name, quota)| {
            let algo = quota.algorithm().key_name();
            (*quota, format!("{}:{algo}:{name}:", self.prefix))
        });
        let shared_tag =
            (self.limits.len() > 1).then(|| format!("{{{}:{}}}:", self.prefix, self.limits[0].0));
        Ok(Limiter {
            inner: Arc::new(Inner {
                limits: limits.collect(),
                policies: Arc::new(Policies::new(&self.limits)),
                shared_tag,
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
        let twice = Limiter::builder(q).name("a").limit("a", q).build();
        assert!(matches!(twice, Err(ConfigError::DuplicateName(_))));
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
        let multi = Limiter::builder(Quota::per_second(1))
            .name("second")
            .limit("day", Quota::per_day(9).sliding_window())
            .build()
            .unwrap();
        assert_eq!(
            multi.store_keys("a{b}"),
            [
                "rl:fw:second:{rl:second}:#b8a4b706093b9c712e002b1b283c048684d27813032ba14c3a07f3508e3321d6",
                "rl:sw:day:{rl:second}:#b8a4b706093b9c712e002b1b283c048684d27813032ba14c3a07f3508e3321d6",
            ]
        );
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
