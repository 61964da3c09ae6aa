//! The concurrency limit over HTTP, against real Redis and the in-memory
//! store: at most N in flight across two servers (axum and, with the `actix`
//! feature, actix-web), leases that cover the response body and survive past
//! their lease time, and slots freed on a panic or a disconnect.

mod support;

use std::time::{Duration, Instant};

use axum::{Router, routing::get};
use futures_util::future::join_all;
#[cfg(feature = "actix")]
use redis_ratelimit::concurrency::actix::InFlightLimitMiddleware;
use redis_ratelimit::{
    OnStoreError,
    concurrency::{ConcurrencyLimiter, InFlightLimitLayer},
    key::Header,
};
use support::{
    Backend, RedisServer,
    lease::{self, Gauge, LEASE, Reply, eventually, free_slots},
};

const POLICY_5: &str = r#""concurrency";q=5;qu="concurrent-requests""#;

/// An axum app whose `/` takes `hold` inside the handler, counted by `gauge`,
/// limited per `x-api-key` by `limiter`.
async fn spawn_slow_app(limiter: ConcurrencyLimiter, gauge: &Gauge, hold: Duration) -> String {
    let gauge = gauge.clone();
    let app = Router::new()
        .route(
            "/",
            get(move || async move {
                gauge.hold(hold).await;
                "ok"
            }),
        )
        .layer(InFlightLimitLayer::new(limiter, Header::new("x-api-key")));
    lease::spawn_axum(app).await
}

/// 20 concurrent slow requests for one key, alternating over `urls` (limit 5):
/// never more than 5 in the handler, at least 5 served, the rest refused with
/// the headers; then every slot comes back.
async fn limit_holds(b: &Backend, urls: &[String], gauge: &Gauge, limiter: &ConcurrencyLimiter) {
    let client = lease::client();
    let replies: Vec<Reply> =
        join_all((0..20).map(|i| lease::get(&client, &urls[i % urls.len()], "hot"))).await;
    let ok: Vec<&Reply> = replies.iter().filter(|r| r.status == 200).collect();
    let refused: Vec<&Reply> = replies.iter().filter(|r| r.status == 429).collect();
    eprintln!(
        "limit 5, 20 requests over {} server(s): {} served, {} refused, at most {} in flight",
        urls.len(),
        ok.len(),
        refused.len(),
        gauge.max()
    );
    assert!(
        gauge.max() <= 5,
        "{} in flight at once\n{}",
        gauge.max(),
        b.log()
    );
    assert!(ok.len() >= 5, "only {} served: {replies:?}", ok.len());
    assert_eq!(ok.len() + refused.len(), 20, "{replies:?}");
    for r in &ok {
        assert_eq!(r.header("ratelimit-policy"), Some(POLICY_5), "{r:?}");
        assert!(r.header("retry-after").is_none(), "{r:?}");
    }
    for r in &refused {
        assert_eq!(
            r.body, "too many concurrent requests; retry in 1 s",
            "{r:?}"
        );
        assert_eq!(r.header("ratelimit-policy"), Some(POLICY_5), "{r:?}");
        assert_eq!(r.header("ratelimit"), Some(r#""concurrency";r=0"#), "{r:?}");
        assert_eq!(r.header("retry-after"), Some("1"), "{r:?}");
    }
    // Released when each response ended, not at the lease's expiry (30 s).
    eventually(
        "all 5 slots free",
        Duration::from_secs(5),
        &b.log(),
        || async { free_slots(limiter, "hot").await == 5 },
    )
    .await;
    if let Some(server) = b.server() {
        server.assert_every_key_has_ttl().await;
    }
}

/// Two servers, each with its own limiter (and, on Redis, connection);
/// the second's on `two`'s store if given.
async fn limit_holds_across_two_servers(b: Backend, two: Option<redis_ratelimit::RedisStore>) {
    let gauge = Gauge::default();
    let hold = Duration::from_millis(500);
    let one = b.concurrency(5).build().unwrap();
    let two = match two {
        Some(store) => ConcurrencyLimiter::builder(5).store(store),
        None => b.concurrency_replica(5).await,
    };
    let two = two.build().unwrap();
    let urls = [
        spawn_slow_app(one.clone(), &gauge, hold).await,
        spawn_slow_app(two, &gauge, hold).await,
    ];
    limit_holds(&b, &urls, &gauge, &one).await;
}

#[tokio::test]
async fn limit_holds_across_two_servers_with_redis() {
    limit_holds_across_two_servers(Backend::redis().await, None).await;
}

#[tokio::test]
async fn limit_holds_across_two_servers_with_redis_pool() {
    // Both servers on pools of their own.
    let b = Backend::redis_pool().await;
    let two = b.server().unwrap().pool_store(8).await;
    limit_holds_across_two_servers(b, Some(two)).await;
}

#[tokio::test]
async fn limit_holds_across_two_servers_with_memory_store() {
    limit_holds_across_two_servers(Backend::memory(), None).await;
}

#[tokio::test]
async fn long_request_keeps_its_slot_past_the_lease_over_http() {
    let b = Backend::redis().await;
    let gauge = Gauge::default();
    let url = spawn_slow_app(b.short_lease(1), &gauge, LEASE * 3).await;
    let client = lease::client();
    let long = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { lease::get(&client, &url, "k").await }
    });
    for _ in 0..2 {
        tokio::time::sleep(LEASE + LEASE / 4).await;
        let r = lease::get(&client, &url, "k").await;
        assert_eq!(
            r.status,
            429,
            "the long request lost its slot: {r:?}\n{}",
            b.log()
        );
    }
    assert_eq!(long.await.unwrap().status, 200);
    // The slot frees a Redis round trip after the response ends.
    eventually(
        "the slot freed",
        Duration::from_secs(5),
        &b.log(),
        || async { lease::get(&client, &url, "k").await.status == 200 },
    )
    .await;
    assert_eq!(gauge.max(), 1);
}

#[tokio::test]
async fn store_failure_follows_the_policy() {
    let mut server = RedisServer::start();
    let store = server.store().await;
    let layer = |name: &str, policy| {
        let limiter = ConcurrencyLimiter::builder(1)
            .name(name)
            .store(store.clone());
        InFlightLimitLayer::new(limiter.build().unwrap(), Header::new("x-api-key"))
            .on_store_error(policy)
    };
    let ok = || get(|| async { "ok" });
    let app = Router::new()
        .route("/allow", ok().layer(layer("allow", OnStoreError::Allow)))
        .route("/deny", ok().layer(layer("deny", OnStoreError::Deny)));
    let base = lease::spawn_axum(app).await;
    let client = lease::client();
    server.kill();
    for (path, status) in [("/allow", 200), ("/deny", 503)] {
        for _ in 0..3 {
            let started = Instant::now();
            let r = lease::get(&client, &format!("{base}{path}"), "k").await;
            assert_eq!(r.status, status, "{r:?}");
            assert!(r.header("ratelimit").is_none() && r.header("retry-after").is_none());
            assert!(started.elapsed() < Duration::from_millis(1500), "{path}");
        }
    }
}

#[tokio::test]
async fn the_lease_covers_the_body_and_a_client_that_goes_away_frees_it() {
    use axum::body::Body;
    use http_body_util::BodyExt;

    let b = Backend::redis().await;
    // A 10 s download: one chunk every 100 ms.
    let stream = || {
        let chunks = futures_util::stream::unfold(0, |i| async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            (i < 100).then(|| (Ok::<_, std::io::Error>(format!("chunk {i}\n")), i + 1))
        });
        Body::from_stream(chunks)
    };
    let layer = InFlightLimitLayer::new(b.short_lease(1), Header::new("x-api-key"));
    let url = lease::spawn_axum(
        Router::new()
            .route("/", get(move || async move { stream() }))
            .layer(layer),
    )
    .await;
    let client = lease::client();
    let req = http::Request::get(&url).header("x-api-key", "k");
    let res = client
        .request(req.body(http_body_util::Empty::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let mut body = res.into_body();
    body.frame().await.unwrap().unwrap();
    // The handler returned long ago; the body still holds the slot.
    let r = lease::get(&client, &url, "k").await;
    assert_eq!(r.status, 429, "{r:?}");
    drop(body);
    eventually(
        "the slot freed after the client left",
        Duration::from_secs(5),
        &b.log(),
        || async { lease::get(&client, &url, "k").await.status == 200 },
    )
    .await;
}

/// A response future dropped before its first poll (the caller went away
/// between `call` and `.await`) asks Redis nothing: no acquire runs for a
/// request that never ran, so none takes a slot from real requests.
#[tokio::test]
async fn a_response_future_dropped_unpolled_sends_nothing_to_redis() {
    use tower::{Layer, Service, ServiceExt, service_fn};

    let b = Backend::redis().await;
    let server = b.server().unwrap();
    let limiter = b.concurrency(1).build().unwrap();
    let mut events = server.key_events(&limiter.store_key("k")).await;
    let app = service_fn(|_| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    });
    let mut svc = InFlightLimitLayer::new(limiter, Header::new("x-api-key")).layer(app);
    let req = || {
        let req = http::Request::get("/").header("x-api-key", "k");
        req.body(String::new()).unwrap()
    };
    server.reset_stats().await;
    drop(svc.ready().await.unwrap().call(req()));
    // An acquire sent for it would be applied within a round trip, well
    // under a second on a local Redis.
    events.expect_none(Duration::from_secs(1)).await;
    assert_eq!(server.script_calls().await, 0, "{}", server.log());
    let res = svc.ready().await.unwrap().call(req()).await.unwrap();
    assert_eq!(res.status(), 200);
}

async fn boom() -> &'static str {
    panic!("handler panicked on purpose")
}

#[tokio::test]
async fn a_panicking_handler_frees_its_slot() {
    let b = Backend::redis().await;
    let layer =
        InFlightLimitLayer::new(b.concurrency(1).build().unwrap(), Header::new("x-api-key"));
    let app = Router::new()
        .route("/panic", get(boom))
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let url = lease::spawn_axum(app).await;
    let client = lease::client();
    let req = http::Request::get(format!("{url}/panic")).header("x-api-key", "k");
    let res = client
        .request(req.body(http_body_util::Empty::new()).unwrap())
        .await;
    assert!(
        res.is_err(),
        "the connection dies with the handler: {res:?}"
    );
    // Freed by the lease's drop, not by its 30 s expiry.
    eventually(
        "the slot freed after the panic",
        Duration::from_secs(5),
        &b.log(),
        || async { lease::get(&client, &url, "k").await.status == 200 },
    )
    .await;
}

/// Serves `/` (held for `hold`, counted by `gauge`) through actix-web on its
/// own thread and runtime, limited by `layer`.
#[cfg(feature = "actix")]
fn spawn_actix(layer: InFlightLimitMiddleware<Header>, gauge: Gauge, hold: Duration) -> String {
    use actix_web::{App, HttpServer, web};

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let server = HttpServer::new(move || {
            let gauge = gauge.clone();
            let handler = move || {
                let gauge = gauge.clone();
                async move {
                    gauge.hold(hold).await;
                    "ok"
                }
            };
            App::new()
                .wrap(layer.clone())
                .route("/", web::get().to(handler))
        });
        let server = server
            .workers(1)
            .disable_signals()
            .listen(listener)
            .unwrap();
        actix_web::rt::System::new().block_on(server.run())
    });
    url
}

#[cfg(feature = "actix")]
#[tokio::test]
async fn actix_limit_holds_across_two_servers_with_redis() {
    let b = Backend::redis().await;
    let gauge = Gauge::default();
    let hold = Duration::from_millis(500);
    let limiter = || async { b.concurrency_replica(5).await.build().unwrap() };
    let urls = [
        spawn_actix(
            InFlightLimitMiddleware::new(limiter().await, Header::new("x-api-key")),
            gauge.clone(),
            hold,
        ),
        spawn_actix(
            InFlightLimitMiddleware::new(limiter().await, Header::new("x-api-key")),
            gauge.clone(),
            hold,
        ),
    ];
    limit_holds(&b, &urls, &gauge, &limiter().await).await;
}

/// In a tower stack (hyper, tonic) the layers above an in-flight limit see
/// its `LeaseBody` responses: a rate limit, or a second in-flight limit
/// (one per key inside one for everyone), must build its rejection of that
/// body. Fails to compile without `LeaseBody: Default`.
#[tokio::test]
async fn layers_above_an_in_flight_limit_answer_with_its_body() {
    use http_body_util::{BodyExt, Full};
    use redis_ratelimit::{Limiter, Quota, RateLimitLayer, key::Global};
    use tower::{ServiceBuilder, ServiceExt, service_fn};

    let handler = service_fn(|_req: http::Request<()>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(bytes::Bytes::from("ok"))))
    });
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(
            Limiter::new(Quota::per_minute(2)),
            Global,
        ))
        .layer(InFlightLimitLayer::new(ConcurrencyLimiter::new(1), Global))
        .layer(InFlightLimitLayer::new(
            ConcurrencyLimiter::new(1),
            Header::new("x-api-key"),
        ))
        .service(handler);
    let req = || {
        http::Request::builder()
            .header("x-api-key", "a")
            .body(())
            .unwrap()
    };
    // The first holds both slots while its body lives.
    let held = svc.clone().oneshot(req()).await.unwrap();
    assert_eq!(held.status(), 200);
    let busy = svc.clone().oneshot(req()).await.unwrap();
    assert_eq!(
        busy.status(),
        429,
        "the outer in-flight limit, its slot held"
    );
    let body = held.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"ok");
    let spent = svc.clone().oneshot(req()).await.unwrap();
    assert_eq!(spent.status(), 429, "the rate limit, 2 a minute");
    assert!(spent.headers().contains_key("retry-after"));
    // The default answer's text, in the body the in-flight limit wraps.
    let content_type = spent.headers().get("content-type").cloned();
    let text = spent.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&text).contains("rate limit exceeded"),
        "{text:?}"
    );
    assert_eq!(content_type.unwrap(), "text/plain; charset=utf-8");
    // An answer of one's own, made `From` its body.
    let own = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(Limiter::new(Quota::per_minute(1)), Global).respond_with(|r| {
                let body = Full::new(bytes::Bytes::from("slow down"));
                http::Response::builder()
                    .status(r.status())
                    .body(body)
                    .unwrap()
            }),
        )
        .layer(InFlightLimitLayer::new(ConcurrencyLimiter::new(1), Global))
        .service(handler);
    drop(own.clone().oneshot(req()).await.unwrap());
    let denied = own.oneshot(req()).await.unwrap();
    assert_eq!(denied.status(), 429);
    let text = denied.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&text[..], b"slow down");
}

/// A request its extractor skips (`skip::Skipping`) takes no slot, as
/// under the rate limit: a health check goes through while the one slot is
/// held. Fails with the skip ignored (the health check a 429).
#[tokio::test]
async fn a_skipped_request_takes_no_slot() {
    use http_body_util::{BodyExt, Full};
    use redis_ratelimit::{key::Global, skip::Skipping};
    use tower::{ServiceBuilder, ServiceExt, service_fn};

    let handler = service_fn(|_req: http::Request<()>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(bytes::Bytes::from("ok"))))
    });
    let health = |parts: &http::request::Parts| parts.uri.path() == "/healthz";
    let svc = ServiceBuilder::new()
        .layer(InFlightLimitLayer::new(
            ConcurrencyLimiter::new(1),
            Skipping::new(Global, health),
        ))
        .service(handler);
    let req = |path: &str| http::Request::get(path).body(()).unwrap();
    let held = svc.clone().oneshot(req("/")).await.unwrap();
    assert_eq!(held.status(), 200);
    assert_eq!(svc.clone().oneshot(req("/")).await.unwrap().status(), 429);
    let check = svc.clone().oneshot(req("/healthz")).await.unwrap();
    assert_eq!(check.status(), 200, "skipped");
    assert!(!check.headers().contains_key("ratelimit-policy"));
    drop(held.into_body().collect().await.unwrap());
    // The release runs as a task of its own.
    let freed = async {
        while svc.clone().oneshot(req("/")).await.unwrap().status() != 200 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), freed)
        .await
        .expect("the slot came back");
}

/// Fails without the check: `key::each` gave the in-flight limit its first
/// key alone, and the second (a limit for everyone) was silently dropped.
#[test]
#[should_panic(expected = "a concurrency limit takes one")]
fn an_in_flight_limit_refuses_an_extractor_of_several_keys() {
    use redis_ratelimit::key::{self, Global};
    let _ = InFlightLimitLayer::new(
        ConcurrencyLimiter::new(1),
        key::each((Header::new("x-api-key"), Global)),
    );
}
