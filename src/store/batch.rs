//! Batching: concurrent decisions share one script call.
//!
//! On a standalone Redis behind the `ConnectionManager`, and on a Redis
//! Cluster behind one cluster connection, every decision goes through one
//! background task. The task takes what is waiting as one round, with at
//! most [`IN_FLIGHT`] rounds outstanding, and sends each group of it as one
//! `EVALSHA` of the decide script (up to [`MAX_BATCH`] requests). On a
//! standalone Redis a round is one call; on a cluster a round (up to 8
//! calls' worth) is split by node, from a slot map (`batch_cluster.rs`),
//! and its calls go out at once. There is no
//! timer: a lone request is sent at once, and requests queue only while
//! earlier rounds are in flight, so batches grow exactly when the server is
//! busy. Each request is still decided on its own, all or nothing, inside
//! the one atomic script run. This cuts Redis's per-command work and the
//! round trips, syscalls and parsing on both sides, and on a cluster the
//! per-request routing of redis-rs's cluster connection, which under a
//! burst of 2000 concurrent calls took longer than the limiter's timeout.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use redis::aio::{ConnectionLike, ConnectionManager};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use super::{
    BoxFuture, Checks, LimitCheck,
    redis::{Request, decide, decide_spread},
};
use crate::{Error, decision::States};

#[cfg(feature = "cluster")]
#[path = "batch_cluster.rs"]
mod cluster;

/// The most requests in one script call.
pub(crate) const MAX_BATCH: usize = 64;
/// The most script calls outstanding at once.
pub(crate) const IN_FLIGHT: usize = 2;
/// Requests that may wait; beyond it, requests go unbatched.
const QUEUE: usize = 4096;

type Reply = Result<States, Error>;

struct Job {
    checks: Checks,
    cost: u64,
    reply: oneshot::Sender<Reply>,
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

    /// The group of a request, from its limits.
    fn group(router: &Self::Router, checks: &[LimitCheck]) -> Self::Group;

    /// Whether a group's call may hold keys of several hash slots (a
    /// cluster node's fixed-window requests: `lua/decide_fixed.lua`).
    fn spread(_group: &Self::Group) -> bool {
        false
    }
}

/// How long a router is used before it is read again.
const ROUTER_AGE: Duration = Duration::from_secs(5);

impl Batched for ConnectionManager {
    type Group = ();
    type Router = ();

    /// One call a round: a standalone Redis runs one script at a time.
    const ROUND: usize = MAX_BATCH;

    fn router(&self) -> BoxFuture<'static, ()> {
        Box::pin(std::future::ready(()))
    }

    fn group(_: &(), _: &[LimitCheck]) {}
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

    fn group(_: &(), _: &[LimitCheck]) {}
}

/// The handle to a connection's batching task, started on first use.
#[derive(Debug, Clone, Default)]
pub(super) struct Batcher {
    queue: Arc<OnceLock<mpsc::Sender<Job>>>,
}

impl Batcher {
    /// The same for every clone of this batcher (of one store).
    pub(super) fn instance(&self) -> usize {
        Arc::as_ptr(&self.queue) as *const () as usize
    }

    /// Queues a request, or hands it back when it cannot be batched (no
    /// Tokio runtime to run the task, the task gone, or the queue full).
    pub(super) fn submit<C: Batched>(
        &self,
        conn: &C,
        checks: Checks,
        cost: u64,
    ) -> Result<Answer, (Checks, u64)> {
        let queue = match self.queue.get() {
            Some(queue) => queue,
            None => match tokio::runtime::Handle::try_current() {
                Ok(runtime) => self.queue.get_or_init(|| {
                    let (tx, rx) = mpsc::channel(QUEUE);
                    runtime.spawn(run(rx, conn.clone()));
                    tx
                }),
                Err(_) => return Err((checks, cost)),
            },
        };
        let (reply, answer) = oneshot::channel();
        let job = Job {
            checks,
            cost,
            reply,
        };
        match queue.try_send(job) {
            Ok(()) => Ok(Answer(answer)),
            Err(e) => {
                let job = e.into_inner();
                Err((job.checks, job.cost))
            }
        }
    }
}

/// A queued request's answer, from the batching task.
pub(crate) struct Answer(oneshot::Receiver<Reply>);

impl Future for Answer {
    type Output = Reply;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Reply> {
        Pin::new(&mut self.0).poll(cx).map(|answer| {
            answer.unwrap_or_else(|_| Err(Error::UnexpectedReply("batching task stopped".into())))
        })
    }
}

/// Takes what is waiting, up to [`MAX_BATCH`], whenever a round may start,
/// and sends it as one call per group.
async fn run<C: Batched>(mut queue: mpsc::Receiver<Job>, conn: C) {
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut routing = Routing::new(read_router(&conn).await.unwrap_or_default());
    // Set by a call that failed: the router is read again before the next
    // round (a cluster's slots may have moved).
    let stale = Arc::new(AtomicBool::new(false));
    while let Ok(permit) = permits.clone().acquire_owned().await {
        let Some(first) = queue.recv().await else {
            return;
        };
        let router = routing
            .current(&conn, stale.swap(false, Ordering::Relaxed))
            .await;
        let mut jobs = Vec::with_capacity(C::ROUND.min(queue.len() + 1));
        jobs.push(first);
        while jobs.len() < C::ROUND {
            match queue.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        // Callers that gave up (timed out, went away) cost Redis nothing.
        jobs.retain(|job| !job.reply.is_closed());
        if jobs.is_empty() {
            continue;
        }
        let mut groups: Vec<(C::Group, Vec<Job>)> = Vec::new();
        let count = jobs.len();
        for (i, job) in jobs.into_iter().enumerate() {
            let group = C::group(&router, &job.checks);
            let open =
                |(g, jobs): &&mut (C::Group, Vec<Job>)| *g == group && jobs.len() < MAX_BATCH;
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
        // The round's permit is free again once its last call is answered.
        let permit = Arc::new(permit);
        for (group, jobs) in groups {
            let call = Sent {
                spread: C::spread(&group),
                stale: stale.clone(),
                _permit: permit.clone(),
            };
            tokio::spawn(send(jobs, conn.clone(), call));
        }
    }
}

/// The router a batching task groups by: read again every [`ROUTER_AGE`]
/// in the background, so that no round waits for it, and at once (bounded
/// by [`ROUTER_WAIT`]) after a failed call.
struct Routing<R> {
    router: Arc<R>,
    read_at: tokio::time::Instant,
    /// A background read is on its way.
    reading: Arc<AtomicBool>,
    /// What the last background read found, not yet in use.
    fresh: Arc<std::sync::Mutex<Option<Arc<R>>>>,
}

impl<R: Default + Send + Sync + 'static> Routing<R> {
    fn new(router: Arc<R>) -> Self {
        Self {
            router,
            read_at: tokio::time::Instant::now(),
            reading: Arc::new(AtomicBool::new(false)),
            fresh: Arc::new(std::sync::Mutex::new(None)),
        }
    }

    /// The router for the next round: read now if `stale`, else the newest
    /// one (and a background read started once it is old).
    async fn current<C: Batched<Router = R>>(&mut self, conn: &C, stale: bool) -> Arc<R> {
        let now = tokio::time::Instant::now();
        if stale && let Some(router) = read_router(conn).await {
            (self.router, self.read_at) = (router, now);
        } else if let Some(router) = lock(&self.fresh).take() {
            self.router = router;
        }
        if self.read_at.elapsed() >= ROUTER_AGE && !self.reading.swap(true, Ordering::Relaxed) {
            self.read_at = now;
            let (conn, fresh, reading) = (conn.clone(), self.fresh.clone(), self.reading.clone());
            tokio::spawn(async move {
                if let Some(router) = read_router(&conn).await {
                    *lock(&fresh) = Some(router);
                }
                reading.store(false, Ordering::Relaxed);
            });
        }
        self.router.clone()
    }
}

/// A lock whose data stays consistent if a holder panicked.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reads `conn`'s router, waiting at most [`ROUTER_WAIT`] (a node that does
/// not answer): `None` past it.
async fn read_router<C: Batched>(conn: &C) -> Option<Arc<C::Router>> {
    tokio::time::timeout(ROUTER_WAIT, conn.router())
        .await
        .ok()
        .map(Arc::new)
}

/// The longest a read of the router is waited for.
const ROUTER_WAIT: Duration = Duration::from_millis(500);

/// A call on its way, for [`send`].
struct Sent {
    /// Its keys may be of several hash slots of one node.
    spread: bool,
    /// Set if it fails.
    stale: Arc<AtomicBool>,
    /// Its round's permit.
    _permit: Arc<OwnedSemaphorePermit>,
}

/// Sends one group of requests as one call and answers each request.
async fn send<C: Batched>(jobs: Vec<Job>, mut conn: C, call: Sent) {
    let requests: Vec<Request<'_>> = jobs
        .iter()
        .map(|job| Request {
            checks: &job.checks,
            cost: job.cost,
        })
        .collect();
    let result = match call.spread {
        true => decide_spread(&mut conn, &requests).await,
        false => decide(&mut conn, &requests).await,
    };
    drop(requests);
    if result.is_err() {
        call.stale.store(true, Ordering::Relaxed);
    }
    match result {
        Ok(states) => {
            for (job, states) in jobs.into_iter().zip(states) {
                let _ = job.reply.send(Ok(states));
            }
        }
        Err(e) => {
            for job in jobs {
                let _ = job.reply.send(Err(e.clone_for_batch()));
            }
        }
    }
}
