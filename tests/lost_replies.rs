//! A reply lost on its way back, after Redis ran the call: the pool, the
//! sentinel store and redis-rs's cluster connection replace a connection
//! that dropped and send the call again on the new one. A decision is then
//! charged twice (a limit is reached early, never passed). A refund takes
//! effect once: run twice, it would give its cost back twice and lift the
//! limit, so its first run leaves a marker that the second finds
//! (`lua/once.lua`). So does a reset: run twice, it would forget what
//! another replica charged between its runs.

mod support;

use redis_ratelimit::{Limiter, RedisStore};
use support::{RedisServer, TEST_TIMEOUT, lease::eventually, limits::admitted, lossy::LossyProxy};

/// On `store`, whose connections go through `proxy`: a decision, a refund
/// and a reset, each losing its reply and sent again. `direct` is another
/// replica's store on the same Redis (on a cluster, through the same
/// proxies: a proxy loses one reply at a time).
async fn lost_replies_are_sent_again_and_take_effect_once(
    store: RedisStore,
    direct: RedisStore,
    proxy: &LossyProxy,
    log: impl Fn() -> String,
) {
    let limiter = |store| {
        Limiter::builder("4/1h".parse().unwrap())
            .store(store)
            .timeout(TEST_TIMEOUT)
            .build()
            .unwrap()
    };
    let l = limiter(store);
    let other = limiter(direct);

    // Sent again on a new connection: charged twice.
    proxy.lose_next_reply();
    let d = l
        .check("k", 1)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", log()));
    assert_eq!(proxy.lost(), 1, "no reply was lost\n{}", log());
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 2, "charged once only?");

    // Redis gave the unit back at the first run; the second finds its
    // marker. Credited twice, the key would admit 4 more where 3 are left.
    proxy.lose_next_reply();
    l.refund("k", &d)
        .await
        .unwrap_or_else(|e| panic!("a refund sent again: {e}\n{}", log()));
    assert_eq!(proxy.lost(), 2, "no reply was lost\n{}", log());
    assert_eq!(
        l.peek("k", 1).await.unwrap().remaining(),
        3,
        "refunded twice"
    );
    assert_eq!(admitted(&l, "k", 4).await, 3);

    // The reset's first run deletes the counter; another replica then
    // charges a unit, before the reset's reply (held, then lost) makes this
    // one send it again. The second run finds the first's marker and
    // deletes nothing: run again, it would forget that unit.
    proxy.lose_and_hold_next_reply();
    let reset = tokio::spawn({
        let l = l.clone();
        async move { l.reset("k").await }
    });
    let ran = || async { proxy.lost() >= 3 };
    eventually("the reset's first run", TEST_TIMEOUT, &log(), ran).await;
    let between = other.check("k", 1).await.unwrap();
    assert_eq!(
        between.remaining(),
        3,
        "the reset's first run did not delete"
    );
    proxy.let_go();
    reset
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("a reset sent again: {e}\n{}", log()));
    assert_eq!(
        l.peek("k", 1).await.unwrap().remaining(),
        3,
        "the reset's second run forgot the unit charged between its runs"
    );
}

#[tokio::test]
async fn a_pool_sends_a_lost_refund_again_and_credits_it_once() {
    let server = RedisServer::start();
    let proxy = LossyProxy::start(server.port()).await;
    let store = support::pool_store(&proxy.url(), 2, || server.log()).await;
    store.self_test().await.unwrap();
    let direct = server.store().await;
    lost_replies_are_sent_again_and_take_effect_once(store, direct, &proxy, || server.log()).await;
}

/// One sentinel, monitoring the master at the proxy's address: the store
/// reaches the master through the proxy.
#[cfg(feature = "sentinel")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_store_sends_a_lost_refund_again_and_credits_it_once() {
    use support::sentinel::MASTER;
    let master = RedisServer::start();
    let proxy = LossyProxy::start(master.port()).await;
    let port = proxy.port();
    let sentinel =
        RedisServer::start_sentinel(&format!("sentinel monitor {MASTER} 127.0.0.1 {port} 1\n"));
    let log = || {
        format!(
            "--- master\n{}\n--- sentinel\n{}",
            master.log(),
            sentinel.log()
        )
    };
    let store = RedisStore::sentinel([sentinel.url()], MASTER)
        .await
        .unwrap_or_else(|e| panic!("RedisStore::sentinel: {e}\n{}", log()));
    let direct = master.store().await;
    lost_replies_are_sent_again_and_take_effect_once(store, direct, &proxy, log).await;
}

/// Three masters, each announcing its own proxy's port
/// (`cluster-announce-port`), so that redis-rs's cluster connection reaches
/// every node through a proxy, and the key's master's loses the replies:
/// the cluster connection sends a call again on a new connection too.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_store_sends_a_lost_refund_again_and_credits_it_once() {
    use support::cluster::RedisCluster;
    let cluster = RedisCluster::start();
    // Read before the ports change: the map then names the proxies.
    let owner = cluster.master_of("k");
    let mut proxies = Vec::new();
    for port in cluster.masters() {
        let proxy = LossyProxy::start(port).await;
        cluster.announce(port, proxy.port());
        proxies.push((port, proxy));
    }
    let urls: Vec<String> = proxies.iter().map(|(_, p)| p.url()).collect();
    let connect = || async {
        RedisStore::cluster(urls.clone())
            .await
            .unwrap_or_else(|e| panic!("RedisStore::cluster: {e}\n{}", cluster.log()))
    };
    let (store, direct) = (connect().await, connect().await);
    let proxy = &proxies.iter().find(|(port, _)| *port == owner).unwrap().1;
    lost_replies_are_sent_again_and_take_effect_once(store, direct, proxy, || cluster.log()).await;
}
