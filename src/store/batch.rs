//! Batching: concurrent decisions share one script call.
//!
//! On a standalone Redis behind the `ConnectionManager`, every decision goes
//! through one background task. The task sends what is waiting as one
//! `EVALSHA` of the decide script (up to [`MAX_BATCH`] requests), with at
//! most [`IN_FLIGHT`] calls outstanding. There is no timer: a lone request is
//! sent at once, and requests queue only while earlier calls are in flight,
//! so batches grow exactly when the server is busy. Each request is still
//! decided on its own, all or nothing, inside the one atomic script run. This
//! cuts Redis's per-command work and the round trips, syscalls and parsing on
//! both sides.

use std::sync::{Arc, OnceLock};

use redis::aio::ConnectionManager;
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::{
    BoxFuture, LimitCheck, LimitState,
    redis::{Request, decide},
};
use crate::Error;

/// The most requests in one script call.
pub(crate) const MAX_BATCH: usize = 64;
/// The most script calls outstanding at once.
pub(crate) const IN_FLIGHT: usize = 2;
/// Requests that may wait; beyond it, requests go unbatched.
const QUEUE: usize = 4096;

type Reply = Result<Vec<LimitState>, Error>;

struct Job {
    checks: Vec<LimitCheck>,
    cost: u64,
    reply: oneshot::Sender<Reply>,
}

/// The handle to a connection's batching task, started on first use.
#[derive(Debug, Clone, Default)]
pub(super) struct Batcher {
    queue: Arc<OnceLock<mpsc::Sender<Job>>>,
}

impl Batcher {
    /// Queues a request, or hands it back when it cannot be batched (no
    /// Tokio runtime to run the task, the task gone, or the queue full).
    pub(super) fn submit(
        &self,
        conn: &ConnectionManager,
        checks: Vec<LimitCheck>,
        cost: u64,
    ) -> Result<BoxFuture<'static, Reply>, (Vec<LimitCheck>, u64)> {
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
            Ok(()) => Ok(Box::pin(async move {
                answer
                    .await
                    .unwrap_or_else(|_| Err(Error::UnexpectedReply("batching task stopped".into())))
            })),
            Err(e) => {
                let job = e.into_inner();
                Err((job.checks, job.cost))
            }
        }
    }
}

/// Takes what is waiting, up to [`MAX_BATCH`], whenever a call slot is free.
async fn run(mut queue: mpsc::Receiver<Job>, conn: ConnectionManager) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Ok(slot) = slots.clone().acquire_owned().await {
        let Some(first) = queue.recv().await else {
            return;
        };
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH {
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
        let mut conn = conn.clone();
        tokio::spawn(async move {
            let requests: Vec<Request<'_>> = jobs
                .iter()
                .map(|job| Request {
                    checks: &job.checks,
                    cost: job.cost,
                })
                .collect();
            let result = decide(&mut conn, &requests).await;
            drop(requests);
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
            drop(slot);
        });
    }
}
