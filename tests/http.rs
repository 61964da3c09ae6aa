//! The layer end to end over real HTTP: axum and plain hyper servers on
//! ephemeral ports, the hyper-util client, and a real redis-server per test.

mod support;

use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use axum::{Router, response::IntoResponse, routing::get};
use bytes::Bytes;
use http::{Request, Response, header::CONTENT_TYPE};
use http_body_util::Full;
use hyper::{body::Incoming, server::conn::http1};
use hyper_util::{rt::TokioIo, service::TowerToHyperService};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis_ratelimit::{
    Key, OnStoreError, RateLimitLayer, RedisStore, Rejection,
    key::{self, Global, PeerIp},
};
use support::{
    Backend, RedisServer,
    http::Caller,
    scenarios::{self, by_key, exact_count, log},
    servers::{Axum, app, spawn_axum},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};
use tower::ServiceBuilder;

/// Serves `layer` over a plain hyper 1 server that puts each connection's
/// peer `SocketAddr` into the request extensions.
async fn spawn_hyper(layer: RateLimitLayer<PeerIp>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (stream, peer) = listener.accept().await.unwrap();
            let svc = ServiceBuilder::new()
                .map_request(move |mut req: Request<Incoming>| {
                    req.extensions_mut().insert(peer);
                    req
                })
                .layer(layer.clone())
                .service_fn(|_| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                });
            let svc = TowerToHyperService::new(svc);
            tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), svc));
        }
    });
    url
}

#[tokio::test]
async fn axum_with_redis_admits_exactly_the_quota() {
    scenarios::exact_count_by_key(&Axum, &Backend::redis().await).await;
}

#[tokio::test]
async fn axum_with_redis_pool_admits_exactly_the_quota() {
    scenarios::exact_count_by_key(&Axum, &Backend::redis_pool().await).await;
}

#[tokio::test]
async fn axum_with_memory_store_admits_exactly_the_quota() {
    scenarios::exact_count_by_key(&Axum, &Backend::memory()).await;
}

#[tokio::test]
async fn axum_window_reopens_after_its_reset() {
    scenarios::window_reopens(&Axum, &Backend::redis().await).await;
}

#[tokio::test]
async fn axum_legacy_headers_carry_limit_remaining_and_reset() {
    scenarios::header_values(&Axum, &Backend::redis().await).await;
}

#[tokio::test]
async fn axum_nested_layers_legacy_headers_are_the_tightest_limits() {
    scenarios::nested_legacy_headers(&Axum, &Backend::memory()).await;
}

#[tokio::test]
async fn axum_partition_key_is_opt_in_stable_and_opaque() {
    scenarios::partition_key(&Axum, &Backend::redis().await).await;
}

#[tokio::test]
async fn axum_default_answers_have_text_or_problem_details_bodies() {
    scenarios::default_answers(&Axum, &Backend::redis().await).await;
}

#[tokio::test]
async fn concurrent_requests_admit_exactly_the_limit() {
    scenarios::concurrent_requests_admit_exactly_the_limit(&Axum, 1).await;
}

#[tokio::test]
async fn two_servers_sharing_redis_admit_exactly_the_limit() {
    scenarios::concurrent_requests_admit_exactly_the_limit(&Axum, 2).await;
}

#[tokio::test]
async fn script_flush_between_requests_is_invisible_to_clients() {
    scenarios::script_flush_is_invisible(&Axum, &Backend::redis().await).await;
}

#[tokio::test]
async fn redis_outage_follows_the_policy_and_limiting_resumes_after_restart() {
    scenarios::redis_killed_and_restarted(&Axum).await;
}

#[tokio::test]
async fn hyper_keyed_by_peer_ip_admits_exactly_the_quota() {
    let b = Backend::redis().await;
    let url = spawn_hyper(RateLimitLayer::new(b.limiter("5/10s"), PeerIp)).await;
    let a = Caller::from_ip([127, 0, 0, 1]);
    let other = Caller::from_ip([127, 0, 0, 2]);
    exact_count(&b, &url, &a, &other).await;
}

#[tokio::test]
async fn requests_without_a_key_are_refused_not_let_through() {
    let b = Backend::redis().await;
    scenarios::missing_key_is_refused(&Axum, &b).await;
    // PeerIp behind an axum server that was not given connect info.
    let by_ip = RateLimitLayer::new(b.builder("5/1m").name("by-ip").build().unwrap(), PeerIp);
    let url = spawn_axum(app().layer(by_ip), false).await;
    for res in Caller::with_key(None).get_n(&url, 3).await {
        let res = res.expect(500, &log(&b));
        assert!(!res.has_ratelimit_headers(), "{res:?}");
        // Nothing about the server's configuration, and not the handler's "ok".
        res.expect_text("rate limit key unavailable");
    }
}

#[tokio::test]
async fn route_layer_limits_only_its_routes() {
    let b = Backend::redis().await;
    let app = Router::new()
        .route("/limited", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(b.limiter("2/1m"), Global))
        .route("/free", get(|| async { "ok" }));
    let url = spawn_axum(app, true).await;
    let caller = Caller::with_key(None);
    let free = format!("{url}/free");
    let before = caller.get_n(&free, 5).await;
    let limited = caller.statuses(&format!("{url}/limited"), 3).await;
    assert_eq!(limited, [200, 200, 429], "/free must not spend the quota");
    for res in before.into_iter().chain(caller.get_n(&free, 3).await) {
        let res = res.expect(200, &log(&b));
        assert!(!res.has_ratelimit_headers(), "{res:?}");
    }
}

#[tokio::test]
async fn a_hung_redis_is_cut_off_by_the_limiter_timeout() {
    let server = RedisServer::start();
    // A connection that waits for replies forever: only the limiter's own
    // timeout can bound a check.
    let config = ConnectionManagerConfig::new().set_response_timeout(None);
    let client = redis::Client::open(server.url()).unwrap();
    let manager = ConnectionManager::new_with_config(client, config).await;
    let store = RedisStore::new(manager.unwrap());
    let (allow, deny) = scenarios::serve_policies(&Axum, store).await;
    let caller = Caller::with_key(Some("k"));
    let res = caller.get(&allow).await.expect(200, &server.log());
    assert_eq!(res.ratelimit("r"), 2, "{res:?}");
    // Redis takes commands but answers none for 6 s: only the timeout helps.
    let mut pause = redis::cmd("CLIENT");
    pause.arg("PAUSE").arg(6000).arg("ALL");
    pause.exec_async(&mut server.conn().await).await.unwrap();
    scenarios::assert_failure_policy(&caller, &allow, &deny, &server).await;
    // A raw PING is answered only once the pause is over.
    let mut raw = TcpStream::connect(("127.0.0.1", server.port()))
        .await
        .unwrap();
    raw.write_all(b"PING\r\n").await.unwrap();
    raw.read_exact(&mut [0; 7]).await.unwrap();
    let res = caller.get(&deny).await.expect(200, &server.log());
    assert!(res.headers.contains_key("ratelimit"), "{res:?}");
}

#[tokio::test]
async fn custom_rejection_body_keeps_the_rate_limit_headers() {
    const JSON: &str = r#"{"error":"rate limited"}"#;
    let b = Backend::redis().await;
    let json =
        |r: &Rejection| (r.status(), [(CONTENT_TYPE, "application/json")], JSON).into_response();
    let layer = by_key(b.limiter("1/1m")).respond_with(json);
    let url = spawn_axum(app().layer(layer), true).await;
    let caller = Caller::with_key(Some("k"));
    caller.get(&url).await.expect(200, &log(&b));
    let res = caller.get(&url).await.expect(429, &log(&b));
    assert_eq!(res.body, JSON);
    assert_eq!(res.header("content-type"), Some("application/json"));
    assert!((55..=60).contains(&res.int("retry-after")), "{res:?}");
    let policy = res.header("ratelimit-policy");
    assert_eq!(policy, Some(r#""default";q=1;w=60"#), "{res:?}");
    assert_eq!(res.ratelimit("r"), 0, "{res:?}");
}

/// The builder as a new user writes it: a key closure that owns something
/// that is not `Clone`, every builder method after it (on a layer that was
/// already cloned), and rejection closures with no type annotation, one
/// returning axum's `Response`, one `Response<String>` for axum's `Body`.
/// Before, this did not compile (E0282 on the closures, E0271 on the body,
/// `K: Clone` on the builder methods).
#[tokio::test]
async fn builder_takes_unannotated_closures_and_a_non_clone_extractor() {
    /// Owned by the key closure; deliberately not `Clone`.
    struct Seen(AtomicU64);
    let b = Backend::redis().await;
    let layer = |name: &str, seen: Arc<Seen>| {
        let owned = Seen(AtomicU64::new(0));
        let key = key::from_fn(move |p: &http::request::Parts| {
            owned.0.fetch_add(1, Ordering::Relaxed);
            seen.0.fetch_add(1, Ordering::Relaxed);
            Ok(Key::from(p.uri.path().to_owned()))
        });
        let limiter = b.builder("3/1m").name(name).build().unwrap();
        let layer = RateLimitLayer::new(limiter, key);
        let _shared = layer.clone();
        layer
            .on_store_error(OnStoreError::Deny)
            .legacy_headers(true)
            .cost(|p| if p.uri.path() == "/heavy" { 2 } else { 1 })
    };
    let seen = Arc::new(Seen(AtomicU64::new(0)));
    let short =
        layer("short", seen.clone()).respond_with(|r| (r.status(), "slow down").into_response());
    let built = layer("built", seen.clone()).respond_with(|r| {
        let wait = r.decision().and_then(|d| d.retry_after());
        Response::builder()
            .status(r.status())
            .body(format!("retry in {}s", wait.map_or(0, |w| w.as_secs())))
            .unwrap()
    });
    let routes = || {
        Router::new()
            .route("/", get(|| async { "ok" }))
            .route("/heavy", get(|| async { "ok" }))
    };
    let short = spawn_axum(routes().layer(short), false).await;
    let built = spawn_axum(routes().layer(built), false).await;
    let caller = Caller::with_key(None);
    for url in [&short, &built] {
        let heavy = format!("{url}/heavy");
        let res = caller.get(&heavy).await.expect(200, &log(&b));
        assert_eq!(res.header("x-ratelimit-remaining"), Some("1"), "{res:?}");
        let res = caller.get(&heavy).await.expect(429, &log(&b));
        assert_eq!(res.ratelimit("r"), 1, "cost 2 does not fit in 1: {res:?}");
        caller.get(url).await.expect(200, &log(&b));
    }
    let res = caller.get(&format!("{short}/heavy")).await;
    assert_eq!(res.expect(429, &log(&b)).body, "slow down");
    let res = caller
        .get(&format!("{built}/heavy"))
        .await
        .expect(429, &log(&b));
    assert!(res.body.starts_with("retry in "), "{res:?}");
    assert!(res.int("retry-after") >= 1, "{res:?}");
    assert_eq!(seen.0.load(Ordering::Relaxed), 8, "every request was keyed");
}

/// A request whose cost is above the whole quota could never be admitted:
/// over HTTP it is a 429 at once, without `Retry-After` (no wait would
/// help), with a body naming its cost and the limit, and nothing spent:
/// the next request of cost 1 sees the whole quota. On both stores.
#[tokio::test]
async fn a_cost_above_the_quota_is_a_429_without_retry_after_and_spends_nothing() {
    for b in [Backend::memory(), Backend::redis().await] {
        let limiter = b.builder("5/1m").name("over").build().unwrap();
        let layer = RateLimitLayer::new(limiter, Global)
            .legacy_headers(true)
            .cost(|p| if p.uri.path() == "/heavy" { 9 } else { 1 });
        let routes = Router::new()
            .route("/", get(|| async { "ok" }))
            .route("/heavy", get(|| async { "ok" }));
        let url = spawn_axum(routes.layer(layer), false).await;
        let caller = Caller::with_key(None);
        for _ in 0..2 {
            let res = caller.get(&format!("{url}/heavy")).await;
            let res = res.expect(429, &log(&b));
            assert_eq!(res.header("retry-after"), None, "{res:?}");
            assert!(
                res.body
                    .contains("request cost 9 exceeds the rate limit of 5"),
                "{res:?}"
            );
        }
        let res = caller.get(&url).await.expect(200, &log(&b));
        assert_eq!(res.header("x-ratelimit-remaining"), Some("4"), "{res:?}");
    }
}
