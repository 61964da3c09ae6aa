//! Sliding window, GCRA and costs, against every store; and store parity:
//! the memory store gives the same decisions as Redis, run side by side.

mod support;

use std::time::Duration;

use redis::AsyncCommands;
use redis_ratelimit::{Decision, Error, Limiter, MemoryStore, Quota};
use support::{Backend, RedisServer};
use tokio::time::sleep;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn admitted(limiter: &Limiter, key: &str, n: usize) -> usize {
    let mut count = 0;
    for _ in 0..n {
        count += usize::from(limiter.check(key, 1).await.unwrap().is_allowed());
    }
    count
}

async fn assert_ttls(b: &Backend) {
    if let Some(server) = b.server() {
        server.assert_every_key_has_ttl().await;
    }
}

/// GCRA "2/1s" with a burst of 3: exactly 3 at once, then one every 500 ms;
/// `retry_after` and `reset_after` are what the next request experiences.
async fn gcra_admits_the_burst_then_one_per_interval(b: Backend) {
    let quota = Quota::per_second(2).gcra(3).unwrap();
    let limiter = b.builder_for(quota).build().unwrap();
    let mut ds = Vec::new();
    for _ in 0..4 {
        ds.push(limiter.check("k", 1).await.unwrap());
    }
    let allowed: Vec<_> = ds.iter().map(Decision::is_allowed).collect();
    assert_eq!(allowed, [true, true, true, false], "{ds:?}");
    let remaining: Vec<_> = ds.iter().map(Decision::remaining).collect();
    assert_eq!(remaining, [2, 1, 0, 0], "{ds:?}");
    // Full again three intervals after the burst.
    assert!(
        (1400..=1500).contains(&ds[2].reset_after().as_millis()),
        "{ds:?}"
    );
    let wait = ds[3].retry_after().unwrap();
    assert!((400..=500).contains(&wait.as_millis()), "{wait:?}");

    // 250 ms before the wait is over: still denied, and told the rest.
    sleep(wait - ms(250)).await;
    let early = limiter.check("k", 1).await.unwrap();
    assert!(!early.is_allowed(), "{early:?}");
    let rest = early.retry_after().unwrap();
    assert!((100..=260).contains(&rest.as_millis()), "{rest:?}");
    // At the wait: admitted, and the next one waits a whole interval.
    sleep(rest).await;
    let on_time = limiter.check("k", 1).await.unwrap();
    assert!(on_time.is_allowed(), "{on_time:?}");
    let next = limiter.check("k", 1).await.unwrap();
    let wait = next.retry_after().unwrap();
    assert!((400..=500).contains(&wait.as_millis()), "{next:?}");
    // After reset_after, the whole burst is back.
    sleep(on_time.reset_after()).await;
    let burst = limiter.check("k", 3).await.unwrap();
    assert!(burst.is_allowed(), "{burst:?}");
    assert!(matches!(
        limiter.check("k", 4).await,
        Err(Error::CostExceedsLimit { cost: 4, limit: 3 })
    ));
    assert_ttls(&b).await;
}

/// A named GCRA limit whose burst is lowered on a live key (50 → 3, "5/1s",
/// one unit per 200 ms), as in a rolling deploy where replicas of both
/// quotas share the key: the old booking, 10 s ahead, is obeyed, never
/// shortened. The narrow quota denies until the booking is within its
/// bucket (9.6 s: 3 units minus the one asked for, ahead), and a wide
/// replica's next request still finds its booking whole. (Shortening it to
/// a full narrow bucket, as the memory store did, let each narrow request
/// give the wide replicas about 47 units back.)
async fn gcra_obeys_a_booking_beyond_a_lowered_burst(b: Backend) {
    let quota = |burst| Quota::per_second(5).gcra(burst).unwrap();
    let wide = b
        .builder_for(quota(50))
        .name("g")
        .deny_cache(0)
        .build()
        .unwrap();
    assert_eq!(admitted(&wide, "k", 50).await, 50);
    let narrow = b
        .builder_for(quota(3))
        .name("g")
        .share_counters()
        .deny_cache(0)
        .build()
        .unwrap();
    for _ in 0..3 {
        let d = narrow.check("k", 1).await.unwrap();
        assert!(!d.is_allowed(), "{d:?}");
        let wait = d.retry_after().unwrap().as_millis();
        assert!((9_400..=9_600).contains(&wait), "{d:?}");
        assert!(
            (9_800..=10_000).contains(&d.reset_after().as_millis()),
            "{d:?}"
        );
        let d = wide.check("k", 1).await.unwrap();
        assert!(!d.is_allowed(), "the wide booking was shortened: {d:?}");
    }
    assert_ttls(&b).await;
}

/// A refund of a narrow quota's spend on a key a wider quota booked beyond
/// the narrow bucket since (replicas of both during a deploy): the credit
/// comes off the booking as it stands, one unit, so the wide quota gets
/// that unit back and no more. (Crediting a booking clamped to the narrow
/// bucket gave the wide quota about 38 units back.)
async fn gcra_a_refund_never_frees_a_wider_booking(b: Backend) {
    let quota = |burst| Quota::per_second(5).gcra(burst).unwrap();
    let narrow = b
        .builder_for(quota(3))
        .name("g")
        .deny_cache(0)
        .build()
        .unwrap();
    let wide = b
        .builder_for(quota(50))
        .name("g")
        .share_counters()
        .deny_cache(0)
        .build()
        .unwrap();
    let spent = narrow.check("k", 1).await.unwrap();
    assert!(spent.is_allowed(), "{spent:?}");
    // 41 units booked, 8.2 s: 9 more fit the wide bucket of 10 s.
    assert_eq!(admitted(&wide, "k", 40).await, 40);
    narrow.refund("k", &spent).await.unwrap();
    // 10 then, and one more if a unit (200 ms) drained meanwhile.
    let more = admitted(&wide, "k", 20).await;
    assert!((10..=11).contains(&more), "{more}");
    assert_ttls(&b).await;
}

/// "5/2s": one request opens the window, four more come at 1.7 s and five
/// at 2.2 s. A fixed window admits all nine of the last within 0.5 s; the
/// sliding window stays within its bound, 5 × (1 + 0.5 / 2) = 6.
async fn sliding_window_bounds_the_boundary_burst(b: Backend) {
    let fixed = b.builder("5/2s").name("fixed").build().unwrap();
    let quota = "5/2s".parse::<Quota>().unwrap().sliding_window();
    let sliding = b.builder_for(quota).name("sliding").build().unwrap();
    let (mut fixed_late, mut sliding_late) = (0, 0);
    for (limiter, late) in [(&fixed, &mut fixed_late), (&sliding, &mut sliding_late)] {
        assert_eq!(admitted(limiter, "k", 1).await, 1);
        sleep(ms(1700)).await;
        *late += admitted(limiter, "k", 4).await;
        sleep(ms(500)).await;
        *late += admitted(limiter, "k", 5).await;
    }
    assert_eq!(fixed_late, 9, "a fixed window admits 2 x limit - 1 here");
    assert!(
        sliding_late <= 6,
        "sliding admitted {sliding_late} in 0.5 s"
    );
    // Ideally 4 (none after the boundary); a late scheduler can let one in.
    assert_ttls(&b).await;
}

/// The sliding window tells a denied request when its cost fits, and a
/// request at that time is admitted.
async fn sliding_window_retry_after_is_honest(b: Backend) {
    let quota = "4/1s".parse::<Quota>().unwrap().sliding_window();
    let limiter = b.builder_for(quota).build().unwrap();
    assert_eq!(admitted(&limiter, "k", 4).await, 4);
    let denied = limiter.check("k", 1).await.unwrap();
    // The count moves to the previous window at 1 s and weighs 4 × 0.75 = 3
    // at 1.25 s, when one unit fits.
    let wait = denied.retry_after().unwrap();
    assert!((1150..=1250).contains(&wait.as_millis()), "{denied:?}");
    sleep(wait - ms(200)).await;
    assert!(!limiter.check("k", 1).await.unwrap().is_allowed());
    sleep(ms(220)).await;
    let d = limiter.check("k", 1).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");
    assert_ttls(&b).await;
}

/// Costs are spent exactly in every algorithm; a cost above the capacity is
/// an error that spends nothing.
async fn costs_are_exact_in_every_algorithm(b: Backend) {
    let quotas = [
        Quota::per_minute(10),
        Quota::per_minute(10).sliding_window(),
        Quota::per_minute(10).gcra(10).unwrap(),
    ];
    for quota in quotas {
        let limiter = b.builder_for(quota).build().unwrap();
        let spend = |cost| limiter.check("k", cost);
        let what = format!("{:?}", quota.algorithm());
        assert_eq!(spend(3).await.unwrap().remaining(), 7, "{what}");
        assert_eq!(spend(3).await.unwrap().remaining(), 4, "{what}");
        assert_eq!(spend(3).await.unwrap().remaining(), 1, "{what}");
        let denied = spend(3).await.unwrap();
        assert!(!denied.is_allowed(), "{what}");
        assert_eq!(denied.remaining(), 1, "{what}: a denial spent");
        assert_eq!(
            spend(0).await.unwrap().remaining(),
            1,
            "{what}: a peek spent"
        );
        assert_eq!(spend(1).await.unwrap().remaining(), 0, "{what}");
        let err = spend(11).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::CostExceedsLimit {
                    cost: 11,
                    limit: 10
                }
            ),
            "{err}"
        );
    }
    assert_ttls(&b).await;
}

/// A cost that can never fit, asked of the store itself (the `Limiter`
/// refuses it before: `Error::CostExceedsLimit`): a denial that spends
/// nothing, with a finite wait, in every algorithm, on an empty key and on
/// one with counts; never an overflow, an infinite wait or a bad reply.
async fn a_cost_beyond_the_limit_is_a_finite_denial_from_the_store(b: Backend) {
    let store: std::sync::Arc<dyn redis_ratelimit::Store> = match &b {
        Backend::Memory(m) => std::sync::Arc::new(m.clone()),
        Backend::Redis(_, r) => std::sync::Arc::new(r.clone()),
    };
    let window = 60_000;
    for quota in [
        Quota::per_minute(5),
        Quota::per_minute(5).sliding_window(),
        Quota::per_minute(5).gcra(5).unwrap(),
    ] {
        let name = format!("{:?}", quota.algorithm());
        let check = |key: &str| {
            vec![redis_ratelimit::LimitCheck {
                key: format!("huge:{name}:{key}"),
                quota,
                shadow: false,
            }]
        };
        let spent = store.decide(check("counted"), 3).await.unwrap();
        assert!(spent[0].allowed, "{name}: {spent:?}");
        for key in ["empty", "counted"] {
            let max = redis_ratelimit::quota::MAX_LIMIT;
            for cost in [6, 1_000, max, max + 1, (1 << 53) - 1, u64::MAX] {
                let states = match store.decide(check(key), cost).await {
                    // Redis counts in Lua's doubles: the store refuses a
                    // cost past any limit outright.
                    Err(e) if cost > max && b.server().is_some() => {
                        assert!(
                            matches!(e, redis_ratelimit::Error::CostExceedsLimit { .. }),
                            "{name} {key}: {e}"
                        );
                        continue;
                    }
                    states => states.unwrap_or_else(|e| panic!("{name} {key} {cost}: {e}")),
                };
                let state = &states[0];
                assert!(!state.allowed, "{name} {key} {cost}: {state:?}");
                assert!(
                    (1..=2 * window).contains(&state.retry_ms),
                    "{name} {key} {cost}: {state:?}"
                );
            }
        }
        // Nothing was spent by the denials, and the 3 spent are still
        // counted: 2 more fit in the counted key, and no more. A cost of
        // 2^53 - 1 on Redis once read as a corrupt count (INCRBY's reply,
        // 2^53 + 2, past 2^53), and the denial deleted the counter.
        let left = store.decide(check("counted"), 2).await.unwrap();
        assert!(
            left[0].allowed && left[0].remaining == 0,
            "{name}: {left:?}"
        );
    }
    assert_ttls(&b).await;
}

/// A client that retries a fixed window's denial when told is admitted:
/// no request sent after a denial's retry time is denied. Fails on Redis
/// with the wait said as the counter's PTTL: Redis keeps a key through the
/// ms its expiry names, so a counter lived 1 ms past the wait it reported
/// (a window of `window_ms + 1` ticks, where the memory store's is
/// `window_ms`), and a retry in that ms was denied once more.
async fn a_fixed_windows_retry_after_is_never_early(b: Backend) {
    let limiter = b
        .builder("1/20ms")
        .name("early")
        .deny_cache(0)
        .build()
        .unwrap();
    // Denials that came while an earlier one's retry time still ran.
    let mut checked = 0;
    for round in 0..20 {
        let key = format!("k{round}");
        assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
        let mut by: Option<std::time::Instant> = None;
        loop {
            let sent = std::time::Instant::now();
            // Peeks (a look) and checks (a spend, decide_fixed.lua's
            // inline path on Redis) in turn.
            let d = match round % 2 {
                0 => limiter.peek(&key, 1).await.unwrap(),
                _ => limiter.check(&key, 1).await.unwrap(),
            };
            if d.is_allowed() {
                break;
            }
            if let Some(by) = by {
                assert!(
                    sent < by,
                    "round {round}: denied {:?} after its retry time",
                    sent - by
                );
                checked += 1;
            }
            let at = std::time::Instant::now() + d.retry_after().unwrap();
            by = Some(by.map_or(at, |by| by.min(at)));
        }
    }
    assert!(checked > 0, "no denial came within another's retry time");
}

support::for_every_store!(
    a_fixed_windows_retry_after_is_never_early,
    a_cost_beyond_the_limit_is_a_finite_denial_from_the_store,
    gcra_admits_the_burst_then_one_per_interval,
    gcra_obeys_a_booking_beyond_a_lowered_burst,
    gcra_a_refund_never_frees_a_wider_booking,
    sliding_window_bounds_the_boundary_burst,
    sliding_window_retry_after_is_honest,
    costs_are_exact_in_every_algorithm,
);

/// Steps of a parity run: wait, then spend `cost` for `key`.
const STEPS: &[(u64, u64, &str)] = &[
    (0, 1, "a"),
    (0, 2, "a"),
    (0, 1, "b"),
    (300, 1, "a"),
    (0, 3, "a"),
    (0, 1, "a"),
    (450, 2, "a"),
    (0, 1, "b"),
    (700, 1, "a"),
    (0, 1, "a"),
    (0, 2, "b"),
    (1300, 4, "a"),
    (0, 1, "a"),
    (350, 1, "a"),
];

/// Runs [`STEPS`] on a memory and a Redis limiter side by side (each step
/// within a few ms on both) and compares every decision.
async fn parity(limits: &[(&str, Quota)], redis: &RedisServer) {
    let build = |store: Box<
        dyn FnOnce(redis_ratelimit::LimiterBuilder) -> redis_ratelimit::LimiterBuilder,
    >| {
        let mut builder = Limiter::builder(limits[0].1).name(limits[0].0);
        for (name, quota) in &limits[1..] {
            builder = builder.limit(*name, *quota);
        }
        // The stores' own answers: no deny cache (the memory store has none),
        // whose repeated denials carry the other limits' states as they were.
        store(builder)
            .deny_cache(0)
            .timeout(support::TEST_TIMEOUT)
            .build()
            .unwrap()
    };
    let memory = build(Box::new(|b| b.store(MemoryStore::new())));
    let store = redis.store().await;
    let redis_limiter = build(Box::new(move |b| b.store(store)));
    for (i, &(wait, cost, key)) in STEPS.iter().enumerate() {
        sleep(ms(wait)).await;
        let m = memory.check(key, cost).await.unwrap();
        let r = redis_limiter.check(key, cost).await.unwrap();
        let context = format!("step {i} ({cost} for {key}):\nmemory {m:?}\nredis  {r:?}");
        assert_eq!(m.is_allowed(), r.is_allowed(), "{context}");
        for (lm, lr) in m.limits().zip(r.limits()) {
            assert_eq!(lm.is_allowed(), lr.is_allowed(), "{context}");
            assert_eq!(lm.remaining(), lr.remaining(), "{context}");
            let close = |a: Duration, b: Duration| a.abs_diff(b) <= ms(60);
            assert!(close(lm.reset_after(), lr.reset_after()), "{context}");
            let (wm, wr) = (lm.retry_after(), lr.retry_after());
            assert!(
                close(wm.unwrap_or_default(), wr.unwrap_or_default()),
                "{context}"
            );
        }
    }
    redis.assert_every_key_has_ttl().await;
}

#[tokio::test]
async fn memory_and_redis_agree_on_fixed_windows() {
    parity(&[("fw", "5/1s".parse().unwrap())], &RedisServer::start()).await;
}

#[tokio::test]
async fn memory_and_redis_agree_on_sliding_windows() {
    let quota = "5/1s".parse::<Quota>().unwrap().sliding_window();
    parity(&[("sw", quota)], &RedisServer::start()).await;
}

#[tokio::test]
async fn memory_and_redis_agree_on_gcra() {
    let quota = "3/1s".parse::<Quota>().unwrap().gcra(4).unwrap();
    parity(&[("gcra", quota)], &RedisServer::start()).await;
}

/// Fixed windows only, so Redis runs the fast-path script: a step that one
/// limit denies must be
/// taken back in the other, as the memory store never spends it.
#[tokio::test]
async fn memory_and_redis_agree_on_several_fixed_windows() {
    let limits = [
        ("fw", "6/1s".parse().unwrap()),
        ("small", "4/2s".parse().unwrap()),
    ];
    parity(&limits, &RedisServer::start()).await;
}

#[tokio::test]
async fn memory_and_redis_agree_on_several_limits_at_once() {
    let limits = [
        ("fw", "6/1s".parse().unwrap()),
        ("sw", "8/2s".parse::<Quota>().unwrap().sliding_window()),
        ("gcra", "4/1s".parse::<Quota>().unwrap().gcra(5).unwrap()),
    ];
    parity(&limits, &RedisServer::start()).await;
}

/// GCRA at the edges of what `Quota::gcra` accepts: whole intervals (1 µs
/// at 1000/1ms), fractional ones (999/1ms is 1.001 µs, 3/1s 333 333.3 µs),
/// the longest window, and bursts at the exact-arithmetic bound (`1/366d`
/// with a burst of 142).
const EDGES: [(&str, u64); 13] = [
    ("1000/1ms", 10),
    ("1000/1ms", 1),
    ("999/1ms", 10),
    ("999/1ms", 1),
    ("1/1ms", 1),
    ("7/1ms", 5),
    ("3/1s", 3),
    ("3/1s", 1),
    ("7/1h", 7),
    ("999983/1d", 100),
    ("31622400000000/366d", 4),
    ("31622399999999/366d", 3),
    ("1/366d", 142),
];

/// `n` requests of cost 1 on `key` in one DECIDE_LUA call (one Redis
/// instant), under `q`: the reply, per request allowed, then allowed,
/// remaining, reset, retry.
async fn decide_at_one_instant(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    q: Quota,
    n: u64,
) -> redis::RedisResult<support::Reply> {
    let burst = q.capacity();
    let decide = redis::Script::new(redis_ratelimit::store::DECIDE_LUA);
    let mut script = decide.prepare_invoke();
    script.arg(n);
    for _ in 0..n {
        script.key(key);
        let request = [1, 1, 3, q.limit(), q.window_ms(), burst, 0];
        script.arg(&request[..]);
    }
    let reply: support::Reply = script.invoke_async(conn).await?;
    Ok(support::Reply(reply.decided(true)))
}

fn admitted_in(reply: &support::Reply) -> u64 {
    reply.0.chunks(5).map(|r| r[0] as u64).sum()
}

/// A sliding-window hash whose fields are not whole numbers from 0 up (a
/// negative count, which would lift the limit, text, NaN, infinity, a
/// fraction) is reset, never obeyed: at one Redis instant the key admits
/// exactly its limit. Stored fields are parsed leniently ("1e3" is 1000),
/// but only to a whole number from 0 to 2^53.
#[tokio::test]
async fn sliding_window_resets_fields_that_are_not_whole_counts() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let time: (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now_ms = (time.0 * 1_000_000 + time.1) / 1000;
    let decide = redis::Script::new(redis_ratelimit::store::DECIDE_LUA);
    for (field, value) in [
        ("c", "-100"),
        ("p", "-100"),
        ("c", "x"),
        ("s", "nan"),
        ("p", "inf"),
        ("c", "1.5"),
    ] {
        let mut fields = vec![
            ("s", now_ms.to_string()),
            ("c", "0".into()),
            ("p", "0".into()),
        ];
        fields.retain(|(f, _)| *f != field);
        fields.push((field, value.into()));
        let _: () = redis::cmd("DEL")
            .arg("k")
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: () = conn.hset_multiple("k", &fields).await.unwrap();
        let _: () = conn.pexpire("k", 60_000).await.unwrap();
        let mut script = decide.prepare_invoke();
        script.arg(5);
        for _ in 0..5 {
            script.key("k");
            script.arg(&[1, 1, 2, 3, 10_000, 0, 0][..]);
        }
        let reply: support::Reply = script.invoke_async(&mut conn).await.unwrap();
        let reply = support::Reply(reply.decided(false));
        assert_eq!(admitted_in(&reply), 3, "{field} = {value}: {:?}", reply.0);
    }
    server.assert_every_key_has_ttl().await;
}

/// One call whose requests alternate between GCRA quotas that differ in one
/// field each (the burst, the window): the script keeps a batch's last
/// shape from request to request, and each request still gets its own
/// quota's. At one Redis instant each key admits exactly its own burst.
#[tokio::test]
async fn gcra_requests_of_alternating_quotas_in_one_call_each_get_their_own() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let quotas = [("10/1s", 3, "a"), ("10/1s", 5, "b"), ("10/2s", 3, "c")];
    let decide = redis::Script::new(redis_ratelimit::store::DECIDE_LUA);
    let mut script = decide.prepare_invoke();
    let rounds = 12;
    script.arg(rounds * quotas.len());
    for _ in 0..rounds {
        for (text, burst, key) in quotas {
            let q = text.parse::<Quota>().unwrap().gcra(burst).unwrap();
            script.key(key);
            script.arg(&[1, 1, 3, q.limit(), q.window_ms(), q.capacity(), 0][..]);
        }
    }
    let reply: support::Reply = script.invoke_async(&mut conn).await.unwrap();
    let reply = reply.decided(true);
    for (i, (text, burst, key)) in quotas.into_iter().enumerate() {
        let admitted: u64 = reply
            .chunks(5)
            .skip(i)
            .step_by(quotas.len())
            .map(|r| r[0] as u64)
            .sum();
        assert_eq!(admitted, burst, "{key}: {text} with a burst of {burst}");
    }
    server.assert_every_key_has_ttl().await;
}

/// GCRA in Redis: `2 * burst + 10` requests in one script call, so at one
/// Redis instant, admit exactly `burst` (the bucket holds `burst` units and
/// none refills within an instant), whether the interval is a whole number
/// of microseconds or not. 1000/1ms with a burst of 10 once admitted all 30:
/// its 1 µs tolerance let a clamped, full bucket fit one more unit each time.
/// The memory store's twins are `gcra_admits_exactly_the_burst_at_every_edge_quota`
/// and `gcra_matches_exact_rational_gcra_over_a_long_run` in
/// src/store/memory/algorithms.rs, where its clock can be held still.
#[tokio::test]
async fn gcra_batch_at_one_instant_admits_exactly_the_burst_at_edge_quotas() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let mut read = 0;
    for (i, (text, burst)) in EDGES.into_iter().enumerate() {
        let q = text.parse::<Quota>().unwrap().gcra(burst).unwrap();
        let key = format!("edge{i}");
        let reply = decide_at_one_instant(&mut conn, &key, q, 2 * burst + 10)
            .await
            .unwrap();
        assert_eq!(
            admitted_in(&reply),
            burst,
            "{text} burst {burst}: {:?}",
            reply.0
        );
        // The TAT is stored exactly: "a:b", b in units of 1/per_us µs. A
        // key whose whole burst lasts a millisecond or two may have expired
        // by the time a loaded machine reads it; most edges last longer.
        let stored: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        if let Some(stored) = stored {
            let (a, b) = stored.split_once(':').unwrap_or_else(|| panic!("{stored}"));
            assert!(
                a.parse::<u64>().is_ok() && b.parse::<u64>().is_ok(),
                "{stored}"
            );
            read += 1;
        }
    }
    // Seven edges keep their TAT for a third of a second or more.
    assert!(read >= 7, "only {read} TATs were read");
    server.assert_every_key_has_ttl().await;
}

/// A GCRA limiter ("3/1s", a burst of 3) on `server`, the store key of its
/// client "c", and a value for it that books the bucket a year ahead of
/// Redis's clock.
async fn booked_a_year_ahead(server: &RedisServer) -> (Limiter, String, String) {
    let q = "3/1s".parse::<Quota>().unwrap().gcra(3).unwrap();
    let limiter = Limiter::builder(q)
        .store(server.store().await)
        .deny_cache(0)
        .timeout(support::TEST_TIMEOUT)
        .build()
        .unwrap();
    let key = limiter.store_key("c");
    let mut conn = server.conn().await;
    let time: (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let far = format!("{}:0", time.0 * 1_000_000 + time.1 + 31_536_000_000_000);
    (limiter, key, far)
}

/// A GCRA value booked far ahead (corrupt, or a wider quota's) is obeyed
/// but lasts no longer than its key: the waits a denial tells are capped by
/// the key's TTL, and a key without one is given a full bucket's (1 s for
/// "3/1s" with a burst of 3), so no value wedges a client.
#[tokio::test]
async fn gcra_a_booking_far_ahead_waits_no_longer_than_its_key_lives() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let (limiter, key, far) = booked_a_year_ahead(&server).await;
    let set = |px: Option<u64>| {
        let mut cmd = redis::cmd("SET");
        cmd.arg(&key).arg(&far);
        if let Some(px) = px {
            cmd.arg("PX").arg(px);
        }
        cmd
    };
    let _: () = set(Some(1500)).query_async(&mut conn).await.unwrap();
    let d = limiter.check("c", 1).await.unwrap();
    assert!(!d.is_allowed(), "{d:?}");
    // A PTTL of 1500 lives through that ms: 1501 at most.
    assert!(d.retry_after().unwrap() <= ms(1501), "{d:?}");
    assert!(d.reset_after() <= ms(1501), "{d:?}");
    let _: () = set(None).query_async(&mut conn).await.unwrap();
    let d = limiter.check("c", 1).await.unwrap();
    assert!(!d.is_allowed(), "{d:?}");
    assert!(d.retry_after().unwrap() <= ms(1000), "{d:?}");
    let ttl: i64 = conn.pttl(&key).await.unwrap();
    assert!((0..=999).contains(&ttl), "{ttl}");
    // Healed to be gone by the time it told (a PTTL of k lives k + 1 ms).
    let told = d.retry_after().unwrap().as_millis() as i64;
    assert!(ttl < told, "PTTL {ttl} after a wait of {told} ms");
    server.assert_every_key_has_ttl().await;
}

/// A TAT stored by the previous version, a float of microseconds, is read
/// (rounded up to a whole microsecond), not reset, so a rolling deploy keeps
/// every bucket; so is a remainder from another limit (rounded up). What is
/// neither format is corrupt: deleted, and the key starts afresh.
#[tokio::test]
async fn gcra_reads_the_previous_float_format_and_resets_only_corrupt_values() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    // 3/1s: one unit per 333 333 1/3 µs; a burst of 3 is 1 s.
    let q = "3/1s".parse::<Quota>().unwrap().gcra(3).unwrap();
    let time: (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now = time.0 * 1_000_000 + time.1;
    // Two units spent: the TAT 666 666 2/3 µs ahead, in every format that
    // reads as (at most 1/3 µs later than) that.
    let tat = now + 666_666;
    for stored in [
        format!("{tat}.66666667"),
        format!("{tat}.5"),
        format!("{}", tat + 1),
        format!("{}:7", tat),
        format!("{tat}:2"),
    ] {
        let _: () = redis::cmd("SET")
            .arg("k")
            .arg(&stored)
            .arg("PX")
            .arg(5000)
            .query_async(&mut conn)
            .await
            .unwrap();
        let reply = decide_at_one_instant(&mut conn, "k", q, 3).await.unwrap();
        assert_eq!(admitted_in(&reply), 1, "{stored}: {:?}", reply.0);
        let now: String = redis::cmd("GET")
            .arg("k")
            .query_async(&mut conn)
            .await
            .unwrap();
        let expected = match stored.as_str() {
            s if s.ends_with(":2") => format!("{}:0", tat + 333_334),
            _ => format!("{}:1", tat + 1 + 333_333),
        };
        assert_eq!(now, expected, "{stored}");
    }
    for corrupt in [
        "garbage", "1:x", "-5", ":", "1:2:3", "nan", "inf", "1e300", "1:-1",
    ] {
        let _: () = redis::cmd("SET")
            .arg("k")
            .arg(corrupt)
            .arg("PX")
            .arg(5000)
            .query_async(&mut conn)
            .await
            .unwrap();
        let reply = decide_at_one_instant(&mut conn, "k", q, 5).await.unwrap();
        assert_eq!(admitted_in(&reply), 3, "{corrupt}: {:?}", reply.0);
    }
    server.assert_every_key_has_ttl().await;
}

/// The script refuses a GCRA quota it cannot count exactly (what
/// `Quota::gcra` rejects: `1/366d` with a burst of 143) with an error, and
/// writes nothing.
#[tokio::test]
async fn gcra_script_refuses_a_quota_it_cannot_count_exactly() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let q = "1/366d".parse::<Quota>().unwrap();
    let err = q.gcra(143).unwrap_err();
    assert!(
        err.to_string().contains("lower the burst or the window"),
        "{err}"
    );
    let ok = q.gcra(142).unwrap();
    // The same arguments, with the burst one above the bound.
    let decide = redis::Script::new(redis_ratelimit::store::DECIDE_LUA);
    let mut script = decide.prepare_invoke();
    script.arg(1).key("k");
    script.arg(&[1, 1, 3, ok.limit(), ok.window_ms(), 143, 0][..]);
    let res: redis::RedisResult<support::Reply> = script.invoke_async(&mut conn).await;
    let e = res.unwrap_err();
    assert!(
        e.to_string().contains("decide: request 1, limit 1: bad"),
        "{e}"
    );
    let exists: u64 = redis::cmd("EXISTS")
        .arg("k")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 0);
    let reply = decide_at_one_instant(&mut conn, "k", ok, 150)
        .await
        .unwrap();
    assert_eq!(admitted_in(&reply), 142);
}

/// The memory store over a long run on tokio's paused clock (its clock),
/// stepping to 1 µs before and exactly at each instant exact GCRA first fits
/// the next request: every decision is exact rational GCRA's, computed here
/// in integers (the TAT times the limit, in µs).
#[tokio::test(start_paused = true)]
async fn gcra_memory_store_matches_exact_gcra_on_a_held_clock() {
    for (text, burst) in [("999/1ms", 10), ("3/1s", 3), ("7/1h", 7), ("1000/1ms", 5)] {
        let q = text.parse::<Quota>().unwrap().gcra(burst).unwrap();
        let limiter = Limiter::builder(q)
            .store(MemoryStore::new())
            .build()
            .unwrap();
        let (limit, window_us) = (u128::from(q.limit()), u128::from(q.window_ms()) * 1000);
        let cap = u128::from(burst) * window_us;
        let (mut tat_l, mut now) = (0_u128, 0_u128);
        let mut admits = 0;
        for step in 0..600 {
            // The first whole µs at which one more unit fits, or 1 µs before.
            let fits_at = (tat_l + window_us).saturating_sub(cap).div_ceil(limit);
            let at = (fits_at - u128::from(step % 2 == 0 && fits_at > 0)).max(now);
            tokio::time::advance(Duration::from_micros((at - now) as u64)).await;
            now = at;
            let ahead = tat_l.max(now * limit) - now * limit;
            let exact = ahead + window_us <= cap;
            let d = limiter.check("k", 1).await.unwrap();
            assert_eq!(d.is_allowed(), exact, "{text}: step {step} at {now} µs");
            if exact {
                tat_l = now * limit + ahead + window_us;
                admits += 1;
            }
        }
        assert!(admits >= 300, "{text}: {admits}");
    }
}

/// A booking written by a quota of another rate on a shared counter (a
/// named limit whose quota changed, during a deploy) is read as the script
/// reads it: to the whole µs, rounded up where the remainder is not below
/// the reader's `per_us` (and, as the script's, up to 1 µs early where it
/// is). The memory store kept the TAT's distance below its expiry's whole
/// ms in the writer's units and read it in the reader's, clamped below a
/// ms: a reader of 1/s read a 3/s booking up to 1 ms early and admitted at
/// 333,333 µs, where the TAT is 333,333⅓ µs and the script (which keeps
/// whole µs and a remainder it rounds up) denies.
#[tokio::test(start_paused = true)]
async fn gcra_a_booking_of_another_rate_is_read_as_the_script_reads_it() {
    let store = MemoryStore::new();
    let limiter = |per_second| {
        Limiter::builder(Quota::per_second(per_second).gcra(1).unwrap())
            .store(store.clone())
            .name("g")
            .share_counters()
            .deny_cache(0)
            .build()
            .unwrap()
    };
    let (writer, reader) = (limiter(3), limiter(1));
    // From a whole ms of the store's clock, so the booking ends 2/3 of a
    // ms before its expiry's whole ms.
    tokio::time::advance(Duration::from_millis(5)).await;
    assert!(writer.check("k", 1).await.unwrap().is_allowed());
    tokio::time::advance(Duration::from_micros(333_333)).await;
    let d = reader.check("k", 1).await.unwrap();
    assert!(!d.is_allowed(), "read before the booking ends: {d:?}");
    tokio::time::advance(Duration::from_micros(1)).await;
    let d = reader.check("k", 1).await.unwrap();
    assert!(d.is_allowed(), "once it has: {d:?}");
}

/// A GCRA key must outlive its TAT: once it is gone the bucket reads as
/// full, so a key that vanished early would admit early. Redis counts `PX`
/// from its millisecond clock, up to 1 ms behind `TIME`'s microseconds, so a
/// `PX` of the TAT's distance rounded up could still end before the TAT.
/// Spends on many keys land at every sub-millisecond phase; each key's
/// `PEXPIRETIME` must be at or after its stored TAT.
#[tokio::test]
async fn gcra_keys_never_expire_before_their_tat() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    // Fractional intervals, with TATs long enough ahead to read back.
    for text in ["3/1s", "7/1s"] {
        let q = text.parse::<Quota>().unwrap().gcra(3).unwrap();
        for i in 0..200 {
            let key = format!("{text}:{i}");
            let reply = decide_at_one_instant(&mut conn, &key, q, 1).await.unwrap();
            assert_eq!(admitted_in(&reply), 1, "{key}");
            let stored: String = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            let (whole, part) = stored.split_once(':').expect("a:b");
            let tat_us = whole.parse::<u64>().unwrap() + u64::from(part != "0");
            let expires_ms: i64 = redis::cmd("PEXPIRETIME")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert!(expires_ms > 0, "{key}: PEXPIRETIME {expires_ms}");
            assert!(
                expires_ms as u64 * 1000 >= tat_us,
                "{key}: expires at {expires_ms} ms, before its TAT {tat_us} µs ({stored})"
            );
        }
    }
}

/// Fails with a booking's wait capped by the key's bare PTTL: in its last
/// ms (PTTL 0) the cap was dropped and the wait was the whole booking, a
/// year; and a PTTL of k said k, though the key lives through that ms.
#[tokio::test]
async fn gcra_a_booking_in_its_keys_last_milliseconds_waits_no_longer_than_the_key() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let (limiter, key, far) = booked_a_year_ahead(&server).await;
    let mut denials = 0;
    // The check lands anywhere in the key's 3 ms, its last one included.
    for i in 0..300u64 {
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(&far)
            .arg("PX")
            .arg(2)
            .query_async(&mut conn)
            .await
            .unwrap();
        std::thread::sleep(Duration::from_micros(i * 37 % 3200));
        let d = limiter.check("c", 1).await.unwrap();
        if let Some(wait) = d.retry_after() {
            denials += 1;
            assert!(wait <= ms(3), "{i}: {d:?}");
        }
    }
    assert!(denials > 100, "{denials} denials");
    server.assert_every_key_has_ttl().await;
}
