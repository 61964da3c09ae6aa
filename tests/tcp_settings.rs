//! The store's TCP settings on every connection the Redis store opens by
//! itself (`src/store/tcp.rs`).
//!
//! redis-rs 1 leaves Nagle's algorithm on, and the store keeps up to two
//! calls in flight on one connection: with Nagle on, the second call's bytes
//! wait for the first call's reply before they leave, a round trip more on a
//! network (`benches/ab.py --rtt` measures it). And a link that loses every
//! packet without a reset would hold a connection, every call on it timing
//! out, until the kernel gives up after about 15 minutes, unless
//! `TCP_USER_TIMEOUT` and keepalive close it within seconds. Neither shows
//! on loopback (a round trip of microseconds; no packet is ever lost, and
//! dropping packets takes privileges a test does not have), so these read
//! the socket options themselves off the test's own connections to Redis,
//! after the store has decided on them.

mod support;

use redis_ratelimit::{Limiter, RedisStore};
use support::{
    RedisServer, TEST_TIMEOUT,
    sockets::{assert_new_ones_tuned, connections_to},
};

/// A few checks on `store`, so its connections are open and in use.
async fn decides(store: &RedisStore, log: &str) {
    let limiter = Limiter::builder("5/1h".parse().unwrap())
        .store(store.clone())
        .timeout(TEST_TIMEOUT)
        .build()
        .unwrap();
    for i in 0..8 {
        let decision = limiter
            .check(&format!("tuned-{i}"), 1)
            .await
            .unwrap_or_else(|e| panic!("check: {e}\n{log}"));
        assert!(decision.is_allowed(), "{decision:?}\n{log}");
    }
}

/// Notes this process's connections to `ports`, builds a store with
/// `connect` (a future: nothing connects before that), decides on it, and
/// asserts that every connection it opened to `ports` has the store's TCP
/// settings.
/// Returns the store, whose connections live as long as it does.
async fn connects_tuned(
    ports: &[u16],
    log: impl Fn() -> String,
    connect: impl Future<Output = RedisStore>,
) -> RedisStore {
    let before = connections_to(ports);
    let store = connect.await;
    decides(&store, &log()).await;
    assert_new_ones_tuned(&before, ports, &log());
    store
}

#[tokio::test]
async fn connect_sets_the_tcp_settings() {
    let server = RedisServer::start();
    let connect = async {
        RedisStore::connect(server.url())
            .await
            .unwrap_or_else(|e| panic!("connect: {e}\n{}", server.log()))
    };
    connects_tuned(&[server.port()], || server.log(), connect).await;
}

#[tokio::test]
async fn connect_lazy_sets_the_tcp_settings() {
    let server = RedisServer::start();
    let connect = async { RedisStore::connect_lazy(server.url()).unwrap() };
    connects_tuned(&[server.port()], || server.log(), connect).await;
}

#[cfg(feature = "tls")]
#[tokio::test]
async fn connect_with_tls_sets_the_tcp_settings() {
    let pki = support::tls::Pki::new();
    let server = pki.server(&[]);
    let connect = async {
        RedisStore::connect_with_tls(server.url(), pki.certs(false))
            .await
            .unwrap_or_else(|e| panic!("connect_with_tls: {e}\n{}", server.log()))
    };
    connects_tuned(&[server.port()], || server.log(), connect).await;
}

#[cfg(feature = "cluster")]
#[tokio::test]
async fn cluster_sets_the_tcp_settings_on_every_node() {
    let cluster = support::cluster::RedisCluster::start();
    let ports: Vec<u16> = cluster
        .seed_urls()
        .iter()
        .map(|u| u.rsplit(':').next().unwrap().parse().unwrap())
        .collect();
    let _store = connects_tuned(&ports, || cluster.log(), cluster.store()).await;
    // Eight keys reach every master of three, so each has its connection.
    let reached: std::collections::BTreeSet<u16> = connections_to(&ports)
        .iter()
        .map(|c| c.peer.port())
        .collect();
    assert_eq!(reached.len(), ports.len(), "{reached:?}\n{}", cluster.log());
}

#[cfg(feature = "sentinel")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_sets_the_tcp_settings_on_the_masters_connection() {
    use support::sentinel::{MASTER, Sentinels};
    let deployment = Sentinels::start().await;
    let connect = async {
        RedisStore::sentinel(deployment.urls(), MASTER)
            .await
            .unwrap_or_else(|e| panic!("RedisStore::sentinel: {e}\n{}", deployment.log()))
    };
    connects_tuned(&[deployment.master.port()], || deployment.log(), connect).await;
}
