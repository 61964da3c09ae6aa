//! Resilience: the circuit breaker with Redis killed or frozen, and the local
//! deny cache (no Redis command for a key known to be over its limit).

mod support;

use std::time::{Duration, Instant};

use http::StatusCode;
use redis_ratelimit::{
    Breaker, Error, Limiter, OnStoreError,
    concurrency::{Acquired, ConcurrencyLimiter},
};
use support::{
    RedisServer,
    http::Caller,
    inproc::{call, service},
    logs::Captured,
    scenarios::by_key,
    servers::{app, spawn_axum},
};

/// Opens after 3 failures, probes after 500 ms.
fn breaker() -> Breaker {
    Breaker::new()
        .failures(3)
        .cooldown(Duration::from_millis(500))
}

fn breaker_limiter(store: redis_ratelimit::RedisStore) -> Limiter {
    Limiter::builder("1000/1m".parse().unwrap())
        .store(store)
        .timeout(Duration::from_millis(200))
        .breaker(breaker())
        .build()
        .unwrap()
}

/// With Redis down the breaker opens after 3 failures; then 1000 requests
/// per policy are answered at once (allow: 200, deny: 503) without a store
/// call; after Redis is back, limiting resumes within seconds. The opening
/// and the closing are each logged once (the closing was not logged).
async fn breaker_scenario(frozen: bool) {
    let captured = Captured::default();
    let _logs = captured.install_at(tracing::Level::INFO);
    let mut server = RedisServer::start();
    let limiter = breaker_limiter(server.store().await);
    let (allow, deny) = (
        service(&limiter, OnStoreError::Allow),
        service(&limiter, OnStoreError::Deny),
    );
    let res = call(&allow).await;
    assert!(res.headers().contains_key("ratelimit"), "{res:?}");

    if frozen {
        server.freeze(true);
    } else {
        server.kill();
    }
    for _ in 0..3 {
        let res = call(&allow).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert!(!res.headers().contains_key("ratelimit"), "{res:?}");
    }
    let err = limiter.check("any", 1).await.unwrap_err();
    assert!(matches!(err, Error::CircuitOpen), "breaker not open: {err}");

    let started = Instant::now();
    for (svc, status) in [(&allow, 200), (&deny, 503)] {
        for _ in 0..1000 {
            assert_eq!(call(svc).await.status().as_u16(), status);
        }
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "2000 requests took {took:?}");

    if frozen {
        server.freeze(false);
    } else {
        server.restart();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let res = call(&allow).await;
        if res.headers().contains_key("ratelimit") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not limiting 5 s after recovery\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(limiter.check("any", 1).await.is_ok());
    let opened = captured.lines_at("WARN");
    let opened: Vec<_> = opened
        .iter()
        .filter(|l| l.contains("breaker open;"))
        .collect();
    assert_eq!(opened.len(), 1, "{opened:?}");
    let closed = captured.lines_at("INFO");
    let closed: Vec<_> = closed
        .iter()
        .filter(|l| l.contains("breaker closed"))
        .collect();
    assert_eq!(closed.len(), 1, "{closed:?}");
}

#[tokio::test]
async fn breaker_opens_when_redis_is_killed_and_closes_after_restart() {
    breaker_scenario(false).await;
}

#[tokio::test]
async fn breaker_opens_when_redis_hangs_so_nobody_waits_for_timeouts() {
    breaker_scenario(true).await;
}

#[tokio::test]
async fn a_key_over_its_limit_is_denied_without_a_redis_command() {
    let server = RedisServer::start();
    let cached = server.limiter("3/1m").await;
    let uncached = Limiter::builder("3/1m".parse().unwrap())
        .store(server.store().await)
        .deny_cache(0)
        .build()
        .unwrap();
    for _ in 0..3 {
        assert!(cached.check("k", 1).await.unwrap().is_allowed());
    }
    assert!(!cached.check("k", 1).await.unwrap().is_allowed());

    server.reset_stats().await;
    for _ in 0..50 {
        let local = cached.check("k", 1).await.unwrap();
        assert!(!local.is_allowed());
        assert!(!cached.check("k", 3).await.unwrap().is_allowed());
    }
    assert_eq!(server.script_calls().await, 0, "denials went to Redis");

    // The same answer Redis gives.
    let local = cached.check("k", 1).await.unwrap();
    let redis = uncached.check("k", 1).await.unwrap();
    assert_eq!(
        (
            local.is_allowed(),
            local.remaining(),
            local.policy(),
            local.limit()
        ),
        (
            redis.is_allowed(),
            redis.remaining(),
            redis.policy(),
            redis.limit()
        )
    );
    let gap = local
        .retry_after()
        .unwrap()
        .abs_diff(redis.retry_after().unwrap());
    assert!(gap <= Duration::from_millis(50), "{local:?}\n{redis:?}");

    // A peek (cost 0) and other keys still ask Redis.
    server.reset_stats().await;
    assert!(cached.check("k", 0).await.unwrap().is_allowed());
    assert!(cached.check("other", 1).await.unwrap().is_allowed());
    assert_eq!(server.script_calls().await, 2);
    server.assert_every_key_has_ttl().await;
}

#[tokio::test]
async fn over_http_a_cached_denial_has_the_status_and_headers_redis_would_give() {
    let server = RedisServer::start();
    let layer = |cache| {
        let store = server.store();
        async move {
            let builder = Limiter::builder("2/1m".parse().unwrap()).store(store.await);
            by_key(builder.deny_cache(cache).build().unwrap())
        }
    };
    let cached = spawn_axum(app().layer(layer(100).await), true).await;
    let uncached = spawn_axum(app().layer(layer(0).await), true).await;
    let caller = Caller::with_key(Some("k"));
    assert_eq!(caller.statuses(&cached, 3).await, [200, 200, 429]);

    server.reset_stats().await;
    let local = caller.get(&cached).await.expect(429, &server.log());
    let redis = caller.get(&uncached).await.expect(429, &server.log());
    assert_eq!(
        server.script_calls().await,
        1,
        "only the uncached server asked"
    );
    let context = format!("{local:?}\n{redis:?}");
    assert_eq!(
        local.header("ratelimit-policy"),
        redis.header("ratelimit-policy"),
        "{context}"
    );
    assert_eq!(local.ratelimit("r"), redis.ratelimit("r"), "{context}");
    // Whole seconds, rounded up: equal unless a second boundary fell between.
    assert!(
        local.ratelimit("t").abs_diff(redis.ratelimit("t")) <= 1,
        "{context}"
    );
    assert!(
        local.int("retry-after").abs_diff(redis.int("retry-after")) <= 1,
        "{context}"
    );
    assert_eq!(local.body, redis.body);
}

/// The concurrency limiter has a breaker too: with Redis frozen, after 3
/// acquires that timed out, acquires fail at once (`CircuitOpen`) instead
/// of each waiting for the timeout; once Redis thaws, acquires are granted
/// again within seconds, and no key is left without a TTL.
#[tokio::test]
async fn the_concurrency_breaker_opens_when_redis_hangs_and_closes_after() {
    let server = RedisServer::start();
    let limiter = ConcurrencyLimiter::builder(2)
        .store(server.store().await)
        .timeout(Duration::from_millis(200))
        .breaker(breaker())
        .build()
        .unwrap();
    let held = limiter.acquire("k").await.unwrap();
    assert!(held.is_acquired(), "{held:?}\n{}", server.log());

    server.freeze(true);
    for _ in 0..3 {
        let err = limiter.acquire("k").await.unwrap_err();
        assert!(matches!(err, Error::Timeout(_)), "{err}");
    }
    let started = Instant::now();
    for _ in 0..1000 {
        let err = limiter.acquire("k").await.unwrap_err();
        assert!(matches!(err, Error::CircuitOpen), "breaker not open: {err}");
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "1000 acquires took {took:?}");

    server.freeze(false);
    leased_again(&limiter, &server).await;
    drop(held);
    server.assert_every_key_has_ttl().await;
}

/// One failed call is one failure of the store, however many requests it
/// carried: 20 checks queued on a frozen Redis, whose connection is then
/// reset (the server killed and started again), fail together, and the
/// breaker stays closed: the next checks go to Redis. Before, each of the
/// 20 requests counted as a failure of its own, and one blip opened the
/// breaker for a whole cooldown (here 30 s), every request on the
/// store-error policy meanwhile.
#[tokio::test]
async fn one_failed_call_of_many_requests_does_not_open_the_breaker() {
    let mut server = RedisServer::start();
    let limiter = Limiter::builder("1000/1m".parse().unwrap())
        .store(server.store().await)
        .timeout(Duration::from_secs(2))
        .breaker(
            Breaker::new()
                .failures(10)
                .cooldown(Duration::from_secs(30)),
        )
        .build()
        .unwrap();
    assert!(limiter.check("warm", 1).await.unwrap().is_allowed());
    server.freeze(true);
    let checks: Vec<_> = (0..20)
        .map(|i| {
            let l = limiter.clone();
            tokio::spawn(async move { l.check(&format!("k{i}"), 1).await })
        })
        .collect();
    // Sent, and held by the frozen server.
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.kill();
    for check in checks {
        let result = check.await.unwrap();
        assert!(
            matches!(result, Err(Error::Redis(_))),
            "a failed call's request: {result:?}"
        );
    }
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match limiter.check("after", 1).await {
            Ok(d) => {
                assert!(d.is_allowed());
                break;
            }
            Err(Error::CircuitOpen) => panic!("one failed call opened the breaker"),
            Err(e) => assert!(Instant::now() < deadline, "Redis not back: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A check its caller gives up on before the limiter's timeout (a timeout
/// layer outside the limit, a `grpc-timeout`, a client that hangs up) still
/// counts for the breaker once its call times out. With Redis frozen and
/// every check given up at 50 ms, below the limiter's 300 ms, the breaker
/// opens and the checks after it fail at once (`CircuitOpen`). Before, a
/// dropped check freed its pass uncounted, the breaker never opened, and
/// every request waited until its caller's deadline.
#[tokio::test]
async fn checks_their_callers_give_up_on_still_open_the_breaker() {
    let server = RedisServer::start();
    let limiter = Limiter::builder("1000/1m".parse().unwrap())
        .store(server.store().await)
        .timeout(Duration::from_millis(300))
        .breaker(Breaker::new().failures(3).cooldown(Duration::from_secs(30)))
        .build()
        .unwrap();
    assert!(limiter.check("warm", 1).await.unwrap().is_allowed());
    server.freeze(true);
    let give_up = Duration::from_millis(50);
    for i in 0..4 {
        let given_up = tokio::time::timeout(give_up, limiter.check(&format!("k{i}"), 1)).await;
        assert!(
            given_up.is_err(),
            "answered on a frozen Redis: {given_up:?}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match tokio::time::timeout(give_up, limiter.check("after", 1)).await {
            Ok(Err(Error::CircuitOpen)) => break,
            other => assert!(
                Instant::now() < deadline,
                "breaker not open 5 s after the first check was given up: {other:?}"
            ),
        }
    }
    server.freeze(false);
    assert!(
        tokio::time::timeout(Duration::from_secs(1), limiter.check("open", 1))
            .await
            .is_ok_and(|r| matches!(r, Err(Error::CircuitOpen))),
        "the breaker's cooldown is 30 s"
    );
}

/// Peeks until the breaker lets one through (its cooldown over, 5 s at
/// most), and returns that peek's answer: the breaker's probe.
async fn first_peek_past_the_breaker(
    limiter: &Limiter,
) -> Result<redis_ratelimit::Decision, Error> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match limiter.peek("k", 1).await {
            Err(Error::CircuitOpen) => {
                assert!(Instant::now() < deadline, "the breaker never probed");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            other => return other,
        }
    }
}

/// A peek takes the breaker's pass as a check does: refused at once while
/// the breaker is open, and the one probe once its cooldown ends. A probe
/// peek that fails opens it for another cooldown (the check after it is
/// refused at once, not a probe of its own); one that succeeds closes it,
/// so the breaker takes its three failures to open again (not one, as a
/// half-open breaker's probe would).
#[tokio::test]
async fn a_peek_is_the_breakers_probe_as_a_check_is() {
    let server = RedisServer::start();
    let limiter = breaker_limiter(server.store().await);
    assert!(limiter.check("warm", 1).await.unwrap().is_allowed());
    server.freeze(true);
    for _ in 0..3 {
        let r = limiter.check("k", 1).await;
        assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
    }
    let r = limiter.peek("k", 1).await;
    assert!(
        matches!(r, Err(Error::CircuitOpen)),
        "an open breaker let a peek through: {r:?}"
    );

    let probe = first_peek_past_the_breaker(&limiter).await;
    assert!(matches!(probe, Err(Error::Timeout(_))), "{probe:?}");
    let r = limiter.check("k", 1).await;
    assert!(
        matches!(r, Err(Error::CircuitOpen)),
        "a failed probe peek left it closed: {r:?}"
    );

    server.freeze(false);
    let probe = first_peek_past_the_breaker(&limiter).await;
    assert!(probe.is_ok_and(|d| d.is_allowed()));
    server.freeze(true);
    for i in 0..3 {
        let r = limiter.check("k", 1).await;
        assert!(
            matches!(r, Err(Error::Timeout(_))),
            "failure {i} after a probe peek: {r:?}"
        );
    }
    let r = limiter.check("k", 1).await;
    assert!(matches!(r, Err(Error::CircuitOpen)), "{r:?}");
    server.freeze(false);
}

/// The same for the concurrency limiter: acquires given up at 50 ms on a
/// frozen Redis, below the limiter's 300 ms, still count for its breaker
/// once their calls time out, so it opens; once Redis thaws and the
/// cooldown passes, leases are granted again and no key is left without a
/// TTL (the given-up acquires' tokens are released in the background).
#[tokio::test]
async fn acquires_their_callers_give_up_on_still_open_the_concurrency_breaker() {
    let server = RedisServer::start();
    let limiter = ConcurrencyLimiter::builder(2)
        .store(server.store().await)
        .timeout(Duration::from_millis(300))
        .breaker(breaker())
        .build()
        .unwrap();
    assert!(limiter.acquire("warm").await.unwrap().is_acquired());
    server.freeze(true);
    let give_up = Duration::from_millis(50);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match tokio::time::timeout(give_up, limiter.acquire("k")).await {
            Ok(Err(Error::CircuitOpen)) => break,
            other => assert!(
                Instant::now() < deadline,
                "breaker not open 5 s after the first acquire was given up: {other:?}"
            ),
        }
    }
    server.freeze(false);
    leased_again(&limiter, &server).await;
    server.assert_every_key_has_ttl().await;
}

/// A probe acquire its caller gives up on, whose runtime then ends before
/// the acquire is due, gives its probe back: the breaker probes again, and
/// closes once Redis answers. Before, the task that awaited the abandoned
/// probe was dropped with its runtime holding the breaker's pass, the
/// probe slot stayed taken, and every acquire after was `CircuitOpen` for
/// the life of the process.
#[test]
fn a_given_up_probe_whose_runtime_ends_gives_its_probe_back() {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let main = runtime();
    let server = RedisServer::start();
    let limiter = main.block_on(async {
        ConcurrencyLimiter::builder(4)
            .store(server.store().await)
            .timeout(Duration::from_millis(200))
            .breaker(
                Breaker::new()
                    .failures(1)
                    .cooldown(Duration::from_millis(100)),
            )
            .build()
            .unwrap()
    });
    server.freeze(true);
    let err = main.block_on(limiter.acquire("k")).unwrap_err();
    assert!(matches!(err, Error::Timeout(_)), "{err}");
    std::thread::sleep(Duration::from_millis(150));
    {
        let other = runtime();
        let given_up = other.block_on(async {
            tokio::time::timeout(Duration::from_millis(10), limiter.acquire("k")).await
        });
        assert!(
            given_up.is_err(),
            "answered on a frozen Redis: {given_up:?}"
        );
    }
    server.freeze(false);
    main.block_on(leased_again(&limiter, &server));
}

/// Waits up to 5 s for `limiter` to grant a lease of `k` again, once
/// `server` has thawed.
async fn leased_again(limiter: &ConcurrencyLimiter, server: &RedisServer) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match limiter.acquire("k").await {
            Ok(Acquired::Lease(_)) => return,
            other => assert!(
                Instant::now() < deadline,
                "no lease 5 s after Redis thawed: {other:?}\n{}",
                server.log()
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
