//! Refunds by a `grpc-status` in the trailers, with
//! `refund::TrailersLayer` outside the rate-limit layer: the status in the
//! trailers decides, a body that never reaches them stays charged, and
//! without the layer nothing is refunded and a warning says so. gRPC-Web
//! answers are judged by their `grpc-status`, at their head or in their
//! body's trailer frame, never by their HTTP 200. On the memory store and on Redis. (Served tonic calls:
//! `tests/grpc.rs`.)

mod support;

use std::{convert::Infallible, time::Duration};

use bytes::Bytes;
use futures_util::stream;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody, combinators::UnsyncBoxBody};
use redis_ratelimit::{
    Limiter, RateLimitLayer,
    key::Global,
    refund::{Refund, TrailersBody, TrailersLayer},
};
use support::{Backend, logs::Captured};
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// A gRPC answer (HTTP 200, `application/grpc`) of one message, then by
/// the path: `/trailers/<code>` trailers with that `grpc-status`,
/// `/trailers/none` trailers without one, `/end` no trailers at all.
async fn grpc_app(req: Request<()>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_owned();
    let mut frames = vec![Ok(Frame::data(Bytes::from_static(b"\0\0\0\0\0")))];
    if let Some(code) = path.strip_prefix("/trailers/") {
        let mut trailers = HeaderMap::new();
        if code != "none" {
            trailers.insert("grpc-status", HeaderValue::from_str(code).unwrap());
        }
        trailers.insert("grpc-message", HeaderValue::from_static("x"));
        frames.push(Ok(Frame::trailers(trailers)));
    }
    let res = Response::builder()
        .header("content-type", "application/grpc")
        .body(StreamBody::new(stream::iter(frames)).boxed_unsync())
        .unwrap();
    Ok(res)
}

/// `svc`'s response to a gRPC call to `path` (`POST`, `content-type:
/// application/grpc`), once it is ready.
async fn send<S, B>(svc: &mut S, path: &str) -> Response<B>
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    send_as(svc, "POST", Some("application/grpc"), path).await
}

/// `svc`'s response to `method path` with `content_type`, once it is ready.
async fn send_as<S, B>(
    svc: &mut S,
    method: &str,
    content_type: Option<&str>,
    path: &str,
) -> Response<B>
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    let mut req = Request::builder().method(method).uri(path);
    if let Some(content_type) = content_type {
        req = req.header("content-type", content_type);
    }
    svc.ready()
        .await
        .unwrap()
        .call(req.body(()).unwrap())
        .await
        .unwrap()
}

/// The units left of the global key, once nothing changes it for 200 ms
/// (refunds run as tasks; a refund that should not come has time to land).
async fn remaining_after_refunds(limiter: &Limiter, expected: u64) -> u64 {
    let wait = async {
        while limiter.peek("global", 1).await.unwrap().remaining() != expected {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), wait).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    limiter.peek("global", 1).await.unwrap().remaining()
}

/// Reads the HTTP 200 answer `res` to `path` to its end, or drops it after
/// its first frame, then checks the global key has `left` units, one fewer
/// unless the answer was `refunded`; what is left.
async fn answered<B: http_body::Body + Unpin>(
    res: Response<B>,
    path: &str,
    to_the_end: bool,
    refunded: bool,
    limiter: &Limiter,
    mut left: u64,
) -> u64
where
    B::Error: std::fmt::Debug,
{
    assert_eq!(res.status(), 200, "{path}");
    let mut body = res.into_body();
    if to_the_end {
        body.collect().await.unwrap();
    } else {
        body.frame().await.unwrap().unwrap();
        drop(body);
    }
    if !refunded {
        left -= 1;
    }
    let now = remaining_after_refunds(limiter, left).await;
    assert_eq!(now, left, "{path}: refunded {refunded}");
    left
}

async fn refunds_by_the_trailers(b: Backend) {
    let limiter = b.limiter("12/1m");
    let layer = RateLimitLayer::new(limiter.clone(), Global).refund_when(Refund::ServerErrors);
    let mut svc = ServiceBuilder::new()
        .layer(TrailersLayer::new())
        .layer(layer)
        .service(service_fn(grpc_app));
    let mut left = 12;
    // (path, read the body to its end, refunded)
    let cases = [
        ("/trailers/0", true, false),
        ("/trailers/13", true, true),
        ("/trailers/5", true, false),
        ("/trailers/14", true, true),
        // Statuses the client can have at will: its unknown method, its
        // own deadline.
        ("/trailers/12", true, false),
        ("/trailers/4", true, false),
        ("/trailers/none", true, true),
        ("/end", true, false),
        // Dropped after its first frame: the trailers never came.
        ("/trailers/13", false, false),
    ];
    for (path, to_the_end, refunded) in cases {
        let res = send(&mut svc, path).await;
        assert!(res.body().holds_a_refund(), "{path}");
        left = answered(res, path, to_the_end, refunded, &limiter, left).await;
    }

    // A non-gRPC response, and a gRPC answer with its status at the head,
    // are settled by the rate-limit layer itself: nothing for the body.
    let mut head_only = ServiceBuilder::new()
        .layer(TrailersLayer::new())
        .layer(RateLimitLayer::new(limiter.clone(), Global).refund_when(Refund::ServerErrors))
        .service(service_fn(|_: Request<()>| async {
            let res = Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", "13")
                .body(http_body_util::Empty::<Bytes>::new())
                .unwrap();
            Ok::<_, Infallible>(res)
        }));
    let res = send(&mut head_only, "/").await;
    assert!(!res.body().holds_a_refund());
    assert_eq!(remaining_after_refunds(&limiter, left).await, left);

    // Two rate-limit layers with refunds, one inside the other: the
    // trailers settle both.
    let outer = b.builder("10/1m").name("outer").build().unwrap();
    let mut nested = ServiceBuilder::new()
        .layer(TrailersLayer::new())
        .layer(RateLimitLayer::new(outer.clone(), Global).refund_when(Refund::ServerErrors))
        .layer(RateLimitLayer::new(limiter.clone(), Global).refund_when(Refund::ServerErrors))
        .service(service_fn(grpc_app));
    for (path, refunded) in [("/trailers/13", true), ("/trailers/0", false)] {
        let res = send(&mut nested, path).await;
        res.into_body().collect().await.unwrap();
        if !refunded {
            left -= 1;
        }
        let outer_left = if refunded { 10 } else { 9 };
        assert_eq!(
            remaining_after_refunds(&outer, outer_left).await,
            outer_left,
            "{path}"
        );
        assert_eq!(
            remaining_after_refunds(&limiter, left).await,
            left,
            "{path}"
        );
    }
    if let Backend::Redis(server, _) = &b {
        server.assert_every_key_has_ttl().await;
    }
}

#[tokio::test]
async fn a_grpc_status_in_the_trailers_decides_the_refund_memory() {
    refunds_by_the_trailers(Backend::memory()).await;
}

#[tokio::test]
async fn a_grpc_status_in_the_trailers_decides_the_refund_redis() {
    refunds_by_the_trailers(Backend::redis().await).await;
}

/// Without the trailers layer, a status in the trailers is never read: the
/// call stays charged, and a warning names the layer, once.
#[tokio::test]
async fn without_the_trailers_layer_nothing_is_refunded_and_a_warning_says_so() {
    let b = Backend::redis().await;
    let limiter = b.limiter("10/1m");
    let layer = RateLimitLayer::new(limiter.clone(), Global).refund_when(Refund::ServerErrors);
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(grpc_app));
    let captured = Captured::default();
    let guard = captured.install();
    for _ in 0..3 {
        let res = send(&mut svc, "/trailers/13").await;
        res.into_body().collect().await.unwrap();
    }
    drop(guard);
    assert_eq!(remaining_after_refunds(&limiter, 7).await, 7);
    let warnings = captured.warning_lines();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("refund::TrailersLayer"),
        "{warnings:?}"
    );
}

/// A gRPC-Web call's `content-type`.
const WEB: &str = "application/grpc-web+proto";

/// A gRPC-Web frame: the flag byte, the length, the payload.
fn web_frame(flag: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![flag];
    out.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A gRPC-Web answer (HTTP 200) by the path: `/status/<code>` that status
/// at its head and no body; `/body/<code>` one message, then the trailer
/// frame with that status, sent a few bytes at a time; `/text/<code>` the
/// same in `application/grpc-web-text` (base64, each frame's own segment);
/// `/in-body` a body that ends without a trailer frame.
async fn grpc_web_app(req: Request<()>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_owned();
    let (kind, code) = path[1..].split_once('/').unwrap_or((&path[1..], ""));
    let trailer = web_frame(
        0x80,
        format!("grpc-message: x\r\ngrpc-status: {code}\r\n").as_bytes(),
    );
    let message = web_frame(0, b"a message");
    let (content_type, body): (_, Vec<u8>) = match kind {
        "body" => ("application/grpc-web+proto", [message, trailer].concat()),
        "text" => {
            use base64::Engine;
            let b64 = base64::engine::general_purpose::STANDARD;
            let text = b64.encode(&message) + &b64.encode(&trailer);
            ("application/grpc-web-text+proto", text.into_bytes())
        }
        _ => ("application/grpc-web+proto", message),
    };
    let frames: Vec<Result<_, Infallible>> = body
        .chunks(3)
        .map(|piece| Ok(Frame::data(Bytes::copy_from_slice(piece))))
        .collect();
    let mut res = Response::builder().header("content-type", content_type);
    if kind == "status" {
        res = res.header("grpc-status", code);
    }
    let body = match kind {
        "status" => http_body_util::Empty::new()
            .map_err(|e| match e {})
            .boxed_unsync(),
        _ => StreamBody::new(stream::iter(frames)).boxed_unsync(),
    };
    Ok(res.body(body).unwrap())
}

/// [`grpc_web_app`] behind `limiter` (keyed by `Global`, refunding by
/// `refund`), inside a `TrailersLayer`.
fn grpc_web_service(
    limiter: &Limiter,
    refund: Refund,
) -> impl Service<Request<()>, Response = Response<TrailersBody<Body>>, Error = Infallible> {
    let layer = RateLimitLayer::new(limiter.clone(), Global).refund_when(refund);
    ServiceBuilder::new()
        .layer(TrailersLayer::new())
        .layer(layer)
        .service(service_fn(grpc_web_app))
}

/// A gRPC-Web answer is HTTP 200 whatever the call's outcome, as a gRPC
/// one is: "count only failures" (`Successes`) must not refund a failed
/// call for its 200. Its `grpc-status` decides: at the head, or in the
/// trailer frame that ends its body, which the `TrailersLayer` reads as the
/// body passes, binary or base64; a body that ends without one, or is
/// dropped first, stays charged.
async fn grpc_web_by_its_status(b: Backend) {
    let limiter = b.limiter("10/1m");
    let mut svc = grpc_web_service(&limiter, Refund::Successes);
    let mut left = 10;
    // (path, read the body to its end, refunded): a failure at the head (16
    // UNAUTHENTICATED), a success at the head, then in the body.
    for (path, to_the_end, refunded) in [
        ("/status/16", true, false),
        ("/status/0", true, true),
        ("/body/16", true, false),
        ("/body/0", true, true),
        ("/text/5", true, false),
        ("/text/0", true, true),
        ("/body/0", false, false),
        ("/in-body", true, false),
    ] {
        let res = send_as(&mut svc, "POST", Some(WEB), path).await;
        left = answered(res, path, to_the_end, refunded, &limiter, left).await;
    }
}

#[tokio::test]
async fn grpc_web_answers_are_judged_by_their_grpc_status_not_their_200_memory() {
    grpc_web_by_its_status(Backend::memory()).await;
}

#[tokio::test]
async fn grpc_web_answers_are_judged_by_their_grpc_status_not_their_200_redis() {
    grpc_web_by_its_status(Backend::redis().await).await;
}

/// Only a gRPC or gRPC-Web call is judged by its `grpc-status`; a
/// gRPC-typed 200 to any other request stays charged. Content a client
/// chose (a file it uploaded with `content-type: application/grpc-web` and
/// a trailer frame of `grpc-status: 13`, served back to a `GET`) read as a
/// failed call, and under `ServerErrors` every download of it was
/// refunded: downloads without limit. And a failed call sent without its
/// `content-type` (tonic serves it all the same) must not pass for a
/// success by its 200 under `Successes`.
async fn only_a_grpc_call_is_judged_by_its_grpc_status(b: Backend) {
    let limiter = b.limiter("10/1m");
    let mut svc = grpc_web_service(&limiter, Refund::ServerErrors);
    let mut left = 10;
    // (method, the request's content-type, refunded): charged as the 200 it
    // is, unless the request is a gRPC-Web call.
    for (method, content_type, refunded) in [
        ("GET", None, false),
        ("GET", Some(WEB), false),
        ("POST", None, false),
        ("POST", Some("text/plain"), false),
        ("POST", Some(WEB), true),
    ] {
        for path in ["/body/13", "/status/13"] {
            let res = send_as(&mut svc, method, content_type, path).await;
            let case = format!("{method} {content_type:?} {path}");
            left = answered(res, &case, true, refunded, &limiter, left).await;
        }
    }

    // Count only failures: a failed call (16 UNAUTHENTICATED) is charged,
    // however it is sent; only a success sent as a call is refunded.
    let limiter = b.builder("10/1m").name("failures").build().unwrap();
    let mut svc = grpc_web_service(&limiter, Refund::Successes);
    let mut left = 10;
    for (method, content_type, path, refunded) in [
        ("POST", None, "/status/16", false),
        ("POST", Some("text/plain"), "/body/16", false),
        ("GET", None, "/status/0", false),
        ("POST", Some(WEB), "/status/16", false),
        ("POST", Some(WEB), "/status/0", true),
    ] {
        let res = send_as(&mut svc, method, content_type, path).await;
        let case = format!("{method} {content_type:?} {path}");
        left = answered(res, &case, true, refunded, &limiter, left).await;
    }
}

#[tokio::test]
async fn only_a_grpc_call_is_judged_by_its_grpc_status_memory() {
    only_a_grpc_call_is_judged_by_its_grpc_status(Backend::memory()).await;
}

#[tokio::test]
async fn only_a_grpc_call_is_judged_by_its_grpc_status_redis() {
    only_a_grpc_call_is_judged_by_its_grpc_status(Backend::redis().await).await;
}
