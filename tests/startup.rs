//! `RedisStore::connect` checks at startup that Redis can serve the limiter
//! (`RedisStore::self_test`): a server that cannot run the scripts, refuses
//! the password, or is not there fails `connect` with `Error::Startup`
//! naming the cause, rather than every later request.

mod support;

use redis_ratelimit::{Error, RedisStore};
use support::{RedisServer, logs::Captured};

/// `connect`'s error on `url`, which must be `Error::Startup`.
async fn startup_error(url: &str, server: Option<&RedisServer>) -> String {
    let log = server.map(RedisServer::log).unwrap_or_default();
    match RedisStore::connect(url).await {
        Ok(store) => panic!("connected: {store:?}\n{log}"),
        Err(Error::Startup(message)) => message,
        Err(e) => panic!("not a startup error: {e:?}\n{log}"),
    }
}

#[tokio::test]
async fn a_server_that_cannot_run_scripts_fails_connect_naming_scripting() {
    for command in ["EVALSHA", "SCRIPT"] {
        let server = RedisServer::start_with(&["--rename-command", command, ""]);
        let message = startup_error(&server.url(), Some(&server)).await;
        assert!(
            message.contains("cannot run the limiter's Lua scripts"),
            "{message}"
        );
        assert!(message.contains("unknown command"), "{message}");
        // And so does the check of a pool store, which users call themselves.
        let err = server.pool_store(2).await.self_test().await.unwrap_err();
        assert!(err.to_string().contains("Lua scripts"), "{err}");
    }
}

#[tokio::test]
async fn a_missing_or_wrong_password_fails_connect_naming_authentication() {
    let server = RedisServer::start_with(&["--requirepass", "secret"]);
    let port = server.port();
    for url in [server.url(), format!("redis://:wrong@127.0.0.1:{port}")] {
        let message = startup_error(&url, Some(&server)).await;
        assert!(
            message.contains("authentication failed"),
            "{url}: {message}"
        );
    }
    // With the password, it connects, and the check left no key behind.
    let store = RedisStore::connect(format!("redis://:secret@127.0.0.1:{port}"))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
    store.self_test().await.unwrap();
    let mut conn = redis::Client::open(format!("redis://:secret@127.0.0.1:{port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let size: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    assert_eq!(size, 0, "the startup check wrote keys");
}

#[tokio::test]
async fn nothing_listening_fails_connect_naming_the_refusal() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill();
    let message = startup_error(&url, None).await;
    assert!(message.contains("connection refused"), "{message}");
    // connect_lazy still starts while Redis is down.
    assert!(RedisStore::connect_lazy(url.as_str()).is_ok());
}

#[tokio::test]
async fn a_healthy_server_passes_and_keeps_no_key() {
    let server = RedisServer::start();
    let store = server.store().await;
    store.self_test().await.unwrap();
    server.pool_store(2).await.self_test().await.unwrap();
    assert_eq!(
        server.keys_with_ttl().await,
        [],
        "the startup check wrote keys"
    );
}

/// A Redis that may evict keys (a `maxmemory`, and a policy other than
/// `noeviction`: `volatile-lru` is some managed services' default, and
/// every key of the limiter has a TTL) is named in a warning at startup,
/// once; one that may not, or has no `maxmemory`, is not.
#[tokio::test]
async fn a_redis_that_may_evict_the_counters_is_named_at_startup() {
    for (args, warned) in [
        (
            ["--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru"],
            true,
        ),
        (
            ["--maxmemory", "100mb", "--maxmemory-policy", "noeviction"],
            false,
        ),
        (
            ["--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"],
            false,
        ),
    ] {
        let server = RedisServer::start_with(&args);
        let captured = Captured::default();
        let guard = captured.install();
        let store = RedisStore::connect(server.url()).await;
        drop(guard);
        store.unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
        let warnings = captured.warning_lines();
        if warned {
            assert_eq!(warnings.len(), 1, "{args:?}: {warnings:#?}");
            assert!(
                warnings[0].contains("maxmemory-policy is volatile-lru")
                    && warnings[0].contains("noeviction"),
                "{warnings:#?}"
            );
        } else {
            assert!(warnings.is_empty(), "{args:?}: {warnings:#?}");
        }
    }
}

/// A URL that names a read-only replica (a failover's old master, or the
/// wrong host) fails `connect` naming it: the decisions the check runs only
/// read, which a replica allows, and every later check would be refused.
/// The check writes nothing on a master (the keyspace stays empty).
#[tokio::test]
async fn a_read_only_replica_fails_connect_naming_it() {
    let master = RedisServer::start();
    let replica = master.start_replica().await;
    let message = startup_error(&replica.url(), Some(&replica)).await;
    assert!(message.contains("read-only replica"), "{message}");
    // Its master passes, and keeps no key.
    let store = RedisStore::connect(master.url())
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", master.log()));
    drop(store);
    let size: u64 = redis::cmd("DBSIZE")
        .query_async(&mut master.conn().await)
        .await
        .unwrap();
    assert_eq!(size, 0, "the startup check wrote keys");
}

/// A replica that lost its master and serves nothing (`replica-serve-stale-
/// data no`) answers `MASTERDOWN`, and `connect` names that. Its message
/// blamed scripting ("cannot run the limiter's Lua scripts").
#[tokio::test]
async fn a_replica_without_its_master_fails_connect_naming_it() {
    let mut master = RedisServer::start();
    let replica = master.start_replica().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("replica-serve-stale-data")
        .arg("no")
        .query_async(&mut replica.conn().await)
        .await
        .unwrap();
    master.kill();
    replica.wait_for_master_link("down").await;
    let message = startup_error(&replica.url(), Some(&replica)).await;
    assert!(message.contains("lost its master"), "{message}");
    assert!(!message.contains("Lua scripts"), "{message}");
}

/// A Redis loading its dataset (a restart with data on disk) answers
/// `LOADING` to nearly every command. `connect` waits for it within its
/// deadline, and connects once it has loaded. Before, the first `LOADING`
/// failed `connect`, blaming scripting.
#[tokio::test]
async fn a_redis_loading_its_dataset_is_waited_for() {
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    // About a second of loading.
    let _reload = server.reload_slowly(5_000, 100).await;
    let store = RedisStore::connect(server.url())
        .await
        .unwrap_or_else(|e| panic!("connect while loading: {e}\n{}", server.log()));
    let info: String = redis::cmd("INFO")
        .arg("persistence")
        .query_async(&mut server.conn().await)
        .await
        .unwrap();
    assert!(
        info.contains("loading:0"),
        "connected while loading: {info}"
    );
    drop(store);
}

/// A Redis still loading at the deadline fails `connect` naming it.
#[tokio::test]
async fn a_redis_loading_past_the_deadline_fails_connect_naming_it() {
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    // Ten seconds and more of loading, past the check's 5 s.
    let _reload = server.reload_slowly(20_000, 500).await;
    let message = startup_error(&server.url(), Some(&server)).await;
    assert!(message.contains("still loading its dataset"), "{message}");
    assert!(!message.contains("Lua scripts"), "{message}");
}

/// A user whose ACL denies the scripts' writes fails `connect` naming its
/// ACL: the scripts `DEL` a fresh counter to roll a denied spend back and
/// in a reset, and `PEXPIRE` every counter. Before, a refused `DEL` probe was
/// skipped, and the other checks only read, so a user without writes
/// (`-@write`, as a read-only key selector gives) connected and then
/// failed every check into the `OnStoreError` policy: under `Allow`, no
/// limit at all. The probes write nothing (the keyspace stays empty).
/// A user denied only a write a counter's spend makes (`INCRBY`, `SET`,
/// `HSET`, ...) connected too; the probe script now makes each of them on
/// a key it deletes in the same script.
#[tokio::test]
async fn a_user_denied_the_scripts_writes_fails_connect_naming_its_acl() {
    let denials = [
        ("@write", "DEL"),
        ("del", "DEL"),
        ("pexpire", "PEXPIRE"),
        ("incrby", "INCRBY"),
        ("decrby", "DECRBY"),
        ("set", "SET"),
        ("hset", "HSET"),
        ("zadd", "ZADD"),
        ("zrem", "ZREM"),
        ("zremrangebyscore", "ZREMRANGEBYSCORE"),
    ];
    for (denied, command) in denials {
        let server = RedisServer::start();
        let url = server.acl_user_without("limiter", "secret", denied).await;
        let message = startup_error(&url, Some(&server)).await;
        assert!(
            message.contains("may not make the writes the limiter's scripts make"),
            "-{denied}: {message}"
        );
        assert_acl_refused(&server, command).await;
        let size: u64 = redis::cmd("DBSIZE")
            .query_async(&mut server.conn().await)
            .await
            .unwrap();
        assert_eq!(size, 0, "-{denied}: the startup check wrote keys");
    }
}

/// A Redis out of memory (`maxmemory` reached under `noeviction`) still
/// connects: its checks follow the store-error policy until memory frees,
/// and startup does not hold that against it. The write probes that a full
/// Redis refuses (`OOM`) are not counted as a refusal of the user's.
#[tokio::test]
async fn a_redis_out_of_memory_still_connects() {
    let server = RedisServer::start();
    server.refuse_writes(true).await;
    let store = RedisStore::connect(server.url()).await;
    assert!(store.is_ok(), "{store:?}\n{}", server.log());
    server.refuse_writes(false).await;
}

/// Fails unless `server`'s ACL log holds a refusal of the command `what`.
async fn assert_acl_refused(server: &RedisServer, what: &str) {
    let entries: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("ACL")
        .arg("LOG")
        .query_async(&mut server.conn().await)
        .await
        .unwrap();
    let objects: Vec<String> = entries
        .iter()
        .filter_map(|entry| match entry.get("object") {
            Some(redis::Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            Some(redis::Value::SimpleString(s)) => Some(s.clone()),
            _ => None,
        })
        .collect();
    assert!(
        objects.iter().any(|o| o.eq_ignore_ascii_case(what)),
        "{what} was not denied: {objects:?}"
    );
}

/// Two checks of 3/1m on `store`, each after a `SCRIPT FLUSH` of `server`:
/// both decided, as if no script had been lost.
async fn decides_after_script_flushes(server: &RedisServer, store: RedisStore) {
    let limiter = redis_ratelimit::Limiter::builder("3/1m".parse().unwrap())
        .store(store)
        .build()
        .unwrap();
    for remaining in [2, 1] {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut server.conn().await)
            .await
            .unwrap();
        let d = limiter
            .check("k", 1)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
        assert_eq!((d.is_allowed(), d.remaining()), (true, remaining));
    }
}

/// After `NOSCRIPT` a call goes again as `EVAL`; a user whose ACL allows
/// `EVALSHA` and `SCRIPT LOAD` but not `EVAL` gets the script loaded and
/// the call sent again as before, and decides on.
#[tokio::test]
async fn a_user_denied_eval_still_recovers_from_noscript() {
    let server = RedisServer::start();
    let url = server.acl_user_without("limiter", "secret", "eval").await;
    let store = RedisStore::connect(url)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
    decides_after_script_flushes(&server, store).await;
    // EVAL was tried and refused, not run.
    assert_acl_refused(&server, "EVAL").await;
}

/// A Redis whose `EVAL` is renamed away (a hardening step) answers the
/// `EVAL` after `NOSCRIPT` "unknown command": the script is loaded and the
/// call sent again as before, and decides on. Without the fallback every
/// call failed after a restart or a flush until the process restarted.
#[tokio::test]
async fn a_redis_with_eval_renamed_still_recovers_from_noscript() {
    let server = RedisServer::start_with(&["--rename-command", "EVAL", "EVAL_hidden"]);
    let store = server.store().await;
    decides_after_script_flushes(&server, store).await;
}
