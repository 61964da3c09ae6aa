//! TLS (feature `tls`) against a real `redis-server` speaking TLS only, with
//! a CA and certificates made in the test: a `rediss://` store decides with
//! the right CA or `#insecure`, and fails at startup naming TLS with the
//! wrong CA or without the client certificate the server asks for.

mod support;

use redis::TlsCertificates;
use redis_ratelimit::{Error, Limiter, RedisStore};
use support::{RedisServer, TEST_TIMEOUT, tls::Pki};

/// Three checks of `2/1h` on one key: two admitted, then a denial, from
/// Redis (so the store really talks to the server).
async fn decides(store: RedisStore, server: &RedisServer) {
    let limiter = Limiter::builder("2/1h".parse().unwrap())
        .store(store)
        .timeout(TEST_TIMEOUT)
        .build()
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let decision = limiter
            .check("tls-user", 1)
            .await
            .unwrap_or_else(|e| panic!("check over TLS: {e}\n{}", server.log()));
        seen.push((decision.is_allowed(), decision.remaining()));
    }
    assert_eq!(seen, [(true, 1), (true, 0), (false, 0)], "{}", server.log());
}

/// The startup error of a connect, which must be `Error::Startup`.
fn startup_message(result: Result<RedisStore, Error>, server: &RedisServer) -> String {
    match result {
        Ok(store) => panic!("connected: {store:?}\n{}", server.log()),
        Err(Error::Startup(message)) => message,
        Err(e) => panic!("not a startup error: {e:?}\n{}", server.log()),
    }
}

#[tokio::test]
async fn rediss_with_the_servers_ca_decides() {
    let pki = Pki::new();
    let server = pki.server(&[]);
    let store = RedisStore::connect_with_tls(server.url(), pki.certs(false))
        .await
        .unwrap_or_else(|e| panic!("connect_with_tls: {e}\n{}", server.log()));
    decides(store, &server).await;
}

#[tokio::test]
async fn rediss_insecure_skips_the_certificate_check_and_decides() {
    let pki = Pki::new();
    let server = pki.server(&[]);
    // No CA given: only `#insecure` lets this certificate through.
    let url = format!("{}/#insecure", server.url());
    let store = RedisStore::connect(url.as_str())
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}\n{}", server.log()));
    decides(store, &server).await;
}

#[tokio::test]
async fn the_wrong_ca_fails_connect_naming_tls() {
    let pki = Pki::new();
    let server = pki.server(&[]);
    let wrong = TlsCertificates {
        root_cert: Some(support::tls::other_ca().into_bytes()),
        client_tls: None,
    };
    let message = startup_message(
        RedisStore::connect_with_tls(server.url(), wrong).await,
        &server,
    );
    assert!(message.contains("TLS failed"), "{message}");
    assert!(message.contains("certificate"), "{message}");
    // The system's trust store does not know the test CA either.
    let message = startup_message(RedisStore::connect(server.url()).await, &server);
    assert!(message.contains("TLS failed"), "{message}");
    // connect_lazy still starts; its checks fail until TLS works.
    let lazy = RedisStore::connect_lazy(server.url()).expect("connect_lazy starts");
    let limiter = Limiter::builder("2/1h".parse().unwrap())
        .store(lazy)
        .timeout(TEST_TIMEOUT)
        .build()
        .unwrap();
    assert!(limiter.check("tls-user", 1).await.is_err());
}

#[tokio::test]
async fn a_server_that_wants_a_client_certificate_takes_ours_and_refuses_none() {
    let pki = Pki::new();
    let server = pki.server(&["--tls-auth-clients", "yes"]);
    let store = RedisStore::connect_with_tls(server.url(), pki.certs(true))
        .await
        .unwrap_or_else(|e| panic!("connect with a client certificate: {e}\n{}", server.log()));
    decides(store, &server).await;
    let message = startup_message(
        RedisStore::connect_with_tls(server.url(), pki.certs(false)).await,
        &server,
    );
    assert!(message.contains("TLS failed"), "{message}");
}

#[tokio::test]
async fn rediss_to_a_plain_port_fails_connect_asking_whether_it_speaks_tls() {
    let server = RedisServer::start();
    let url = server.url().replace("redis://", "rediss://");
    let message = startup_message(RedisStore::connect(url.as_str()).await, &server);
    // A plain Redis waits for the rest of what it takes for a command.
    assert!(message.contains("does this port speak TLS?"), "{message}");
}
