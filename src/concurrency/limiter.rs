//! [`ConcurrencyLimiter`]: a concurrency limit plus a lease store; the
//! framework-free entry point.

use std::{fmt, sync::Arc, time::Duration};

use tokio::{runtime::Handle, time::Instant};

use super::{
    headers::Policy,
    lease::{Acquired, Busy, Lease, next_token, release_quietly},
};
use crate::{
    Breaker, ConfigError, DEFAULT_TIMEOUT, Error, MemoryStore,
    breaker::{self, Pass},
    keyspace, metrics,
    quota::{MAX_LIMIT, MAX_WINDOW},
    store::{BoxFuture, LeaseState, LeaseStore},
};

/// How long a lease lives unless renewed, by default.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The `Retry-After` a refused request is given, by default.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The shortest lease, whatever the timeout.
const MIN_LEASE: Duration = Duration::from_millis(3);

/// Allows at most `limit` leases per key at once, across every replica that
/// shares the store: a distributed semaphore.
///
/// [`acquire`](Self::acquire) either grants a [`Lease`], which holds one slot
/// until it is released or dropped, or reports the key [`Busy`]. Leases
/// expire after the lease time (default [`DEFAULT_LEASE`], 30 s) unless
/// renewed, and a lease renews itself in the background every third of that
/// time for as long as it is held, so a crashed holder frees its slot within
/// one lease time while a long-running holder keeps it.
///
/// After repeated store failures a [circuit breaker](crate::Breaker), as the
/// rate limiter's, stops calling the store for a while: acquires fail at
/// once with [`Error::CircuitOpen`] instead of each waiting for the timeout.
/// Renewals and releases are always sent.
///
/// Clones are cheap and share one `Arc` of state. Needs a Tokio runtime (for
/// the timeout, renewals and releases on drop).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use redis_ratelimit::concurrency::{Acquired, ConcurrencyLimiter};
///
/// // At most 2 reports per tenant at once, in memory (RedisStore for Redis).
/// let limiter = ConcurrencyLimiter::builder(2).name("reports").build()?;
/// let first = limiter.acquire("tenant:7").await?.lease().unwrap();
/// let second = limiter.acquire("tenant:7").await?.lease().unwrap();
/// assert_eq!(second.remaining(), 0);
/// let Acquired::Busy(busy) = limiter.acquire("tenant:7").await? else { panic!() };
/// assert_eq!(busy.in_flight(), 2);
///
/// assert!(first.release().await?); // or drop it: the release is spawned
/// assert!(limiter.acquire("tenant:7").await?.is_acquired());
/// # drop(second);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ConcurrencyLimiter {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) policy: Arc<Policy>,
    /// `{prefix}:cc:{name}:`, built once.
    key_prefix: String,
    pub(super) store: Arc<dyn LeaseStore>,
    pub(super) lease: Duration,
    pub(super) timeout: Duration,
    retry_after: Duration,
    breaker: breaker::State,
    /// Its `limit` label: the limiter's name.
    pub(super) metrics: metrics::Keys,
}

impl Inner {
    pub(super) fn lease_ms(&self) -> u64 {
        self.lease.as_millis() as u64
    }
}

impl fmt::Debug for ConcurrencyLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &self.inner;
        f.debug_struct("ConcurrencyLimiter")
            .field("limit", &inner.policy.limit())
            .field("name", &inner.policy.name())
            .field("key_prefix", &inner.key_prefix)
            .field("store", &inner.store)
            .field("lease", &inner.lease)
            .field("timeout", &inner.timeout)
            .field("retry_after", &inner.retry_after)
            .field("breaker", &inner.breaker)
            .finish()
    }
}

impl ConcurrencyLimiter {
    /// A limiter of `limit` leases per key with default settings and an
    /// in-memory store.
    ///
    /// # Panics
    /// If `limit` is 0 or above [`MAX_LIMIT`]; use [`builder`](Self::builder)
    /// for values that come from configuration.
    pub fn new(limit: u64) -> Self {
        match Self::builder(limit).build() {
            Ok(limiter) => limiter,
            Err(e) => panic!("{e}"),
        }
    }

    /// Starts a [`ConcurrencyLimiterBuilder`].
    pub fn builder(limit: u64) -> ConcurrencyLimiterBuilder {
        ConcurrencyLimiterBuilder {
            limit,
            name: "concurrency".into(),
            prefix: "rl".into(),
            store: None,
            lease: DEFAULT_LEASE,
            timeout: DEFAULT_TIMEOUT,
            retry_after: DEFAULT_RETRY_AFTER,
            breaker: Breaker::default(),
            share_counters: false,
        }
    }

    /// Takes one of `key`'s slots, or reports it [`Busy`].
    ///
    /// Store failures and the timeout are errors, and hold no slot past one
    /// lease time: the acquire may still have been applied (a timed-out call
    /// can succeed in Redis later), so its token is released in the
    /// background once the call's real outcome is known (or after one lease
    /// time, whichever comes first). The release is owner-checked, hence
    /// harmless if nothing was granted. An attempt the client retried on
    /// its own (a cluster connection's retries) may land after that
    /// release; its lease, never renewed, expires after one lease time.
    /// Dropping the future before it finishes (a client that went away, a
    /// `select!` that took another branch) leaks nothing either: its token
    /// is released the same way, and its outcome (a timeout, if Redis does
    /// not answer within the timeout) still counts for the breaker. The
    /// store is first called when the future is first polled, so one
    /// dropped unpolled asks it nothing.
    ///
    /// While the [circuit breaker](crate::Breaker) is open, the store is not
    /// called: [`Error::CircuitOpen`] at once.
    pub async fn acquire<K: AsRef<[u8]> + ?Sized>(&self, key: &K) -> Result<Acquired, Error> {
        self.start(key.as_ref()).await
    }

    /// The same as [`acquire`](Self::acquire), as a `'static` future.
    pub(crate) fn start(&self, key: &[u8]) -> BoxFuture<'static, Result<Acquired, Error>> {
        let inner = &self.inner;
        let key: Arc<str> = self.store_key_bytes(key).into();
        let domain = breaker::domain(inner.store.fault_domain(&key));
        let pass = inner.breaker.pass(domain);
        if pass == Pass::Open {
            metrics::store_error(std::iter::once(&inner.metrics));
            return Box::pin(std::future::ready(Err(Error::CircuitOpen)));
        }
        // Made now, so that dropping the future unpolled frees a probe's
        // slot; the store's acquire is only made at the first poll.
        let pending = Pending {
            limiter: self.clone(),
            key,
            token: next_token(inner.lease_ms()),
            call: None,
            due: None,
            domain,
            pass,
            settled: false,
        };
        Box::pin(finish(pending))
    }

    /// Records an acquire's outcome with the breaker: `failed` or not.
    fn record(&self, domain: u8, pass: Pass, failed: Option<&Error>) {
        let breaker = &self.inner.breaker;
        let Some(e) = failed else {
            breaker.record(domain, pass, true);
            return;
        };
        if breaker.record(domain, pass, false)
            && let Some(unlogged) = breaker.log_opening()
        {
            tracing::warn!(error = %e, domain, unlogged, "concurrency store failing: circuit breaker open; store-error policy applies without calling the store until it recovers");
        }
    }
}

/// Waits for `pending`'s acquire within the timeout and settles it,
/// recording its outcome with the breaker.
async fn finish(mut pending: Pending) -> Result<Acquired, Error> {
    let inner = &pending.limiter.inner;
    let (limit, lease_ms, timeout) = (inner.policy.limit(), inner.lease_ms(), inner.timeout);
    let call = inner
        .store
        .acquire(&pending.key, &pending.token, limit, lease_ms);
    let call = pending.call.insert(call);
    pending.due = Some(Instant::now() + timeout);
    let started = metrics::clock();
    let outcome = tokio::time::timeout(timeout, call).await;
    metrics::store_latency(&inner.metrics, started);
    pending.settled = true;
    let (key, token) = (pending.key.clone(), pending.token.clone());
    let (domain, pass) = (pending.domain, pending.pass);
    let limiter = &pending.limiter;
    match outcome {
        Ok(Ok(LeaseState {
            acquired: true,
            held,
        })) => {
            limiter.record(domain, pass, None);
            metrics::leased(&limiter.inner.metrics, true);
            Ok(Acquired::Lease(Lease::new(
                limiter.clone(),
                key,
                token,
                held,
            )))
        }
        Ok(Ok(LeaseState { held, .. })) => {
            limiter.record(domain, pass, None);
            metrics::leased(&limiter.inner.metrics, false);
            Ok(Acquired::Busy(Busy::new(
                held,
                limiter.inner.retry_after,
                limiter.inner.policy.clone(),
            )))
        }
        Ok(Err(e)) => {
            limiter.record(domain, pass, Some(&e));
            metrics::store_error(std::iter::once(&limiter.inner.metrics));
            // The reply may have been lost after the script ran.
            limiter.release_later(key, token, None, None);
            Err(e)
        }
        Err(_) => {
            let e = Error::Timeout(timeout);
            limiter.record(domain, pass, Some(&e));
            metrics::store_error(std::iter::once(&limiter.inner.metrics));
            let limiter = limiter.clone();
            limiter.release_later(key, token, pending.call.take(), None);
            Err(e)
        }
    }
}

impl ConcurrencyLimiter {
    /// Releases `token` in the background, after `pending` (a timed-out or
    /// abandoned acquire) has finished, unless it is known to have granted
    /// nothing. An abandoned acquire's outcome is `unsettled`: recorded with
    /// the breaker as it comes, a timeout at its due time, as if its caller
    /// had waited for it. Outside a Tokio runtime nothing can run: the lease
    /// expires on its own, and the breaker's pass is given back (as it is
    /// if the task is dropped first, its runtime gone: [`Unsettled`]).
    fn release_later(
        &self,
        key: Arc<str>,
        token: Arc<str>,
        pending: Option<BoxFuture<'static, Result<LeaseState, Error>>>,
        unsettled: Option<Unsettled>,
    ) {
        let Ok(rt) = Handle::try_current() else {
            tracing::debug!(key = %key, "concurrency acquire abandoned outside a Tokio runtime; its lease expires on its own");
            // Dropped: the pass is given back.
            drop(unsettled);
            return;
        };
        let limiter = self.clone();
        rt.spawn(async move {
            let inner = &limiter.inner;
            let until = Instant::now() + inner.lease;
            if let Some(mut call) = pending {
                if let Some(u) = unsettled {
                    match tokio::time::timeout_at(u.due, &mut call).await {
                        Ok(outcome) => {
                            u.record(outcome.as_ref().err());
                            if let Ok(LeaseState {
                                acquired: false, ..
                            }) = outcome
                            {
                                return;
                            }
                            release_quietly(inner, &key, &token).await;
                            return;
                        }
                        Err(_) => u.record(Some(&Error::Timeout(inner.timeout))),
                    }
                }
                // Wait for the real outcome, but at most one lease time; an
                // acquire that only runs after that holds its slot for one
                // lease at most.
                let outcome = tokio::time::timeout_at(until, call).await;
                if let Ok(Ok(LeaseState {
                    acquired: false, ..
                })) = outcome
                {
                    return;
                }
            }
            release_quietly(inner, &key, &token).await;
        });
    }

    /// The store key that holds `key`'s leases, e.g.
    /// `rl:cc:concurrency:{203.0.113.9}`; hostile or long keys appear hashed.
    pub fn store_key<K: AsRef<[u8]> + ?Sized>(&self, key: &K) -> String {
        self.store_key_bytes(key.as_ref())
    }

    fn store_key_bytes(&self, key: &[u8]) -> String {
        let prefix = &self.inner.key_prefix;
        let mut out = String::with_capacity(prefix.len() + key.len().min(68) + 2);
        out.push_str(prefix);
        keyspace::push_client(&mut out, key);
        out
    }

    /// Leases allowed per key at once.
    pub fn limit(&self) -> u64 {
        self.inner.policy.limit()
    }

    /// How long a lease lives unless renewed.
    pub fn lease(&self) -> Duration {
        self.inner.lease
    }

    /// The policy name reported in the `RateLimit` headers.
    pub fn name(&self) -> &str {
        self.inner.policy.name()
    }
}

/// An acquire on its way. If it is dropped before its outcome is known (the
/// caller went away: a client that disconnected, a `select!` that took
/// another branch), the acquire may still be applied, so its token is
/// released in the background as after a timeout; if it is dropped before
/// its first poll, the store was never called, and nothing is sent.
struct Pending {
    limiter: ConcurrencyLimiter,
    key: Arc<str>,
    token: Arc<str>,
    /// The store's acquire, made at the first poll.
    call: Option<BoxFuture<'static, Result<LeaseState, Error>>>,
    /// When the acquire times out: the timeout after its first poll.
    due: Option<Instant>,
    /// The breaker's fault domain of the key, and what the breaker let the
    /// acquire do.
    domain: u8,
    pass: Pass,
    /// The outcome is known and handled: nothing to do on drop.
    settled: bool,
}

/// An acquire its caller gave up on, whose outcome the breaker still
/// awaits: the breaker's domain and pass, and when it times out. Dropped
/// unrecorded (its task dropped with its runtime, or never spawned), it
/// gives the pass back, so that a probe's slot is never held for good.
struct Unsettled {
    limiter: ConcurrencyLimiter,
    domain: u8,
    pass: Pass,
    due: Instant,
    recorded: bool,
}

impl Unsettled {
    /// Records the acquire's outcome with the breaker: `failed` or not.
    fn record(mut self, failed: Option<&Error>) {
        self.recorded = true;
        self.limiter.record(self.domain, self.pass, failed);
    }
}

impl Drop for Unsettled {
    fn drop(&mut self) {
        if !self.recorded {
            self.limiter.inner.breaker.abandon(self.domain, self.pass);
        }
    }
}

impl Drop for Pending {
    /// An acquire dropped after its call was made is still awaited, in
    /// the background, and its outcome counted by the breaker: with Redis
    /// frozen and every caller giving up before the timeout, the breaker
    /// otherwise never opened. One dropped unpolled frees its pass.
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        match (self.call.take(), self.due) {
            (Some(call), Some(due)) => {
                let (key, token) = (self.key.clone(), self.token.clone());
                let (domain, pass) = (self.domain, self.pass);
                let unsettled = Unsettled {
                    limiter: self.limiter.clone(),
                    domain,
                    pass,
                    due,
                    recorded: false,
                };
                self.limiter
                    .release_later(key, token, Some(call), Some(unsettled));
            }
            _ => self.limiter.inner.breaker.abandon(self.domain, self.pass),
        }
    }
}

/// Builds a [`ConcurrencyLimiter`]; start with [`ConcurrencyLimiter::builder`].
#[must_use]
#[derive(Debug)]
pub struct ConcurrencyLimiterBuilder {
    limit: u64,
    name: String,
    prefix: String,
    store: Option<Arc<dyn LeaseStore>>,
    lease: Duration,
    timeout: Duration,
    retry_after: Duration,
    breaker: Breaker,
    share_counters: bool,
}

impl ConcurrencyLimiterBuilder {
    /// The store: a [`RedisStore`](crate::RedisStore), a [`MemoryStore`]
    /// (the default), or your own [`LeaseStore`].
    pub fn store(mut self, store: impl LeaseStore) -> Self {
        self.store = Some(Arc::new(store));
        self
    }

    /// The policy name, used in `RateLimit` headers and in store keys
    /// (default `"concurrency"`). Limiters with the same prefix and name
    /// share slots: replicas (other processes) do so by using the same
    /// names, as they should.
    ///
    /// In one process, building a concurrency limiter whose slots a
    /// **live** one on the same store already uses (the same prefix and
    /// name; clones of one [`MemoryStore`] or
    /// [`RedisStore`](crate::RedisStore) are the same store) fails with
    /// [`ConfigError::SharedCounters`]: two layers stacked unnamed (one per
    /// key, one for everyone) would otherwise share slots, and a client
    /// could send the other layer's key as its own. Clone the limiter to
    /// share on purpose, or opt in with
    /// [`share_counters`](Self::share_counters). Dropping every clone of a
    /// limiter frees its name.
    ///
    /// ```
    /// use redis_ratelimit::{ConfigError, MemoryStore, concurrency::ConcurrencyLimiter};
    ///
    /// let store = MemoryStore::new();
    /// let exports = ConcurrencyLimiter::builder(5).name("exports").store(store.clone()).build()?;
    /// let again = ConcurrencyLimiter::builder(2).name("exports").store(store.clone()).build();
    /// assert!(matches!(again, Err(ConfigError::SharedCounters(_))));
    /// let shared = ConcurrencyLimiter::builder(5)
    ///     .name("exports")
    ///     .store(store)
    ///     .share_counters()
    ///     .build()?;
    /// assert_eq!(shared.store_key("k"), exports.store_key("k"));
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Lets this limiter use slots that another live concurrency limiter on
    /// the same store already uses, on purpose (see [`name`](Self::name));
    /// without it, that is [`ConfigError::SharedCounters`].
    pub fn share_counters(mut self) -> Self {
        self.share_counters = true;
        self
    }

    /// The store key prefix (default `"rl"`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long a lease lives unless renewed (default [`DEFAULT_LEASE`],
    /// 30 s): the longest a crashed holder keeps its slot. At least three
    /// times the timeout, so that a renewal sent a third into the lease lands
    /// in time even if it is slow; at most 366 days.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The bound on every acquire, renewal and release a request waits
    /// for (default [`DEFAULT_TIMEOUT`], 200 ms). Work no request waits for
    /// is bounded by the lease instead: an acquire given up is still
    /// awaited, to release what it took, and a lost lease is taken back,
    /// each for at most one lease time (see [`Lease`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The wait suggested to refused requests (default
    /// [`DEFAULT_RETRY_AFTER`], 1 s; `Retry-After` rounds up to whole
    /// seconds). A slot frees whenever any request in flight finishes, which
    /// nobody can predict, so this is a fixed hint rather than a computed one.
    pub fn retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = wait;
        self
    }

    /// The circuit breaker in front of the store's acquires (default:
    /// [`Breaker::new`]; [`Breaker::disabled`] turns it off).
    ///
    /// ```
    /// use std::time::Duration;
    /// use redis_ratelimit::{Breaker, concurrency::ConcurrencyLimiter};
    ///
    /// let limiter = ConcurrencyLimiter::builder(4)
    ///     .breaker(Breaker::new().failures(3).cooldown(Duration::from_millis(500)))
    ///     .build()
    ///     .unwrap();
    /// # let _ = limiter;
    /// ```
    pub fn breaker(mut self, breaker: Breaker) -> Self {
        self.breaker = breaker;
        self
    }

    /// Builds the limiter, checking the limit, name, prefix, timeout and lease.
    pub fn build(self) -> Result<ConcurrencyLimiter, ConfigError> {
        if self.limit == 0 || self.limit > MAX_LIMIT {
            return Err(ConfigError::ConcurrencyLimit(self.limit));
        }
        keyspace::validate("prefix", &self.prefix)?;
        keyspace::validate("name", &self.name)?;
        if self.timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        let min = self.timeout.saturating_mul(3).max(MIN_LEASE);
        if self.lease < min || self.lease > MAX_WINDOW {
            return Err(ConfigError::LeaseOutOfRange {
                lease: self.lease,
                min,
            });
        }
        let key_prefix = format!("{}:cc:{}:", self.prefix, self.name);
        let store = self.store.unwrap_or_else(|| Arc::new(MemoryStore::new()));
        let instance = store.instance();
        let inner = Arc::new(Inner {
            policy: Arc::new(Policy::new(&self.name, self.limit)),
            key_prefix: key_prefix.clone(),
            store,
            lease: self.lease,
            timeout: self.timeout,
            retry_after: self.retry_after,
            breaker: breaker::State::new(self.breaker),
            metrics: metrics::Keys::new(&self.name),
        });
        if let Some(instance) = instance {
            let prefixes = [key_prefix];
            crate::limiter::registry::register(instance, &prefixes, self.share_counters, &inner)?;
        }
        Ok(ConcurrencyLimiter { inner })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_rejects_bad_settings() {
        let b = ConcurrencyLimiter::builder;
        assert!(matches!(
            b(0).build(),
            Err(ConfigError::ConcurrencyLimit(0))
        ));
        assert!(b(MAX_LIMIT + 1).build().is_err());
        assert!(b(1).prefix("a b").build().is_err());
        assert!(b(1).name("{x}").build().is_err());
        assert!(b(1).timeout(Duration::ZERO).build().is_err());
        let short = b(1).lease(Duration::from_millis(599)).build().unwrap_err();
        assert!(short.to_string().contains("600ms"), "{short}");
        assert!(b(1).lease(Duration::from_millis(600)).build().is_ok());
        assert!(b(1).lease(MAX_WINDOW * 2).build().is_err());
    }

    #[test]
    fn store_keys_are_prefixed_tagged_and_bounded() {
        let l = ConcurrencyLimiter::builder(3)
            .prefix("app")
            .name("uploads")
            .build()
            .unwrap();
        assert_eq!(l.store_key("1.2.3.4"), "app:cc:uploads:{1.2.3.4}");
        assert!(l.store_key(&vec![b'x'; 1 << 20]).len() < 100);
    }
}
