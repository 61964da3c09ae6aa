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

use super::{Batched, BoxFuture, ROUTER_AGE};

/// What reads a router: a [`Batched`] connection (or a test's stand-in).
pub(super) trait ReadsRouter: Clone + Send + Sync + 'static {
    type Router: Default + Send + Sync + 'static;

    fn read(&self) -> BoxFuture<'static, Self::Router>;
}

impl<C: Batched> ReadsRouter for C {
    type Router = C::Router;

    fn read(&self) -> BoxFuture<'static, Self::Router> {
        self.router()
    }
}

/// The router a batching task groups by: read again every [`ROUTER_AGE`]
/// in the background, so that no round waits for it; at once (bounded by
/// [`ROUTER_WAIT`]) after a failed call, or in the background at once if
/// it could not be read by the round's deadline; and in the background at
/// once after a call whose requests all timed out (its node may be the one
/// that does not answer, and `CLUSTER SLOTS` may go to it).
///
/// Reads are numbered as they start, and a router replaces only one read
/// before it: a background read that started before a read made at once,
/// and ended after it, found the older map (during a resharding, a slot
/// still on its old node, and a failed call for that node's requests).
pub(super) struct Routing<R> {
    router: Arc<R>,
    read_at: tokio::time::Instant,
    /// The number of the read `router` came from (0: none yet).
    router_no: u64,
    /// The number of the last read started.
    started: u64,
    /// A background read is on its way.
    reading: Arc<AtomicBool>,
    /// What the last background read found, with its number, not yet in
    /// use.
    fresh: Fresh<R>,
}

/// A background read's router and its number, until a round takes it.
type Fresh<R> = Arc<std::sync::Mutex<Option<(u64, Arc<R>)>>>;

impl<R: Default + Send + Sync + 'static> Routing<R> {
    pub(super) fn new(router: Arc<R>) -> Self {
        Self {
            router,
            read_at: tokio::time::Instant::now(),
            router_no: 0,
            started: 0,
            reading: Arc::new(AtomicBool::new(false)),
            fresh: Arc::new(std::sync::Mutex::new(None)),
        }
    }

    /// The number of a read starting now.
    fn start(&mut self) -> u64 {
        self.started += 1;
        self.started
    }

    /// The router for the next round: read now if `stale` (waiting at most
    /// until `cut` resolves: by the round's earliest deadline, or a
    /// request's queued meanwhile), else the newest one (and a background
    /// read started once it is old, or `doubtful`, or `stale` but not read
    /// in time: otherwise the stale router would be used until it is old).
    pub(super) async fn current<C: ReadsRouter<Router = R>>(
        &mut self,
        conn: &C,
        stale: bool,
        doubtful: bool,
        cut: impl Future<Output = ()>,
    ) -> Arc<R> {
        let now = tokio::time::Instant::now();
        let read = match stale {
            true => {
                let no = self.start();
                read_router(conn, cut).await.map(|router| (no, router))
            }
            false => None,
        };
        let late = stale && read.is_none();
        if let Some((no, router)) = read {
            (self.router, self.router_no, self.read_at) = (router, no, now);
        }
        if let Some((no, router)) = lock(&self.fresh).take()
            && no > self.router_no
        {
            (self.router, self.router_no) = (router, no);
        }
        let due = doubtful || late || self.read_at.elapsed() >= ROUTER_AGE;
        if due && !self.reading.swap(true, Ordering::Relaxed) {
            self.read_at = now;
            let no = self.start();
            let (conn, fresh, reading) = (conn.clone(), self.fresh.clone(), self.reading.clone());
            tokio::spawn(async move {
                if let Some(router) = read_router(&conn, std::future::pending()).await {
                    *lock(&fresh) = Some((no, router));
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
/// not answer) and not once `cut` resolves: `None` past either.
pub(super) async fn read_router<C: ReadsRouter>(
    conn: &C,
    cut: impl Future<Output = ()>,
) -> Option<Arc<C::Router>> {
    let by = Instant::now() + ROUTER_WAIT;
    let mut read = None;
    let reading = async { read = tokio::time::timeout_at(by, conn.read()).await.ok() };
    super::deadline::first(reading, cut).await;
    read.map(Arc::new)
}

/// The longest a read of the router is waited for.
const ROUTER_WAIT: Duration = Duration::from_millis(500);

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;

    /// Reads 1, 2, 3...: the first read (in the background) after `slow`,
    /// the others at once.
    #[derive(Clone)]
    struct Maps {
        reads: Arc<AtomicU32>,
        slow: Duration,
    }

    impl ReadsRouter for Maps {
        type Router = u32;

        fn read(&self) -> BoxFuture<'static, u32> {
            let n = self.reads.fetch_add(1, Ordering::SeqCst) + 1;
            let wait = if n == 1 { self.slow } else { Duration::ZERO };
            Box::pin(async move {
                tokio::time::sleep(wait).await;
                n
            })
        }
    }

    /// Fails with the read bounded only by the deadlines known when it
    /// began: a request with a timeout shorter than any before, queued
    /// while a read waited on a frozen node, waited with it (to the 200 ms
    /// deadline of the round's own requests, where its own was 20 ms).
    #[tokio::test(start_paused = true)]
    async fn a_read_ends_once_a_request_with_a_shorter_timeout_is_queued() {
        use super::super::deadline::{Deadline, Shortest};
        let maps = Maps {
            reads: Arc::new(AtomicU32::new(0)),
            slow: Duration::from_secs(10),
        };
        let shortest = Shortest::new();
        let round = Deadline::after(Duration::from_millis(200)).unwrap();
        shortest.note(round);
        let mut routing = Routing::new(Arc::new(0));
        let start = Instant::now();
        let until = Some(start + Duration::from_millis(200));
        let read = routing.current(&maps, true, false, shortest.cut(until));
        let queue = async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            shortest.note(Deadline::after(Duration::from_millis(20)).unwrap());
        };
        let (router, ()) = tokio::join!(read, queue);
        assert_eq!(*router, 0, "the read was cut short");
        assert!(
            start.elapsed() <= Duration::from_millis(21),
            "{:?}",
            start.elapsed()
        );
    }

    /// Fails without the reads' numbers: a background read that started
    /// before a read made at once, and ended after it, replaced the newer
    /// map with its older one at the next round.
    #[tokio::test(start_paused = true)]
    async fn an_older_background_read_never_replaces_a_newer_map() {
        let maps = Maps {
            reads: Arc::new(AtomicU32::new(0)),
            slow: Duration::from_millis(100),
        };
        let mut routing = Routing::new(Arc::new(0));
        // A doubtful round starts a background read (map 1, slow).
        assert_eq!(
            *routing
                .current(&maps, false, true, std::future::pending())
                .await,
            0
        );
        tokio::task::yield_now().await;
        assert_eq!(maps.reads.load(Ordering::SeqCst), 1, "on its way");
        // A failed call: read at once (map 2).
        assert_eq!(
            *routing
                .current(&maps, true, false, std::future::pending())
                .await,
            2
        );
        // The background read ends with map 1.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(lock(&routing.fresh).as_ref().map(|f| f.0), Some(1));
        assert_eq!(
            *routing
                .current(&maps, false, false, std::future::pending())
                .await,
            2
        );
        // A background read started after map 2 is taken.
        tokio::time::sleep(ROUTER_AGE).await;
        assert_eq!(
            *routing
                .current(&maps, false, false, std::future::pending())
                .await,
            2
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            *routing
                .current(&maps, false, false, std::future::pending())
                .await,
            3
        );
    }
}
