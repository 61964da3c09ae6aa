//! Redis Sentinel (feature `sentinel`) against real sentinels on loopback:
//! the store finds the master through them, fails at startup naming an
//! unknown master, and after the master dies and the sentinels promote the
//! replica, decides again on the new master with the counts the replica
//! already had; so too when the master freezes rather than dies, and when
//! the first sentinel listed does not answer while checks time out sooner
//! than a lookup takes, and when the master is cut off from its replica
//! and its sentinels but not from the store, and refuses every write
//! (`NOREPLICAS`) rather than being demoted.

mod support;

use std::time::{Duration, Instant};

use redis::{
    ConnectionAddr,
    sentinel::{SentinelClientBuilder, SentinelServerType},
};
use redis_ratelimit::{Decision, Error, Limiter, RedisStore};
use support::{
    TEST_TIMEOUT,
    limits::every_check,
    sentinel::{APP, MASTER, Sentinels, query, query_as_app, replication},
};

/// A limiter timeout shorter than a lookup of the master that waits for a
/// sentinel that does not answer (its response timeout, 0.5 s).
const SHORT: Duration = Duration::from_millis(200);

/// How long a test waits for the store to decide again after the fault.
const RECOVERY: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_follows_a_failover_and_keeps_counting_on_the_promoted_replica() {
    let mut deployment = Sentinels::start().await;

    // A name no sentinel monitors fails at startup, naming the cause.
    match RedisStore::sentinel(deployment.urls(), "no-such-master").await {
        Err(Error::Startup(message)) => {
            assert!(
                message.contains("no sentinel names a healthy master"),
                "{message}"
            )
        }
        other => panic!("expected a startup error, got {other:?}"),
    }

    let store = RedisStore::sentinel(deployment.urls(), MASTER)
        .await
        .unwrap_or_else(|e| panic!("RedisStore::sentinel: {e}\n{}", deployment.log()));
    let limiter = Limiter::builder("100/1h".parse().unwrap())
        .store(store)
        .timeout(TEST_TIMEOUT)
        .build()
        .unwrap();
    // The replica has every write before the master dies.
    spend_ten_and_replicate(&limiter, &deployment).await;

    deployment.master.kill();
    let decision = decided_again(&limiter, &deployment, "the master's death").await;
    assert_counted_on_the_promoted_replica(&decision, &deployment).await;
    // Every check reached the dead master or the new one in time (a 2 s
    // timeout): the count carried on exactly.
    assert_eq!(
        decision.remaining(),
        89,
        "the count restarted\n{}",
        deployment.log()
    );
    let next = limiter.check("user:1", 1).await.unwrap();
    assert_eq!(next.remaining(), 88);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_leaves_a_frozen_master_once_the_sentinels_promote_its_replica() {
    let mut deployment = Sentinels::start().await;
    let limiter = short_limiter(&deployment).await;
    spend_ten_and_replicate(&limiter, &deployment).await;

    // Its connections stay open and it answers nothing: no call on it ever
    // fails, each is dropped at the limiter's timeout.
    deployment.master.freeze(true);
    let decision = decided_again(&limiter, &deployment, "the master froze").await;
    assert_counted_on_the_promoted_replica(&decision, &deployment).await;
    // SIGKILL ends a stopped process too.
    deployment.master.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_first_sentinel_does_not_stop_the_store_finding_the_new_master() {
    let mut deployment = Sentinels::start().await;
    let limiter = short_limiter(&deployment).await;
    spend_ten_and_replicate(&limiter, &deployment).await;

    // The first sentinel listed accepts connections and answers nothing: a
    // lookup reads its answer first, so each waits for its response
    // timeout, longer than the limiter's. The other two still vote the
    // failover (quorum 2).
    deployment.sentinels[0].freeze(true);
    deployment.master.kill();
    let decision = decided_again(&limiter, &deployment, "the master died").await;
    assert_counted_on_the_promoted_replica(&decision, &deployment).await;
    deployment.sentinels[0].kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_leaves_a_master_cut_off_from_its_replicas_that_refuses_writes() {
    let mut deployment = Sentinels::start_isolable().await;
    let addrs = deployment
        .sentinels
        .iter()
        .map(|sentinel| ConnectionAddr::Tcp("127.0.0.1".into(), sentinel.port()));
    let (user, password) = APP;
    let client = SentinelClientBuilder::new(addrs, MASTER, SentinelServerType::Master)
        .and_then(|builder| {
            builder
                .set_client_to_redis_username(user)
                .set_client_to_redis_password(password)
                .build()
        })
        .unwrap();
    let store = RedisStore::from_sentinel(client)
        .await
        .unwrap_or_else(|e| panic!("RedisStore::from_sentinel: {e}\n{}", deployment.log()));
    let limiter = refusals_only_limiter(store);
    spend_ten_and_replicate(&limiter, &deployment).await;

    deployment.isolate_master().await;
    let decision = decided_again(&limiter, &deployment, "the master was cut off").await;
    assert_counted_on_the_promoted_replica(&decision, &deployment).await;
    // The old master is still a master, and still refuses writes: the store
    // left it, it was not demoted under it.
    let old: redis::RedisResult<i64> = query_as_app(
        deployment.master.port(),
        redis::cmd("EVAL")
            .arg("return redis.call('INCR', KEYS[1])")
            .arg(1)
            .arg("probe"),
    )
    .await;
    let refused = old.expect_err("the old master took a write");
    assert!(
        refused.to_string().contains("NOREPLICAS"),
        "{refused}\n{}",
        deployment.log()
    );
    deployment.master.kill();
}

/// A master only short of replicas (its replica frozen, the sentinels
/// naming it still) refuses every write with `NOREPLICAS` for as long as
/// that lasts. The store asks the sentinels whether the master changed,
/// but less and less often while they name the same one. Each lookup
/// checks the master's `ROLE` (about twice here, on new connections): 7
/// `ROLE`s in the 6 s watched; fails with a lookup every 500 ms, 28.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_for_a_master_only_short_of_replicas_back_off() {
    let deployment = Sentinels::start_needing_a_replica().await;
    let store = RedisStore::sentinel(deployment.urls(), MASTER)
        .await
        .unwrap_or_else(|e| panic!("RedisStore::sentinel: {e}\n{}", deployment.log()));
    let limiter = refusals_only_limiter(store);
    assert!(limiter.check("user:1", 1).await.unwrap().is_allowed());
    deployment.replica.freeze(true);
    let refused = |e: &Error| e.to_string().contains("NOREPLICAS");
    let since = Instant::now();
    loop {
        match limiter.check("user:1", 1).await {
            Err(e) if refused(&e) => break,
            _ => {}
        }
        assert!(
            since.elapsed() < RECOVERY,
            "the master never refused a write\n{}",
            deployment.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let port = deployment.master.port();
    let _: () = query(port, redis::cmd("CONFIG").arg("RESETSTAT"))
        .await
        .unwrap();
    let watched = Instant::now();
    let mut failures = 0;
    while watched.elapsed() < Duration::from_secs(6) {
        if let Err(e) = limiter.check("user:1", 1).await {
            assert!(refused(&e), "{e}\n{}", deployment.log());
            failures += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats: String = query(port, redis::cmd("INFO").arg("commandstats"))
        .await
        .unwrap();
    let roles = stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_role:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse::<u64>().unwrap());
    println!("{roles} ROLE calls in 6 s of {failures} refused checks");
    assert!(
        failures > 50,
        "{failures} refused checks\n{}",
        deployment.log()
    );
    assert!(
        (1..=14).contains(&roles),
        "{roles} ROLE calls on the master in 6 s\n{}",
        deployment.log()
    );
}

/// A limiter of 100 an hour on the deployment's master whose every check
/// reaches the store (no breaker, no deny cache) and gives up after
/// [`SHORT`].
async fn short_limiter(deployment: &Sentinels) -> Limiter {
    let store = RedisStore::sentinel(deployment.urls(), MASTER)
        .await
        .unwrap_or_else(|e| panic!("RedisStore::sentinel: {e}\n{}", deployment.log()));
    every_check("100/1h".parse().unwrap(), store)
        .timeout(SHORT)
        .build()
        .unwrap()
}

/// A limiter of 100 an hour on `store` whose every check reaches it, with a
/// timeout of 40 ms: below the 50 ms after which a call dropped unanswered
/// has the store look for another master, so only refusals can.
fn refusals_only_limiter(store: RedisStore) -> Limiter {
    every_check("100/1h".parse().unwrap(), store)
        .timeout(Duration::from_millis(40))
        .build()
        .unwrap()
}

/// Spends 10 of `user:1`'s 100, and waits until the replica has them.
async fn spend_ten_and_replicate(limiter: &Limiter, deployment: &Sentinels) {
    for spent in 1..=10 {
        let decision = limiter.check("user:1", 1).await.unwrap();
        assert!(decision.is_allowed());
        assert_eq!(decision.remaining(), 100 - spent);
    }
    let acked: i64 = query(
        deployment.master.port(),
        redis::cmd("WAIT").arg(1).arg(5000),
    )
    .await
    .unwrap();
    assert_eq!(
        acked,
        1,
        "the replica did not acknowledge\n{}",
        deployment.log()
    );
}

/// Checks `user:1` every 50 ms until the store decides one, for at most
/// [`RECOVERY`] after the fault (`fault` names it).
async fn decided_again(limiter: &Limiter, deployment: &Sentinels, fault: &str) -> Decision {
    let since = Instant::now();
    let mut failures = 0;
    loop {
        match limiter.check("user:1", 1).await {
            Ok(decision) => {
                println!(
                    "decided again {:?} after {fault}, after {failures} failed checks; {} remaining",
                    since.elapsed(),
                    decision.remaining()
                );
                return decision;
            }
            Err(_) => failures += 1,
        }
        assert!(
            since.elapsed() < RECOVERY,
            "no decision within {RECOVERY:?} after {fault} ({failures} failed checks)\n{}",
            deployment.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The replica was promoted and `decision` counted on from the 10 spent
/// before the fault.
async fn assert_counted_on_the_promoted_replica(decision: &Decision, deployment: &Sentinels) {
    assert!(
        replication(deployment.replica.port())
            .await
            .contains("role:master"),
        "the replica was not promoted\n{}",
        deployment.log()
    );
    assert!(decision.is_allowed());
    // 89, unless a check on the new master timed out after Redis ran it
    // (its unit spent all the same); a count started over would read 99.
    assert!(
        (80..=89).contains(&decision.remaining()),
        "the count did not carry on: {} remaining\n{}",
        decision.remaining(),
        deployment.log()
    );
}

/// Sentinels reached over TLS (`rediss://`) name a master that speaks TLS
/// only: the store reaches it over TLS too. Fails with the master reached
/// in plain TCP whatever the sentinels' scheme (the store never starts).
#[cfg(feature = "tls")]
#[tokio::test]
async fn over_tls_sentinels_the_master_is_reached_over_tls() {
    let pki = support::tls::Pki::new();
    let master = pki.server(&[]);
    let conf = format!("sentinel monitor {MASTER} 127.0.0.1 {} 1\n", master.port());
    let sentinel = pki.sentinel(&conf);
    // The test CA is not the system's: no certificate check, for either.
    let url = format!("{}/#insecure", sentinel.url());
    let store = RedisStore::sentinel([url.as_str()], MASTER)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", sentinel.log(), master.log()));
    let limiter = every_check("2/1m".parse().unwrap(), store).build().unwrap();
    assert!(limiter.check("k", 1).await.unwrap().is_allowed());
    assert_eq!(limiter.check("k", 1).await.unwrap().remaining(), 0);
    // A list that mixes the schemes says nothing sure of the master.
    let mixed = [url.as_str(), "redis://127.0.0.1:1"];
    match RedisStore::sentinel(mixed, MASTER).await {
        Err(Error::Startup(message)) => assert!(message.contains("mix"), "{message}"),
        other => panic!("{other:?}"),
    }
}
