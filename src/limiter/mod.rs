//! [`Limiter`]: named limits plus a store; the framework-free entry point.

use std::{borrow::Cow, fmt, sync::Arc, time::Duration};

pub(crate) use self::deciding::Deciding;
use self::deciding::ProbeGuard;
use crate::{
    Decision, Error, MemoryStore, Quota, RedisStore,
    breaker::{self, Pass},
    decision::{Ends, Stamp, States},
    deny_cache::DenyCache,
    headers::Policies,
    keyspace, metrics,
    per_thread::PerThread,
    store::{Checks, Deadline, KeyHasher, LimitCheck, Store, StoreReply},
};

pub use self::builder::{DEFAULT_DENY_CACHE, LimiterBuilder};

mod admin;
pub(crate) mod builder;
mod deciding;
pub(crate) mod registry;
mod reservation;
mod slots;
mod wait;

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
///
/// # The local deny cache
///
/// A key denied until a known time is denied in process, without a store
/// call, until then: under an attack, most requests cost no Redis round trip.
/// It is on by default, bounded ([`LimiterBuilder::deny_cache`] sets the
/// number of keys; 0 turns it off) and shared by the limiter's clones. The
/// [`MemoryStore`] does not use it: that store decides in process, exactly
/// and as quickly as the cache would answer.
///
/// **It never admits a request the store would deny**: it only ever denies,
/// and everything it does not hold goes to the store. A cached denial for a
/// cost `c` is used only for requests of cost `c` (or more, where every limit
/// is a fixed window and denied it: a larger cost does not lengthen such a
/// wait, but a limit that admitted `c` may deny more, for longer), for the
/// same keys, and only until the denial's `Retry-After` has passed or it is
/// [`deny_cache_max_age`](LimiterBuilder::deny_cache_max_age) old (1 s by
/// default), whichever is sooner. **It can deny a request the store would
/// have allowed** when the store's state changed behind its back: a
/// [`reset`](Limiter::reset) or [`refund`](Limiter::refund) made by another
/// replica (this limiter's own drop its entry for those keys; a reset, or a
/// refund of several keys, such as a global limit's beside a client's,
/// clears the whole cache; a denial of those keys, or for a reset of any,
/// decided before it and answered after it is not cached), an operator who
/// deleted the counter, a quota
/// raised in another process, or Redis losing its data (restart, failover).
/// Such a client is denied for at most the max age after the change, and
/// never longer than the `Retry-After` it was already told. The wait is
/// counted from when the denial reached this process, not from when the
/// store made it, so a cached denial can outlast the store's by the reply's
/// latency (under the [timeout](LimiterBuilder::timeout)); a client that
/// waits out its `Retry-After`, measured from when it got it, is not
/// affected.
///
/// With a sliding window or GCRA limit, a denial of one cost is also dropped
/// when this limiter's store admits another cost for those keys, which
/// lengthens the wait the denial told.
///
/// A cached answer has the status and headers of the denial it repeats, with
/// the waits shortened by the time since. With several limits, another limit
/// may have run out since; the cached answer still denies (rightly), but its
/// `Retry-After` can be shorter than the store would now say, and the
/// request after that wait gets the store's own, longer answer.
///
/// # When the store fails
///
/// Every store call is bounded by the [timeout](LimiterBuilder::timeout).
/// After repeated failures a [circuit breaker](crate::Breaker) stops calling
/// the store for a cool-down and fails checks at once with
/// [`Error::CircuitOpen`], so a dead or hung Redis costs no waiting; then it
/// probes and closes by itself when Redis answers.
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

struct Inner {
    /// Per limit: its quota and `{prefix}:{algo}:{name}:`, built once.
    limits: Box<[(Quota, String)]>,
    policies: Arc<Policies>,
    /// Per thread, a copy of `policies` for the decisions made there.
    thread_policies: PerThread<Policies>,
    /// With several limits: `{<prefix>:<first name>}:`, the shared hash tag.
    shared_tag: Option<String>,
    store: Backend,
    /// With the in-memory store and a lone limit: that limit's prefix,
    /// hashed under the store's secret, which a decision copies and feeds
    /// its client part ([`MemoryStore::key_hasher`]).
    memory_prefix: Option<KeyHasher>,
    timeout: Duration,
    breaker: breaker::State,
    deny_cache: Option<DenyCache>,
    /// Local reservations of the lone limit's keys, if enabled (never for
    /// the in-memory store).
    reservations: Option<reservation::Reservations>,
    /// Every limit is a shadow limit: the middleware denies nothing for it,
    /// not even a request it finds no key for or one the store fails.
    enforces_nothing: bool,
}

/// Where the counts live. The in-memory store is called directly: it decides
/// synchronously, so its decisions need no boxed future.
#[derive(Debug)]
enum Backend {
    Memory(MemoryStore),
    /// Any other store; a [`RedisStore`] is also kept as itself, for
    /// decisions that skip the trait's boxed future and vectors.
    Other(Arc<dyn Store>, Option<RedisStore>),
}

impl Backend {
    fn new<S: Store>(store: S) -> Self {
        let any = &store as &dyn std::any::Any;
        if let Some(memory) = any.downcast_ref::<MemoryStore>() {
            return Backend::Memory(memory.clone());
        }
        let redis = any.downcast_ref::<RedisStore>().cloned();
        Backend::Other(Arc::new(store), redis)
    }
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limits: Vec<_> = self.limits().collect();
        f.debug_struct("Limiter")
            .field("limits", &limits)
            .field("store", &self.inner.store)
            .field("timeout", &self.inner.timeout)
            .field("breaker", &self.inner.breaker)
            .field("deny_cache", &self.inner.deny_cache)
            .field("reservations", &self.inner.reservations)
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
        LimiterBuilder::new(quota)
    }

    /// Checks `key` against every limit and, if `cost` fits in all of them,
    /// spends it in all of them.
    ///
    /// A `cost` of 0 only looks. A denied check spends nothing. A `cost`
    /// above an enforced limit's [capacity](Quota::capacity) is
    /// [`Error::CostExceedsLimit`] without asking the store: no wait could
    /// ever admit it. With the `metrics` feature it is counted as a denial
    /// (`ratelimit_denied_total`) of each limit it exceeds (a shadow
    /// limit's as a shadow denial). Above a
    /// [shadow](LimiterBuilder::shadow_limit)
    /// limit's, the check goes on, and that limit reports a denial (unless
    /// the cost is above [`MAX_LIMIT`](crate::quota::MAX_LIMIT)). Store
    /// failures and the timeout are errors; the layers turn them into their
    /// [`OnStoreError`](crate::OnStoreError) policy.
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

    /// Whether every limit is a [shadow](LimiterBuilder::shadow) limit:
    /// then the middleware denies nothing, whatever fails.
    pub(crate) fn enforces_nothing(&self) -> bool {
        self.inner.enforces_nothing
    }

    /// Decides `cost` for `keys`: one key for every limit, or one per limit.
    ///
    /// In order: the in-memory store decides at once; a cached denial answers
    /// at once; an open circuit breaker fails at once; otherwise one store
    /// call, bounded by the timeout.
    pub(crate) fn decide(&self, keys: &[&[u8]], cost: u64) -> Deciding {
        let inner = &self.inner;
        let done = |r| Deciding::Ready(Some(r));
        let limits = inner.limits.len();
        if keys.len() != 1 && keys.len() != limits {
            let got = keys.len();
            return done(Err(Error::KeyCount { limits, got }));
        }
        let (store, redis) = match &inner.store {
            Backend::Memory(memory) => return done(self.decide_in_memory(memory, keys, cost)),
            Backend::Other(store, redis) => (store, redis),
        };
        // A reserved unit is spent before anything else is asked, and
        // before anything is allocated: the key is built on the stack.
        let mut reserving = inner.reservations.as_ref().filter(|_| cost > 0);
        if let Some(reservations) = reserving {
            if let Err(e) = self.limit_check_quota(0, cost) {
                return done(Err(self.refused(e)));
            }
            let mut key = keyspace::StackKey::new();
            self.write_key(0, keys[0], &mut key);
            let taken = match key.get() {
                Some(key) => reservations.take(key, cost),
                None => reservations.take(self.key_of(0, keys[0]).as_bytes(), cost),
            };
            match taken {
                reservation::Take::Taken(state, refill) => {
                    if refill && let Ok(check) = self.limit_check(0, keys, cost) {
                        reservation::refill_behind(inner, store, check);
                    }
                    return done(Ok(inner.reserved_decision(state, cost)));
                }
                reservation::Take::Short => {}
                // A cold key, or one in its window's last stretch: checked
                // as without reservations.
                reservation::Take::Unreserved => reserving = None,
            }
        }
        let mut checks: Checks = match self.checks(keys, cost) {
            Ok(checks) => checks,
            Err(e) => return done(Err(self.refused(e))),
        };
        // Borrowed for the lookup; after a miss, copied for an insert should
        // the store deny (inline, without an allocation, when short).
        let cache_key = inner.deny_cache.as_ref().map(|cache| {
            let key = match &checks[..] {
                [one] => Cow::Borrowed(one.key.as_str()),
                many => Cow::Owned(
                    many.iter()
                        .map(|c| c.key.as_str())
                        .collect::<Vec<_>>()
                        .join(" "),
                ),
            };
            (cache, key)
        });
        if let Some((cache, key)) = &cache_key
            && let Some(d) = cache.get(key, cost)
        {
            metrics::decision(&d, true);
            tracing::trace!(
                limit = d.policy(),
                "rate limit: denied from the local deny cache"
            );
            return done(Ok(d));
        }
        let cache_key = cache_key.map(|(cache, key)| cache.miss(key.as_bytes()));
        if reserving.is_some() {
            // The breaker is asked by the one request of the key's flight.
            let check = checks.pop().expect("a reserving limiter has one limit");
            let span = tracing::debug_span!("rate_limit", limit = inner.policies.name(0), cost);
            let asked = tokio::time::Instant::now();
            let fut =
                reservation::reserving(inner.clone(), store.clone(), check, cost, cache_key, asked);
            return Deciding::Waiting(Box::pin(tracing::Instrument::instrument(fut, span)));
        }
        // A decision's keys share a hash slot, and so a fault domain.
        let domain = match (redis, checks.first()) {
            (Some(redis), Some(check)) => redis.fault_domain(&check.key),
            (None, Some(check)) => store.fault_domain(&check.key),
            (_, None) => 0,
        };
        let domain = breaker::domain(domain);
        let pass = inner.breaker.pass(domain);
        if pass == Pass::Open {
            metrics::store_error(inner.policies.all_metric_keys());
            return done(Err(Error::CircuitOpen));
        }
        let probe = ProbeGuard {
            inner: inner.clone(),
            domain,
            pass,
            settled: false,
            epoch: 0,
        };
        let span = tracing::debug_span!("rate_limit", limit = inner.policies.name(0), cost);
        match redis {
            Some(redis) => {
                let deadline = Deadline::after(inner.timeout);
                let (states, bounded) = redis.decide_states(checks, cost, deadline);
                probe.settling(states, bounded, cost, cache_key, span)
            }
            None => {
                let states = StoreReply::other(store.decide(checks.into_vec(), cost));
                probe.settling(states, false, cost, cache_key, span)
            }
        }
    }

    /// Limit `i`'s check of `cost` for `keys` (one key for every limit, or
    /// one per limit).
    fn limit_check(&self, i: usize, keys: &[&[u8]], cost: u64) -> Result<LimitCheck, Error> {
        let quota = self.limit_check_quota(i, cost)?;
        Ok(LimitCheck {
            key: self.key_of(i, keys[i.min(keys.len() - 1)]),
            quota,
            shadow: self.inner.policies.is_shadow(i),
        })
    }

    /// Limit `i`'s quota, if `cost` can ever fit in it, or if the limit only
    /// observes ([shadow](LimiterBuilder::shadow_limit)) and `cost` is at
    /// most [`MAX_LIMIT`](crate::quota::MAX_LIMIT): a shadow limit denies
    /// nothing, so its store reports the denial it would make, and the
    /// request goes on.
    fn limit_check_quota(&self, i: usize, cost: u64) -> Result<Quota, Error> {
        let quota = self.inner.limits[i].0;
        if cost > quota.capacity()
            && !(self.inner.policies.is_shadow(i) && cost <= crate::quota::MAX_LIMIT)
        {
            let limit = quota.capacity();
            return Err(Error::CostExceedsLimit { cost, limit });
        }
        Ok(quota)
    }

    /// `e`, a check's error before any store call, once counted if it is
    /// [`Error::CostExceedsLimit`]: a denial of each enforced limit whose
    /// whole quota the cost exceeds, and a shadow denial of each such
    /// shadow limit (the metrics' `limit` labels). Counted here, by the
    /// check, so that business code calling [`check`](Self::check) and the
    /// layers count alike; a [`peek`](Self::peek) decides nothing and counts
    /// nothing. Logging it is the caller's: the layers log it, throttled.
    #[cold]
    fn refused(&self, e: Error) -> Error {
        if let Error::CostExceedsLimit { cost, .. } = e {
            let policies = &self.inner.policies;
            for (i, (quota, _)) in self.inner.limits.iter().enumerate() {
                if cost > quota.capacity() {
                    metrics::cost_exceeds(policies.metric_keys(i), policies.is_shadow(i));
                }
            }
        }
        e
    }

    /// Every limit's check of `cost` for `keys`.
    fn checks<C: FromIterator<LimitCheck>>(&self, keys: &[&[u8]], cost: u64) -> Result<C, Error> {
        match self.inner.limits.len() {
            // The common lone limit, without collecting `Result`s.
            1 => Ok(std::iter::once(self.limit_check(0, keys, cost)?).collect()),
            limits => (0..limits)
                .map(|i| self.limit_check(i, keys, cost))
                .collect(),
        }
    }

    /// The in-memory store decides at once, and it cannot fail or hang: no
    /// deny cache (it would be no faster), no timeout, no breaker, and for a
    /// lone limit no allocation but the key.
    fn decide_in_memory(
        &self,
        memory: &MemoryStore,
        keys: &[&[u8]],
        cost: u64,
    ) -> Result<Decision, Error> {
        let inner = &self.inner;
        let span = tracing::debug_span!("rate_limit", limit = inner.policies.name(0), cost);
        let _entered = span.enter();
        let started = metrics::clock();
        let (states, ends): (States, Ends) = if inner.limits.len() == 1 {
            // The key hashed as it is written, after its prefix, which was
            // hashed once: a decision on a known key allocates nothing.
            let quota = self
                .limit_check_quota(0, cost)
                .map_err(|e| self.refused(e))?;
            let (state, end) = match inner.memory_prefix {
                Some(mut key) => {
                    keyspace::push_client(&mut key, keys[0]);
                    memory.decide_id(key.id(), quota, cost)
                }
                None => memory.decide_one(self.key_of(0, keys[0]).as_bytes(), quota, cost),
            };
            (smallvec::smallvec![state], Ends::One(end))
        } else {
            let checks = self.checks(keys, cost).map_err(|e| self.refused(e))?;
            let (states, ends) = memory.decide_now_at(checks, cost);
            (states.into(), ends)
        };
        metrics::store_latency(inner.policies.metric_keys(0), started);
        inner.conclude(states, cost, None, Some(Stamp::Memory(ends)))
    }

    /// The store key that holds `key`'s count for the first limit, e.g.
    /// `rl:fw:login:{203.0.113.9}` for a limit named `login`, or
    /// `rl:fw:default.5-60000:{203.0.113.9}` for an unnamed 5/min one (an
    /// unnamed limit's quota is part of its key; a named one's is not: see
    /// [`LimiterBuilder::name`]). Hostile or long keys appear hashed.
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
        let mut out = String::with_capacity(prefix.len() + client.len().min(68) + 2);
        self.write_key(limit, client, &mut out);
        out
    }

    /// Writes limit `limit`'s store key for `client` to `out`.
    fn write_key(&self, limit: usize, client: &[u8], out: &mut impl keyspace::KeyBuf) {
        out.push_str(&self.inner.limits[limit].1);
        match self.inner.shared_tag.as_deref() {
            None => keyspace::push_client(out, client),
            Some(tag) => {
                out.push_str(tag);
                keyspace::push_escaped(out, client);
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ConfigError, RAW_KEY_MAX};

    #[test]
    fn builder_rejects_bad_settings() {
        let q = Quota::per_second(1);
        assert!(Limiter::builder(q).prefix("a{b").build().is_err());
        assert!(Limiter::builder(q).name("x y").build().is_err());
        assert!(Limiter::builder(q).timeout(Duration::ZERO).build().is_err());
        // A resend must find the 10 s marker of lua/once.lua.
        let late = Limiter::builder(q).timeout(Duration::from_secs(10)).build();
        assert!(matches!(late, Err(ConfigError::TimeoutTooLong(_))));
        let just = Duration::from_secs(10) - Duration::from_millis(1);
        assert!(Limiter::builder(q).timeout(just).build().is_ok());
        let twice = Limiter::builder(q).name("a").limit("a", q).build();
        assert!(matches!(twice, Err(ConfigError::DuplicateName(_))));
        // A name that spells the unnamed first limit's counter: both limits
        // would spend one key, each undoing the other's spends (on Redis,
        // a DECRBY that left the key at -1 without a TTL).
        let m = Quota::per_minute(5);
        let shared = Limiter::builder(m)
            .limit("default.5-60000", Quota::per_minute(1))
            .build();
        assert!(
            matches!(&shared, Err(ConfigError::DuplicateName(n)) if n == "default.5-60000"),
            "{:?}",
            shared.as_ref().err()
        );
        // Another algorithm's counter is another key.
        let gcra = m.gcra(5).unwrap();
        assert!(
            Limiter::builder(gcra)
                .limit("default.5-60000", m)
                .build()
                .is_ok()
        );
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

    /// A limiter whose prefix and name are as long as they may be: the
    /// longest store keys.
    fn longest_names(quota: Quota) -> Limiter {
        let long = "x".repeat(64);
        let builder = Limiter::builder(quota).prefix(&long).name(&long);
        builder.build().unwrap()
    }

    #[test]
    fn stack_keys_are_the_store_keys() {
        let l = longest_names(Quota::per_second(1));
        let huge = vec![b'y'; 1 << 16];
        for client in [&b"1.2.3.4"[..], b"a}b", &[b'k'; RAW_KEY_MAX], &huge] {
            let mut key = keyspace::StackKey::new();
            l.write_key(0, client, &mut key);
            assert_eq!(key.get(), Some(l.store_key(client).as_bytes()));
        }
    }

    #[tokio::test]
    async fn the_memory_stores_hot_path_counts_under_the_store_key() {
        // A check hashes the key as it writes it, after a prefix hashed
        // once; peek and reset hash the written key. They must agree.
        let l = longest_names(Quota::per_minute(3));
        let huge = vec![b'y'; 1 << 16];
        let clients = [
            &b"1.2.3.4"[..],
            b"",
            b"a}b",
            b"\xff\xfe",
            b"1234567",
            b"12345678",
            &[b'k'; RAW_KEY_MAX],
            &[b'k'; RAW_KEY_MAX + 1],
            &huge,
        ];
        for client in clients {
            assert_eq!(l.check(client, 1).await.unwrap().remaining(), 2);
            assert_eq!(l.peek(client, 1).await.unwrap().remaining(), 2);
            l.reset(client).await.unwrap();
            assert_eq!(l.peek(client, 1).await.unwrap().remaining(), 3);
            assert_eq!(l.check(client, 2).await.unwrap().remaining(), 1);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_memory_store_answers_every_check_itself() {
        // A deny cache would repeat the first denial, "fw" state included,
        // until the "small" window ends; the memory store answers afresh.
        let limiter = Limiter::builder(Quota::per_second(6))
            .name("fw")
            .limit("small", "1/5s".parse().unwrap())
            .build()
            .unwrap();
        assert!(limiter.inner.deny_cache.is_none());
        let mut check = limiter.decide(&[b"k"], 1);
        assert!(check.now().is_some_and(|d| d.unwrap().is_allowed()));
        let denied = limiter.check("k", 1).await.unwrap();
        assert_eq!(denied.limits().next().unwrap().remaining(), 5);
        tokio::time::advance(Duration::from_millis(1500)).await;
        let again = limiter.check("k", 1).await.unwrap();
        assert!(!again.is_allowed());
        let fw = again.limits().next().unwrap();
        assert_eq!(
            (fw.remaining(), fw.reset_after()),
            (6, Duration::from_secs(1))
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

    /// A shadow limit denies nothing, not even a cost it could never hold:
    /// the request is admitted by the enforced limits, and the shadow limit
    /// reports its denial. (It was `CostExceedsLimit`, a 429 in the layers.)
    #[tokio::test]
    async fn a_cost_above_a_shadow_limit_is_a_shadow_denial() {
        let l = Limiter::builder(Quota::per_minute(100))
            .limit("small", Quota::per_minute(5))
            .shadow_limit("small")
            .build()
            .unwrap();
        let d = l.check("k", 10).await.unwrap();
        assert!(d.is_allowed() && d.is_shadow_denied(), "{d:?}");
        // The enforced limit spent the 10: 90 more fit, then none.
        assert!(l.check("k", 90).await.unwrap().is_allowed());
        assert!(!l.check("k", 1).await.unwrap().is_allowed());
        // A limiter in shadow mode as a whole, too.
        let all = Limiter::builder(Quota::per_minute(5))
            .shadow(true)
            .build()
            .unwrap();
        let d = all.check("k", 10).await.unwrap();
        assert!(d.is_allowed() && d.is_shadow_denied(), "{d:?}");
        assert!(matches!(
            all.check("k", crate::quota::MAX_LIMIT + 1).await,
            Err(Error::CostExceedsLimit { .. })
        ));
    }
}
