//! [`RedisStore::self_test`]: fail at startup, saying why, on a Redis the
//! limiter cannot use, rather than on every request.
//!
//! A child module of `redis.rs`, so that it reaches the store's `run`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::future::try_join_all;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use super::{Call, RedisStore};
use crate::{Error, Quota, store::LimitCheck, store::scripts};

/// How long the whole check may take.
const DEADLINE: Duration = Duration::from_secs(5);

/// How often the check asks again a Redis that is loading its dataset.
const LOADING_POLL: Duration = Duration::from_millis(50);

/// The key of the check's decisions: a reserved name, in one cluster slot.
/// The decisions cost 0, which only looks: nothing is written.
const KEY: &str = "redis-ratelimit:self-test:{self-test}";

/// The key the check deletes to see that Redis takes writes: never set.
const WRITE_PROBE: &str = "redis-ratelimit:self-test:{self-test}:write";

impl RedisStore {
    /// Checks that this store's Redis can run the limiter: it loads every
    /// script the store uses (`SCRIPT LOAD`, on a cluster on every node) and
    /// runs one decision of each kind, with a cost of 0 on a reserved key
    /// (`redis-ratelimit:self-test:{self-test}`), which writes nothing.
    ///
    /// [`connect`](Self::connect) and `cluster` run it themselves. A store
    /// built from a pool you made ([`from_pool`](Self::from_pool),
    /// `from_cluster_pool`) cannot be checked in its constructor: call this
    /// once at startup, so that a Redis that is unreachable, refuses the
    /// password, cannot run the scripts (scripting disabled or renamed, a
    /// Redis-protocol server without Lua's `cmsgpack`) or refuses writes (a
    /// read-only replica, `MISCONF`, a user whose ACL denies any write the
    /// scripts make; it deletes and expires a key that is never set,
    /// `redis-ratelimit:self-test:{self-test}:write`, which writes nothing,
    /// then makes the scripts' other writes on that key and deletes it in
    /// the same script, `lua/probe_writes.lua`, which leaves nothing) stops
    /// the service with a message, instead of failing every request into
    /// the [`OnStoreError`](crate::OnStoreError) policy. A Redis out of
    /// memory (`noeviction`) is not held against it.
    ///
    /// A Redis still loading its dataset from disk (a restart, `LOADING`)
    /// is waited for, within the same deadline.
    ///
    /// Fails with [`Error::Startup`], whose message names the cause, after
    /// 5 s at most.
    ///
    /// It also reads `INFO memory`, and logs a warning (`tracing`) if Redis
    /// may evict the limiter's keys: a `maxmemory` set, with a
    /// `maxmemory-policy` other than `noeviction`. Every key the limiter
    /// writes has a TTL, so `volatile-*` policies evict them as `allkeys-*`
    /// ones do, and an evicted counter forgets what its client spent: the
    /// client starts over with a whole quota. A Redis that refuses
    /// `INFO` is not checked for it.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use bb8_redis::{RedisConnectionManager, bb8::Pool};
    /// use redis_ratelimit::RedisStore;
    ///
    /// let manager = RedisConnectionManager::new("redis://127.0.0.1:6379")?;
    /// let pool = Pool::builder().test_on_check_out(false).build(manager).await?;
    /// let store = RedisStore::from_pool(pool);
    /// store.self_test().await?;
    /// # Ok(()) }
    /// ```
    pub async fn self_test(&self) -> Result<(), Error> {
        let loading = AtomicBool::new(false);
        let check = async {
            self.wait_while_loading(&loading).await?;
            self.check_scripts().await?;
            self.warn_if_evicting().await;
            Ok(())
        };
        match tokio::time::timeout(DEADLINE, check).await {
            Ok(Err(e @ Error::Startup(_))) => Err(e),
            Ok(result) => result.map_err(|e| startup(e, Stage::Scripts)),
            Err(_) if loading.load(Ordering::Relaxed) => Err(Error::Startup(format!(
                "Redis was still loading its dataset into memory (LOADING) after \
                 {DEADLINE:?}: start the service once Redis has loaded it"
            ))),
            Err(_) => Err(Error::Startup(format!(
                "Redis did not answer the startup check within {DEADLINE:?}"
            ))),
        }
    }

    /// `PING`s until Redis answers other than `LOADING` (a Redis loading its
    /// dataset from disk answers every command but a few so), setting
    /// `loading` if it did. `PING` comes first as a command every client may
    /// send once authenticated, so that a missing password reads as such
    /// (Redis cuts an unauthenticated client off at a large argument, such
    /// as a script's source).
    async fn wait_while_loading(&self, loading: &AtomicBool) -> Result<(), Error> {
        loop {
            match self.run::<String>(Call::command(redis::cmd("PING"))).await {
                Err(Error::Redis(e)) if e.code() == Some("LOADING") => {
                    loading.store(true, Ordering::Relaxed);
                    tokio::time::sleep(LOADING_POLL).await;
                }
                result => return result.map(drop),
            }
        }
    }

    async fn check_scripts(&self) -> Result<(), Error> {
        // Writes that write nothing (a key that is never set), so that a
        // Redis that refuses every check's write says so now: a read-only
        // replica (`READONLY`), one that cannot save to disk (`MISCONF`), or
        // a user whose ACL denies the scripts' writes (`NOPERM`: the
        // scripts delete a fresh counter to roll a denied spend back, set a
        // TTL on every key, and set GCRA's values and refunds' and resets'
        // markers). The decisions below cost 0 and only read, which a
        // replica and a read-only user allow.
        // The probes, then the loads, each sent at once (pipelined on a
        // multiplexed connection): a round trip for all of them, where one
        // each put a Redis 300 ms away past the check's deadline.
        let probes = write_probes()
            .map(|probe| async { refused_by_acl(self.run::<Value>(Call::command(probe)).await) });
        try_join_all(probes).await?;
        let loads = scripts::all().map(|(script, source)| async move {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(source);
            let sha: String = self.run(Call::command(load)).await?;
            match sha == script.get_hash() {
                true => Ok(()),
                false => Err(Error::UnexpectedReply(format!(
                    "SCRIPT LOAD returned {sha:?}, not the script's SHA1 {}",
                    script.get_hash()
                ))),
            }
        });
        try_join_all(loads).await?;
        let limit = Quota::per_minute(1);
        let gcra = limit.gcra(1).expect("a burst of 1 is valid");
        // All fixed windows (decide_fixed.lua), then the general script.
        for quotas in [&[limit][..], &[limit.sliding_window(), gcra]] {
            let checks: Vec<LimitCheck> = (quotas.iter().enumerate())
                .map(|(i, quota)| LimitCheck {
                    key: format!("{KEY}:{i}"),
                    quota: *quota,
                    shadow: false,
                })
                .collect();
            let count = checks.len();
            let (states, _) = self.decide_one(checks, 0).await?;
            if states.len() != count || !states.iter().all(|s| s.allowed && s.remaining == 1) {
                return Err(Error::UnexpectedReply(format!(
                    "a look at an empty key returned {states:?}"
                )));
            }
        }
        // Every other write the scripts make, each on a key the probe
        // deletes before it returns (`lua/probe_writes.lua`). A Redis out
        // of memory refuses them (`OOM`), which startup does not hold
        // against it, as above.
        let probe = Call::new(&scripts::PROBE_WRITES, &[WRITE_PROBE]);
        match self.run::<Value>(probe).await {
            Err(Error::Redis(e)) if e.code() == Some("OOM") => Ok(()),
            result => refused_by_acl(result).map(drop),
        }
    }
}

/// `result`, or if Redis refused it by the user's ACL (`NOPERM`), a startup
/// error that says so.
fn refused_by_acl(result: Result<Value, Error>) -> Result<Value, Error> {
    match result {
        Err(Error::Redis(e)) if e.code() == Some("NOPERM") => Err(Error::Startup(format!(
            "this user may not make the writes the limiter's scripts make \
             (DEL, PEXPIRE, SET, INCRBY, DECRBY, HSET, and for the concurrency \
             limiter ZADD, ZREM and ZREMRANGEBYSCORE): allow them on the \
             limiter's keys in its ACL: {e}"
        ))),
        result => result,
    }
}

/// The startup check's writes, each of which writes nothing on
/// [`WRITE_PROBE`], a key that is never set: `DEL` it, `PEXPIRE` it. Neither
/// is refused by a Redis out of memory (`noeviction`), which startup does
/// not hold against a store: its checks follow the policy until memory
/// frees. The other writes are probed by `lua/probe_writes.lua`, after the
/// scripts are loaded.
fn write_probes() -> [redis::Cmd; 2] {
    let mut del = redis::cmd("DEL");
    del.arg(WRITE_PROBE);
    let mut pexpire = redis::cmd("PEXPIRE");
    pexpire.arg(WRITE_PROBE).arg(1);
    [del, pexpire]
}

impl RedisStore {
    /// Logs a warning for each eviction policy [`evicting`] finds in `INFO
    /// memory` (on a cluster, redis-rs asks every master).
    async fn warn_if_evicting(&self) {
        let mut info = redis::cmd("INFO");
        info.arg("memory");
        match self.run::<Value>(Call::command(info)).await {
            Ok(reply) => {
                for policy in evicting(&reply) {
                    tracing::warn!(
                        maxmemory_policy = %policy,
                        "Redis may evict the limiter's keys (maxmemory is set, and \
                         maxmemory-policy is {policy}): an evicted counter forgets what its \
                         client spent, and the client starts over with a whole quota. \
                         Set maxmemory-policy noeviction on the limiter's Redis (a full Redis \
                         then fails checks into the OnStoreError policy), or give the limiter \
                         a Redis of its own"
                    );
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "INFO memory: the eviction policy is not checked")
            }
        }
    }
}

/// The eviction policies in an `INFO memory` reply (one node's text, or a
/// cluster's map of them) of nodes that may evict keys: `maxmemory` above 0
/// and `maxmemory_policy` other than `noeviction`; each policy once.
fn evicting(reply: &Value) -> Vec<String> {
    fn node(text: &str, found: &mut Vec<String>) {
        let field = |name: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let limited = field("maxmemory").is_some_and(|m| m != "0");
        if let Some(policy) = field("maxmemory_policy")
            && limited
            && policy != "noeviction"
            && !found.iter().any(|p| p == policy)
        {
            found.push(policy.to_owned());
        }
    }
    fn walk(reply: &Value, found: &mut Vec<String>) {
        match reply {
            Value::BulkString(bytes) => node(&String::from_utf8_lossy(bytes), found),
            Value::SimpleString(text) | Value::VerbatimString { text, .. } => node(text, found),
            Value::Map(pairs) => pairs.iter().for_each(|(_, v)| walk(v, found)),
            Value::Array(items) => items.iter().for_each(|v| walk(v, found)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    walk(reply, &mut found);
    found
}

/// What the check was doing when it failed.
#[derive(Clone, Copy)]
pub(super) enum Stage {
    /// Opening the connection.
    Connect,
    /// Opening a TLS connection (a `rediss://` URL).
    #[cfg(feature = "tls")]
    ConnectTls,
    /// Loading and running the scripts.
    Scripts,
}

impl Stage {
    /// The connecting stage for a connection to `addr`.
    pub(super) fn of(addr: &redis::ConnectionAddr) -> Self {
        match addr {
            #[cfg(feature = "tls")]
            redis::ConnectionAddr::TcpTls { .. } => Stage::ConnectTls,
            _ => Stage::Connect,
        }
    }
}

/// [`Error::Startup`] for `e`, naming the cause where redis-rs tells it.
pub(super) fn startup(e: Error, stage: Stage) -> Error {
    let cause = match (&e, stage) {
        #[cfg(feature = "tls")]
        (Error::Redis(e), _) if super::tls::is_tls_error(e) => {
            "TLS failed: the server's certificate is not signed by the CA you trust \
             (pass yours to RedisStore::connect_with_tls), the server wants a client \
             certificate, or the port does not speak TLS"
        }
        #[cfg(feature = "tls")]
        (Error::Redis(e), Stage::ConnectTls) if e.is_timeout() => {
            "no TLS handshake in time: does this port speak TLS? (a plain Redis port never \
             answers a TLS hello)"
        }
        #[cfg(feature = "sentinel")]
        (Error::Redis(e), _) if e.kind() == ErrorKind::MasterNameNotFoundBySentinel => {
            "no sentinel names a healthy master by that name: check the master name \
             (`sentinel monitor <name> ...` in the sentinels' configuration) and that \
             the master is up"
        }
        (Error::Redis(e), _) if is_auth(e) => {
            "authentication failed: wrong or missing password (put it in the URL, \
             redis://:PASSWORD@host:port or redis://USER:PASSWORD@host:port)"
        }
        (Error::Redis(e), _) if e.is_connection_refusal() => {
            "connection refused: nothing listens at that address; is Redis running there?"
        }
        (Error::Redis(e), _) if e.is_io_error() || e.is_timeout() => "Redis is unreachable",
        (Error::Redis(e), _) if e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) => {
            "this Redis is a read-only replica, which would refuse every check: point the \
             store at the master (RedisStore::sentinel and RedisStore::cluster find it)"
        }
        (Error::Redis(e), _) if e.code() == Some("MASTERDOWN") => {
            "this Redis is a replica that lost its master and serves nothing \
             (replica-serve-stale-data no): point the store at the master \
             (RedisStore::sentinel and RedisStore::cluster find it)"
        }
        (Error::Redis(e), _) if e.code() == Some("LOADING") => {
            "Redis is loading its dataset into memory (LOADING): start the service once \
             it has loaded it"
        }
        (Error::Redis(e), _) if e.code() == Some("MISCONF") => {
            "Redis refuses writes because it cannot save to disk (MISCONF): every check \
             would fail; see its log"
        }
        (Error::Redis(e), _) if e.code() == Some("NOPERM") => {
            "this user may not run the limiter's scripts: allow EVALSHA and SCRIPT LOAD \
             in its ACL"
        }
        (_, Stage::Scripts) => {
            "Redis cannot run the limiter's Lua scripts (scripting disabled or renamed, \
             or a Redis-protocol server without Lua and its cmsgpack library)"
        }
        _ => "cannot connect to Redis",
    };
    Error::Startup(format!("{cause}: {e}"))
}

fn is_auth(e: &RedisError) -> bool {
    e.kind() == ErrorKind::AuthenticationFailed || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::evicting;

    fn info(maxmemory: u64, policy: &str) -> String {
        format!(
            "# Memory\r\nused_memory:1000\r\nmaxmemory:{maxmemory}\r\nmaxmemory_human:0B\r\nmaxmemory_policy:{policy}\r\n"
        )
    }

    #[test]
    fn an_eviction_policy_counts_only_with_a_maxmemory() {
        let bulk = |text: String| Value::BulkString(text.into_bytes());
        assert_eq!(
            evicting(&bulk(info(1 << 30, "volatile-lru"))),
            ["volatile-lru"]
        );
        assert_eq!(
            evicting(&bulk(info(1 << 30, "allkeys-lfu"))),
            ["allkeys-lfu"]
        );
        assert!(evicting(&bulk(info(1 << 30, "noeviction"))).is_empty());
        assert!(evicting(&bulk(info(0, "allkeys-lru"))).is_empty());
        assert!(evicting(&Value::Nil).is_empty());
        // A cluster's reply, a map of nodes: each policy once.
        let cluster = Value::Map(vec![
            (bulk("a:1".into()), bulk(info(1 << 30, "allkeys-lru"))),
            (bulk("b:2".into()), bulk(info(1 << 30, "noeviction"))),
            (bulk("c:3".into()), bulk(info(1 << 30, "allkeys-lru"))),
        ]);
        assert_eq!(evicting(&cluster), ["allkeys-lru"]);
    }
}
