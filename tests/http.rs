//! The layer end to end over real HTTP: axum and plain hyper servers on
//! ephemeral ports, the hyper-util client, and a real redis-server per test.

mod support;

use std::{
    convert::Infallible,
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use axum::{Router, response::IntoResponse, routing::get};
use bytes::Bytes;
use futures_util::future::join_all;
use http::{HeaderMap, Request, Response, StatusCode, header::CONTENT_TYPE};
use http_body_util::{BodyExt, Empty, Full};
use hyper::{body::Incoming, server::conn::http1};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioIo},
    service::TowerToHyperService,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis_ratelimit::{
    Limiter, OnStoreError, RateLimitLayer, RedisStore, Rejection,
    key::{Global, Header, PeerIp},
};
use support::{Backend, RedisServer};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};
use tower::ServiceBuilder;

/// A finished HTTP exchange.
#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    /// A header holding a plain integer, such as `retry-after`.
    fn int(&self, name: &str) -> u64 {
        let v = self.header(name);
        v.and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} is not an integer: {v:?} in {self:?}"))
    }

    /// A parameter of `RateLimit: "default";r=4;t=10`: `r` or `t`.
    fn ratelimit(&self, key: &str) -> u64 {
        let v = self.header("ratelimit");
        let v = v.unwrap_or_else(|| panic!("no ratelimit header: {self:?}"));
        v.split(';')
            .skip(1)
            .find_map(|p| p.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
            .unwrap_or_else(|| panic!("no integer {key}= in ratelimit: {v:?}"))
    }

    fn has_ratelimit_headers(&self) -> bool {
        ["ratelimit", "ratelimit-policy", "retry-after"]
            .iter()
            .any(|h| self.headers.contains_key(*h))
    }

    /// Asserts the status, showing the Redis `log` if it is wrong.
    fn expect(self, status: u16, log: &str) -> Self {
        assert_eq!(self.status.as_u16(), status, "{self:?}\n{log}");
        self
    }
}

/// Who sends requests: a client (which fixes the source IP) and an API key.
#[derive(Clone)]
struct Caller {
    client: Client<HttpConnector, Empty<Bytes>>,
    api_key: Option<&'static str>,
}

impl Caller {
    fn with_key(api_key: Option<&'static str>) -> Self {
        let client = Client::builder(TokioExecutor::new()).build_http();
        Self { client, api_key }
    }

    /// A caller whose requests come from `ip` (on Linux any 127.0.0.0/8
    /// address reaches 127.0.0.1), each on a new connection, so a new port.
    fn from_ip(ip: [u8; 4]) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_local_address(Some(IpAddr::from(ip)));
        let mut builder = Client::builder(TokioExecutor::new());
        let client = builder.pool_max_idle_per_host(0).build(connector);
        let api_key = None;
        Self { client, api_key }
    }

    async fn get(&self, url: &str) -> Reply {
        let mut req = Request::get(url);
        if let Some(key) = self.api_key {
            req = req.header("x-api-key", key);
        }
        let req = req.body(Empty::new()).unwrap();
        let exchange = async {
            let res = self.client.request(req).await.expect("HTTP request");
            let (parts, body) = res.into_parts();
            let body = body.collect().await.expect("response body").to_bytes();
            let body = String::from_utf8(body.to_vec()).unwrap();
            Reply {
                status: parts.status,
                headers: parts.headers,
                body,
            }
        };
        tokio::time::timeout(Duration::from_secs(30), exchange)
            .await
            .unwrap_or_else(|_| panic!("GET {url} hung for 30 s"))
    }

    /// `n` requests, one after another.
    async fn get_n(&self, url: &str, n: usize) -> Vec<Reply> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(self.get(url).await);
        }
        out
    }

    async fn statuses(&self, url: &str, n: usize) -> Vec<u16> {
        let replies = self.get_n(url, n).await;
        replies.iter().map(|r| r.status.as_u16()).collect()
    }
}

/// `GET /` answering `ok`.
fn app() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

/// Serves `app` on an ephemeral port, with or without axum's connect info.
async fn spawn_axum(app: Router, connect_info: bool) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        if connect_info {
            let app = app.into_make_service_with_connect_info::<SocketAddr>();
            axum::serve(listener, app).await
        } else {
            axum::serve(listener, app).await
        }
    });
    url
}

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

fn log(b: &Backend) -> String {
    b.server().map(RedisServer::log).unwrap_or_default()
}

fn by_key(limiter: Limiter) -> RateLimitLayer<Header> {
    RateLimitLayer::new(limiter, Header::new("x-api-key"))
}

const POLICY_5_PER_10S: &str = r#""default";q=5;w=10"#;

/// The "5/10s" policy over HTTP: `first` gets exactly five 200s counting
/// down, then 429s; `other` is counted on its own.
async fn exact_count(b: &Backend, url: &str, first: &Caller, other: &Caller) {
    for expected_r in (0..5).rev() {
        let res = first.get(url).await.expect(200, &log(b));
        assert_eq!(res.body, "ok");
        assert_eq!(res.header("ratelimit-policy"), Some(POLICY_5_PER_10S));
        assert_eq!(res.ratelimit("r"), expected_r, "{res:?}");
        assert!((9..=10).contains(&res.ratelimit("t")), "{res:?}");
        assert_eq!(res.header("retry-after"), None, "{res:?}");
    }
    for _ in 0..2 {
        let res = first.get(url).await.expect(429, &log(b));
        assert_eq!(res.body, "", "the handler must not run");
        assert_eq!(res.header("ratelimit-policy"), Some(POLICY_5_PER_10S));
        assert_eq!(res.ratelimit("r"), 0, "{res:?}");
        let retry = res.int("retry-after");
        assert!((9..=10).contains(&retry), "{res:?}");
        assert_eq!(retry, res.ratelimit("t"), "{res:?}");
    }
    let res = other.get(url).await.expect(200, &log(b));
    assert_eq!(res.ratelimit("r"), 4, "another client has its own count");
}

async fn axum_exact_count(b: Backend) {
    let url = spawn_axum(app().layer(by_key(b.limiter("5/10s"))), true).await;
    let (a, other) = (Caller::with_key(Some("a")), Caller::with_key(Some("b")));
    exact_count(&b, &url, &a, &other).await;
}

#[tokio::test]
async fn axum_with_redis_admits_exactly_the_quota() {
    axum_exact_count(Backend::redis().await).await;
}

#[tokio::test]
async fn axum_with_redis_pool_admits_exactly_the_quota() {
    axum_exact_count(Backend::redis_pool().await).await;
}

#[tokio::test]
async fn axum_with_memory_store_admits_exactly_the_quota() {
    axum_exact_count(Backend::memory()).await;
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
    let by_header = spawn_axum(app().layer(by_key(b.limiter("5/1m"))), true).await;
    // PeerIp behind an axum server that was not given connect info.
    let by_ip = RateLimitLayer::new(b.limiter("5/1m"), PeerIp);
    let by_ip = spawn_axum(app().layer(by_ip), false).await;
    for (url, status) in [(by_header, 400), (by_ip, 500)] {
        for res in Caller::with_key(None).get_n(&url, 3).await {
            let res = res.expect(status, &log(&b));
            assert!(!res.has_ratelimit_headers(), "{res:?}");
            assert_eq!(res.body, "", "the handler must not run");
        }
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

/// Fires 200 concurrent requests with one key, alternating over `urls`, and
/// returns how many were answered 200 and 429.
async fn burst(urls: &[String]) -> (usize, usize) {
    let caller = Caller::with_key(Some("hot"));
    let replies = join_all((0..200).map(|i| caller.get(&urls[i % urls.len()]))).await;
    let count = |s| replies.iter().filter(|r| r.status == s).count();
    (count(StatusCode::OK), count(StatusCode::TOO_MANY_REQUESTS))
}

/// An axum server limiting "50/1m" per `x-api-key` on its own connection.
async fn spawn_hot_app(server: &RedisServer) -> String {
    let (quota, store) = ("50/1m".parse().unwrap(), server.store().await);
    let limiter = Limiter::builder(quota).store(store).build().unwrap();
    spawn_axum(app().layer(by_key(limiter)), true).await
}

#[tokio::test]
async fn concurrent_requests_admit_exactly_the_limit() {
    let server = RedisServer::start();
    let url = spawn_hot_app(&server).await;
    assert_eq!(burst(&[url]).await, (50, 150), "{}", server.log());
    server.assert_every_key_has_ttl().await;
}

#[tokio::test]
async fn two_servers_sharing_redis_admit_exactly_the_limit() {
    let server = RedisServer::start();
    let urls = [spawn_hot_app(&server).await, spawn_hot_app(&server).await];
    assert_eq!(burst(&urls).await, (50, 150), "{}", server.log());
    server.assert_every_key_has_ttl().await;
}

/// Serves `/allow` and `/deny`, each limited "3/1m" per `x-api-key` with a
/// 200 ms store timeout, under the store-error policy of that name.
async fn spawn_policy_app(store: RedisStore) -> (String, String) {
    let layer = |name: &str, policy| {
        let builder = Limiter::builder("3/1m".parse().unwrap()).store(store.clone());
        let limiter = builder.name(name).timeout(Duration::from_millis(200));
        by_key(limiter.build().unwrap()).on_store_error(policy)
    };
    let ok = || get(|| async { "ok" });
    let app = Router::new()
        .route("/allow", ok().layer(layer("allow", OnStoreError::Allow)))
        .route("/deny", ok().layer(layer("deny", OnStoreError::Deny)));
    let base = spawn_axum(app, true).await;
    (format!("{base}/allow"), format!("{base}/deny"))
}

/// With the store failing, `/allow` answers 200 and `/deny` 503, both
/// without rate-limit headers and well within a bound.
async fn assert_failure_policy(caller: &Caller, allow: &str, deny: &str, server: &RedisServer) {
    for (url, status) in [(allow, 200), (deny, 503)] {
        for _ in 0..2 {
            let started = Instant::now();
            let res = caller.get(url).await.expect(status, &server.log());
            let took = started.elapsed();
            assert!(!res.has_ratelimit_headers(), "{res:?}");
            assert!(took < Duration::from_millis(1500), "{url} took {took:?}");
        }
    }
}

#[tokio::test]
async fn redis_outage_follows_the_policy_and_limiting_resumes_after_restart() {
    let mut server = RedisServer::start();
    let (allow, deny) = spawn_policy_app(server.store().await).await;
    let caller = Caller::with_key(Some("k"));
    // Exhaust /allow while Redis is up, so a fresh count is visible later.
    assert_eq!(caller.statuses(&allow, 4).await, [200, 200, 200, 429]);

    server.kill();
    assert_failure_policy(&caller, &allow, &deny, &server).await;

    server.restart();
    // The ConnectionManager reconnects by itself; poll until it has.
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        let res = caller.get(&allow).await.expect(200, &server.log());
        if res.headers.contains_key("ratelimit") {
            break res;
        }
        assert!(Instant::now() < deadline, "not limiting 10 s after restart");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The restart emptied Redis: a fresh window, which runs out again.
    let r = first.ratelimit("r") as usize;
    let mut expected = vec![200; r];
    expected.push(429);
    let statuses = caller.statuses(&allow, r + 1).await;
    assert_eq!(statuses, expected, "{}", server.log());
    let res = caller.get(&deny).await.expect(200, &server.log());
    assert_eq!(res.ratelimit("r"), 2, "{res:?}");
}

#[tokio::test]
async fn a_hung_redis_is_cut_off_by_the_limiter_timeout() {
    let server = RedisServer::start();
    // A connection that waits for replies forever: only the limiter's own
    // timeout can bound a check.
    let config = ConnectionManagerConfig::new().set_response_timeout(None);
    let client = redis::Client::open(server.url()).unwrap();
    let manager = ConnectionManager::new_with_config(client, config).await;
    let (allow, deny) = spawn_policy_app(RedisStore::new(manager.unwrap())).await;
    let caller = Caller::with_key(Some("k"));
    let res = caller.get(&allow).await.expect(200, &server.log());
    assert_eq!(res.ratelimit("r"), 2, "{res:?}");
    // Redis takes commands but answers none for 6 s: only the timeout helps.
    let mut pause = redis::cmd("CLIENT");
    pause.arg("PAUSE").arg(6000).arg("ALL");
    pause.exec_async(&mut server.conn().await).await.unwrap();
    assert_failure_policy(&caller, &allow, &deny, &server).await;
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
async fn script_flush_between_requests_is_invisible_to_clients() {
    let b = Backend::redis().await;
    let url = spawn_axum(app().layer(by_key(b.limiter("5/1m"))), true).await;
    let caller = Caller::with_key(Some("k"));
    let mut conn = b.server().unwrap().conn().await;
    let mut flush = redis::cmd("SCRIPT");
    flush.arg("FLUSH");
    for expected_r in (0..5).rev() {
        let res = caller.get(&url).await.expect(200, &log(&b));
        assert_eq!(res.ratelimit("r"), expected_r, "{res:?}");
        flush.exec_async(&mut conn).await.unwrap();
    }
    caller.get(&url).await.expect(429, &log(&b));
}

#[tokio::test]
async fn legacy_headers_carry_limit_remaining_and_reset() {
    let b = Backend::redis().await;
    let layer = by_key(b.limiter("3/1m")).legacy_headers(true);
    let url = spawn_axum(app().layer(layer), true).await;
    let caller = Caller::with_key(Some("k"));
    for (status, remaining) in [(200, 2), (200, 1), (200, 0), (429, 0)] {
        let res = caller.get(&url).await.expect(status, &log(&b));
        assert_eq!(res.int("x-ratelimit-limit"), 3, "{res:?}");
        assert_eq!(res.int("x-ratelimit-remaining"), remaining, "{res:?}");
        let reset = res.int("x-ratelimit-reset");
        assert!((55..=60).contains(&reset), "{res:?}");
        assert_eq!(reset, res.ratelimit("t"), "{res:?}");
    }
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
