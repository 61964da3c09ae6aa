//! Harness for the concurrency limit: limiters on a `Backend`, leases whose
//! renewals died, an in-flight gauge, and an HTTP client and servers.

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::Empty;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use redis_ratelimit::concurrency::{ConcurrencyLimiter, ConcurrencyLimiterBuilder, Lease};

use super::{Backend, RedisServer};

/// A short lease, so that expiry-based tests stay quick: 1 s, renewed every
/// 333 ms, with the default 200 ms timeout.
pub const LEASE: Duration = Duration::from_secs(1);

impl Backend {
    /// The Redis log, if there is a Redis.
    pub fn log(&self) -> String {
        self.server().map(RedisServer::log).unwrap_or_default()
    }

    /// A limiter of `limit` on this backend's store, with a [`LEASE`] lease.
    pub fn short_lease(&self, limit: u64) -> ConcurrencyLimiter {
        self.concurrency(limit).lease(LEASE).build().unwrap()
    }

    /// A concurrency limiter builder on this backend's store.
    pub fn concurrency(&self, limit: u64) -> ConcurrencyLimiterBuilder {
        let builder = ConcurrencyLimiter::builder(limit);
        match self {
            Backend::Memory(m) => builder.store(m.clone()),
            Backend::Redis(_, r) => builder.store(r.clone()),
        }
    }

    /// A builder sharing this backend's leases through a separate
    /// connection, as another replica would (on the memory store, the same
    /// store, shared on purpose).
    pub async fn concurrency_replica(&self, limit: u64) -> ConcurrencyLimiterBuilder {
        let builder = ConcurrencyLimiter::builder(limit).share_counters();
        match self {
            Backend::Memory(m) => builder.store(m.clone()),
            Backend::Redis(server, _) => builder.store(server.store().await),
        }
    }
}

impl RedisServer {
    /// The owner tokens in a lease set.
    pub async fn lease_tokens(&self, key: &str) -> Vec<String> {
        redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn().await)
            .await
            .unwrap()
    }

    /// The PTTL of a key (-2: none, -1: no TTL).
    pub async fn pttl(&self, key: &str) -> i64 {
        redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut self.conn().await)
            .await
            .unwrap()
    }
}

/// The keyspace events (`zadd`, `zrem`, `expire`, `del`, ...) of one key, in
/// the order Redis applied them.
pub struct KeyEvents {
    stream: redis::aio::PubSubStream,
    log: String,
}

impl RedisServer {
    /// Turns on keyspace notifications and subscribes to `key`'s.
    pub async fn key_events(&self, key: &str) -> KeyEvents {
        let mut config = redis::cmd("CONFIG");
        config.arg("SET").arg("notify-keyspace-events").arg("Kgz");
        config.exec_async(&mut self.conn().await).await.unwrap();
        let client = redis::Client::open(self.url()).unwrap();
        let mut pubsub = client.get_async_pubsub().await.unwrap();
        pubsub
            .subscribe(format!("__keyspace@0__:{key}"))
            .await
            .unwrap();
        KeyEvents {
            stream: pubsub.into_on_message(),
            log: String::new(),
        }
    }
}

impl KeyEvents {
    /// Waits for `event`, skipping others, failing after `limit`.
    pub async fn wait_for(&mut self, event: &str, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let next = tokio::time::timeout_at(deadline, self.stream.next()).await;
            let Ok(Some(msg)) = next else {
                panic!("no {event:?} within {limit:?}; saw {}", self.log);
            };
            let seen: String = msg.get_payload().unwrap();
            self.log.push_str(&seen);
            self.log.push(' ');
            if seen == event {
                return;
            }
        }
    }

    /// Fails if any event comes within `limit`: for what must not happen,
    /// waited for about as long as it would take if it did.
    pub async fn expect_none(&mut self, limit: Duration) {
        if let Ok(Some(msg)) = tokio::time::timeout(limit, self.stream.next()).await {
            let seen: String = msg.get_payload().unwrap();
            panic!("unexpected {seen:?} within {limit:?}; saw {}", self.log);
        }
    }
}

/// A lease acquired on a runtime that is then shut down, taking the lease's
/// renewal task with it: a holder whose renewals stopped landing (a stalled
/// or partitioned process). `mem::forget` it to simulate a crash.
pub async fn unrenewed(limiter: &ConcurrencyLimiter, key: &str) -> Lease {
    let (limiter, key) = (limiter.clone(), key.to_owned());
    tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let acquired = rt.block_on(limiter.acquire(&key)).unwrap();
        drop(rt);
        acquired.lease().expect("a free slot")
    })
    .await
    .unwrap()
}

/// Waits until the lease set `key` was just renewed (its TTL jumped back
/// up), then deletes it: Redis "loses" its leases a whole renewal period
/// (a third of the lease) before the holder's next renewal, so a newcomer
/// acquiring now does so before the holder finds its lease lost.
pub async fn lose_leases_after_a_renewal(server: &RedisServer, key: &str) {
    let asked = std::time::Instant::now();
    let mut before = server.pttl(key).await;
    loop {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let now = server.pttl(key).await;
        if now > before + 50 {
            break;
        }
        before = now;
        assert!(
            asked.elapsed() < Duration::from_secs(10),
            "{key} was not renewed\n{}",
            server.log()
        );
    }
    let _: () = redis::cmd("DEL")
        .arg(key)
        .query_async(&mut server.conn().await)
        .await
        .unwrap();
}

/// How many slots `key` has free now: acquires until refused, then releases.
pub async fn free_slots(limiter: &ConcurrencyLimiter, key: &str) -> u64 {
    let mut leases = Vec::new();
    while let Some(lease) = limiter.acquire(key).await.unwrap().lease() {
        leases.push(lease);
    }
    let free = leases.len() as u64;
    for lease in leases {
        assert!(lease.release().await.unwrap());
    }
    free
}

/// Polls `check` every 20 ms until it holds, failing after `limit` with
/// `what` and the Redis log (if any).
pub async fn eventually<F, Fut>(what: &str, limit: Duration, log: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < limit,
            "{what}: not within {limit:?}\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

/// Counts requests inside a handler: how many are in flight, and the most
/// ever at once.
#[derive(Clone, Default)]
pub struct Gauge {
    now: Arc<AtomicU64>,
    max: Arc<AtomicU64>,
}

/// One request counted by a [`Gauge`], until dropped.
pub struct InFlight(Gauge);

impl Gauge {
    pub fn enter(&self) -> InFlight {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        InFlight(self.clone())
    }

    /// A handler body: in flight for `d`.
    pub async fn hold(&self, d: Duration) {
        let _in_flight = self.enter();
        tokio::time::sleep(d).await;
    }

    pub fn max(&self) -> u64 {
        self.max.load(Ordering::SeqCst)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

pub use super::http::Reply;

/// A client sending `GET`s with an `x-api-key`.
pub fn client() -> Client<HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

pub async fn get(client: &Client<HttpConnector, Empty<Bytes>>, url: &str, key: &str) -> Reply {
    super::http::get(client, url, Some(key)).await
}

/// Serves an axum app on an ephemeral port.
pub async fn spawn_axum(app: axum::Router) -> String {
    super::servers::spawn_axum(app, true).await
}
