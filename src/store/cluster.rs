//! Redis Cluster for [`RedisStore`] (feature `cluster`): redis-rs's async
//! cluster connection, or a bb8 pool of them.
//!
//! All keys of one decision share a hash tag (see the crate's keyspace
//! rules), so each decision belongs to the one master that owns its slot.
//! redis-rs routes `EVALSHA` by its first key and follows `MOVED` and
//! `ASK`; on `NOSCRIPT` the call is sent again as `EVAL`, to the same node
//! (`SCRIPT LOAD` would go to every node, and fail while any one is down).
//! On one cluster connection, concurrent fixed-window decisions bound for
//! one master go in one call, whatever their slots, and so do those of one
//! sliding-window or GCRA limit alike; others go per slot (see `batch.rs`
//! and `batch_cluster.rs`); a pool sends one call each.
//!
//! A child module of `redis.rs`, so that it reaches the store's backends.

use std::time::Duration;

use bb8::Pool;
use redis::{
    FromRedisValue, IntoConnectionInfo,
    cluster::{ClusterClient, ClusterClientBuilder},
    cluster_async::ClusterConnection,
};

use super::{Backend, Batcher, Call, RedisStore};
use crate::{Error, store::BoxFuture};

/// The hash slot of `key`, as Redis Cluster computes it: CRC16 (XMODEM) of
/// its hash tag (the bytes between the first `{` and the next `}`, if not
/// empty) or else of the whole key, modulo 16,384.
pub(super) fn slot(key: &str) -> u16 {
    let key = key.as_bytes();
    let tag = key.iter().position(|b| *b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|b| *b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tag.unwrap_or(key)) % 16_384
}

/// A store's cluster backend.
#[derive(Clone)]
pub(super) enum Cluster {
    /// One cluster connection (a multiplexed connection per node), shared.
    Connection(ClusterConnection),
    /// A bb8 pool of cluster connections.
    Pool(Pool<ClusterClient>),
}

impl Cluster {
    /// For `Debug`.
    pub(super) fn name(&self) -> &'static str {
        match self {
            Cluster::Connection(_) => "ClusterConnection",
            Cluster::Pool(_) => "bb8::Pool<ClusterClient>",
        }
    }

    /// Runs a script call on the master that owns its keys' slot.
    pub(super) fn run<T>(&self, call: Call) -> BoxFuture<'static, Result<T, Error>>
    where
        T: FromRedisValue + Send + 'static,
    {
        match self {
            Cluster::Connection(conn) => {
                let mut conn = conn.clone();
                Box::pin(async move { call.invoke(&mut conn).await })
            }
            Cluster::Pool(pool) => {
                let pool = pool.clone();
                Box::pin(async move { crate::store::pool::run(&pool, &call).await })
            }
        }
    }
}

impl RedisStore {
    /// Connects to a Redis Cluster through any of the seed `nodes` (e.g.
    /// `redis://10.0.0.1:7000`), with the settings of
    /// [`cluster_client`](Self::cluster_client), and runs the
    /// [`self_test`](Self::self_test) (the scripts load on every node); fails
    /// now, with [`Error::Startup`] naming the cause, if no seed can be
    /// reached, the cluster's slot map cannot be read, or a node cannot run
    /// the scripts.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use redis_ratelimit::{Limiter, Quota, RedisStore};
    ///
    /// let store = RedisStore::cluster([
    ///     "redis://127.0.0.1:7000",
    ///     "redis://127.0.0.1:7001",
    ///     "redis://127.0.0.1:7002",
    /// ])
    /// .await?;
    /// let limiter = Limiter::builder(Quota::per_second(10)).store(store).build()?;
    /// assert!(limiter.check("user:1", 1).await?.is_allowed());
    /// # Ok(()) }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub async fn cluster<T: IntoConnectionInfo>(
        nodes: impl IntoIterator<Item = T>,
    ) -> Result<Self, Error> {
        super::install_tls_provider();
        let client = Self::cluster_client(nodes).build()?;
        let conn = client
            .get_async_connection()
            .await
            .map_err(|e| super::self_test::startup(e.into(), super::self_test::Stage::Connect))?;
        let store = Self::from_cluster(conn);
        store.self_test().await?;
        Ok(store)
    }

    /// redis-rs's cluster client builder with the settings
    /// [`cluster`](Self::cluster) uses, for adding credentials or TLS:
    ///
    /// * a 1 s connection timeout, and a 1 s response timeout per attempt, so
    ///   that a dead or frozen node cannot hold a request for ever;
    /// * no overall timeout: the limiter's own timeout (200 ms by default)
    ///   bounds every check, whatever it is;
    /// * up to 5 retries, 10 to 500 ms apart, which follow `MOVED` and `ASK`
    ///   redirections and, after a failover, reconnect and read the slot map
    ///   again, so the same store serves the promoted replica. They also
    ///   send a call again when its node's connection dropped after it was
    ///   written, or its response timeout passed: Redis may have run it. A
    ///   decision is then charged twice (a limit reached early, never
    ///   passed); a refund or a reset takes effect once however often it is
    ///   sent (see [`Limiter::refund`](crate::Limiter::refund)).
    /// * the store's [TCP settings](Self::tcp_settings) on every node's
    ///   connection: `TCP_NODELAY` on, and a dead link closed within
    ///   seconds. Calling `.tcp_settings(..)` on the builder replaces them;
    ///   start what you pass from [`RedisStore::tcp_settings`].
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use redis_ratelimit::RedisStore;
    ///
    /// let client = RedisStore::cluster_client(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
    ///     .password("secret")
    ///     .build()?;
    /// let store = RedisStore::from_cluster(client.get_async_connection().await?);
    /// # Ok(()) }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster_client<T: IntoConnectionInfo>(
        nodes: impl IntoIterator<Item = T>,
    ) -> ClusterClientBuilder {
        super::install_tls_provider();
        ClusterClientBuilder::new(nodes)
            .connection_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(1))
            .overall_response_timeout(None)
            .retries(5)
            .min_retry_wait(10)
            .max_retry_wait(500)
            .tcp_settings(Self::tcp_settings())
    }

    /// Uses an existing cluster connection; clones share it. Build its client
    /// with [`cluster_client`](Self::cluster_client), which sets the store's
    /// [TCP settings](Self::tcp_settings), or set them yourself with the
    /// builder's `.tcp_settings(..)`.
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn from_cluster(conn: ClusterConnection) -> Self {
        Self {
            backend: Backend::Cluster(Cluster::Connection(conn)),
            batcher: Batcher::default(),
        }
    }

    /// Uses a bb8 pool of cluster connections, managed by redis-rs's own
    /// `bb8::ManageConnection` for [`ClusterClient`].
    ///
    /// One cluster connection already multiplexes every request to each
    /// node, so prefer [`cluster`](Self::cluster) unless you run a pool
    /// anyway. As with [`from_pool`](Self::from_pool), build the pool with
    /// `.test_on_check_out(false)`: the check-out `PING` goes to every
    /// master. A connection that fails with a broken link is replaced, as
    /// for [`from_pool`](Self::from_pool); call
    /// [`self_test`](Self::self_test) once after building the store.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use redis_ratelimit::RedisStore;
    ///
    /// let client = RedisStore::cluster_client(["redis://127.0.0.1:7000"]).build()?;
    /// let pool = bb8::Pool::builder()
    ///     .max_size(4)
    ///     .test_on_check_out(false)
    ///     .build(client)
    ///     .await?;
    /// let store = RedisStore::from_cluster_pool(pool);
    /// # Ok(()) }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn from_cluster_pool(pool: Pool<ClusterClient>) -> Self {
        Self {
            backend: Backend::Cluster(Cluster::Pool(pool)),
            batcher: Batcher::default(),
        }
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
impl From<ClusterConnection> for RedisStore {
    fn from(conn: ClusterConnection) -> Self {
        Self::from_cluster(conn)
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
impl From<Pool<ClusterClient>> for RedisStore {
    fn from(pool: Pool<ClusterClient>) -> Self {
        Self::from_cluster_pool(pool)
    }
}
