//! The seed incidents, reproduced against a real Redis: a counter left with no
//! TTL, and keys that other (naive or broken) clients left behind.

mod support;

use std::time::Duration;

use redis::AsyncCommands;
use redis_ratelimit::{Limiter, Quota};
use support::RedisServer;

const LIMIT: i64 = 3;

/// The naive limiter: `SET key LIMIT PX window NX`, then — after the request
/// did its (slow) work — `DECR key`; a negative result means "denied".
async fn naive_request(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    window: Duration,
    slow_downstream: Duration,
) -> bool {
    let _: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(LIMIT)
        .arg("PX")
        .arg(window.as_millis() as u64)
        .arg("NX")
        .query_async(conn)
        .await
        .unwrap();
    tokio::time::sleep(slow_downstream).await;
    let left: i64 = conn.decr(key, 1).await.unwrap();
    left >= 0
}

/// The incident: the window (5 ms) passes between `SET NX` and `DECR`, as when
/// a downstream call is slow, so `DECR` recreates the key with no TTL. From
/// then on the key never expires and every request is denied, forever.
#[tokio::test]
async fn naive_set_nx_decr_leaves_a_key_without_ttl_that_blocks_forever() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let window = Duration::from_millis(5);

    // One slow request: the key expires before its DECR.
    naive_request(&mut conn, "naive", window, Duration::from_millis(30)).await;
    let ttl: i64 = conn.pttl("naive").await.unwrap();
    assert_eq!(ttl, -1, "DECR recreated the key without a TTL");

    // Every later request, in any later window, is denied.
    for _ in 0..10 {
        tokio::time::sleep(window * 3).await;
        assert!(!naive_request(&mut conn, "naive", window, Duration::ZERO).await);
    }
    let ttl: i64 = conn.pttl("naive").await.unwrap();
    assert_eq!(
        ttl,
        -1,
        "still no TTL: the client is wedged\n{}",
        server.log()
    );
}

/// The same load through our script: slow requests, a 5 ms window. No key is
/// ever left without a TTL, and every new window admits again.
#[tokio::test]
async fn our_script_under_the_same_load_keeps_ttls_and_admits_every_window() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let store = server.store().await;
    let limiter = Limiter::builder("3/5ms".parse().unwrap())
        .store(store)
        .build()
        .unwrap();
    let key = limiter.store_key("client");

    for round in 0..20 {
        // Each round starts after the previous window has surely expired.
        tokio::time::sleep(Duration::from_millis(25)).await;
        let first = limiter.check("client", 1).await.unwrap();
        assert!(
            first.is_allowed(),
            "round {round}: a new window must admit: {first:?}"
        );
        // A slow downstream call, then more requests.
        tokio::time::sleep(Duration::from_millis(10)).await;
        for _ in 0..5 {
            limiter.check("client", 1).await.unwrap();
            let ttl: i64 = conn.pttl(&key).await.unwrap();
            assert!(
                ttl != -1,
                "round {round}: key left without TTL\n{}",
                server.log()
            );
        }
    }
    server.assert_every_key_has_ttl().await;
}

/// A counter planted without a TTL (by `INCR` whose `EXPIRE` never ran, or the
/// naive limiter above) is healed by the next decision rather than honoured
/// forever.
#[tokio::test]
async fn key_planted_without_ttl_is_healed_by_the_next_decision() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let limiter = server.limiter("3/1s").await;
    let key = limiter.store_key("victim");
    let _: () = conn.set(&key, 1_000).await.unwrap(); // way over, no TTL

    let d = limiter.check("victim", 1).await.unwrap();
    assert!(!d.is_allowed());
    let ttl: i64 = conn.pttl(&key).await.unwrap();
    assert!((1..=1000).contains(&ttl), "not healed: PTTL {ttl}");
    assert!(d.retry_after().unwrap() <= Duration::from_secs(1));

    tokio::time::sleep(d.retry_after().unwrap() + Duration::from_millis(250)).await;
    let d = limiter.check("victim", 1).await.unwrap();
    assert!(
        d.is_allowed(),
        "the victim is admitted again after one window: {d:?}"
    );
    assert_eq!(d.remaining(), 2);
}

/// Garbage under our key (a non-number, a negative count, the wrong type, a
/// TTL far longer than the window) never wedges the client.
#[tokio::test]
async fn corrupt_keys_are_reset_not_obeyed() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let limiter = server.limiter("3/10s").await;

    let key = limiter.store_key("text");
    let _: () = conn.set(&key, "garbage").await.unwrap();
    assert_eq!(limiter.check("text", 1).await.unwrap().remaining(), 2);

    let key = limiter.store_key("negative");
    let _: () = conn.set(&key, -5).await.unwrap();
    assert_eq!(limiter.check("negative", 1).await.unwrap().remaining(), 2);

    let key = limiter.store_key("hash");
    let _: () = conn.hset(&key, "f", "v").await.unwrap();
    assert_eq!(limiter.check("hash", 1).await.unwrap().remaining(), 2);

    let key = limiter.store_key("long-ttl");
    let _: () = conn.set_ex(&key, 3, 86_400).await.unwrap();
    let d = limiter.check("long-ttl", 1).await.unwrap();
    assert!(!d.is_allowed());
    assert!(d.reset_after() <= Duration::from_secs(10), "{d:?}");
    let ttl: i64 = conn.pttl(&key).await.unwrap();
    assert!(
        (1..=10_000).contains(&ttl),
        "TTL not capped to the window: {ttl}"
    );

    server.assert_every_key_has_ttl().await;
}

/// A sliding-window or GCRA key whose TTL was removed (PERSIST) gets one
/// back from the next check, whether that check spends, only looks, or is
/// denied (the scripts heal after deciding, so that a spend stays their
/// first write).
#[tokio::test]
async fn ttl_less_sliding_and_gcra_keys_are_healed() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    for quota in [
        "2/1m".parse::<Quota>().unwrap().sliding_window(),
        "2/1m".parse::<Quota>().unwrap().gcra(2).unwrap(),
    ] {
        let limiter = Limiter::builder(quota)
            .store(server.store().await)
            .deny_cache(0)
            .build()
            .unwrap();
        let key = limiter.store_key("k");
        assert!(limiter.check("k", 1).await.unwrap().is_allowed());
        for (cost, allowed) in [(0, true), (1, true), (1, false)] {
            let persisted: bool = conn.persist(&key).await.unwrap();
            assert!(persisted, "{quota:?}: the key had no TTL to remove");
            let d = limiter.check("k", cost).await.unwrap();
            assert_eq!(d.is_allowed(), allowed, "{quota:?} cost {cost}: {d:?}");
            let ttl: i64 = conn.pttl(&key).await.unwrap();
            assert!(
                (1..=2 * 60_000).contains(&ttl),
                "{quota:?} cost {cost}: TTL {ttl}"
            );
        }
    }
    server.assert_every_key_has_ttl().await;
}

/// The fixed-window script spends first and takes the spend back when a
/// request is denied. A denial must leave every counter and TTL as it was,
/// and create nothing: not for a cost beyond the limit, not for a fresh key
/// of a limit that admitted while another denied, not for a peek.
#[tokio::test]
async fn denied_fixed_window_requests_leave_no_trace() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let limiter = server.limiter("3/10s").await;

    // The limiter refuses such a cost itself; the script must cope too.
    let huge: support::Reply = redis::Script::new(redis_ratelimit::store::DECIDE_FIXED_LUA)
        .key("huge")
        .arg(&["1", "3", "10000", "0", "1", "1", "5", "1", "1"][..])
        .invoke_async(&mut conn)
        .await
        .unwrap();
    // Denied, 3 left: -1 - 3; the window (10 s) until it resets.
    assert_eq!(huge.0, [-4, 10_000]);
    let exists: bool = conn.exists("huge").await.unwrap();
    assert!(!exists, "a cost beyond the limit created its key");

    let peek = limiter.check("peek", 0).await.unwrap();
    assert!(peek.is_allowed());
    let exists: bool = conn.exists(limiter.store_key("peek")).await.unwrap();
    assert!(!exists, "a peek created its key");

    assert!(limiter.check("k", 2).await.unwrap().is_allowed());
    let key = limiter.store_key("k");
    let ttl_before: i64 = conn.pttl(&key).await.unwrap();
    let d = limiter.check("k", 2).await.unwrap();
    assert!(!d.is_allowed());
    assert_eq!(d.remaining(), 1);
    let count: i64 = conn.get(&key).await.unwrap();
    assert_eq!(count, 2, "the denied spend was not taken back");
    let ttl: i64 = conn.pttl(&key).await.unwrap();
    assert!(
        0 < ttl && ttl <= ttl_before,
        "TTL moved: {ttl_before} -> {ttl}"
    );

    // Two limits with a key each: the first is spent, the second is fresh.
    let both = Limiter::builder("1/10s".parse().unwrap())
        .name("spent")
        .limit("fresh", "5/10s".parse().unwrap())
        .store(server.store().await)
        .build()
        .unwrap();
    assert!(both.check_each(&["a", "b"], 1).await.unwrap().is_allowed());
    let d = both.check_each(&["a", "c"], 1).await.unwrap();
    assert!(!d.is_allowed());
    let fresh = both.store_keys("c").pop().unwrap();
    let exists: bool = conn.exists(&fresh).await.unwrap();
    assert!(!exists, "the admitting limit kept a spend: {fresh}");

    server.assert_every_key_has_ttl().await;
}

/// The fast path validates its arguments before writing anything too.
#[tokio::test]
async fn fixed_window_script_rejects_bad_arguments_without_writing() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let script = redis::Script::new(redis_ratelimit::store::DECIDE_FIXED_LUA);
    // ARGV: policies, then per policy: limit, window_ms, shadow; then runs,
    // then per run: requests, cost, limits, then a policy per limit.
    let call = |keys: &[&str], argv: &[&str]| support::invocation(&script, keys, argv);
    // Two requests as one run, then as two runs of one, then with the
    // second key carried after the runs (a cluster node's batch): the same
    // reply.
    let one_run = ["1", "5", "1000", "0", "1", "2", "1", "1", "1"];
    let two_runs = [
        "1", "5", "1000", "0", "2", "1", "1", "1", "1", "1", "1", "1", "1",
    ];
    let carried = ["1", "5", "1000", "0", "1", "2", "1", "1", "1", "k2"];
    for (keys, good) in [
        (&["k", "k2"][..], &one_run[..]),
        (&["k", "k2"][..], &two_runs[..]),
        (&["k"][..], &carried[..]),
    ] {
        let ok: support::Reply = call(keys, good).invoke_async(&mut conn).await.unwrap();
        // Per request: 4 remain, 1000 ms until the reset.
        assert_eq!(ok.0, [4, 1000, 4, 1000], "{good:?}");
        let _: () = conn.del(&["k", "k2"]).await.unwrap();
    }
    let good = [
        "1", "5", "1000", "0", "2", "1", "1", "1", "1", "1", "1", "1", "1",
    ];
    // Each position of the good call, spoiled in turn; every policy field is
    // also tried out of range.
    let mut bad = support::spoiled(
        &good,
        &[
            (0, "0"),
            (0, "x"),
            (1, "0"),
            (1, "1.5"),
            (2, "0"),
            (2, "-1"),
            (2, "1e3"),
            (6, "0x1"),
            (6, " 1"),
            (3, "2"),
            (3, "x"),
            (4, "0"),
            (4, "1"),
            (4, "3"),
            (5, "0"),
            (5, "2"),
            (6, "-1"),
            (6, "1.5"),
            (7, "0"),
            (7, "2"),
            (8, "0"),
            (8, "2"),
            (8, "x"),
            (9, "0"),
            (11, "0"),
            (12, "2"),
            (12, "x"),
            // Short spoils: a leading zero, a sign, a space, a letter.
            (1, "05"),
            (4, "02"),
            (5, "1 "),
            (8, "1x"),
            (9, "+1"),
            (11, "0 "),
        ],
    );
    // Counts that do not match: a missing argument, an extra one.
    bad.push(good[..good.len() - 1].to_vec());
    bad.push([&good[..], &["1"]].concat());
    support::assert_refused(&mut conn, &script, &["k", "k2"], &bad).await;
    // A missing key.
    support::assert_refused(&mut conn, &script, &["k"], &[good.to_vec()]).await;
}

/// The fast path's compact form (one run of requests with one limit each:
/// `0`, the limit, the window and the cost, then any carried keys) decides
/// and replies as the same requests spelled out do, and checks its
/// arguments before writing too.
#[tokio::test]
async fn the_compact_form_decides_as_the_spelled_out_one_and_checks_too() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let script = redis::Script::new(redis_ratelimit::store::DECIDE_FIXED_LUA);
    let call = |keys: &[&str], argv: &[&str]| support::invocation(&script, keys, argv);
    // Limit 5 a 10 s window, cost 2; a call of three requests, the second
    // and third on one key: spelled out, compact, and compact with two keys
    // carried (a cluster node's batch). Each on keys of its own, three calls
    // in a row: spent, then partly denied (taken back), then denied.
    let spelled = ["1", "5", "10000", "0", "1", "3", "2", "1", "1"];
    let forms: [(&str, &[&str], bool); 3] = [
        ("s", &spelled, false),
        ("c", &["0", "5", "10000", "2"], false),
        ("r", &["0", "5", "10000", "2"], true),
    ];
    let mut replies = Vec::new();
    for (prefix, argv, carried) in forms {
        let (a, b) = (format!("{prefix}:a"), format!("{prefix}:b"));
        let keys = [a.as_str(), b.as_str(), b.as_str()];
        let mut seen = Vec::new();
        for _ in 0..3 {
            let reply: support::Reply = match carried {
                false => call(&keys, argv).invoke_async(&mut conn).await.unwrap(),
                true => {
                    let argv = [argv, &keys[1..]].concat();
                    call(&keys[..1], &argv)
                        .invoke_async(&mut conn)
                        .await
                        .unwrap()
                }
            };
            seen.push(reply.0);
        }
        let counts: (i64, i64) = (conn.get(&a).await.unwrap(), conn.get(&b).await.unwrap());
        replies.push((prefix, seen, counts));
    }
    let (_, first, counts) = &replies[0];
    // a: 3 left, 1 left, denied (1 left); b: 3 left then 1 left, then
    // denied twice.
    let remaining = |seen: &Vec<Vec<i64>>| -> Vec<i64> {
        seen.iter()
            .flat_map(|r| r.iter().step_by(2).copied())
            .collect()
    };
    assert_eq!(remaining(first), [3, 3, 1, 1, -2, -2, -2, -2, -2]);
    assert_eq!(*counts, (4, 4));
    for (prefix, seen, theirs) in &replies[1..] {
        assert_eq!(remaining(seen), remaining(first), "{prefix}: {seen:?}");
        assert_eq!(theirs, counts, "{prefix}: the counters differ");
        // The reset: a whole window for a fresh counter, else its TTL.
        for (mine, spelled) in seen.iter().zip(first) {
            for (m, s) in mine.iter().zip(spelled).skip(1).step_by(2) {
                assert!((m - s).abs() < 1000 && *m <= 10_000, "{prefix}: {seen:?}");
            }
        }
    }
    server.assert_every_key_has_ttl().await;

    // Each argument spoiled in turn, nothing else missing or extra: refused,
    // and nothing written.
    let good = ["0", "5", "1000", "1"];
    let mut bad = support::spoiled(
        &good,
        &[
            (1, "0"),
            (1, "x"),
            (1, "1.5"),
            (1, "05"),
            (1, "-5"),
            (2, "0"),
            (2, "-1"),
            (2, "1e3"),
            (2, " 1000"),
            (3, "0"),
            (3, "x"),
            (3, "+1"),
            (3, "1 "),
        ],
    );
    bad.push(good[..3].to_vec());
    bad.push(good[..1].to_vec());
    support::assert_refused(&mut conn, &script, &["k"], &bad).await;
    // No key at all.
    support::assert_refused(&mut conn, &script, &[], &[good.to_vec()]).await;
    let ok: support::Reply = call(&["k"], &good).invoke_async(&mut conn).await.unwrap();
    assert_eq!(ok.0, [4, 1000], "the good call");
}

/// decide.lua's compact form for GCRA (`0`, the limit, the window, the
/// burst and the cost, then one key a request) decides and replies as the
/// same requests spelled out do: on fresh keys, on keys in the previous
/// float format, corrupt, of the wrong type, with a remainder past a
/// microsecond, and without a TTL, where a denial heals it. And it checks
/// its arguments before writing.
#[tokio::test]
async fn the_gcra_compact_form_decides_as_the_spelled_out_one_and_checks_too() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let script = redis::Script::new(redis_ratelimit::store::DECIDE_LUA);
    let call = |keys: &[String], argv: &[&str]| {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        support::invocation(&script, &keys, argv)
    };
    // 5/10s with a burst of 3: a unit is 2 s; each request costs 2.
    let (limit, window, burst, cost) = ("5", "10000", "3", "2");
    let names = ["a", "b", "b", "old", "junk", "half", "list", "late", "far"];
    let mut spelled = vec!["9"];
    for _ in names {
        spelled.extend([cost, "1", "3", limit, window, burst, "0"]);
    }
    let compact = ["0", "3", limit, window, burst, cost];
    let mut replies = Vec::new();
    // Spelled out, compact, and compact with every key but the first
    // carried after the cost (a cluster node's batch).
    for (prefix, argv, carried) in [
        ("s", &spelled[..], false),
        ("c", &compact[..], false),
        ("r", &compact[..], true),
    ] {
        let keys: Vec<String> = names.iter().map(|n| format!("{prefix}:{n}")).collect();
        let time: (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
        let now_us = time.0 * 1_000_000 + time.1;
        let _: () = conn.set(&keys[3], "1.5").await.unwrap();
        let _: () = conn.set(&keys[4], "x:y").await.unwrap();
        // A TAT of whole µs with a remainder that is not a number.
        let _: () = conn.set(&keys[5], format!("{now_us}:x")).await.unwrap();
        let _: () = conn.lpush(&keys[6], "v").await.unwrap();
        // A TAT 5 s ahead and no TTL: room for half a unit, so denied, and
        // the denial gives the key its TTL.
        let _: () = conn
            .set(&keys[7], format!("{}:0", now_us + 5_000_000))
            .await
            .unwrap();
        // A remainder of 7 where a unit of time is 1 µs: read as a µs more.
        let _: () = conn
            .set(&keys[8], format!("{}:7", now_us - 1))
            .await
            .unwrap();
        let mut seen = Vec::new();
        for _ in 0..2 {
            let invocation = match carried {
                false => call(&keys, argv),
                true => {
                    let rest: Vec<&str> = keys[1..].iter().map(String::as_str).collect();
                    call(&keys[..1], &[argv, &rest[..]].concat())
                }
            };
            let reply: support::Reply = invocation.invoke_async(&mut conn).await.unwrap();
            seen.push(reply.decided(true));
        }
        replies.push((prefix, seen));
    }
    let (_, first) = &replies[0];
    // Per request: allowed, allowed_1, remaining, reset_ms, retry_ms.
    let decided = |seen: &Vec<Vec<i64>>| -> Vec<(i64, i64, i64)> {
        seen.iter()
            .flat_map(|r| r.chunks(5).map(|c| (c[0], c[1], c[2])))
            .collect()
    };
    // Admitted with one unit left, or denied with one (two needed), or with
    // none.
    let (admitted, denied, empty) = ((1, 1, 1), (0, 0, 1), (0, 0, 0));
    assert_eq!(
        decided(first),
        [
            // a, b admitted, b again denied; old, junk, half and list read
            // as nothing (reset) and admitted; late denied (half a unit of
            // room); far admitted.
            admitted, admitted, denied, admitted, admitted, admitted, admitted, empty, admitted,
            // Then every one denied.
            denied, denied, denied, denied, denied, denied, denied, empty, denied,
        ]
    );
    for (prefix, seen) in &replies[1..] {
        assert_eq!(
            decided(seen),
            decided(first),
            "{prefix}: {seen:?} against {first:?}"
        );
        for (mine, spelled) in seen.iter().zip(first) {
            for (m, s) in mine.iter().zip(spelled) {
                assert!((m - s).abs() <= 100, "{prefix}: {seen:?} against {first:?}");
            }
        }
        assert_same_ttls(&mut conn, prefix, &names).await;
    }
    server.assert_every_key_has_ttl().await;

    // Each argument spoiled in turn, nothing else missing: refused, and
    // nothing written (an argument past the cost is a carried key).
    let good = ["0", "3", "5", "1000", "3", "1"];
    let mut bad = support::spoiled(
        &good,
        &[
            (1, "1"),
            (1, "4"),
            (1, "x"),
            (2, "0"),
            (2, "x"),
            (2, "1.5"),
            (2, "05"),
            (3, "0"),
            (3, "-1"),
            (3, "1e3"),
            (4, "0"),
            (4, " 3"),
            (5, "0"),
            (5, "x"),
            (5, "+1"),
        ],
    );
    // A quota Quota::gcra refuses: faster than one a microsecond.
    bad.push(vec!["0", "3", "5000", "1", "3", "1"]);
    bad.push(good[..5].to_vec());
    support::assert_refused(&mut conn, &script, &["k"], &bad).await;
    support::assert_refused(&mut conn, &script, &[], &[good.to_vec()]).await;
    let ok: support::Reply = call(&["k".into()], &good)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    let ok = ok.decided(true);
    assert_eq!(ok[..3], [1, 1, 2], "the good call: {ok:?}");
}

/// The same compact form for a sliding window (algorithm 2, a burst of 0)
/// decides and replies as the same requests spelled out do: on fresh keys,
/// a window just rolled over, fields that are not whole counts, a hash
/// missing fields, a key of the wrong type, and a full window without a TTL,
/// where a denial heals it.
#[tokio::test]
async fn the_sliding_window_compact_form_decides_as_the_spelled_out_one() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let script = redis::Script::new(redis_ratelimit::store::DECIDE_LUA);
    let (limit, window, cost) = ("5", "10000", "2");
    let names = ["a", "b", "b", "rolled", "junk", "partial", "list", "full"];
    let mut spelled = vec!["8"];
    for _ in names {
        spelled.extend([cost, "1", "2", limit, window, "0", "0"]);
    }
    let compact = ["0", "2", limit, window, "0", cost];
    let mut replies = Vec::new();
    for (prefix, argv) in [("s", &spelled[..]), ("c", &compact[..])] {
        let keys: Vec<String> = names.iter().map(|n| format!("{prefix}:{n}")).collect();
        let time: (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
        let now_ms = time.0 * 1000 + time.1 / 1000;
        // A window that ended 0.1 s ago with 2 spent: weighs 1.98 now.
        let rolled = [("s", now_ms - 10_100), ("c", 2), ("p", 0)];
        let _: () = conn.hset_multiple(&keys[3], &rolled).await.unwrap();
        let _: () = conn
            .hset_multiple(&keys[4], &[("s", "x"), ("c", "1"), ("p", "0")])
            .await
            .unwrap();
        let _: () = conn.hset(&keys[5], "c", 1).await.unwrap();
        let _: () = conn.lpush(&keys[6], "v").await.unwrap();
        let full = [("s", now_ms), ("c", 5), ("p", 0)];
        let _: () = conn.hset_multiple(&keys[7], &full).await.unwrap();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut seen = Vec::new();
        for _ in 0..2 {
            let call = support::invocation(&script, &keys, argv);
            let reply: support::Reply = call.invoke_async(&mut conn).await.unwrap();
            seen.push(reply.decided(false));
        }
        replies.push(seen);
    }
    // Per request: allowed, allowed_1, remaining.
    let decided = |seen: &Vec<Vec<i64>>| -> Vec<(i64, i64, i64)> {
        seen.iter()
            .flat_map(|r| r.chunks(5).map(|c| (c[0], c[1], c[2])))
            .collect()
    };
    assert_eq!(
        decided(&replies[0]),
        [
            // a, b: 3 left; b again: 1 left; rolled: 2 spent, 1.98 weighed;
            // junk, partial, list reset; full denied.
            (1, 1, 3),
            (1, 1, 3),
            (1, 1, 1),
            (1, 1, 1),
            (1, 1, 3),
            (1, 1, 3),
            (1, 1, 3),
            (0, 0, 0),
            // a: 1 left; b: denied; rolled: denied; the rest as a, and full.
            (1, 1, 1),
            (0, 0, 1),
            (0, 0, 1),
            (0, 0, 1),
            (1, 1, 1),
            (1, 1, 1),
            (1, 1, 1),
            (0, 0, 0),
        ]
    );
    assert_eq!(decided(&replies[1]), decided(&replies[0]), "{replies:?}");
    for (mine, spelled) in replies[1].iter().zip(&replies[0]) {
        for (m, s) in mine.iter().zip(spelled) {
            assert!((m - s).abs() <= 100, "{replies:?}");
        }
    }
    assert_same_ttls(&mut conn, "c", &names).await;
    server.assert_every_key_has_ttl().await;
}

/// Each key the compact form decided (`{prefix}:…`) has the TTL its
/// spelled-out twin (`s:…`) has, within the 0.1 s between them.
async fn assert_same_ttls(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    names: &[&str],
) {
    for name in names {
        let spelled: i64 = conn.pttl(format!("s:{name}")).await.unwrap();
        let compact: i64 = conn.pttl(format!("{prefix}:{name}")).await.unwrap();
        assert!(
            (spelled - compact).abs() <= 100,
            "{name}: a TTL of {compact} ms, spelled out {spelled} ms"
        );
    }
}

/// The script validates its arguments before writing anything.
#[tokio::test]
async fn script_rejects_bad_arguments_without_writing() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let script = redis::Script::new(redis_ratelimit::store::DECIDE_LUA);
    // ARGV: requests, then per request: cost, limits, then per limit:
    // algorithm, limit, window_ms, burst, shadow.
    let limit = ["1", "5", "1000", "0", "0"];
    let one = |cost: &'static str, limits: &[&[&'static str]]| {
        let mut argv = vec!["1", cost];
        let n: &'static str = ["0", "1", "2"][limits.len()];
        argv.push(n);
        for l in limits {
            argv.extend_from_slice(l);
        }
        argv
    };
    let ok: support::Reply = script
        .key("k")
        .arg(&one("1", &[&limit])[..])
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        ok.decided(false),
        [1, 1, 4, 1000, 0],
        "the well-formed call is admitted"
    );
    let _: () = conn.del("k").await.unwrap();
    let mut bad_calls: Vec<(Vec<&str>, Vec<&str>)> = Vec::new();
    for cost in ["-1", "x", "1.5"] {
        bad_calls.push((vec!["k"], one(cost, &[&limit])));
    }
    // A bad limit alone, after a good one in its request, or in a second
    // request of a batch: nothing may be written.
    for bad in [
        &["1", "0", "1000", "0", "0"][..],
        &["1", "5", "0", "0", "0"],
        &["1", "5", "x", "0", "0"],
        &["1", "5", "1.5", "0", "0"],
        &["4", "5", "1000", "0", "0"],
        &["3", "5", "1000", "0", "0"],
        &["1", "5", "1000", "0", "2"],
        &["1", "5", "1000", "0"],
    ] {
        bad_calls.push((vec!["k"], one("1", &[bad])));
        bad_calls.push((vec!["k", "k2"], one("1", &[&limit, bad])));
        let mut batch = vec!["2", "1", "1"];
        batch.extend_from_slice(&limit);
        batch.extend_from_slice(&["1", "1"]);
        batch.extend_from_slice(bad);
        bad_calls.push((vec!["k", "k2"], batch));
    }
    // Counts that do not match: two requests announced, one given; two
    // limits announced, one key given.
    bad_calls.push((vec!["k"], [&["2", "1", "1"][..], &limit].concat()));
    bad_calls.push((vec!["k"], one("1", &[&limit, &limit])));
    for (keys, argv) in bad_calls {
        let mut call = script.prepare_invoke();
        for k in &keys {
            call.key(*k);
        }
        let r: redis::RedisResult<support::Reply> =
            call.arg(&argv[..]).invoke_async(&mut conn).await;
        assert!(r.is_err(), "{keys:?} {argv:?} accepted: {r:?}");
    }
    let exists: usize = conn.exists(&["k", "k2"]).await.unwrap();
    assert_eq!(exists, 0, "a rejected call wrote a key");
}

/// The sliding window and GCRA heal and reset their keys too: a hash or a
/// timestamp planted without a TTL, or garbage of the wrong type, never
/// wedges a client, and every key ends with a TTL.
#[tokio::test]
async fn sliding_window_and_gcra_keys_are_healed_and_reset() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let sliding = "3/1s"
        .parse::<redis_ratelimit::Quota>()
        .unwrap()
        .sliding_window();
    let gcra = "3/1s"
        .parse::<redis_ratelimit::Quota>()
        .unwrap()
        .gcra(3)
        .unwrap();
    let store = server.store().await;
    let build = |quota| {
        let builder = redis_ratelimit::Limiter::builder(quota).store(store.clone());
        builder.build().unwrap()
    };
    let (sliding, gcra) = (build(sliding), build(gcra));

    // A sliding-window hash with counts but no TTL.
    let key = sliding.store_key("no-ttl");
    let _: () = conn
        .hset_multiple(&key, &[("s", "0"), ("c", "2"), ("p", "9")])
        .await
        .unwrap();
    let d = sliding.check("no-ttl", 1).await.unwrap();
    assert!(
        d.is_allowed() && d.remaining() == 2,
        "an ancient window counts nothing: {d:?}"
    );
    // Garbage fields and the wrong type.
    let key = sliding.store_key("garbage");
    let _: () = conn
        .hset_multiple(&key, &[("s", "x"), ("c", "-1")])
        .await
        .unwrap();
    assert_eq!(sliding.check("garbage", 1).await.unwrap().remaining(), 2);
    let key = sliding.store_key("list");
    let _: () = conn.rpush(&key, "x").await.unwrap();
    assert_eq!(sliding.check("list", 1).await.unwrap().remaining(), 2);

    // A GCRA timestamp far in the future (the year 2255), without a TTL:
    // obeyed only as long as a full bucket (1 s), to which the key's TTL is
    // healed, not for centuries.
    let key = gcra.store_key("future");
    let _: () = conn.set(&key, "9000000000000000").await.unwrap();
    let d = gcra.check("future", 1).await.unwrap();
    assert!(!d.is_allowed(), "{d:?}");
    assert!(
        d.retry_after().unwrap() <= Duration::from_millis(1000),
        "{d:?}"
    );
    let ttl: i64 = conn.pttl(&key).await.unwrap();
    assert!((1..=1001).contains(&ttl), "{ttl}");
    // One beyond 2^53 µs is no time a TAT can be: corrupt, and reset.
    let key = gcra.store_key("beyond");
    let _: () = conn.set(&key, "99999999999999999").await.unwrap();
    assert_eq!(gcra.check("beyond", 1).await.unwrap().remaining(), 2);
    let key = gcra.store_key("text");
    let _: () = conn.set(&key, "garbage").await.unwrap();
    assert_eq!(gcra.check("text", 1).await.unwrap().remaining(), 2);

    server.assert_every_key_has_ttl().await;
}

/// A counter someone else wrote in a form `INCRBY` refuses ("7.0", " 7",
/// "1e1", "0x7", "+7") or as a number no count reaches ("inf") is reset by
/// a local reservation's call as by a decision, not read as a count by its
/// look and then refused by its spend: that failed every check of the key
/// (lifting the limit under `OnStoreError::Allow`) until the window ended,
/// and denied every one for a window for "inf".
#[tokio::test]
async fn a_reservation_resets_counters_that_incrby_refuses() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let limiter = Limiter::builder("100/60s".parse().unwrap())
        .store(server.store().await)
        .local_reservation(10)
        .build()
        .unwrap();
    for bad in [
        "7.0",
        " 7",
        "1e1",
        "0x7",
        "+7",
        "inf",
        "-0",
        "9007199254740993",
    ] {
        let key = format!("k{bad}");
        let store_key = limiter.store_key(&key);
        let _: () = conn.pset_ex(&store_key, bad, 60_000).await.unwrap();
        let d = limiter
            .check(&key, 1)
            .await
            .unwrap_or_else(|e| panic!("{bad:?}: {e}"));
        assert!(d.is_allowed(), "{bad:?}: {d:?}");
        // Reset, then the reservation's 10 units: a fresh window's count.
        let count: String = conn.get(&store_key).await.unwrap();
        assert_eq!(count, "10", "{bad:?}");
        let ttl: i64 = conn.pttl(&store_key).await.unwrap();
        assert!((1..=60_000).contains(&ttl), "{bad:?}: TTL {ttl}");
    }
    server.assert_every_key_has_ttl().await;
}

/// A fixed-window count above 2^53, which no spend reaches, is corrupt and
/// reset by a decision too, on each script's path (the fast path alone,
/// its general form with two limits, and the general script beside a
/// sliding window), as a peek or a reservation resets it. A decision
/// obeyed it: denied for the window, while a peek said allowed.
#[tokio::test]
async fn a_decision_resets_a_count_beyond_2_pow_53() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let store = server.store().await;
    let limiters = [
        ("alone", None),
        ("two-fixed", Some(Quota::per_hour(100))),
        (
            "beside-sliding",
            Some(Quota::per_hour(100).sliding_window()),
        ),
    ];
    for (name, other) in limiters {
        let mut builder = Limiter::builder("100/60s".parse().unwrap())
            .name(name)
            .store(store.clone());
        if let Some(quota) = other {
            builder = builder.limit(format!("{name}-hour"), quota);
        }
        let limiter = builder.build().unwrap();
        let store_key = limiter.store_key("k");
        // An odd count with an odd cost: their sum rounds in Lua's doubles.
        for (stored, cost) in [("9007199254740994", 1), ("9007199254740993", 3)] {
            let _: () = conn.pset_ex(&store_key, stored, 60_000).await.unwrap();
            let d = limiter.check("k", cost).await.unwrap();
            assert!(d.is_allowed(), "{name} {stored}: {d:?}");
            let count: String = conn.get(&store_key).await.unwrap();
            assert_eq!(count, cost.to_string(), "{name} {stored}");
            let ttl: i64 = conn.pttl(&store_key).await.unwrap();
            assert!((1..=60_000).contains(&ttl), "{name}: TTL {ttl}");
        }
    }
    server.assert_every_key_has_ttl().await;
}

/// A counter in its last millisecond answers `PTTL` 0 (Redis expires a key
/// only once its time has passed, and in a script by the script's start:
/// a key can outlive its PTTL's reaching 0 by the length of a call). A
/// denial then said to retry in 0 ms, where the memory store says at least
/// 1: the scripts say 1 (the PTTL + 1, as for every live counter). A denial
/// that says 1 can only be of a PTTL of 0 (a PTTL of 1 says 2), so the
/// search below ends only once that case has run.
#[tokio::test]
async fn a_denial_in_a_counters_last_millisecond_says_retry_in_one() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let script = redis::Script::new(redis_ratelimit::store::DECIDE_FIXED_LUA);
    // A compact call (limit 1, a window of 60 s, cost 1) whose last key is
    // spent and expires `px` ms after it is set: long enough to outlast the
    // call's way to Redis, shorter than the thousands of decisions before
    // it take, so that it is decided (still live, by the script's clock)
    // after its PTTL has reached 0. `px` is found by trying.
    let keys: Vec<String> = (0..20_000).map(|i| format!("fill:{i}")).collect();
    let mut px: u64 = 20;
    let mut seen = Vec::new();
    for _ in 0..30 {
        let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
        let _: () = conn.pset_ex("last", 1, px).await.unwrap();
        let mut call = script.prepare_invoke();
        for k in &keys {
            call.key(k);
        }
        call.key("last");
        call.arg(&["0", "1", "60000", "1"][..]);
        let reply: support::Reply = call.invoke_async(&mut conn).await.unwrap();
        let (left, retry) = (reply.0[2 * keys.len()], reply.0[2 * keys.len() + 1]);
        seen.push((px, left, retry));
        if left >= 0 {
            px *= 2; // gone before the call ran: admitted afresh
        } else if retry > 1 {
            px = (px * 2 / 3).max(1); // decided before its time ran out
        } else {
            assert_eq!(retry, 1, "a denial said to retry in {retry} ms ({seen:?})");
            server.assert_every_key_has_ttl().await;
            return;
        }
    }
    panic!("the key never reached its last ms in a call: (px, left, retry) {seen:?}");
}

/// A counter set by a version before the window's expiry was `window_ms -
/// 1` (PEXPIRE `window_ms`: a PTTL of the whole window, in its first ms)
/// says no more than the window, and gets the new expiry. Fails with heal
/// applied only past the window: it said `window_ms + 1`, and a window of
/// 1 s a `Retry-After` of 2.
#[tokio::test]
async fn a_counter_set_by_an_older_version_says_no_more_than_its_window() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let script = redis_ratelimit::store::DECIDE_FIXED_LUA;
    let mut longest = 0;
    for i in 0..20 {
        let key = format!("old:{i}");
        // Set as an older version sets a new counter, and decided at once
        // (limit 1, so denied; a window of 60 s), in one pipeline.
        let (_, reply): ((), support::Reply) = redis::pipe()
            .cmd("SET")
            .arg(&key)
            .arg(1)
            .arg("PX")
            .arg(60_000)
            .cmd("EVAL")
            .arg(script)
            .arg(1)
            .arg(&key)
            .arg(&["0", "1", "60000", "1"])
            .query_async(&mut conn)
            .await
            .unwrap();
        let (left, reset) = (reply.0[0], reply.0[1]);
        assert!(left < 0, "{key}: denied: {reply:?}");
        longest = longest.max(reset);
        let ttl: i64 = conn.pttl(&key).await.unwrap();
        assert!(ttl < 60_000, "{key}: PTTL {ttl}");
    }
    assert!(longest <= 60_000, "a wait of {longest} ms on a 60 s window");
    server.assert_every_key_has_ttl().await;
}
