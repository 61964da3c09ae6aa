//! Redis Sentinel (feature `sentinel`) against real sentinels on loopback:
//! the store finds the master through them, fails at startup naming an
//! unknown master, and after the master dies and the sentinels promote the
//! replica, decides again on the new master with the counts the replica
//! already had.

mod support;

use std::time::{Duration, Instant};

use redis_ratelimit::{Error, Limiter, RedisStore};
use support::{
    TEST_TIMEOUT,
    sentinel::{MASTER, Sentinels, query, replication},
};

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
    for spent in 1..=10 {
        let decision = limiter.check("user:1", 1).await.unwrap();
        assert!(decision.is_allowed());
        assert_eq!(decision.remaining(), 100 - spent);
    }
    // The replica has every write before the master dies.
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

    deployment.master.kill();
    let killed = Instant::now();
    let limit = Duration::from_secs(20);
    let mut failures = 0;
    let decision = loop {
        match limiter.check("user:1", 1).await {
            Ok(decision) => break decision,
            Err(_) => failures += 1,
        }
        assert!(
            killed.elapsed() < limit,
            "no decision within {limit:?} of the master's death\n{}",
            deployment.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!(
        "decided again {:?} after the kill, after {failures} failed checks",
        killed.elapsed()
    );
    // On the promoted replica, with the count carried on, not reset.
    assert!(
        replication(deployment.replica.port())
            .await
            .contains("role:master"),
        "the replica was not promoted\n{}",
        deployment.log()
    );
    assert!(decision.is_allowed());
    assert_eq!(
        decision.remaining(),
        89,
        "the count restarted\n{}",
        deployment.log()
    );
    let next = limiter.check("user:1", 1).await.unwrap();
    assert_eq!(next.remaining(), 88);
}
