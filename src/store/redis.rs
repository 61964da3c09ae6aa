//! [`RedisStore`]: counters in Redis, one atomic script call per decision.

use std::fmt;

use bb8_redis::{RedisConnectionManager, bb8::Pool};
use redis::{
    Client, FromRedisValue, IntoConnectionInfo, ParsingError, Value,
    aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig},
};

use super::{
    BoxFuture, LimitCheck, LimitState, Refund, Reservation, Store, batch::Batcher, call::Call,
    scripts,
};
use crate::{Algorithm, Error};

#[path = "redis_admin.rs"]
mod admin;
#[cfg(feature = "cluster")]
#[path = "cluster.rs"]
mod cluster;
#[path = "redis_lease.rs"]
mod lease;
#[path = "self_test.rs"]
mod self_test;
#[cfg(feature = "sentinel")]
#[path = "sentinel.rs"]
mod sentinel;
#[cfg(feature = "tls")]
#[path = "tls.rs"]
mod tls;

#[cfg(feature = "sentinel")]
pub(super) use self::sentinel::Sentinel as SentinelMaster;

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
    Manager(ConnectionManager),
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
    pub async fn connect(url: impl IntoConnectionInfo) -> Result<Self, Error> {
        install_tls_provider();
        Self::connect_client(Client::open(url)?).await
    }

    /// [`connect`](Self::connect) with a client already built.
    async fn connect_client(client: Client) -> Result<Self, Error> {
        let stage = self_test::Stage::of(client.get_connection_info().addr());
        let manager = ConnectionManager::new_with_config(client, Self::manager_config())
            .await
            .map_err(|e| self_test::startup(e.into(), stage))?;
        let store = Self::new(manager);
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
        let client = Client::open(url)?;
        let manager = ConnectionManager::new_lazy_with_config(client, Self::manager_config())?;
        Ok(Self::new(manager))
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
    pub fn new(manager: ConnectionManager) -> Self {
        Self {
            backend: Backend::Manager(manager),
            batcher: Batcher::default(),
        }
    }

    /// Uses an existing bb8 pool (from `bb8-redis`).
    ///
    /// bb8 sends a `PING` on every checkout unless the pool is built with
    /// `.test_on_check_out(false)`, doubling the round trips per decision;
    /// turn it off for rate limiting. Each check waits for a free connection,
    /// so when Redis is down checks end at the limiter's timeout rather than
    /// failing fast as the `ConnectionManager` does.
    ///
    /// bb8-redis never reports a connection broken, so the store repairs the
    /// pool itself: a call whose connection was closed, reset or refused (a
    /// Redis restart, a dropped link) replaces that connection in the pool
    /// with a new one and is sent once more on it, so the pool decides again
    /// as soon as Redis is back. Error replies from Redis keep the
    /// connection.
    ///
    /// The pool is not checked here (this constructor is not `async`): call
    /// [`self_test`](Self::self_test) once after building the store to fail
    /// at startup on a Redis that is unreachable or cannot run the scripts.
    pub fn from_pool(pool: Pool<RedisConnectionManager>) -> Self {
        Self {
            backend: Backend::Pool(pool),
            batcher: Batcher::default(),
        }
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

/// One request of a decide call: its limits and cost.
pub(super) struct Request<'a> {
    pub(super) checks: &'a [LimitCheck],
    pub(super) cost: u64,
}

/// Every limit's key of a batch, request by request: the call's `KEYS`.
fn batch_keys<'a>(requests: &'a [Request<'_>]) -> Vec<&'a str> {
    let checks = requests.iter().flat_map(|r| r.checks);
    checks.map(|check| check.key.as_str()).collect()
}

/// The decide script's call for a batch of requests (often one): `KEYS` are
/// every limit's key, `ARGV` the batch (see `lua/decide.lua`). A call whose
/// limits are all fixed windows goes to the fast path instead.
fn decide_invocation(requests: &[Request<'_>]) -> Call {
    let fixed = requests.iter().all(|request| {
        (request.checks.iter()).all(|check| check.quota.algorithm() == Algorithm::FixedWindow)
    });
    if fixed {
        return fixed_invocation(requests);
    }
    general_invocation(&scripts::DECIDE, requests)
}

/// decide.lua's call (or its peek's, with `script` [`scripts::PEEK`]).
pub(super) fn general_invocation(script: &'static redis::Script, requests: &[Request<'_>]) -> Call {
    let mut call = Call::new(script, &batch_keys(requests));
    call.arg(requests.len());
    for request in requests {
        call.arg(request.cost).arg(request.checks.len());
        for check in request.checks {
            let quota = check.quota;
            let burst = match quota.algorithm() {
                Algorithm::Gcra { burst } => burst,
                _ => 0,
            };
            call.arg(quota.algorithm().code())
                .arg(quota.limit())
                .arg(quota.window_ms())
                .arg(burst)
                .arg(u8::from(check.shadow));
        }
    }
    call
}

/// The fixed-window fast path's call (see `lua/decide_fixed.lua`): the
/// batch's distinct policies once, then each request's cost and, per limit,
/// its policy's number. Same reply as [`decide_invocation`]'s.
fn fixed_invocation(requests: &[Request<'_>]) -> Call {
    let mut policies: Vec<(u64, u64, bool)> = Vec::new();
    let mut numbers = Vec::with_capacity(requests.iter().map(|r| r.checks.len()).sum());
    for check in requests.iter().flat_map(|r| r.checks) {
        let policy = (check.quota.limit(), check.quota.window_ms(), check.shadow);
        let number = match policies.iter().position(|p| *p == policy) {
            Some(i) => i + 1,
            None => {
                policies.push(policy);
                policies.len()
            }
        };
        numbers.push(number);
    }
    let mut call = Call::new(&scripts::DECIDE_FIXED, &batch_keys(requests));
    call.arg(policies.len());
    for (limit, window_ms, shadow) in policies {
        call.arg(limit).arg(window_ms).arg(u8::from(shadow));
    }
    call.arg(requests.len());
    let mut numbers = numbers.into_iter();
    for request in requests {
        call.arg(request.cost).arg(request.checks.len());
        for number in (&mut numbers).take(request.checks.len()) {
            call.arg(number);
        }
    }
    call
}

/// The decide scripts' reply: a flat array of integers that the script packs
/// with `cmsgpack.pack`. It arrives as one bulk string, taken whole; an
/// array reply is parsed by redis-rs element by element, which cost the
/// server about 4,500 instructions per request on the 100k-key benchmark.
pub(super) struct Packed(pub(super) Vec<i64>);

impl FromRedisValue for Packed {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let Value::BulkString(bytes) = v else {
            return Err(format!("decide replied {v:?}, not MessagePack").into());
        };
        let bad = || ParsingError::from(format!("decide replied bad MessagePack: {bytes:?}"));
        let mut rd = bytes.as_slice();
        let len = rmp::decode::read_array_len(&mut rd).map_err(|_| bad())?;
        let values = (0..len)
            .map(|_| rmp::decode::read_int(&mut rd).map_err(|_| bad()))
            .collect::<Result<Vec<i64>, _>>()?;
        if !rd.is_empty() {
            return Err(bad());
        }
        Ok(Packed(values))
    }
}

/// Splits a batch's flat reply into each request's states, in order.
pub(super) fn parse_batch(
    reply: &[i64],
    requests: &[Request<'_>],
) -> Result<Vec<Vec<LimitState>>, Error> {
    let mut rest = reply;
    let mut out = Vec::with_capacity(requests.len());
    for request in requests {
        let len = 1 + 4 * request.checks.len();
        if rest.len() < len {
            break;
        }
        out.push(parse_reply(&rest[..len], request.checks.len())?);
        rest = &rest[len..];
    }
    if out.len() != requests.len() || !rest.is_empty() {
        return Err(Error::UnexpectedReply(format!("decide returned {reply:?}")));
    }
    Ok(out)
}

/// Runs a batch on one connection: one call, one round trip.
pub(super) async fn decide<C: ConnectionLike>(
    conn: &mut C,
    requests: &[Request<'_>],
) -> Result<Vec<Vec<LimitState>>, Error> {
    let Packed(reply) = decide_invocation(requests).invoke(conn).await?;
    parse_batch(&reply, requests)
}

impl RedisStore {
    /// Runs a script call on a connection of this store: `EVALSHA`, then
    /// `SCRIPT LOAD` and `EVALSHA` again on `NOSCRIPT`.
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

/// `{ allowed, then per limit: allowed, remaining, reset_ms, retry_ms }`.
fn parse_reply(reply: &[i64], limits: usize) -> Result<Vec<LimitState>, Error> {
    let bad = || Error::UnexpectedReply(format!("decide returned {reply:?}"));
    if reply.len() != 1 + 4 * limits {
        return Err(bad());
    }
    let states = reply[1..].chunks_exact(4).map(|s| {
        let n = |i: usize| u64::try_from(s[i]).ok();
        Some(LimitState {
            allowed: s[0] == 1,
            remaining: n(1)?,
            reset_ms: n(2)?,
            retry_ms: n(3)?,
        })
    });
    let states: Option<Vec<_>> = states.collect();
    states.ok_or_else(bad)
}

impl RedisStore {
    /// One request, unbatched: on a pool, or when batching is not possible.
    fn decide_one(
        &self,
        checks: Vec<LimitCheck>,
        cost: u64,
    ) -> BoxFuture<'static, Result<Vec<LimitState>, Error>> {
        self.call_one(checks, cost, decide_invocation)
    }

    /// One request, alone in the call `invocation` makes of it (a decision,
    /// or a peek), and its states.
    pub(super) fn call_one(
        &self,
        checks: Vec<LimitCheck>,
        cost: u64,
        invocation: fn(&[Request<'_>]) -> Call,
    ) -> BoxFuture<'static, Result<Vec<LimitState>, Error>> {
        let request = [Request {
            checks: &checks,
            cost,
        }];
        let reply = self.run::<Packed>(invocation(&request));
        Box::pin(async move {
            let request = [Request {
                checks: &checks,
                cost,
            }];
            let mut states = parse_batch(&reply.await?.0, &request)?;
            states
                .pop()
                .ok_or_else(|| Error::UnexpectedReply("no reply".into()))
        })
    }
}

impl Store for RedisStore {
    fn instance(&self) -> Option<usize> {
        Some(self.batcher.instance())
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
        let submitted = match &self.backend {
            Backend::Manager(manager) => self.batcher.submit(manager, checks, cost),
            #[cfg(feature = "cluster")]
            Backend::Cluster(cluster::Cluster::Connection(conn)) => {
                self.batcher.submit(conn, checks, cost)
            }
            #[cfg(feature = "sentinel")]
            Backend::Sentinel(sentinel) => self.batcher.submit(sentinel, checks, cost),
            _ => Err((checks, cost)),
        };
        match submitted {
            Ok(reply) => reply,
            Err((checks, cost)) => self.decide_one(checks, cost),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packed(values: &[i64], extra: &[u8]) -> Value {
        let mut bytes = Vec::new();
        rmp::encode::write_array_len(&mut bytes, values.len() as u32).unwrap();
        for v in values {
            rmp::encode::write_sint(&mut bytes, *v).unwrap();
        }
        bytes.extend_from_slice(extra);
        Value::BulkString(bytes)
    }

    #[test]
    fn packed_replies_are_read_whole_and_nothing_else_is() {
        let values = [1, 0, 4, 3_600_000, 0, 1 << 40];
        let Packed(read) = Packed::from_redis_value(packed(&values, b"")).unwrap();
        assert_eq!(read, values);
        // Trailing bytes, a float, an array reply, a truncated array.
        assert!(Packed::from_redis_value(packed(&values, b"\x01")).is_err());
        let mut float = Vec::new();
        rmp::encode::write_array_len(&mut float, 1).unwrap();
        rmp::encode::write_f64(&mut float, 1.5).unwrap();
        assert!(Packed::from_redis_value(Value::BulkString(float)).is_err());
        let array = Value::Array(vec![Value::Int(1)]);
        assert!(Packed::from_redis_value(array).is_err());
        assert!(Packed::from_redis_value(Value::BulkString(vec![0x93, 0x01])).is_err());
    }
}
