//! Redis misbehaving under the limiter: scripts flushed, the server killed,
//! restarted, or frozen. Every answer comes within the limiter's timeout, and
//! limiting resumes by itself.

mod support;

use std::time::{Duration, Instant};

use redis_ratelimit::{Breaker, ConfigError, Error, Limiter, RedisStore};
use support::RedisServer;

const TIMEOUT: Duration = Duration::from_millis(200);

async fn limiter(server: &RedisServer, quota: &str) -> Limiter {
    Limiter::builder(quota.parse().unwrap())
        .store(server.store().await)
        .timeout(TIMEOUT)
        .build()
        .unwrap()
}

/// Waits, with a deadline, until the limiter answers again after an outage.
async fn until_answered(limiter: &Limiter, key: &str, server: &RedisServer) -> Duration {
    let start = Instant::now();
    loop {
        if limiter.check(key, 1).await.is_ok() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "limiter never recovered\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn script_flush_between_requests_is_invisible() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let limiter = limiter(&server, "3/1m").await;
    for remaining in [2, 1, 0] {
        assert_eq!(limiter.check("k", 1).await.unwrap().remaining(), remaining);
        let flush = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .exec_async(&mut conn)
            .await;
        flush.unwrap();
    }
    assert!(!limiter.check("k", 1).await.unwrap().is_allowed());
}

#[tokio::test]
async fn redis_killed_mid_test_errors_within_the_timeout_then_recovers_after_restart() {
    let mut server = RedisServer::start();
    let limiter = limiter(&server, "2/1m").await;
    assert!(limiter.check("k", 1).await.unwrap().is_allowed());

    server.kill();
    for _ in 0..20 {
        let start = Instant::now();
        let r = limiter.check("k", 1).await;
        assert!(r.is_err(), "answered with Redis dead: {r:?}");
        assert!(
            start.elapsed() < TIMEOUT + Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
    }

    // Same port, empty dataset, no scripts loaded: NOSCRIPT is handled, and
    // the same limiter (no rebuild) decides again.
    server.restart();
    let took = until_answered(&limiter, "k", &server).await;
    assert!(took < Duration::from_secs(10), "{took:?}");
    let d = limiter.check("k", 1).await.unwrap();
    assert!(d.is_allowed() && d.remaining() == 0, "{d:?}");
    assert!(!limiter.check("k", 1).await.unwrap().is_allowed());
    server.assert_every_key_has_ttl().await;
}

#[tokio::test]
async fn frozen_redis_times_out_instead_of_hanging() {
    let server = RedisServer::start();
    let limiter = limiter(&server, "5/1m").await;
    assert!(limiter.check("k", 1).await.unwrap().is_allowed());

    server.freeze(true);
    let start = Instant::now();
    let checks = futures_util::future::join_all((0..50).map(|_| limiter.check("k", 1)));
    // A guard, so that a lost timeout fails here rather than hanging.
    let results = tokio::time::timeout(TIMEOUT * 10, checks)
        .await
        .expect("checks still waiting at 10 times the timeout");
    let took = start.elapsed();
    server.freeze(false);
    for r in &results {
        assert!(
            matches!(r, Err(Error::Timeout(t)) if *t == TIMEOUT),
            "{r:?}"
        );
    }
    assert!(
        took < TIMEOUT + Duration::from_millis(500),
        "50 checks took {took:?}"
    );

    // Thawed: it answers again, and the count is intact (timed-out calls may
    // have been applied, so at most 5 - 1 remain).
    until_answered(&limiter, "other", &server).await;
    let d = limiter.check("k", 0).await.unwrap();
    assert!(d.remaining() <= 4, "{d:?}");
    server.assert_every_key_has_ttl().await;
}

/// Limiters sharing one store share its batching task; each request still
/// gets its own limiter's timeout. A short-timeout check queued behind calls
/// of a long-timeout limiter, on a frozen Redis, is answered at its own
/// deadline, not when those calls give up: whether a request with the short
/// timeout came before (the task sweeps its queue that often) or this is
/// the first (it wakes the task).
#[tokio::test]
async fn a_short_timeout_is_kept_behind_a_long_timeouts_calls() {
    short_behind_long(true).await;
}

#[tokio::test]
async fn a_first_short_timeout_is_kept_behind_a_long_timeouts_calls() {
    short_behind_long(false).await;
}

/// Two limiters on one store of `server`'s: a roomy one whose checks wait
/// `long`, and "quick", of 5 a minute, whose checks wait [`TIMEOUT`].
async fn slow_and_quick(server: &RedisServer, long: Duration) -> (Limiter, Limiter) {
    let store = server.store().await;
    let slow = Limiter::builder("1000/1m".parse().unwrap())
        .store(store.clone())
        .timeout(long)
        .build()
        .unwrap();
    let quick = Limiter::builder("5/1m".parse().unwrap())
        .name("quick")
        .store(store)
        .timeout(TIMEOUT)
        .build()
        .unwrap();
    (slow, quick)
}

/// A check of `key` on `quick` (see [`slow_and_quick`]), Redis frozen:
/// answered `Error::Timeout` at its own deadline, give or take 300 ms; a
/// failure if it still waits after `wait`.
async fn quick_times_out_on_time(quick: &Limiter, key: &str, wait: Duration) {
    let start = Instant::now();
    let r = tokio::time::timeout(wait, quick.check(key, 1))
        .await
        .unwrap_or_else(|_| panic!("the quick check still waiting after {wait:?}"));
    let took = start.elapsed();
    assert!(matches!(r, Err(Error::Timeout(t)) if t == TIMEOUT), "{r:?}");
    assert!(
        took < TIMEOUT + Duration::from_millis(300),
        "the quick check took {took:?}"
    );
}

async fn short_behind_long(seen_before: bool) {
    let server = RedisServer::start();
    let long = Duration::from_millis(1500);
    let (slow, quick) = slow_and_quick(&server, long).await;
    let first = match seen_before {
        true => &quick,
        false => &slow,
    };
    assert!(first.check("k", 1).await.unwrap().is_allowed());

    server.freeze(true);
    // Enough to fill every call the task may have in flight (two, and six
    // more once they are full enough: eight of 64), and more.
    let waiting: Vec<_> = (0..600)
        .map(|i| {
            let slow = slow.clone();
            tokio::spawn(async move { slow.check(&format!("s{i}"), 1).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    quick_times_out_on_time(&quick, "k", long * 2).await;
    let started = Instant::now();
    for task in waiting {
        let r = tokio::time::timeout(long * 2, task)
            .await
            .expect("a slow check still waiting at twice its timeout")
            .unwrap();
        assert!(matches!(r, Err(Error::Timeout(t)) if t == long), "{r:?}");
    }
    assert!(started.elapsed() < long + Duration::from_millis(500));
    server.freeze(false);
    until_answered(&quick, "other", &server).await;
    server.assert_every_key_has_ttl().await;
}

/// A lane of the batching task keeps one timer for all its calls. A call
/// whose deadline is nearer than the one its lane's timer was last armed
/// for (by calls of a long-timeout limiter, which Redis answered) still
/// times out at its own deadline, and so does the next.
#[tokio::test]
async fn a_call_times_out_at_its_own_deadline_after_longer_ones() {
    let server = RedisServer::start();
    let (slow, quick) = slow_and_quick(&server, Duration::from_secs(9)).await;
    // One at a time, so each goes to the first idle lane, and together, so
    // every lane has answered a call armed 9 s ahead.
    for i in 0..5 {
        assert!(slow.check(&format!("s{i}"), 1).await.unwrap().is_allowed());
    }
    let together = (0..64).map(|i| {
        let slow = slow.clone();
        async move { slow.check(&format!("t{i}"), 1).await }
    });
    for r in futures_util::future::join_all(together).await {
        assert!(r.unwrap().is_allowed());
    }
    server.freeze(true);
    for key in ["a", "b"] {
        quick_times_out_on_time(&quick, key, Duration::from_secs(5)).await;
    }
    server.freeze(false);
    until_answered(&quick, "other", &server).await;
}

/// A call that timed out may still be applied once Redis thaws, but how
/// much is bounded by what was sent before the breaker opened, not by how
/// long Redis stayed frozen (README, "When Redis fails"): requests that time
/// out while queued are never sent, and an open breaker sends only probes.
/// With the breaker off, the same freeze applies thousands.
#[tokio::test]
async fn a_long_freeze_applies_late_only_what_went_before_the_breaker_opened() {
    let applied = late_applied(Breaker::new()).await;
    // Eight calls of 64 out at once, a second such wave from requests
    // queued before the first timed out, and the probes.
    assert!(applied.late <= 2 * 8 * 64 + 10, "{applied:?}");
    assert!(applied.sent >= 3_000, "{applied:?}");
}

#[tokio::test]
async fn without_the_breaker_a_long_freeze_applies_what_went_throughout() {
    let applied = late_applied(Breaker::disabled()).await;
    assert!(applied.late > 2 * 8 * 64 + 10, "{applied:?}");
}

#[derive(Debug)]
struct Applied {
    /// Checks made while Redis was frozen, each of a key of its own.
    sent: usize,
    /// Those whose units Redis spent once it thawed.
    late: usize,
}

/// Freezes Redis for 3 s under 2,000 checks a second, each of a new key,
/// thaws it, and counts the keys it spent.
async fn late_applied(breaker: Breaker) -> Applied {
    let server = RedisServer::start();
    let limiter = Limiter::builder("1000/1m".parse().unwrap())
        .store(server.store().await)
        .timeout(TIMEOUT)
        .breaker(breaker)
        .build()
        .unwrap();
    assert!(limiter.check("warm", 1).await.unwrap().is_allowed());
    server.freeze(true);
    let start = Instant::now();
    let mut checks = Vec::new();
    while start.elapsed() < Duration::from_secs(3) {
        for _ in 0..20 {
            let (limiter, key) = (limiter.clone(), format!("late{}", checks.len()));
            checks.push(tokio::spawn(async move { limiter.check(&key, 1).await }));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let sent = checks.len();
    for check in checks {
        let r = check.await.unwrap();
        assert!(
            matches!(r, Err(Error::Timeout(_) | Error::CircuitOpen)),
            "{r:?}"
        );
    }
    server.freeze(false);
    until_answered(&limiter, "after", &server).await;
    // Redis works through what it was sent, in order, before the check above.
    let late = server
        .keys_with_ttl()
        .await
        .iter()
        .filter(|(key, _)| key.contains("late"))
        .count();
    server.assert_every_key_has_ttl().await;
    Applied { sent, late }
}

/// A timeout too long to add to the clock is refused when the limiter is
/// built, as is any of 10 s or more (a resent refund would outlive its
/// marker); the longest allowed still decides.
#[tokio::test]
async fn a_timeout_of_ten_seconds_or_more_is_refused_and_the_longest_allowed_decides() {
    let server = RedisServer::start();
    let store = server.store().await;
    let builder = || Limiter::builder("2/1m".parse().unwrap()).store(store.clone());
    for refused in [Duration::MAX, Duration::from_secs(10)] {
        let built = builder().timeout(refused).build();
        assert!(
            matches!(built, Err(ConfigError::TimeoutTooLong(t)) if t == refused),
            "{refused:?}: {built:?}"
        );
    }
    let limiter = builder()
        .timeout(Duration::from_secs(10) - Duration::from_millis(1))
        .build()
        .unwrap();
    assert_eq!(limiter.check("k", 1).await.unwrap().remaining(), 1);
    assert_eq!(limiter.check("k", 1).await.unwrap().remaining(), 0);
    assert!(!limiter.check("k", 1).await.unwrap().is_allowed());
    server.assert_every_key_has_ttl().await;
}

#[tokio::test]
async fn lazy_store_starts_while_redis_is_down() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill();
    let store = redis_ratelimit::RedisStore::connect_lazy(url.as_str()).unwrap();
    let limiter = Limiter::builder("1/1m".parse().unwrap())
        .store(store)
        .timeout(TIMEOUT)
        .build()
        .unwrap();
    let start = Instant::now();
    assert!(limiter.check("k", 1).await.is_err());
    assert!(start.elapsed() < TIMEOUT + Duration::from_millis(300));
    server.restart();
    until_answered(&limiter, "k", &server).await;
    assert!(!limiter.check("k", 1).await.unwrap().is_allowed());
}

/// The limiter's timeout, not redis-rs's default response timeout (500 ms),
/// bounds a call: a Redis that answers after 1.5 s is waited for under a 3 s
/// timeout.
#[tokio::test]
async fn the_limiter_timeout_is_the_only_bound() {
    let server = RedisServer::start();
    let limiter = Limiter::builder("3/1m".parse().unwrap())
        .store(server.store().await)
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    limiter.check("k", 1).await.unwrap();
    let mut pause = redis::cmd("CLIENT");
    pause.arg("PAUSE").arg(1500).arg("ALL");
    pause.exec_async(&mut server.conn().await).await.unwrap();
    let start = Instant::now();
    let d = limiter.check("k", 1).await;
    assert!(d.is_ok(), "{d:?} after {:?}", start.elapsed());
    assert!(
        start.elapsed() > Duration::from_millis(1000),
        "{:?}",
        start.elapsed()
    );
}

/// Fails without a new manager after a refused setup: redis-rs's
/// `ConnectionManager` keeps a connection whose login Redis refused, and
/// tries again only after an I/O error, so once Redis refused the password
/// at a reconnection (a restart whose `requirepass` or users are set a
/// little later) every check failed with "authentication failed" for good,
/// even once Redis took the password again: denied, or let through
/// unlimited, until the service restarted. Both the store that connects at
/// once and the lazy one recover now.
///
/// Over RESP3 the login is `HELLO`'s, whose refusal (`WRONGPASS`) redis-rs
/// passes on as Redis's own error, not as a failed authentication: fails
/// without that error counted as a refused setup (still refused after 10 s).
#[tokio::test]
async fn the_store_recovers_once_redis_takes_its_password_again() {
    recovers_once_redis_takes_its_password_again("").await;
}

#[tokio::test]
async fn over_resp3_the_store_recovers_once_redis_takes_its_password_again() {
    recovers_once_redis_takes_its_password_again("?protocol=resp3").await;
}

async fn recovers_once_redis_takes_its_password_again(options: &str) {
    let server = RedisServer::start_with(&["--requirepass", "a"]);
    let url = |password: &str| format!("redis://:{password}@127.0.0.1:{}/{options}", server.port());
    let mut admin = redis::Client::open(url("a"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut config = async |args: &[&str]| {
        let _: () = redis::cmd("CONFIG")
            .arg(args)
            .query_async(&mut admin)
            .await
            .unwrap();
    };
    let limiter = |store| {
        Limiter::builder("1000000/1m".parse().unwrap())
            .store(store)
            .timeout(support::TEST_TIMEOUT)
            .breaker(Breaker::disabled())
            .build()
            .unwrap()
    };
    let connected = limiter(RedisStore::connect(url("a")).await.unwrap());
    until_answered(&connected, "k", &server).await;
    // Its connection is dropped (the admin's too: it is not used again),
    // and Redis refuses the reconnections.
    config(&["SET", "requirepass", "b"]).await;
    let lazy = limiter(RedisStore::connect_lazy(url("a")).unwrap());
    let mut killer = redis::Client::open(url("b"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
        .query_async(&mut killer)
        .await
        .unwrap();
    // The first call after the kill meets the dropped connection; the
    // manager's reconnections are then refused. A call answers with the
    // refusal only once the manager has given up trying (its calls await
    // the reconnection), so no wait is needed after it.
    // RESP2's refused `AUTH`, or RESP3's `HELLO` refused.
    let refusal = |e: &redis_ratelimit::Error| {
        let e = e.to_string();
        e.contains("authentication") || e.contains("WRONGPASS")
    };
    for (name, limiter) in [("connect", &connected), ("connect_lazy", &lazy)] {
        let until = Instant::now() + Duration::from_secs(10);
        let refused = loop {
            let e = limiter.check("k", 1).await.unwrap_err();
            if refusal(&e) || Instant::now() > until {
                break e;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(refusal(&refused), "{name}: {refused}");
    }
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "a"])
        .query_async(&mut killer)
        .await
        .unwrap();
    for (name, limiter) in [("connect", &connected), ("connect_lazy", &lazy)] {
        eprintln!("{name}: {:?}", until_answered(limiter, "k", &server).await);
    }
}
