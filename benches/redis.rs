//! One decision against a real Redis: [`Limiter::check`] on a `redis-server`
//! this benchmark starts on a free port (the tests' harness; it fails loudly,
//! with the install hint, if there is no `redis-server` or
//! `REDIS_SERVER_BIN`).
//!
//! * `redis/ping`: a bare `PING` on the same multiplexed connection: the
//!   round trip that every decision pays at least;
//! * `redis/allowed_10k_keys/*` and `redis/denied_one_key/*`: one check at a
//!   time, through the `ConnectionManager` (`manager`) and through a bb8 pool
//!   of 32 connections without PING-on-checkout (`pool`), as the example
//!   servers set them up;
//! * `redis/allowed_32_concurrent/*`: 32 checks in flight at once (as 32 HTTP
//!   connections would send them), reported per check.
//!
//! Run with `cargo bench --bench redis`.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use futures_util::future::join_all;
use redis_ratelimit::{Limiter, Quota, RedisStore};
use tokio::runtime::Runtime;

use self::support::RedisServer;

/// Distinct client keys the allowed paths rotate through.
const KEYS: usize = 10_000;
/// Checks in flight at once in `allowed_32_concurrent`.
const CONCURRENT: usize = 32;

/// A store timeout no healthy local Redis reaches, so a slow moment of a
/// shared machine shows as a slow sample rather than as an error.
const TIMEOUT: Duration = Duration::from_secs(2);

fn limiter(store: &RedisStore, quota: Quota) -> Limiter {
    Limiter::builder(quota)
        .store(store.clone())
        .timeout(TIMEOUT)
        .build()
        .expect("a valid limiter")
}

async fn pool(server: &RedisServer) -> RedisStore {
    let manager = bb8_redis::RedisConnectionManager::new(server.url()).expect("a Redis URL");
    let pool = bb8::Pool::builder()
        .max_size(32)
        .min_idle(32)
        .test_on_check_out(false)
        .build(manager)
        .await
        .unwrap_or_else(|e| panic!("bb8 pool: {e}\n{}", server.log()));
    RedisStore::from_pool(pool)
}

fn redis(c: &mut Criterion) {
    let rt: Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    let server = RedisServer::start();
    let stores = rt.block_on(async {
        [
            ("manager", server.store().await),
            ("pool", pool(&server).await),
        ]
    });
    let keys: Vec<String> = (0..KEYS).map(|i| format!("client-{i}")).collect();
    let roomy = Quota::new(1 << 40, Duration::from_secs(3600)).expect("a valid quota");

    let mut group = c.benchmark_group("redis");
    let mut conn = rt.block_on(server.conn());
    group.bench_function("ping", |b| {
        b.to_async(&rt).iter(|| {
            let mut conn = conn.clone();
            async move {
                let pong: String = redis::cmd("PING")
                    .query_async(&mut conn)
                    .await
                    .expect("PING");
                pong
            }
        })
    });
    let _: () = rt
        .block_on(redis::cmd("FLUSHALL").query_async(&mut conn))
        .expect("FLUSHALL");

    for (name, store) in &stores {
        let allowing = limiter(store, roomy);
        let mut i = 0;
        group.bench_function(BenchmarkId::new("allowed_10k_keys", name), |b| {
            b.to_async(&rt).iter(|| {
                i = (i + 1) % KEYS;
                let (limiter, key) = (&allowing, &keys[i]);
                async move { limiter.check(key, 1).await.expect("a decision") }
            })
        });

        let denying = limiter(store, Quota::per_hour(1));
        let hot = format!("hot-{name}");
        let first = rt.block_on(denying.check(&hot, 1)).expect("a decision");
        assert!(first.is_allowed(), "a fresh key is allowed");
        group.bench_function(BenchmarkId::new("denied_one_key", name), |b| {
            b.to_async(&rt).iter(|| async {
                let d = denying.check(&hot, 1).await.expect("a decision");
                assert!(!d.is_allowed(), "a spent key is denied");
                d
            })
        });
    }

    group.throughput(Throughput::Elements(CONCURRENT as u64));
    for (name, store) in &stores {
        let allowing = limiter(store, roomy);
        let mut i = 0;
        group.bench_function(BenchmarkId::new("allowed_32_concurrent", name), |b| {
            b.to_async(&rt).iter(|| {
                let batch = (0..CONCURRENT).map(|_| {
                    i = (i + 1) % KEYS;
                    allowing.check(&keys[i], 1)
                });
                let checks = join_all(batch.collect::<Vec<_>>());
                async move {
                    for d in checks.await {
                        d.expect("a decision");
                    }
                }
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = redis
}
criterion_main!(benches);
