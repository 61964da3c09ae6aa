//! Shadow (dry-run) mode and the `metrics` feature's counters, read back
//! through a recorder installed for this test binary.

mod support;

use std::time::Duration;

use metrics_util::{
    CompositeKey, MetricKind,
    debugging::{DebugValue, DebuggingRecorder, Snapshotter},
};
use redis_ratelimit::{
    Breaker, Limiter, MemoryStore, OnStoreError, Quota, RateLimitLayer, key::Header,
};
use support::{
    RedisServer,
    http::Caller,
    servers::{app, spawn_axum},
};

/// The value of counter `name` with `limit=<limit>`, 0 if never counted.
fn counter(
    snapshot: &[(
        CompositeKey,
        Option<metrics::Unit>,
        Option<metrics::SharedString>,
        DebugValue,
    )],
    name: &str,
    limit: &str,
) -> u64 {
    snapshot
        .iter()
        .filter(|(k, ..)| k.kind() == MetricKind::Counter && k.key().name() == name)
        .filter(|(k, ..)| {
            k.key()
                .labels()
                .any(|l| l.key() == "limit" && l.value() == limit)
        })
        .map(|(.., v)| match v {
            DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum()
}

fn histogram_samples(
    snapshot: &[(
        CompositeKey,
        Option<metrics::Unit>,
        Option<metrics::SharedString>,
        DebugValue,
    )],
    name: &str,
) -> usize {
    snapshot
        .iter()
        .filter(|(k, ..)| k.key().name() == name)
        .map(|(.., v)| match v {
            DebugValue::Histogram(samples) => samples.len(),
            _ => 0,
        })
        .sum()
}

/// One test: the recorder is global to the process.
#[tokio::test]
async fn shadow_mode_rejects_nothing_and_metrics_count_every_outcome() {
    let recorder = DebuggingRecorder::new();
    let snapshotter: Snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    let server = RedisServer::start();

    // Global shadow: "2/1m", five requests, all served.
    let shadow = Limiter::builder("2/1m".parse().unwrap())
        .name("dry")
        .store(server.store().await)
        .shadow(true)
        .build()
        .unwrap();
    let url = spawn_axum(
        app().layer(RateLimitLayer::new(shadow, Header::new("x-api-key"))),
        true,
    )
    .await;
    let caller = Caller::with_key(Some("k"));
    assert_eq!(
        caller.statuses(&url, 5).await,
        [200; 5],
        "shadow mode rejected"
    );
    let last = caller.get(&url).await;
    assert!(last.header("retry-after").is_none(), "{last:?}");
    // Nor a request it finds no key for.
    assert_eq!(
        Caller::with_key(None).statuses(&url, 2).await,
        [200; 2],
        "shadow mode rejected a request without a key"
    );

    // Shadow for one limit: "day" observes, "second" enforces.
    let mixed = Limiter::builder("3/1m".parse().unwrap())
        .name("second")
        .limit("day", Quota::per_minute(1))
        .shadow_limit("day")
        .store(server.store().await)
        .build()
        .unwrap();
    let url = spawn_axum(
        app().layer(RateLimitLayer::new(mixed, Header::new("x-api-key"))),
        true,
    )
    .await;
    assert_eq!(caller.statuses(&url, 5).await, [200, 200, 200, 429, 429]);
    // An enforced limit still needs the key.
    assert_eq!(Caller::with_key(None).statuses(&url, 1).await, [400]);

    let snapshot = snapshotter.snapshot().into_vec();
    assert_eq!(
        counter(&snapshot, "ratelimit_shadow_denied_total", "dry"),
        4
    );
    assert_eq!(counter(&snapshot, "ratelimit_allowed_total", "dry"), 2);
    assert_eq!(counter(&snapshot, "ratelimit_denied_total", "dry"), 0);
    assert_eq!(counter(&snapshot, "ratelimit_allowed_total", "second"), 3);
    // The 4th request goes to Redis; the 5th is denied from the deny cache.
    assert_eq!(counter(&snapshot, "ratelimit_denied_total", "second"), 1);
    assert_eq!(
        counter(&snapshot, "ratelimit_denied_locally_total", "second"),
        1
    );
    assert_eq!(counter(&snapshot, "ratelimit_allowed_total", "day"), 1);
    // "day" would have denied requests 2 to 5 (4 and 5 were denied anyway).
    assert_eq!(
        counter(&snapshot, "ratelimit_shadow_denied_total", "day"),
        4
    );
    assert!(histogram_samples(&snapshot, "ratelimit_store_latency_seconds") >= 10);

    // Store errors, by limit, including those the open breaker refused.
    let mut server = server;
    let broken = Limiter::builder("3/1m".parse().unwrap())
        .name("broken")
        .store(server.store().await)
        .timeout(Duration::from_millis(200))
        .breaker(Breaker::new().failures(2))
        .build()
        .unwrap();
    // A shadow limiter under `OnStoreError::Deny` denies nothing when its
    // store fails either, where an enforced one answers 503.
    let failing = |name: &'static str, shadow: bool| {
        let store = server.store();
        async move {
            let limiter = Limiter::builder("3/1m".parse().unwrap())
                .name(name)
                .store(store.await)
                .timeout(Duration::from_millis(200))
                .shadow(shadow)
                .build()
                .unwrap();
            let layer = RateLimitLayer::new(limiter, Header::new("x-api-key"))
                .on_store_error(OnStoreError::Deny);
            spawn_axum(app().layer(layer), true).await
        }
    };
    let dry_url = failing("dry-down", true).await;
    let enforced_url = failing("enforced-down", false).await;
    server.kill();
    for _ in 0..5 {
        assert!(broken.check("k", 1).await.is_err());
    }
    assert_eq!(caller.statuses(&dry_url, 2).await, [200; 2]);
    assert_eq!(caller.statuses(&enforced_url, 1).await, [503]);
    let snapshot = snapshotter.snapshot().into_vec();
    assert_eq!(
        counter(&snapshot, "ratelimit_store_errors_total", "broken"),
        5
    );

    // A write Redis refuses (out of memory) is a store error, counted too,
    // even for a key whose counter exists (once taken for a corrupt one).
    let full = RedisServer::start();
    let oom = Limiter::builder("3/1m".parse().unwrap())
        .name("oom")
        .store(full.store().await)
        .deny_cache(0)
        .breaker(Breaker::disabled())
        .build()
        .unwrap();
    assert!(oom.check("k", 1).await.unwrap().is_allowed());
    full.refuse_writes(true).await;
    for _ in 0..3 {
        let r = oom.check("k", 1).await;
        assert!(r.is_err(), "answered while Redis refuses writes: {r:?}");
    }
    let snapshot = snapshotter.snapshot().into_vec();
    assert_eq!(counter(&snapshot, "ratelimit_store_errors_total", "oom"), 3);

    // New keys refused by a full in-memory store: denials, and counted.
    let bounded = Limiter::builder("3/1m".parse().unwrap())
        .name("full")
        .store(MemoryStore::with_max_keys(1))
        .build()
        .unwrap();
    assert!(bounded.check("held", 1).await.unwrap().is_allowed());
    for i in 0..3 {
        assert!(
            !bounded
                .check(&format!("new{i}"), 1)
                .await
                .unwrap()
                .is_allowed()
        );
    }
    let snapshot = snapshotter.snapshot().into_vec();
    let store_full: u64 = snapshot
        .iter()
        .filter(|(k, ..)| k.key().name() == "ratelimit_store_full_total")
        .map(|(.., v)| match v {
            DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum();
    assert_eq!(store_full, 3);
    assert_eq!(counter(&snapshot, "ratelimit_denied_total", "full"), 3);

    // A reserving request that times out while its reserve call is in the
    // air is one store error: its own timeout, not that and then the
    // call's failure once the call's own timeout ends too.
    let frozen = RedisServer::start();
    let reserved = Limiter::builder("1000/1h".parse().unwrap())
        .name("reserved")
        .store(frozen.store().await)
        .timeout(Duration::from_millis(200))
        .breaker(Breaker::disabled())
        .local_reservation(10)
        .build()
        .unwrap();
    frozen.freeze(true);
    assert!(reserved.check("k", 1).await.is_err());
    // The call's end is its latency sample. A snapshot takes the counts
    // it reads (it resets them), so they are added up.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut errors = 0;
    loop {
        let snapshot = snapshotter.snapshot().into_vec();
        errors += counter(&snapshot, "ratelimit_store_errors_total", "reserved");
        let ended = snapshot.iter().any(|(k, .., v)| {
            k.key().name() == "ratelimit_store_latency_seconds"
                && k.key().labels().any(|l| l.value() == "reserved")
                && matches!(v, DebugValue::Histogram(s) if !s.is_empty())
        });
        if ended {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the reserve call never ended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    frozen.freeze(false);
    let snapshot = snapshotter.snapshot().into_vec();
    errors += counter(&snapshot, "ratelimit_store_errors_total", "reserved");
    assert_eq!(errors, 1, "store errors counted for one failed check");
}
