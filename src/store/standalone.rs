//! The default backend's connection: redis-rs's `ConnectionManager`, made
//! to leave a master that has become a replica.
//!
//! The manager reconnects when its connection drops, but a node demoted to
//! a replica while the connection stays open (a failover behind a DNS name
//! or a virtual IP, as managed Redis services do it; a manual `REPLICAOF`)
//! answers every write `READONLY` (`MASTERDOWN`, with
//! `replica-serve-stale-data no`, while it has no link to its new master)
//! for as long as the connection lasts, and every check would fail with it.
//! So a call answered either way asks Redis
//! to close the connection (`QUIT`, which any client may send, on the same
//! manager, then a `PING` that fails on the closed connection), and the
//! manager reconnects, to whatever node the address names by then. The
//! call itself fails (a script's first write is refused on a replica, so it
//! wrote nothing) and the limiter applies its
//! [`OnStoreError`](crate::OnStoreError) policy; the calls after the
//! reconnection go to the new node. Calls already in flight on the old
//! connection answer `READONLY` too: at most one `QUIT` a second is sent
//! (the crate's log [`Throttle`]), so that they do not close the new
//! connection as well, and a node still read-only after the reconnection
//! (the address not yet moved) is left again a second later.
//!
//! The manager also never tries again after a connection whose setup Redis
//! refused (a password refused: `WRONGPASS`; a database it would not
//! `SELECT`; over RESP3, the login's `HELLO` refused): it keeps that
//! failed connection, and every later call fails
//! with its error at once, for the life of the process, even once Redis
//! takes the password again (a restart whose users or `requirepass` are set
//! a little later; a failover to a node not yet given them). So a store
//! that made its manager itself ([`RedisStore::connect`] and the like)
//! keeps the client, and a call failing with such an error makes a new
//! manager, at most once a second; the call itself fails, as a store error.
//! A manager given to [`RedisStore::new`] cannot be made again: its docs
//! say so.
//!
//! A child module of `redis.rs`, so that it reaches the store's backends.
//!
//! [`RedisStore::connect`]: super::RedisStore::connect
//! [`RedisStore::new`]: super::RedisStore::new

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicU64, Ordering},
};

use super::super::pool;
use crate::core::Throttle;
use redis::{
    Client, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value,
    aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig},
};

/// A `ConnectionManager` that leaves a node demoted to a replica, and
/// replaces itself after a refused setup; clones share it.
#[derive(Clone)]
pub(crate) struct Standalone {
    /// This clone's copy of the manager in use, and its number.
    manager: ConnectionManager,
    seen: u64,
    shared: Arc<Shared>,
}

struct Shared {
    /// One `QUIT` a second, and its warning.
    leaving: Throttle,
    /// What a new manager is made from, if the store made its own.
    remake: Option<(Client, ConnectionManagerConfig)>,
    /// One new manager a second, and its warning.
    remaking: Throttle,
    /// The number of the manager in use (0: the first), and that manager.
    number: AtomicU64,
    current: Mutex<ConnectionManager>,
}

impl Standalone {
    pub(super) fn new(manager: ConnectionManager) -> Self {
        Self::with_remake(manager, None)
    }

    /// A manager the store made from `client` with `config`: made again
    /// after a refused setup.
    pub(super) fn remade_from(
        manager: ConnectionManager,
        client: Client,
        config: ConnectionManagerConfig,
    ) -> Self {
        Self::with_remake(manager, Some((client, config)))
    }

    fn with_remake(
        manager: ConnectionManager,
        remake: Option<(Client, ConnectionManagerConfig)>,
    ) -> Self {
        Self {
            manager: manager.clone(),
            seen: 0,
            shared: Arc::new(Shared {
                leaving: Throttle::new(),
                remake,
                remaking: Throttle::new(),
                number: AtomicU64::new(0),
                current: Mutex::new(manager),
            }),
        }
    }

    /// This clone's manager, made current if another clone replaced it.
    fn manager(&mut self) -> &mut ConnectionManager {
        let number = self.shared.number.load(Ordering::Acquire);
        if number != self.seen {
            let current = self
                .shared
                .current
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.manager = current.clone();
            self.seen = number;
        }
        &mut self.manager
    }

    /// After a call on manager number `on` that failed with `e`: a new
    /// manager, if `e` is a refused setup, the store can make one, and no
    /// clone has made one since the call began (a late failure of an old
    /// manager must not replace a new one that may be connected).
    fn after_error(&mut self, e: &RedisError, on: u64) {
        let Some((client, config)) = &self.shared.remake else {
            return;
        };
        if !refused_setup(e) || self.shared.number.load(Ordering::Acquire) != on {
            return;
        }
        let Some(unlogged) = self.shared.remaking.admit() else {
            return;
        };
        tracing::warn!(
            unlogged,
            error = %e,
            "Redis refused the connection's setup; connecting again"
        );
        match ConnectionManager::new_lazy_with_config(client.clone(), config.clone()) {
            Ok(manager) => {
                let mut current = self
                    .shared
                    .current
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                *current = manager.clone();
                self.seen = self.shared.number.fetch_add(1, Ordering::AcqRel) + 1;
                self.manager = manager;
            }
            Err(e) => tracing::warn!(error = %e, "cannot make a new Redis connection manager"),
        }
    }

    /// After a call's `result`: leaves the node if it answered as a replica.
    async fn after<T>(&mut self, result: RedisResult<T>, read_only: bool) -> RedisResult<T> {
        if read_only && let Some(unlogged) = self.shared.leaving.admit() {
            tracing::warn!(
                unlogged,
                "Redis answered READONLY or MASTERDOWN: its node is a replica now; reconnecting"
            );
            // Their replies do not matter. Redis answers QUIT, then closes
            // the connection; the manager reconnects once a command fails on
            // the closed connection, which the PING does, so that the next
            // call goes to the new node rather than failing there.
            let manager = self.manager();
            let _: RedisResult<Value> = manager.req_packed_command(&redis::cmd("QUIT")).await;
            let _: RedisResult<Value> = manager.req_packed_command(&redis::cmd("PING")).await;
        }
        result
    }
}

impl ConnectionLike for Standalone {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let result = self.manager().req_packed_command(cmd).await;
            let on = self.seen;
            let read_only = match &result {
                Ok(value) => pool::replies_as_replica(value),
                Err(e) => {
                    self.after_error(e, on);
                    pool::is_replicas(e)
                }
            };
            self.after(result, read_only).await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let result = self.manager().req_packed_commands(cmd, offset, count).await;
            let on = self.seen;
            let read_only = match &result {
                Ok(values) => values.iter().any(pool::replies_as_replica),
                Err(e) => {
                    self.after_error(e, on);
                    pool::is_replicas(e)
                }
            };
            self.after(result, read_only).await
        })
    }

    fn get_db(&self) -> i64 {
        self.manager.get_db()
    }
}

/// Whether `e` is a connection's setup that Redis refused, which the
/// manager never tries again: a login refused, a database it would not
/// select, or, over RESP3, whose `HELLO` carries the login, the `HELLO`'s
/// own refusal (`WRONGPASS`, `NOAUTH`), which redis-rs passes on as Redis's
/// error. Not an error reply to a command: those come as values.
fn refused_setup(e: &RedisError) -> bool {
    match e.kind() {
        ErrorKind::AuthenticationFailed => true,
        ErrorKind::Server(ServerErrorKind::ResponseError) => {
            e.to_string().contains("refused to switch database")
        }
        ErrorKind::Extension => matches!(e.code(), Some("WRONGPASS" | "NOAUTH")),
        _ => false,
    }
}
