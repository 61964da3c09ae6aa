//! A master demoted to a replica behind the address the store connects to:
//! a failover behind a DNS name or a virtual IP, as managed Redis services
//! do it, while the store's connections stay open to the old node. That
//! node answers every write `READONLY` (or, with `replica-serve-stale-data
//! no` and no link to its own master, every command `MASTERDOWN`); the
//! store must leave it for the node the address names now, by itself and
//! within a bound, and count on from the counters the new master has
//! (replicated), never from zero.
//!
//! `support::switch::SwitchProxy` is the address: connections made after the
//! switch reach the new master, those made before stay with the old one.

mod support;

use std::time::{Duration, Instant};

use redis::{ErrorKind, ServerErrorKind};
use redis_ratelimit::{Error, Limiter, RedisStore};
use support::{RedisServer, limits, switch::SwitchProxy};

/// How long the store may take to reach the new master.
const RECOVERY: Duration = Duration::from_secs(5);

/// `REPLICAOF` on `server`: of `127.0.0.1:<port>`, or `NO ONE`.
async fn replica_of(server: &RedisServer, port: Option<u16>) {
    let mut cmd = redis::cmd("REPLICAOF");
    match port {
        Some(port) => cmd.arg("127.0.0.1").arg(port),
        None => cmd.arg("NO").arg("ONE"),
    };
    let _: () = cmd
        .query_async(&mut server.conn().await)
        .await
        .unwrap_or_else(|e| panic!("REPLICAOF: {e}\n{}", server.log()));
}

/// How the old master answers once demoted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Demoted {
    /// A replica of the new master: `READONLY` to a write.
    ReadOnly,
    /// A replica of an address where no server listens, with
    /// `replica-serve-stale-data no`: `MASTERDOWN` to every command.
    MasterDown,
}

fn limiter(store: RedisStore) -> Limiter {
    limits::every_check("100/1h".parse().unwrap(), store)
        .build()
        .unwrap()
}

/// Spends 3 of "k" on the old master, fails over to its replica (the
/// address moved with it), and expects checks to fail only with `READONLY`
/// (or `LOADING`, while the old master loads the new one's data as its
/// replica: it answers `READONLY` after that) until the store reaches the
/// new master, within [`RECOVERY`], then to count on from the 3
/// replicated: 96 left after the 4th.
async fn leaves_the_demoted_master(connect: impl AsyncFnOnce(String) -> RedisStore) {
    leaves_the_demoted_master_as(None, Demoted::ReadOnly, connect).await;
}

/// [`leaves_the_demoted_master`], connected as `user` (name, password) if
/// given: a user of both nodes whose ACL allows every command but `QUIT`;
/// the old master answering as `demoted` says.
async fn leaves_the_demoted_master_as(
    user: Option<(&str, &str)>,
    demoted: Demoted,
    connect: impl AsyncFnOnce(String) -> RedisStore,
) {
    let old = RedisServer::start();
    let new = old.start_replica().await;
    let address = SwitchProxy::start(old.port()).await;
    let log = || format!("old master:\n{}\nnew master:\n{}", old.log(), new.log());
    let url = match user {
        None => address.url(),
        Some((name, password)) => {
            for server in [&old, &new] {
                server.acl_user_without(name, password, "quit").await;
            }
            address
                .url()
                .replacen("redis://", &format!("redis://{name}:{password}@"), 1)
        }
    };
    let limiter = limiter(connect(url).await);
    for _ in 0..3 {
        let d = limiter.check("k", 1).await.unwrap();
        assert!(d.is_allowed(), "{d:?}\n{}", log());
    }
    if let Some((name, _)) = user {
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut old.conn().await)
            .await
            .unwrap();
        assert!(
            clients.contains(&format!(" user={name} ")),
            "no connection as {name}:\n{clients}"
        );
    }
    old.sync_replicas().await;

    // Where the MASTERDOWN case's old master is pointed: a socket that
    // accepts and never answers, held for the whole test (a port merely
    // free could be taken by another test's server, which would answer).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    replica_of(&new, None).await;
    match demoted {
        Demoted::ReadOnly => replica_of(&old, Some(new.port())).await,
        Demoted::MasterDown => {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("replica-serve-stale-data")
                .arg("no")
                .query_async(&mut old.conn().await)
                .await
                .unwrap();
            replica_of(&old, Some(silent.local_addr().unwrap().port())).await;
        }
    }
    address.switch_to(new.port());

    let failed_over = Instant::now();
    let mut refused = 0;
    let decision = loop {
        match limiter.check("k", 1).await {
            Ok(d) => break d,
            Err(Error::Redis(e))
                if match demoted {
                    Demoted::ReadOnly => matches!(
                        e.kind(),
                        ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::BusyLoading)
                    ),
                    Demoted::MasterDown => {
                        e.kind() == ErrorKind::Server(ServerErrorKind::MasterDown)
                    }
                } =>
            {
                refused += 1;
            }
            Err(e) => panic!("after {refused} refused: {e}\n{}", log()),
        }
        assert!(
            failed_over.elapsed() < RECOVERY,
            "still on the demoted master after {RECOVERY:?} ({refused} checks refused)\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The README's promise: the check that finds the node demoted is
    // refused, and the store has left it by the next.
    assert!(
        refused <= 1,
        "{refused} checks refused before the store left the demoted master\n{}",
        log()
    );
    assert!(
        decision.is_allowed() && decision.remaining() == 96,
        "the new master's count, 3 replicated then this one: {decision:?}\n{}",
        log()
    );
    // Every check from now on goes to the new master.
    for remaining in (90..96).rev() {
        let d = limiter
            .check("k", 1)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", log()));
        assert_eq!(d.remaining(), remaining, "{d:?}\n{}", log());
    }
    new.assert_every_key_has_ttl().await;
}

#[tokio::test]
async fn the_connection_manager_leaves_a_demoted_master() {
    leaves_the_demoted_master(async |url| RedisStore::connect(url).await.unwrap()).await;
}

#[tokio::test]
async fn a_lazy_connection_manager_leaves_a_demoted_master() {
    leaves_the_demoted_master(async |url| RedisStore::connect_lazy(url).unwrap()).await;
}

#[tokio::test]
async fn the_pool_leaves_a_demoted_master() {
    leaves_the_demoted_master(async |url| support::pool_store(&url, 4, String::new).await).await;
}

/// A user whose ACL denies `QUIT` still leaves: Redis answers `QUIT` before
/// it checks a command's permissions (7.0), so the store's way off a
/// demoted node cannot be taken from it by an ACL.
#[tokio::test]
async fn a_user_denied_quit_still_leaves_a_demoted_master() {
    leaves_the_demoted_master_as(
        Some(("limiter", "secret")),
        Demoted::ReadOnly,
        async |url| RedisStore::connect(url).await.unwrap(),
    )
    .await;
}

/// A demoted master that has lost its link to the new one, and serves no
/// stale data, answers every call `MASTERDOWN` (before it runs it), never
/// `READONLY`: it is left all the same.
#[tokio::test]
async fn the_connection_manager_leaves_a_demoted_master_answering_masterdown() {
    leaves_the_demoted_master_as(None, Demoted::MasterDown, async |url| {
        RedisStore::connect(url).await.unwrap()
    })
    .await;
}

#[tokio::test]
async fn the_pool_leaves_a_demoted_master_answering_masterdown() {
    leaves_the_demoted_master_as(None, Demoted::MasterDown, async |url| {
        support::pool_store(&url, 4, String::new).await
    })
    .await;
}

/// The Sentinel store, whose sentinel names an address that moves with the
/// master (a proxy or a virtual IP in front of the nodes, or a node demoted
/// by hand with `REPLICAOF` while its clients stay connected): a `READONLY`
/// reply makes it ask the sentinels again and connect anew, as a dropped
/// connection does. redis-rs hands that reply over as a value, not as an
/// error, so a store that looked only at errors stayed on the demoted node
/// for as long as it kept the connection open.
#[cfg(feature = "sentinel")]
#[tokio::test]
async fn the_sentinel_store_leaves_a_demoted_master() {
    sentinel_store_leaves(Demoted::ReadOnly).await;
}

#[cfg(feature = "sentinel")]
#[tokio::test]
async fn the_sentinel_store_leaves_a_demoted_master_answering_masterdown() {
    sentinel_store_leaves(Demoted::MasterDown).await;
}

#[cfg(feature = "sentinel")]
async fn sentinel_store_leaves(demoted: Demoted) {
    use support::sentinel::MASTER;
    let mut sentinel = None;
    leaves_the_demoted_master_as(None, demoted, async |url| {
        let port = url.rsplit(':').next().unwrap();
        let s =
            RedisServer::start_sentinel(&format!("sentinel monitor {MASTER} 127.0.0.1 {port} 1\n"));
        let store = RedisStore::sentinel([s.url()], MASTER).await.unwrap();
        sentinel = Some(s);
        store
    })
    .await;
    drop(sentinel);
}
