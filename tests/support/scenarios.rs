//! HTTP scenarios written once and run against every framework adapter:
//! each test file implements [`Serve`] for its framework (axum for tower,
//! actix-web) and calls these.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use futures_util::future::join_all;
use http::StatusCode;
use redis_ratelimit::{Limiter, OnStoreError, RateLimitLayer, RedisStore, key::Header};

use super::{
    Backend, RedisServer,
    http::{Caller, Reply},
};

/// A framework that can serve `GET /` (answering `ok`) behind a layer.
pub trait Serve {
    /// Serves on a free port and returns the base URL.
    fn serve(&self, layer: RateLimitLayer<Header>) -> impl Future<Output = String>;

    /// Serves `GET /` and `GET /own` (answering `ok` with the handler's own
    /// legacy headers, [`OWN_LEGACY_HEADERS`]) behind `inner`, itself
    /// behind `outer`.
    fn serve_nested(
        &self,
        outer: RateLimitLayer<Header>,
        inner: RateLimitLayer<Header>,
    ) -> impl Future<Output = String>;
}

/// What `GET /own` sets itself: a legacy set no layer can read.
pub const OWN_LEGACY_HEADERS: [(&str, &str); 2] = [
    ("x-ratelimit-limit", "10"),
    ("x-ratelimit-remaining", "soon"),
];

/// Limits by the `x-api-key` header.
pub fn by_key(limiter: Limiter) -> RateLimitLayer<Header> {
    RateLimitLayer::new(limiter, Header::new("x-api-key"))
}

pub fn log(b: &Backend) -> String {
    b.server().map(RedisServer::log).unwrap_or_default()
}

const POLICY_5_PER_10S: &str = r#""default";q=5;w=10"#;

/// The "5/10s" policy over HTTP: `first` gets exactly five 200s counting
/// down, then 429s; `other` is counted on its own.
pub async fn exact_count(b: &Backend, url: &str, first: &Caller, other: &Caller) {
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
        assert_eq!(res.header("ratelimit-policy"), Some(POLICY_5_PER_10S));
        assert_eq!(res.ratelimit("r"), 0, "{res:?}");
        let retry = res.int("retry-after");
        assert!((9..=10).contains(&retry), "{res:?}");
        // The middleware's own short answer: the handler did not run.
        res.expect_text(&format!("rate limit exceeded; retry in {retry} s"));
        assert_eq!(retry, res.ratelimit("t"), "{res:?}");
    }
    let res = other.get(url).await.expect(200, &log(b));
    assert_eq!(res.ratelimit("r"), 4, "another client has its own count");
}

/// [`exact_count`] keyed by `x-api-key`.
pub async fn exact_count_by_key(s: &impl Serve, b: &Backend) {
    let url = s.serve(by_key(b.limiter("5/10s"))).await;
    let (a, other) = (Caller::with_key(Some("a")), Caller::with_key(Some("b")));
    exact_count(b, &url, &a, &other).await;
}

/// A "2/1s" key runs out, is told to come back in 1 s, and after that
/// second has a fresh window.
pub async fn window_reopens(s: &impl Serve, b: &Backend) {
    let url = s.serve(by_key(b.limiter("2/1s"))).await;
    let caller = Caller::with_key(Some("k"));
    assert_eq!(caller.statuses(&url, 2).await, [200, 200], "{}", log(b));
    let denied = caller.get(&url).await.expect(429, &log(b));
    assert_eq!(denied.int("retry-after"), 1, "{denied:?}");
    assert_eq!(denied.ratelimit("t"), 1, "{denied:?}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let res = caller.get(&url).await.expect(200, &log(b));
    assert_eq!(res.ratelimit("r"), 1, "a fresh window: {res:?}");
}

/// The optional legacy headers, consistent with `RateLimit`.
pub async fn header_values(s: &impl Serve, b: &Backend) {
    let layer = by_key(b.limiter("3/1m")).legacy_headers(true);
    let url = s.serve(layer).await;
    let caller = Caller::with_key(Some("k"));
    for (status, remaining) in [(200, 2), (200, 1), (200, 0), (429, 0)] {
        let res = caller.get(&url).await.expect(status, &log(b));
        assert_eq!(
            res.header("ratelimit-policy"),
            Some(r#""default";q=3;w=60"#)
        );
        assert_eq!(res.int("x-ratelimit-limit"), 3, "{res:?}");
        assert_eq!(res.int("x-ratelimit-remaining"), remaining, "{res:?}");
        assert_eq!(res.ratelimit("r"), remaining, "{res:?}");
        let reset = res.int("x-ratelimit-reset");
        assert!((55..=60).contains(&reset), "{res:?}");
        assert_eq!(reset, res.ratelimit("t"), "{res:?}");
        if status == 429 {
            assert_eq!(res.int("retry-after"), reset, "{res:?}");
        }
    }
}

/// The legacy headers of a response that passed two nested layers, a
/// global one outside a per-route one: one set, the tightest limit's (the
/// fewest remaining, then the later reset), whichever layer it is in; the
/// IETF headers carry both layers' items. A handler's own unreadable set
/// is replaced, never a 500.
pub async fn nested_legacy_headers(s: &impl Serve, b: &Backend) {
    let layer = |name: &str, quota: &str| {
        by_key(b.builder(quota).name(name).build().unwrap()).legacy_headers(true)
    };
    let legacy = |res: &Reply| {
        [
            res.int("x-ratelimit-limit"),
            res.int("x-ratelimit-remaining"),
            res.int("x-ratelimit-reset"),
        ]
    };
    let all = |res: &Reply, name: &str| -> Vec<String> {
        let values = res.headers.get_all(name).iter();
        values.map(|v| v.to_str().unwrap().to_owned()).collect()
    };
    let (minute, hour) = (55..=60, 3590..=3600);

    // The per-route limit is the tighter: its set, though the outer layer
    // writes last; on its denial too.
    let url = s
        .serve_nested(layer("global", "100/1h"), layer("route", "2/1m"))
        .await;
    let caller = Caller::with_key(Some("a"));
    for (status, remaining) in [(200, 1), (200, 0), (429, 0)] {
        let res = caller.get(&url).await.expect(status, &log(b));
        let [limit, left, reset] = legacy(&res);
        assert_eq!((limit, left), (2, remaining), "{res:?}");
        assert!(minute.contains(&reset), "{res:?}");
        for name in [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ] {
            assert_eq!(all(&res, name).len(), 1, "{name}: {res:?}");
        }
        // Appended, not overwritten: the inner layer's item, then the outer's.
        let ratelimit = all(&res, "ratelimit");
        assert_eq!(ratelimit.len(), 2, "{res:?}");
        assert!(ratelimit[0].starts_with(r#""route";"#), "{res:?}");
        assert!(ratelimit[1].starts_with(r#""global";"#), "{res:?}");
        let policy = all(&res, "ratelimit-policy");
        assert_eq!(policy, [r#""route";q=2;w=60"#, r#""global";q=100;w=3600"#]);
    }

    // The global limit is the tighter: its set, whole.
    let url = s
        .serve_nested(layer("global-2", "2/1h"), layer("route-2", "100/1m"))
        .await;
    for remaining in [1, 0] {
        let res = caller.get(&url).await.expect(200, &log(b));
        let [limit, left, reset] = legacy(&res);
        assert_eq!((limit, left), (2, remaining), "{res:?}");
        assert!(hour.contains(&reset), "{res:?}");
    }

    // As many remaining: the later reset. Then a handler's own set that no
    // layer can read: replaced by the tightest layer's, whole.
    let url = s
        .serve_nested(layer("global-3", "3/1h"), layer("route-3", "3/1m"))
        .await;
    let res = caller.get(&url).await.expect(200, &log(b));
    let [limit, left, reset] = legacy(&res);
    assert_eq!((limit, left), (3, 2), "{res:?}");
    assert!(hour.contains(&reset), "the later reset: {res:?}");
    let res = caller.get(&format!("{url}/own")).await.expect(200, &log(b));
    assert_eq!(res.body, "ok");
    let [limit, left, reset] = legacy(&res);
    assert_eq!((limit, left), (3, 1), "{res:?}");
    assert!(hour.contains(&reset), "{res:?}");
}

/// A request without the key header: 400, no headers, handler not run.
pub async fn missing_key_is_refused(s: &impl Serve, b: &Backend) {
    let url = s.serve(by_key(b.limiter("5/1m"))).await;
    for res in Caller::with_key(None).get_n(&url, 3).await {
        let res = res.expect(400, &log(b));
        assert!(!res.has_ratelimit_headers(), "{res:?}");
        res.expect_text("missing rate limit key: header x-api-key");
    }
}

/// The default answers' bodies, by `Accept`: text, or RFC 9457 problem
/// details with the draft's `quota-exceeded` type and `violated-policies`
/// naming only the limit that denied (of two), for 429, 400 and 503.
pub async fn default_answers(s: &impl Serve, b: &Backend) {
    let limiter = b
        .builder("1/1m")
        .name("burst")
        .limit("daily", "100/1d".parse().unwrap());
    let url = s.serve(by_key(limiter.build().unwrap())).await;
    let text = Caller::with_key(Some("k"));
    let json = Caller::with_key(Some("k")).accepting("text/html;q=0.9, application/json");
    let problem = Caller::with_key(Some("k")).accepting("application/problem+json");
    text.get(&url).await.expect(200, &log(b));

    let res = text.get(&url).await.expect(429, &log(b));
    let retry = res.int("retry-after");
    res.expect_text(&format!("rate limit exceeded; retry in {retry} s"));
    // The 429's RFC 9457 body, `retry` seconds to wait.
    let quota_exceeded = |retry: u64| {
        serde_json::json!({
            "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
            "title": "Quota Exceeded",
            "status": 429,
            "detail": format!("rate limit exceeded; retry in {retry} s"),
            "violated-policies": ["burst"],
        })
    };
    for caller in [&json, &problem] {
        let res = caller.get(&url).await.expect(429, &log(b));
        let want = quota_exceeded(res.int("retry-after"));
        assert_eq!(res.problem(), want, "{res:?}");
        assert!(
            res.header("ratelimit")
                .unwrap()
                .starts_with(r#""burst";r=0;"#)
        );
    }
    let wildcard = Caller::with_key(Some("k")).accepting("*/*");
    let res = wildcard.get(&url).await.expect(429, &log(b));
    assert!(res.body.starts_with("rate limit exceeded"), "{res:?}");
    // problem+json refused by name (q=0), JSON preferred to text: the same
    // body as plain JSON; the most specific range decides, so `*/*` does
    // not bring it back. With JSON refused too, or preferred less: text.
    for (accept, json) in [
        ("application/problem+json;q=0, application/json", true),
        ("application/problem+json;q=0, text/plain;q=0.5, */*", true),
        ("application/problem+json;q=0, text/plain", false),
        (
            "application/problem+json;q=0, application/json;q=0, */*",
            false,
        ),
    ] {
        let caller = Caller::with_key(Some("k")).accepting(accept);
        let res = caller.get(&url).await.expect(429, &log(b));
        let retry = res.int("retry-after");
        if json {
            let body = res.json_as("application/json");
            assert_eq!(body, quota_exceeded(retry), "{accept}");
        } else {
            res.expect_text(&format!("rate limit exceeded; retry in {retry} s"));
        }
    }

    let res = Caller::with_key(None).get(&url).await.expect(400, &log(b));
    res.expect_text("missing rate limit key: header x-api-key");
    let json = Caller::with_key(None).accepting("application/json");
    let res = json.get(&url).await.expect(400, &log(b));
    let want = serde_json::json!({
        "type": "about:blank",
        "title": "Bad Request",
        "status": 400,
        "detail": "missing rate limit key: header x-api-key",
    });
    assert_eq!(res.problem(), want, "{res:?}");

    // A store that never answers (a socket held for the whole test: a port
    // merely free could be taken by another test's server, which would
    // answer), under OnStoreError::Deny: 503.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let down = RedisStore::connect_lazy(format!("redis://127.0.0.1:{port}")).unwrap();
    let limiter = Limiter::builder("5/1m".parse().unwrap()).store(down);
    let limiter = limiter.timeout(Duration::from_millis(300)).build().unwrap();
    let url = s
        .serve(by_key(limiter).on_store_error(OnStoreError::Deny))
        .await;
    let res = Caller::with_key(Some("k")).get(&url).await.expect(503, "");
    res.expect_text("rate limit store unavailable");
    let json = Caller::with_key(Some("k")).accepting("application/problem+json");
    let res = json.get(&url).await.expect(503, "");
    let want = serde_json::json!({
        "type": "about:blank",
        "title": "Service Unavailable",
        "status": 503,
        "detail": "rate limit store unavailable",
    });
    assert_eq!(res.problem(), want, "{res:?}");
    assert!(!res.has_ratelimit_headers(), "{res:?}");
}

/// 200 concurrent requests with one key over `urls` (servers limiting
/// "50/1m" on one Redis) are answered with exactly 50 200s and 150 429s.
pub async fn concurrent_requests_admit_exactly_the_limit(s: &impl Serve, servers: usize) {
    let redis = RedisServer::start();
    let mut urls = Vec::new();
    for _ in 0..servers {
        urls.push(s.serve(by_key(redis.limiter("50/1m").await)).await);
    }
    let caller = Caller::with_key(Some("hot"));
    let replies = join_all((0..200).map(|i| caller.get(&urls[i % urls.len()]))).await;
    let count = |s| replies.iter().filter(|r| r.status == s).count();
    let counts = (count(StatusCode::OK), count(StatusCode::TOO_MANY_REQUESTS));
    assert_eq!(counts, (50, 150), "{}", redis.log());
    redis.assert_every_key_has_ttl().await;
}

/// `SCRIPT FLUSH` between requests: redis-rs reloads the script on
/// `NOSCRIPT` and clients never notice.
pub async fn script_flush_is_invisible(s: &impl Serve, b: &Backend) {
    let url = s.serve(by_key(b.limiter("5/1m"))).await;
    let caller = Caller::with_key(Some("k"));
    let mut conn = b.server().expect("a Redis backend").conn().await;
    let mut flush = redis::cmd("SCRIPT");
    flush.arg("FLUSH");
    for expected_r in (0..5).rev() {
        let res = caller.get(&url).await.expect(200, &log(b));
        assert_eq!(res.ratelimit("r"), expected_r, "{res:?}");
        flush.exec_async(&mut conn).await.unwrap();
    }
    caller.get(&url).await.expect(429, &log(b));
}

/// Serves an "allow" and a "deny" URL, each limited "3/1m" per `x-api-key`
/// with a 200 ms store timeout, under the store-error policy of that name.
pub async fn serve_policies(s: &impl Serve, store: RedisStore) -> (String, String) {
    let layer = |name: &str, policy| {
        let builder = Limiter::builder("3/1m".parse().unwrap()).store(store.clone());
        let limiter = builder.name(name).timeout(Duration::from_millis(200));
        by_key(limiter.build().unwrap()).on_store_error(policy)
    };
    let allow = s.serve(layer("allow", OnStoreError::Allow)).await;
    let deny = s.serve(layer("deny", OnStoreError::Deny)).await;
    (allow, deny)
}

/// With the store failing, `allow` answers 200 and `deny` 503, both
/// without rate-limit headers and well within a bound.
pub async fn assert_failure_policy(caller: &Caller, allow: &str, deny: &str, server: &RedisServer) {
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

/// Redis killed: the store-error policy, within a bound, except for a key
/// already known to be over its limit, which the local deny cache keeps
/// denying. Redis restarted: limiting resumes by itself.
pub async fn redis_killed_and_restarted(s: &impl Serve) {
    let mut server = RedisServer::start();
    let (allow, deny) = serve_policies(s, server.store().await).await;
    let (spent, caller) = (Caller::with_key(Some("spent")), Caller::with_key(Some("k")));
    assert_eq!(spent.statuses(&allow, 4).await, [200, 200, 200, 429]);

    server.kill();
    assert_failure_policy(&caller, &allow, &deny, &server).await;
    let res = spent.get(&allow).await.expect(429, &server.log());
    assert!(
        res.int("retry-after") > 50,
        "denied locally until the window ends: {res:?}"
    );

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

/// One fixed sequence of requests, for comparing adapters: two keys through
/// a "3/1h" limit with legacy headers, and a request without a key.
pub async fn parity_sequence(s: &impl Serve, b: &Backend) -> Vec<Reply> {
    let url = s
        .serve(by_key(b.limiter("3/1h")).legacy_headers(true))
        .await;
    let (a, other, none) = (
        Caller::with_key(Some("a")),
        Caller::with_key(Some("b")),
        Caller::with_key(None),
    );
    let mut replies = a.get_n(&url, 5).await;
    replies.extend(other.get_n(&url, 2).await);
    replies.push(none.get(&url).await);
    replies.extend(a.get_n(&url, 1).await);
    replies
}

/// `pk` on `RateLimit`: absent by default; with `partition_key(true)` the
/// same for one client on every answer (200 and 429), different for another
/// client, and never the key itself; with one `partition_key_secret`, the
/// same on two servers (replicas).
pub async fn partition_key(s: &impl Serve, b: &Backend) {
    let named = |name: &str| b.builder("2/1m").name(name).build().unwrap();
    let plain = s.serve(by_key(named("plain"))).await;
    let res = Caller::with_key(Some("alice"))
        .get(&plain)
        .await
        .expect(200, &log(b));
    assert_eq!(res.pk(), None, "{res:?}");

    let url = s.serve(by_key(named("pk")).partition_key(true)).await;
    let (alice, bob) = (
        Caller::with_key(Some("alice")),
        Caller::with_key(Some("bob")),
    );
    let replies = alice.get_n(&url, 3).await;
    assert_eq!(replies[2].status, 429, "{:?}", replies[2]);
    let pk = replies[0].pk().expect("pk with partition_key(true)");
    assert_eq!(pk.len(), 8);
    for res in &replies {
        assert_eq!(
            res.pk().as_ref(),
            Some(&pk),
            "stable for one client: {res:?}"
        );
        assert!(
            !res.header("ratelimit").unwrap().contains("alice"),
            "{res:?}"
        );
    }
    let bobs = bob.get(&url).await.expect(200, &log(b)).pk().unwrap();
    assert_ne!(bobs, pk, "another client, another partition");
    let again = s.serve(by_key(named("again")).partition_key(true)).await;
    let res = bob.get(&again).await.expect(200, &log(b));
    assert_ne!(res.pk().unwrap(), bobs, "a fresh random secret per layer");

    let replica = || {
        let shared = b.builder("100/1m").share_counters().build().unwrap();
        by_key(shared).partition_key_secret("shared secret")
    };
    let (one, two) = (s.serve(replica()).await, s.serve(replica()).await);
    let at_one = alice.get(&one).await.expect(200, &log(b)).pk();
    let at_two = alice.get(&two).await.expect(200, &log(b)).pk();
    assert_eq!(at_one, at_two, "replicas with one secret agree");
    assert!(at_one.is_some());
}
