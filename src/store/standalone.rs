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
//! A child module of `redis.rs`, so that it reaches the store's backends.

use std::sync::Arc;

use super::super::pool;
use crate::core::Throttle;
use redis::{
    Cmd, Pipeline, RedisFuture, RedisResult, Value,
    aio::{ConnectionLike, ConnectionManager},
};

/// A `ConnectionManager` that leaves a node demoted to a replica; clones
/// share it.
#[derive(Clone)]
pub(crate) struct Standalone {
    manager: ConnectionManager,
    /// One `QUIT` a second, and its warning.
    leaving: Arc<Throttle>,
}

impl Standalone {
    pub(super) fn new(manager: ConnectionManager) -> Self {
        Self {
            manager,
            leaving: Arc::default(),
        }
    }

    /// After a call's `result`: leaves the node if it answered as a replica.
    async fn after<T>(&mut self, result: RedisResult<T>, read_only: bool) -> RedisResult<T> {
        if read_only && let Some(unlogged) = self.leaving.admit() {
            tracing::warn!(
                unlogged,
                "Redis answered READONLY or MASTERDOWN: its node is a replica now; reconnecting"
            );
            // Their replies do not matter. Redis answers QUIT, then closes
            // the connection; the manager reconnects once a command fails on
            // the closed connection, which the PING does, so that the next
            // call goes to the new node rather than failing there.
            let _: RedisResult<Value> = self.manager.req_packed_command(&redis::cmd("QUIT")).await;
            let _: RedisResult<Value> = self.manager.req_packed_command(&redis::cmd("PING")).await;
        }
        result
    }
}

impl ConnectionLike for Standalone {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let result = self.manager.req_packed_command(cmd).await;
            let read_only = match &result {
                Ok(value) => pool::replies_as_replica(value),
                Err(e) => pool::is_replicas(e),
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
            let result = self.manager.req_packed_commands(cmd, offset, count).await;
            let read_only = match &result {
                Ok(values) => values.iter().any(pool::replies_as_replica),
                Err(e) => pool::is_replicas(e),
            };
            self.after(result, read_only).await
        })
    }

    fn get_db(&self) -> i64 {
        self.manager.get_db()
    }
}
