//! The limiters on a real Redis Cluster (feature `cluster`), through a
//! cluster connection and a bb8 pool of them: every algorithm and the
//! multi-limit script count exactly, keys spread over every master, counts
//! stay exact under concurrency, the concurrency limit holds, scripts come
//! back after `SCRIPT FLUSH`, a limiter finds a promoted replica after its
//! master dies, and a burst over many slots is batched per node. Any error
//! (`CROSSSLOT` included) fails a test, but where a test says otherwise.

mod support;

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redis_ratelimit::{
    Breaker, Decision, Limiter, Quota, RedisStore, Store,
    concurrency::{Acquired, ConcurrencyLimiter},
};
use support::cluster::RedisCluster;

/// The decisions of `n` checks of `key`, one after another.
async fn decisions(limiter: &Limiter, key: &str, n: usize) -> Vec<Decision> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(limiter.check(key, 1).await.unwrap());
    }
    out
}

/// `(allowed, remaining)` of each decision.
fn summary(ds: &[Decision]) -> Vec<(bool, u64)> {
    ds.iter().map(|d| (d.is_allowed(), d.remaining())).collect()
}

/// Five admitted counting down, then denied.
const FIVE_THEN_DENIED: [(bool, u64); 7] = [
    (true, 4),
    (true, 3),
    (true, 2),
    (true, 1),
    (true, 0),
    (false, 0),
    (false, 0),
];

/// Fixed window, sliding window and GCRA, each for two clients, on `store`:
/// exact counts, keys on the master that owns their slot, and TTLs.
async fn every_algorithm_counts_exactly(cluster: &RedisCluster, store: RedisStore) {
    let five = Quota::per_minute(5);
    let quotas = [
        ("fixed", five),
        ("sliding", five.sliding_window()),
        ("gcra", five.gcra(5).unwrap()),
    ];
    for (name, quota) in quotas {
        let limiter = Limiter::builder(quota).name(name).store(store.clone());
        let limiter = limiter.timeout(support::TEST_TIMEOUT).build().unwrap();
        for client in ["alice", "bob"] {
            let ds = decisions(&limiter, client, 7).await;
            assert_eq!(summary(&ds), FIVE_THEN_DENIED, "{name} {client}: {ds:?}");
            let key = limiter.store_key(client);
            let owner = cluster.master_of(&key);
            let keys = &cluster.keys_with_ttl()[&owner];
            assert!(keys.iter().any(|(k, _)| *k == key), "{key} not on {owner}");
        }
    }
    cluster.assert_every_key_has_ttl();
}

#[tokio::test]
async fn every_algorithm_counts_exactly_through_a_cluster_connection() {
    let cluster = RedisCluster::start();
    every_algorithm_counts_exactly(&cluster, cluster.store().await).await;
}

#[tokio::test]
async fn every_algorithm_counts_exactly_through_a_pool_of_cluster_connections() {
    let cluster = RedisCluster::start();
    every_algorithm_counts_exactly(&cluster, cluster.pool_store(4).await).await;
}

/// Three limits keyed by user, IP and `"global"`: one slot for all their
/// keys, whatever the clients, and all or nothing.
#[tokio::test]
async fn multi_limit_keys_share_one_slot_and_decide_all_or_nothing() {
    let cluster = RedisCluster::start();
    let limiter = cluster.builder("3/1m").await.name("user");
    let limiter = limiter.limit("ip", Quota::per_minute(5).sliding_window());
    let limiter = limiter.limit("global", Quota::per_minute(8).gcra(8).unwrap());
    let limiter = limiter.build().unwrap();
    let check = |user: &'static str, ip: &'static str| {
        let limiter = limiter.clone();
        async move { limiter.check_each(&[user, ip, "global"], 1).await.unwrap() }
    };
    let outcome = |d: Decision| (d.is_allowed(), d.policy().to_owned());
    let deny = |policy: &str| (false, policy.to_owned());
    // u1 spends its 3; the 4th is the user limit's, and spends nothing.
    for _ in 0..3 {
        assert!(check("u1", "ip1").await.is_allowed());
    }
    assert_eq!(outcome(check("u1", "ip1").await), deny("user"));
    // u2 on the same IP: the IP limit has 2 left.
    for _ in 0..2 {
        assert!(check("u2", "ip1").await.is_allowed());
    }
    assert_eq!(outcome(check("u2", "ip1").await), deny("ip"));
    // u3 on another IP takes the last 3 of the global 8.
    for _ in 0..3 {
        assert!(check("u3", "ip2").await.is_allowed());
    }
    assert_eq!(outcome(check("u4", "ip3").await), deny("global"));

    let keys = [
        &limiter.store_keys("u1")[0],
        &limiter.store_keys("ip1")[1],
        &limiter.store_keys("global")[2],
    ];
    let slots: Vec<u16> = keys.iter().map(|k| cluster.slot_of(k)).collect();
    assert!(slots.iter().all(|s| *s == slots[0]), "{keys:?}: {slots:?}");
    let holding: Vec<_> = cluster
        .keys_per_master()
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect();
    // user: u1, u2, u3; ip: ip1, ip2; global: 1. u4 was denied: no key.
    assert_eq!(holding.len(), 1, "{holding:?}");
    assert_eq!(holding[0].1, 6, "{:?}", cluster.keys_with_ttl());
    cluster.assert_every_key_has_ttl();
}

/// A refund's and a reset's markers (`<key>#rf:<id>`, `<key>#rs:<id>`:
/// `lua/once.lua`) sit in their counters' slot, for a client key long
/// enough to be hashed and for a limiter of several limits (whose keys
/// share one tag): each call is one script on one node, with no
/// `CROSSSLOT`, takes effect, and leaves its marker beside the counters,
/// with a TTL.
#[tokio::test]
async fn refund_and_reset_markers_sit_in_their_counters_slot() {
    let cluster = RedisCluster::start();
    let long = "x".repeat(redis_ratelimit::RAW_KEY_MAX * 2);
    let single = cluster
        .builder("3/1m")
        .await
        .name("single")
        .build()
        .unwrap();
    let multi = cluster.builder("3/1m").await.name("user");
    let multi = multi.limit("global", Quota::per_minute(9)).build().unwrap();
    let cases = [
        (&single, vec![long.clone()]),
        (&multi, vec![long.clone(), "global".to_owned()]),
    ];
    for (limiter, keys) in cases {
        let remaining = || async { limiter.peek_each(&keys, 1).await.unwrap().remaining() };
        let d = limiter.check_each(&keys, 2).await.unwrap();
        assert!(d.is_allowed());
        assert_eq!(remaining().await, 1);
        limiter.refund_each(&keys, &d).await.unwrap();
        assert_eq!(remaining().await, 3, "not refunded");
        assert!(limiter.check_each(&keys, 1).await.unwrap().is_allowed());
        limiter.reset_each(&keys).await.unwrap();
        assert_eq!(remaining().await, 3, "not reset");

        let counter = &limiter.store_keys(&keys[0])[0];
        let slot = cluster.slot_of(counter);
        let all: Vec<(String, i64)> = cluster.keys_with_ttl().into_values().flatten().collect();
        for kind in ["#rf:", "#rs:"] {
            let marker = all
                .iter()
                .find(|(k, _)| k.starts_with(counter.as_str()) && k.contains(kind));
            let (marker, ttl) = marker.unwrap_or_else(|| panic!("no {kind} marker: {all:?}"));
            assert_eq!(
                cluster.slot_of(marker),
                slot,
                "{marker} apart from {counter}"
            );
            assert!(*ttl > 0, "{marker} has TTL {ttl}");
        }
    }
    cluster.assert_every_key_has_ttl();
}

/// 200 clients, one check each: a key per client, on every master.
#[tokio::test]
async fn keys_of_many_clients_spread_over_every_master() {
    let cluster = RedisCluster::start();
    let limiter = cluster.limiter("10/1m").await;
    let clients: Vec<String> = (0..200).map(|i| format!("client-{i}")).collect();
    let checks = clients.iter().map(|c| limiter.check(c, 1));
    for d in join_all(checks).await {
        assert_eq!(d.unwrap().remaining(), 9);
    }
    let per_master = cluster.keys_per_master();
    assert_eq!(per_master.len(), 3, "{per_master:?}");
    assert!(per_master.values().all(|n| *n > 20), "{per_master:?}");
    assert_eq!(per_master.values().sum::<usize>(), 200, "{per_master:?}");
    for client in clients.iter().step_by(20) {
        let key = limiter.store_key(client);
        let owner = cluster.master_of(&key);
        let keys = &cluster.keys_with_ttl()[&owner];
        assert!(keys.iter().any(|(k, _)| *k == key), "{key} not on {owner}");
    }
    cluster.assert_every_key_has_ttl();
}

/// `EVALSHA` calls each master has run since its last `CONFIG RESETSTAT`.
fn script_calls_per_master(cluster: &RedisCluster) -> Vec<u64> {
    let info = redis::cmd("INFO").arg("commandstats").clone();
    let calls = |port: u16| -> u64 {
        let stats: String = cluster.query(port, &info);
        let line = stats.lines().find(|l| l.starts_with("cmdstat_evalsha:"));
        let field = line.and_then(|l| l.split("calls=").nth(1));
        field
            .and_then(|f| f.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    cluster.masters().into_iter().map(calls).collect()
}

fn reset_stats(cluster: &RedisCluster) {
    for port in cluster.masters() {
        let () = cluster.query(port, redis::cmd("CONFIG").arg("RESETSTAT"));
    }
}

/// 600 clients at once, four checks each, a key each over hundreds of
/// slots: decided in calls per node, not per slot, and each exactly. For a
/// fixed window (decide_fixed.lua's batch per node), a sliding window and
/// GCRA (decide.lua's compact form's, for requests of one limit alike).
#[tokio::test]
async fn a_burst_over_many_slots_is_batched_per_node() {
    let cluster = RedisCluster::start();
    let store = cluster.store().await;
    let quota: Quota = "3/1m".parse().unwrap();
    for (name, quota) in [
        ("fw", quota),
        ("sw", quota.sliding_window()),
        ("gcra", quota.gcra(3).unwrap()),
    ] {
        let limiter = Limiter::builder(quota)
            .name(name)
            .store(store.clone())
            .timeout(support::TEST_TIMEOUT)
            .build()
            .unwrap();
        assert!(limiter.check("warm", 1).await.unwrap().is_allowed());
        reset_stats(&cluster);
        let clients: Vec<String> = (0..600).map(|i| format!("c{i}")).collect();
        let checks = clients
            .iter()
            .flat_map(|c| (0..4).map(|_| limiter.check(c, 1)));
        let decisions: Vec<bool> = join_all(checks)
            .await
            .into_iter()
            .map(|d| d.unwrap().is_allowed())
            .collect();
        for (i, mine) in decisions.chunks(4).enumerate() {
            let allowed = mine.iter().filter(|a| **a).count();
            assert_eq!(allowed, 3, "{name}: client {i}: {mine:?}");
        }
        let calls = script_calls_per_master(&cluster);
        let all: u64 = calls.iter().sum();
        // By slot, 2,400 checks of 600 keys (about 590 slots) took hundreds
        // of calls; by node, a round of up to 512 is a few calls per master.
        assert!(all < 150, "{name}: {all} script calls: {calls:?}");
        assert!(calls.iter().all(|c| *c > 0), "{name}: {calls:?}");
    }
    cluster.assert_every_key_has_ttl();
}

/// A slot moves after the batching task read the slot map: a node's call
/// that meets a key it no longer holds fails as a store error (never an
/// admission past the limit), the map is read again, and the next checks
/// are decided exactly. For a fixed window (decide_fixed.lua's batch per
/// node), a sliding window and GCRA (decide.lua's compact form's).
#[tokio::test]
async fn a_stale_slot_map_fails_its_call_then_recovers() {
    let quota: Quota = "2/1m".parse().unwrap();
    for quota in [quota, quota.sliding_window(), quota.gcra(2).unwrap()] {
        let cluster = RedisCluster::start();
        let limiter = Limiter::builder(quota)
            .store(cluster.store().await)
            .timeout(support::TEST_TIMEOUT)
            .build()
            .unwrap();
        assert!(limiter.check("warm", 1).await.unwrap().is_allowed());
        let (rounds, _) = rounds_until_a_moved_slot_is_followed(&cluster, &limiter).await;
        // The first round's node call met the moved key (the map was stale).
        assert!(
            rounds > 1,
            "{quota:?}: no call failed: the map was not stale?"
        );
    }
}

/// As above, after a burst: the map is read again before the round after
/// the failed call all the same. A burst of more checks than two rounds
/// take (512 each) has the batching task wait for a round's permit and
/// sweep its queue, which sets its next sweep a timeout (300 ms) on, and
/// nothing clears it after. The read was bounded by that sweep, long
/// past, so it was never made, and the map stayed stale until the
/// periodic read (5 s): every round failed for seconds, for keys whose
/// slots never moved too. The breaker is off: with it, the first round's
/// failures open some ranges' breakers, whose cooldown the test would
/// measure instead.
#[tokio::test]
async fn a_stale_slot_map_is_read_again_at_once_after_a_burst() {
    let cluster = RedisCluster::start();
    let timeout = Duration::from_millis(300);
    let limiter = Limiter::builder("2/1m".parse().unwrap())
        .store(cluster.store().await)
        .timeout(timeout)
        .breaker(Breaker::disabled())
        .build()
        .unwrap();
    assert!(limiter.check("warm", 1).await.unwrap().is_allowed());
    let burst: Vec<String> = (0..1500).map(|i| format!("burst{i}")).collect();
    // Some may time out on a loaded machine: only the task's wait counts.
    join_all(burst.iter().map(|c| limiter.check(c, 1))).await;
    // Idle until the burst's last sweep time, at most a timeout after its
    // last check began, is past: the state the fix is about (no event
    // marks it, so the test waits it out).
    tokio::time::sleep(2 * timeout).await;

    let (rounds, took) = rounds_until_a_moved_slot_is_followed(&cluster, &limiter).await;
    assert!(rounds > 1, "no call failed: the map was not stale?");
    assert!(
        rounds <= 3 && took < Duration::from_secs(1),
        "{rounds} rounds, {took:?} until every check was decided again"
    );
}

/// Moves the slot of `limiter`'s client "moved" (a quota of 2) to another
/// master, then checks clients of every slot, "moved" among them, round
/// after round until a round has no error: how many rounds that took, and
/// how long. No client is ever admitted past 2, and once recovered every
/// one is decided.
async fn rounds_until_a_moved_slot_is_followed(
    cluster: &RedisCluster,
    limiter: &Limiter,
) -> (usize, Duration) {
    let key = limiter.store_key("moved");
    let (slot, from) = (cluster.slot_of(&key), cluster.master_of(&key));
    let to = cluster.masters().into_iter().find(|p| *p != from).unwrap();
    cluster.migrate_slot(slot, from, to);
    cluster.finish_migration(slot, to);
    let clients: Vec<String> = (0..300)
        .map(|i| format!("s{i}"))
        .chain(["moved".to_owned()])
        .collect();
    let mut admitted = vec![0; clients.len()];
    let start = Instant::now();
    let deadline = start + Duration::from_secs(10);
    let mut rounds = 0;
    loop {
        rounds += 1;
        let checks = clients.iter().map(|c| limiter.check(c, 1));
        let results = join_all(checks).await;
        let ok = results.iter().all(Result::is_ok);
        for (n, r) in admitted.iter_mut().zip(&results) {
            *n += usize::from(r.as_ref().is_ok_and(|d| d.is_allowed()));
        }
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "still failing: {results:?}");
    }
    let took = start.elapsed();
    assert!(admitted.iter().all(|n| *n <= 2), "{admitted:?}");
    // Once recovered: every client is decided, exactly.
    let checks = clients.iter().map(|c| limiter.check(c, 1));
    for (n, r) in admitted.iter_mut().zip(join_all(checks).await) {
        *n += usize::from(r.unwrap().is_allowed());
    }
    assert!(admitted.iter().all(|n| *n <= 2), "{admitted:?}");
    assert_eq!(cluster.master_of(&key), to);
    cluster.assert_every_key_has_ttl();
    (rounds, took)
}

/// A `RedisStore` behind a `Store` of a caller's own, which the limiter
/// cannot see through: it calls `Store::decide`, whose requests carry no
/// deadline (the limiter's timer bounds its wait).
#[derive(Debug, Clone)]
struct Wrapped(RedisStore);

impl Store for Wrapped {
    fn decide(
        &self,
        checks: Vec<redis_ratelimit::store::LimitCheck>,
        cost: u64,
    ) -> futures_util::future::BoxFuture<
        'static,
        Result<Vec<redis_ratelimit::store::LimitState>, redis_ratelimit::Error>,
    > {
        self.0.decide(checks, cost)
    }
}

/// A warmed-up limiter for the frozen-master tests (a 300 ms timeout, and
/// `breaker`), on a cluster whose other masters go on serving their slots
/// while one is down; its store [`Wrapped`] if `wrapped`.
async fn limiter_for_a_frozen_master(
    cluster: &RedisCluster,
    breaker: Breaker,
    wrapped: bool,
) -> Limiter {
    let builder = Limiter::builder("100000/1m".parse().unwrap());
    let builder = match wrapped {
        true => builder.store(Wrapped(cluster.store().await)),
        false => builder.store(cluster.store().await),
    };
    let limiter = builder
        .timeout(Duration::from_millis(300))
        .breaker(breaker)
        .build()
        .unwrap();
    assert!(limiter.check("warm", 1).await.unwrap().is_allowed());
    serve_without_full_coverage(cluster);
    limiter
}

/// Has every master of `cluster` go on serving its slots while another
/// master is down (`cluster-require-full-coverage no`).
fn serve_without_full_coverage(cluster: &RedisCluster) {
    for port in cluster.masters() {
        let set = redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-require-full-coverage")
            .arg("no")
            .clone();
        let () = cluster.query(port, &set);
    }
}

/// Thaws `frozen` and fails the test if any of round `round`'s `results`
/// is an error.
fn thaw_and_fail_on_errors(
    cluster: &RedisCluster,
    frozen: u16,
    round: usize,
    results: &[Result<Decision, redis_ratelimit::Error>],
) {
    let failed: Vec<_> = results.iter().filter(|r| r.is_err()).collect();
    if !failed.is_empty() {
        cluster.freeze(frozen, false);
        panic!(
            "round {round}: {} of {} failed: {:?}",
            failed.len(),
            results.len(),
            failed[0]
        );
    }
}

/// A master that stops answering holds up no decision of the other
/// masters' keys: the slot map is read again in the background (every 5 s,
/// from any node, the frozen one included), never in a round's way.
#[tokio::test]
async fn a_frozen_master_holds_up_no_other_masters_decisions() {
    let cluster = RedisCluster::start();
    let limiter = limiter_for_a_frozen_master(&cluster, Breaker::disabled(), false).await;
    let frozen = cluster.masters()[0];
    let clients: Vec<String> = (0..200)
        .map(|i| format!("f{i}"))
        .filter(|c| cluster.master_of(&limiter.store_key(c)) != frozen)
        .take(40)
        .collect();
    cluster.freeze(frozen, true);
    // Past two background reads of the map.
    let until = Instant::now() + Duration::from_secs(12);
    let mut rounds = 0;
    while Instant::now() < until {
        let results = join_all(clients.iter().map(|c| limiter.check(c, 1))).await;
        thaw_and_fail_on_errors(&cluster, frozen, rounds, &results);
        rounds += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.freeze(frozen, false);
    assert!(rounds > 50, "{rounds} rounds");
}

/// The same through a [`Wrapped`] store, with the frozen master's keys
/// checked too. A call to the frozen master lasted redis-rs's timeouts
/// and retries (seconds) after its callers had timed out, holding one of
/// the batching task's two rounds: with both held, the other masters' keys
/// waited in the queue and timed out as well. A call whose callers have
/// all gone is now dropped, and its round with it.
#[tokio::test]
async fn a_frozen_master_holds_up_no_other_masters_decisions_through_a_wrapped_store() {
    let cluster = RedisCluster::start();
    let limiter = limiter_for_a_frozen_master(&cluster, Breaker::disabled(), true).await;
    let frozen = cluster.masters()[0];
    let on_frozen = |c: &String| cluster.master_of(&limiter.store_key(c)) == frozen;
    let all: Vec<String> = (0..400).map(|i| format!("w{i}")).collect();
    let others: Vec<&String> = all.iter().filter(|c| !on_frozen(c)).take(40).collect();
    let frozen_ones: Vec<&String> = all.iter().filter(|c| on_frozen(c)).take(10).collect();
    cluster.freeze(frozen, true);
    let until = Instant::now() + Duration::from_secs(4);
    let mut rounds = 0;
    while Instant::now() < until {
        // The frozen master's keys time out; the others' must not.
        let (_, results) = tokio::join!(
            join_all(frozen_ones.iter().map(|c| limiter.check(c.as_str(), 1))),
            join_all(others.iter().map(|c| limiter.check(c.as_str(), 1))),
        );
        thaw_and_fail_on_errors(&cluster, frozen, rounds, &results);
        rounds += 1;
    }
    cluster.freeze(frozen, false);
    assert!(rounds > 3, "{rounds} rounds");
}

/// The batching task's first read of the slot map is bounded by its
/// requests' deadlines, as every later read before a round is: with every
/// master frozen before the store's first check, that check ends at its
/// own timeout (150 ms), not after the read's own bound (500 ms), during
/// which the task swept nothing.
#[tokio::test]
async fn the_first_read_of_the_slot_map_keeps_the_first_checks_deadline() {
    let cluster = RedisCluster::start();
    let limiter = cluster
        .builder("100/1m")
        .await
        .timeout(Duration::from_millis(150))
        .breaker(Breaker::disabled())
        .build()
        .unwrap();
    let masters = cluster.masters();
    for &port in &masters {
        cluster.freeze(port, true);
    }
    let started = Instant::now();
    let result = limiter.check("first", 1).await;
    let took = started.elapsed();
    for &port in &masters {
        cluster.freeze(port, false);
    }
    assert!(
        matches!(result, Err(redis_ratelimit::Error::Timeout(_))),
        "{result:?}"
    );
    assert!(took < Duration::from_millis(400), "{took:?}");
}

/// A key's fault domain on a cluster is its hash slot (as Redis computes
/// it, hash tags included) divided by 256.
#[tokio::test]
async fn a_keys_fault_domain_is_its_hash_slots_range() {
    let cluster = RedisCluster::start();
    let store = cluster.store().await;
    let pool = cluster.pool_store(2).await;
    let keys = [
        "a",
        "b",
        "user:1",
        "{user:1}:x",
        "x{}y",
        "{}",
        "k{tag}",
        "{a}{b}",
        "é",
    ];
    let many = (0..200).map(|i| format!("rl:fw:api:client-{i}"));
    for key in keys.into_iter().map(String::from).chain(many) {
        let expected = usize::from(cluster.slot_of(&key)) / 256;
        assert_eq!(store.fault_domain(&key), expected, "{key}");
        assert_eq!(pool.fault_domain(&key), expected, "{key}, a pool");
    }
    let limiter = cluster.limiter("5/1m").await;
    let tagged = limiter.store_key("c");
    assert_eq!(
        store.fault_domain(&tagged),
        usize::from(cluster.slot_of(&tagged)) / 256
    );
    // Other stores are one domain.
    assert_eq!(redis_ratelimit::MemoryStore::new().fault_domain("a"), 0);
}

/// A master that stops answering opens the circuit breaker of its own keys
/// only: with the default breaker, the other masters' keys are still
/// decided by the store, every one of them, while the frozen master's keys
/// fail at once (`CircuitOpen`) once their breakers open. With one breaker
/// for the limiter, the frozen master's timeouts opened it for every key.
#[tokio::test]
async fn a_frozen_master_opens_the_breaker_of_its_own_keys_only() {
    let cluster = RedisCluster::start();
    let limiter = limiter_for_a_frozen_master(&cluster, Breaker::new(), false).await;
    let frozen = cluster.masters()[0];
    let frozen_slots = cluster.slots_of(frozen);
    // A client is healthy when no slot of its key's 256-slot range is the
    // frozen master's (a range two masters share opens for both).
    let shares_a_range = |client: &str| {
        let range = cluster.slot_of(&limiter.store_key(client)) / 256;
        let (lo, hi) = (range * 256, range * 256 + 255);
        frozen_slots
            .iter()
            .any(|r| *r.start() <= hi && lo <= *r.end())
    };
    let candidates: Vec<String> = (0..400).map(|i| format!("c{i}")).collect();
    let healthy: Vec<&String> = (candidates.iter())
        .filter(|c| !shares_a_range(c))
        .take(40)
        .collect();
    let stuck: Vec<&String> = (candidates.iter())
        .filter(|c| cluster.master_of(&limiter.store_key(c)) == frozen)
        .take(20)
        .collect();
    assert_eq!((healthy.len(), stuck.len()), (40, 20));
    cluster.freeze(frozen, true);
    let until = Instant::now() + Duration::from_secs(5);
    let (mut rounds, mut open, mut timed_out) = (0, 0, 0);
    while Instant::now() < until {
        let (ok, bad) = futures_util::join!(
            join_all(healthy.iter().map(|c| limiter.check(c, 1))),
            join_all(stuck.iter().map(|c| limiter.check(c, 1))),
        );
        if let Some(e) = ok.iter().find_map(|r| r.as_ref().err()) {
            cluster.freeze(frozen, false);
            panic!("round {rounds}: a healthy master's key failed: {e:?}");
        }
        for r in bad {
            match r {
                Err(redis_ratelimit::Error::CircuitOpen) => open += 1,
                Err(redis_ratelimit::Error::Timeout(_)) => timed_out += 1,
                other => {
                    cluster.freeze(frozen, false);
                    panic!("round {rounds}: the frozen master's key: {other:?}");
                }
            }
        }
        rounds += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.freeze(frozen, false);
    // The breakers of the frozen master's keys opened: most of its checks
    // failed at once, not after the timeout.
    assert!(open > timed_out, "{open} open, {timed_out} timed out");
    assert!(rounds > 20, "{rounds} rounds");
}

/// 200 concurrent checks of one key against 50, spread over two cluster
/// connections and a pool (three replicas of a service): exactly 50 pass,
/// each seeing a different remaining count.
#[tokio::test]
async fn concurrent_checks_through_separate_connections_admit_exactly_the_limit() {
    let cluster = RedisCluster::start();
    let quota = Quota::per_minute(50);
    let mut limiters = Vec::new();
    for store in [
        cluster.store().await,
        cluster.store().await,
        cluster.pool_store(4).await,
    ] {
        let builder = Limiter::builder(quota).store(store);
        limiters.push(builder.timeout(support::TEST_TIMEOUT).build().unwrap());
    }
    let checks = (0..200).map(|i| limiters[i % 3].check("hot", 1));
    let ds: Vec<Decision> = join_all(checks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let mut remaining: Vec<u64> = ds
        .iter()
        .filter(|d| d.is_allowed())
        .map(Decision::remaining)
        .collect();
    remaining.sort_unstable();
    assert_eq!(
        remaining,
        (0..50).collect::<Vec<_>>(),
        "{} admitted",
        remaining.len()
    );
    cluster.assert_every_key_has_ttl();
}

/// Up to 3 leases per key, shared by two cluster connections; release frees
/// a slot; the lease set expires with its leases.
#[tokio::test]
async fn concurrency_limiter_holds_its_limit_on_a_cluster() {
    let cluster = RedisCluster::start();
    let lease = Duration::from_secs(10);
    let limiter = |store| {
        let builder = ConcurrencyLimiter::builder(3).store(store).lease(lease);
        builder.timeout(support::TEST_TIMEOUT).build().unwrap()
    };
    let (a, b) = (
        limiter(cluster.store().await),
        limiter(cluster.store().await),
    );
    for key in ["tenant-1", "tenant-2", "tenant-3"] {
        let mut held = Vec::new();
        for (i, limiter) in [&a, &b, &a].into_iter().enumerate() {
            let lease = limiter.acquire(key).await.unwrap().lease();
            let lease = lease.unwrap_or_else(|| panic!("slot {i} of {key} refused"));
            assert_eq!(lease.in_flight(), i as u64 + 1);
            held.push(lease);
        }
        let Acquired::Busy(busy) = b.acquire(key).await.unwrap() else {
            panic!("a 4th lease on {key} was granted");
        };
        assert_eq!(busy.in_flight(), 3);
        let store_key = a.store_key(key);
        let owner = cluster.master_of(&store_key);
        let ttl = cluster.keys_with_ttl()[&owner]
            .iter()
            .find(|(k, _)| *k == store_key)
            .map(|(_, t)| *t);
        let ttl = ttl.unwrap_or_else(|| panic!("{store_key} not on {owner}"));
        assert!((1..=10_000).contains(&ttl), "{store_key}: PTTL {ttl}");
        assert!(held.pop().unwrap().release().await.unwrap());
        assert!(
            b.acquire(key).await.unwrap().is_acquired(),
            "release freed nothing"
        );
    }
    // A 1 s lease renews itself (every 333 ms) on the cluster too: held
    // well past its first expiry.
    let short = ConcurrencyLimiter::builder(1).store(cluster.store().await);
    let short = short.lease(Duration::from_secs(1)).build().unwrap();
    let held = short.acquire("long").await.unwrap().lease().unwrap();
    tokio::time::sleep(Duration::from_millis(1800)).await;
    assert!(
        !short.acquire("long").await.unwrap().is_acquired(),
        "the renewed lease was lost"
    );
    assert!(held.release().await.unwrap(), "the lease had expired");
    cluster.assert_every_key_has_ttl();
}

/// After `SCRIPT FLUSH` on every node, the decide and lease scripts are
/// loaded again on first use (`NOSCRIPT`), and counting goes on.
#[tokio::test]
async fn scripts_come_back_after_script_flush_on_every_node() {
    let cluster = RedisCluster::start();
    let store = cluster.store().await;
    let limiter = Limiter::builder(Quota::per_minute(5))
        .store(store.clone())
        .build()
        .unwrap();
    let leases = ConcurrencyLimiter::builder(1).store(store).build().unwrap();
    let decide_sha = redis::Script::new(redis_ratelimit::store::DECIDE_FIXED_LUA)
        .get_hash()
        .to_owned();
    let acquire_sha = redis::Script::new(redis_ratelimit::store::ACQUIRE_LUA);
    let acquire_sha = acquire_sha.get_hash().to_owned();
    let rate_owner = cluster.master_of(&limiter.store_key("k"));
    let lease_owner = cluster.master_of(&leases.store_key("k"));

    assert_eq!(
        summary(&decisions(&limiter, "k", 2).await),
        FIVE_THEN_DENIED[..2]
    );
    let lease = leases.acquire("k").await.unwrap().lease().unwrap();
    assert!(lease.release().await.unwrap());
    for _ in 0..2 {
        cluster.flush_scripts();
        assert!(!cluster.has_script(rate_owner, &decide_sha));
        assert!(!cluster.has_script(lease_owner, &acquire_sha));
        let d = limiter.check("k", 1).await.unwrap();
        assert!(cluster.has_script(rate_owner, &decide_sha), "not reloaded");
        let lease = leases.acquire("k").await.unwrap().lease().unwrap();
        assert!(
            cluster.has_script(lease_owner, &acquire_sha),
            "not reloaded"
        );
        cluster.flush_scripts();
        assert!(lease.release().await.unwrap(), "release after a flush");
        assert!(d.is_allowed());
    }
    assert_eq!(limiter.check("k", 1).await.unwrap().remaining(), 0);
    cluster.assert_every_key_has_ttl();
}

/// A master that lost its scripts (restarted, `SCRIPT FLUSH`) while another
/// master is frozen: the script is loaded on the first alone, and its keys
/// are decided. Fails with `SCRIPT LOAD` after `NOSCRIPT`, which redis-rs
/// sends to every node and which waits for every one: every call to the
/// healthy master timed out until the frozen one came back.
#[tokio::test]
async fn a_master_that_lost_its_scripts_is_used_while_another_is_frozen() {
    let cluster = RedisCluster::start();
    let limiter = cluster
        .builder("100/1m")
        .await
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    assert!(limiter.check("k", 1).await.unwrap().is_allowed());
    let owner = cluster.master_of(&limiter.store_key("k"));
    let frozen = *cluster.masters().iter().find(|&&m| m != owner).unwrap();
    cluster.freeze(frozen, true);
    let _: () = cluster.query(owner, redis::cmd("SCRIPT").arg("FLUSH"));
    let decided = limiter.check("k", 1).await;
    cluster.freeze(frozen, false);
    let d = decided.unwrap_or_else(|e| panic!("{e}\n{}", cluster.log()));
    assert_eq!((d.is_allowed(), d.remaining()), (true, 98));
    cluster.assert_every_key_has_ttl();
}

/// The slot of a counted key moves to another master: while it migrates,
/// the old master answers `ASK` and the store follows it to the new one;
/// after, the old master answers `MOVED`. The count goes on exactly, even
/// when the script must be loaded again on the way.
#[tokio::test]
async fn the_same_limiter_follows_a_slot_migration() {
    let cluster = RedisCluster::start();
    let limiter = cluster.limiter("100/1m").await;
    let remaining = |d: Decision| (d.is_allowed(), d.remaining());
    for left in [99, 98, 97] {
        assert_eq!(
            remaining(limiter.check("k", 1).await.unwrap()),
            (true, left)
        );
    }
    let key = limiter.store_key("k");
    let (slot, from) = (cluster.slot_of(&key), cluster.master_of(&key));
    let to = cluster.masters().into_iter().find(|p| *p != from).unwrap();

    cluster.migrate_slot(slot, from, to);
    assert_eq!(cluster.keys_per_master()[&from], 0, "the key did not move");
    // The new master must load the script on the way, too.
    cluster.flush_scripts();
    assert_eq!(
        remaining(limiter.check("k", 1).await.unwrap()),
        (true, 96),
        "ASK"
    );
    cluster.finish_migration(slot, to);
    assert_eq!(
        remaining(limiter.check("k", 1).await.unwrap()),
        (true, 95),
        "MOVED"
    );

    assert_eq!(cluster.master_of(&key), to);
    assert_eq!(cluster.keys_per_master()[&to], 1);
    cluster.assert_every_key_has_ttl();
}

/// The master owning a key is killed. While no node serves its slot, checks
/// fail within the limiter's timeout; once a replica is promoted, the same
/// limiter decides again, with the count the replica kept.
#[tokio::test]
async fn the_same_limiter_recovers_after_its_master_fails_over() {
    let mut cluster = RedisCluster::with_replicas();
    let timeout = Duration::from_millis(500);
    let store = cluster.store().await;
    let limiter = Limiter::builder(Quota::per_minute(100)).store(store);
    let limiter = limiter.timeout(timeout).build().unwrap();
    for _ in 0..3 {
        assert!(limiter.check("k", 1).await.unwrap().is_allowed());
    }
    let key = limiter.store_key("k");
    let old = cluster.master_of(&key);
    let replicas = cluster.replicas();
    cluster.wait_replicated();

    cluster.kill(old);
    let killed = Instant::now();
    let (mut errors, mut last_error, mut slowest) = (0, String::new(), Duration::ZERO);
    let recovered = loop {
        let started = Instant::now();
        let result = limiter.check("k", 1).await;
        let took = started.elapsed();
        assert!(
            took < timeout + Duration::from_millis(400),
            "a check took {took:?}"
        );
        match result {
            Ok(d) => break d,
            Err(e) => (errors, last_error) = (errors + 1, e.to_string()),
        }
        slowest = slowest.max(took);
        let waited = killed.elapsed();
        assert!(
            waited < Duration::from_secs(15),
            "no recovery {waited:?} after the kill ({errors} errors, last: {last_error})\n{}",
            cluster.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "recovered {:?} after the kill; {errors} checks failed before, the slowest in \
         {slowest:?} (last: {last_error})",
        killed.elapsed()
    );
    assert!(errors > 0, "no check failed while the slot had no master");
    // The other nodes learn of the promotion from the gossip, soon after.
    let promoted = |c: &RedisCluster| c.master_of(&key) != old;
    cluster.wait_until(Duration::from_secs(5), "the promotion", promoted);
    let new = cluster.master_of(&key);
    assert!(
        new != old && replicas.contains(&new),
        "{old} -> {new}, replicas {replicas:?}"
    );
    // The 3 counted before the kill survived; checks that timed out during
    // the outage may have been applied late (redis-rs retries them).
    assert!(
        recovered.is_allowed() && recovered.remaining() <= 96,
        "{recovered:?}"
    );
    let mut last = recovered.remaining();
    // The dead node must not stop the script from being loaded again.
    cluster.flush_scripts();
    for _ in 0..10 {
        let d = limiter.check("k", 1).await.unwrap();
        assert!(d.is_allowed() && d.remaining() < last, "{d:?} after {last}");
        last = d.remaining();
    }
    cluster.assert_every_key_has_ttl();
}

/// A bb8 pool of cluster connections (built without a checkout PING, as
/// `RedisStore::from_cluster_pool` recommends) decides again within 2 s of a
/// master being killed and restarted on its port, on every connection of
/// the pool, and limits a key at its quota.
#[tokio::test]
async fn a_pool_of_cluster_connections_recovers_after_a_master_restarts() {
    let mut cluster = RedisCluster::start();
    let store = cluster.pool_store(4).await;
    let limiter = Limiter::builder(Quota::per_minute(1000)).store(store);
    let limiter = limiter.timeout(support::TEST_TIMEOUT).build().unwrap();
    let port = cluster.master_of(&limiter.store_key("k"));
    let warm = join_all((0..16).map(|_| limiter.check("k", 1))).await;
    assert!(warm.iter().all(Result::is_ok), "{warm:?}");

    cluster.kill(port);
    assert!(
        limiter.check("k", 1).await.is_err(),
        "answered with its master dead"
    );
    cluster.restart(port);
    let restarted = Instant::now();
    while limiter.check("k", 1).await.is_err() {
        assert!(
            restarted.elapsed() < Duration::from_secs(2),
            "no decision 2 s after the master restarted\n{}",
            cluster.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after = join_all((0..16).map(|_| limiter.check("k", 1))).await;
    assert!(
        after.iter().all(Result::is_ok),
        "{after:?}\n{}",
        cluster.log()
    );
    // The restarted master's key space is empty: a key admits its 1000 once.
    let key = (0..)
        .map(|i| format!("after{i}"))
        .find(|k| cluster.master_of(&limiter.store_key(k)) == port)
        .unwrap();
    assert!(limiter.check(&key, 1000).await.unwrap().is_allowed());
    assert!(!limiter.check(&key, 1).await.unwrap().is_allowed());
    cluster.assert_every_key_has_ttl();
}

/// On a cluster, `INFO memory` goes to every master: one that may evict
/// the limiter's keys is warned of at startup (the warning names its
/// policy, not the node) even when the node the seed list starts with may
/// not.
#[tokio::test]
async fn a_node_that_may_evict_the_counters_is_warned_of_at_startup() {
    let cluster = RedisCluster::start();
    let seeds = cluster.seed_urls();
    let port: u16 = seeds
        .last()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    for (name, value) in [("maxmemory", "100mb"), ("maxmemory-policy", "allkeys-lfu")] {
        let _: () = cluster.query(port, redis::cmd("CONFIG").arg("SET").arg(name).arg(value));
    }
    let captured = support::logs::Captured::default();
    let guard = captured.install();
    let store = cluster.store().await;
    drop(guard);
    drop(store);
    let warnings = captured.warning_lines();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(
        warnings[0].contains("maxmemory-policy is allkeys-lfu"),
        "{warnings:#?}"
    );
}

/// A `Store::decide` request whose keys are on two masters fails alone
/// (the cluster refuses it, `CROSSSLOT`), and the limiter's checks sent
/// at the same time on the first key's master are decided. It was batched
/// with them by its first key, the script aborted at its second key on
/// another node, and every request of that call got the error: from 7 to
/// all 60 of the limiter's checks a round failed, some after their units
/// were spent, and the failures could open the limiter's breaker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_keys_span_masters_fails_alone() {
    use redis_ratelimit::store::LimitCheck;
    let cluster = RedisCluster::start();
    let store = cluster.store().await;
    let limiter = Limiter::builder("1000/1m".parse().unwrap())
        .store(store.clone())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    assert!(limiter.check("warm", 1).await.unwrap().is_allowed());
    let masters = cluster.masters();
    let on = |m: u16| {
        (0..10_000)
            .map(|i| format!("k{i}"))
            .find(|k| cluster.master_of(k) == m)
            .unwrap()
    };
    let spanning: Vec<LimitCheck> = [on(masters[0]), on(masters[1])]
        .into_iter()
        .map(|key| LimitCheck {
            key,
            quota: Quota::per_minute(10),
            shadow: false,
        })
        .collect();
    let clients: Vec<String> = (0..1000)
        .map(|i| format!("c{i}"))
        .filter(|c| cluster.master_of(&limiter.store_key(c)) == masters[0])
        .take(60)
        .collect();
    for round in 0..5 {
        let checks = join_all(clients.iter().map(|c| limiter.check(c, 1)));
        let (decided, refused) = tokio::join!(checks, async {
            tokio::task::yield_now().await;
            store.decide(spanning.clone(), 1).await
        });
        assert!(refused.is_err(), "round {round}: {refused:?}");
        for (client, decision) in clients.iter().zip(&decided) {
            let d = decision.as_ref().unwrap_or_else(|e| {
                panic!("round {round}: {client} failed beside the spanning request: {e}")
            });
            assert!(d.is_allowed() && d.remaining() == 999 - round, "{d:?}");
        }
    }
    cluster.assert_every_key_has_ttl();
}

/// While a frozen master's keys keep coming, a check of another master's
/// key waits for no call to the frozen one: each takes well under the
/// limiter's 2 s timeout. Calls go out in rounds (one call per node, two
/// rounds in flight), and a round's permit was held until its slowest
/// call ended: with a check of the frozen master in every round, the
/// other masters' checks waited for a round about as long as the frozen
/// calls took (their timeout, or redis-rs's own). A call outstanding past
/// a grace now gives its round's permit back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_masters_calls_hold_no_round_from_the_other_masters() {
    let cluster = RedisCluster::start();
    let limiter = Limiter::builder("100000000/1m".parse().unwrap())
        .store(cluster.store().await)
        .timeout(Duration::from_secs(2))
        .breaker(Breaker::disabled())
        .build()
        .unwrap();
    assert!(limiter.check("warm", 1).await.unwrap().is_allowed());
    serve_without_full_coverage(&cluster);
    let frozen = cluster.masters()[0];
    let on_frozen = |c: &String| cluster.master_of(&limiter.store_key(c)) == frozen;
    let all: Vec<String> = (0..2000).map(|i| format!("h{i}")).collect();
    let others: Vec<String> = all
        .iter()
        .filter(|c| !on_frozen(c))
        .take(100)
        .cloned()
        .collect();
    let stuck: Vec<String> = all
        .iter()
        .filter(|c| on_frozen(c))
        .take(100)
        .cloned()
        .collect();
    cluster.freeze(frozen, true);
    let until = Instant::now() + Duration::from_secs(3);
    let mut checks = Vec::new();
    let mut i = 0;
    while Instant::now() < until {
        let (l, key) = (limiter.clone(), stuck[i % stuck.len()].clone());
        tokio::spawn(async move { l.check(&key, 1).await });
        let (l, key) = (limiter.clone(), others[i % others.len()].clone());
        checks.push(tokio::spawn(async move {
            let asked = Instant::now();
            (l.check(&key, 1).await, asked.elapsed())
        }));
        i += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut slowest = Duration::ZERO;
    for check in checks {
        let (result, took) = check.await.unwrap();
        if let Err(e) = result {
            cluster.freeze(frozen, false);
            panic!("a live master's check failed: {e}");
        }
        slowest = slowest.max(took);
    }
    cluster.freeze(frozen, false);
    assert!(
        slowest < Duration::from_millis(700),
        "a live master's check took {slowest:?} beside a frozen master"
    );
}
