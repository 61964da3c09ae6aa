//! gRPC end to end: `tonic::transport::Server` with the layer in front of the
//! standard health service, called by tonic-health's generated client.
//! Rejected calls are gRPC statuses (not HTTP errors that a gRPC client
//! maps to a retryable `UNAVAILABLE`), gRPC-Web calls (the layer outside
//! tonic-web's translation) get them under their own content type, and
//! `PeerIp` reads tonic's connect info.

mod support;

use std::time::Duration;

use http::request::Parts;
use http_body_util::{BodyExt, Empty};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use redis_ratelimit::{
    Limiter, OnStoreError, Quota, RateLimitLayer,
    key::{Global, KeyExtractor, PeerIp},
    refund::{Refund, TrailersLayer},
    respond::{GrpcResponse, Respond},
};
use support::{Backend, RedisServer};
use tokio::net::TcpListener;
use tonic::{
    Code, Status,
    transport::{Channel, Server, server::TcpIncoming},
};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use tonic_web::{GrpcWebClientLayer, GrpcWebLayer};

/// Serves the health service behind `layer` on an ephemeral port (HTTP/1
/// accepted too, for plain HTTP requests); its address.
async fn spawn<K: KeyExtractor<Parts> + Clone>(layer: RateLimitLayer<K>) -> String {
    let (incoming, url) = listen().await;
    let (_reporter, health) = tonic_health::server::health_reporter();
    let server = Server::builder()
        .accept_http1(true)
        .layer(layer)
        .add_service(health)
        .serve_with_incoming(incoming);
    tokio::spawn(server);
    url
}

/// A listener on an ephemeral port, and its URL.
async fn listen() -> (TcpIncoming, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (TcpIncoming::from(listener), url)
}

async fn client(url: &str) -> HealthClient<Channel> {
    let channel = Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

async fn check(client: &mut HealthClient<Channel>) -> Result<ServingStatus, Status> {
    let res = client.check(HealthCheckRequest::default()).await?;
    Ok(res.into_inner().status())
}

/// A check of a service the health server does not know: `NOT_FOUND`, a
/// trailers-only failure.
fn unknown() -> HealthCheckRequest {
    HealthCheckRequest {
        service: "no.such.Service".into(),
    }
}

/// `n` calls that fail with `NOT_FOUND`, then one that is over the limit.
async fn failures_until_exhausted(calls: &mut HealthClient<Channel>, n: usize, backend: &str) {
    for i in 0..n {
        let status = calls.check(unknown()).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{backend}: call {i}");
    }
    let status = calls.check(unknown()).await.unwrap_err();
    assert_eq!(
        status.code(),
        Code::ResourceExhausted,
        "{backend}: {status:?}"
    );
}

/// The two backends, named: the memory store, and a Redis of the test's own.
async fn backends() -> [(&'static str, Backend); 2] {
    [
        ("memory", Backend::memory()),
        ("redis", Backend::redis().await),
    ]
}

/// Every key in `b`'s Redis, if it has one, has a TTL.
async fn assert_ttls(b: &Backend) {
    if let Some(server) = b.server() {
        server.assert_every_key_has_ttl().await;
    }
}

fn metadata_u64(status: &Status, name: &str) -> u64 {
    let value = status.metadata().get(name);
    let value = value.unwrap_or_else(|| panic!("no {name} in {status:?}"));
    value.to_str().unwrap().parse().unwrap()
}

#[tokio::test]
async fn over_the_limit_a_call_is_resource_exhausted_with_a_retry_hint() {
    let redis = RedisServer::start();
    let limiter = Limiter::builder(Quota::per_minute(3))
        .store(redis.store().await)
        .build()
        .unwrap();
    // PeerIp: reads tonic's TcpConnectInfo (no Code::Internal).
    let url = spawn(RateLimitLayer::new(limiter, PeerIp)).await;
    let mut client = client(&url).await;
    for i in 0..3 {
        let status = check(&mut client).await.map_err(|s| s.code());
        assert_eq!(status, Ok(ServingStatus::Serving), "call {i}");
    }
    let status = check(&mut client).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(status.message(), "rate limit exceeded");
    let retry_after = metadata_u64(&status, "retry-after");
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    let pushback = metadata_u64(&status, "grpc-retry-pushback-ms");
    assert!((1..=60_000).contains(&pushback), "{pushback}");
    assert!(status.metadata().get("ratelimit").is_some(), "{status:?}");
    assert!(status.metadata().get("ratelimit-policy").is_some());
    redis.assert_every_key_has_ttl().await;
}

/// `PeerIp` keys the calls to a tonic server over TLS too. There tonic
/// records the peer as `TlsConnectInfo<TcpConnectInfo>` (a type named only
/// with one of tonic's TLS features, which an app turns on, not this crate)
/// and, in tonic 0.14, the plain `TcpConnectInfo` beside it, which is what
/// `PeerIp` reads. Should a tonic release drop the plain one, every call
/// here would be an `INTERNAL` error (no peer address), and this test says
/// so.
#[tokio::test]
async fn peer_ip_keys_calls_on_a_tls_server() {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    let identity = Identity::from_pem(cert.pem(), key.serialize_pem());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let limiter = Limiter::new(Quota::per_minute(2));
    let server = Server::builder()
        .tls_config(ServerTlsConfig::new().identity(identity))
        .unwrap()
        .layer(RateLimitLayer::new(limiter, PeerIp))
        .add_service(health)
        .serve_with_incoming(TcpIncoming::from(listener));
    tokio::spawn(server);
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(cert.pem()))
        .domain_name("localhost");
    let channel = Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    for i in 0..2 {
        let status = check(&mut client).await;
        assert_eq!(status.ok(), Some(ServingStatus::Serving), "call {i}");
    }
    let status = check(&mut client).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
}

#[tokio::test]
async fn store_failure_under_deny_is_unavailable() {
    let mut redis = RedisServer::start();
    let limiter = Limiter::builder(Quota::per_minute(100))
        .store(redis.store().await)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(limiter, PeerIp).on_store_error(OnStoreError::Deny);
    let url = spawn(layer).await;
    let mut client = client(&url).await;
    assert_eq!(check(&mut client).await.ok(), Some(ServingStatus::Serving));
    redis.kill();
    let status = check(&mut client).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), "rate limit store unavailable");
    assert!(status.metadata().get("grpc-retry-pushback-ms").is_none());
}

/// One server, one limit, two protocols: the gRPC call is answered as gRPC,
/// the plain HTTP request with its 429.
#[tokio::test]
async fn a_mixed_server_answers_each_protocol_in_its_own_terms() {
    let url = spawn(RateLimitLayer::new(
        Limiter::new(Quota::per_minute(1)),
        Global,
    ))
    .await;
    let mut client = client(&url).await;
    assert_eq!(check(&mut client).await.ok(), Some(ServingStatus::Serving));

    let http = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    let res = http.get(url.parse().unwrap()).await.unwrap();
    assert_eq!(res.status(), http::StatusCode::TOO_MANY_REQUESTS);
    assert!(
        res.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    assert!(res.headers().get("grpc-status").is_none());
    assert!(
        res.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .is_empty()
    );

    // A plain HTTP request that only claims a gRPC content-type gets the
    // HTTP answer too: a gRPC answer is an HTTP 200, which it (or a cache on
    // its way) would take for a success.
    // A request that claims a gRPC content-type, by method and `te`.
    let claiming = |method: http::Method, te: Option<&str>| {
        let mut req = http::Request::builder()
            .method(method)
            .uri(&url)
            .header("content-type", "application/grpc");
        if let Some(te) = te {
            req = req.header("te", te);
        }
        http.request(req.body(Empty::new()).unwrap())
    };
    for (method, te) in [
        (http::Method::GET, Some("trailers")),
        (http::Method::POST, None),
    ] {
        let res = claiming(method.clone(), te).await.unwrap();
        assert_eq!(
            res.status(),
            http::StatusCode::TOO_MANY_REQUESTS,
            "{method} {te:?}"
        );
        assert!(
            res.headers().get("grpc-status").is_none(),
            "{method} {te:?}"
        );
    }
    // A gRPC call passed on over HTTP/1.1 (as tonic-web does) asks for
    // trailers, and is answered as gRPC.
    let res = claiming(http::Method::POST, Some("trailers"))
        .await
        .unwrap();
    assert_eq!(res.status(), http::StatusCode::OK);
    assert_eq!(res.headers()["grpc-status"], "8");

    let status = check(&mut client).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
}

/// Serves the health service behind `layer`, outside tonic-web's
/// translation: the layer sees gRPC-Web calls as the browser sent them.
async fn spawn_web<R>(layer: RateLimitLayer<Global, R>) -> String
where
    RateLimitLayer<Global, R>: Clone,
    R: Respond<http::Response<tonic::body::Body>>,
{
    let (incoming, url) = listen().await;
    let (_reporter, health) = tonic_health::server::health_reporter();
    let server = Server::builder()
        .accept_http1(true)
        .layer(layer)
        .layer(GrpcWebLayer::new())
        .add_service(health)
        .serve_with_incoming(incoming);
    tokio::spawn(server);
    url
}

/// A bare `POST` of a health check with `content-type` (and `te`), over
/// HTTP/1.1 as a browser sends gRPC-Web: the answer's head and its body.
async fn post_check(
    url: &str,
    content_type: &str,
    te: bool,
) -> (http::response::Parts, bytes::Bytes) {
    let http =
        Client::builder(TokioExecutor::new()).build_http::<http_body_util::Full<bytes::Bytes>>();
    let mut req = http::Request::post(format!("{url}/grpc.health.v1.Health/Check"))
        .header("content-type", content_type);
    if te {
        req = req.header("te", "trailers");
    }
    let req = req.body(http_body_util::Full::new(bytes::Bytes::from_static(
        b"\0\0\0\0\0",
    )));
    let res = http.request(req.unwrap()).await.unwrap();
    let (head, body) = res.into_parts();
    (head, body.collect().await.unwrap().to_bytes())
}

/// A gRPC-Web call answered by `GrpcResponse` (the layer outside tonic-web)
/// gets the same trailers-only answer as a gRPC call, under its own
/// gRPC-Web `content-type` (family and codec), with its status and retry
/// hints as headers, which tonic-web's client reads as the call's status.
/// A plain gRPC call keeps `application/grpc`.
#[tokio::test]
async fn a_grpc_web_call_is_answered_in_grpc_web() {
    let limiter = Limiter::new(Quota::per_minute(1));
    let url = spawn_web(RateLimitLayer::new(limiter, Global).responder(GrpcResponse)).await;
    let origin = url.parse().unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http();
    let web = tower::ServiceBuilder::new()
        .layer(GrpcWebClientLayer::new())
        .service(client);
    let mut calls = HealthClient::with_origin(web, origin);
    let served = calls.check(HealthCheckRequest::default()).await;
    let served = served
        .map(|r| r.into_inner().status())
        .map_err(|s| s.code());
    assert_eq!(
        served,
        Ok(ServingStatus::Serving),
        "served through tonic-web"
    );
    let status = calls
        .check(HealthCheckRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(status.message(), "rate limit exceeded");
    let pushback = metadata_u64(&status, "grpc-retry-pushback-ms");
    assert!((1..=60_000).contains(&pushback), "{pushback}");

    for (request, answer) in [
        ("application/grpc-web", "application/grpc-web"),
        ("application/grpc-web+proto", "application/grpc-web+proto"),
        ("application/grpc-web+json", "application/grpc-web+json"),
        ("application/grpc-web-text", "application/grpc-web-text"),
        (
            "application/grpc-web-text+proto",
            "application/grpc-web-text+proto",
        ),
        (
            "Application/gRPC-Web-Text+Proto; x=y",
            "application/grpc-web-text+proto",
        ),
    ] {
        let (head, body) = post_check(&url, request, false).await;
        assert_eq!(head.status, http::StatusCode::OK, "{request}");
        assert_eq!(head.headers["content-type"], answer, "{request}");
        assert_eq!(head.headers["grpc-status"], "8", "{request}");
        assert_eq!(head.headers["grpc-message"], "rate limit exceeded");
        assert!(head.headers.contains_key("grpc-retry-pushback-ms"));
        assert!(head.headers.contains_key("ratelimit"), "{request}");
        assert!(body.is_empty(), "trailers-only: {request}: {body:?}");
    }
    // Plain gRPC (passed on over HTTP/1.1, asking for trailers): as before.
    let (head, body) = post_check(&url, "application/grpc+proto", true).await;
    assert_eq!(head.status, http::StatusCode::OK);
    assert_eq!(head.headers["content-type"], "application/grpc");
    assert_eq!(head.headers["grpc-status"], "8");
    assert!(body.is_empty());
}

/// The default answer to a gRPC-Web call is still an HTTP status: the
/// gRPC-Web type is given to gRPC answers only.
#[tokio::test]
async fn the_default_answer_to_a_grpc_web_call_stays_http() {
    let limiter = Limiter::new(Quota::per_minute(1));
    let url = spawn_web(RateLimitLayer::new(limiter, Global)).await;
    let (head, _) = post_check(&url, "application/grpc-web+proto", false).await;
    assert_eq!(head.status, http::StatusCode::OK, "served: {head:?}");
    let (head, _) = post_check(&url, "application/grpc-web+proto", false).await;
    assert_eq!(head.status, http::StatusCode::TOO_MANY_REQUESTS, "{head:?}");
    assert!(head.headers.get("grpc-status").is_none(), "{head:?}");
    let content_type = head.headers.get("content-type").map(|v| v.as_bytes());
    assert!(!content_type.is_some_and(|t| t.starts_with(b"application/grpc")));
}

/// Waits (at most 10 s) until the global key has `remaining` left, that is
/// until the refunds sent so far have landed. Peeks spend nothing.
async fn settled(limiter: &Limiter, remaining: u64) {
    let wait = async {
        while limiter.peek("global", 1).await.unwrap().remaining() != remaining {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap_or_else(|_| panic!("never got back to {remaining} left"));
}

/// A gRPC answer is HTTP 200 whatever its outcome: refunds go by its
/// `grpc-status` when it is at the head (a trailers-only answer, as errors
/// are). A served call's status comes in the trailers, after the response
/// has left the middleware: without a `TrailersLayer` it is never refunded
/// (with one: `served_calls_are_refunded_by_their_trailers`).
#[tokio::test]
async fn grpc_refunds_go_by_the_grpc_status() {
    for (backend, b) in backends().await {
        let limiter = |name: &str| b.builder("3/1m").name(name).build().unwrap();

        // Count only failures: a failed call (NOT_FOUND) is never taken
        // for a success, so the failures reach the limit.
        let failures = limiter("failures");
        let layer = RateLimitLayer::new(failures.clone(), Global).refund_when(Refund::Successes);
        let mut calls = client(&spawn(layer).await).await;
        failures_until_exhausted(&mut calls, 3, backend).await;

        // Refund client errors: NOT_FOUND is a 404, and is refunded; a
        // served call is charged.
        let served = limiter("served");
        let layer = RateLimitLayer::new(served.clone(), Global).refund_when(Refund::ClientErrors);
        let mut calls = client(&spawn(layer).await).await;
        for i in 0..5 {
            let status = calls.check(unknown()).await.unwrap_err();
            assert_eq!(status.code(), Code::NotFound, "{backend}: call {i}");
            settled(&served, 3).await;
        }
        for i in 0..3 {
            let status = check(&mut calls).await.map_err(|s| s.code());
            assert_eq!(status, Ok(ServingStatus::Serving), "{backend}: call {i}");
        }
        let status = check(&mut calls).await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::ResourceExhausted,
            "{backend}: {status:?}"
        );
        assert_ttls(&b).await;
    }
}

/// With `refund::TrailersLayer` outside the rate-limit layer, a served
/// call (its `grpc-status` 0 in the trailers) is refunded by `Successes`:
/// twice the quota of served calls all pass, and only failures count.
#[tokio::test]
async fn served_calls_are_refunded_by_their_trailers() {
    for (backend, b) in backends().await {
        let limiter = b.builder("3/1m").name("failures").build().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (_reporter, health) = tonic_health::server::health_reporter();
        let limit = RateLimitLayer::new(limiter.clone(), Global).refund_when(Refund::Successes);
        let server = Server::builder()
            .layer(TrailersLayer::new())
            .layer(limit)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener));
        tokio::spawn(server);
        let mut calls = client(&url).await;
        for i in 0..6 {
            let status = check(&mut calls).await.map_err(|s| s.code());
            assert_eq!(status, Ok(ServingStatus::Serving), "{backend}: call {i}");
            settled(&limiter, 3).await;
        }
        failures_until_exhausted(&mut calls, 3, backend).await;
        assert_ttls(&b).await;
    }
}

/// `Refund::ServerErrors` never refunds a status the client can have at
/// will: a call to a method the server does not have is answered 12
/// `UNIMPLEMENTED` (HTTP 501) by tonic itself, and a client sending only
/// such calls is limited like any other, not refunded each one.
#[tokio::test]
async fn calls_to_an_unknown_method_are_not_refunded_as_server_errors() {
    for (backend, b) in backends().await {
        let limiter = b.builder("3/1m").name("unknown").build().unwrap();
        let layer = RateLimitLayer::new(limiter.clone(), Global).refund_when(Refund::ServerErrors);
        let url = spawn(layer).await;
        let http = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build_http::<http_body_util::Full<bytes::Bytes>>();
        let mut codes = Vec::new();
        for _ in 0..5 {
            let req = http::Request::post(format!("{url}/grpc.health.v1.Health/NoSuchMethod"))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(http_body_util::Full::new(bytes::Bytes::from_static(
                    b"\0\0\0\0\0",
                )))
                .unwrap();
            let res = http.request(req).await.unwrap();
            let code = res.headers().get("grpc-status").map(|v| v.to_owned());
            // A served call would carry it in the trailers.
            let trailers = res.into_body().collect().await.unwrap().trailers().cloned();
            let code = code.or_else(|| trailers.and_then(|t| t.get("grpc-status").cloned()));
            let code = code.expect("a grpc-status at the head or in the trailers");
            codes.push(code.to_str().unwrap().to_owned());
        }
        assert_eq!(codes, ["12", "12", "12", "8", "8"], "{backend}");
        assert_ttls(&b).await;
    }
}

/// A call the key extractor refuses is answered in gRPC's terms, as the
/// README's table maps it: a missing key header (400) `INVALID_ARGUMENT`,
/// a server error of the extractor's (500) `INTERNAL`, neither with a
/// retry hint, and the message a fixed text, not the extractor's reason.
#[tokio::test]
async fn a_call_without_a_key_is_invalid_argument_and_a_key_server_error_internal() {
    let header = RateLimitLayer::new(
        Limiter::new(Quota::per_minute(100)),
        redis_ratelimit::key::Header::new("x-api-key"),
    );
    let mut calls = client(&spawn(header).await).await;
    let status = check(&mut calls).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.metadata().get("grpc-retry-pushback-ms").is_none());

    let failing = redis_ratelimit::key::from_fn(|_: &Parts| {
        Err::<redis_ratelimit::Key, _>(redis_ratelimit::key::KeyError::Rejected {
            status: http::StatusCode::INTERNAL_SERVER_ERROR,
            reason: "the auth step set no tenant".into(),
        })
    });
    let layer = RateLimitLayer::new(Limiter::new(Quota::per_minute(100)), failing);
    let mut calls = client(&spawn(layer).await).await;
    let status = check(&mut calls).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(!status.message().contains("tenant"), "{status:?}");
    assert!(status.metadata().get("grpc-retry-pushback-ms").is_none());
}
