//! Redis Sentinel for [`RedisStore`] (feature `sentinel`): the master is
//! found through the sentinels, and found again after a failover.
//!
//! A connection bound to the master's address (a `ConnectionManager`) would
//! reconnect to the same address for ever after a failover: to a dead host,
//! or to the old master now serving as a read-only replica. Instead, the
//! store's connection is a [`Sentinel`]: a multiplexed connection to the
//! master the sentinels named, which a lookup of the master replaces in two
//! cases.
//!
//! * **A call finds the master gone** (the connection closed, reset,
//!   refused) **or a replica** (`READONLY`, or `MASTERDOWN` from a replica
//!   that lost its own master: that node was demoted). The
//!   connection is dropped, and the call waits for a lookup, then is sent
//!   once more, to the master the sentinels name now. Redis may have run it
//!   before its connection dropped (the reply was lost): a decision is then
//!   charged twice, a limit reached early, never passed; a refund or a reset
//!   runs once however often it is sent (`lua/once.lua`).
//! * **A call on the master is dropped before its reply** (its limiter's
//!   timeout) after waiting [`STALLED`] (50 ms) or more: the master may be
//!   frozen (`SIGSTOP`, a stalled host), its connections open and nothing
//!   answered, which fails no call. A lookup then asks the sentinels which
//!   master they name: at another address, the store connects to it and
//!   sends every call after to it; at the same address, nothing changes.
//!   Calls go on using the connection in use meanwhile. Such a lookup
//!   starts at most once per 500 ms, and not while another one runs.
//! * **The master refuses a call with `NOREPLICAS`**: it has
//!   `min-replicas-to-write` and reaches too few replicas. Cut off from its
//!   replicas and its sentinels while the store still reaches it, it stays
//!   a master for as long as the partition lasts (the sentinels promote a
//!   replica but cannot demote it), refusing every call. The call fails,
//!   and a lookup starts as for a call gone unanswered (once per 500 ms at
//!   most, calls going on meanwhile), so the store moves to the master the
//!   sentinels promoted, if they did. While lookups keep finding the same
//!   master (one only short of replicas, a replica down for maintenance),
//!   the least time between them doubles, up to 4 s.
//!
//! All the repair is in [`Sentinel::send`]; the lookups are in
//! `sentinel_lookup.rs`. A lookup runs in a task of its own, one at a time,
//! so that it ends, and installs the connection it made, even when every
//! call that waited for it gave up first (each waits within its own
//! deadline). That matters because a lookup can take longer than a
//! limiter's timeout (200 ms by default): redis-rs reads the sentinels'
//! answers in the order they are listed, so a first sentinel that does not
//! answer holds every lookup for redis-rs's timeouts, 0.5 to 1.5 s (0.5 s
//! for a reply and 1 s to connect; once a reply has timed out, redis-rs
//! connects to that sentinel again and asks once more). A failed
//! lookup's error stands for 100 ms (`RETRY`): calls that need a connection
//! meanwhile fail at once with it.
//!
//! During a failover, until the sentinels have promoted a replica, calls
//! fail (and the limiter applies its [`OnStoreError`](crate::OnStoreError)
//! policy). A dead master is left by the first lookup that ends after the
//! sentinels name the new one. A frozen one is left by the first lookup
//! for a stalled call that starts after that: once a call has timed out,
//! and at most 500 ms after the last such lookup started (or when the one
//! running ends), then one lookup's time. So it is left only while calls
//! come and time out: under a limiter timeout shorter than 50 ms no call
//! waits long enough, and a frozen master is left only once it answers
//! again (`READONLY`, or its connections closed by Sentinel demoting it).
//! A link that loses every packet is also closed within seconds by the
//! store's TCP settings (`tcp.rs`), and a call on it then fails.
//!
//! In the tests (`tests/sentinel.rs`: down-after-milliseconds 1000, a
//! limiter timeout of 200 ms, every check sent to the store), the store
//! decided again about 0.1 s after the sentinels switched to the replica
//! when the master was frozen (3.3 s after the freeze), and about 1.5 s
//! after the switch when the master was killed while the first sentinel
//! was frozen (3.7 s after the kill).
//!
//! A child module of `redis.rs`, so that it reaches the store's backends.

use std::{
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use redis::{
    Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, Pipeline, RedisError, RedisFuture,
    RedisResult, TlsMode, Value,
    aio::{ConnectionLike, MultiplexedConnection},
    sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType},
};
use tokio::sync::watch;

use self::lookup::{State, Suspicion};
use super::super::pool;
use super::{Backend, Batcher, RedisStore, self_test};
use crate::Error;

/// The master's TLS, as the sentinels': `None` when no sentinel is reached
/// over TLS, its mode when every one is (`Insecure` only if every one is),
/// and an error for a list that mixes the two, which says nothing sure of
/// the master.
fn master_tls(sentinels: &[ConnectionInfo]) -> Result<Option<TlsMode>, Error> {
    let insecure = |info: &ConnectionInfo| match info.addr() {
        ConnectionAddr::TcpTls { insecure, .. } => Some(*insecure),
        _ => None,
    };
    let tls: Vec<Option<bool>> = sentinels.iter().map(insecure).collect();
    match (
        tls.iter().all(Option::is_some),
        tls.iter().all(Option::is_none),
    ) {
        (_, true) => Ok(None),
        (true, _) => match tls.iter().all(|i| *i == Some(true)) {
            true => Ok(Some(TlsMode::Insecure)),
            false => Ok(Some(TlsMode::Secure)),
        },
        _ => Err(Error::Startup(
            "the sentinel URLs mix redis:// and rediss://: give them all one scheme (the \
             master is reached over TLS if the sentinels are), or build a SentinelClient \
             for the master's TLS and use RedisStore::from_sentinel"
                .into(),
        )),
    }
}

#[path = "sentinel_lookup.rs"]
mod lookup;

/// How long a call must have waited for the master's reply, when it is
/// dropped unanswered (its caller's timeout), for the sentinels to be asked
/// whether they name another master now (see the [module docs](self)).
const STALLED: Duration = Duration::from_millis(50);

/// The store's connection to the master the sentinels name; clones share it.
#[derive(Clone)]
pub(crate) struct Sentinel {
    shared: Arc<Shared>,
}

struct Shared {
    /// The master's name, for messages.
    name: String,
    /// The connection in use and the lookups' state.
    state: Mutex<State>,
    /// Counts the lookups that ended, for the calls that wait for one.
    ended: watch::Sender<u64>,
    /// Asks the sentinels: the one lookup running holds it.
    client: tokio::sync::Mutex<SentinelClient>,
}

/// A connection to the master, numbered so that a call repairs only the
/// connection it failed on, not one a lookup installed meanwhile.
#[derive(Clone)]
struct Master {
    conn: MultiplexedConnection,
    generation: u64,
}

impl Sentinel {
    fn new(client: SentinelClient, name: String) -> Self {
        Self {
            shared: Arc::new(Shared {
                name,
                state: Mutex::new(State::default()),
                ended: watch::Sender::new(0),
                client: tokio::sync::Mutex::new(client),
            }),
        }
    }

    /// The state, held briefly: nothing that holds it awaits or panics.
    fn state(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn current(&self) -> Option<Master> {
        self.state().master()
    }

    /// The master's connection: the current one, or a new one.
    async fn master(&self) -> RedisResult<Master> {
        match self.current() {
            Some(master) => Ok(master),
            None => self.replace(None).await,
        }
    }

    /// Sends one request on the master, repairing the connection as the
    /// [module docs](self) say. A request sent again after its connection
    /// dropped may have run the first time too (the reply was lost): a
    /// decision's key is then charged twice, so a limit can only be reached
    /// early; a refund or a reset finds its marker and does nothing more
    /// (`lua/once.lua`).
    ///
    /// `refusal` reads a reply's error replies (see [`Refusal`]): redis-rs
    /// hands them over as values, so a demoted master's answer comes as
    /// `Ok`, not as an error.
    async fn send<T, F>(
        &self,
        request: impl Fn(MultiplexedConnection) -> F,
        refusal: impl Fn(&T) -> Option<Refusal>,
    ) -> RedisResult<T>
    where
        F: Future<Output = RedisResult<T>>,
    {
        let master = self.master().await?;
        let generation = master.generation;
        let result = self.awaited(generation, request(master.conn)).await;
        let refused = match &result {
            Ok(reply) => refusal(reply),
            Err(e) => Refusal::of_error(e),
        };
        match refused {
            None => return result,
            Some(Refusal::NoReplicas) => {
                self.suspect(generation, Suspicion::NoReplicas);
                return result;
            }
            Some(Refusal::Replica) => {}
        }
        match &result {
            Ok(_) => {
                tracing::warn!(master = %self.shared.name, "master answered as a replica (READONLY or MASTERDOWN: demoted): asking the sentinels")
            }
            Err(e) => {
                tracing::warn!(master = %self.shared.name, error = %e, "master lost: asking the sentinels")
            }
        }
        // Still no master: keep the first answer.
        let Ok(master) = self.replace(Some(generation)).await else {
            return result;
        };
        self.awaited(master.generation, request(master.conn)).await
    }

    /// `call`, sent on the master numbered `generation`, noting it if it
    /// is dropped unanswered.
    async fn awaited<T>(&self, generation: u64, call: impl Future<Output = T>) -> T {
        let awaiting = Awaiting {
            sentinel: self,
            generation,
            since: Instant::now(),
        };
        let reply = call.await;
        awaiting.answered();
        reply
    }
}

/// A call waiting for the master's reply. Dropped before the reply, after
/// waiting [`STALLED`] or more, it has the sentinels asked whether they name
/// another master now ([`Sentinel::suspect`]).
struct Awaiting<'a> {
    sentinel: &'a Sentinel,
    generation: u64,
    since: Instant,
}

impl Awaiting<'_> {
    /// The reply came: nothing to note.
    fn answered(self) {
        std::mem::forget(self);
    }
}

impl Drop for Awaiting<'_> {
    fn drop(&mut self) {
        if self.since.elapsed() >= STALLED {
            self.sentinel.suspect(self.generation, Suspicion::Stalled);
        }
    }
}

/// Whether `e` means this connection's node is no longer the master to use:
/// the connection is gone, or the node is a read-only replica now.
fn needs_new_master(e: &RedisError) -> bool {
    pool::is_broken(e) || pool::is_replicas(e)
}

/// An error reply that says the node may no longer be the master to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// The connection is gone, or the node answered as a replica
    /// (`READONLY`, or `MASTERDOWN`: see `pool::is_replicas`), and so
    /// ran nothing. The connection is dropped and the call sent again once
    /// the sentinels name the master.
    Replica,
    /// `NOREPLICAS`: a master with `min-replicas-to-write` that reaches
    /// too few replicas, and so refuses writes (a script's, before it has
    /// written anything). It may be cut off from its replicas and its
    /// sentinels, which promote one of the replicas: they cannot demote
    /// it while they cannot reach it, so it would refuse every call for as
    /// long as the partition lasts. The call fails (its limiter's
    /// [`OnStoreError`](crate::OnStoreError) policy), and the sentinels are
    /// asked whether they name another master now, at most once per 500 ms,
    /// less often (up to every 4 s) while they keep naming this one
    /// ([`Sentinel::suspect`]); calls go on using the connection in use
    /// meanwhile.
    NoReplicas,
}

/// Redis's error code for a write refused for want of replicas.
const NOREPLICAS: &str = "NOREPLICAS";

impl Refusal {
    /// The refusal in a reply, if it is an error reply that says one.
    fn of_value(value: &Value) -> Option<Self> {
        match value {
            _ if pool::replies_as_replica(value) => Some(Self::Replica),
            Value::ServerError(e) if e.code() == NOREPLICAS => Some(Self::NoReplicas),
            _ => None,
        }
    }

    /// The refusal in a call's error, if it says one.
    fn of_error(e: &RedisError) -> Option<Self> {
        if needs_new_master(e) {
            Some(Self::Replica)
        } else if e.code() == Some(NOREPLICAS) {
            Some(Self::NoReplicas)
        } else {
            None
        }
    }

    /// The refusal among a pipeline's replies: a replica's over a
    /// master's that reaches too few replicas.
    fn of_values(values: &[Value]) -> Option<Self> {
        values
            .iter()
            .filter_map(Self::of_value)
            .min_by_key(|refusal| *refusal != Self::Replica)
    }
}

impl ConnectionLike for Sentinel {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.send(
            move |mut conn| async move { conn.req_packed_command(cmd).await },
            Refusal::of_value,
        ))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(self.send(
            move |mut conn| async move { conn.req_packed_commands(cmd, offset, count).await },
            |replies: &Vec<Value>| Refusal::of_values(replies),
        ))
    }

    fn get_db(&self) -> i64 {
        self.current().map_or(0, |master| master.conn.get_db())
    }
}

impl RedisStore {
    /// Connects to the master that the sentinels at `sentinels` (e.g.
    /// `redis://10.0.0.1:26379`) name `master_name`, and runs the
    /// [`self_test`](Self::self_test): fails now, with [`Error::Startup`]
    /// naming the cause, if no sentinel answers, none knows a healthy master
    /// by that name, or the master cannot run the scripts.
    ///
    /// The store follows failovers: when the master is gone or has become a
    /// replica, it asks the sentinels again and sends the call to the new
    /// master; a refund or a reset sent again runs once all the same. When
    /// a call times out after waiting 50 ms or more (a frozen master fails
    /// no call), it asks them in the background, at most once per 500 ms,
    /// and moves to the master they name if it is another one. Lookups run
    /// in a task of their own, so that one slower than the limiter's
    /// timeout (a first sentinel that does not answer) still ends and is
    /// used. Until a replica is promoted, checks fail (or time out, on a
    /// frozen master) into the [`OnStoreError`](crate::OnStoreError)
    /// policy. The `sentinel` module's docs in the source give the bounds.
    ///
    /// The master is reached over TLS when the sentinels are (`rediss://`
    /// URLs, all of them: a list that mixes `redis://` and `rediss://` is
    /// refused, with [`Error::Startup`]), checking its certificate against
    /// the system's trust store unless every URL says `#insecure`. It is
    /// reached without a password; for one (or a database other than 0, or
    /// certificates of your own), build a [`SentinelClient`] with
    /// redis-rs's `SentinelClientBuilder` and pass it to
    /// [`from_sentinel`](Self::from_sentinel).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use redis_ratelimit::{Limiter, Quota, RedisStore};
    ///
    /// let store = RedisStore::sentinel(
    ///     ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///     "mymaster",
    /// )
    /// .await?;
    /// let limiter = Limiter::builder(Quota::per_second(10)).store(store).build()?;
    /// assert!(limiter.check("user:1", 1).await?.is_allowed());
    /// # Ok(()) }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub async fn sentinel<T: IntoConnectionInfo>(
        sentinels: impl IntoIterator<Item = T>,
        master_name: &str,
    ) -> Result<Self, Error> {
        super::install_tls_provider();
        let sentinels = (sentinels.into_iter())
            .map(IntoConnectionInfo::into_connection_info)
            .collect::<RedisResult<Vec<ConnectionInfo>>>()?;
        let master = master_tls(&sentinels)?
            .map(|tls| SentinelNodeConnectionInfo::default().set_tls_mode(tls));
        // Without redis-rs's TLS the name must be a `String`; with it, any `AsRef<str>`.
        #[allow(clippy::unnecessary_to_owned)]
        let client = SentinelClient::build(
            sentinels,
            master_name.to_owned(),
            master,
            SentinelServerType::Master,
        )?;
        Self::connect_sentinel(client, master_name.to_owned()).await
    }

    /// Like [`sentinel`](Self::sentinel), with a [`SentinelClient`] you built
    /// (with a password, TLS or a database for the master); it must be of
    /// [`SentinelServerType::Master`].
    ///
    /// The store's connections to the master have `TCP_NODELAY` on, as with
    /// [`sentinel`](Self::sentinel), whatever the client's TCP settings for
    /// the master say; its other TCP settings are kept.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
    /// use redis::ConnectionAddr;
    /// use redis_ratelimit::RedisStore;
    ///
    /// let sentinels = [ConnectionAddr::Tcp("10.0.0.1".into(), 26379)];
    /// let client = SentinelClientBuilder::new(sentinels, "mymaster", SentinelServerType::Master)?
    ///     .set_client_to_redis_password("secret")
    ///     .build()?;
    /// let store = RedisStore::from_sentinel(client).await?;
    /// # Ok(()) }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub async fn from_sentinel(client: SentinelClient) -> Result<Self, Error> {
        super::install_tls_provider();
        Self::connect_sentinel(client, "the master".to_owned()).await
    }

    async fn connect_sentinel(client: SentinelClient, name: String) -> Result<Self, Error> {
        let sentinel = Sentinel::new(client, name);
        sentinel
            .master()
            .await
            .map_err(|e| self_test::startup(e.into(), self_test::Stage::Connect))?;
        let store = Self {
            backend: Backend::Sentinel(sentinel),
            batcher: Batcher::default(),
        };
        store.self_test().await?;
        Ok(store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(resp: &str) -> Value {
        redis::parse_redis_value(resp.as_bytes()).unwrap()
    }

    #[test]
    fn a_replicas_answers_and_a_cut_off_masters_are_told_apart() {
        let read_only = reply("-READONLY You can't write against a read only replica.\r\n");
        let master_down = reply(
            "-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.\r\n",
        );
        let no_replicas = reply("-NOREPLICAS Not enough good replicas to write. script: 1f\r\n");
        let other = reply("-ERR decide_fixed: bad limit\r\n");
        assert_eq!(Refusal::of_value(&read_only), Some(Refusal::Replica));
        assert_eq!(Refusal::of_value(&master_down), Some(Refusal::Replica));
        assert_eq!(Refusal::of_value(&no_replicas), Some(Refusal::NoReplicas));
        assert_eq!(Refusal::of_value(&other), None);
        assert_eq!(Refusal::of_value(&Value::Int(1)), None);
        // In a pipeline, a replica's answer wins: the node is not the master.
        let mixed = [Value::Okay, no_replicas.clone(), master_down, no_replicas];
        assert_eq!(Refusal::of_values(&mixed), Some(Refusal::Replica));
        assert_eq!(Refusal::of_values(&mixed[..2]), Some(Refusal::NoReplicas));
        assert_eq!(Refusal::of_values(&[Value::Okay, other]), None);
    }
}
