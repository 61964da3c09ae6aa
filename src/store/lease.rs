//! The [`LeaseStore`] trait: owned, expiring leases for the concurrency limit.

use std::fmt;

use super::BoxFuture;
use crate::Error;

/// What an acquire found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseState {
    /// Whether the token now holds a lease.
    pub acquired: bool,
    /// Live leases on the key after the call, the caller's included.
    pub held: u64,
}

/// A backend that keeps, per key, a set of owned leases that expire unless
/// renewed: a distributed semaphore.
///
/// Implemented by [`RedisStore`](crate::RedisStore) (one Lua script per
/// call, on Redis's clock) and [`MemoryStore`](crate::MemoryStore) (same
/// semantics, in this process). Implementations must:
///
/// * drop expired leases before counting, and grant a lease only while fewer
///   than `limit` live ones remain;
/// * treat `acquire` with a token that already holds a lease as a renewal
///   (a lease found lost at a renewal is acquired again with its own token,
///   which must never take a second slot);
/// * take any `limit` from 1 to [`MAX_LIMIT`](crate::quota::MAX_LIMIT): a
///   lease found lost is taken back under that largest limit, whatever the
///   limiter's own, since its request still runs, so a key can hold more
///   leases than a limiter's limit (`held` then says so);
/// * only ever touch the caller's own token in `renew` and `release`, and
///   never create a lease in `renew`;
/// * give every key an expiry no later than its last lease's;
/// * in `acquire`, cut each other lease that outlives the one granted now:
///   to its own length from now, which a token ending in `/<lease_ms>`
///   names (a plain decimal from 1 to 366 days' ms, as the limiter's
///   tokens end), or else to the one granted now. A lease that does not
///   outlive it is left as it is, whatever its token says.
///
/// Tokens are at most 128 bytes; keys are built by the
/// [`ConcurrencyLimiter`](crate::concurrency::ConcurrencyLimiter).
///
/// # Errors
///
/// Both stores refuse arguments the scripts do not take, changing nothing:
/// a `limit` or `lease_ms` of 0 or from 2^53 up, a token that is empty or
/// longer than 128 bytes. The Redis store's script answers an error reply,
/// which comes back as an [`Error::Redis`] of kind
/// `ServerErrorKind::ResponseError`; the memory store returns the same kind
/// of error, naming the script and what to fix.
pub trait LeaseStore: fmt::Debug + Send + Sync + 'static {
    /// Grants `token` a lease of `lease_ms` on `key` if fewer than `limit`
    /// live leases are held there.
    fn acquire(
        &self,
        key: &str,
        token: &str,
        limit: u64,
        lease_ms: u64,
    ) -> BoxFuture<'static, Result<LeaseState, Error>>;

    /// Extends `token`'s lease to `lease_ms` from now. `false`: the token
    /// holds no live lease any more (it expired or was released).
    fn renew(
        &self,
        key: &str,
        token: &str,
        lease_ms: u64,
    ) -> BoxFuture<'static, Result<bool, Error>>;

    /// Removes `token`'s lease. `false`: it held no live lease. Never touches
    /// another token's lease.
    fn release(&self, key: &str, token: &str) -> BoxFuture<'static, Result<bool, Error>>;

    /// The fault domain of `key`, as [`Store::fault_domain`](crate::Store::fault_domain)
    /// gives it: the [`ConcurrencyLimiter`](crate::concurrency::ConcurrencyLimiter)'s
    /// [circuit breaker](crate::Breaker) keeps one state per domain. The
    /// default, 0, puts every key in one.
    fn fault_domain(&self, key: &str) -> usize {
        let _ = key;
        0
    }

    /// An identity shared by this store and its clones, as
    /// [`Store::instance`](crate::Store::instance) gives it: a
    /// [`ConcurrencyLimiter`](crate::concurrency::ConcurrencyLimiter) uses
    /// it to refuse, at build time, slots that a live concurrency limiter on
    /// the same store already uses (see
    /// [`ConcurrencyLimiterBuilder::share_counters`](crate::concurrency::ConcurrencyLimiterBuilder::share_counters)).
    /// The default, `None`, skips that check.
    fn instance(&self) -> Option<usize> {
        None
    }
}
