//! Where counters live: the [`Store`] trait, [`RedisStore`] and [`MemoryStore`].
//!
//! Both stores give the same answers for the same sequence of checks, for
//! every [`Algorithm`](crate::Algorithm): they count admitted cost only,
//! decide all limits of a request at once (all or nothing), never go above a
//! limit, and let every key expire.

use std::{fmt, future::Future, pin::Pin};

use crate::{Error, Quota};

mod batch;
mod call;
mod lease;
mod memory;
mod pool;
mod redis;
pub(crate) mod scripts;

pub(crate) use self::batch::Deadline;
pub use self::lease::{LeaseState, LeaseStore};
pub use self::memory::MemoryStore;
pub(crate) use self::memory::{Credit, KeyHasher};
pub use self::redis::RedisStore;
pub(crate) use self::redis::StoreReply;
pub use self::scripts::{
    ACQUIRE_LUA, DECIDE_FIXED_LUA, DECIDE_LUA, PEEK_LUA, REFUND_LUA, RELEASE_LUA, RENEW_LUA,
    RESERVE_LUA, RESET_LUA,
};

/// A boxed, `Send` future, as [`Store`] methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One limit of a decision: the key it counts under and its quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitCheck {
    /// The store key (see [`Limiter::store_key`](crate::Limiter::store_key)).
    pub key: String,
    /// The quota, with its algorithm.
    pub quota: Quota,
    /// A shadow (dry-run) limit: it is decided and reported, but its denial
    /// blocks nothing, and it spends only when it admits.
    pub shadow: bool,
}

/// A request's checks, one per limit: a lone limit's held inline.
pub(crate) type Checks = smallvec::SmallVec<[LimitCheck; 1]>;

/// What a store reports for one limit of a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitState {
    /// Whether this limit alone would admit the cost.
    pub allowed: bool,
    /// Units left after the decision (after spending, if the decision admitted).
    pub remaining: u64,
    /// Milliseconds until the limit is fully available again.
    pub reset_ms: u64,
    /// Milliseconds until the limit would admit the cost; 0 when it does.
    pub retry_ms: u64,
}

/// One limit's part of a refund: give `cost` back to the window of `key`
/// that ends `window_end_in_ms` from now (see [`Store::refund`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Refund {
    /// The store key that was spent.
    pub key: String,
    /// The limit's quota, with its algorithm.
    pub quota: Quota,
    /// The units to give back (> 0).
    pub cost: u64,
    /// Which window was spent, as the time from now until it ends, in ms
    /// (negative once it has ended), as the caller measured it:
    /// - fixed window: the spent window's end (the key's TTL then);
    /// - sliding window: the end of the window (bucket) the cost went to;
    /// - GCRA: the theoretical arrival time the spend left, so that a
    ///   refund never gives back more than is still outstanding of it.
    ///
    /// Windows of one key follow each other a whole window apart, so a store
    /// tells the spent window from a later one within half a window.
    pub window_end_in_ms: i64,
    /// For a GCRA spend a Redis store decided: when the spend ends (the
    /// theoretical arrival time it left) on Redis's own clock (`TIME`), in
    /// µs rounded up. A refund is then bounded by what is still
    /// outstanding on the store's clock, whatever the round trips took;
    /// `window_end_in_ms`, measured by the caller, can only be later by
    /// them. `None` otherwise.
    pub spend_ends_at_us: Option<u64>,
}

impl Refund {
    pub(crate) fn new(key: String, quota: Quota, cost: u64, window_end_in_ms: i64) -> Self {
        Self {
            key,
            quota,
            cost,
            window_end_in_ms,
            spend_ends_at_us: None,
        }
    }

    /// With the spend's end on the store's clock (see
    /// [`spend_ends_at_us`](Self::spend_ends_at_us)).
    pub(crate) fn spent_until(self, us: u64) -> Self {
        Self {
            spend_ends_at_us: Some(us),
            ..self
        }
    }
}

/// What [`Store::reserve`] took from a fixed window's counter for a
/// [local reservation](crate::LimiterBuilder::local_reservation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reservation {
    /// The units taken (spent in the store now); 0 when fewer than `need`
    /// were left, which is a denial that took nothing.
    pub granted: u64,
    /// The units the counter has left after the grant.
    pub remaining: u64,
    /// Milliseconds left in the window, by the store's clock, when it
    /// answered: the grant must not be spent after that.
    pub window_left_ms: u64,
}

impl Reservation {
    /// A store's answer: `granted` units, `remaining` left in the counter,
    /// `window_left_ms` until the window ends.
    pub fn new(granted: u64, remaining: u64, window_left_ms: u64) -> Self {
        Self {
            granted,
            remaining,
            window_left_ms,
        }
    }
}

/// A backend that decides rate-limit checks atomically.
///
/// One call decides every limit of a request **all or nothing**: if every
/// enforced limit admits `cost`, all of them spend it; if any denies, none
/// spends anything. A [shadow](LimitCheck::shadow) limit never blocks the
/// others and spends only what it admits. Implementations count as [`Algorithm`](crate::Algorithm)
/// documents, take time from one clock of their own, and give every key they
/// create an expiry.
pub trait Store: fmt::Debug + Send + Sync + 'static {
    /// Decides `cost` against every limit in `checks` at once; the reply has
    /// one state per check, in order.
    ///
    /// The keys of one call should differ (a [`Limiter`](crate::Limiter)'s
    /// always do). A key listed twice leaves no counter behind that it
    /// should not, but its states say little, and differ between stores:
    /// on [`RedisStore`], a fixed window's second check counts the first
    /// one's spend (so a limit of 1 denies both), while a sliding window or
    /// GCRA, and every algorithm on [`MemoryStore`],
    /// decide both against the state before the call and spend once.
    ///
    /// A cost above [`MAX_LIMIT`](crate::quota::MAX_LIMIT), more than any
    /// limit holds, is denied by [`MemoryStore`], and refused by
    /// [`RedisStore`] with [`Error::CostExceedsLimit`] (its scripts count in
    /// Lua's doubles, exact only below 2^53), without a script call. So is
    /// a call without checks, with the script's error. A [`Limiter`](crate::Limiter)
    /// sends neither.
    fn decide(
        &self,
        checks: Vec<LimitCheck>,
        cost: u64,
    ) -> BoxFuture<'static, Result<Vec<LimitState>, Error>>;

    /// The fault domain of `key`: the part of the store that holds it and
    /// can fail alone, such as one master of a Redis Cluster. A
    /// [`Limiter`](crate::Limiter) keeps a [circuit breaker](crate::Breaker)
    /// for each domain (up to 64; domains beyond share them), so that one
    /// failing part opens the breaker of its own keys only. Every key of one
    /// decision must be of the same domain (as the keys of one decision on a
    /// cluster share a hash slot). The default, 0 for every key, is one
    /// breaker for the whole store.
    ///
    /// [`RedisStore`] on a cluster answers the key's hash slot divided by
    /// 256; any other store, 0.
    ///
    /// ```
    /// use redis_ratelimit::{MemoryStore, Store};
    ///
    /// assert_eq!(MemoryStore::new().fault_domain("any key"), 0);
    /// ```
    fn fault_domain(&self, key: &str) -> usize {
        let _ = key;
        0
    }

    /// An identity shared by this store and its clones (say, the address of
    /// their shared state), while any of them lives. A
    /// [`Limiter`](crate::Limiter) uses it to refuse, at build time, counters
    /// that a live limiter on the same store already uses (see
    /// [`LimiterBuilder::share_counters`](crate::LimiterBuilder::share_counters)).
    /// The default, `None`, skips that check.
    fn instance(&self) -> Option<usize> {
        None
    }

    /// Like [`decide`](Self::decide), but spends nothing: whether `cost`
    /// would be admitted now, with the states a check would report
    /// (`remaining` before spending; `retry_ms` when it would deny).
    ///
    /// Provided so that stores written before it keep compiling: the
    /// default fails with [`Error::Unsupported`].
    fn peek(
        &self,
        checks: Vec<LimitCheck>,
        cost: u64,
    ) -> BoxFuture<'static, Result<Vec<LimitState>, Error>> {
        let _ = (checks, cost);
        Box::pin(std::future::ready(Err(Error::Unsupported("peek"))))
    }

    /// Gives back what a decision spent, in one atomic call: for each
    /// [`Refund`], `cost` units to the window it names, and only to that
    /// window (a fixed window that has ended is not credited, nor a later
    /// one), never below zero, keeping the key's expiry. Keys that are gone
    /// are left alone.
    ///
    /// The default fails with [`Error::Unsupported`].
    fn refund(&self, refunds: Vec<Refund>) -> BoxFuture<'static, Result<(), Error>> {
        let _ = refunds;
        Box::pin(std::future::ready(Err(Error::Unsupported("refund"))))
    }

    /// Whether this store implements [`reserve`](Self::reserve). A
    /// [`LimiterBuilder::local_reservation`](crate::LimiterBuilder::local_reservation)
    /// on a store that does not is refused at build time. The default is
    /// `false`.
    fn supports_reservation(&self) -> bool {
        false
    }

    /// Takes between `need` and `want` units (`1 <= need <= want`) of the
    /// fixed-window counter `check.key` in one atomic call: as many as are
    /// left, up to `want`, if that is at least `need`, else none. The units
    /// taken are spent in the counter at once, exactly as admitted requests
    /// are, and the counter keeps (or, new, gets) its window's expiry.
    ///
    /// The default fails with [`Error::Unsupported`].
    fn reserve(
        &self,
        check: LimitCheck,
        need: u64,
        want: u64,
    ) -> BoxFuture<'static, Result<Reservation, Error>> {
        let _ = (check, need, want);
        Box::pin(std::future::ready(Err(Error::Unsupported("reserve"))))
    }

    /// Deletes `keys` (every limit's counter of a client), in one atomic
    /// call.
    ///
    /// The default fails with [`Error::Unsupported`].
    fn reset(&self, keys: Vec<String>) -> BoxFuture<'static, Result<(), Error>> {
        let _ = keys;
        Box::pin(std::future::ready(Err(Error::Unsupported("reset"))))
    }
}
