//! Recipe: a distributed lock with owner tokens, on the concurrency limiter
//! with N = 1.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use redis::AsyncCommands;
use redis_ratelimit::{
    ConfigError, Error,
    concurrency::{Acquired, ConcurrencyLimiter},
    store::LeaseStore,
};
use tokio::task::JoinSet;

use crate::support::{
    RedisServer,
    lease::{Gauge, LEASE, unrenewed},
};

// ANCHOR: lock
/// Locks by resource name, one holder at a time across every replica. A
/// holder that dies loses its lock after `lease`; one that lives renews it.
pub fn locks(store: impl LeaseStore, lease: Duration) -> Result<ConcurrencyLimiter, ConfigError> {
    ConcurrencyLimiter::builder(1)
        .name("lock")
        .lease(lease)
        .store(store)
        .build()
}

/// Runs `work` holding `resource`'s lock; `None` at once if another holds it.
pub async fn with_lock<T>(
    locks: &ConcurrencyLimiter,
    resource: &str,
    work: impl Future<Output = T>,
) -> Result<Option<T>, Error> {
    let Acquired::Lease(lease) = locks.acquire(resource).await? else {
        return Ok(None);
    };
    let out = work.await;
    // The release removes this holder's own token and nothing else.
    match lease.release().await {
        Ok(true) => {}
        // The lease ran out or was lost while `work` ran (the process
        // stalled for longer than the lease, renewals included, or Redis
        // lost it), even if it was taken back since: another holder may
        // have overlapped. See "Fencing" in docs/recipes.md.
        Ok(false) => tracing::warn!(resource, "lock expired while held"),
        // It expires on its own.
        Err(e) => tracing::warn!(resource, error = %e, "lock release failed"),
    }
    Ok(Some(out))
}
// ANCHOR_END: lock

/// 16 workers on two replicas each do 5 non-atomic read-modify-writes of one
/// Redis counter (GET, pause, SET) under the lock: never two holders at once,
/// and not one update lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_holder_at_a_time_across_replicas() {
    let server = RedisServer::start();
    let long = Duration::from_secs(30);
    let replicas = [
        locks(server.store().await, long).unwrap(),
        locks(server.store().await, long).unwrap(),
    ];
    let gauge = Gauge::default();
    let mut tasks = JoinSet::new();
    for worker in 0..16 {
        let (locks, gauge) = (replicas[worker % 2].clone(), gauge.clone());
        let mut conn = server.conn().await;
        tasks.spawn(async move {
            let (mut done, mut busy) = (0, 0);
            while done < 5 {
                let update = async {
                    let _holding = gauge.enter();
                    let n: Option<u64> = conn.get("counter").await.unwrap();
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    let n = n.unwrap_or(0) + 1;
                    let _: () = conn.set_ex("counter", n, 60).await.unwrap();
                };
                match with_lock(&locks, "invoice:7", update).await {
                    Ok(Some(())) => done += 1,
                    // A timed-out acquire (a loaded machine) is retried, as
                    // busy is: its token, if it landed, is released.
                    Ok(None) | Err(Error::Timeout(_)) => {
                        busy += 1;
                        tokio::time::sleep(Duration::from_millis(3)).await;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            busy
        });
    }
    let mut contended = 0;
    while let Some(busy) = tasks.join_next().await {
        contended += busy.unwrap();
    }
    assert!(contended > 0, "the workers never met");
    assert_eq!(gauge.max(), 1, "two holders at once\n{}", server.log());
    let total: u64 = server.conn().await.get("counter").await.unwrap();
    assert_eq!(total, 16 * 5, "lost updates\n{}", server.log());
    server.assert_every_key_has_ttl().await;
}

/// A release with another token frees nothing; a holder that stops renewing
/// (it died, or stalled) loses the lock after the lease, and its release
/// when it comes back does not free the new holder's lock.
#[tokio::test]
async fn only_the_owner_frees_the_lock_and_a_dead_holders_lock_expires() {
    let server = RedisServer::start();
    let store = server.store().await;
    let a = locks(store.clone(), LEASE).unwrap();
    let b = locks(server.store().await, LEASE).unwrap();

    let holder = a.acquire("report").await.unwrap().lease().unwrap();
    let key = holder.store_key().to_owned();
    let other = store.release(&key, "someone-else").await.unwrap();
    assert!(!other, "a stranger's release removed something");
    assert!(!b.acquire("report").await.unwrap().is_acquired());
    assert!(holder.release().await.unwrap());

    // A holder whose renewals stopped (its runtime is gone).
    let stalled = unrenewed(&a, "report").await;
    assert!(!b.acquire("report").await.unwrap().is_acquired());
    let deadline = Instant::now() + LEASE * 10;
    let new_holder = loop {
        if let Some(lease) = b.acquire("report").await.unwrap().lease() {
            break lease;
        }
        assert!(Instant::now() < deadline, "never expired\n{}", server.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The stalled holder comes back and releases: nothing is freed.
    assert!(!stalled.release().await.unwrap(), "released a lapsed lease");
    assert!(!a.acquire("report").await.unwrap().is_acquired());
    assert!(!b.acquire("report").await.unwrap().is_acquired());
    assert!(new_holder.release().await.unwrap());
    assert!(a.acquire("report").await.unwrap().is_acquired());
    server.assert_every_key_has_ttl().await;
}
