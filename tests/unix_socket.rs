//! Redis over its Unix socket (`unix:///path/to/redis.sock`), as a Redis on
//! the same host can be reached: the store connects through it (its startup
//! check included), decides, leaves every key with a TTL, and recovers by
//! itself once Redis restarts on the same socket; a bb8 pool too.

mod support;

use std::time::{Duration, Instant};

use redis_ratelimit::{Limiter, RedisStore};
use support::{RedisServer, TEST_TIMEOUT};

/// A server that listens on a Unix socket in `dir` too; the socket's URL.
fn with_socket(dir: &tempfile::TempDir) -> (RedisServer, String) {
    let socket = dir.path().join("redis.sock");
    let socket = socket.to_str().expect("utf-8 temp dir").to_owned();
    let server = RedisServer::start_with(&["--unixsocket", &socket, "--unixsocketperm", "700"]);
    (server, format!("unix://{socket}"))
}

fn limiter(store: RedisStore) -> Limiter {
    Limiter::builder("2/1m".parse().unwrap())
        .store(store)
        .timeout(TEST_TIMEOUT)
        .build()
        .unwrap()
}

/// How many clients Redis has on its Unix socket (asked over TCP).
async fn socket_clients(server: &RedisServer, url: &str) -> usize {
    let socket = url.trim_start_matches("unix://");
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut server.conn().await)
        .await
        .unwrap();
    let on_socket = format!("laddr={socket}:0");
    list.lines().filter(|l| l.contains(&on_socket)).count()
}

async fn decides_twice_then_denies(limiter: &Limiter, key: &str) {
    assert_eq!(limiter.check(key, 1).await.unwrap().remaining(), 1);
    assert_eq!(limiter.check(key, 1).await.unwrap().remaining(), 0);
    assert!(!limiter.check(key, 1).await.unwrap().is_allowed());
}

#[tokio::test]
async fn a_store_on_the_unix_socket_decides_and_recovers_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, url) = with_socket(&dir);
    let limiter = limiter(RedisStore::connect(url.as_str()).await.unwrap());
    decides_twice_then_denies(&limiter, "k").await;
    assert!(socket_clients(&server, &url).await >= 1, "{}", server.log());

    // Same socket, empty dataset: the same limiter decides again, by itself.
    server.restart();
    let start = Instant::now();
    while limiter.check("r", 1).await.is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(limiter.check("r", 1).await.unwrap().remaining(), 0);
    // A new key: "k"'s denial is still in the deny cache, as it should be.
    decides_twice_then_denies(&limiter, "k2").await;
    server.assert_every_key_has_ttl().await;
}

#[tokio::test]
async fn a_pool_on_the_unix_socket_decides() {
    let dir = tempfile::tempdir().unwrap();
    let (server, url) = with_socket(&dir);
    let store = support::pool_store(&url, 4, || server.log()).await;
    store.self_test().await.unwrap();
    let limiter = limiter(store);
    decides_twice_then_denies(&limiter, "k").await;
    assert!(socket_clients(&server, &url).await >= 1, "{}", server.log());
    server.assert_every_key_has_ttl().await;
}
