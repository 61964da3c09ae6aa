//! [`Lease`], the guard that holds a slot; [`Busy`], the answer when none is
//! free; and the owner tokens that tell holders apart.

use std::{fmt, sync::Arc, time::Duration};

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::{runtime::Handle, sync::Notify, time::Instant};

use super::{ConcurrencyLimiter, headers::Policy, limiter::Inner};
use crate::{Error, headers::HeaderSink, metrics, quota::MAX_LIMIT, store::LeaseState};

/// What [`ConcurrencyLimiter::acquire`] got.
#[derive(Debug)]
#[must_use = "dropping a lease releases its slot at once"]
pub enum Acquired {
    /// A slot, held until the lease is released or dropped.
    Lease(Lease),
    /// The key already has its limit of leases.
    Busy(Busy),
}

impl Acquired {
    /// The lease, if one was granted.
    pub fn lease(self) -> Option<Lease> {
        match self {
            Acquired::Lease(lease) => Some(lease),
            Acquired::Busy(_) => None,
        }
    }

    /// Whether a lease was granted.
    pub fn is_acquired(&self) -> bool {
        matches!(self, Acquired::Lease(_))
    }
}

/// The answer for a key that already has its limit of leases.
#[derive(Debug, Clone)]
pub struct Busy {
    held: u64,
    retry_after: Duration,
    policy: Arc<Policy>,
}

impl Busy {
    pub(super) fn new(held: u64, retry_after: Duration, policy: Arc<Policy>) -> Self {
        Self {
            held,
            retry_after,
            policy,
        }
    }

    /// Leases allowed per key at once.
    pub fn limit(&self) -> u64 {
        self.policy.limit()
    }

    /// Leases held on the key when it was found busy; the
    /// [`limit`](Self::limit) when a full [`MemoryStore`](crate::MemoryStore)
    /// refused a new key (see its "Concurrency leases").
    pub fn in_flight(&self) -> u64 {
        self.held
    }

    /// The limiter's suggested wait (see
    /// [`retry_after`](super::ConcurrencyLimiterBuilder::retry_after)).
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }

    /// The policy (limiter) name used in the `RateLimit` headers.
    pub fn policy(&self) -> &str {
        self.policy.name()
    }

    /// Writes `RateLimit-Policy`, `RateLimit` (`r=0`) and `Retry-After`.
    pub(crate) fn write_headers(&self, sink: &mut impl HeaderSink) {
        let wait = Some(self.retry_after);
        super::headers::write(sink, &self.policy, self.policy.limit(), wait);
    }
}

/// One slot of a key's concurrency limit, held until released or dropped.
///
/// While it is held, a background task renews it every third of the lease
/// time. Dropping it (at the end of a request, on an error, a panic or a
/// disconnect) stops the renewals and spawns an owner-checked release onto
/// the current Tokio runtime; outside a runtime nothing can be sent and the
/// lease simply expires, and so does one dropped as its runtime shuts down
/// (the end of `main`, a server's last requests at a graceful shutdown): a
/// spawned release the runtime drops before it runs is never sent, and
/// every replica sees the slot taken until the lease time has passed. To
/// free it at once, await [`release`](Self::release) before the runtime
/// ends. A holder that crashes, or whose renewals stop
/// landing, loses the slot after one lease time; its late release then
/// removes nothing, so it can never free a slot someone else holds by then.
/// A lease found lost at a renewal while it is still held (its renewals
/// failed for a lease time, or the store lost it) is taken back at once,
/// beyond the limit if newcomers filled the key meanwhile: its request
/// still runs, so it counts, and the key admits no one until fewer than the
/// limit run.
///
/// A lease leaked with [`std::mem::forget`] keeps renewing for as long as its
/// runtime runs.
pub struct Lease {
    inner: Arc<Inner>,
    key: Arc<str>,
    token: Arc<str>,
    held: u64,
    renewal: Arc<Renewal>,
    released: bool,
}

/// What a lease and its renewal task share.
#[derive(Default)]
struct Renewal {
    /// Set when the lease is released or dropped: the task stops, and
    /// releases again a slot it took back meanwhile, whose acquire may have
    /// run in the store after the lease's release.
    stopped: AtomicBool,
    /// Set once a renewal found the lease lost: another holder may have had
    /// its slot meanwhile, even if it was taken back since.
    lost: AtomicBool,
    /// Wakes the task when `stopped` is set.
    wake: Notify,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("store_key", &self.key)
            .field("token", &self.token)
            .field("in_flight", &self.held)
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// A granted lease; starts its renewals.
    pub(super) fn new(
        limiter: ConcurrencyLimiter,
        key: Arc<str>,
        token: Arc<str>,
        held: u64,
    ) -> Self {
        let inner = limiter.inner;
        let renewal = Arc::new(Renewal::default());
        if let Ok(rt) = Handle::try_current() {
            let shared = (inner.clone(), key.clone(), token.clone());
            rt.spawn(renew(shared, renewal.clone()));
        }
        Self {
            inner,
            key,
            token,
            held,
            renewal,
            released: false,
        }
    }

    /// Leases allowed per key at once.
    pub fn limit(&self) -> u64 {
        self.inner.policy.limit()
    }

    /// Leases held on the key when this one was granted, this one included.
    pub fn in_flight(&self) -> u64 {
        self.held
    }

    /// How many more leases the key could grant when this one was granted.
    pub fn remaining(&self) -> u64 {
        self.limit().saturating_sub(self.held)
    }

    /// The store key the lease is held on.
    pub fn store_key(&self) -> &str {
        &self.key
    }

    /// This holder's owner token: random per process, plus a counter, and
    /// the lease length it is for (`<process>-<counter>/<lease ms>`).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Releases the slot now and waits for the store. `Ok(false)`: the lease
    /// had already expired, so nothing was removed, or it was lost while
    /// held and taken back since; either way another holder may have had
    /// the slot meanwhile (a lock's holders overlapped). If the release
    /// fails, times out or is dropped unfinished, the release is sent again
    /// in the background, as a dropped lease's is.
    pub async fn release(mut self) -> Result<bool, Error> {
        self.stop_renewals();
        let inner = &self.inner;
        let release = inner.store.release(&self.key, &self.token);
        let released = tokio::time::timeout(inner.timeout, release)
            .await
            .map_err(|_| Error::Timeout(inner.timeout))?;
        // Only now: until the store has answered, dropping `self` (an
        // error above, or this future dropped) releases it again.
        self.released = released.is_ok();
        let lost = self.renewal.lost.load(Ordering::SeqCst);
        released.map(|removed| removed && !lost)
    }

    /// Writes `RateLimit-Policy` and `RateLimit` for a passed request.
    pub(crate) fn write_headers(&self, sink: &mut impl HeaderSink) {
        super::headers::write(sink, &self.inner.policy, self.held, None);
    }

    fn stop_renewals(&mut self) {
        self.renewal.stopped.store(true, Ordering::SeqCst);
        self.renewal.wake.notify_one();
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop_renewals();
        if self.released {
            return;
        }
        let Ok(rt) = Handle::try_current() else {
            tracing::debug!(key = %self.key, "concurrency lease dropped outside a Tokio runtime; it expires on its own");
            return;
        };
        let (inner, key, token) = (self.inner.clone(), self.key.clone(), self.token.clone());
        rt.spawn(async move { release_quietly(&inner, &key, &token).await });
    }
}

/// Releases `token`'s lease on `key`, bounded by the timeout. A failure is
/// only logged: the lease expires on its own.
pub(super) async fn release_quietly(inner: &Inner, key: &str, token: &str) {
    let release = inner.store.release(key, token);
    match tokio::time::timeout(inner.timeout, release).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::debug!(error = %e, %key, "concurrency lease release failed; it expires on its own")
        }
        Err(_) => {
            tracing::debug!(%key, "concurrency lease release timed out; it expires on its own")
        }
    }
}

/// Renews a lease every third of the lease time until it is released or
/// dropped (`renewal.stopped`).
///
/// A lease the store no longer holds (it expired before a renewal landed,
/// or Redis lost it: a restart without persistence, a failover that lost
/// writes, a flush) is taken back at once with an acquire of the same
/// token, whatever the limit ([`MAX_LIMIT`]): its request still runs,
/// so it counts, and a key that newcomers filled meanwhile holds more
/// leases than its limit, and admits no one, until fewer than the limit
/// run. A take-back is waited for until its outcome is known, but at most
/// one lease time (as an acquire given up is): if the lease was released
/// meanwhile, the slot it took is released again. One that lands later
/// still, after the release, holds its slot for at most its own lease.
async fn renew((inner, key, token): (Arc<Inner>, Arc<str>, Arc<str>), renewal: Arc<Renewal>) {
    let every = inner.lease / 3;
    let stopped = || renewal.stopped.load(Ordering::SeqCst);
    let mut next = Instant::now() + every;
    // Lost, and not taken back yet.
    let mut lost = false;
    // A refused take-back was warned of, since the lease was lost.
    let mut warned = false;
    loop {
        // The next tick, or a stop (a permit left by one before this wait
        // ends it at once).
        let _ = tokio::time::timeout_at(next, renewal.wake.notified()).await;
        if stopped() {
            return;
        }
        next = (next + every).max(Instant::now());
        if !lost {
            match renewed(&inner, &key, &token).await {
                Ok(true) => continue,
                Ok(false) if stopped() => return,
                Ok(false) => {
                    lost = true;
                    renewal.lost.store(true, Ordering::SeqCst);
                    metrics::lease_lost(&inner.metrics);
                }
                Err(e) => {
                    metrics::store_error(std::iter::once(&inner.metrics));
                    tracing::debug!(error = %e, %key, "concurrency lease renewal failed; retrying");
                    continue;
                }
            }
        }
        let taken = taken_back(&inner, &key, &token).await;
        if stopped() {
            // Its acquire may have run after the lease's release.
            release_quietly(&inner, &key, &token).await;
            return;
        }
        match taken {
            Ok(LeaseState {
                acquired: true,
                held,
            }) => {
                (lost, warned) = (false, false);
                let limit = inner.policy.limit();
                if held > limit {
                    tracing::warn!(%key, held, limit, "concurrency lease lost (it expired before a renewal landed, or the store lost it) and taken back beyond the limit, since its request still runs: no request is admitted until fewer than the limit run");
                } else {
                    tracing::info!(%key, "concurrency lease lost and taken back");
                }
            }
            Ok(_) if !warned => {
                warned = true;
                tracing::warn!(%key, "concurrency lease lost and the store refused to take it back (an in-memory store's full lease table, say): the request runs uncounted; retried at every renewal");
            }
            Ok(_) => {}
            Err(e) => {
                metrics::store_error(std::iter::once(&inner.metrics));
                tracing::debug!(error = %e, %key, "concurrency lease take-back failed; retrying");
            }
        }
    }
}

/// One renewal within the timeout: whether the store still held the lease.
async fn renewed(inner: &Inner, key: &str, token: &str) -> Result<bool, Error> {
    let renewal = inner.store.renew(key, token, inner.lease_ms());
    match tokio::time::timeout(inner.timeout, renewal).await {
        Ok(result) => result,
        Err(_) => Err(Error::Timeout(inner.timeout)),
    }
}

/// An acquire of a lost lease's own token under the largest limit a
/// limiter takes ([`MAX_LIMIT`], which no key's leases reach), so that the
/// store grants it whatever the key holds (a retried acquire of a live
/// token only renews it, so it never takes two). Waited for until its
/// outcome is known, but at most one lease time: one dropped at the
/// timeout could take its slot after the lease's release, for a lease time
/// that no one holds it.
async fn taken_back(inner: &Inner, key: &str, token: &str) -> Result<LeaseState, Error> {
    let acquire = inner.store.acquire(key, token, MAX_LIMIT, inner.lease_ms());
    match tokio::time::timeout(inner.lease, acquire).await {
        Ok(result) => result,
        Err(_) => Err(Error::Timeout(inner.lease)),
    }
}

/// A new owner token, unique across replicas ([`random::unique_id`]), for a
/// lease of `lease_ms`: `<process>-<counter>/<lease_ms>`, at most 53 bytes.
///
/// The lease's length travels with it so that a store that cuts leases
/// outliving their length from now (a clock that stepped back) cuts each
/// to its own length ([`token_lease`]), never to the length of whoever
/// acquires next: limiters sharing a name with different leases (a rolling
/// deploy that changes `lease`, the lock recipe's callers) would otherwise
/// cut a long holder's lease short, and let a second holder in while it
/// still runs.
///
/// [`random::unique_id`]: crate::random::unique_id
pub(super) fn next_token(lease_ms: u64) -> Arc<str> {
    format!("{}/{lease_ms}", crate::random::unique_id()).into()
}

/// The lease length a token was made for ([`next_token`]), if it says one
/// within [`MAX_WINDOW`](crate::quota::MAX_WINDOW); `None` for any other
/// token (a custom store's, an earlier version's). What the acquire script
/// reads (`lib.lua`'s `whole(_, 1)`): a plain decimal of at least 1, so not
/// `0` and no leading zero.
pub(crate) fn token_lease(token: &str) -> Option<Duration> {
    let (_, ms) = token.rsplit_once('/')?;
    let plain = ms.bytes().all(|b| b.is_ascii_digit()) && !ms.starts_with('0');
    if ms.is_empty() || ms.len() > 12 || !plain {
        return None;
    }
    let lease = Duration::from_millis(ms.parse().ok()?);
    (lease <= crate::quota::MAX_WINDOW).then_some(lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_says_its_lease_and_only_a_plain_one_is_read() {
        let token = next_token(30_000);
        assert!(token.len() <= 53, "{token}");
        assert_eq!(token_lease(&token), Some(Duration::from_secs(30)));
        let max = crate::quota::MAX_WINDOW.as_millis();
        assert_eq!(
            token_lease(&next_token(max as u64)),
            Some(crate::quota::MAX_WINDOW)
        );
        for other in [
            "stale",
            "a-1/",
            "a-1/+5",
            "a-1/5s",
            "a-1/ 5",
            "a-1/1e3",
            "a-1/0",
            "a-1/030000",
            "a-1/999999999999",
            "a-1/99999999999999999999999",
        ] {
            assert_eq!(token_lease(other), None, "{other}");
        }
        assert_eq!(
            token_lease(&format!("a-1/{}", max + 1)),
            None,
            "over 366 days"
        );
    }
}
