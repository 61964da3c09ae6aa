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
//! more requests behind a 1.25 ms round trip, level on loopback, and on a Redis
//! capped to 15% of a core under a fleet of four servers within the noise
//! of two calls (`benches/fleet.py`), where eight calls in flight always
//! cost a fifth to a quarter of its decisions.
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
    /// Requests the task holds out of the queue.
    held: AtomicUsize,
}

impl Fill {
    pub(super) fn new() -> Self {
        Self {
            wake: Notify::new(),
            permits: Arc::new(Semaphore::new(EXTRA)),
            held: AtomicUsize::new(0),
        }
    }

    /// Called by a sender after it queued a request, with how many wait in
    /// the queue: wakes the task once a call beyond [`IN_FLIGHT`] would be
    /// full enough.
    ///
    /// [`IN_FLIGHT`]: super::IN_FLIGHT
    pub(super) fn queued(&self, in_queue: usize) {
        if in_queue + self.held.load(Ordering::Relaxed) >= FILL {
            self.wake.notify_one();
        }
    }

    /// Called by a lane once its call is answered and its permit dropped.
    pub(super) fn answered(&self) {
        self.wake.notify_one();
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
