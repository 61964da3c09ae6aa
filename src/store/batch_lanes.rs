//! [`Lanes`]: the tasks that send the batching task's calls.
//!
//! A task spawned per call cost each call about 3,000 instructions, most of
//! them its cell's allocation and the copies of the call's future into
//! it. Instead, one task for each call that may be in flight lives as
//! long as the batching task and sends one call at a time. A round whose
//! call finds no idle lane (on a cluster, a round's second call and after)
//! gets a task of its own, as before. A lane keeps its own handle on the
//! connection and one timer for its calls' deadlines
//! ([`Timer`]), where each call cloned the
//! connection (reference counts that both workers write) and made, boxed,
//! registered and dropped a timer of its own.
//!
//! A lane is idle from when it has answered its call's requests until it
//! is handed the next one. It releases its round's permit only once idle,
//! so a round that got a permit from a lane's call finds that lane idle;
//! but for a cluster call outstanding past [`Batched::DETACH`], which gives
//! the permit back first (the next round's call may then find no idle lane,
//! and get a task of its own).

use std::{
    pin::pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use tokio::sync::{OwnedSemaphorePermit, mpsc};

use super::{Batched, IN_FLIGHT, Job, Sent, Timer, fill::Fill, send};

/// A call for a lane: its requests, and the round's permit.
type Work = (Vec<Job>, Sent, Arc<OwnedSemaphorePermit>);

struct Lane {
    work: mpsc::Sender<Work>,
    idle: Arc<AtomicBool>,
}

/// The batching task's long-lived senders; see the module docs.
pub(super) struct Lanes<C> {
    lanes: Vec<Lane>,
    conn: C,
    fill: Arc<Fill>,
}

impl<C: Batched> Lanes<C> {
    /// Starts one lane on `conn` for each call that may be in flight
    /// ([`IN_FLIGHT`], and those `fill` allows beyond them), which end
    /// with the batching task (when this is dropped). Each tells `fill`
    /// when its call is answered.
    pub(super) fn start(conn: &C, fill: &Arc<Fill>) -> Self {
        let lanes = (0..IN_FLIGHT + fill.extra())
            .map(|_| {
                let (work, mut calls) = mpsc::channel::<Work>(1);
                let idle = Arc::new(AtomicBool::new(true));
                let (conn, done, fill) = (conn.clone(), idle.clone(), fill.clone());
                tokio::spawn(async move {
                    // The lane's own: no clone of the connection, nor a new
                    // timer, for each call.
                    let mut conn = conn;
                    let mut timer = pin!(Timer::new());
                    while let Some((jobs, call, permit)) = calls.recv().await {
                        let permit = send(jobs, &mut conn, call, timer.as_mut(), permit).await;
                        done.store(true, Ordering::Release);
                        drop(permit);
                        fill.answered();
                    }
                });
                Lane { work, idle }
            })
            .collect();
        Self {
            lanes,
            conn: conn.clone(),
            fill: fill.clone(),
        }
    }

    /// Sends `jobs` as one call by an idle lane, or by a task of its own.
    pub(super) fn send(&self, jobs: Vec<Job>, call: Sent, permit: Arc<OwnedSemaphorePermit>) {
        let mut work = (jobs, call, permit);
        for lane in &self.lanes {
            if !lane.idle.swap(false, Ordering::Acquire) {
                continue;
            }
            match lane.work.try_send(work) {
                Ok(()) => return,
                // Gone (a panic in a call): not idle again.
                Err(e) => work = e.into_inner(),
            }
        }
        let (jobs, call, permit) = work;
        let (mut conn, fill) = (self.conn.clone(), self.fill.clone());
        tokio::spawn(async move {
            let permit = send(jobs, &mut conn, call, pin!(Timer::new()), permit).await;
            drop(permit);
            fill.answered();
        });
    }
}
