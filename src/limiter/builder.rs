//! [`LimiterBuilder`]: limits, store, timeout, breaker, deny cache, shadow.

use std::{sync::Arc, time::Duration};

use super::{Backend, DEFAULT_TIMEOUT, Inner, Limiter};

/// How long `lua/once.lua` keeps a refund's or reset's marker: a resend
/// within it takes effect once. Every resend comes within the timeout.
const ONCE_MARKER_TTL: Duration = Duration::from_secs(10);
use crate::{
    Breaker, ConfigError, MemoryStore, Quota, breaker, deny_cache::DenyCache, headers::Policies,
    keyspace, per_thread::PerThread, store::Store,
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
    /// Units per local reservation; 0 for none.
    reservation: u64,
    /// How many keys hold a reservation at most.
    reservation_keys: usize,
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
            reservation: 0,
            reservation_keys: super::slots::RESERVED_KEYS,
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
    ///
    /// Under the middleware ([`RateLimitLayer`](crate::RateLimitLayer), the
    /// actix-web adapter), a limiter whose every limit is a shadow limit
    /// also lets through, unchecked, a request it finds no key for (where
    /// an enforced limit answers 400, or 500 for a missing peer address),
    /// and one whose check failed in the store, whatever the
    /// [`OnStoreError`](crate::OnStoreError) policy; both are logged and
    /// counted as usual. So is a request whose cost is above even
    /// [`MAX_LIMIT`](crate::quota::MAX_LIMIT) (a cost no limit could ever
    /// hold, [`Error::CostExceedsLimit`](crate::Error::CostExceedsLimit)
    /// even for a shadow limit): let through, logged (throttled) and
    /// counted as a shadow denial of every limit. [`Limiter::check`] still
    /// returns the error.
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
    /// In a limiter of several limits, every limit's key also carries the
    /// first limit's store name, as the Redis Cluster hash tag its keys
    /// share ([`Limiter::store_keys`]). Name the first limit too: a change
    /// of an unnamed first limit's quota, or going from one limit to
    /// several or back, moves every limit (named ones included) to new
    /// counters, each starting a fresh window.
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

    /// Reserves up to `n` units of a key at a time from the store, and
    /// admits requests from them in process, without a store call, until
    /// they run out or their window ends (default 0: off). For hot keys: a
    /// global limit ("5,000/s for everyone") or one big tenant is a single
    /// key, so without this every request for it is a script call on the
    /// one Redis master that owns it. With it, about one call per `3n / 4`
    /// requests.
    ///
    /// This is the approach of CockroachDB's and Doorman's central
    /// limiters (instances lease capacity from the centre), made exact in
    /// the over-admission direction:
    ///
    /// - **Never over-admits**, across any number of instances: reserved
    ///   units are spent in the store's counter when they are reserved (one
    ///   atomic call, `lua/reserve.lua`, on Redis's clock), so the counter
    ///   never passes the limit, and this instance stops spending them when
    ///   the window ends, measured from before the call was sent, less a
    ///   thousandth of the window (so at or before Redis's end of the
    ///   window, whose clock may run fast against this one's by up to 1,000
    ///   ppm; a clock stepped forward, not slewed, on the Redis host ends
    ///   Redis's windows early for every client, and is not covered).
    /// - **Can under-admit** by at most `n` units per instance per window:
    ///   units reserved and not spent when the window ends expire with it
    ///   (they are not given back to the store), and an instance never
    ///   holds more than `n` units of a key, counting those a reserve call
    ///   on its way will add (a [refund](Limiter::refund) that would pass
    ///   `n` goes to the store instead). Once a key's units stop, a little
    ///   before the store's window ends, it reserves nothing more until
    ///   that window has surely ended: through that last stretch (a
    ///   thousandth of the window, a reserve call's round trip and a few
    ///   ms, on each side of the store's end) each of its requests is
    ///   checked by the store as without reservations (batched with other
    ///   checks), so units reserved late never add to those left unspent.
    ///   The one exception is a request that leaves before its reserve
    ///   call answers: its cost stays reserved for the key's next
    ///   requests, beyond `n`. The request that leaves fewer than `n / 4`
    ///   reserves, in the background, what tops the key up to `n`, so that
    ///   a busy key does not run dry and its requests go on without waiting
    ///   (about one reserve call per `3n / 4` units spent). A request whose
    ///   cost is more than this instance holds reserves what tops the key
    ///   up to `n`, or its cost if that is more (as much as the store has
    ///   left, at least its cost); if the store has less than its cost
    ///   left, the request is denied, even if other instances still hold
    ///   units.
    /// - **Choosing `n`:** a refill is a store round trip; if a key spends
    ///   its last `n / 4` units before the refill lands, its requests wait
    ///   for it. Take `n ≥ 4 × the key's rate per instance × a slow round
    ///   trip` (e.g. 400 for 100,000 req/s and 1 ms), and keep `n` a small
    ///   share of the quota, since it bounds the under-admission.
    /// - Requests for one key that find its reservation short wait for one
    ///   reserve call (single flight), then share its answer: its units, its
    ///   denial, or its error. Other keys are not blocked. At most 10,000
    ///   keys hold a reservation per limiter (beyond that only while their
    ///   reserve calls run; [`local_reservation_keys`](Self::local_reservation_keys)
    ///   changes the bound); a full map drops the keys not hit since it last
    ///   made room, those holding units last, so a hot key stays (and a
    ///   flood of new keys, which hold none, does not waste a quiet one's
    ///   reservation), and dropping one only under-admits: its units, beyond
    ///   the bound above.
    ///   Once the map has dropped a key (more keys are in use than it
    ///   holds), a key it does not hold is checked by the store as without
    ///   reservations and noted, and reserves from its next request if that
    ///   comes while it is still held: a stream of cold keys costs what it
    ///   would without reservations, not a reserve call and `n - 1` unspent
    ///   units each.
    /// - A denial is the store's: `Retry-After` is the window's time left,
    ///   and it goes to the [deny cache](crate::Limiter#the-local-deny-cache)
    ///   as ever, unless a [`reset`](Limiter::reset) dropped the key's
    ///   reservation while the call was on its way. Store errors, the timeout and the
    ///   [circuit breaker](crate::Breaker) apply to reserve calls as to
    ///   checks: a failing store never admits more than the units already
    ///   reserved, and never after their window ends. The
    ///   [timeout](Self::timeout) bounds a request's whole wait, for its
    ///   key's flight and then its own reserve call: behind a slow store, a
    ///   request still waiting when it ends is
    ///   [`Error::Timeout`](crate::Error::Timeout), never a wait of one
    ///   store call per request queued before it.
    /// - A reserve call, once sent, is kept whatever becomes of its
    ///   request: it runs in a task of its own that holds the key's flight
    ///   and waits up to a whole timeout from sending for the answer, so a
    ///   request dropped by its client (a reset stream) or timed out loses
    ///   none of the units the store spent for it: they stay reserved for
    ///   the key's next requests. Only an answer later than that timeout
    ///   is lost: up to `n` units (or the request's cost, if larger: a
    ///   costlier request reserves its whole cost) the store spent and no
    ///   one holds, beyond
    ///   the under-admission bound above, for each such answer (a store
    ///   slower than the timeout can so waste a window's units).
    /// - A decision from the reservation reports as `remaining` the units
    ///   this instance still holds plus what the store had left at its last
    ///   reservation (other instances may have spent some since), and as
    ///   `reset` the time until the store's window ends, as the store
    ///   reports it (counted from the reserve call's answer: late by at most
    ///   its way back, never early but for clock drift), though its units
    ///   stop a little before that.
    /// - [`peek`](Limiter::peek) answers from the reservation when it holds
    ///   enough, else asks the store; [`refund`](Limiter::refund) of a
    ///   reserved decision gives the units back to the reservation it came
    ///   from while it lives and stays within `n` units, else to the
    ///   store's window;
    ///   [`reset`](Limiter::reset) drops this instance's reservation too
    ///   (a reserve call on its way keeps nothing, and the requests that
    ///   waited for it share one new call).
    ///   Other instances keep theirs (at most `n` units each) until their
    ///   window ends, on top of the fresh counter; so does a Redis that loses
    ///   its data.
    ///
    /// Only for a limiter with **one fixed-window limit**, on a store that
    /// implements [`Store::reserve`] ([`RedisStore`](crate::RedisStore)
    /// does): otherwise [`build`](Self::build) fails with
    /// [`ConfigError::Reservation`], as it does for an `n` above
    /// [`MAX_LIMIT`](crate::quota::MAX_LIMIT). A sliding window or GCRA counts a spend
    /// by when it happened, so units spent in advance would be charged at
    /// the wrong time, and proving that never over-admits is not simple;
    /// several limits would need units reserved in all of them at once. The
    /// [`MemoryStore`] ignores the setting: it decides in process anyway.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use redis_ratelimit::{Limiter, Quota, RedisStore};
    ///
    /// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// // 5,000/s for everyone, about one Redis call per 50 requests.
    /// let global = Limiter::builder(Quota::per_second(5_000))
    ///     .name("global")
    ///     .store(store)
    ///     .local_reservation(50)
    ///     .build()?;
    /// assert!(global.check("all", 1).await?.is_allowed());
    /// # Ok(()) }
    /// ```
    pub fn local_reservation(mut self, n: u64) -> Self {
        self.reservation = n;
        self
    }

    /// How many keys may hold a [local reservation](Self::local_reservation)
    /// at once, per limiter (default 10,000; 1 to 10,000,000, else
    /// [`build`](Self::build) fails with [`ConfigError::Reservation`]). The
    /// bound is about, not exact: the map is split into shards of at most
    /// 1,250 keys, and a shard that fills makes room on its own. Without
    /// [`local_reservation`](Self::local_reservation) it has no effect.
    ///
    /// Size it to the keys that are hit again within a window, when there
    /// are more than 10,000: say 100,000 tenants of 10,000 requests a
    /// minute each. A key the map holds is admitted in process after its
    /// first request (one reserve call, not batched with other checks);
    /// once more keys are in use than the map holds, a key it does not hold
    /// is checked by the store as without reservations. Each held key costs
    /// about 300 bytes, so the default map takes at most about 3 MB and
    /// 1,000,000 keys about 300 MB, and each can leave up to `n`
    /// units unspent per window: size `n` to the quota. Until the map is
    /// full, every new key's first request is a reserve call of its own, so
    /// a flood of one-off keys (clients that make up keys) costs Redis about
    /// one unbatched script call each up to the map's size, then what it
    /// would without reservations.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use redis_ratelimit::{Limiter, Quota, RedisStore};
    ///
    /// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
    /// // 100,000 tenants of 10,000 requests a minute, each reserving 100 at a time.
    /// let per_tenant = Limiter::builder(Quota::per_minute(10_000))
    ///     .store(store)
    ///     .local_reservation(100)
    ///     .local_reservation_keys(100_000)
    ///     .build()?;
    /// assert!(per_tenant.check("tenant-42", 1).await?.is_allowed());
    /// # Ok(()) }
    /// ```
    pub fn local_reservation_keys(mut self, keys: usize) -> Self {
        self.reservation_keys = keys;
        self
    }

    /// The store key prefix (default `"rl"`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The bound on every store call (default [`DEFAULT_TIMEOUT`], 200 ms).
    ///
    /// A check waits at most this long for the store, whether its request
    /// still waits to be sent (queued behind other calls to a busy Redis)
    /// or is in a call Redis has not answered; then it is
    /// [`Error::Timeout`](crate::Error::Timeout), which the layers answer by
    /// their [`OnStoreError`](crate::OnStoreError) policy. Limiters that
    /// share a store keep each their own timeout. A call that timed out may
    /// still be applied by Redis (its units spent, never more). It must be
    /// under 10 s, else [`build`](Self::build) fails with
    /// [`ConfigError::TimeoutTooLong`]: a [refund](Limiter::refund) or
    /// [reset](Limiter::reset) whose reply was lost may be sent again while
    /// its caller waits, and takes effect once only when that is within 10 s
    /// of its first run (`lua/once.lua`'s marker lives 10 s).
    ///
    /// A check its caller drops first (a `grpc-timeout`, a timeout layer
    /// outside the limit) is still awaited in a task of its own, within
    /// this timeout, and its outcome counted by the [`Breaker`]: a frozen
    /// Redis opens it even if every caller gives up before the timeout.
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
        if self.timeout >= ONCE_MARKER_TTL {
            return Err(ConfigError::TimeoutTooLong(self.timeout));
        }
        if let Some(unknown) = self
            .shadow
            .iter()
            .find(|s| !self.limits.iter().any(|(n, _)| n == *s))
        {
            return Err(ConfigError::UnknownLimit(unknown.clone()));
        }
        if self.reservation > 0 {
            self.check_reservation()?;
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
        // An explicit name can spell the key of an unnamed first limit
        // (`default.5-60000`): two limits on one counter would each spend
        // it, and undo each other's spends.
        for (i, (_, prefix)) in limits.iter().enumerate() {
            if limits[..i].iter().any(|(_, p)| p == prefix) {
                return Err(ConfigError::DuplicateName(self.limits[i].0.clone()));
            }
        }
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
        let deny_cache = (self.deny_cache > 0 && !matches!(store, Backend::Memory(_))).then(|| {
            let quotas: Vec<Quota> = self.limits.iter().map(|(_, q)| *q).collect();
            DenyCache::new(self.deny_cache, self.deny_cache_max_age, &quotas)
        });
        let reservations =
            (self.reservation > 0 && !matches!(store, Backend::Memory(_))).then(|| {
                super::reservation::Reservations::new(self.reservation, self.reservation_keys)
            });
        let instance = match &store {
            Backend::Memory(memory) => memory.instance(),
            Backend::Other(store, _) => store.instance(),
        };
        let memory_prefix = match (&store, &limits[..]) {
            (Backend::Memory(memory), [(_, prefix)]) => Some(memory.key_hasher(prefix)),
            _ => None,
        };
        let shadow: Vec<bool> = shadow.collect();
        let inner = Arc::new(Inner {
            enforces_nothing: shadow.iter().all(|s| *s),
            memory_prefix,
            limits: limits.into(),
            policies: Arc::new(Policies::new(&self.limits).with_shadow(shadow)),
            thread_policies: PerThread::new(),
            shared_tag,
            store,
            timeout: self.timeout,
            breaker: breaker::State::new(self.breaker),
            deny_cache,
            reservations,
        });
        if let Some(instance) = instance {
            super::registry::register(instance, &counters, self.share_counters, &inner)?;
        }
        Ok(Limiter { inner })
    }
}

impl LimiterBuilder {
    /// Whether a local reservation can serve this limiter exactly.
    fn check_reservation(&self) -> Result<(), ConfigError> {
        // No window holds more (the store refuses a larger reserve call,
        // and every request would fail by the store-error policy).
        if self.reservation > crate::quota::MAX_LIMIT {
            return Err(ConfigError::Reservation(
                "local_reservation must be at most MAX_LIMIT (2^50) units",
            ));
        }
        if !(1..=super::slots::MAX_RESERVED_KEYS).contains(&self.reservation_keys) {
            return Err(ConfigError::Reservation(
                "local_reservation_keys must be 1 to 10,000,000 keys",
            ));
        }
        if self.limits.len() > 1 {
            return Err(ConfigError::Reservation(
                "a limiter with several limits cannot reserve: use one limiter per limit",
            ));
        }
        if self.limits[0].1.algorithm() != crate::Algorithm::FixedWindow {
            return Err(ConfigError::Reservation(
                "only a fixed window can reserve units exactly: drop .sliding_window()/.gcra() or the reservation",
            ));
        }
        if let Some(Backend::Other(store, _)) = &self.store
            && !store.supports_reservation()
        {
            return Err(ConfigError::Reservation(
                "this store does not implement Store::reserve: use a RedisStore",
            ));
        }
        Ok(())
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
