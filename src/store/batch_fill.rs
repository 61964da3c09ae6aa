//! [`Fill`]: calls beyond [`IN_FLIGHT`](super::IN_FLIGHT), each only with at least [`FILL`]
//! requests.
//!
//! With [`IN_FLIGHT`](super::IN_FLIGHT) calls out, requests wait for the first to be
//! answered. On loopback that is microseconds, and the wait is what makes
//! batches. Behind a network round trip it is a whole round trip, and two
//! calls carry too little: at 1.25 ms, a server with 32 connections made
//! 13,000 decisions a second where one `PING` a request allowed 20,000.
//! More calls in flight for everyone would cost Redis on loopback, and
//! worse, a rule that added calls when calls are slow would add them when
//! Redis is saturated too, since a saturated Redis also answers slowly, and
//! shrink batches just when Redis needs them large.
//!
//! So a call beyond the first [`IN_FLIGHT`](super::IN_FLIGHT) goes out
//! only when at least [`FILL`] requests wait, up to [`EXTRA`] more. Such a
//! call is always large enough that Redis's cost for the call itself (its
//! `read(2)`, `write(2)` and script invocation, about 3.5 decisions' worth)
//! is spread over at least [`FILL`] decisions, whatever made the calls
//! slow. Measured (`BENCHMARKS.md`, "Behind a network round trip"): 25%
//! more requests behind a 1.25 ms round trip, level on loopback, and on a
//! Redis capped to 15% of a core under a fleet of four servers within the
//! noise of two calls (`benches/fleet.py`), where eight calls in flight
//! always cost a fifth to a quarter of its decisions.
//!
//! Each queued request is counted by its sender, which wakes the batching
//! task once [`FILL`] wait, so the task is not woken per request. The
//! requests the task took from the queue to hold (its sweeps for
//! deadlines) count too.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, futures::Notified};

/// The fewest requests a call beyond [`IN_FLIGHT`](super::IN_FLIGHT) carries.
pub(super) const FILL: usize = super::MAX_BATCH / 4;
/// The most calls beyond [`IN_FLIGHT`](super::IN_FLIGHT) at once.
pub(super) const EXTRA: usize = 6;

/// The permits of the calls beyond [`IN_FLIGHT`](super::IN_FLIGHT), and the batching task's
/// wake-up when enough requests wait for one.
#[derive(Debug)]
pub(super) struct Fill {
    full: Notify,
    permits: Arc<Semaphore>,
    /// Requests the task holds out of the queue.
    held: AtomicUsize,
}

impl Fill {
    pub(super) fn new() -> Self {
        Self {
            full: Notify::new(),
            permits: Arc::new(Semaphore::new(EXTRA)),
            held: AtomicUsize::new(0),
        }
    }

    /// Called by a sender after it queued a request, with how many wait in
    /// the queue: wakes the task once a call beyond
    /// [`IN_FLIGHT`](super::IN_FLIGHT) would be full enough.
    pub(super) fn queued(&self, in_queue: usize) {
        if in_queue + self.held.load(Ordering::Relaxed) >= FILL {
            self.full.notify_one();
        }
    }

    /// Called by the task when the requests it holds out of the queue are
    /// now `held`.
    pub(super) fn holding(&self, held: usize) {
        self.held.store(held, Ordering::Relaxed);
    }

    /// Completes when a sender found [`FILL`] requests waiting (or had
    /// before the task last looked).
    pub(super) fn full(&self) -> Notified<'_> {
        self.full.notified()
    }

    /// A permit for a call beyond [`IN_FLIGHT`](super::IN_FLIGHT), if `waiting` requests fill
    /// one and fewer than [`EXTRA`] such calls are out.
    pub(super) fn permit(&self, waiting: usize) -> Option<OwnedSemaphorePermit> {
        if waiting < FILL {
            return None;
        }
        self.permits.clone().try_acquire_owned().ok()
    }
}
