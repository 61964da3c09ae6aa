//! `Limiter` behaviour, run against every store: the in-memory store, Redis
//! through a `ConnectionManager`, and Redis through a bb8 pool. Each store must
//! give the same answers.

mod support;

use std::time::Duration;

use futures_util::future::join_all;
use redis_ratelimit::{Decision, Error, Limiter};
use support::Backend;

async fn checks(limiter: &Limiter, key: &str, n: usize) -> Vec<Decision> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(limiter.check(key, 1).await.unwrap());
    }
    out
}

async fn exact_count(b: Backend) {
    let limiter = b.limiter("5/10s");
    let ds = checks(&limiter, "client-a", 7).await;
    let allowed: Vec<bool> = ds.iter().map(Decision::is_allowed).collect();
    assert_eq!(allowed, [true, true, true, true, true, false, false]);
    let remaining: Vec<u64> = ds.iter().map(Decision::remaining).collect();
    assert_eq!(remaining, [4, 3, 2, 1, 0, 0, 0]);
    for d in &ds {
        assert_eq!(d.limit(), 5);
        assert!(d.reset_after() <= Duration::from_secs(10), "{d:?}");
        assert!(d.reset_after() > Duration::from_secs(5), "{d:?}");
    }
    assert_eq!(ds[0].retry_after(), None);
    assert_eq!(ds[6].retry_after(), Some(ds[6].reset_after()));
    // Another key is counted on its own.
    assert!(limiter.check("client-b", 1).await.unwrap().is_allowed());
}

async fn window_reopens(b: Backend) {
    let limiter = b.limiter("3/1s");
    let ds = checks(&limiter, "k", 4).await;
    assert!(!ds[3].is_allowed());
    let wait = ds[3].retry_after().unwrap();
    assert!(wait <= Duration::from_secs(1), "{wait:?}");
    tokio::time::sleep(wait + Duration::from_millis(250)).await;
    let d = limiter.check("k", 1).await.unwrap();
    assert!(d.is_allowed(), "window did not reopen: {d:?}");
    assert_eq!(d.remaining(), 2);
    assert!(d.reset_after() > Duration::from_millis(500), "{d:?}");
}

async fn costs_are_exact(b: Backend) {
    let limiter = b.limiter("10/1m");
    let spend = |cost| limiter.check("k", cost);
    assert_eq!(spend(4).await.unwrap().remaining(), 6);
    assert_eq!(spend(4).await.unwrap().remaining(), 2);
    let denied = spend(4).await.unwrap();
    assert!(!denied.is_allowed());
    assert_eq!(denied.remaining(), 2, "a denied check must consume nothing");
    let peek = spend(0).await.unwrap();
    assert!(peek.is_allowed());
    assert_eq!(peek.remaining(), 2);
    assert_eq!(spend(2).await.unwrap().remaining(), 0);
    assert!(matches!(
        spend(11).await,
        Err(Error::CostExceedsLimit {
            cost: 11,
            limit: 10
        })
    ));
    // A peek at a key never seen creates nothing and reports a full window.
    let fresh = limiter.check("never-seen", 0).await.unwrap();
    assert_eq!(
        (fresh.remaining(), fresh.reset_after()),
        (10, Duration::from_secs(60))
    );
}

async fn concurrent_one_limiter(b: Backend) {
    let limiter = b.limiter("50/1m");
    let results = join_all((0..200).map(|_| limiter.check("hot", 1))).await;
    let allowed = results
        .iter()
        .filter(|r| r.as_ref().unwrap().is_allowed())
        .count();
    assert_eq!(allowed, 50);
}

async fn concurrent_two_replicas(b: Backend) {
    let one = b.limiter("50/1m");
    let two = b.other_replica("50/1m").await;
    let results = join_all((0..200).map(|i| {
        let l = if i % 2 == 0 { &one } else { &two };
        l.check("hot", 1)
    }))
    .await;
    let allowed = results
        .iter()
        .filter(|r| r.as_ref().unwrap().is_allowed())
        .count();
    assert_eq!(allowed, 50);
    if let Some(server) = b.server() {
        server.assert_every_key_has_ttl().await;
    }
}

async fn names_and_prefixes_separate_counters(b: Backend) {
    let a = b.builder("1/1m").name("a").build().unwrap();
    let a_again = b
        .builder("1/1m")
        .name("a")
        .share_counters()
        .build()
        .unwrap();
    let other = b.builder("1/1m").name("b").build().unwrap();
    let other_prefix = b.builder("1/1m").name("a").prefix("x").build().unwrap();
    assert!(a.check("k", 1).await.unwrap().is_allowed());
    assert!(!a_again.check("k", 1).await.unwrap().is_allowed());
    assert!(other.check("k", 1).await.unwrap().is_allowed());
    assert!(other_prefix.check("k", 1).await.unwrap().is_allowed());
}

async fn hostile_keys_are_distinct(b: Backend) {
    let limiter = b.limiter("1/1m");
    let big = vec![b'x'; 1 << 20];
    let keys: [&[u8]; 6] = [b"a}b", b"a{b", b"\xff\xfe", b"with space", &big, b"a"];
    for key in keys {
        assert!(
            limiter.check(key, 1).await.unwrap().is_allowed(),
            "{:?}",
            &key[..key.len().min(9)]
        );
    }
    for key in keys {
        assert!(!limiter.check(key, 1).await.unwrap().is_allowed());
    }
    if let Some(server) = b.server() {
        for (key, _) in server.keys_with_ttl().await {
            assert!(key.len() < 100, "unbounded key {key}");
        }
    }
}

support::for_every_store!(
    exact_count,
    window_reopens,
    costs_are_exact,
    concurrent_one_limiter,
    concurrent_two_replicas,
    names_and_prefixes_separate_counters,
    hostile_keys_are_distinct,
);

/// The in-memory store needs no time driver (the README says so; a Redis
/// store does, as redis-rs does): a runtime built without one decides, and
/// the tower layer answers, allowed and denied alike, without a panic.
#[test]
fn the_memory_store_needs_no_time_driver() {
    use redis_ratelimit::{RateLimitLayer, key::Global};
    use tower::{Layer, ServiceExt, service_fn};

    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let limiter = Limiter::new("2/1m".parse().unwrap());
        let allowed: Vec<bool> = checks(&limiter, "k", 3)
            .await
            .iter()
            .map(Decision::is_allowed)
            .collect();
        assert_eq!(allowed, [true, true, false]);
        let svc = RateLimitLayer::new(Limiter::new("1/1m".parse().unwrap()), Global).layer(
            service_fn(|_: http::Request<()>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(()))
            }),
        );
        let mut statuses = Vec::new();
        for _ in 0..2 {
            let res = svc.clone().oneshot(http::Request::new(())).await.unwrap();
            statuses.push(res.status().as_u16());
        }
        assert_eq!(statuses, [200, 429]);
    });
}
