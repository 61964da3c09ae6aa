//! Shadow (dry-run) mode and the `metrics` feature's counters, read back
//! through a recorder installed for this test binary.

mod support;

use std::time::Duration;

use metrics_util::{
    CompositeKey, MetricKind,
    debugging::{DebugValue, DebuggingRecorder, Snapshotter},
};
use redis_ratelimit::{
    Breaker, Error, Limiter, MemoryStore, OnStoreError, Quota, RateLimitLayer,
    concurrency::ConcurrencyLimiter,
    key::{Global, Header},
};
use support::{
    RedisServer,
    http::Caller,
    logs::Captured,
    servers::{app, spawn_axum},
    slow_reserve::SlowReserve,
};

/// The value of counter `name` with `limit=<limit>`, 0 if never counted.
fn counter(snapshot: &[Entry], name: &str, limit: &str) -> u64 {
    counter_where(snapshot, name, |k| {
        k.key()
            .labels()
            .any(|l| l.key() == "limit" && l.value() == limit)
    })
}

/// One metric of a `DebuggingRecorder`'s snapshot.
type Entry = (
    CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
);

/// The sum of counter `name` over the keys `keep` takes.
fn counter_where(snapshot: &[Entry], name: &str, keep: impl Fn(&CompositeKey) -> bool) -> u64 {
    snapshot
        .iter()
        .filter(|(k, ..)| k.kind() == MetricKind::Counter && k.key().name() == name && keep(k))
        .map(|(.., v)| match v {
            DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum()
}

fn histogram_samples(snapshot: &[Entry], name: &str) -> usize {
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

/// A recorder of this test's own, on its thread: the tests below run beside
/// the one above, whose recorder is global, and a `#[tokio::test]` runs its
/// tasks (and so the in-process services' decisions) on the test's thread.
/// A snapshot takes the counts it reads, so each test reads once, at its end.
fn local_recorder() -> (DebuggingRecorder, Snapshotter) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    (recorder, snapshotter)
}

/// The value of counter `name`, whatever its labels.
fn counter_total(snapshot: &[Entry], name: &str) -> u64 {
    counter_where(snapshot, name, |_| true)
}

fn cost_of(header: Option<&[u8]>) -> u64 {
    header
        .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
        .unwrap_or(1)
}

/// `limiter` as a tower layer around "ok", in process, keyed by `Global`,
/// each request costing its `x-cost` header.
fn costed_tower(
    limiter: Limiter,
) -> impl Fn(u64) -> std::pin::Pin<Box<dyn std::future::Future<Output = u16>>> {
    use tower::{ServiceExt, service_fn};
    let layer = RateLimitLayer::new(limiter, Global)
        .cost(|p| cost_of(p.headers.get("x-cost").map(|v| v.as_bytes())));
    let svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_req: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(String::from("ok")))
        }));
    move |cost| {
        let req = http::Request::get("/")
            .header("x-cost", cost.to_string())
            .body(())
            .unwrap();
        let svc = svc.clone();
        Box::pin(async move { svc.oneshot(req).await.unwrap().status().as_u16() })
    }
}

/// `limiter` as actix-web middleware around "ok", in process (actix-web's
/// test service), keyed by `Global`, each request costing its `x-cost`
/// header.
#[cfg(feature = "actix")]
async fn costed_actix(
    limiter: Limiter,
) -> impl Fn(u64) -> std::pin::Pin<Box<dyn std::future::Future<Output = u16>>> {
    use actix_web::{App, HttpResponse, test, web};
    use redis_ratelimit::actix::RateLimitMiddleware;
    let middleware = RateLimitMiddleware::new(limiter, Global)
        .cost(|r| cost_of(r.headers().get("x-cost").map(|v| v.as_bytes())));
    let app = test::init_service(
        App::new()
            .wrap(middleware)
            .route("/", web::get().to(HttpResponse::Ok)),
    )
    .await;
    let app = std::rc::Rc::new(app);
    move |cost| {
        let app = app.clone();
        Box::pin(async move {
            let req = test::TestRequest::get()
                .uri("/")
                .insert_header(("x-cost", cost.to_string()))
                .to_request();
            test::call_service(&*app, req).await.status().as_u16()
        })
    }
}

/// A cost above a limit's whole quota is a 429 (`CostExceedsLimit`) that
/// no wait clears: counted as a denial of the limit it exceeds, by the
/// limiter (so business code calling `check` counts it too, and a peek
/// does not), and logged by the middleware at `warn`, at most once a
/// second, however many such requests come. It was neither.
#[tokio::test]
async fn a_cost_above_the_quota_is_a_counted_and_logged_denial() {
    let (recorder, snapshotter) = local_recorder();
    let _local = metrics::set_default_local_recorder(&recorder);
    let captured = Captured::default();
    let _logs = captured.install();
    let started = std::time::Instant::now();

    let tower = costed_tower(
        Limiter::builder("3/1m".parse().unwrap())
            .name("cost-tower")
            .build()
            .unwrap(),
    );
    assert_eq!(tower(1).await, 200);
    for _ in 0..20 {
        assert_eq!(tower(4).await, 429);
    }

    // Direct use: the error, counted for each limit the cost exceeds (a
    // denial of an enforced limit, a shadow denial of a shadow one); the
    // limit it fits in counts nothing.
    let direct = Limiter::builder("3/1m".parse().unwrap())
        .name("cost-small")
        .limit("cost-big", Quota::per_minute(100))
        .limit("cost-dry", Quota::per_minute(2))
        .shadow_limit("cost-dry")
        .build()
        .unwrap();
    let err = direct.check("k", 5).await.unwrap_err();
    assert!(
        matches!(err, Error::CostExceedsLimit { cost: 5, limit: 3 }),
        "{err}"
    );
    // A peek decides nothing: not counted.
    assert!(direct.peek("k", 5).await.is_err());

    let snapshot = snapshotter.snapshot().into_vec();
    assert_eq!(
        counter(&snapshot, "ratelimit_denied_total", "cost-tower"),
        20
    );
    assert_eq!(
        counter(&snapshot, "ratelimit_allowed_total", "cost-tower"),
        1
    );
    assert_eq!(
        counter(&snapshot, "ratelimit_denied_total", "cost-small"),
        1
    );
    assert_eq!(counter(&snapshot, "ratelimit_denied_total", "cost-big"), 0);
    assert_eq!(counter(&snapshot, "ratelimit_allowed_total", "cost-big"), 0);
    assert_eq!(
        counter(&snapshot, "ratelimit_shadow_denied_total", "cost-dry"),
        1
    );
    assert_eq!(counter_total(&snapshot, "ratelimit_store_errors_total"), 0);

    // One line a second at most: 20 requests in well under a second are
    // one line (a slow machine may take a second or two: one more each).
    let lines: Vec<_> = captured
        .warning_lines()
        .into_iter()
        .filter(|l| l.contains("cost"))
        .collect();
    let most = 1 + started.elapsed().as_secs() as usize;
    assert!(
        !lines.is_empty() && lines.len() <= most,
        "{most} lines at most: {lines:?}"
    );
    assert!(
        lines[0].contains("cost=4") && lines[0].contains("limit=3"),
        "{lines:?}"
    );
    assert!(
        captured
            .warning_lines()
            .iter()
            .all(|l| !l.contains("store failed"))
    );
}

/// The actix middleware shares the core: the same count and log.
#[cfg(feature = "actix")]
#[tokio::test]
async fn actix_counts_and_logs_a_cost_above_the_quota() {
    let (recorder, snapshotter) = local_recorder();
    let _local = metrics::set_default_local_recorder(&recorder);
    let captured = Captured::default();
    let _logs = captured.install();
    let actix = costed_actix(
        Limiter::builder("3/1m".parse().unwrap())
            .name("cost-actix")
            .build()
            .unwrap(),
    )
    .await;
    assert_eq!(actix(1).await, 200);
    for _ in 0..5 {
        assert_eq!(actix(4).await, 429);
    }
    let snapshot = snapshotter.snapshot().into_vec();
    assert_eq!(
        counter(&snapshot, "ratelimit_denied_total", "cost-actix"),
        5
    );
    let lines = captured.warning_lines();
    assert!(lines.iter().any(|l| l.contains("cost=4")), "{lines:?}");
}

/// A limiter whose every limit is a shadow limit denies nothing: a cost
/// above even `MAX_LIMIT` (`CostExceedsLimit`, for a shadow limit too) is
/// let through and counted as a shadow denial. It was let through, but
/// logged as "rate limit store failed": no store was asked.
#[tokio::test]
async fn a_shadow_limiter_passes_a_cost_no_limit_can_hold_as_a_shadow_denial() {
    let (recorder, snapshotter) = local_recorder();
    let _local = metrics::set_default_local_recorder(&recorder);
    let captured = Captured::default();
    let _logs = captured.install();
    let huge = redis_ratelimit::quota::MAX_LIMIT + 1;
    let shadow = |name: &str| {
        Limiter::builder("5/1m".parse().unwrap())
            .name(name)
            .limit(format!("{name}-day"), Quota::per_day(100))
            .shadow(true)
            .build()
            .unwrap()
    };
    let tower = costed_tower(shadow("huge-tower"));
    assert_eq!(tower(huge).await, 200);
    assert_eq!(tower(huge).await, 200);
    #[cfg(feature = "actix")]
    {
        let actix = costed_actix(shadow("huge-actix")).await;
        assert_eq!(actix(huge).await, 200);
    }

    let snapshot = snapshotter.snapshot().into_vec();
    for (name, n) in [("huge-tower", 2), ("huge-actix", 1)] {
        if name == "huge-actix" && !cfg!(feature = "actix") {
            continue;
        }
        for limit in [name.to_owned(), format!("{name}-day")] {
            let denied = counter(&snapshot, "ratelimit_shadow_denied_total", &limit);
            assert_eq!(denied, n, "{limit}");
            assert_eq!(counter(&snapshot, "ratelimit_denied_total", &limit), 0);
        }
    }
    assert_eq!(counter_total(&snapshot, "ratelimit_store_errors_total"), 0);
    let lines = captured.warning_lines();
    assert!(
        lines.iter().all(|l| !l.contains("store failed")),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.contains(&format!("cost={huge}"))),
        "{lines:?}"
    );
}

/// A peek of a new key on a full in-memory store answers what a check
/// would (denied, nothing left, until the store's soonest window there
/// ends), but refuses no spend: neither `ratelimit_store_full_total` nor
/// the store's "full" warning counts it. It counted as a refusal.
#[tokio::test]
async fn a_peek_on_a_full_memory_store_is_no_refusal() {
    let (recorder, snapshotter) = local_recorder();
    let _local = metrics::set_default_local_recorder(&recorder);
    let captured = Captured::default();
    let _logs = captured.install();
    let limiter = Limiter::builder("3/1m".parse().unwrap())
        .name("peek-full")
        .limit("peek-full-hour", Quota::per_hour(10))
        .store(MemoryStore::with_max_keys(2))
        .build()
        .unwrap();
    assert!(limiter.check("held", 1).await.unwrap().is_allowed());
    for cost in [1, 3] {
        let peek = limiter.peek("new", cost).await.unwrap();
        assert!(!peek.is_allowed(), "{peek:?}");
        assert_eq!(peek.remaining(), 0);
        assert!(
            peek.retry_after()
                .is_some_and(|w| w <= Duration::from_secs(60))
        );
    }
    let snapshot = snapshotter.snapshot().into_vec();
    assert_eq!(counter_total(&snapshot, "ratelimit_store_full_total"), 0);
    assert_eq!(captured.warning_lines(), Vec::<String>::new());

    // The check a peek stands for is refused, counted (a new key for each
    // limit) and logged.
    let check = limiter.check("new", 1).await.unwrap();
    assert!(!check.is_allowed(), "{check:?}");
    let snapshot = snapshotter.snapshot().into_vec();
    assert_eq!(counter_total(&snapshot, "ratelimit_store_full_total"), 2);
    let lines = captured.warning_lines();
    assert!(
        lines.len() == 1 && lines[0].contains("store full"),
        "{lines:?}"
    );
}

/// Fails before the concurrency limiter counted anything: its leases, its
/// busy answers, a lease lost and taken back beyond the limit and its store
/// errors, under its name, as the rate limiter counts its own.
#[tokio::test]
async fn the_concurrency_limiter_counts_leases_refusals_losses_and_store_errors() {
    let (recorder, snapshotter) = local_recorder();
    let _local = metrics::set_default_local_recorder(&recorder);
    let captured = Captured::default();
    let _logs = captured.install();
    let mut server = RedisServer::start();
    let limiter = ConcurrencyLimiter::builder(1)
        .name("cc-metrics")
        .store(server.store().await)
        .lease(Duration::from_secs(1))
        .build()
        .unwrap();
    let held = limiter.acquire("k").await.unwrap().lease().unwrap();
    assert!(!limiter.acquire("k").await.unwrap().is_acquired());
    // Redis loses the lease and a newcomer takes the slot.
    support::lease::lose_leases_after_a_renewal(&server, held.store_key()).await;
    let newcomer = limiter.acquire("k").await.unwrap().lease().unwrap();
    let asked = std::time::Instant::now();
    while captured.warning_lines().is_empty() {
        assert!(asked.elapsed() < Duration::from_secs(3), "no loss seen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let lines = captured.warning_lines();
    assert!(
        lines[0].contains("concurrency lease lost") && lines[0].contains("beyond the limit"),
        "{lines:?}"
    );
    let snapshot = snapshotter.snapshot().into_vec();
    let count = |name| counter(&snapshot, name, "cc-metrics");
    assert_eq!(count("ratelimit_allowed_total"), 2);
    assert_eq!(count("ratelimit_denied_total"), 1);
    assert_eq!(count("ratelimit_lease_lost_total"), 1);
    assert_eq!(count("ratelimit_store_errors_total"), 0);
    assert_eq!(
        histogram_samples(&snapshot, "ratelimit_store_latency_seconds"),
        3
    );

    assert!(newcomer.release().await.unwrap());
    // Taken back beyond the limit (the warning), then released: another
    // holder had its slot meanwhile.
    assert!(!held.release().await.unwrap());
    server.kill();
    assert!(limiter.acquire("k").await.is_err());
    let snapshot = snapshotter.snapshot().into_vec();
    assert_eq!(
        counter(&snapshot, "ratelimit_store_errors_total", "cc-metrics"),
        1
    );
}

/// A limiter named `name` reserving 1 unit at a time from a store whose
/// reserve calls take 150 ms of its 200 ms timeout, without a breaker.
fn slow_flights(name: &str) -> Limiter {
    Limiter::builder(Quota::per_minute(1_000_000))
        .name(name)
        .store(SlowReserve::default())
        .timeout(Duration::from_millis(200))
        .breaker(Breaker::disabled())
        .local_reservation(1)
        .build()
        .unwrap()
}

/// A request that timed out waiting for a reservation's flight is counted
/// once, as a store error: its flight's answer, which lands after it has
/// gone, is not counted as well. Here two requests share a key with
/// `n = 1` behind a store whose reserve calls take 150 ms of a 200 ms
/// timeout: the first is admitted at 150 ms; the second then sends its
/// own call, which answers at 300 ms, after its timeout. Its unit goes back
/// to the pool and is counted by the request that spends it. Before, the
/// flight counted the gone request's decision too: three admissions
/// counted for two.
#[tokio::test(start_paused = true)]
async fn a_request_gone_before_its_flight_answers_is_counted_once() {
    let (recorder, snapshotter) = local_recorder();
    let _local = metrics::set_default_local_recorder(&recorder);
    let l = slow_flights("flight-count");
    let (a, b) = tokio::join!(l.check("k", 1), l.check("k", 1));
    assert!(a.unwrap().is_allowed());
    assert!(matches!(b, Err(Error::Timeout(_))), "{b:?}");
    // The second flight lands, and its unit goes back to the pool.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(l.check("k", 1).await.unwrap().is_allowed());
    let snapshot = snapshotter.snapshot().into_vec();
    let count = |name| counter(&snapshot, name, "flight-count");
    assert_eq!(count("ratelimit_allowed_total"), 2, "admissions");
    assert_eq!(count("ratelimit_store_errors_total"), 1, "store errors");
    assert_eq!(count("ratelimit_denied_total"), 0, "denials");
}

/// A request dropped after its flight answered but before it took the
/// answer (its client went away between the two) is not counted: its unit
/// goes back to the pool, and is counted by the request that spends it.
/// The flight counted it as soon as it could hand the answer over.
#[tokio::test(start_paused = true)]
async fn a_request_dropped_before_it_takes_its_flights_answer_is_not_counted() {
    use futures_util::FutureExt;

    let (recorder, snapshotter) = local_recorder();
    let _local = metrics::set_default_local_recorder(&recorder);
    let l = slow_flights("flight-dropped");
    let mut gone = Box::pin(l.check("k", 1));
    assert!((&mut gone).now_or_never().is_none(), "its flight is out");
    // The flight answers at 150 ms; the request is not polled again.
    tokio::time::sleep(Duration::from_millis(160)).await;
    drop(gone);
    assert!(l.check("k", 1).await.unwrap().is_allowed());
    let snapshot = snapshotter.snapshot().into_vec();
    let count = |name| counter(&snapshot, name, "flight-dropped");
    assert_eq!(count("ratelimit_allowed_total"), 1, "admissions");
    assert_eq!(count("ratelimit_store_errors_total"), 0, "store errors");
}

/// A peek decides nothing, so its failure is no store error: a custom store
/// without `peek` answers it `Unsupported`, which counted as one.
#[tokio::test]
async fn a_failed_peek_is_not_counted_as_a_store_error() {
    let (recorder, snapshotter) = local_recorder();
    let _local = metrics::set_default_local_recorder(&recorder);
    let l = Limiter::builder(Quota::per_minute(10))
        .name("peek-unsupported")
        .store(SlowReserve::default())
        .build()
        .unwrap();
    let peek = l.peek("k", 1).await;
    assert!(matches!(peek, Err(Error::Unsupported(_))), "{peek:?}");
    // A check on the same store is counted, as ever.
    assert!(l.check("k", 1).await.unwrap().is_allowed());
    let snapshot = snapshotter.snapshot().into_vec();
    let count = |name| counter(&snapshot, name, "peek-unsupported");
    assert_eq!(count("ratelimit_store_errors_total"), 0);
    assert_eq!(count("ratelimit_allowed_total"), 1);
}
