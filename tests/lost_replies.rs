//! A reply lost on its way back, after Redis ran the call: the pool and the
//! sentinel store replace a connection that dropped and send the call again
//! on the new one. A decision is then charged twice (a limit is reached
//! early, never passed). A refund takes effect once: run twice, it would
//! give its cost back twice and lift the limit, so its first run leaves a
//! marker that the second finds (`lua/once.lua`). A reset whose reply is
//! lost is sent again without an error (that its second run deletes
//! nothing spent in between is tested on the script, in `admin.rs`).

mod support;

use redis_ratelimit::{Limiter, RedisStore};
use support::{RedisServer, TEST_TIMEOUT, limits::admitted, lossy::LossyProxy};

/// On `store`, whose connections go through `proxy`: a decision, a refund
/// and a reset, each losing its reply and sent again.
async fn lost_replies_are_sent_again_and_take_effect_once(
    store: RedisStore,
    proxy: &LossyProxy,
    log: impl Fn() -> String,
) {
    let l = Limiter::builder("4/1h".parse().unwrap())
        .store(store)
        .timeout(TEST_TIMEOUT)
        .build()
        .unwrap();

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

    proxy.lose_next_reply();
    l.reset("k")
        .await
        .unwrap_or_else(|e| panic!("a reset sent again: {e}\n{}", log()));
    assert_eq!(proxy.lost(), 3, "no reply was lost\n{}", log());
    assert_eq!(l.peek("k", 1).await.unwrap().remaining(), 4);
}

#[tokio::test]
async fn a_pool_sends_a_lost_refund_again_and_credits_it_once() {
    let server = RedisServer::start();
    let proxy = LossyProxy::start(server.port()).await;
    let store = support::pool_store(&proxy.url(), 2, || server.log()).await;
    store.self_test().await.unwrap();
    lost_replies_are_sent_again_and_take_effect_once(store, &proxy, || server.log()).await;
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
    lost_replies_are_sent_again_and_take_effect_once(store, &proxy, log).await;
}
