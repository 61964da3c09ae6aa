//! Several limits decided together: all or nothing, under concurrency, and
//! over HTTP (policies, the binding limit, Retry-After, per-request cost).

mod support;

use std::time::Duration;

use axum::{Router, routing::get};
use futures_util::future::join_all;
use http::request::Parts;
use redis::AsyncCommands;
use redis_ratelimit::{
    Decision, Limiter, Quota, RateLimitLayer,
    key::{self, Global, Header},
};
use support::{Backend, http::Caller, scenarios::log, servers::spawn_axum};

/// "second" and "day" limits of one key, with the remaining of each.
fn remaining(d: &Decision) -> Vec<(String, u64)> {
    d.limits()
        .map(|l| (l.name().to_owned(), l.remaining()))
        .collect()
}

fn pair(second: u64, day: u64) -> Vec<(String, u64)> {
    vec![("second".into(), second), ("day".into(), day)]
}

/// A request denied by one limit spends nothing in the other, both ways.
async fn denied_by_one_limit_spends_in_none(b: Backend) {
    let limiter = b
        .builder("3/1s")
        .name("second")
        .limit("day", Quota::per_day(5))
        .build()
        .unwrap();
    for _ in 0..3 {
        assert!(limiter.check("u", 1).await.unwrap().is_allowed());
    }
    let by_second = limiter.check("u", 1).await.unwrap();
    assert!(!by_second.is_allowed());
    assert_eq!(by_second.policy(), "second");
    assert_eq!(remaining(&by_second), pair(0, 2), "the day limit was spent");

    tokio::time::sleep(Duration::from_millis(1100)).await;
    for _ in 0..2 {
        assert!(limiter.check("u", 1).await.unwrap().is_allowed());
    }
    let by_day = limiter.check("u", 1).await.unwrap();
    assert!(!by_day.is_allowed());
    assert_eq!(by_day.policy(), "day");
    assert_eq!(remaining(&by_day), pair(1, 0), "the second limit was spent");
    assert!(by_day.retry_after().unwrap() > Duration::from_secs(86_000));

    if let Some(server) = b.server() {
        let mut conn = server.conn().await;
        let keys = limiter.store_keys("u");
        let counts: Vec<Option<u64>> = conn.mget(&keys).await.unwrap();
        assert_eq!(counts, [Some(2), Some(5)], "{keys:?}");
        server.assert_every_key_has_ttl().await;
    }
}

/// 200 concurrent requests from 4 users against 30 per user and 100 in
/// total: the total is exactly 100 and no user passes 30.
async fn concurrent_requests_never_pass_any_limit(b: Backend) {
    let limiter = b
        .builder("30/1m")
        .name("per-user")
        .limit("total", Quota::per_minute(100).sliding_window())
        .build()
        .unwrap();
    let users = ["u0", "u1", "u2", "u3"];
    let checks = (0..200).map(|i| {
        let user = users[i % users.len()];
        let limiter = &limiter;
        async move { (user, limiter.check_each(&[user, "all"], 1).await.unwrap()) }
    });
    let results = join_all(checks).await;
    let allowed = |user: &str| {
        let mine = results.iter().filter(|(u, d)| *u == user && d.is_allowed());
        mine.count()
    };
    let total: usize = users.iter().map(|u| allowed(u)).sum();
    assert_eq!(total, 100, "the total limit");
    for user in users {
        assert!(allowed(user) <= 30, "{user} got {}", allowed(user));
    }
    if let Some(server) = b.server() {
        server.assert_every_key_has_ttl().await;
    }
}

/// A shadow limit denies nothing, not even a cost above its capacity: the
/// store decides it (a denial that blocks nothing), for every algorithm,
/// and the enforced limit spends the cost. It was `CostExceedsLimit`, a 429
/// from the layers.
async fn a_cost_above_a_shadow_limit_only_reports_a_denial(b: Backend) {
    let small = Quota::per_minute(5);
    for (name, shadow) in [
        ("fw", small),
        ("sw", small.sliding_window()),
        ("gcra", small.gcra(5).unwrap()),
    ] {
        let limiter = b
            .builder("100/1m")
            .name(format!("enforced-{name}"))
            .limit(format!("small-{name}"), shadow)
            .shadow_limit(format!("small-{name}"))
            .build()
            .unwrap();
        let d = limiter.check("u", 10).await.unwrap();
        assert!(d.is_allowed() && d.is_shadow_denied(), "{name}: {d:?}");
        // The enforced limit spent the 10; the shadow one nothing.
        assert!(limiter.check("u", 90).await.unwrap().is_allowed(), "{name}");
        assert!(!limiter.check("u", 1).await.unwrap().is_allowed(), "{name}");
    }
    if let Some(server) = b.server() {
        server.assert_every_key_has_ttl().await;
    }
}

/// An allowed decision reports the enforced limit, not a shadow limit with
/// fewer units left: headers saying `r=0` on a 200 would make clients that
/// follow them back off for a limit that denies nothing.
async fn an_allowed_decision_reports_the_enforced_limit_not_a_shadow(b: Backend) {
    let limiter = b
        .builder("3/1m")
        .name("second")
        .limit("day", Quota::per_minute(1))
        .shadow_limit("day")
        .build()
        .unwrap();
    limiter.check("k", 1).await.unwrap();
    let d = limiter.check("k", 1).await.unwrap();
    assert!(d.is_allowed() && d.is_shadow_denied(), "{d:?}");
    assert_eq!((d.policy(), d.remaining()), ("second", 1), "{d:?}");
    let mut headers = http::HeaderMap::new();
    d.write_headers(&mut headers);
    let ratelimit = headers["ratelimit"].to_str().unwrap();
    assert!(ratelimit.starts_with("\"second\";r=1;"), "{ratelimit}");
    // With every limit a shadow, the tightest of all is reported.
    let all = b
        .builder("3/1m")
        .name("all-second")
        .limit("all-day", Quota::per_minute(1))
        .shadow(true)
        .build()
        .unwrap();
    all.check("k", 1).await.unwrap();
    let d = all.check("k", 1).await.unwrap();
    assert_eq!((d.policy(), d.remaining()), ("all-day", 0), "{d:?}");
}

support::for_every_store!(
    an_allowed_decision_reports_the_enforced_limit_not_a_shadow,
    denied_by_one_limit_spends_in_none,
    concurrent_requests_never_pass_any_limit,
    a_cost_above_a_shadow_limit_only_reports_a_denial,
);

/// An axum app with `/`, `/search` (cost 2) and `/export` (cost 10).
fn app() -> Router {
    let ok = || get(|| async { "ok" });
    Router::new()
        .route("/", ok())
        .route("/search", ok())
        .route("/export", ok())
}

fn cost(p: &Parts) -> u64 {
    match p.uri.path() {
        "/search" => 2,
        "/export" => 10,
        _ => 1,
    }
}

#[tokio::test]
async fn http_reports_every_policy_the_binding_limit_and_the_longest_wait() {
    let b = Backend::redis().await;
    let limiter = b
        .builder("1/5s")
        .name("per-key")
        .limit("global", "3/1m".parse().unwrap())
        // The store's own answers: a cached denial of `a` (by per-key) would
        // repeat its shorter wait after the global limit ran out too.
        .deny_cache(0)
        .build()
        .unwrap();
    let layer = RateLimitLayer::each(limiter, (Header::new("x-api-key"), Global)).cost(cost);
    let url = spawn_axum(app().layer(layer), true).await;
    let (a, c) = (Caller::with_key(Some("a")), Caller::with_key(Some("c")));
    let policy = r#""per-key";q=1;w=5, "global";q=3;w=60"#;

    let res = a.get(&url).await.expect(200, &log(&b));
    assert_eq!(res.header("ratelimit-policy"), Some(policy));
    assert!(
        res.header("ratelimit")
            .unwrap()
            .starts_with(r#""per-key";r=0;"#),
        "{res:?}"
    );
    // Denied by per-key alone: its wait, not the global window's.
    let res = a.get(&url).await.expect(429, &log(&b));
    assert!(
        res.header("ratelimit")
            .unwrap()
            .starts_with(r#""per-key";r=0;"#),
        "{res:?}"
    );
    assert!((4..=5).contains(&res.int("retry-after")), "{res:?}");
    assert_eq!(res.int("retry-after"), res.ratelimit("t"), "{res:?}");
    let d = Caller::with_key(Some("d"));
    let res = d.get(&url).await.expect(200, &log(&b));
    assert!(
        res.header("ratelimit")
            .unwrap()
            .starts_with(r#""per-key";r=0;"#),
        "{res:?}"
    );
    // Both at 0: the one that takes longer to recover binds. Then both deny
    // `a`, and the longest wait wins.
    let res = c.get(&url).await.expect(200, &log(&b));
    assert!(
        res.header("ratelimit")
            .unwrap()
            .starts_with(r#""global";r=0;"#),
        "{res:?}"
    );
    let res = a.get(&url).await.expect(429, &log(&b));
    assert!(
        res.header("ratelimit")
            .unwrap()
            .starts_with(r#""global";r=0;"#),
        "{res:?}"
    );
    assert!((55..=60).contains(&res.int("retry-after")), "{res:?}");
    // A cost above every capacity: refused at once, with nothing to wait for.
    let res = Caller::with_key(Some("e"))
        .get(&format!("{url}/export"))
        .await;
    let res = res.expect(429, &log(&b));
    assert!(!res.has_ratelimit_headers(), "{res:?}");
    b.server().unwrap().assert_every_key_has_ttl().await;
}

#[tokio::test]
async fn http_costs_are_spent_exactly() {
    let b = Backend::redis().await;
    let layer = RateLimitLayer::new(b.limiter("5/1m"), Header::new("x-api-key")).cost(cost);
    let url = spawn_axum(app().layer(layer), true).await;
    let caller = Caller::with_key(Some("k"));
    let search = format!("{url}/search");
    for (path, status, r) in [
        (&search, 200, 3),
        (&search, 200, 1),
        (&search, 429, 1),
        (&url, 200, 0),
    ] {
        let res = caller.get(path).await.expect(status, &log(&b));
        assert_eq!(res.ratelimit("r"), r, "{res:?}");
    }
}

#[tokio::test]
async fn http_gcra_retry_after_is_what_the_next_request_experiences() {
    let b = Backend::redis().await;
    let quota = Quota::per_second(1).gcra(2).unwrap();
    let limiter = b.builder_for(quota).build().unwrap();
    let layer = RateLimitLayer::new(limiter, Header::new("x-api-key"));
    let url = spawn_axum(app().layer(layer), true).await;
    let caller = Caller::with_key(Some("k"));
    assert_eq!(caller.statuses(&url, 2).await, [200, 200]);
    let res = caller.get(&url).await.expect(429, &log(&b));
    assert_eq!(
        (res.int("retry-after"), res.ratelimit("t")),
        (1, 1),
        "{res:?}"
    );
    // Waiting exactly what the server advertised is the point of the test.
    tokio::time::sleep(Duration::from_secs(res.int("retry-after"))).await;
    let res = caller.get(&url).await.expect(200, &log(&b));
    assert_eq!(res.ratelimit("r"), 0, "{res:?}");
    let res = caller.get(&url).await.expect(429, &log(&b));
    assert_eq!(res.int("retry-after"), 1, "{res:?}");
}

#[test]
#[should_panic(expected = "2 extractors for a limiter with 1 limits")]
fn each_needs_one_extractor_per_limit() {
    let limiter = Limiter::new(Quota::per_second(1));
    let _ = RateLimitLayer::each(limiter, (Header::new("x-api-key"), Global));
}

/// An extractor built apart from `each` (`key::each`, or a custom one's
/// `key_count`) is checked as well, when the layer is built: not a 500 on
/// every request.
#[test]
#[should_panic(expected = "gives 2 keys per request, and limiter \"default\" has 3 limits")]
fn new_refuses_an_extractor_that_fits_no_limit() {
    let limiter = Limiter::builder(Quota::per_second(1))
        .limit("b", Quota::per_minute(10))
        .limit("c", Quota::per_hour(100))
        .build()
        .unwrap();
    let _ = RateLimitLayer::new(limiter, key::each((Header::new("x-api-key"), Global)));
}

/// `Store::decide` is public and takes any checks: one listing the same
/// fixed-window key twice, denied by the second (its spend passes the
/// limit), leaves the key as it was, with no counter left behind. Fails
/// with the spends undone in order: the first undo deleted the counter it
/// had created, the second's `DECRBY` made one of -1 with no TTL, on the
/// fast path (fixed windows only) and on the general script (a sliding
/// window beside them) alike.
#[tokio::test]
async fn a_key_listed_twice_in_one_decision_leaves_no_counter_without_ttl() {
    use redis_ratelimit::{Store, store::LimitCheck};
    let server = support::RedisServer::start();
    let store = server.store().await;
    let check = |key: &str, quota: Quota| LimitCheck {
        key: key.into(),
        quota,
        shadow: false,
    };
    let fixed = Quota::per_hour(1);
    let sliding = Quota::per_hour(5).sliding_window();
    let cases = [
        vec![check("fast", fixed), check("fast", fixed)],
        vec![
            check("general", fixed),
            check("sliding", sliding),
            check("general", fixed),
        ],
    ];
    for checks in cases {
        let key = checks[0].key.clone();
        let states = store.decide(checks, 1).await.unwrap();
        assert!(states[0].allowed && !states.last().unwrap().allowed);
        let mut conn = server.conn().await;
        let left: Option<i64> = conn.get(&key).await.unwrap();
        assert_eq!(left, None, "{key}: a counter left behind\n{}", server.log());
    }
    server.assert_every_key_has_ttl().await;
}
