//! Bursts on a healthy Redis Cluster (feature `cluster`): two limiters (two
//! services' stores) fire 2000 concurrent checks at once, ten times, with
//! the default 200 ms timeout and breaker. No store call may fail or time
//! out, so the breaker never opens and `Allow` never admits past a limit.

mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use futures_util::future::join_all;
use redis_ratelimit::{
    Error, Limiter, Quota, RedisStore,
    store::{BoxFuture, LimitCheck, LimitState, Store},
};
use support::cluster::RedisCluster;

/// A store that records its slowest call, as the limiter's timeout sees it.
#[derive(Debug, Clone)]
struct Timed {
    inner: RedisStore,
    slowest_us: Arc<AtomicU64>,
}

impl Store for Timed {
    fn decide(
        &self,
        checks: Vec<LimitCheck>,
        cost: u64,
    ) -> BoxFuture<'static, Result<Vec<LimitState>, Error>> {
        let started = Instant::now();
        let call = self.inner.decide(checks, cost);
        let slowest = self.slowest_us.clone();
        Box::pin(async move {
            let result = call.await;
            slowest.fetch_max(started.elapsed().as_micros() as u64, Ordering::Relaxed);
            result
        })
    }
}

const BURSTS: usize = 10;
const REQUESTS: usize = 2000;
const KEYS: usize = 10;
const LIMIT: u64 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_on_a_healthy_cluster_never_trip_the_breaker_nor_pass_the_limit() {
    let cluster = RedisCluster::start();
    let slowest_us = Arc::new(AtomicU64::new(0));
    let mut limiters = Vec::new();
    for _ in 0..2 {
        let store = Timed {
            inner: cluster.store().await,
            slowest_us: slowest_us.clone(),
        };
        // The defaults: a 200 ms timeout and the default breaker.
        limiters.push(
            Limiter::builder(Quota::per_minute(LIMIT))
                .store(store)
                .build()
                .unwrap(),
        );
    }
    let mut slowest_per_burst = Vec::new();
    for burst in 0..BURSTS {
        slowest_us.store(0, Ordering::Relaxed);
        let checks = (0..REQUESTS).map(|i| {
            let limiter = limiters[i % 2].clone();
            let key = format!("b{burst}:k{}", i % KEYS);
            tokio::spawn(async move {
                let result = limiter.check(&key, 1).await;
                (key, result)
            })
        });
        let results = join_all(checks).await;
        let mut admitted = std::collections::BTreeMap::<String, u64>::new();
        let mut errors = Vec::new();
        for joined in results {
            let (key, result) = joined.unwrap();
            // Under `Allow`, an error admits the request unlimited.
            let allowed = match result {
                Ok(d) => d.is_allowed(),
                Err(e) => {
                    errors.push(e.to_string());
                    true
                }
            };
            *admitted.entry(key).or_default() += u64::from(allowed);
        }
        let slowest = Duration::from_micros(slowest_us.load(Ordering::Relaxed));
        slowest_per_burst.push(slowest);
        errors.dedup();
        assert!(
            errors.is_empty(),
            "burst {burst}: store errors {errors:?}; slowest call {slowest:?}"
        );
        for (key, n) in &admitted {
            assert!(
                *n <= LIMIT,
                "burst {burst}: {key} admitted {n} against {LIMIT}"
            );
        }
        assert_eq!(admitted.values().sum::<u64>(), LIMIT * KEYS as u64);
    }
    eprintln!("slowest store call per burst: {slowest_per_burst:?}");
    cluster.assert_every_key_has_ttl();
}
