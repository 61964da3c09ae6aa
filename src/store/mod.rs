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

pub use self::lease::{LeaseState, LeaseStore};
pub use self::memory::MemoryStore;
pub use self::redis::RedisStore;
pub use self::scripts::{ACQUIRE_LUA, DECIDE_FIXED_LUA, DECIDE_LUA, RELEASE_LUA, RENEW_LUA};

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
    fn decide(
        &self,
        checks: Vec<LimitCheck>,
        cost: u64,
    ) -> BoxFuture<'static, Result<Vec<LimitState>, Error>>;
}
