//! The router a cluster's batching task groups requests by; see
//! `batch.rs`.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

use super::{Batched, ROUTER_AGE};

/// The router a batching task groups by: read again every [`ROUTER_AGE`]
/// in the background, so that no round waits for it; at once (bounded by
/// [`ROUTER_WAIT`]) after a failed call, or in the background at once if
/// it could not be read by the round's deadline; and in the background at
/// once after a call whose requests all timed out (its node may be the one
/// that does not answer, and `CLUSTER SLOTS` may go to it).
pub(super) struct Routing<R> {
    router: Arc<R>,
    read_at: tokio::time::Instant,
    /// A background read is on its way.
    reading: Arc<AtomicBool>,
    /// What the last background read found, not yet in use.
    fresh: Arc<std::sync::Mutex<Option<Arc<R>>>>,
}

impl<R: Default + Send + Sync + 'static> Routing<R> {
    pub(super) fn new(router: Arc<R>) -> Self {
        Self {
            router,
            read_at: tokio::time::Instant::now(),
            reading: Arc::new(AtomicBool::new(false)),
            fresh: Arc::new(std::sync::Mutex::new(None)),
        }
    }

    /// The router for the next round: read now if `stale` (waiting at most
    /// until `until`, the round's earliest deadline), else the newest one
    /// (and a background read started once it is old, or `doubtful`, or
    /// `stale` but not read in time: otherwise the stale router would be
    /// used until it is old).
    pub(super) async fn current<C: Batched<Router = R>>(
        &mut self,
        conn: &C,
        stale: bool,
        doubtful: bool,
        until: Option<Instant>,
    ) -> Arc<R> {
        let now = tokio::time::Instant::now();
        let read = match stale {
            true => read_router(conn, until).await,
            false => None,
        };
        let late = stale && read.is_none();
        if let Some(router) = read {
            (self.router, self.read_at) = (router, now);
        } else if let Some(router) = lock(&self.fresh).take() {
            self.router = router;
        }
        let due = doubtful || late || self.read_at.elapsed() >= ROUTER_AGE;
        if due && !self.reading.swap(true, Ordering::Relaxed) {
            self.read_at = now;
            let (conn, fresh, reading) = (conn.clone(), self.fresh.clone(), self.reading.clone());
            tokio::spawn(async move {
                if let Some(router) = read_router(&conn, None).await {
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
/// not answer) and not past `until`: `None` past either.
pub(super) async fn read_router<C: Batched>(
    conn: &C,
    until: Option<Instant>,
) -> Option<Arc<C::Router>> {
    let mut by = Instant::now() + ROUTER_WAIT;
    if let Some(until) = until {
        by = by.min(until);
    }
    tokio::time::timeout_at(by, conn.router())
        .await
        .ok()
        .map(Arc::new)
}

/// The longest a read of the router is waited for.
const ROUTER_WAIT: Duration = Duration::from_millis(500);
