//! Batching: concurrent decisions share one script call.
//!
//! On a standalone Redis behind the `ConnectionManager`, and on a Redis
//! Cluster behind one cluster connection, every decision goes through one
//! background task. The task takes what is waiting as one round, with at
//! most [`IN_FLIGHT`] rounds outstanding (on a standalone Redis, up to
//! [`EXTRA`](fill::EXTRA) more, each only when at least
//! [`FILL`](fill::FILL) requests wait for it: `batch_fill.rs`), and sends
//! each group of it as one `EVALSHA` of the decide script (up to
//! [`MAX_BATCH`] requests). On a standalone Redis a round is one call; on a
//! cluster a round (up to 8 calls' worth) is split by node, from a slot
//! map (`batch_cluster.rs`), and its calls go out at once. Nothing waits
//! to fill a batch: a lone request is sent at once, and requests queue
//! only while earlier rounds are in flight, so batches grow exactly when
//! the server is busy. Each
//! request is still decided on its own, all or nothing, inside the one
//! atomic script run. This cuts Redis's per-command work and the round
//! trips, syscalls and parsing on both sides, and on a cluster the
//! per-request routing of redis-rs's cluster connection, which under a
//! burst of 2000 concurrent calls took longer than the limiter's timeout.
//!
//! A request the [`Limiter`](crate::Limiter) queues carries its
//! [`Deadline`], and the task answers it `Error::Timeout` then, whether it
//! still waits for a round or is in a call that Redis has not answered
//! (`batch_deadline.rs`). So the request needs no timer of its own, which
//! cost about 650 instructions a request; a call has one, and the queue
//! is swept on one while every round is out. A call whose requests have all
//! timed out is dropped, so a Redis that never answers holds no round's
//! permit past their deadlines; on a cluster, whose rounds are calls to
//! several nodes, a call gives its round's permit back once it has waited
//! [`Batched::DETACH`], so that a node that never answers holds up no
//! other node's requests. A request without a deadline (through
//! [`Store::decide`](crate::Store::decide), whose caller keeps its own
//! timer) counts as waiting until its caller goes away: a call is dropped
//! once every caller of it has gone too.
//!
//! That holds while the task runs. It runs on the Tokio runtime of the
//! store's first check, and a runtime can stop running it:
//!
//! * a handler that blocks the thread of a current-thread runtime (each of
//!   actix-web's workers has one) holds up every task of that runtime. So a
//!   request counts on the task for its deadline only when the task runs on
//!   a multi-thread runtime (whose other workers go on running it, as a
//!   rule), or on the request's own runtime (which then runs, since it
//!   polls the request); a request from another runtime, or queued where
//!   no runtime is (a tower service called outside one), keeps a timer of
//!   its own, on the runtime that polls it ([`Batcher::submit`]);
//! * a runtime that is dropped drops the task: the next request finds its
//!   queue closed and starts a task again, on its own runtime.
//!
//! Calls go out on long-lived tasks (`batch_lanes.rs`), one for each call
//! that may be in flight, not a task spawned per call, which cost a call
//! about 3,000 instructions.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU8, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use arc_swap::{ArcSwapOption, Guard};
use redis::aio::ConnectionLike;
use smallvec::{SmallVec, smallvec};
use tokio::{
    runtime::{Handle, RuntimeFlavor},
    sync::{
        OwnedSemaphorePermit, Semaphore,
        mpsc::{self, error::TrySendError},
        oneshot,
    },
    time::Instant,
};

use super::{
    BoxFuture, Checks, LimitCheck,
    redis::{Request, decide, decide_spread},
};
use crate::{Error, decision::Answered};

#[cfg(feature = "cluster")]
#[path = "batch_cluster.rs"]
mod cluster;
#[path = "batch_deadline.rs"]
mod deadline;
#[path = "batch_fill.rs"]
mod fill;
#[path = "batch_lanes.rs"]
mod lanes;
#[path = "batch_routing.rs"]
mod routing;

pub(crate) use self::deadline::Deadline;
use self::{
    deadline::{
        Held, Hold, Shortest, Sweep, Timer, Waiter, Waiting, drop_finished, read_until,
        within_deadlines,
    },
    fill::Fill,
    lanes::Lanes,
    routing::Routing,
};

/// The most requests in one script call.
pub(crate) const MAX_BATCH: usize = 64;
/// The most script calls outstanding at once.
pub(crate) const IN_FLIGHT: usize = 2;
/// Requests that may wait; beyond it, requests go unbatched.
const QUEUE: usize = 4096;

type Reply = Result<Answered, Error>;

struct Job {
    checks: Checks,
    cost: u64,
    waiter: Waiter,
}

/// A connection the batching task can send on.
pub(super) trait Batched: ConnectionLike + Clone + Send + Sync + 'static {
    /// What requests must share to go in one call.
    type Group: PartialEq + Send + 'static;

    /// What the task reads to group requests (a cluster's slot map), read
    /// again every [`ROUTER_AGE`] and after a failed call.
    type Router: Default + Send + Sync + 'static;

    /// The most requests in one round (each call still holds at most
    /// [`MAX_BATCH`]).
    const ROUND: usize;

    /// Reads the router.
    fn router(&self) -> BoxFuture<'static, Self::Router>;

    /// The group of a request, from its limits and cost.
    fn group(router: &Self::Router, checks: &[LimitCheck], cost: u64) -> Self::Group;

    /// Whether rounds beyond [`IN_FLIGHT`] may go once enough requests
    /// wait (`batch_fill.rs`): where a round is one call, so that each
    /// such call carries at least [`FILL`](fill::FILL) requests.
    const FILLS: bool = true;

    /// Whether a group's call may hold keys of several hash slots (a
    /// cluster node's fixed-window requests: `lua/decide_fixed.lua`).
    fn spread(_group: &Self::Group) -> bool {
        false
    }

    /// How long a call holds its round's permit at most, if not until it
    /// ends: where a round is several calls (to several cluster nodes), so that
    /// a node that does not answer holds up no round, and with it no other
    /// node's requests, past this. The call goes on awaiting its answer.
    const DETACH: Option<Duration> = None;
}

/// How long a router is used before it is read again.
const ROUTER_AGE: Duration = Duration::from_secs(5);

impl Batched for super::redis::Standalone {
    type Group = ();
    type Router = ();

    /// One call a round: a standalone Redis runs one script at a time.
    const ROUND: usize = MAX_BATCH;

    fn router(&self) -> BoxFuture<'static, ()> {
        Box::pin(std::future::ready(()))
    }

    fn group(_: &(), _: &[LimitCheck], _: u64) {}
}

#[cfg(feature = "sentinel")]
impl Batched for super::redis::SentinelMaster {
    type Group = ();
    type Router = ();

    /// One call a round, as on any standalone Redis.
    const ROUND: usize = MAX_BATCH;

    fn router(&self) -> BoxFuture<'static, ()> {
        Box::pin(std::future::ready(()))
    }

    fn group(_: &(), _: &[LimitCheck], _: u64) {}
}

/// The handle to a connection's batching task, started on first use, and
/// again on the runtime of a later request once the task's own runtime is
/// gone.
#[derive(Debug, Clone, Default)]
pub(super) struct Batcher {
    links: Arc<Links>,
}

/// The ways to a connection's batching tasks: the first, and the one
/// started last after the first one's runtime was gone.
///
/// The first is a `OnceLock`, which a request reads with one load, as
/// before: a task that another runtime must take over (a runtime dropped
/// while the store lives on) is rare, and a request pays for the swappable
/// `later` (its load writes a slot of this thread's, and the failed send
/// to the first task before it) only once that has happened.
#[derive(Debug, Default)]
struct Links {
    first: OnceLock<Link>,
    later: ArcSwapOption<Link>,
}

/// The way to a running batching task.
#[derive(Debug)]
struct Link {
    queue: mpsc::Sender<Job>,
    shortest: Arc<Shortest>,
    fill: Arc<Fill>,
    host: Host,
}

/// What the runtime a batching task runs on says of the task's deadlines.
#[derive(Debug, Clone, Copy)]
enum Host {
    /// A multi-thread runtime: a handler that blocks one of its workers
    /// leaves the others to run the task (as a rule: Tokio's workers do not
    /// steal the one task a worker keeps in its LIFO slot), which answers
    /// every request by its deadline.
    Shared,
    /// A current-thread runtime (this one, by its id): a handler that
    /// blocks its thread holds the task up, so that only the runtime's own
    /// requests may count on the task for their deadlines.
    Alone(tokio::runtime::Id),
}

impl Host {
    fn of(runtime: &Handle) -> Self {
        match runtime.runtime_flavor() {
            RuntimeFlavor::CurrentThread => Host::Alone(runtime.id()),
            _ => Host::Shared,
        }
    }

    /// Whether a request asked here gets its answer by its deadline from
    /// the task alone.
    fn bounds_here(self) -> bool {
        match self {
            Host::Shared => true,
            // On the task's runtime, which runs (it polls the request).
            // Asked where no runtime is (a tower service called outside
            // one), the request may be polled on another runtime while the
            // task's is blocked: it keeps a timer of its own, armed where
            // it is first polled.
            Host::Alone(id) => Handle::try_current().is_ok_and(|here| here.id() == id),
        }
    }
}

impl Link {
    /// A link to a task not yet started on `runtime`, and the task's queue.
    fn new<C: Batched>(runtime: &Handle) -> (Self, mpsc::Receiver<Job>) {
        let (queue, rx) = mpsc::channel(QUEUE);
        let link = Link {
            queue,
            shortest: Arc::new(Shortest::new()),
            fill: Arc::new(Fill::new(C::FILLS)),
            host: Host::of(runtime),
        };
        (link, rx)
    }

    /// Starts the task of a link from [`new`](Self::new) on `runtime`.
    fn spawn<C: Batched>(&self, queue: mpsc::Receiver<Job>, conn: &C, runtime: &Handle) {
        let (shortest, fill) = (self.shortest.clone(), self.fill.clone());
        runtime.spawn(run(queue, conn.clone(), shortest, fill));
    }

    /// A link to a task started on `runtime`.
    fn start<C: Batched>(conn: &C, runtime: &Handle) -> Self {
        let (link, queue) = Self::new::<C>(runtime);
        link.spawn(queue, conn, runtime);
        link
    }

    /// Queues `job`, or hands it back.
    fn send(&self, job: Job) -> Sending {
        if let Some(deadline) = job.waiter.deadline {
            self.shortest.note(deadline);
        }
        match self.queue.try_send(job) {
            Ok(()) => {
                let queue = &self.queue;
                self.fill.queued(queue.max_capacity() - queue.capacity());
                Sending::Queued
            }
            Err(TrySendError::Full(job)) => Sending::Full(job),
            Err(TrySendError::Closed(job)) => Sending::Gone(job),
        }
    }
}

/// What became of a request sent to a task ([`Link::send`]).
enum Sending {
    Queued,
    /// Handed back: the queue is full.
    Full(Job),
    /// Handed back: the task is gone, with its runtime.
    Gone(Job),
}

impl Batcher {
    /// The same for every clone of this batcher (of one store).
    pub(super) fn instance(&self) -> usize {
        Arc::as_ptr(&self.links) as *const () as usize
    }

    /// Queues a request, or hands it back when it cannot be batched (no
    /// Tokio runtime to run the task, or the queue full). With a
    /// `deadline`, the task answers by it, and with the answer comes
    /// whether the request may count on that alone: it has a deadline, and
    /// the task runs on a multi-thread runtime or on the request's own
    /// (see the module docs). Otherwise the caller keeps a timer of its
    /// own.
    pub(super) fn submit<C: Batched>(
        &self,
        conn: &C,
        checks: Checks,
        cost: u64,
        deadline: Option<Deadline>,
    ) -> Result<(Answer, bool), (Checks, u64)> {
        let link = match self.links.first.get() {
            Some(link) => link,
            None => match Handle::try_current() {
                Ok(runtime) => self.links.first.get_or_init(|| Link::start(conn, &runtime)),
                Err(_) => return Err((checks, cost)),
            },
        };
        let (reply, answer) = oneshot::channel();
        let job = Job {
            checks,
            cost,
            waiter: Waiter {
                reply: Some(reply),
                deadline,
            },
        };
        let host = match link.send(job) {
            Sending::Queued => link.host,
            Sending::Gone(job) => self.again(conn, job)?,
            Sending::Full(job) => return Err((job.checks, job.cost)),
        };
        let bounded = deadline.is_some() && host.bounds_here();
        Ok((Answer { answer }, bounded))
    }

    /// Queues `job` for the task started after the first one's runtime was
    /// gone (dropped, and the task with it), starting one on this runtime
    /// if there is none or its runtime is gone too; the runtime the job's
    /// task runs on.
    fn again<C: Batched>(&self, conn: &C, job: Job) -> Result<Host, (Checks, u64)> {
        let later = self.links.later.load();
        let job = match &*later {
            Some(link) => match link.send(job) {
                Sending::Queued => return Ok(link.host),
                Sending::Gone(job) => job,
                Sending::Full(job) => return Err((job.checks, job.cost)),
            },
            None => job,
        };
        let Ok(runtime) = Handle::try_current() else {
            return Err((job.checks, job.cost));
        };
        let (link, queue) = Link::new::<C>(&runtime);
        let link = Arc::new(link);
        let before = self
            .links
            .later
            .compare_and_swap(&later, Some(link.clone()));
        let link = match same(&before, &later) {
            true => {
                link.spawn(queue, conn, &runtime);
                link
            }
            // Another request started one first: this job goes to it.
            false => match Guard::into_inner(before) {
                Some(link) => link,
                None => return Err((job.checks, job.cost)),
            },
        };
        match link.send(job) {
            Sending::Queued => Ok(link.host),
            Sending::Full(job) | Sending::Gone(job) => Err((job.checks, job.cost)),
        }
    }
}

/// Whether two loads of [`Links::later`] found the same link.
fn same(a: &Option<Arc<Link>>, b: &Option<Arc<Link>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (a, b) => a.is_none() && b.is_none(),
    }
}

/// A queued request's answer, from the batching task: by the request's
/// [`Deadline`], if it had one (a timeout then), so that the caller needs no
/// timer, where [`Batcher::submit`] says so.
pub(crate) struct Answer {
    answer: oneshot::Receiver<Reply>,
}

impl Future for Answer {
    type Output = Reply;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Reply> {
        Pin::new(&mut self.answer).poll(cx).map(|answer| {
            answer.unwrap_or_else(|_| Err(Error::UnexpectedReply("batching task stopped".into())))
        })
    }
}

/// Takes what is waiting, up to [`MAX_BATCH`], whenever a round may start,
/// and sends it as one call per group.
async fn run<C: Batched>(
    mut queue: mpsc::Receiver<Job>,
    conn: C,
    shortest: Arc<Shortest>,
    fill: Arc<Fill>,
) {
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    let lanes = Lanes::start(&conn, &fill);
    // Read before the first round, as after a failed call: bounded by its
    // requests' earliest deadline (a read that waited for a frozen node
    // before the task swept anything held every queued request past its
    // own), then in the background.
    let mut routing = Routing::new(Default::default());
    // Set by a call that failed: the router is read again before the next
    // round (a cluster's slots may have moved); or, for a call that timed
    // out, in the background (see `Doubt`).
    let stale = Arc::new(AtomicU8::new(Doubt::Failed as u8));
    // Requests taken from the queue while every round's permit was out.
    let mut held = Held::default();
    let mut sweep = Sweep::new();
    loop {
        if held.jobs.is_empty() {
            match queue.recv().await {
                Some(job) => held.push(job),
                None => return,
            }
        }
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                let waiting = Waiting {
                    queue: &mut queue,
                    held: &mut held,
                    shortest: &shortest,
                    fill: &fill,
                };
                sweep.until_permit(&permits, waiting).await
            }
        };
        let mut jobs = Vec::with_capacity(C::ROUND.min(held.jobs.len() + queue.len()));
        held.take_into(&mut jobs, C::ROUND);
        fill.holding(held.jobs.len());
        // What waits, at once: `recv_many` gives the queue back its room
        // once for all, where `try_recv` did for each request under the
        // queue's lock (about 100 instructions a request). The queue is not
        // empty, so it does not wait (unless Tokio's budget says yield).
        let room = C::ROUND - jobs.len();
        if room > 0 && !queue.is_empty() {
            queue.recv_many(&mut jobs, room).await;
        }
        // A stale router is read again, by the round's earliest deadline,
        // the queue's next sweep and the deadline of a request queued
        // meanwhile (`read_until`; and `Shortest::cut` ends the read sooner
        // for a request whose timeout is shorter than any before). A sweep
        // due at or before now bounds nothing (it is set only while the
        // task waits for a permit, and left behind once the burst ends): it
        // would leave the read no time.
        let doubt = stale.swap(Doubt::None as u8, Ordering::Relaxed);
        let reread = doubt == Doubt::Failed as u8;
        let until = reread
            .then(|| {
                let due = jobs.iter().filter_map(|job| job.waiter.due()).min();
                read_until(due, sweep.next, &shortest, Instant::now())
            })
            .flatten();
        let doubtful = doubt == Doubt::TimedOut as u8;
        let router = (routing.current(&conn, reread, doubtful, shortest.cut(until))).await;
        // Requests past their deadline, and those nobody awaits any more,
        // cost Redis nothing. (A limiter's check its caller gave up on is
        // still awaited, for the breaker: `Settling`'s `Drop`.)
        drop_finished(&mut jobs, Instant::now());
        if jobs.is_empty() {
            continue;
        }
        let groups = group::<C>(&router, jobs);
        // The round's permit is free again once its last call is answered.
        let permit = Arc::new(permit);
        for (group, jobs) in groups {
            let call = Sent {
                spread: C::spread(&group),
                stale: stale.clone(),
            };
            lanes.send(jobs, call, permit.clone());
        }
    }
}

/// A round's groups of requests: inline for the one group of nearly every
/// round (all of a standalone Redis's rounds).
type Groups<G> = SmallVec<[(G, Vec<Job>); 1]>;

/// A round's requests by group, each group in calls of at most
/// [`MAX_BATCH`]: as they are when they fit one call (a standalone Redis's
/// round always does), without moving them.
fn group<C: Batched>(router: &C::Router, jobs: Vec<Job>) -> Groups<C::Group> {
    let Some(head) = jobs.first() else {
        return Groups::new();
    };
    let first = C::group(router, &head.checks, head.cost);
    if jobs.len() <= MAX_BATCH
        && jobs
            .iter()
            .skip(1)
            .all(|job| C::group(router, &job.checks, job.cost) == first)
    {
        return smallvec![(first, jobs)];
    }
    let mut groups = Groups::new();
    let count = jobs.len();
    for (i, job) in jobs.into_iter().enumerate() {
        let group = C::group(router, &job.checks, job.cost);
        let open = |(g, jobs): &&mut (C::Group, Vec<Job>)| *g == group && jobs.len() < MAX_BATCH;
        match groups.iter_mut().find(open) {
            Some((_, jobs)) => jobs.push(job),
            None => {
                // Room for every job left (one group, as a rule).
                let mut jobs = Vec::with_capacity((count - i).min(MAX_BATCH));
                jobs.push(job);
                groups.push((group, jobs));
            }
        }
    }
    groups
}

/// A call on its way, for [`send`].
struct Sent {
    /// Its keys may be of several hash slots of one node.
    spread: bool,
    /// Raised (to a [`Doubt`]) if it fails or times out.
    stale: Arc<AtomicU8>,
}

/// What the last calls say of the router, in rising doubt.
#[derive(Clone, Copy)]
#[repr(u8)]
enum Doubt {
    None = 0,
    /// Every request of a call timed out: a node may be slow or gone, or
    /// its slots moved. The router is read again in the background: a read
    /// before the next round could wait for that very node (`CLUSTER SLOTS`
    /// goes to any node), holding up every other node's requests until
    /// their deadlines.
    TimedOut = 1,
    /// A call failed (`MOVED`, `CROSSSLOT`, a lost connection): the router
    /// is read again before the next round (in the background at once, if
    /// it cannot be read by the round's earliest deadline).
    Failed = 2,
}

/// Sends one group of requests as one call and answers each request, or
/// a timeout at its deadline.
///
/// `permit` is the round's, held until the call ends or, on a store whose
/// rounds are several calls, [`Batched::DETACH`] after it was sent; given
/// back if still held, for the lane to drop once idle.
async fn send<C: Batched>(
    mut jobs: Vec<Job>,
    conn: &mut C,
    call: Sent,
    timer: Pin<&mut Timer>,
    permit: Arc<OwnedSemaphorePermit>,
) -> Option<Arc<OwnedSemaphorePermit>> {
    // Inline for the batches of nearly every call (about 8 requests under
    // load), as the call's own vectors are.
    let mut waiters: SmallVec<[Waiter; 16]> = jobs
        .iter_mut()
        .map(|job| Waiter {
            reply: job.waiter.reply.take(),
            deadline: job.waiter.deadline,
        })
        .collect();
    let requests: SmallVec<[Request<'_>; 16]> = jobs
        .iter()
        .map(|job| Request {
            checks: &job.checks,
            cost: job.cost,
        })
        .collect();
    let decided = async {
        match call.spread {
            true => decide_spread(conn, &requests).await,
            false => decide(conn, &requests).await,
        }
    };
    let mut held = Some(permit);
    let hold = Hold {
        permit: &mut held,
        until: C::DETACH.map(|detach| Instant::now() + detach),
    };
    let result = within_deadlines(decided, &mut waiters, timer, hold).await;
    drop(requests);
    match result {
        Some(Ok(answers)) => {
            for (waiter, answer) in waiters.iter_mut().zip(answers) {
                waiter.answer(Ok(answer));
            }
        }
        Some(Err(e)) => {
            call.stale.fetch_max(Doubt::Failed as u8, Ordering::Relaxed);
            for waiter in &mut waiters {
                waiter.answer(Err(e.clone_for_batch()));
            }
        }
        // Every request timed out: the call is dropped (Redis may still
        // apply it, as with any timed-out call).
        None => {
            (call.stale).fetch_max(Doubt::TimedOut as u8, Ordering::Relaxed);
        }
    }
    held
}
