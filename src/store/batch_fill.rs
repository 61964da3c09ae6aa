//! [`Fill`]: calls beyond [`IN_FLIGHT`], each only with at least [`FILL`]
//! requests.
//!
//! With [`IN_FLIGHT`] calls out, requests wait for the first to be
//! answered. On loopback that is microseconds, and the wait is what makes
//! batches. Behind a network round trip it is a whole round trip, and two
//! calls carry too little: at 1.25 ms, a server with 32 connections made
//! 12,400 decisions a second where one `PING` a request allowed 19,900.
//! More calls in flight for everyone would cost Redis on loopback, and
//! worse, a rule that added calls when calls are slow would add them when
//! Redis is saturated too, since a saturated Redis also answers slowly, and
//! shrink batches just when Redis needs them large.
//!
//! So a call beyond the first [`IN_FLIGHT`] goes out only when at least
//! [`FILL`] requests wait, up to [`EXTRA`] more. Such a call is always
//! large enough that Redis's cost for the call itself (its `read(2)`,
//! `write(2)` and script invocation, about 3.5 decisions' worth) is spread
//! over at least [`FILL`] decisions, whatever made the calls slow.
//! Measured (`BENCHMARKS.md`, "Behind a network round trip"): 22% to 25%
//! more requests behind a 1.25 ms round trip, level on loopback, and on a
//! Redis capped to 15% of a core under a fleet of four servers within the
//! noise of two calls (`benches/fleet.py`), where eight calls in flight
//! always cost a fifth to a quarter of its decisions.
//!
//! The task is woken for it, not per request: by a sender that queued a
//! request and found [`FILL`] waiting (the requests the task holds out of
//! the queue after a sweep for deadlines count too), and by a lane whose
//! call was answered, which may have freed a call beyond [`IN_FLIGHT`].
//!
//! [`IN_FLIGHT`]: super::IN_FLIGHT

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, futures::Notified};

/// The fewest requests a call beyond [`IN_FLIGHT`] carries.
///
/// [`IN_FLIGHT`]: super::IN_FLIGHT
pub(super) const FILL: usize = super::MAX_BATCH / 4;
/// The most calls beyond [`IN_FLIGHT`] at once.
///
/// [`IN_FLIGHT`]: super::IN_FLIGHT
pub(super) const EXTRA: usize = 6;

/// The permits of the calls beyond [`IN_FLIGHT`], and the batching task's
/// wake-up when one of them may go.
///
/// [`IN_FLIGHT`]: super::IN_FLIGHT
#[derive(Debug)]
pub(super) struct Fill {
    wake: Notify,
    permits: Arc<Semaphore>,
    /// [`EXTRA`], or 0 where a round is not one call.
    extra: usize,
    /// Requests the task holds out of the queue.
    held: AtomicUsize,
}

impl Fill {
    /// With [`EXTRA`] calls beyond [`IN_FLIGHT`], or none (`extra` false).
    ///
    /// [`IN_FLIGHT`]: super::IN_FLIGHT
    pub(super) fn new(extra: bool) -> Self {
        let extra = if extra { EXTRA } else { 0 };
        Self {
            wake: Notify::new(),
            permits: Arc::new(Semaphore::new(extra)),
            extra,
            held: AtomicUsize::new(0),
        }
    }

    /// Called by a sender after it queued a request, with how many wait in
    /// the queue: wakes the task once a call beyond [`IN_FLIGHT`] would be
    /// full enough.
    ///
    /// [`IN_FLIGHT`]: super::IN_FLIGHT
    pub(super) fn queued(&self, in_queue: usize) {
        if self.extra > 0 && in_queue + self.held.load(Ordering::Relaxed) >= FILL {
            self.wake.notify_one();
        }
    }

    /// How many calls beyond [`IN_FLIGHT`] may be out.
    ///
    /// [`IN_FLIGHT`]: super::IN_FLIGHT
    pub(super) fn extra(&self) -> usize {
        self.extra
    }

    /// Called by a lane once its call is answered and its permit dropped:
    /// wakes the task, unless no call beyond [`IN_FLIGHT`] may go (a
    /// round's own permit wakes it then).
    ///
    /// [`IN_FLIGHT`]: super::IN_FLIGHT
    pub(super) fn answered(&self) {
        if self.extra > 0 {
            self.wake.notify_one();
        }
    }

    /// Called by the task when the requests it holds out of the queue are
    /// now `held`.
    pub(super) fn holding(&self, held: usize) {
        self.held.store(held, Ordering::Relaxed);
    }

    /// Completes when a call beyond [`IN_FLIGHT`] may go, or when it may
    /// have since the task last looked.
    ///
    /// [`IN_FLIGHT`]: super::IN_FLIGHT
    pub(super) fn woken(&self) -> Notified<'_> {
        self.wake.notified()
    }

    /// A permit for a call beyond [`IN_FLIGHT`], if `waiting` requests fill
    /// one and fewer than [`EXTRA`] such calls are out.
    ///
    /// [`IN_FLIGHT`]: super::IN_FLIGHT
    pub(super) fn permit(&self, waiting: usize) -> Option<OwnedSemaphorePermit> {
        if waiting < FILL {
            return None;
        }
        self.permits.clone().try_acquire_owned().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::{EXTRA, FILL, Fill};

    #[test]
    fn a_permit_needs_fill_requests_and_a_free_call() {
        let fill = Fill::new(true);
        assert_eq!(fill.extra(), EXTRA);
        assert!(fill.permit(FILL - 1).is_none(), "fewer than FILL wait");
        let permits: Vec<_> = (0..EXTRA).map(|_| fill.permit(FILL)).collect();
        assert!(permits.iter().all(Option::is_some), "EXTRA calls may go");
        assert!(fill.permit(10 * FILL).is_none(), "no more than EXTRA");
        drop(permits);
        assert!(fill.permit(FILL).is_some(), "a call answered frees one");
    }

    #[test]
    fn without_extra_calls_none_is_granted() {
        let fill = Fill::new(false);
        assert_eq!(fill.extra(), 0);
        assert!(fill.permit(10 * FILL).is_none());
    }
}
