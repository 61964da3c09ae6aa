//! A bb8 pool of Redis connections recovers after Redis is killed and
//! restarted on the same port, under both store-error policies: bb8-redis
//! never reports a connection broken, and the pool is built without a PING
//! on checkout, as `RedisStore::from_pool` recommends, so the store itself
//! must replace a connection that failed.

mod support;

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use http::StatusCode;
use redis_ratelimit::{Limiter, OnStoreError};
use support::{
    RedisServer,
    inproc::{call, decided, service},
};

/// Kill -9, restart on the same port: the limiter decides again within 2 s
/// of the restart, every connection of the pool (all 8 open, and all
/// broken by the kill) works again, and a key is limited at its quota.
async fn pool_recovers_after_restart(policy: OnStoreError) {
    let mut server = RedisServer::start();
    // The defaults but for the store: 200 ms timeout, the default breaker.
    // All 8 connections open from the start (bb8 opens them as checks need
    // them, which 32 at once usually do, but not surely), so that all 8 are
    // broken by the kill, and shown to recover.
    let manager = bb8_redis::RedisConnectionManager::new(server.url()).unwrap();
    let pool = bb8::Pool::builder()
        .max_size(8)
        .min_idle(Some(8))
        .test_on_check_out(false)
        .build(manager)
        .await
        .unwrap();
    let limiter = Limiter::builder("40/1m".parse().unwrap())
        .store(redis_ratelimit::RedisStore::from_pool(pool))
        .build()
        .unwrap();
    let svc = service(&limiter, policy);
    let warm = join_all((0..32).map(|_| call(&svc))).await;
    assert!(warm.iter().all(decided), "{warm:?}\n{}", server.log());
    let open = client_ids(&server).await.len();
    assert_eq!(open, 8, "the pool's connections before the kill");

    server.kill();
    let outage = if policy == OnStoreError::Allow {
        200
    } else {
        503
    };
    for _ in 0..10 {
        let res = call(&svc).await;
        assert_eq!(res.status().as_u16(), outage, "{res:?}");
        assert!(!decided(&res), "{res:?}");
    }

    server.restart();
    let restarted = Instant::now();
    // Probes sent to the restarted Redis: each may have spent a unit.
    let mut probes = 0_usize;
    loop {
        probes += 1;
        if decided(&call(&svc).await) {
            break;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(2),
            "{policy:?}: no decision 2 s after Redis restarted\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = restarted.elapsed();

    // Every connection decides again, not just the one that was repaired.
    let checks = join_all((0..32).map(|_| limiter.check("spread", 1))).await;
    for r in &checks {
        assert!(
            r.is_ok(),
            "{policy:?}: {r:?} after recovery\n{}",
            server.log()
        );
    }
    // Limiting is enforced: the key (empty after the restart, then spent by
    // the probe that was decided, and perhaps by those that were not)
    // admits what is left of its 40, then denies.
    let mut statuses = Vec::new();
    for _ in 0..45 {
        let res = call(&svc).await;
        assert!(
            decided(&res),
            "{policy:?}: undecided after recovery: {res:?}"
        );
        statuses.push(res.status());
    }
    let admitted = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert!(
        (40_usize.saturating_sub(probes)..=39).contains(&admitted),
        "{policy:?}: {admitted} admitted against 40, {probes} probes"
    );
    assert_eq!(statuses.last(), Some(&StatusCode::TOO_MANY_REQUESTS));
    server.assert_every_key_has_ttl().await;
    eprintln!("{policy:?}: decided again {took:?} after the restart");
}

#[tokio::test]
async fn pool_recovers_after_redis_restarts_under_allow() {
    pool_recovers_after_restart(OnStoreError::Allow).await;
}

#[tokio::test]
async fn pool_recovers_after_redis_restarts_under_deny() {
    pool_recovers_after_restart(OnStoreError::Deny).await;
}

/// A Redis error reply (here `OOM`, from a server out of memory under
/// `noeviction`) is not a broken connection: the pool keeps its connection,
/// so `CLIENT LIST` shows the same client afterwards. (`READONLY` is the
/// exception: `tests/demoted_master.rs`.)
#[tokio::test]
async fn an_error_reply_keeps_the_pooled_connection() {
    let server = RedisServer::start();
    let limiter = Limiter::builder("5/1m".parse().unwrap())
        .store(server.pool_store(1).await)
        .timeout(support::TEST_TIMEOUT)
        .breaker(redis_ratelimit::Breaker::disabled())
        .build()
        .unwrap();
    assert!(limiter.check("ok", 1).await.unwrap().is_allowed());
    let ids = client_ids(&server).await;
    assert_eq!(ids.len(), 1, "{ids:?}");
    server.refuse_writes(true).await;
    for _ in 0..3 {
        let err = limiter.check("new", 1).await.unwrap_err();
        let redis_ratelimit::Error::Redis(e) = &err else {
            panic!("not a Redis error: {err}")
        };
        assert_eq!(e.code(), Some("OOM"), "{e}");
    }
    server.refuse_writes(false).await;
    assert!(limiter.check("ok", 1).await.unwrap().is_allowed());
    assert_eq!(client_ids(&server).await, ids, "the pool reconnected");
}

/// The ids of the clients connected to `server`, but the one asking.
async fn client_ids(server: &RedisServer) -> Vec<u64> {
    let mut conn = server.conn().await;
    let me: u64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(&mut conn)
        .await
        .unwrap();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut ids: Vec<u64> = list
        .lines()
        .filter_map(|l| l.strip_prefix("id=")?.split(' ').next()?.parse().ok())
        .filter(|id| *id != me)
        .collect();
    ids.sort_unstable();
    ids
}
