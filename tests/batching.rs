//! Concurrent decisions on one `ConnectionManager` share script calls, and
//! each is still decided on its own, exactly.

mod support;

use futures_util::future::join_all;
use redis_ratelimit::Limiter;
use support::RedisServer;

/// A limiter on `server` with `quota`, warmed up (the script loaded, the
/// connection up), and the script calls made so far.
async fn warmed(server: &RedisServer, quota: &str) -> (Limiter, u64) {
    let limiter = server.limiter(quota).await;
    assert!(limiter.check("warm", 1).await.unwrap().is_allowed());
    (limiter, server.script_calls().await)
}

#[tokio::test]
async fn concurrent_decisions_share_script_calls_and_stay_exact() {
    let server = RedisServer::start();
    let (limiter, before) = warmed(&server, "30/1m").await;

    let keys = ["a", "b", "c", "d"];
    let checks = (0..400).map(|i| limiter.check(keys[i % 4], 1));
    let decisions = join_all(checks).await;
    let calls = server.script_calls().await - before;

    for (k, key) in keys.iter().enumerate() {
        let mine = decisions.iter().skip(k).step_by(4);
        let allowed = mine.filter(|d| d.as_ref().unwrap().is_allowed()).count();
        assert_eq!(allowed, 30, "{key}: each request is decided on its own");
    }
    // Denials of a key over its limit come from the deny cache once known,
    // and the rest share calls: far fewer calls than decisions.
    assert!(calls >= 1, "no script call at all?");
    assert!(
        calls < 100,
        "{calls} script calls for 400 concurrent decisions"
    );
    server.assert_every_key_has_ttl().await;
}

/// A batch mixes requests unlike each other (costs, limiters, one limit or
/// two): the fast path sends alike neighbours as one run and the rest as
/// runs of their own, and every request is still decided exactly.
#[tokio::test]
async fn batches_of_unlike_requests_stay_exact() {
    let server = RedisServer::start();
    let store = server.store().await;
    let build = |quota: &str, name: &str| {
        redis_ratelimit::Limiter::builder(quota.parse().unwrap())
            .name(name)
            .store(store.clone())
            .deny_cache(0)
    };
    let a = build("30/1m", "a").build().unwrap();
    let b = build("10/1m", "b").build().unwrap();
    let both = build("12/1m", "both")
        .limit("wide", "1000/1m".parse().unwrap())
        .build()
        .unwrap();
    assert!(a.check("warm", 1).await.unwrap().is_allowed());
    let before = server.script_calls().await;

    // Interleaved: cost 1 on a, cost 3 on a, cost 1 on b, a peek on a, two
    // limits: no two neighbours alike.
    let mut checks = Vec::new();
    for _ in 0..60 {
        checks.push(Box::pin(a.check("one", 1)) as futures_util::future::BoxFuture<'_, _>);
        checks.push(Box::pin(a.check("three", 3)));
        checks.push(Box::pin(b.check("b", 1)));
        checks.push(Box::pin(a.check("one", 0)));
        checks.push(Box::pin(both.check("two", 1)));
    }
    let decisions: Vec<_> = join_all(checks)
        .await
        .into_iter()
        .map(|d| d.unwrap().is_allowed())
        .collect();
    let calls = server.script_calls().await - before;
    let allowed = |k: usize| decisions.iter().skip(k).step_by(5).filter(|d| **d).count();
    assert_eq!(allowed(0), 30, "a, cost 1");
    assert_eq!(allowed(1), 10, "a, cost 3");
    assert_eq!(allowed(2), 10, "b");
    assert_eq!(
        allowed(3),
        60,
        "peeks look at a used-up counter: cost 0 fits"
    );
    assert_eq!(allowed(4), 12, "two limits");
    let mut conn = server.conn().await;
    for (key, count) in [
        (a.store_key("one"), 30),
        (a.store_key("three"), 30),
        (b.store_key("b"), 10),
    ] {
        let got: i64 = redis::AsyncCommands::get(&mut conn, &key).await.unwrap();
        assert_eq!(got, count, "{key}");
    }
    for (key, count) in both.store_keys("two").into_iter().zip([12, 12]) {
        let got: i64 = redis::AsyncCommands::get(&mut conn, &key).await.unwrap();
        assert_eq!(got, count, "{key}");
    }
    assert!(
        calls < 150,
        "{calls} script calls for 300 concurrent decisions"
    );
    server.assert_every_key_has_ttl().await;
}

/// Requests queued faster than calls go out are sent in calls of at most
/// 64 each (`MAX_BATCH`): all 600 here are queued before the first call
/// leaves (one task polls them all first), so the calls are exactly
/// 600 / 64 rounded up, whatever the timing.
#[tokio::test]
async fn a_queue_goes_out_in_calls_of_at_most_64_requests() {
    let server = RedisServer::start();
    let (limiter, before) = warmed(&server, "100/1m").await;

    let keys: Vec<String> = (0..10).map(|k| format!("k{k}")).collect();
    let checks = (0..600).map(|i| limiter.check(&keys[i % 10], 1));
    let decisions = join_all(checks).await;
    let calls = server.script_calls().await - before;

    assert_eq!(calls, 10, "600 queued requests in calls of 64");
    for (k, key) in keys.iter().enumerate() {
        let mine = decisions.iter().skip(k).step_by(10);
        let allowed = mine.filter(|d| d.as_ref().unwrap().is_allowed()).count();
        assert_eq!(allowed, 60, "{key}: each request is decided on its own");
    }
    server.assert_every_key_has_ttl().await;
}
