//! [`RedisStore`]: counters in Redis, one atomic script call per decision.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use bb8_redis::{RedisConnectionManager, bb8::Pool};
use redis::{
    Client, FromRedisValue, IntoConnectionInfo,
    aio::{ConnectionManager, ConnectionManagerConfig},
    io::tcp::TcpSettings,
};

use super::{
    BoxFuture, Checks, LimitCheck, LimitState, Refund, Reservation, Store,
    batch::{Answer, Batcher, Deadline},
    call::Call,
};
use crate::{
    Error,
    decision::{Answered, Ends, States},
};

#[path = "redis_admin.rs"]
mod admin;
#[cfg(feature = "cluster")]
#[path = "cluster.rs"]
mod cluster;
#[path = "redis_decide.rs"]
mod decide_call;
#[path = "redis_lease.rs"]
mod lease;
#[path = "self_test.rs"]
mod self_test;
#[cfg(feature = "sentinel")]
#[path = "sentinel.rs"]
mod sentinel;
#[path = "standalone.rs"]
mod standalone;
#[path = "tcp.rs"]
mod tcp;
#[cfg(feature = "tls")]
#[path = "tls.rs"]
mod tls;

use self::decide_call::{Layout, Packed, decide_invocation, parse_batch};
pub(super) use self::decide_call::{Request, decide, decide_spread, general_invocation};
#[cfg(feature = "sentinel")]
pub(super) use self::sentinel::Sentinel as SentinelMaster;
pub(super) use self::standalone::Standalone;

/// Counters in Redis.
///
/// The default backend is redis-rs's [`ConnectionManager`]: one multiplexed
/// connection shared by every clone, reconnecting by itself after Redis
/// restarts. On this project's 2-core test machine it served about twice the
/// requests per second of a 32-connection bb8 pool, so prefer it; use
/// [`RedisStore::from_pool`] only if you already run a bb8 pool.
///
/// Every call runs one Lua script with `EVALSHA` (reloaded on `NOSCRIPT`); time
/// comes from Redis itself, never from this process's clock.
///
/// It needs a Tokio runtime with its time driver (`#[tokio::main]`,
/// actix-web's, or a `Builder` with `enable_all` or `enable_time`): it
/// bounds every call in time, and redis-rs panics connecting without one.
/// The [`MemoryStore`](crate::MemoryStore) needs none.
///
/// With the `cluster` feature, `RedisStore::cluster` runs the same scripts
/// on a Redis Cluster: all keys of one call share a hash tag, so each call
/// goes to the one master that owns their slot. With the `sentinel` feature,
/// `RedisStore::sentinel` finds the master through Redis Sentinel, and finds
/// it again after a failover. With the `tls` feature, every constructor takes
/// `rediss://` URLs, and `RedisStore::connect_with_tls` a CA of your own and a
/// client certificate.
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use redis_ratelimit::{Limiter, Quota, RedisStore};
///
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
/// let limiter = Limiter::builder(Quota::per_second(10)).store(store).build()?;
/// assert!(limiter.check("user:1", 1).await?.is_allowed());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    backend: Backend,
    batcher: Batcher,
}

#[derive(Clone)]
enum Backend {
    Manager(Standalone),
    Pool(Pool<RedisConnectionManager>),
    #[cfg(feature = "cluster")]
    Cluster(cluster::Cluster),
    #[cfg(feature = "sentinel")]
    Sentinel(sentinel::Sentinel),
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let backend = match &self.backend {
            Backend::Manager(_) => "ConnectionManager",
            Backend::Pool(_) => "bb8::Pool",
            #[cfg(feature = "cluster")]
            Backend::Cluster(cluster) => cluster.name(),
            #[cfg(feature = "sentinel")]
            Backend::Sentinel(_) => "Sentinel",
        };
        f.debug_struct("RedisStore")
            .field("backend", &backend)
            .finish()
    }
}

impl RedisStore {
    /// Connects a [`ConnectionManager`] to `url` (e.g. `redis://host:6379/0`)
    /// and runs the [`self_test`](Self::self_test): fails now, with
    /// [`Error::Startup`] naming the cause, if Redis cannot be reached,
    /// refuses the password, cannot run the limiter's scripts, or (for a
    /// `rediss://` URL, with the `tls` feature) fails the TLS handshake.
    ///
    /// The connection has the store's [TCP settings](Self::tcp_settings)
    /// (`TCP_NODELAY` on, a dead link closed within seconds), as have those
    /// of every constructor here that connects by itself.
    pub async fn connect(url: impl IntoConnectionInfo) -> Result<Self, Error> {
        install_tls_provider();
        Self::connect_client(Client::open(url)?).await
    }

    /// [`connect`](Self::connect) with a client already built, with
    /// `TCP_NODELAY` set on its connection info.
    async fn connect_client(client: Client) -> Result<Self, Error> {
        let client = tcp::tuned_client(&client)?;
        let stage = self_test::Stage::of(client.get_connection_info().addr());
        let manager = ConnectionManager::new_with_config(client.clone(), Self::manager_config())
            .await
            .map_err(|e| self_test::startup(e.into(), stage))?;
        let store = Self::made(manager, client);
        store.self_test().await?;
        Ok(store)
    }

    /// Like [`connect`](Self::connect), but connects on first use, so a
    /// service can start while Redis is down; until Redis is reachable, checks
    /// fail and the layer applies its [`OnStoreError`](crate::OnStoreError)
    /// policy. Fails only for a malformed URL: it runs no
    /// [`self_test`](Self::self_test).
    pub fn connect_lazy(url: impl IntoConnectionInfo) -> Result<Self, Error> {
        install_tls_provider();
        let client = Client::open(tcp::tuned(url.into_connection_info()?))?;
        let manager =
            ConnectionManager::new_lazy_with_config(client.clone(), Self::manager_config())?;
        Ok(Self::made(manager, client))
    }

    /// A store on a manager it made from `client`: made again after a
    /// connection whose setup Redis refused (`standalone.rs`).
    fn made(manager: ConnectionManager, client: Client) -> Self {
        let standalone = Standalone::remade_from(manager, client, Self::manager_config());
        Self {
            backend: Backend::Manager(standalone),
            batcher: Batcher::default(),
        }
    }

    /// Reconnection settings: a few quick retries in the background. redis-rs's
    /// own response timeout (500 ms by default) is switched off so that the
    /// limiter's timeout is the one bound on every call, whatever its length.
    fn manager_config() -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_response_timeout(None)
            .set_number_of_retries(3)
            .set_min_delay(std::time::Duration::from_millis(10))
            .set_max_delay(std::time::Duration::from_millis(500))
            .set_connection_timeout(Some(std::time::Duration::from_secs(1)))
    }

    /// Uses an existing [`ConnectionManager`].
    ///
    /// The manager reconnects by itself when its connection drops. When its
    /// node answers `READONLY` or `MASTERDOWN` (it was demoted to a replica while the
    /// connection stayed open: a failover behind a DNS name or a virtual
    /// IP), the store has the node close the connection (`QUIT`), and the
    /// manager reconnects to whatever node the address names now; the call
    /// that met it fails, as a store error.
    ///
    /// Build its client with the store's [TCP settings](Self::tcp_settings),
    /// as [`connect`](Self::connect) does.
    ///
    /// Unlike the store's own, a manager given here is not made again after
    /// a connection whose setup Redis refused (a password it refused, say
    /// after a restart whose users were set a little later): redis-rs's
    /// manager keeps that failed connection, and every call fails with its
    /// error until the process restarts. [`connect`](Self::connect) and
    /// [`connect_lazy`](Self::connect_lazy) keep their client and make a new
    /// manager then.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use redis::{Client, IntoConnectionInfo, aio::ConnectionManager};
    /// use redis_ratelimit::RedisStore;
    ///
    /// let info = "redis://10.0.0.1:6379"
    ///     .into_connection_info()?
    ///     .set_tcp_settings(RedisStore::tcp_settings());
    /// let manager = ConnectionManager::new(Client::open(info)?).await?;
    /// let store = RedisStore::new(manager);
    /// # Ok(()) }
    /// ```
    pub fn new(manager: ConnectionManager) -> Self {
        Self {
            backend: Backend::Manager(Standalone::new(manager)),
            batcher: Batcher::default(),
        }
    }

    /// Uses an existing bb8 pool (from `bb8-redis`).
    ///
    /// bb8 sends a `PING` on every checkout unless the pool is built with
    /// `.test_on_check_out(false)`, doubling the round trips per decision;
    /// turn it off for rate limiting. When Redis is down, a check on an idle
    /// connection fails fast (the connection is broken and its replacement
    /// refused at once, below); one that waits for a free connection, or for
    /// bb8 to open one, ends at the limiter's timeout.
    ///
    /// bb8-redis never reports a connection broken, so the store repairs the
    /// pool itself: a call whose connection was closed, reset or refused (a
    /// Redis restart, a dropped link) replaces that connection in the pool
    /// with a new one and is sent once more on it, so the pool decides again
    /// as soon as Redis is back. Redis may have run the call before the link
    /// dropped: a decision is then charged twice (a limit reached early,
    /// never passed), and a refund or a reset takes effect once however
    /// often it is sent. A call answered `READONLY` or `MASTERDOWN` (the node was demoted to
    /// a replica while the connection stayed open) replaces its connection
    /// and is sent again too, reaching whatever node the address names now.
    /// Other error replies from Redis keep the connection.
    ///
    /// The pool is not checked here (this constructor is not `async`): call
    /// [`self_test`](Self::self_test) once after building the store to fail
    /// at startup on a Redis that is unreachable or cannot run the scripts.
    ///
    /// Give the pool's manager a connection info with the store's
    /// [TCP settings](Self::tcp_settings), as for [`new`](Self::new):
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use bb8_redis::RedisConnectionManager;
    /// use redis::IntoConnectionInfo;
    /// use redis_ratelimit::RedisStore;
    ///
    /// let info = "redis://10.0.0.1:6379"
    ///     .into_connection_info()?
    ///     .set_tcp_settings(RedisStore::tcp_settings());
    /// let pool = bb8::Pool::builder()
    ///     .max_size(8)
    ///     .test_on_check_out(false)
    ///     .build(RedisConnectionManager::new(info)?)
    ///     .await?;
    /// let store = RedisStore::from_pool(pool);
    /// store.self_test().await?;
    /// # Ok(()) }
    /// ```
    pub fn from_pool(pool: Pool<RedisConnectionManager>) -> Self {
        Self {
            backend: Backend::Pool(pool),
            batcher: Batcher::default(),
        }
    }

    /// The TCP settings of every connection the store opens by itself; give
    /// them to a connection you build for it ([`new`](Self::new),
    /// [`from_pool`](Self::from_pool)):
    ///
    /// * `TCP_NODELAY` on (redis-rs leaves it off): with Nagle's algorithm
    ///   on, a call sent while another is in flight waits for the first
    ///   one's reply before it leaves, a round trip more on a network;
    /// * on Linux, `TCP_USER_TIMEOUT` of 5 s, and keepalive probes after
    ///   10 s idle: a link that loses every packet without a reset (a host
    ///   gone, a partition) is closed within seconds, and the store
    ///   reconnects, where otherwise every call would time out for about 15
    ///   minutes (the kernel's `tcp_retries2`). A Redis that is busy or
    ///   frozen while its host is up keeps its connections.
    ///
    /// ```
    /// use redis::IntoConnectionInfo;
    /// use redis_ratelimit::RedisStore;
    ///
    /// let info = "redis://10.0.0.1:6379"
    ///     .into_connection_info()
    ///     .unwrap()
    ///     .set_tcp_settings(RedisStore::tcp_settings());
    /// assert!(info.tcp_settings().nodelay());
    /// ```
    pub fn tcp_settings() -> TcpSettings {
        tcp::settings(&TcpSettings::default())
    }
}

/// With the `tls` feature, makes sure rustls has a crypto provider before a
/// client is built (see `tls.rs`); without it, nothing to do.
fn install_tls_provider() {
    #[cfg(feature = "tls")]
    tls::install_provider();
}

impl From<ConnectionManager> for RedisStore {
    fn from(manager: ConnectionManager) -> Self {
        Self::new(manager)
    }
}

impl From<Pool<RedisConnectionManager>> for RedisStore {
    fn from(pool: Pool<RedisConnectionManager>) -> Self {
        Self::from_pool(pool)
    }
}

impl RedisStore {
    /// Runs a script call on a connection of this store: `EVALSHA`, then
    /// on `NOSCRIPT` the same call as `EVAL` ([`Call::invoke`]).
    pub(super) fn run<T>(&self, call: Call) -> BoxFuture<'static, Result<T, Error>>
    where
        T: FromRedisValue + Send + 'static,
    {
        match &self.backend {
            Backend::Manager(manager) => {
                let mut conn = manager.clone();
                Box::pin(async move { call.invoke(&mut conn).await })
            }
            Backend::Pool(pool) => {
                let pool = pool.clone();
                Box::pin(async move { super::pool::run(&pool, &call).await })
            }
            #[cfg(feature = "cluster")]
            Backend::Cluster(cluster) => cluster.run(call),
            #[cfg(feature = "sentinel")]
            Backend::Sentinel(sentinel) => {
                let mut conn = sentinel.clone();
                Box::pin(async move { call.invoke(&mut conn).await })
            }
        }
    }
}

impl RedisStore {
    /// One request, unbatched: on a pool, or when batching is not possible.
    fn decide_one(
        &self,
        checks: Vec<LimitCheck>,
        cost: u64,
    ) -> BoxFuture<'static, Result<Answered, Error>> {
        self.call_one(checks, cost, decide_invocation)
    }

    /// One request, alone in the call `invocation` makes of it (a decision,
    /// or a peek): its states, and where each GCRA limit's resets on
    /// Redis's clock.
    pub(super) fn call_one(
        &self,
        checks: Vec<LimitCheck>,
        cost: u64,
        invocation: fn(&[Request<'_>]) -> Call,
    ) -> BoxFuture<'static, Result<Answered, Error>> {
        let request = [Request {
            checks: &checks,
            cost,
        }];
        let call = invocation(&request);
        let layout = Layout::of(&call);
        let reply = self.run::<Packed>(call);
        Box::pin(async move {
            let request = [Request {
                checks: &checks,
                cost,
            }];
            let mut answers = parse_batch(&reply.await?.0, &request, layout)?;
            answers
                .pop()
                .ok_or_else(|| Error::UnexpectedReply("no reply".into()))
        })
    }
}

impl RedisStore {
    /// [`Store::decide`] for the crate's [`Limiter`](crate::Limiter): the
    /// checks inline when there is one, and a batched request's answer
    /// unboxed, straight from the batching task, which answers a timeout
    /// at `deadline`. With it, whether the reply comes by `deadline` (a
    /// timeout then), so that the caller needs no timer of its own: a
    /// batched request's does, unless the batching task runs on another
    /// current-thread runtime, which a blocking handler may hold up
    /// ([`Batcher::submit`]). Kept beside the reply, not in it, which would
    /// grow every decision in flight by a word.
    pub(crate) fn decide_states(
        &self,
        checks: Checks,
        cost: u64,
        deadline: Option<Deadline>,
    ) -> (StoreReply, bool) {
        let submitted = match &self.backend {
            Backend::Manager(manager) => self.batcher.submit(manager, checks, cost, deadline),
            #[cfg(feature = "cluster")]
            Backend::Cluster(cluster::Cluster::Connection(conn)) => {
                self.batcher.submit(conn, checks, cost, deadline)
            }
            #[cfg(feature = "sentinel")]
            Backend::Sentinel(sentinel) => self.batcher.submit(sentinel, checks, cost, deadline),
            _ => Err((checks, cost)),
        };
        match submitted {
            Ok((answer, bounded)) => (StoreReply::Batched(answer), bounded),
            Err((checks, cost)) => {
                let reply = self.decide_one(checks.into_vec(), cost);
                (StoreReply::Alone(reply), false)
            }
        }
    }
}

/// A decision on its way from [`RedisStore::decide_states`], or from any
/// other [`Store`]'s [`decide`](Store::decide) (`Alone`).
pub(crate) enum StoreReply {
    /// Queued for the batching task.
    Batched(Answer),
    /// In a call of its own (a pool, no batching task, another store).
    Alone(BoxFuture<'static, Result<Answered, Error>>),
}

impl StoreReply {
    /// Another store's decision, which reports no clock.
    pub(crate) fn other(reply: BoxFuture<'static, Result<Vec<LimitState>, Error>>) -> Self {
        StoreReply::Alone(Box::pin(async move {
            reply
                .await
                .map(|states| (States::from_vec(states), Ends::none()))
        }))
    }
}

impl Future for StoreReply {
    type Output = Result<Answered, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            StoreReply::Batched(answer) => Pin::new(answer).poll(cx),
            StoreReply::Alone(reply) => reply.as_mut().poll(cx),
        }
    }
}

impl RedisStore {
    /// Whether `checks`' keys are in more than one Redis Cluster hash slot
    /// (never, off a cluster).
    fn spans_slots(&self, checks: &[LimitCheck]) -> bool {
        match (&self.backend, checks) {
            #[cfg(feature = "cluster")]
            (Backend::Cluster(_), [first, rest @ ..]) => {
                let slot = cluster::slot(&first.key);
                rest.iter().any(|c| cluster::slot(&c.key) != slot)
            }
            _ => false,
        }
    }
}

impl Store for RedisStore {
    fn instance(&self) -> Option<usize> {
        Some(self.batcher.instance())
    }

    /// On a cluster, the key's hash slot divided by 256: a master's slots
    /// are ranges, so its keys open only the breakers of its own ranges.
    fn fault_domain(&self, key: &str) -> usize {
        match &self.backend {
            #[cfg(feature = "cluster")]
            Backend::Cluster(_) => usize::from(cluster::slot(key)) / 256,
            _ => {
                let _ = key;
                0
            }
        }
    }

    fn peek(
        &self,
        checks: Vec<LimitCheck>,
        cost: u64,
    ) -> BoxFuture<'static, Result<Vec<LimitState>, Error>> {
        self.peek_call(checks, cost)
    }

    fn refund(&self, refunds: Vec<Refund>) -> BoxFuture<'static, Result<(), Error>> {
        self.refund_call(refunds)
    }

    fn reset(&self, keys: Vec<String>) -> BoxFuture<'static, Result<(), Error>> {
        self.reset_call(keys)
    }

    fn supports_reservation(&self) -> bool {
        true
    }

    fn reserve(
        &self,
        check: LimitCheck,
        need: u64,
        want: u64,
    ) -> BoxFuture<'static, Result<Reservation, Error>> {
        self.reserve_call(check, need, want)
    }

    fn decide(
        &self,
        checks: Vec<LimitCheck>,
        cost: u64,
    ) -> BoxFuture<'static, Result<Vec<LimitState>, Error>> {
        // A cost past what any limit holds is refused here: the scripts
        // count in doubles, and a count past 2^53 reads as corrupt (reset).
        if cost > crate::quota::MAX_LIMIT {
            let limit = crate::quota::MAX_LIMIT;
            return Box::pin(std::future::ready(Err(Error::CostExceedsLimit {
                cost,
                limit,
            })));
        }
        // A request the scripts refuse (no checks), or on a cluster one
        // whose keys are in several hash slots (Redis refuses it, or a
        // script aborts at a key of another node), goes alone: in a batch,
        // that refusal would fail every request of the call, after some had
        // spent. A `Limiter` never sends one.
        if checks.is_empty() || self.spans_slots(&checks) {
            let reply = self.decide_one(checks, cost);
            return Box::pin(async move { reply.await.map(|(states, _)| states.into_vec()) });
        }
        // Unbounded: the caller keeps its own timer.
        match self.decide_states(checks.into(), cost, None).0 {
            StoreReply::Batched(answer) => {
                Box::pin(async move { answer.await.map(|(states, _)| states.into_vec()) })
            }
            StoreReply::Alone(reply) => {
                Box::pin(async move { reply.await.map(|(states, _)| states.into_vec()) })
            }
        }
    }
}
