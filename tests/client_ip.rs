//! `key::ClientIp` and key hygiene end to end: a real axum server behind a
//! "proxy" on another loopback address, a real redis-server per test, and the
//! misconfiguration warnings as `tracing` prints them.

mod support;

use std::{
    collections::HashSet,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use axum::{Router, routing::get};
use bytes::Bytes;
use http::{Request, StatusCode, request::Parts};
use http_body_util::Empty;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use redis_ratelimit::{
    RAW_KEY_MAX, RateLimitLayer,
    key::{ClientIp, Header, KeyError, KeyExtractor, MAX_HEADER_KEY_LEN, PeerIp},
};
use support::{RedisServer, logs::Captured};
use tokio::net::TcpListener;

/// Request parts from `peer` with `headers`, as the tower layer sees them.
fn parts(peer: &str, headers: &[(&str, &[u8])]) -> Parts {
    let mut req = Request::get("/").extension(peer.parse::<SocketAddr>().unwrap());
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(()).unwrap().into_parts().0
}

fn key(extractor: &impl KeyExtractor, peer: &str, headers: &[(&str, &[u8])]) -> String {
    let key = extractor.extract(&parts(peer, headers)).unwrap();
    String::from_utf8(key.as_bytes().to_vec()).unwrap()
}

/// Serves `GET /` behind `layer` on 127.0.0.1, with axum's connect info.
async fn spawn(layer: RateLimitLayer<ClientIp>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    serve(listener, layer);
    url
}

/// Serves `GET /` behind `layer` on `listener`, with axum's connect info.
fn serve<K: KeyExtractor>(listener: TcpListener, layer: RateLimitLayer<K>) {
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, app).await });
}

/// Sends `GET url` from loopback address `from` (Linux routes all of
/// 127.0.0.0/8 to lo) with an optional `X-Forwarded-For`, and returns the
/// status.
async fn get_from(url: &str, from: impl Into<IpAddr>, xff: Option<&str>) -> StatusCode {
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(from.into()));
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(connector);
    let mut req = Request::get(url);
    if let Some(xff) = xff {
        req = req.header("x-forwarded-for", xff);
    }
    let res = tokio::time::timeout(
        Duration::from_secs(30),
        client.request(req.body(Empty::new()).unwrap()),
    );
    res.await
        .expect("GET hung for 30 s")
        .expect("HTTP request")
        .status()
}

#[tokio::test]
async fn clients_behind_a_trusted_proxy_get_their_own_buckets_and_spoofers_do_not() {
    let redis = RedisServer::start();
    let limiter = redis.limiter("2/1m").await;
    let client_ip = ClientIp::new().trust("127.0.0.2").unwrap();
    let url = spawn(RateLimitLayer::new(limiter.clone(), client_ip)).await;
    let proxy = [127, 0, 0, 2];
    let (ok, limited) = (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS);

    // Two clients behind the proxy: two buckets of 2.
    for client in ["203.0.113.1", "203.0.113.2"] {
        let xff = format!("6.6.6.6, {client}");
        for expected in [ok, ok, limited] {
            let status = get_from(&url, proxy, Some(&xff)).await;
            assert_eq!(status, expected, "{client}\n{}", redis.log());
        }
    }
    // A client connecting directly cannot pick a fresh key per request.
    let spoofer = [127, 0, 0, 3];
    let mut statuses = Vec::new();
    for i in 0..4 {
        let xff = format!("198.51.100.{i}");
        statuses.push(get_from(&url, spoofer, Some(&xff)).await);
    }
    assert_eq!(statuses, [ok, ok, limited, limited], "{}", redis.log());
    // Nor can it pose as a client behind the proxy (whose bucket has room).
    let status = get_from(&url, spoofer, Some("203.0.113.9")).await;
    assert_eq!(status, limited);
    assert_eq!(get_from(&url, proxy, Some("203.0.113.9")).await, ok);

    let keys: HashSet<String> = redis
        .keys_with_ttl()
        .await
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let expected: HashSet<String> = ["203.0.113.1", "203.0.113.2", "127.0.0.3", "203.0.113.9"]
        .iter()
        .map(|c| limiter.store_key(c))
        .collect();
    assert_eq!(keys, expected, "{}", redis.log());
    redis.assert_every_key_has_ttl().await;
}

/// The default `PeerIp` on a dual-stack listener (`[::]:0`): an IPv4 client,
/// which the socket reports as `::ffff:127.0.0.1`, is keyed `127.0.0.1`, as
/// `ClientIp` keys it; an IPv6 client by its /64.
#[tokio::test]
async fn peer_ip_on_a_dual_stack_listener_keys_ipv4_as_ipv4_and_ipv6_by_64() {
    let redis = RedisServer::start();
    let limiter = redis.limiter("2/1m").await;
    let listener = TcpListener::bind("[::]:0").await.expect(
        "binding [::]:0 failed: this test needs IPv6 (a dual-stack listener); \
         it does not skip",
    );
    let port = listener.local_addr().unwrap().port();
    serve(listener, RateLimitLayer::new(limiter.clone(), PeerIp));
    let (ok, limited) = (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS);

    let v4 = format!("http://127.0.0.1:{port}/");
    for expected in [ok, ok, limited] {
        let status = get_from(&v4, [127, 0, 0, 1], None).await;
        assert_eq!(status, expected, "IPv4 over [::]\n{}", redis.log());
    }
    // IPv6 loopback: a bucket of its own, keyed by its /64.
    std::net::TcpListener::bind("[::1]:0").expect(
        "IPv6 loopback [::1] is unavailable: this test needs it (`ip -6 addr` \
         should list ::1 on lo); it does not skip",
    );
    let v6 = format!("http://[::1]:{port}/");
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(get_from(&v6, std::net::Ipv6Addr::LOCALHOST, None).await);
    }
    assert_eq!(
        statuses,
        [ok, ok, limited],
        "IPv6 over [::]\n{}",
        redis.log()
    );

    let keys: HashSet<String> = redis
        .keys_with_ttl()
        .await
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let expected: HashSet<String> = ["127.0.0.1", "::/64"]
        .iter()
        .map(|c| limiter.store_key(c))
        .collect();
    assert_eq!(keys, expected, "{}", redis.log());
    redis.assert_every_key_has_ttl().await;
}

/// Redis keys for hostile client material stay bounded, tagged and apart.
#[tokio::test]
async fn hostile_key_material_makes_bounded_distinct_redis_keys() {
    let redis = RedisServer::start();
    let limiter = redis.limiter("5/1m").await;
    let header = Header::new("x-api-key");
    let big = vec![b'k'; 64 * 1024];
    let at_bound = vec![b'k'; MAX_HEADER_KEY_LEN];

    // Header: a 64 KB value is refused (400) before it is hashed or stored.
    let err = header
        .extract(&parts("192.0.2.1:1", &[("x-api-key", &big)]))
        .unwrap_err();
    assert!(matches!(err, KeyError::HeaderTooLong(_)), "{err}");
    assert_eq!(err.status(), StatusCode::BAD_REQUEST);
    // ClientIp: a 64 KB forwarding header from the trusted proxy is garbage:
    // the key is the proxy's.
    let client_ip = ClientIp::new().trust("10.0.0.0/8").unwrap();
    assert_eq!(
        key(&client_ip, "10.0.0.1:1", &[("x-forwarded-for", &big)]),
        "10.0.0.1"
    );

    let hashed_braces = limiter.store_key("a}b");
    let digest = hashed_braces
        .rsplit_once('{')
        .unwrap()
        .1
        .trim_end_matches('}')
        .to_owned();
    assert!(digest.starts_with('#'), "{hashed_braces}");
    let values: Vec<Vec<u8>> = vec![
        b"plain-key".to_vec(),
        b"a}b".to_vec(),
        b"}".to_vec(),
        b"{".to_vec(),
        b"{other}".to_vec(),
        b"x}:fw:default:{y".to_vec(),
        b"\xff\xfebytes".to_vec(),
        b"nul\x00and\r\nnewline".to_vec(),
        b"caf\xc3\xa9".to_vec(),
        b"with space".to_vec(),
        digest.clone().into_bytes(), // another client's hashed form
        format!("#{}", &digest[1..]).to_uppercase().into_bytes(),
        vec![b'k'; RAW_KEY_MAX],
        vec![b'k'; RAW_KEY_MAX + 1],
        at_bound.clone(),
        big.clone(),
    ];
    let mut store_keys = HashSet::new();
    for value in &values {
        // Through the Header extractor where HTTP allows the value and the
        // extractor accepts it, else as a business key straight to the limiter.
        let key = match http::HeaderValue::from_bytes(value) {
            Ok(_) => match header.extract(&parts("192.0.2.1:1", &[("x-api-key", value)])) {
                Ok(k) => k.as_bytes().to_vec(),
                Err(_) => value.clone(),
            },
            Err(_) => value.clone(),
        };
        let decision = limiter
            .check(&key, 1)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", redis.log()));
        assert!(decision.is_allowed());
        let store_key = limiter.store_key(&key);
        assert!(
            store_key.len() <= "rl:fw:default.5-60000:".len() + RAW_KEY_MAX + 2,
            "{store_key}"
        );
        assert_eq!(store_key.matches('{').count(), 1, "{store_key}");
        assert_eq!(store_key.matches('}').count(), 1, "{store_key}");
        assert!(store_key.ends_with('}'), "{store_key}");
        assert!(
            store_key.starts_with("rl:fw:default.5-60000:{"),
            "{store_key}"
        );
        store_keys.insert(store_key);
    }
    assert_eq!(store_keys.len(), values.len(), "every value its own key");
    // A value that looks like a digest is itself hashed, never stored raw.
    assert_ne!(limiter.store_key(digest.as_bytes()), hashed_braces);

    let in_redis: HashSet<String> = redis
        .keys_with_ttl()
        .await
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(in_redis, store_keys, "{}", redis.log());
    redis.assert_every_key_has_ttl().await;
}

#[test]
fn misconfigurations_are_logged_once_each() {
    // Headers arriving while no proxy is trusted.
    let warnings = Captured::default().warnings(|| {
        let client_ip = ClientIp::new();
        for i in 0..50 {
            let xff = format!("198.51.100.{i}");
            let k = key(
                &client_ip.clone(),
                "10.0.0.1:1",
                &[("x-forwarded-for", xff.as_bytes())],
            );
            assert_eq!(k, "10.0.0.1");
        }
    });
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(warnings[0].contains("trusts no proxy"), "{warnings:#?}");

    // A trusted proxy that never sends the header.
    let warnings = Captured::default().warnings(|| {
        let client_ip = ClientIp::new().trust("10.0.0.0/8").unwrap();
        for _ in 0..99 {
            key(&client_ip, "10.0.0.1:1", &[]);
        }
        assert_eq!(
            key(
                &client_ip,
                "10.0.0.1:1",
                &[("x-forwarded-for", b"192.0.2.1")]
            ),
            "192.0.2.1"
        );
        for _ in 0..300 {
            assert_eq!(key(&client_ip, "10.0.0.1:1", &[]), "10.0.0.1");
        }
    });
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(
        warnings[0].contains("without a `x-forwarded-for` header"),
        "{warnings:#?}"
    );

    // Trusting every address, at construction; nothing per request.
    let warnings = Captured::default().warnings(|| {
        let client_ip = ClientIp::new().trust("0.0.0.0/0, ::/0").unwrap();
        assert_eq!(
            key(
                &client_ip,
                "192.0.2.1:1",
                &[("x-forwarded-for", b"1.2.3.4")]
            ),
            "1.2.3.4"
        );
    });
    assert_eq!(warnings.len(), 2, "{warnings:#?}");
    assert!(
        warnings.iter().all(|w| w.contains("every address")),
        "{warnings:#?}"
    );

    // A correct setup logs nothing.
    let warnings = Captured::default().warnings(|| {
        let client_ip = ClientIp::new().trust("10.0.0.0/8").unwrap();
        for i in 0..200 {
            let xff = format!("192.0.2.{}", i % 250);
            key(
                &client_ip,
                "10.0.0.1:1",
                &[("x-forwarded-for", xff.as_bytes())],
            );
            key(&client_ip, "203.0.113.5:1", &[]);
        }
    });
    assert_eq!(warnings, Vec::<String>::new());
}

#[cfg(feature = "actix")]
#[test]
fn the_same_extractor_works_for_actix_requests() {
    use actix_web::test::TestRequest;

    let client_ip = ClientIp::new().trust("10.0.0.0/8").unwrap();
    let req = TestRequest::default()
        .peer_addr("10.0.0.1:1".parse().unwrap())
        .insert_header(("x-forwarded-for", "6.6.6.6, 2001:db8:1:2::99"))
        .to_srv_request();
    assert_eq!(
        client_ip.extract(&req).unwrap().as_bytes(),
        b"2001:db8:1:2::/64"
    );
    let spoof = TestRequest::default()
        .peer_addr("192.0.2.8:1".parse().unwrap())
        .insert_header(("x-forwarded-for", "6.6.6.6"))
        .to_srv_request();
    assert_eq!(client_ip.extract(&spoof).unwrap().as_bytes(), b"192.0.2.8");
    let no_peer = TestRequest::default().to_srv_request();
    assert!(matches!(
        client_ip.extract(&no_peer),
        Err(KeyError::NoPeerAddr)
    ));
}
