//! `LimiterBuilder::local_reservation`: a hot key's units reserved in one
//! atomic call and spent in process. Never over-admits across instances,
//! under-admits by at most n per instance per window, refills a busy key
//! ahead, one script call per about 3n/4 requests, one reserve call per key
//! at a time, no unit used after its window, and a failing Redis follows the
//! store-error path.

mod support;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures_util::future::join_all;
use redis_ratelimit::{
    Breaker, ConfigError, Error, Limiter, MemoryStore, Quota, RedisStore,
    store::{BoxFuture, LimitCheck, LimitState, Reservation, Store},
};
use support::{RedisServer, TEST_TIMEOUT, slow_reserve::SlowReserve};
use tokio::sync::watch;

const KEY: &str = "all";

/// A limiter named "global" reserving `n` units at a time on `store`.
fn reserving(store: RedisStore, quota: &str, n: u64) -> Limiter {
    Limiter::builder(quota.parse().unwrap())
        .name("global")
        .store(store)
        .timeout(TEST_TIMEOUT)
        .local_reservation(n)
        .build()
        .unwrap()
}

/// As [`reserving`], unnamed, with a short timeout and no breaker: every
/// store call a frozen Redis gets is a timeout of its own.
fn exposed(store: RedisStore, quota: &str, n: u64) -> Limiter {
    Limiter::builder(quota.parse().unwrap())
        .store(store)
        .timeout(Duration::from_millis(300))
        .breaker(Breaker::disabled())
        .local_reservation(n)
        .build()
        .unwrap()
}

/// The Redis counter of the hot key (0 when absent).
async fn counter(server: &RedisServer, limiter: &Limiter) -> u64 {
    let value: Option<u64> = redis::cmd("GET")
        .arg(limiter.store_key(KEY))
        .query_async(&mut server.conn().await)
        .await
        .unwrap();
    value.unwrap_or(0)
}

/// Waits (up to 5 s) until the hot key's counter is `want`: a refill ahead
/// runs in the background.
async fn settled(server: &RedisServer, limiter: &Limiter, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = counter(server, limiter).await;
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "counter {got}, expected {want}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (up to 5 s) until Redis has run `want` script calls.
async fn wait_for_calls(server: &RedisServer, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = server.script_calls().await;
        if got == want {
            return;
        }
        assert!(
            got < want && Instant::now() < deadline,
            "{got} script calls, expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Admitted decisions' local window ends, from tasks hammering `limiter`
/// until `until`.
async fn hammer(limiter: Limiter, until: Instant) -> Vec<Instant> {
    let mut ends = Vec::new();
    while Instant::now() < until {
        let d = limiter.check(KEY, 1).await.unwrap();
        if d.is_allowed() {
            ends.push(Instant::now() + d.reset_after());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    ends
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_never_over_admit_a_window_and_under_admit_at_most_n_each() {
    let server = RedisServer::start();
    // Two instances: a ConnectionManager and a bb8 pool, each its own
    // connections.
    let a = reserving(server.store().await, "200/2s", 10);
    let b = reserving(server.pool_store(4).await, "200/2s", 10);
    let until = Instant::now() + Duration::from_millis(7_000);
    let tasks = (0..16).map(|i| {
        let l = if i % 2 == 0 { a.clone() } else { b.clone() };
        tokio::spawn(hammer(l, until))
    });
    let mut ends: Vec<Instant> = join_all(tasks)
        .await
        .into_iter()
        .flat_map(Result::unwrap)
        .collect();
    ends.sort();
    // One Redis window's admissions end within the reserve calls' latency
    // of each other; windows are 2 s apart.
    let mut windows: Vec<Vec<Instant>> = Vec::new();
    for end in ends {
        match windows.last_mut() {
            Some(w) if end - *w.last().unwrap() < Duration::from_millis(1_000) => w.push(end),
            _ => windows.push(vec![end]),
        }
    }
    let counts: Vec<usize> = windows.iter().map(Vec::len).collect();
    assert!(counts.len() >= 3, "{counts:?}");
    for (i, &count) in counts.iter().enumerate() {
        assert!(count <= 200, "window {i} admitted {count}: {counts:?}");
        // The last window may be cut short by the end of the run.
        if i + 1 < counts.len() {
            assert!(
                count >= 200 - 2 * 10, // each holds at most n
                "window {i} admitted {count}: {counts:?}"
            );
        }
    }
    server.assert_every_key_has_ttl().await;
}

#[tokio::test]
async fn one_long_window_admits_between_quota_minus_two_holdings_and_quota() {
    let server = RedisServer::start();
    let a = reserving(server.store().await, "200/60s", 10);
    let b = reserving(server.store().await, "200/60s", 10);
    let checks = (0..600).map(|i| {
        let l = if i % 2 == 0 { a.clone() } else { b.clone() };
        async move { l.check(KEY, 1).await.unwrap().is_allowed() }
    });
    let admitted = join_all(checks).await.into_iter().filter(|x| *x).count();
    // Each instance holds at most n units unspent.
    assert!((180..=200).contains(&admitted), "{admitted}");
    assert!(counter(&server, &a).await <= 200);
}

#[tokio::test]
async fn about_one_script_call_per_three_quarters_of_n_requests() {
    let server = RedisServer::start();
    let a = reserving(server.store().await, "10000/60s", 10);
    let b = reserving(server.store().await, "10000/60s", 10);
    server.reset_stats().await;
    // Sequential, so that the store's batching cannot merge calls.
    for i in 0..1_000 {
        let l = if i % 2 == 0 { &a } else { &b };
        assert!(l.check(KEY, 1).await.unwrap().is_allowed());
    }
    let calls = server.script_calls().await;
    // A refill tops a key holding fewer than 10 / 4 up to 10: 9 or more.
    assert!(calls <= 1_000 / 9 + 2, "{calls} script calls");
    // Whatever the two instances hold unspent: at most n each.
    let reserved = counter(&server, &a).await;
    assert!((1_000..=1_000 + 2 * 10).contains(&reserved), "{reserved}");
    server.assert_every_key_has_ttl().await;
}

/// A busy key is refilled ahead: the request that leaves fewer than n/4
/// units reserves, in the background, what tops it up to n, so that the
/// requests after it need no store call at all (here Redis is frozen once
/// the refill landed).
#[tokio::test]
async fn a_busy_key_is_refilled_before_it_runs_dry() {
    let server = RedisServer::start();
    let l = exposed(server.store().await, "1000/60s", 8);
    server.reset_stats().await;
    // 8 reserved, 7 spent: 1 left, under 8 / 4, so 7 more in the background.
    for _ in 0..7 {
        assert!(l.check(KEY, 1).await.unwrap().is_allowed());
    }
    settled(&server, &l, 15).await;
    assert_eq!(server.script_calls().await, 2);
    server.freeze(true);
    // The 8 units held are spent without Redis...
    for i in 0..8 {
        let d = l.check(KEY, 1).await;
        assert!(d.as_ref().is_ok_and(|d| d.is_allowed()), "unit {i}: {d:?}");
    }
    // ...and then the frozen Redis is asked.
    let after = l.check(KEY, 1).await;
    assert!(matches!(after, Err(Error::Timeout(_))), "{after:?}");
    server.freeze(false);
    assert!(counter(&server, &l).await <= 1000);
}

#[tokio::test]
async fn concurrent_first_requests_make_one_reserve_call() {
    let server = RedisServer::start();
    let l = reserving(server.store().await, "1000/60s", 100);
    server.reset_stats().await;
    let checks = (0..100).map(|_| l.check(KEY, 1));
    let decisions = join_all(checks).await;
    assert!(decisions.iter().all(|d| d.as_ref().unwrap().is_allowed()));
    assert_eq!(server.script_calls().await, 1);
    assert_eq!(counter(&server, &l).await, 100);
}

#[tokio::test]
async fn units_of_an_ended_window_are_not_used() {
    let server = RedisServer::start();
    let l = reserving(server.store().await, "100/1s", 10);
    let first = l.check(KEY, 1).await.unwrap();
    assert!(first.is_allowed());
    assert!(first.reset_after() <= Duration::from_secs(1));
    assert_eq!(counter(&server, &l).await, 10);
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    // Nine units are still held, from the window that ended: a new
    // reservation in a new window, not one of them.
    server.reset_stats().await;
    assert!(l.check(KEY, 1).await.unwrap().is_allowed());
    assert_eq!(server.script_calls().await, 1);
    assert_eq!(counter(&server, &l).await, 10);
}

#[tokio::test]
async fn a_frozen_redis_admits_only_units_already_reserved_and_never_after_their_window() {
    let server = RedisServer::start();
    let l = exposed(server.store().await, "100/2s", 10);
    assert!(l.check(KEY, 1).await.unwrap().is_allowed());
    server.freeze(true);
    // Units held: admitted without Redis, while their window lasts.
    for _ in 0..5 {
        assert!(l.check(KEY, 1).await.unwrap().is_allowed());
    }
    // A cost above what is held asks Redis, and waiters share its error:
    // one timeout for all of them, not one each in turn.
    let started = Instant::now();
    let results = join_all((0..20).map(|_| l.check(KEY, 5))).await;
    assert!(
        results.iter().all(|r| matches!(r, Err(Error::Timeout(_)))),
        "{results:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(1_500));
    // The window has ended: the four units still held are never used.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let after = l.check(KEY, 1).await;
    assert!(matches!(after, Err(Error::Timeout(_))), "{after:?}");
    // Its reserve call waits a whole timeout from being sent, a moment
    // after the check gave up: a check that joined it would share its
    // timeout. Redis thaws once it has given up.
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.freeze(false);
    assert!(l.check(KEY, 1).await.unwrap().is_allowed());
}

/// An instance never holds more than n units of a key: a refill tops it up
/// to n (not n more), a request that finds too little reserves what tops
/// the key up (or its cost, if more), and a refund that would pass n goes
/// to Redis instead of the reservation. The exception: the cost of a
/// request that goes away before its reserve call answers stays held, even
/// beyond n.
#[tokio::test]
async fn an_instance_never_holds_more_than_n_units() {
    let server = RedisServer::start();
    let l = exposed(server.store().await, "1000/60s", 8);
    let mut admitted = Vec::new();
    // 8 reserved, 7 spent: the refill tops the 1 left up to 8, with 7.
    for _ in 0..7 {
        admitted.push(l.check(KEY, 1).await.unwrap());
    }
    settled(&server, &l, 15).await;
    // Full: the refund goes to Redis.
    l.refund(KEY, &admitted[0]).await.unwrap();
    assert_eq!(counter(&server, &l).await, 14);
    // With room for it, a refund stays in process.
    let d = l.check(KEY, 1).await.unwrap();
    l.refund(KEY, &d).await.unwrap();
    assert_eq!(counter(&server, &l).await, 14);
    // Down to 2 held: no refill, as that is not fewer than 8 / 4.
    for _ in 0..6 {
        assert!(l.check(KEY, 1).await.unwrap().is_allowed());
    }
    // A request of 3 finds too little and reserves the 6 that top the key
    // up; it goes away before the answer, so its 3 stay held: 8 in all.
    server.freeze(true);
    let gave_up = tokio::time::timeout(Duration::from_millis(50), l.check(KEY, 3)).await;
    assert!(gave_up.is_err(), "{gave_up:?}");
    server.freeze(false);
    settled(&server, &l, 20).await;
    // Spent without a call (2 left are not fewer than 8 / 4).
    server.reset_stats().await;
    for i in 0..6 {
        let d = l.check(KEY, 1).await.unwrap();
        assert!(d.is_allowed(), "check {i}: {d:?}");
    }
    assert_eq!(server.script_calls().await, 0);
    server.assert_every_key_has_ttl().await;
}

/// An instance leaves at most n units of a window unspent, its last
/// stretch included: once its units stop (a thousandth of the window and a
/// ms before Redis's window ends), it reserves nothing more until that
/// window has surely ended, and its requests are checked by Redis one by
/// one. Five keys are probed 1 to 41 ms after their units stopped, while
/// Redis's 60 s window runs about 61 ms longer (a long window, so that a
/// loaded machine's late wake-ups still land in it).
#[tokio::test]
async fn no_units_are_reserved_in_a_windows_last_stretch() {
    let server = RedisServer::start();
    let l = exposed(server.store().await, "1000/60s", 10);
    let probes = (0..5u64).map(|i| {
        let (l, server) = (l.clone(), &server);
        async move {
            let key = format!("k{i}");
            let d = l.check(&key, 1).await.unwrap();
            // The decision reports Redis's window's end: the units stopped
            // about 61 ms before it.
            let stopped = d.reset_after() - Duration::from_millis(61);
            let after = Duration::from_millis(1 + 10 * i);
            tokio::time::sleep(stopped + after).await;
            assert!(l.check(&key, 1).await.unwrap().is_allowed());
            let store_key = l.store_key(&key);
            let (count, pttl): (Option<u64>, i64) = redis::pipe()
                .cmd("GET")
                .arg(&store_key)
                .cmd("PTTL")
                .arg(&store_key)
                .query_async(&mut server.conn().await)
                .await
                .unwrap();
            (count, pttl)
        }
    });
    let got = join_all(probes).await;
    // Probes that Redis counted in the first window (its key still there,
    // with little time left): 2 admitted, at most 10 reserved and unspent.
    let same: Vec<u64> = got
        .iter()
        .filter(|(_, pttl)| (0..30_000).contains(pttl))
        .filter_map(|(count, _)| *count)
        .collect();
    assert!(
        !same.is_empty(),
        "every probe came after the window: {got:?}"
    );
    for count in same {
        assert!(count <= 2 + 10, "{got:?}");
    }
}

/// A refund while a refill is on its way counts the units it will add: 1
/// held and 7 coming leave no room, so the refund goes to Redis, and the
/// key holds 8 once the refill lands, not 9.
#[tokio::test]
async fn a_refund_counts_the_units_a_refill_on_its_way_adds() {
    let server = RedisServer::start();
    let l = exposed(server.store().await, "1000/60s", 8);
    let mut admitted = Vec::new();
    for _ in 0..6 {
        admitted.push(l.check(KEY, 1).await.unwrap());
    }
    // The 7th leaves 1: a refill of 7, sent to a frozen Redis.
    server.freeze(true);
    admitted.push(l.check(KEY, 1).await.unwrap());
    tokio::time::sleep(Duration::from_millis(30)).await;
    let refund = tokio::spawn({
        let (l, d) = (l.clone(), admitted[0].clone());
        async move { l.refund(KEY, &d).await }
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    server.freeze(false);
    refund.await.unwrap().unwrap();
    // 8 reserved, 7 more, 1 refunded to Redis.
    settled(&server, &l, 14).await;
    server.assert_every_key_has_ttl().await;
}

/// A request that goes away once its reserve call is sent (its client gave
/// up, a reset stream, its timeout) loses none of the call's units: Redis
/// spends them all the same, and the flight keeps them for the requests
/// after it, the gone request's own unit included. Three requests give up
/// behind a frozen Redis; one call was sent, and the whole quota is then
/// admitted.
#[tokio::test]
async fn a_reserve_call_whose_request_went_away_keeps_its_units() {
    let server = RedisServer::start();
    // The timeout is the call's to wait for Redis to thaw: generous.
    let l = Limiter::builder("100/60s".parse().unwrap())
        .store(server.store().await)
        .timeout(Duration::from_secs(1))
        .breaker(Breaker::disabled())
        .local_reservation(40)
        .build()
        .unwrap();
    server.freeze(true);
    for i in 0..3 {
        let gave_up = tokio::time::timeout(Duration::from_millis(50), l.check(KEY, 1)).await;
        assert!(gave_up.is_err(), "request {i}: {gave_up:?}");
    }
    server.freeze(false);
    // One reserve call: the first request's. The others waited for it.
    settled(&server, &l, 40).await;
    for i in 0..100 {
        let d = l.check(KEY, 1).await.unwrap();
        assert!(d.is_allowed(), "check {i}: {d:?}");
    }
    assert!(!l.check(KEY, 1).await.unwrap().is_allowed());
    assert_eq!(counter(&server, &l).await, 100);
    server.assert_every_key_has_ttl().await;
}

#[tokio::test]
async fn a_killed_redis_follows_the_store_error_path() {
    let mut server = RedisServer::start();
    let l = reserving(server.store().await, "100/2s", 10);
    assert!(l.check(KEY, 1).await.unwrap().is_allowed());
    server.kill();
    for _ in 0..9 {
        assert!(l.check(KEY, 1).await.unwrap().is_allowed());
    }
    // Nothing held any more: an error, never an admission.
    assert!(l.check(KEY, 1).await.is_err());
}

#[tokio::test]
async fn a_denial_is_the_stores_with_the_windows_retry_after_and_is_cached() {
    let server = RedisServer::start();
    let l = reserving(server.store().await, "15/60s", 10);
    server.reset_stats().await;
    for _ in 0..15 {
        assert!(l.check(KEY, 1).await.unwrap().is_allowed());
    }
    // 10, then the last 5 (refilled ahead), then a refill ahead that found
    // nothing left: its denial is cached.
    settled(&server, &l, 15).await;
    wait_for_calls(&server, 3).await;
    let denied = l.check(KEY, 1).await.unwrap();
    assert!(!denied.is_allowed());
    assert_eq!(denied.remaining(), 0);
    let retry = denied.retry_after().unwrap();
    assert!(retry > Duration::from_secs(50) && retry <= Duration::from_secs(60));
    // From the deny cache: no call.
    assert!(!l.check(KEY, 1).await.unwrap().is_allowed());
    assert_eq!(server.script_calls().await, 3);
    assert_eq!(counter(&server, &l).await, 15);
    server.assert_every_key_has_ttl().await;
}

#[tokio::test]
async fn a_cost_above_n_or_above_what_is_held_reserves_again() {
    let server = RedisServer::start();
    let l = reserving(server.store().await, "100/60s", 10);
    assert!(l.check(KEY, 25).await.unwrap().is_allowed());
    assert_eq!(counter(&server, &l).await, 25);
    assert!(l.check(KEY, 1).await.unwrap().is_allowed()); // reserves 10, holds 9
    assert_eq!(counter(&server, &l).await, 35);
    // From the 9 held; none left, so 10 more in the background.
    assert!(l.check(KEY, 9).await.unwrap().is_allowed());
    settled(&server, &l, 45).await;
    assert!(l.check(KEY, 3).await.unwrap().is_allowed()); // holds 7
    // 7 held: reserves its 8, more than the 3 that top the key up to 10.
    assert!(l.check(KEY, 8).await.unwrap().is_allowed());
    assert_eq!(counter(&server, &l).await, 53);
    // 47 left in Redis: a cost of 50 is denied (the 7 held stay held).
    let big = l.check(KEY, 50).await.unwrap();
    assert!(!big.is_allowed());
    assert_eq!(big.remaining(), 47);
    assert_eq!(counter(&server, &l).await, 53);
    // Again too few held: its 9; the 7 stay held, so no refill.
    assert!(l.check(KEY, 9).await.unwrap().is_allowed());
    settled(&server, &l, 62).await;
    assert_eq!(l.peek(KEY, 7).await.unwrap().remaining(), 7 + 38);
}

#[tokio::test]
async fn peek_answers_from_the_reservation_when_it_holds_enough() {
    let server = RedisServer::start();
    let l = reserving(server.store().await, "100/60s", 10);
    assert!(l.check(KEY, 1).await.unwrap().is_allowed());
    server.reset_stats().await;
    let peek = l.peek(KEY, 9).await.unwrap();
    assert!(peek.is_allowed());
    // Held (9) plus what Redis had left (90).
    assert_eq!(peek.remaining(), 99);
    assert_eq!(server.script_calls().await, 0);
    // More than is held: Redis answers, spending nothing.
    let peek = l.peek(KEY, 20).await.unwrap();
    assert!(peek.is_allowed());
    assert_eq!(peek.remaining(), 90);
    assert_eq!(counter(&server, &l).await, 10);
}

/// A reserved decision reports the store's window's end, as a decision
/// made by the store does (its PTTL + 1), whether it reserved or spent
/// units held: it reported when the local units stop, a thousandth of the
/// window early, so a client that waited its `t` of an hour's window came
/// back 3.6 s too soon (86 s for a day's). And its refund still finds the
/// reservation it came from.
#[tokio::test]
async fn a_reserved_decision_reports_the_stores_window_end() {
    let server = RedisServer::start();
    let l = reserving(server.store().await, "100/1h", 10);
    let pttl = || async {
        let ms: i64 = redis::cmd("PTTL")
            .arg(l.store_key(KEY))
            .query_async(&mut server.conn().await)
            .await
            .unwrap();
        Duration::from_millis(u64::try_from(ms).unwrap())
    };
    for i in 0..3 {
        let d = l.check(KEY, 1).await.unwrap();
        let (reset, left) = (d.reset_after(), pttl().await);
        assert!(
            reset >= left && reset <= left + Duration::from_millis(100),
            "decision {i}: reset after {reset:?}, the counter's PTTL {left:?}"
        );
        if i == 2 {
            server.reset_stats().await;
            l.refund(KEY, &d).await.unwrap();
            assert_eq!(
                server.script_calls().await,
                0,
                "refunded to the reservation"
            );
        }
    }
}

#[tokio::test]
async fn refund_gives_a_reserved_unit_back_to_the_reservation() {
    let server = RedisServer::start();
    let l = reserving(server.store().await, "100/60s", 10);
    let d = l.check(KEY, 1).await.unwrap();
    server.reset_stats().await;
    l.refund(KEY, &d).await.unwrap();
    // Ten held again: eight checks without a store call (the ninth would
    // leave fewer than 10 / 4, and refill ahead).
    for _ in 0..8 {
        assert!(l.check(KEY, 1).await.unwrap().is_allowed());
    }
    assert_eq!(server.script_calls().await, 0);
    assert_eq!(counter(&server, &l).await, 10);
}

/// A shadow limit's denial admits the request but spends nothing, in Redis
/// or in the reservation: refunding it gives nothing back to the
/// reservation, and the next request is shadow-denied too.
#[tokio::test]
async fn refunding_a_shadow_denial_gives_nothing_to_the_reservation() {
    let server = RedisServer::start();
    let l = Limiter::builder("12/60s".parse().unwrap())
        .store(server.store().await)
        .timeout(TEST_TIMEOUT)
        .shadow(true)
        .local_reservation(10)
        .build()
        .unwrap();
    // The 12 units, then a shadow denial: admitted, spending nothing.
    for i in 0..12 {
        let d = l.check(KEY, 1).await.unwrap();
        assert!(d.is_allowed() && !d.is_shadow_denied(), "check {i}: {d:?}");
    }
    let denied = l.check(KEY, 1).await.unwrap();
    assert!(
        denied.is_allowed() && denied.is_shadow_denied(),
        "{denied:?}"
    );
    assert_eq!(counter(&server, &l).await, 12);
    l.refund(KEY, &denied).await.unwrap();
    let next = l.check(KEY, 1).await.unwrap();
    assert!(next.is_shadow_denied(), "{next:?}");
    assert_eq!(counter(&server, &l).await, 12);
}

#[tokio::test]
async fn reset_drops_the_reservation_and_a_refund_does_not_revive_it() {
    let server = RedisServer::start();
    let l = reserving(server.store().await, "100/60s", 10);
    let d = l.check(KEY, 1).await.unwrap();
    l.reset(KEY).await.unwrap();
    assert_eq!(counter(&server, &l).await, 0);
    // No reservation to give back to: the store's, whose key is gone.
    l.refund(KEY, &d).await.unwrap();
    assert_eq!(counter(&server, &l).await, 0);
    // The nine units held before the reset are gone: a new reservation.
    server.reset_stats().await;
    assert!(l.check(KEY, 1).await.unwrap().is_allowed());
    assert_eq!(server.script_calls().await, 1);
    assert_eq!(counter(&server, &l).await, 10);
    server.assert_every_key_has_ttl().await;
}

#[tokio::test]
async fn only_one_fixed_window_limit_can_reserve() {
    let q = Quota::per_second(10);
    let store = || MemoryStore::new();
    let build = |b: redis_ratelimit::LimiterBuilder| b.local_reservation(5).build().unwrap_err();
    let sliding = build(Limiter::builder(q.sliding_window()).store(store()));
    assert!(matches!(sliding, ConfigError::Reservation(_)), "{sliding}");
    let gcra = build(Limiter::builder(q.gcra(10).unwrap()).store(store()));
    assert!(matches!(gcra, ConfigError::Reservation(_)), "{gcra}");
    let two = build(
        Limiter::builder(q)
            .limit("day", Quota::per_day(9))
            .store(store()),
    );
    assert!(matches!(two, ConfigError::Reservation(_)), "{two}");
    // More units than any window holds: refused at build, not failed (and
    // passed by the store-error policy) at every request.
    let max = redis_ratelimit::quota::MAX_LIMIT;
    let huge = Limiter::builder(q)
        .store(store())
        .local_reservation(max + 1);
    let huge = huge.build().unwrap_err();
    assert!(matches!(huge, ConfigError::Reservation(_)), "{huge}");
    Limiter::builder(q)
        .store(store())
        .local_reservation(max)
        .build()
        .unwrap();
    // Off (0) is always fine.
    Limiter::builder(q.sliding_window())
        .local_reservation(0)
        .build()
        .unwrap();
}

#[tokio::test]
async fn the_memory_store_ignores_the_reservation_and_stays_exact() {
    let l = Limiter::builder("5/60s".parse().unwrap())
        .local_reservation(3)
        .build()
        .unwrap();
    for _ in 0..5 {
        assert!(l.check(KEY, 1).await.unwrap().is_allowed());
    }
    assert!(!l.check(KEY, 1).await.unwrap().is_allowed());
    let d = l.peek(KEY, 0).await.unwrap();
    assert_eq!(d.remaining(), 0);
}

#[cfg(feature = "cluster")]
#[tokio::test]
async fn a_cluster_reserves_on_the_keys_master() {
    let cluster = support::cluster::RedisCluster::start();
    let a = reserving(cluster.store().await, "200/60s", 10);
    let b = reserving(cluster.pool_store(2).await, "200/60s", 10);
    let checks = (0..400).map(|i| {
        let l = if i % 2 == 0 { a.clone() } else { b.clone() };
        async move { l.check(KEY, 1).await.unwrap().is_allowed() }
    });
    let admitted = join_all(checks).await.into_iter().filter(|x| *x).count();
    // Each instance holds at most n units unspent.
    assert!((180..=200).contains(&admitted), "{admitted}");
}

#[tokio::test]
async fn requests_waiting_on_a_denied_flight_share_its_denial() {
    let server = RedisServer::start();
    let l = reserving(server.store().await, "5/60s", 10);
    server.reset_stats().await;
    let decisions = join_all((0..100).map(|_| l.check(KEY, 1))).await;
    let admitted = decisions
        .iter()
        .filter(|d| d.as_ref().unwrap().is_allowed());
    assert_eq!(admitted.count(), 5);
    // One call took the 5 units, one was denied: the other waiters share it.
    assert_eq!(server.script_calls().await, 2);
    server.assert_every_key_has_ttl().await;
}

/// A store whose reserve calls take their units from one counter of
/// `limit` per minute when they are made (as Redis runs a call sent to it),
/// and answer only once the test opens the gate: a Redis whose replies the
/// test holds back. `reset` empties the counter; checks go to the
/// in-memory store.
#[derive(Debug, Clone)]
struct Gated {
    memory: MemoryStore,
    limit: u64,
    state: Arc<GatedState>,
}

#[derive(Debug)]
struct GatedState {
    /// The units reserve calls took from the counter since the last reset.
    count: Mutex<u64>,
    /// Reserve calls made.
    calls: watch::Sender<u64>,
    /// Whether reserve calls answer.
    open: watch::Sender<bool>,
    /// Whether a reset runs (empties the counter) when it is made, or
    /// waits for the test, as a reset a Redis runs after calls sent later.
    resets: watch::Sender<bool>,
    /// Reset calls made.
    reset_calls: watch::Sender<u64>,
}

impl Gated {
    fn new(limit: u64, open: bool) -> Self {
        Self {
            memory: MemoryStore::new(),
            limit,
            state: Arc::new(GatedState {
                count: Mutex::new(0),
                calls: watch::Sender::new(0),
                open: watch::Sender::new(open),
                resets: watch::Sender::new(true),
                reset_calls: watch::Sender::new(0),
            }),
        }
    }

    fn open(&self, open: bool) {
        self.state.open.send_replace(open);
    }

    /// Whether resets run when made; held back, they run once let go.
    fn run_resets(&self, run: bool) {
        self.state.resets.send_replace(run);
    }

    fn count(&self) -> u64 {
        *self.state.count.lock().unwrap()
    }

    fn calls(&self) -> u64 {
        *self.state.calls.borrow()
    }

    /// Waits until `calls` reserve calls have been made.
    async fn made(&self, calls: u64) {
        let mut made = self.state.calls.subscribe();
        made.wait_for(|made| *made >= calls).await.unwrap();
    }
}

impl Store for Gated {
    fn decide(
        &self,
        checks: Vec<LimitCheck>,
        cost: u64,
    ) -> BoxFuture<'static, Result<Vec<LimitState>, Error>> {
        self.memory.decide(checks, cost)
    }

    fn supports_reservation(&self) -> bool {
        true
    }

    fn reserve(
        &self,
        _check: LimitCheck,
        need: u64,
        want: u64,
    ) -> BoxFuture<'static, Result<Reservation, Error>> {
        let reply = {
            let mut count = self.state.count.lock().unwrap();
            let left = self.limit - *count;
            let granted = if left < need { 0 } else { want.min(left) };
            *count += granted;
            Reservation::new(granted, left - granted, 60_000)
        };
        self.state.calls.send_modify(|calls| *calls += 1);
        let mut open = self.state.open.subscribe();
        Box::pin(async move {
            open.wait_for(|open| *open).await.unwrap();
            Ok(reply)
        })
    }

    fn reset(&self, _keys: Vec<String>) -> BoxFuture<'static, Result<(), Error>> {
        let state = self.state.clone();
        let mut runs = state.resets.subscribe();
        state.reset_calls.send_modify(|calls| *calls += 1);
        Box::pin(async move {
            runs.wait_for(|run| *run).await.unwrap();
            *state.count.lock().unwrap() = 0;
            Ok(())
        })
    }
}

/// A limiter reserving `n` units at a time on a [`Gated`] store.
fn gated(store: &Gated, n: u64) -> Limiter {
    Limiter::builder(Quota::per_minute(store.limit))
        .store(store.clone())
        .timeout(TEST_TIMEOUT)
        .breaker(Breaker::disabled())
        .local_reservation(n)
        .build()
        .unwrap()
}

/// A reset while requests wait for their key's flight: the flight's grant
/// is kept nowhere (its units may be of the counter the reset deleted),
/// and the requests that waited join the key's new flight, one reserve
/// call for all of them, rather than each reserving `n` units for itself
/// and keeping none.
#[tokio::test]
async fn requests_waiting_on_a_flight_through_a_reset_share_one_new_reserve_call() {
    let store = Gated::new(1_000, false);
    let l = gated(&store, 40);
    let checks: Vec<_> = (0..20)
        .map(|_| {
            let l = l.clone();
            tokio::spawn(async move { l.check(KEY, 1).await })
        })
        .collect();
    // The first request's call is on its way, the others wait for it.
    store.made(1).await;
    l.reset(KEY).await.unwrap();
    store.open(true);
    for check in join_all(checks).await {
        let d = check.unwrap().unwrap();
        assert!(d.is_allowed(), "{d:?}");
    }
    // The call before the reset, and one after it for the 19 waiters.
    assert_eq!((store.calls(), store.count()), (2, 40));
}

/// A reset of [`KEY`] made on `store` and held there (its delete not run),
/// and once its call is made, a request that reserves the whole limit of
/// the counter it will delete: the reset, still on its way.
async fn reserved_during_a_reset(
    store: &Gated,
    l: &Limiter,
) -> tokio::task::JoinHandle<Result<(), redis_ratelimit::Error>> {
    store.run_resets(false);
    let reset = tokio::spawn({
        let l = l.clone();
        async move { l.reset(KEY).await }
    });
    let mut made = store.state.reset_calls.subscribe();
    made.wait_for(|calls| *calls == 1).await.unwrap();
    assert!(l.check(KEY, 1).await.unwrap().is_allowed());
    assert_eq!((store.calls(), store.count()), (1, store.limit));
    reset
}

/// A reserve call made after a reset began but run by the store before the
/// reset's delete (the reset's call still on its way): its units are of the
/// counter the reset deletes, and this instance keeps none of them. It kept
/// them once (the key was dropped only before the reset), and so admitted
/// them on top of the fresh counter's whole limit: 79 of a limit of 40.
#[tokio::test]
async fn a_reserve_run_before_a_resets_delete_keeps_no_units() {
    let store = Gated::new(40, true);
    let l = gated(&store, 40);
    let reset = reserved_during_a_reset(&store, &l).await;
    store.run_resets(true);
    reset.await.unwrap().unwrap();
    // The fresh counter's limit, and no more.
    let mut admitted = 0;
    for _ in 0..100 {
        admitted += usize::from(l.check(KEY, 1).await.unwrap().is_allowed());
    }
    assert_eq!(admitted, 40);
}

/// As above, with the reset's future dropped once its call is made (a
/// timeout around it, an admin handler whose client went away): the store
/// still runs the delete it was sent, and this instance still keeps none
/// of the deleted counter's units. The second drop of the key ran only if
/// the reset was awaited to its end, so this admitted 79 of 40.
#[tokio::test]
async fn a_reset_dropped_on_its_way_keeps_no_units() {
    let store = Gated::new(40, true);
    let l = gated(&store, 40);
    let reset = reserved_during_a_reset(&store, &l).await;
    reset.abort();
    assert!(reset.await.unwrap_err().is_cancelled());
    // The store runs the delete it was sent.
    *store.state.count.lock().unwrap() = 0;
    let mut admitted = 0;
    for _ in 0..100 {
        admitted += usize::from(l.check(KEY, 1).await.unwrap().is_allowed());
    }
    assert_eq!(admitted, 40);
}

/// A refill ahead that finds the store spent caches its denial, for the
/// requests that run short next; but not one answered after a reset
/// dropped its key: the client starts afresh, not denied from the cache.
/// Paused time: a sleep returns once every other task has run.
#[tokio::test(start_paused = true)]
async fn a_refills_denial_answered_after_a_reset_is_not_cached() {
    let store = Gated::new(4, true);
    let l = gated(&store, 4);
    // The 4 units reserved, 3 held.
    assert!(l.check(KEY, 1).await.unwrap().is_allowed());
    store.open(false);
    // The last one held: a refill ahead, which finds the store spent.
    for _ in 0..3 {
        assert!(l.check(KEY, 1).await.unwrap().is_allowed());
    }
    store.made(2).await;
    l.reset(KEY).await.unwrap();
    store.open(true);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let d = l.check(KEY, 1).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!((store.calls(), store.count()), (3, 4));
}

/// As a refill's, a request's denial answered after a reset dropped its
/// key is the request's answer, and is not cached for those after it.
#[tokio::test]
async fn a_requests_denial_answered_after_a_reset_is_not_cached() {
    let store = Gated::new(4, true);
    let l = gated(&store, 4);
    assert!(l.check(KEY, 4).await.unwrap().is_allowed());
    store.open(false);
    let denied = tokio::spawn({
        let l = l.clone();
        async move { l.check(KEY, 1).await }
    });
    store.made(2).await;
    l.reset(KEY).await.unwrap();
    store.open(true);
    // Asked before the reset: denied.
    let d = denied.await.unwrap().unwrap();
    assert!(!d.is_allowed(), "{d:?}");
    let d = l.check(KEY, 1).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!((store.calls(), store.count()), (3, 4));
}

/// Requests queued for a hot key's single flight behind a slow store follow
/// the store-error path within the timeout: each reserve call takes 150 ms
/// of a 200 ms timeout, and with `n = 1` every request reserves, so four
/// tasks queue for the flight. Unbounded, the wait for the flight plus a
/// fresh timeout for the call after it let the last in line take 600 ms.
#[tokio::test(start_paused = true)]
async fn a_request_queued_behind_slow_reserve_calls_ends_within_the_timeout() {
    let timeout = Duration::from_millis(200);
    let l = Limiter::builder(Quota::per_minute(1_000_000))
        .store(SlowReserve::default())
        .timeout(timeout)
        .breaker(Breaker::disabled())
        .local_reservation(1)
        .build()
        .unwrap();
    let tasks = (0..4).map(|_| {
        let l = l.clone();
        tokio::spawn(async move {
            let mut checks = Vec::new();
            for _ in 0..10 {
                let started = tokio::time::Instant::now();
                let result = l.check(KEY, 1).await;
                checks.push((started.elapsed(), result));
            }
            checks
        })
    });
    let checks: Vec<_> = join_all(tasks)
        .await
        .into_iter()
        .flat_map(Result::unwrap)
        .collect();
    let slowest = checks.iter().map(|(took, _)| *took).max().unwrap();
    // Paused time: a check takes exactly what its timers say (to the ms).
    assert!(
        slowest <= timeout + Duration::from_millis(5),
        "slowest check {slowest:?}, timeout {timeout:?}"
    );
    for (took, result) in &checks {
        match result {
            Ok(d) => assert!(d.is_allowed(), "{took:?}: {d:?}"),
            Err(Error::Timeout(t)) => assert_eq!(*t, timeout),
            Err(e) => panic!("{took:?}: {e}"),
        }
    }
    // The store still answers requests that have the time to wait for it.
    let admitted = checks.iter().filter(|(_, r)| r.is_ok()).count();
    assert!(admitted > 0, "none of 40 admitted");
}

/// More keys than the reservation map holds (10,000), each hit once: once
/// the map has had to drop keys, new keys are decided by the store, one
/// unit each, as without reservations, rather than reserving n units apiece
/// (a reserve call each, and n - 1 units unspent). A key noted so reserves
/// from its next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_new_to_a_full_map_are_checked_and_reserve_only_when_hit_again() {
    let server = RedisServer::start();
    let l = reserving(server.store().await, "100/60s", 10);
    const KEYS: usize = 30_000;
    check_keys(&l, KEYS).await;
    let mut conn = server.conn().await;
    let counts = counters(&server, &l, KEYS).await;
    let checked = counts.iter().filter(|&&c| c == 1).count();
    let reserved = counts.iter().filter(|&&c| c == 10).count();
    assert_eq!(checked + reserved, KEYS, "every counter is 1 or 10");
    // At most the map's keys reserved; every other key spent its one unit.
    assert!(reserved <= 10_000, "{reserved} keys reserved");
    assert!(checked >= KEYS - 10_000, "{checked} keys checked");
    // The map is crowded now: a new key's first request is a check, and
    // its next one, while the key is held, reserves (1 + 10 spent).
    for expected in [1, 11] {
        assert!(l.check("hot", 1).await.unwrap().is_allowed());
        let counter: u64 = redis::cmd("GET")
            .arg(l.store_key("hot"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(counter, expected);
    }
    server.assert_every_key_has_ttl().await;
}

/// `local_reservation_keys` sizes the map: 30,000 keys, three times the
/// default, each reserve at their first request and are then admitted in
/// process, and the bound is checked when the limiter is built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_larger_map_keeps_reservations_for_more_keys() {
    let server = RedisServer::start();
    let l = Limiter::builder("100/60s".parse().unwrap())
        .name("global")
        .store(server.store().await)
        .timeout(TEST_TIMEOUT)
        .local_reservation(10)
        .local_reservation_keys(40_000)
        .build()
        .unwrap();
    const KEYS: usize = 30_000;
    check_keys(&l, KEYS).await;
    let counts = counters(&server, &l, KEYS).await;
    let reserved = counts.iter().filter(|&&c| c == 10).count();
    assert_eq!(reserved, KEYS, "every key reserved 10 units");
    // A second request of every key is admitted from its reservation: no
    // counter moves.
    check_keys(&l, KEYS).await;
    assert_eq!(counters(&server, &l, KEYS).await, counts);
    server.assert_every_key_has_ttl().await;
    for keys in [0, 10_000_001] {
        let built = Limiter::builder(Quota::per_minute(100))
            .store(server.store().await)
            .local_reservation(10)
            .local_reservation_keys(keys)
            .build();
        assert!(
            matches!(built, Err(ConfigError::Reservation(_))),
            "{keys} keys: {built:?}"
        );
    }
}

/// A flood of new keys each hit twice (so each reserves, and a full
/// shard's pass keeps it for its units) does not cost hot keys, each hit
/// between every two of them, their reservations: each under-admits by at
/// most n in its window. A pass once dropped a hot key among the flood's
/// keys, with its unspent units, again and again (where a key sat in its
/// shard's table decided which, so there are eight).
#[tokio::test]
async fn a_flood_of_keys_hit_twice_does_not_drop_hot_keys_units() {
    let server = RedisServer::start();
    let l = Limiter::builder("1000/60s".parse().unwrap())
        .name("global")
        .store(server.store().await)
        .timeout(TEST_TIMEOUT)
        .local_reservation(100)
        .local_reservation_keys(64)
        .build()
        .unwrap();
    let mut admitted = [0u64; 8];
    for i in 0..1000 {
        let key = format!("flood{i}");
        for _ in 0..2 {
            assert!(l.check(&key, 1).await.unwrap().is_allowed(), "{key}");
        }
        for (hot, count) in admitted.iter_mut().enumerate() {
            *count += u64::from(l.check(&format!("hot{hot}"), 1).await.unwrap().is_allowed());
        }
    }
    assert!(
        admitted.iter().all(|&a| a >= 900),
        "the hot keys admitted {admitted:?} of 1000 each"
    );
    server.assert_every_key_has_ttl().await;
}

/// Checks keys `k0 .. k{keys - 1}` once each, 500 at a time: all allowed.
async fn check_keys(l: &Limiter, keys: usize) {
    for chunk in (0..keys).collect::<Vec<_>>().chunks(500) {
        let checks = chunk.iter().map(|&i| {
            let l = l.clone();
            async move { l.check(&format!("k{i}"), 1).await.unwrap().is_allowed() }
        });
        assert!(join_all(checks).await.into_iter().all(|allowed| allowed));
    }
}

/// The counters of keys `k0 .. k{keys - 1}`, in order.
async fn counters(server: &RedisServer, l: &Limiter, keys: usize) -> Vec<u64> {
    let mut conn = server.conn().await;
    let mut counts: Vec<u64> = Vec::with_capacity(keys);
    for chunk in (0..keys).collect::<Vec<_>>().chunks(1_000) {
        let mut pipe = redis::pipe();
        for &i in chunk {
            pipe.cmd("GET").arg(l.store_key(&format!("k{i}")));
        }
        let got: Vec<u64> = pipe.query_async(&mut conn).await.unwrap();
        counts.extend(got);
    }
    counts
}
