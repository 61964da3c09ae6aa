//! Redis Sentinel for [`RedisStore`] (feature `sentinel`): the master is
//! found through the sentinels, and found again after a failover.
//!
//! A connection bound to the master's address (a `ConnectionManager`) would
//! reconnect to the same address for ever after a failover: to a dead host,
//! or to the old master now serving as a read-only replica. Instead, the
//! store's connection is a [`Sentinel`]: a multiplexed connection to the
//! master the sentinels named, which is dropped, and the master asked for
//! again, when a call finds it gone (closed, reset, refused) or read-only
//! (`READONLY`: that node is a replica now). That call is then sent once
//! more, to the master the sentinels name now. Redis may have run it before
//! its connection dropped (the reply was lost): a decision is then charged
//! twice, a limit reached early, never passed; a refund or a reset runs once
//! however often it is sent (`lua/once.lua`). All the repair is in
//! [`Sentinel::send`].
//!
//! During a failover, until the sentinels have promoted a replica, calls
//! fail (and the limiter applies its [`OnStoreError`](crate::OnStoreError)
//! policy); the sentinels are asked at most once per [`RETRY`] meanwhile.
//! A master that stops answering without closing its connections is left
//! only when a call sees an error on it: within seconds for a link that
//! loses every packet (the store's TCP settings, `tcp.rs`), and for a
//! frozen Redis when Sentinel, having demoted it, closes every client's
//! connection to it.
//!
//! A child module of `redis.rs`, so that it reaches the store's backends.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use redis::{
    AsyncConnectionConfig, Cmd, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, RedisResult,
    Value,
    aio::{ConnectionLike, MultiplexedConnection},
    sentinel::{SentinelClient, SentinelServerType},
};

use super::super::pool;
use super::{Backend, Batcher, RedisStore, self_test};
use crate::Error;

/// How long a failed lookup of the master stands before the sentinels are
/// asked again: calls in between fail at once with its error.
const RETRY: Duration = Duration::from_millis(100);

/// The store's connection to the master the sentinels name; clones share it.
#[derive(Clone)]
pub(crate) struct Sentinel {
    shared: Arc<Shared>,
}

struct Shared {
    /// The master's name, for messages.
    name: String,
    /// The connection in use, if any.
    master: Mutex<Option<Master>>,
    /// Asks the sentinels; one lookup at a time.
    lookup: tokio::sync::Mutex<Lookup>,
}

/// A connection to the master, numbered so that a call repairs only the
/// connection it failed on, not one a concurrent call already replaced.
#[derive(Clone)]
struct Master {
    conn: MultiplexedConnection,
    generation: u64,
}

struct Lookup {
    client: SentinelClient,
    generation: u64,
    /// The last lookup's error, while it stands.
    failed: Option<(Instant, RedisError)>,
}

impl Sentinel {
    fn new(client: SentinelClient, name: String) -> Self {
        Self {
            shared: Arc::new(Shared {
                name,
                master: Mutex::new(None),
                lookup: tokio::sync::Mutex::new(Lookup {
                    client,
                    generation: 0,
                    failed: None,
                }),
            }),
        }
    }

    fn current(&self) -> Option<Master> {
        self.shared
            .master
            .lock()
            .expect("no panic holds it")
            .clone()
    }

    /// The master's connection: the current one, or a new one.
    async fn master(&self) -> RedisResult<Master> {
        match self.current() {
            Some(master) => Ok(master),
            None => self.replace(None).await,
        }
    }

    /// Asks the sentinels for the master and connects to it, dropping the
    /// connection numbered `broken` (if it is still the current one). A
    /// connection that another call made meanwhile is used as it is.
    async fn replace(&self, broken: Option<u64>) -> RedisResult<Master> {
        let mut lookup = self.shared.lookup.lock().await;
        {
            let mut master = self.shared.master.lock().expect("no panic holds it");
            match &*master {
                Some(m) if Some(m.generation) == broken => *master = None,
                Some(m) => return Ok(m.clone()),
                None => {}
            }
        }
        if let Some((at, e)) = &lookup.failed
            && at.elapsed() < RETRY
        {
            return Err(e.clone());
        }
        let found = async {
            let client = lookup.client.async_get_client().await?;
            let client = super::tcp::tuned_client(&client)?;
            // As the ConnectionManager's: the limiter's timeout bounds calls.
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(1)))
                .set_response_timeout(None);
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await
        }
        .await;
        match found {
            Ok(conn) => {
                lookup.generation += 1;
                lookup.failed = None;
                let master = Master {
                    conn,
                    generation: lookup.generation,
                };
                *self.shared.master.lock().expect("no panic holds it") = Some(master.clone());
                tracing::info!(master = %self.shared.name, "connected to the master the sentinels name");
                Ok(master)
            }
            Err(e) => {
                lookup.failed = Some((Instant::now(), e.clone()));
                Err(e)
            }
        }
    }

    /// Sends one request on the master, repairing the connection as the
    /// [module docs](self) say. A request sent again after its connection
    /// dropped may have run the first time too (the reply was lost): a
    /// decision's key is then charged twice, so a limit can only be reached
    /// early; a refund or a reset finds its marker and does nothing more
    /// (`lua/once.lua`).
    ///
    /// `read_only` tells whether a reply is the `READONLY` error reply:
    /// redis-rs hands error replies over as values, so a demoted master's
    /// answer comes as `Ok`, not as an error.
    async fn send<T, F>(
        &self,
        request: impl Fn(MultiplexedConnection) -> F,
        read_only: impl Fn(&T) -> bool,
    ) -> RedisResult<T>
    where
        F: Future<Output = RedisResult<T>>,
    {
        let master = self.master().await?;
        let result = request(master.conn).await;
        let lost = match &result {
            Ok(reply) => read_only(reply),
            Err(e) => needs_new_master(e),
        };
        if !lost {
            return result;
        }
        match &result {
            Ok(_) => {
                tracing::warn!(master = %self.shared.name, "master answered READONLY (demoted): asking the sentinels")
            }
            Err(e) => {
                tracing::warn!(master = %self.shared.name, error = %e, "master lost: asking the sentinels")
            }
        }
        // Still no master: keep the first answer.
        let Ok(master) = self.replace(Some(master.generation)).await else {
            return result;
        };
        request(master.conn).await
    }
}

/// Whether `e` means this connection's node is no longer the master to use:
/// the connection is gone, or the node is a read-only replica now.
fn needs_new_master(e: &RedisError) -> bool {
    pool::is_broken(e) || pool::is_read_only(e)
}

impl ConnectionLike for Sentinel {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.send(
            move |mut conn| async move { conn.req_packed_command(cmd).await },
            pool::replies_read_only,
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
            |replies: &Vec<Value>| replies.iter().any(pool::replies_read_only),
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
    /// master (see the `sentinel` module's docs in the source); a refund or
    /// a reset sent again runs once all the same. Until a replica is
    /// promoted, checks fail into the
    /// [`OnStoreError`](crate::OnStoreError) policy.
    ///
    /// The master is reached without a password or TLS; for those (or a
    /// database other than 0), build a [`SentinelClient`] with redis-rs's
    /// `SentinelClientBuilder` and pass it to
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
        let sentinels: Vec<T> = sentinels.into_iter().collect();
        // Without redis-rs's TLS the name must be a `String`; with it, any `AsRef<str>`.
        #[allow(clippy::unnecessary_to_owned)]
        let client = SentinelClient::build(
            sentinels,
            master_name.to_owned(),
            None,
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
