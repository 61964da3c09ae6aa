//! `Limiter::refund`: what a decision spent goes back to the window it was
//! spent in, and only there, for every algorithm, on every store, with one
//! limit or several, never below zero, and never past the limit under
//! concurrency.

mod support;

use std::time::Duration;

use futures_util::future::join_all;
use redis::AsyncCommands;
use redis_ratelimit::{Error, Limiter, Quota, RedisStore};
use support::{
    Backend,
    delay::DelayProxy,
    for_every_store,
    limits::{admitted, algorithms, limiter},
};

async fn a_refund_gives_back_the_cost(b: Backend) {
    for (name, quota) in algorithms(3, "10s") {
        let l = limiter(&b, name, quota);
        let d = l.check("k", 2).await.unwrap();
        assert!(d.is_allowed(), "{name}");
        l.refund("k", &d).await.unwrap();
        assert_eq!(l.peek("k", 1).await.unwrap().remaining(), 3, "{name}");
        // Exhausted, one refunded: exactly one more fits.
        let spent: Vec<_> = join_all((0..3).map(|_| l.check("k", 1))).await;
        assert!(
            spent.iter().all(|d| d.as_ref().unwrap().is_allowed()),
            "{name}"
        );
        l.refund("k", spent[0].as_ref().unwrap()).await.unwrap();
        assert_eq!(admitted(&l, "k", 3).await, 1, "{name}");
    }
    if let Some(server) = b.server() {
        server.assert_every_key_has_ttl().await;
    }
}

async fn refunds_never_go_below_zero(b: Backend) {
    for (name, quota) in algorithms(3, "10s") {
        let l = limiter(&b, name, quota);
        let two = l.check("k", 2).await.unwrap();
        assert!(l.check("k", 1).await.unwrap().is_allowed(), "{name}");
        // Not idempotent: given back twice, but clamped at nothing spent.
        l.refund("k", &two).await.unwrap();
        l.refund("k", &two).await.unwrap();
        assert_eq!(admitted(&l, "k", 5).await, 3, "{name}");
    }
}

async fn what_spent_nothing_refunds_nothing(b: Backend) {
    for (name, quota) in algorithms(2, "10s") {
        let l = limiter(&b, name, quota);
        assert_eq!(admitted(&l, "k", 2).await, 2);
        let denied = l.check("k", 1).await.unwrap();
        assert!(!denied.is_allowed(), "{name}");
        l.refund("k", &denied).await.unwrap();
        let peeked = l.peek("k", 1).await.unwrap();
        l.refund("k", &peeked).await.unwrap();
        let nothing = l.check("k", 0).await.unwrap();
        l.refund("k", &nothing).await.unwrap();
        assert_eq!(admitted(&l, "k", 1).await, 0, "{name}");
    }
}

async fn every_limit_gets_its_refund(b: Backend) {
    for (name, quota) in algorithms(2, "10s") {
        let l = b
            .builder_for(quota)
            .name(format!("{name}-user"))
            .limit(format!("{name}-all"), Quota::per_minute(3))
            .build()
            .unwrap();
        let d = l.check_each(&["alice", "all"], 2).await.unwrap();
        assert!(d.is_allowed());
        l.refund_each(&["alice", "all"], &d).await.unwrap();
        let peek = l.peek_each(&["alice", "all"], 1).await.unwrap();
        let left: Vec<_> = peek.limits().map(|l| l.remaining()).collect();
        assert_eq!(left, [2, 3], "{name}");
        // Wrong number of keys, or another limiter's decision: an error.
        let err = l.refund_each(&["a", "b", "c"], &d).await.unwrap_err();
        assert!(matches!(err, Error::KeyCount { .. }), "{err}");
        let other = limiter(&b, &format!("{name}-other"), quota);
        let err = other.refund("alice", &d).await.unwrap_err();
        assert!(matches!(err, Error::ForeignDecision), "{err}");
    }
}

/// A decision holds the policies of the thread it was made on (each thread
/// has its own copy): one made on another thread is still the limiter's.
async fn a_decision_made_on_another_thread_is_refunded(b: Backend) {
    let l = limiter(&b, "threads", Quota::per_minute(2));
    let there = l.clone();
    let runtime = tokio::runtime::Handle::current();
    let d = tokio::task::spawn_blocking(move || runtime.block_on(there.check("k", 2)))
        .await
        .unwrap()
        .unwrap();
    assert!(d.is_allowed());
    l.refund("k", &d).await.unwrap();
    assert_eq!(l.peek("k", 1).await.unwrap().remaining(), 2);
}

async fn an_ended_window_is_not_credited(b: Backend) {
    for (name, quota) in algorithms(2, "300ms") {
        let l = limiter(&b, name, quota);
        let old = l.check("k", 1).await.unwrap();
        assert!(old.is_allowed());
        // Two windows on: the spent window (a sliding window's bucket, the
        // GCRA spend) is gone, and a new one is full.
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(admitted(&l, "k", 2).await, 2, "{name}");
        l.refund("k", &old).await.unwrap();
        assert_eq!(
            admitted(&l, "k", 1).await,
            0,
            "{name}: a later window was credited"
        );
    }
}

async fn concurrent_spends_and_refunds_never_pass_the_limit(b: Backend) {
    for (name, quota) in algorithms(10, "30s") {
        let l = limiter(&b, name, quota);
        let tasks = (0..60).map(|i| {
            let l = l.clone();
            async move {
                let d = l.check("k", 1).await.unwrap();
                let refunded = d.is_allowed() && i % 3 == 0;
                if refunded {
                    l.refund("k", &d).await.unwrap();
                }
                (d.is_allowed(), refunded)
            }
        });
        let results = join_all(tasks).await;
        let allowed = results.iter().filter(|r| r.0).count() as u64;
        let refunded = results.iter().filter(|r| r.1).count() as u64;
        let kept = allowed - refunded;
        assert!(kept <= 10, "{name}: {kept} kept");
        assert_eq!(admitted(&l, "k", 20).await, 10 - kept, "{name}");
    }
}

/// A GCRA decision made before a reset and refunded after it credits the
/// bucket begun after the reset (a GCRA key has no windows to tell apart:
/// `Limiter::refund`'s docs), but by no more than its cost, once: a bucket
/// of 3, spent, reset and spent again, admits at most 1 more after the
/// refund of a spend of 1.
async fn a_gcra_refund_after_a_reset_credits_at_most_its_cost(b: Backend) {
    let [.., (name, quota)] = algorithms(3, "1h");
    let l = limiter(&b, name, quota);
    // The last spend's end is a whole bucket away: more is outstanding of
    // it than its cost.
    assert_eq!(admitted(&l, "k", 2).await, 2);
    let before = l.check("k", 1).await.unwrap();
    assert!(before.is_allowed());
    l.reset("k").await.unwrap();
    assert_eq!(admitted(&l, "k", 4).await, 3, "a reset starts afresh");
    l.refund("k", &before).await.unwrap();
    let more = admitted(&l, "k", 3).await;
    assert!(more <= 1, "a refund of 1 admitted {more} more");
    if let Some(server) = b.server() {
        server.assert_every_key_has_ttl().await;
    }
}

for_every_store!(
    a_refund_gives_back_the_cost,
    refunds_never_go_below_zero,
    what_spent_nothing_refunds_nothing,
    every_limit_gets_its_refund,
    a_decision_made_on_another_thread_is_refunded,
    an_ended_window_is_not_credited,
    concurrent_spends_and_refunds_never_pass_the_limit,
    a_gcra_refund_after_a_reset_credits_at_most_its_cost,
);

/// A GCRA refund right after its spend gives the whole unit back, whatever
/// the sub-millisecond times of the spend and the refund: the bound "no more
/// than is still outstanding" rounds the spend's end up, never down (it once
/// rounded the decision's time down, and a check just after a refund found
/// the bucket a fraction of a unit short). The memory store on tokio's paused
/// clock, its own clock.
#[tokio::test(start_paused = true)]
async fn a_gcra_refund_is_never_short_by_the_clocks_rounding() {
    let quota: Quota = "3/10s".parse().unwrap();
    let l = limiter(&Backend::memory(), "gcra", quota.gcra(3).unwrap());
    // Spent at 0.8 ms: the spend's end is 3,334.13 ms on the store's clock.
    tokio::time::advance(Duration::from_micros(800)).await;
    let spent: Vec<_> = join_all((0..3).map(|_| l.check("k", 1))).await;
    assert!(spent.iter().all(|d| d.as_ref().unwrap().is_allowed()));
    // Refunded at 1.05 ms: 3,333.08 ms of it still outstanding.
    tokio::time::advance(Duration::from_micros(250)).await;
    l.refund("k", spent[0].as_ref().unwrap()).await.unwrap();
    assert_eq!(admitted(&l, "k", 3).await, 1);
}

/// Nor is it over: a GCRA spend that has drained credits nothing, though
/// its end in whole ms is still ahead. 5000/1s, a burst of 1: a unit is
/// 200 µs, so the spend's reset reads 1 ms while the spend is gone after
/// 200 µs; a credit bounded by the reset's whole ms would give back the next
/// spend.
#[tokio::test(start_paused = true)]
async fn a_drained_gcra_spend_credits_nothing_within_its_millisecond() {
    let quota: Quota = "5000/1s".parse().unwrap();
    let l = limiter(&Backend::memory(), "gcra", quota.gcra(1).unwrap());
    tokio::time::advance(Duration::from_micros(800)).await;
    let old = l.check("k", 1).await.unwrap();
    assert!(old.is_allowed());
    // 0.5 ms on: the old spend drained at 1.0 ms; a new one is held.
    tokio::time::advance(Duration::from_micros(700)).await;
    assert_eq!(admitted(&l, "k", 2).await, 1);
    l.refund("k", &old).await.unwrap();
    assert_eq!(admitted(&l, "k", 1).await, 0, "a later spend was credited");
}

/// On Redis, a GCRA refund is bounded by what is still outstanding of the
/// spend on Redis's own clock, whatever the round trips took. Behind a proxy
/// 50 ms away each way, the caller's view of when a spend ends is at least
/// 100 ms late (the answer's way back, the refund's way there): bounded by
/// it, a refund once credited 100 ms of a spend already drained, taken from
/// the spend stacked after it. 100/1s with a burst of 100: a unit is 10 ms.
/// Spend `a` holds 500 ms of the bucket, `b` the 400 ms after it; once `a`
/// is refunded, `b` must still hold its 400 ms. Through the batching
/// connection and through a pool (a call of its own).
#[tokio::test]
async fn a_gcra_refund_on_redis_credits_no_more_than_is_outstanding_on_its_clock() {
    let server = support::RedisServer::start();
    let proxy = DelayProxy::start(server.port(), Duration::from_millis(50)).await;
    let quota = Quota::per_second(100).gcra(100).unwrap();
    for pooled in [false, true] {
        let store = match pooled {
            false => RedisStore::connect(proxy.url()).await.unwrap(),
            true => {
                let manager = bb8_redis::RedisConnectionManager::new(proxy.url()).unwrap();
                let pool = bb8::Pool::builder().max_size(2).test_on_check_out(false);
                RedisStore::from_pool(pool.build(manager).await.unwrap())
            }
        };
        let l = Limiter::builder(quota)
            .name(format!("refund-clock-{pooled}"))
            .store(store)
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        refund_leaves_the_next_spend_whole(&server, &l, (50, 40), 400_000).await;
    }
    server.assert_every_key_has_ttl().await;
}

/// And to the µs, on loopback: 100,000/1s with a burst of 10,000, a unit of
/// 10 µs; `a` holds 50.01 ms of the bucket, `b` the 40 ms after it. The
/// refund of `a` leaves `b`'s 40 ms whole (`a`'s end rounded up to the whole
/// ms would take 0.99 ms of it, 99 units). Alone, and beside a fixed window
/// (a decision of several limits keeps each one's end).
#[tokio::test]
async fn a_gcra_refund_on_redis_is_bounded_to_the_microsecond() {
    let server = support::RedisServer::start();
    let quota = Quota::per_second(100_000).gcra(10_000).unwrap();
    for beside in [None, Some(Quota::per_minute(1_000_000))] {
        let mut builder = Limiter::builder(quota).store(server.store().await);
        if let Some(fixed) = beside {
            builder = builder.name("gcra").limit("fixed", fixed);
        }
        let l = builder.build().unwrap();
        refund_leaves_the_next_spend_whole(&server, &l, (5001, 4000), 40_000).await;
    }
    server.assert_every_key_has_ttl().await;
}

/// refund.lua refuses a call whose arguments are not seven whole numbers a
/// key (the spend's end on Redis's clock the seventh; the first six, the
/// layout before it, no longer do) and the call's id, naming its marker
/// (`lua/once.lua`), before it touches any key: the spend stays spent. The
/// well-formed call then moves the TAT back by the cost, exactly, and sent
/// again (its first reply lost) it credits nothing more.
#[tokio::test]
async fn the_refund_script_refuses_bad_arguments_and_credits_once() {
    let server = support::RedisServer::start();
    let mut conn = server.conn().await;
    // 100/1s with a burst of 100: a unit is 10 ms. A TAT 500 ms ahead.
    let tat = redis_time_us(&mut conn).await + 500_000;
    let stored = format!("{tat}:0");
    set_tat(&mut conn, &stored).await;
    let script = redis::Script::new(redis_ratelimit::store::REFUND_LUA);
    let end = tat.to_string();
    // GCRA, 100 a 1000 ms, a burst of 100, 10 units back, 500 ms from now;
    // the call's id last.
    let good = ["3", "100", "1000", "100", "10", "500", end.as_str(), "ab-1"];
    let keys = ["k", "k#rf:ab-1"];
    let mut bad = support::spoiled(
        &good,
        &[
            (0, "4"),
            (4, "0"),
            (5, "x"),
            (6, "-1"),
            (6, "x"),
            (6, "1.5"),
            (6, " 5"),
            (6, "1e15"),
            (7, "ab-2"),
            (7, "AB-1"),
            (7, ""),
        ],
    );
    bad.push(good[..7].to_vec());
    bad.push([&good[..7], &["0", "ab-1"]].concat());
    let mut calls: Vec<(&[&str], Vec<&str>)> =
        bad.into_iter().map(|argv| (&keys[..], argv)).collect();
    // Without the marker, or with another one.
    calls.push((&keys[..1], good.to_vec()));
    calls.push((&["k", "k#rs:ab-1"], good.to_vec()));
    calls.push((&["k", "other#rf:ab-1"], good.to_vec()));
    for (keys, argv) in &calls {
        let r: redis::RedisResult<i64> = support::invocation(&script, keys, argv)
            .invoke_async(&mut conn)
            .await;
        assert!(r.is_err(), "{keys:?} {argv:?} accepted: {r:?}");
        let now: String = redis::cmd("GET")
            .arg("k")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(now, stored, "{keys:?} {argv:?} touched the key");
        let marked: bool = conn.exists(keys[keys.len() - 1]).await.unwrap();
        assert!(
            keys.len() == 1 || !marked,
            "{keys:?} {argv:?} left a marker"
        );
    }
    for (run, credits) in [(1, 1), (2, 0)] {
        let credited: i64 = support::invocation(&script, &keys, &good)
            .invoke_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(credited, credits, "run {run}");
        let now: String = redis::cmd("GET")
            .arg("k")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            now,
            format!("{}:0", tat - 100_000),
            "10 units are 100 ms, once"
        );
    }
    // The marker lasts 10 s: long past the spend's end (500 ms), as a resend
    // may come later than the next window.
    let ttl: i64 = conn.pttl(keys[1]).await.unwrap();
    assert!(
        (9_000..=10_000).contains(&ttl),
        "the marker's TTL: {ttl} ms"
    );
    server.assert_every_key_has_ttl().await;
}

/// Spends `a` then `b` units on one key of `l`, one after the other, then
/// refunds `a`: `b`'s spend, `b_us` long, must still end no sooner than
/// `b_us` after the refund was sent (by Redis's clock), its TAT.
async fn refund_leaves_the_next_spend_whole(
    server: &support::RedisServer,
    l: &Limiter,
    (a, b): (u64, u64),
    b_us: u64,
) {
    let mut conn = server.conn().await;
    let first = l.check("k", a).await.unwrap();
    let second = l.check("k", b).await.unwrap();
    assert!(first.is_allowed() && second.is_allowed());
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    l.refund("k", &first).await.unwrap();
    let tat: String = redis::cmd("GET")
        .arg(l.store_key("k"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let tat: u64 = tat.split(':').next().unwrap().parse().unwrap();
    let before = secs * 1_000_000 + micros;
    assert!(
        tat >= before + b_us,
        "{}: b's spend ends {} µs after the refund was sent, not {b_us}",
        l.name(),
        tat as i64 - before as i64
    );
}

/// On a cluster: refund, peek and reset for every algorithm and several
/// limits, one call each (a CROSSSLOT error would fail it).
#[cfg(feature = "cluster")]
#[tokio::test]
async fn refunds_work_on_a_cluster() {
    let cluster = support::cluster::RedisCluster::start();
    for (name, quota) in algorithms(2, "10s") {
        let l = redis_ratelimit::Limiter::builder(quota)
            .store(cluster.store().await)
            .name(format!("{name}-user"))
            .limit(format!("{name}-all"), Quota::per_minute(3))
            .build()
            .unwrap();
        let d = l.check_each(&["alice", "all"], 2).await.unwrap();
        l.refund_each(&["alice", "all"], &d).await.unwrap();
        let left: Vec<_> = (l.peek_each(&["alice", "all"], 1).await.unwrap())
            .limits()
            .map(|l| l.remaining())
            .collect();
        assert_eq!(left, [2, 3], "{name}");
        let d = l.check_each(&["alice", "all"], 2).await.unwrap();
        assert!(d.is_allowed());
        assert!(
            !l.peek_each(&["alice", "all"], 1)
                .await
                .unwrap()
                .is_allowed()
        );
        l.reset_each(&["alice", "all"]).await.unwrap();
        assert!(
            l.peek_each(&["alice", "all"], 2)
                .await
                .unwrap()
                .is_allowed()
        );
        l.reset("bob").await.unwrap();
    }
}

/// A refund of a decision made before a reset never credits the window
/// begun after it, though that window ends within half a window of the
/// spent one: the memory store knows the spent window's end to the ms on
/// its own clock. (Redis knows it from the caller's measure, and within
/// half a window: `Limiter::refund`'s docs.) On tokio's paused clock.
#[tokio::test(start_paused = true)]
async fn a_refund_after_a_reset_never_credits_the_new_window() {
    for (name, quota) in algorithms(1, "1s") {
        if name == "gcra" {
            continue; // credited, by at most its cost: see a_gcra_refund_after_a_reset_credits_at_most_its_cost
        }
        // 1 ms later as well: the memory store took a window ending
        // within 1 ms of the spent one's for it.
        for later in [100, 1] {
            let l = limiter(&Backend::memory(), name, quota);
            let before = l.check("k", 1).await.unwrap();
            assert!(before.is_allowed(), "{name}");
            l.reset("k").await.unwrap();
            tokio::time::advance(Duration::from_millis(later)).await;
            let after = l.check("k", 1).await.unwrap();
            assert!(after.is_allowed(), "{name}: a reset starts afresh");
            l.refund("k", &before).await.unwrap();
            let d = l.check("k", 1).await.unwrap();
            assert!(
                !d.is_allowed(),
                "{name}, {later} ms: the refund of a spend before the reset credited the new window"
            );
        }
    }
}

/// A store of your own that keeps checks and nothing else: it cannot
/// refund (the `Store` trait's default answers `Unsupported`).
#[derive(Debug, Default)]
struct NoRefunds(redis_ratelimit::MemoryStore);

impl redis_ratelimit::Store for NoRefunds {
    fn decide(
        &self,
        checks: Vec<redis_ratelimit::store::LimitCheck>,
        cost: u64,
    ) -> redis_ratelimit::store::BoxFuture<
        'static,
        Result<Vec<redis_ratelimit::store::LimitState>, Error>,
    > {
        self.0.decide(checks, cost)
    }
}

/// A shadow limit's denial admits the request and spends nothing: its
/// refund makes no store call. (It called `Store::refund` with no refund
/// in it, which a store that cannot refund answered with an error.)
#[tokio::test]
async fn a_shadow_denials_refund_asks_the_store_nothing() {
    let l = Limiter::builder("1/1m".parse().unwrap())
        .store(NoRefunds::default())
        .shadow(true)
        .build()
        .unwrap();
    assert!(l.check("k", 1).await.unwrap().is_allowed());
    let d = l.check("k", 1).await.unwrap();
    assert!(d.is_allowed() && d.is_shadow_denied(), "{d:?}");
    l.refund("k", &d)
        .await
        .unwrap_or_else(|e| panic!("a refund of nothing spent: {e}"));
    // The admitted request's refund does need the store.
    let admitted = l.check("other", 1).await.unwrap();
    assert!(matches!(
        l.refund("other", &admitted).await,
        Err(Error::Unsupported("refund"))
    ));
}

/// A GCRA spend's end comes rounded up to the whole µs (decide.lua's
/// reply), so a refund credits what is outstanding of it no further than
/// that allows: with a unit of 1/3 µs and a spend that ends 1/3 µs into
/// its last µs, one more spend queued behind it stays exactly where it was
/// less what is outstanding, a whole number of µs ahead (`…:0`). Fails with
/// the rounded end credited whole: 2/3 µs more came back, and the spend
/// behind it moved to `…:1`, earlier than exact.
#[tokio::test]
async fn a_gcra_refund_credits_no_more_than_the_rounded_spend_end_allows() {
    let server = support::RedisServer::start();
    let mut conn = server.conn().await;
    // 3 a 1 ms (a unit is 1/3 µs), a burst of 10,000 (3.3 s). The spend
    // refunded ends 1/3 µs into its last µs, a second from now, reported
    // as `end`; one more spend of 1000 µs is queued behind it.
    let end = redis_time_us(&mut conn).await + 1_000_000;
    let stored = format!("{}:1", end - 1 + 1000);
    set_tat(&mut conn, &stored).await;
    let end = end.to_string();
    // More units back than are outstanding: what is outstanding bounds it.
    let argv = [
        "3",
        "3",
        "1",
        "10000",
        "10000",
        "1000",
        end.as_str(),
        "ab-2",
    ];
    let credited: i64 = redis::Script::new(redis_ratelimit::store::REFUND_LUA)
        .key("k")
        .key("k#rf:ab-2")
        .arg(&argv[..])
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(credited, 1);
    let after: String = conn.get("k").await.unwrap();
    assert!(
        after.ends_with(":0"),
        "the spend behind moved by a fraction of a µs: {stored} -> {after}"
    );
    server.assert_every_key_has_ttl().await;
}

/// Redis's clock (`TIME`), in µs.
async fn redis_time_us(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    secs * 1_000_000 + micros
}

/// Stores a GCRA value (`a:b`) at `k`, for 5 s.
async fn set_tat(conn: &mut redis::aio::MultiplexedConnection, stored: &str) {
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg(stored)
        .arg("PX")
        .arg(5_000)
        .query_async(conn)
        .await
        .unwrap();
}

/// Fails with refund.lua reading a fixed window's end as the key's bare
/// PTTL: decisions report it as the PTTL + 1 (a key lives through the ms
/// its expiry names), so the end a refund carried was 1 ms past the PTTL,
/// and on a window of 3 ms, where the end must match within 1 ms, no
/// refund ever credited (the memory store's did). Each try decides a new
/// counter (its end: the whole window, 3 ms) and refunds it in the same
/// pipeline; a try whose refund runs a ms later misses either way, so one
/// credit in 50 is asked.
#[tokio::test]
async fn a_fixed_window_refund_credits_on_a_window_of_3_ms() {
    use redis_ratelimit::store::{DECIDE_FIXED_LUA, REFUND_LUA};
    let server = support::RedisServer::start();
    let mut conn = server.conn().await;
    let mut credited = 0;
    for i in 0..50 {
        let (key, id) = (format!("k{i}"), format!("ab-{i}"));
        let marker = format!("{key}#rf:{id}");
        // Decide: compact (limit 5, 3 ms, cost 1). Refund: a fixed window
        // (1), limit 5, 3 ms, no burst, cost 1, ending in 3 ms, no GCRA end.
        let (_, got): (redis::Value, i64) = redis::pipe()
            .cmd("EVAL")
            .arg(DECIDE_FIXED_LUA)
            .arg(1)
            .arg(&key)
            .arg(&["0", "5", "3", "1"])
            .cmd("EVAL")
            .arg(REFUND_LUA)
            .arg(2)
            .arg(&key)
            .arg(&marker)
            .arg(&["1", "5", "3", "0", "1", "3", "0", id.as_str()])
            .query_async(&mut conn)
            .await
            .unwrap();
        credited += got;
    }
    assert!(credited > 0, "no refund of 50 credited its 3 ms window");
    server.assert_every_key_has_ttl().await;
}
