//! Deadlines of batched requests: each is answered `Error::Timeout` at its
//! own, whether it waits for a round (in the queue or held) or is in a call
//! Redis has not answered; see `batch.rs`.

use std::{
    future::Future,
    pin::{Pin, pin},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use pin_project_lite::pin_project;
use tokio::{
    sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot},
    time::{Instant, Sleep},
};

use super::{Job, QUEUE, Reply, fill::Fill};
use crate::Error;

/// Who waits for a request's answer, and until when.
pub(super) struct Waiter {
    /// `None` once answered.
    pub(super) reply: Option<oneshot::Sender<Reply>>,
    /// `None` for a caller that bounds the wait itself.
    pub(super) deadline: Option<Deadline>,
}

impl Waiter {
    /// Whether nobody waits any more: answered, or the caller went away.
    pub(super) fn gone(&self) -> bool {
        self.reply.as_ref().is_none_or(|reply| reply.is_closed())
    }

    /// As [`gone`](Self::gone), and if not, wakes `cx`'s task when the
    /// caller goes away.
    pub(super) fn poll_gone(&mut self, cx: &mut Context<'_>) -> bool {
        self.reply
            .as_mut()
            .is_none_or(|reply| reply.poll_closed(cx).is_ready())
    }

    /// The deadline of a request still waiting.
    pub(super) fn due(&self) -> Option<Instant> {
        self.deadline
            .filter(|_| self.reply.is_some())
            .map(|deadline| deadline.at)
    }

    /// Answers `Error::Timeout` if the deadline has passed at `now`.
    pub(super) fn expire(&mut self, now: Instant) {
        if let Some(deadline) = self.deadline
            && deadline.at <= now
            && let Some(reply) = self.reply.take()
        {
            let _ = reply.send(Err(Error::Timeout(deadline.timeout)));
        }
    }

    pub(super) fn answer(&mut self, answer: Reply) {
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(answer);
        }
    }
}

/// When a queued request stops waiting: its limiter's timeout after it was
/// asked. The batching task answers it [`Error::Timeout`] then.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    at: Instant,
    timeout: Duration,
}

impl Deadline {
    /// `timeout` from now; `None` if that is too far to tell (the caller
    /// then keeps a timer of its own).
    pub(crate) fn after(timeout: Duration) -> Option<Self> {
        let at = Instant::now().checked_add(timeout)?;
        Some(Self { at, timeout })
    }
}

/// The shortest timeout of any request queued so far, which the task's
/// sweeps of its queue go by (see [`Sweep`]), and its wake-up when a
/// shorter one comes.
#[derive(Debug)]
pub(super) struct Shortest {
    nanos: AtomicU64,
    shorter: Notify,
    /// Notified with `shorter`, for a router read ([`cut`](Self::cut)):
    /// apart, so that a read does not take the sweep's wake-up.
    shorter_for_read: Notify,
}

impl Shortest {
    pub(super) fn new() -> Self {
        Self {
            nanos: AtomicU64::new(u64::MAX),
            shorter: Notify::new(),
            shorter_for_read: Notify::new(),
        }
    }

    /// Resolves at `until` (never, if `None`; [`read_until`] gives it, the
    /// shortest timeout known then included), or sooner: once a timeout
    /// shorter than any before is noted (a request queued while a router
    /// read waits, with no timer of its own), at now plus that timeout.
    pub(super) async fn cut(&self, mut until: Option<Instant>) {
        loop {
            let noted = self.shorter_for_read.notified();
            match until {
                Some(at) => {
                    if first(tokio::time::sleep_until(at), noted).await {
                        return;
                    }
                }
                None => noted.await,
            }
            let queued = self.get().and_then(|t| Instant::now().checked_add(t));
            until = earliest(until, queued);
        }
    }

    pub(super) fn get(&self) -> Option<Duration> {
        match self.nanos.load(Ordering::Relaxed) {
            u64::MAX => None,
            nanos => Some(Duration::from_nanos(nanos)),
        }
    }

    /// Notes `deadline`'s timeout, waking the task if it is shorter than
    /// any before.
    pub(super) fn note(&self, deadline: Deadline) {
        let nanos = u64::try_from(deadline.timeout.as_nanos()).unwrap_or(u64::MAX - 1);
        if nanos < self.nanos.load(Ordering::Relaxed) {
            self.nanos.fetch_min(nanos, Ordering::Relaxed);
            self.shorter.notify_one();
            self.shorter_for_read.notify_one();
        }
    }
}

/// Requests taken from the queue to wait for a round, oldest first, with
/// the earliest of their deadlines.
#[derive(Default)]
pub(super) struct Held {
    pub(super) jobs: Vec<Job>,
    earliest: Option<Instant>,
}

impl Held {
    pub(super) fn push(&mut self, job: Job) {
        if let Some(at) = job.waiter.due() {
            self.earliest = Some(self.earliest.map_or(at, |earliest| earliest.min(at)));
        }
        self.jobs.push(job);
    }

    /// Moves the oldest `n` into `jobs`, leaving the rest.
    pub(super) fn take_into(&mut self, jobs: &mut Vec<Job>, n: usize) {
        jobs.extend(self.jobs.drain(..n.min(self.jobs.len())));
        self.earliest = self.jobs.iter().filter_map(|job| job.waiter.due()).min();
    }

    /// Answers those due at `now` with a timeout, and drops those nobody
    /// waits for.
    fn expire(&mut self, now: Instant) {
        drop_finished(&mut self.jobs, now);
        self.earliest = self.jobs.iter().filter_map(|job| job.waiter.due()).min();
    }
}

/// Answers the jobs due at `now` with a timeout, and drops those nobody
/// waits for (answered, or the caller went away).
pub(super) fn drop_finished(jobs: &mut Vec<Job>, now: Instant) {
    let finished = |job: &Job| job.waiter.due().is_some_and(|at| at <= now) || job.waiter.gone();
    if !jobs.iter().any(finished) {
        return;
    }
    for job in jobs.iter_mut() {
        job.waiter.expire(now);
    }
    jobs.retain(|job| !job.waiter.gone());
}

/// The earlier of two instants, either of which may be unknown.
pub(super) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Awaits whichever of `a` and `b` ends first: `true` if `a` did.
pub(super) async fn first(a: impl Future, b: impl Future) -> bool {
    let (mut a, mut b) = (pin!(a), pin!(b));
    std::future::poll_fn(|cx| {
        if a.as_mut().poll(cx).is_ready() {
            return Poll::Ready(true);
        }
        b.as_mut().poll(cx).map(|_| false)
    })
    .await
}

/// When a read of the router made at `now`, before a round, must end: by
/// the round's earliest deadline (`due`), the queue's next sweep (`sweep`,
/// if still ahead), and the deadline of a request that may queue while it
/// reads: `now` plus the shortest timeout any request has had. Nothing
/// sweeps the queue during the read, and a request there on a multi-thread
/// runtime has no timer of its own: a limiter of 20 ms sharing the store
/// with one of 200 ms was answered at the 200 ms one's deadline.
pub(super) fn read_until(
    due: Option<Instant>,
    sweep: Option<Instant>,
    shortest: &Shortest,
    now: Instant,
) -> Option<Instant> {
    let queued = shortest.get().and_then(|t| now.checked_add(t));
    earliest(earliest(due, sweep.filter(|next| *next > now)), queued)
}

/// What waits for a round's permit: the queue and the requests held.
pub(super) struct Waiting<'a> {
    pub(super) queue: &'a mut mpsc::Receiver<Job>,
    pub(super) held: &'a mut Held,
    pub(super) shortest: &'a Shortest,
    pub(super) fill: &'a Fill,
}

/// Timeouts of requests still in the queue, which the task does not see:
/// while it waits for a round's permit, it sweeps the queue into [`Held`]
/// (where each request is answered at its deadline) every shortest timeout
/// of the requests queued so far. A request queued after a sweep is due no
/// sooner than the next, unless its timeout is shorter than any before,
/// which wakes the task for a sweep at once. So the queue is not watched
/// request by request (a wake-up of the task each, which cost more than
/// the timer it saves), and each request is still answered at its
/// deadline.
pub(super) struct Sweep {
    timer: Pin<Box<Timer>>,
    /// When the next sweep is due; `None` before the first.
    pub(super) next: Option<Instant>,
}

impl Sweep {
    pub(super) fn new() -> Self {
        Self {
            timer: Box::pin(Timer::new()),
            next: None,
        }
    }

    /// Waits for a round's permit, sweeping the queue when due: one of the
    /// [`IN_FLIGHT`](super::IN_FLIGHT) rounds', or of a round beyond them
    /// once enough requests wait ([`Fill`]).
    pub(super) async fn until_permit(
        &mut self,
        permits: &Arc<Semaphore>,
        waiting: Waiting<'_>,
    ) -> OwnedSemaphorePermit {
        let Waiting {
            queue,
            held,
            shortest,
            fill,
        } = waiting;
        // More wait than the last round took: a round beyond them at once.
        if let Some(permit) = fill.permit(held.jobs.len() + queue.len()) {
            return permit;
        }
        let mut acquire = pin!(permits.clone().acquire_owned());
        let mut shorter = pin!(shortest.shorter.notified());
        let mut woken = pin!(fill.woken());
        // Never swept since requests with a timeout came: sweep now.
        let mut due = self.next.is_none() && shortest.get().is_some();
        std::future::poll_fn(|cx| {
            // The task holds the semaphore, so it is never closed.
            if let Poll::Ready(Ok(permit)) = acquire.as_mut().poll(cx) {
                return Poll::Ready(permit);
            }
            while woken.as_mut().poll(cx).is_ready() {
                woken.set(fill.woken());
                if let Some(permit) = fill.permit(held.jobs.len() + queue.len()) {
                    return Poll::Ready(permit);
                }
            }
            while shorter.as_mut().poll(cx).is_ready() {
                shorter.set(shortest.shorter.notified());
                due = true;
            }
            loop {
                let at = earliest(held.earliest, self.next);
                if !std::mem::take(&mut due) && !self.timer.as_mut().poll_at(at, cx) {
                    return Poll::Pending;
                }
                let now = Instant::now();
                while held.jobs.len() < QUEUE {
                    match queue.try_recv() {
                        Ok(job) => held.push(job),
                        Err(_) => break,
                    }
                }
                self.next = shortest.get().and_then(|t| now.checked_add(t));
                held.expire(now);
                fill.holding(held.jobs.len());
                if let Some(permit) = fill.permit(held.jobs.len() + queue.len()) {
                    return Poll::Ready(permit);
                }
            }
        })
        .await
    }
}

pin_project! {
    /// One timer, re-armed to the earliest deadline of what waits; made at
    /// its first deadline and kept for the next (a lane's calls share one).
    ///
    /// Each call of a lane arms it, most often at a later deadline than
    /// the last, which Tokio takes as a store to the timer's state: the
    /// timer stays in the wheel where it is. A timer made and dropped for
    /// each call (boxed, as `Sleep` is not `Unpin`) cost each call an
    /// allocation, a reference to the runtime's handle and the wheel's
    /// insert and removal.
    pub(super) struct Timer {
        #[pin]
        sleep: Option<Sleep>,
        at: Option<Instant>,
    }
}

impl Timer {
    pub(super) const fn new() -> Self {
        Self {
            sleep: None,
            at: None,
        }
    }

    /// Whether `at` (if any) has come; otherwise `cx` is woken when it does.
    /// A timer armed earlier and not awaited since may still wake `cx` at
    /// the deadline it had then: a wake-up for nothing, and no more.
    fn poll_at(self: Pin<&mut Self>, at: Option<Instant>, cx: &mut Context<'_>) -> bool {
        let Some(at) = at else {
            return false;
        };
        let mut this = self.project();
        if *this.at != Some(at) {
            match this.sleep.as_mut().as_pin_mut() {
                Some(sleep) => sleep.reset(at),
                None => this.sleep.set(Some(tokio::time::sleep_until(at))),
            }
            *this.at = Some(at);
        }
        (this.sleep.as_pin_mut()).is_some_and(|sleep| sleep.poll(cx).is_ready())
    }
}

/// A call's hold on its round's permit: given back (`permit` set to
/// `None`) at `until`, if the call is still out then.
pub(super) struct Hold<'a> {
    pub(super) permit: &'a mut Option<Arc<OwnedSemaphorePermit>>,
    pub(super) until: Option<Instant>,
}

/// Awaits `call`, answering each waiter whose deadline comes first with a
/// timeout (on `timer`), and giving back `hold`'s permit at its time;
/// `None` (the call dropped) once nobody waits for it.
pub(super) async fn within_deadlines<F: Future>(
    call: F,
    waiters: &mut [Waiter],
    mut timer: Pin<&mut Timer>,
    hold: Hold<'_>,
) -> Option<F::Output> {
    let mut call = pin!(call);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(output) = call.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        loop {
            let due = waiters.iter().filter_map(Waiter::due).min();
            let release = hold.until.filter(|_| hold.permit.is_some());
            // Callers that bound their wait themselves (`Store::decide`,
            // the limiter's timer): woken when one goes away, and the call
            // dropped once all have. Otherwise a call a node never answers
            // held its round after its callers had timed out.
            if due.is_none() && waiters.iter_mut().all(|w| w.poll_gone(cx)) {
                return Poll::Ready(None);
            }
            let Some(at) = earliest(due, release) else {
                return Poll::Pending;
            };
            if !timer.as_mut().poll_at(Some(at), cx) {
                return Poll::Pending;
            }
            let now = Instant::now();
            if release.is_some_and(|release| release <= now) {
                *hold.permit = None;
            }
            for waiter in waiters.iter_mut() {
                waiter.expire(now);
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deadline(timeout_ms: u64) -> Deadline {
        Deadline::after(Duration::from_millis(timeout_ms)).unwrap()
    }

    /// Fails without the shortest timeout in the bound: a read before a
    /// round of 200 ms requests could last their 200 ms while a 20 ms
    /// request waited in the queue, unswept.
    #[tokio::test(start_paused = true)]
    async fn a_router_read_ends_by_the_deadline_of_a_request_queued_meanwhile() {
        let now = Instant::now();
        let due = Some(now + Duration::from_millis(200));
        let shortest = Shortest::new();
        assert_eq!(read_until(due, None, &shortest, now), due);
        shortest.note(deadline(200));
        shortest.note(deadline(20));
        let until = read_until(due, None, &shortest, now);
        assert_eq!(until, Some(now + Duration::from_millis(20)));
        // A sweep due sooner bounds it; one already past does not.
        let soon = Some(now + Duration::from_millis(5));
        assert_eq!(read_until(due, soon, &shortest, now), soon);
        let past = Some(now - Duration::from_millis(5));
        assert_eq!(read_until(due, past, &shortest, now), until);
    }
}
