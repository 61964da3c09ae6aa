//! Script calls on a bb8 pool, repairing a connection that broke.
//!
//! bb8 drops a connection only when its manager's `has_broken` says so or
//! when the checkout `PING` fails; bb8-redis's and redis-rs's managers always
//! answer "not broken", and [`RedisStore::from_pool`](super::RedisStore::from_pool)
//! recommends a pool without the checkout `PING`. So after a Redis restart
//! every pooled connection would stay dead for good. Instead, a call whose
//! connection was dropped or refused replaces that connection in place
//! (bb8 0.9 gives no way to take a connection out of the pool, but a
//! checked-out one can be overwritten) with a fresh one from the pool's
//! manager, and the call is sent once more on it. Redis may have run it
//! before the connection dropped: a decision is then charged twice (a limit
//! reached early, never passed), and a refund or a reset runs once however
//! often it is sent (`lua/once.lua`). So does a call answered `READONLY`
//! (or `MASTERDOWN`): its node was demoted to a replica while the connection stayed open (a
//! failover behind a DNS name or a virtual IP), and a fresh connection
//! reaches whatever node the address names now; the call wrote nothing (a
//! script's first write is refused on a replica). Other error replies from
//! Redis (script errors, `OOM`, `WRONGTYPE`, ...) and timeouts keep the
//! connection.

use bb8::{ManageConnection, Pool};
use redis::{ErrorKind, FromRedisValue, RedisError, ServerErrorKind, Value, aio::ConnectionLike};

use super::call::Call;
use crate::Error;

/// Runs `call` on a connection of `pool`; see the [module docs](self).
///
/// A call repeated after its connection dropped may have run the first time
/// too (the reply was lost, not the request): a decision's key is then
/// charged twice, so a limit can only be reached early, never exceeded. A
/// call that gives units back (a refund, a reset) takes effect once
/// however often it runs (`lua/once.lua`).
pub(super) async fn run<M, T>(pool: &Pool<M>, call: &Call) -> Result<T, Error>
where
    M: ManageConnection<Error = RedisError>,
    M::Connection: ConnectionLike + Send,
    T: FromRedisValue,
{
    let mut conn = pool.get().await.map_err(|e| match e {
        // Keep redis-rs's error, which says why (refused, authentication...).
        bb8::RunError::User(e) => Error::Redis(e),
        e => Error::Pool(e.to_string()),
    })?;
    match call.invoke(&mut *conn).await {
        Err(Error::Redis(e)) if is_broken(&e) || is_replicas(&e) => {
            // Still down: keep the first error; the next checkout tries again.
            let Ok(fresh) = pool.dedicated_connection().await else {
                return Err(Error::Redis(e));
            };
            *conn = fresh;
            call.invoke(&mut *conn).await
        }
        result => result,
    }
}

/// Whether `e` means the connection itself is gone (closed, reset, refused;
/// for a cluster connection, no connection to the slot's node), as opposed
/// to an error reply, a reply of the wrong shape, or a slow answer.
pub(super) fn is_broken(e: &RedisError) -> bool {
    e.is_connection_dropped() || e.kind() == ErrorKind::ClusterConnectionNotFound
}

/// Whether `e` is an answer only a replica gives: `READONLY` to a write,
/// or `MASTERDOWN` (a replica whose link to its master is down, with
/// `replica-serve-stale-data no`, answers most commands so, before it runs
/// them). Either way the node was demoted, and the call ran nothing.
pub(super) fn is_replicas(e: &RedisError) -> bool {
    matches!(e.kind(), ErrorKind::Server(kind) if only_a_replicas(kind))
}

/// `READONLY` or `MASTERDOWN`: see [`is_replicas`].
fn only_a_replicas(kind: ServerErrorKind) -> bool {
    matches!(
        kind,
        ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown
    )
}

/// Whether `value` is an error reply only a replica gives (see
/// [`is_replicas`]). redis-rs's connections hand an error reply over as a
/// value, on the `Ok` side; only the caller that reads it (`query_async`)
/// turns it into an error, so a wrapper around a connection sees a demoted
/// node here, not in [`is_replicas`].
pub(super) fn replies_as_replica(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if e.kind().is_some_and(only_a_replicas))
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    #[test]
    fn only_a_gone_connection_is_broken() {
        let io = |kind| RedisError::from(io::Error::from(kind));
        assert!(is_broken(&io(io::ErrorKind::BrokenPipe)));
        assert!(is_broken(&io(io::ErrorKind::ConnectionReset)));
        assert!(is_broken(&io(io::ErrorKind::ConnectionRefused)));
        assert!(!is_broken(&io(io::ErrorKind::TimedOut)));
        let reply = RedisError::from((ErrorKind::Extension, "OOM", "no memory".to_owned()));
        assert!(!is_broken(&reply));
        let parse = RedisError::from((ErrorKind::Parse, "bad reply"));
        assert!(!is_broken(&parse));
    }
}
