//! Concurrent decisions on one `ConnectionManager` share script calls, and
//! each is still decided on its own, exactly.

mod support;

use futures_util::future::join_all;
use support::RedisServer;

#[tokio::test]
async fn concurrent_decisions_share_script_calls_and_stay_exact() {
    let server = RedisServer::start();
    let limiter = server.limiter("30/1m").await;
    // Warm up: the script is loaded and the connection is up.
    assert!(limiter.check("warm", 1).await.unwrap().is_allowed());
    let before = server.script_calls().await;

    let keys = ["a", "b", "c", "d"];
    let checks = (0..400).map(|i| limiter.check(keys[i % 4], 1));
    let decisions = join_all(checks).await;
    let calls = server.script_calls().await - before;

    for (k, key) in keys.iter().enumerate() {
        let mine = decisions.iter().skip(k).step_by(4);
        let allowed = mine.filter(|d| d.as_ref().unwrap().is_allowed()).count();
        assert_eq!(allowed, 30, "{key}: each request is decided on its own");
    }
    // Denials of a key over its limit come from the deny cache once known,
    // and the rest share calls: far fewer calls than decisions.
    assert!(calls >= 1, "no script call at all?");
    assert!(
        calls < 100,
        "{calls} script calls for 400 concurrent decisions"
    );
    server.assert_every_key_has_ttl().await;
}
