//! Connecting the store the example servers count in: one Redis (a
//! multiplexed connection or a bb8 pool), a Redis Cluster, or the master
//! Redis Sentinel names; and handing it to every limiter.

use std::{fmt, time::Duration};

use redis::IntoConnectionInfo;
use redis_ratelimit::{LimiterBuilder, MemoryStore, RedisStore};

#[allow(unused_imports)]
use super::{Error, NO_CLUSTER_FEATURE, NO_SENTINEL_FEATURE};

/// The store every limiter (the default and each tier's) counts in.
pub(super) enum AnyStore {
    Memory(MemoryStore),
    Redis(RedisStore),
}

impl AnyStore {
    pub(super) fn apply(&self, builder: LimiterBuilder) -> LimiterBuilder {
        match self {
            AnyStore::Memory(store) => builder.store(store.clone()),
            AnyStore::Redis(store) => builder.store(store.clone()),
        }
    }
}

pub(super) async fn connect(
    url: &str,
    addr: &str,
    pool: Option<u32>,
) -> Result<(RedisStore, String), Error> {
    let unreachable = |e: &dyn fmt::Display| {
        Error::runtime(format!(
            "cannot use Redis at {addr} (REDIS_URL) for rate limiting: {e}"
        ))
    };
    match pool {
        None => {
            let store = RedisStore::connect(url)
                .await
                .map_err(|e| unreachable(&e))?;
            Ok((store, "one multiplexed connection".into()))
        }
        Some(size) => {
            // The TCP settings RedisStore::connect uses (TCP_NODELAY, a
            // dead link closed within seconds).
            let info = url
                .into_connection_info()
                .map_err(|e| unreachable(&e))?
                .set_tcp_settings(RedisStore::tcp_settings());
            let manager =
                bb8_redis::RedisConnectionManager::new(info).map_err(|e| unreachable(&e))?;
            // Open every connection now: fail fast, and start benchmarks warm.
            let pool = bb8::Pool::builder()
                .max_size(size)
                .min_idle(size)
                // bb8 PINGs every checked-out connection by default: a second
                // round trip per decision.
                .test_on_check_out(false)
                .connection_timeout(Duration::from_secs(2))
                .build(manager)
                .await
                .map_err(|e| unreachable(&e))?;
            // A Redis that cannot run the scripts fails here, not on every request.
            let store = RedisStore::from_pool(pool);
            store.self_test().await.map_err(|e| unreachable(&e))?;
            Ok((store, format!("a bb8 pool of {size}")))
        }
    }
}

/// Connects to a Redis Cluster through its seed nodes: one cluster
/// connection, or a bb8 pool of `pool` of them.
#[cfg(feature = "cluster")]
pub(super) async fn connect_cluster(
    urls: &[String],
    addrs: &str,
    pool: Option<u32>,
) -> Result<(RedisStore, String), Error> {
    let unreachable = |e: &dyn fmt::Display| {
        Error::runtime(format!(
            "cannot use the Redis Cluster at {addrs} (REDIS_CLUSTER_URLS) for rate limiting: \
             {e}; is the cluster up, with cluster_state:ok?"
        ))
    };
    match pool {
        None => {
            let store = RedisStore::cluster(urls.iter().map(String::as_str))
                .await
                .map_err(|e| unreachable(&e))?;
            Ok((store, "one cluster connection".into()))
        }
        Some(size) => {
            let client = RedisStore::cluster_client(urls.iter().map(String::as_str))
                .build()
                .map_err(|e| unreachable(&e))?;
            let pool = bb8::Pool::builder()
                .max_size(size)
                .min_idle(size)
                // The check-out PING would go to every master.
                .test_on_check_out(false)
                .connection_timeout(Duration::from_secs(2))
                .build(client)
                .await
                .map_err(|e| unreachable(&e))?;
            let via = format!("a bb8 pool of {size} cluster connections");
            let store = RedisStore::from_cluster_pool(pool);
            store.self_test().await.map_err(|e| unreachable(&e))?;
            Ok((store, via))
        }
    }
}

/// Without the `cluster` feature, `from_env` already refused
/// `REDIS_CLUSTER_URLS`.
#[cfg(not(feature = "cluster"))]
pub(super) async fn connect_cluster(
    _: &[String],
    _: &str,
    _: Option<u32>,
) -> Result<(RedisStore, String), Error> {
    Err(Error::usage(NO_CLUSTER_FEATURE.into()))
}

/// Connects to the master the sentinels name `master`.
#[cfg(feature = "sentinel")]
pub(super) async fn connect_sentinel(
    urls: &[String],
    master: &str,
    addrs: &str,
) -> Result<RedisStore, Error> {
    RedisStore::sentinel(urls.iter().map(String::as_str), master)
        .await
        .map_err(|e| {
            Error::runtime(format!(
                "cannot use the Redis master {master:?} named by the sentinels at {addrs} \
                 (REDIS_SENTINEL_URLS) for rate limiting: {e}"
            ))
        })
}

/// Without the `sentinel` feature, `from_env` already refused
/// `REDIS_SENTINEL_URLS`.
#[cfg(not(feature = "sentinel"))]
pub(super) async fn connect_sentinel(_: &[String], _: &str, _: &str) -> Result<RedisStore, Error> {
    Err(Error::usage(NO_SENTINEL_FEATURE.into()))
}
