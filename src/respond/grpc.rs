//! gRPC answers: [`GrpcResponse`], and how a gRPC call is recognised.

use std::time::Duration;

use http::{HeaderName, HeaderValue, Response, StatusCode, header::CONTENT_TYPE};
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

use super::{Rejection, Respond};

/// `grpc-status`.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`.
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// `grpc-retry-pushback-ms`: gRFC A6 server pushback.
const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// gRPC's percent-encoding of `grpc-message`: every byte outside printable
/// ASCII, and `%` itself.
const GRPC_MESSAGE_SET: &AsciiSet = &CONTROLS.add(b'%');

/// Whether a request's `content-type` value marks a gRPC call:
/// `application/grpc`, or `application/grpc+<codec>` (parameters after `;`
/// allowed). A prefix comparison, no allocation.
pub(crate) fn is_grpc_content_type(ct: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    match ct.get(..GRPC.len()) {
        Some(prefix) if prefix.eq_ignore_ascii_case(GRPC) => {
            matches!(ct.get(GRPC.len()), None | Some(b'+' | b';'))
        }
        _ => false,
    }
}

impl Rejection {
    /// The gRPC status code a gRPC call gets for this rejection (see
    /// [`GrpcResponse`]): 8 `RESOURCE_EXHAUSTED` when over a limit, 14
    /// `UNAVAILABLE` when the store failed, and a code matching the key
    /// error's HTTP status when there is no key. With tonic:
    /// `tonic::Code::from(rejection.grpc_code())`.
    pub fn grpc_code(&self) -> i32 {
        match self {
            Rejection::Denied(_) | Rejection::Busy(_) | Rejection::CostExceedsLimit { .. } => {
                RESOURCE_EXHAUSTED
            }
            Rejection::StoreUnavailable(_) => UNAVAILABLE,
            Rejection::KeyUnavailable(e) => code_for_status(e.status()),
        }
    }

    /// How long to wait before retrying, when the rejection says.
    fn retry_after(&self) -> Option<Duration> {
        match self {
            Rejection::Denied(d) => d.retry_after(),
            Rejection::Busy(b) => Some(b.retry_after()),
            _ => None,
        }
    }
}

const RESOURCE_EXHAUSTED: i32 = 8;
const UNAVAILABLE: i32 = 14;

/// The gRPC code for an HTTP status, following google.rpc.Code's HTTP
/// mapping read backwards.
fn code_for_status(status: StatusCode) -> i32 {
    match status.as_u16() {
        400 => 3,  // INVALID_ARGUMENT
        401 => 16, // UNAUTHENTICATED
        403 => 7,  // PERMISSION_DENIED
        404 => 5,  // NOT_FOUND
        409 => 10, // ABORTED
        429 => RESOURCE_EXHAUSTED,
        499 => 1,  // CANCELLED
        501 => 12, // UNIMPLEMENTED
        503 => UNAVAILABLE,
        504 => 4,                            // DEADLINE_EXCEEDED
        _ if status.is_client_error() => 9,  // FAILED_PRECONDITION
        _ if status.is_server_error() => 13, // INTERNAL
        _ => 2,                              // UNKNOWN
    }
}

/// What `grpc-message` says. Fixed texts: store errors and a custom
/// extractor's reason are for logs, not for clients.
fn message(rejection: &Rejection) -> &'static str {
    match rejection {
        Rejection::Denied(_) => "rate limit exceeded",
        Rejection::Busy(_) => "concurrency limit exceeded",
        Rejection::CostExceedsLimit { .. } => "request cost exceeds the rate limit",
        Rejection::StoreUnavailable(_) => "rate limit store unavailable",
        Rejection::KeyUnavailable(e) if e.is_server_error() => "rate limit key unavailable",
        Rejection::KeyUnavailable(_) => "no rate limit key for the request",
    }
}

/// `text` percent-encoded as `grpc-message` requires.
fn grpc_message(text: &str) -> HeaderValue {
    let encoded = utf8_percent_encode(text, GRPC_MESSAGE_SET).to_string();
    HeaderValue::try_from(encoded).unwrap_or(HeaderValue::from_static("rate limited"))
}

/// The trailers-only gRPC response for a rejection; the rate-limit headers
/// are added by the layer afterwards, as for HTTP.
pub(crate) fn response<B: Default>(rejection: &Rejection) -> Response<B> {
    let mut res = Response::new(B::default());
    let headers = res.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(GRPC_STATUS, rejection.grpc_code().into());
    headers.insert(GRPC_MESSAGE, grpc_message(message(rejection)));
    if let Some(wait) = rejection.retry_after() {
        // At least 1 ms: a pushback of 0 would have the client retry at
        // once (a custom store may answer a denial with no wait left).
        let ms = u64::try_from(wait.as_nanos().div_ceil(1_000_000))
            .unwrap_or(u64::MAX)
            .max(1);
        headers.insert(GRPC_RETRY_PUSHBACK_MS, ms.into());
    } else if matches!(rejection, Rejection::CostExceedsLimit { .. }) {
        // No wait can admit it: a negative pushback asks the client's retry
        // policy not to retry (gRFC A6), where RESOURCE_EXHAUSTED alone may.
        headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
    }
    res
}

/// gRPC answers: a rejected gRPC call gets a trailers-only gRPC response
/// instead of an HTTP error status, which a gRPC client would see as
/// `UNAVAILABLE` ("mapped from HTTP status code 429") and retry.
///
/// A request is gRPC when it is a `POST` whose `content-type` is
/// `application/grpc` or `application/grpc+<codec>`, over HTTP/2 or later
/// or with `te: trailers` (as tonic-web passes a gRPC-Web call on).
/// `grpc-web` itself is not, nor is a `GET` or an HTTP/1.1 request without
/// `te: trailers` that claims a gRPC `content-type`: those are answered as
/// HTTP, since a gRPC answer's HTTP 200 would read as a success to them
/// (and to a cache on the way).
/// Its rejection is answered with HTTP 200, `content-type: application/grpc`,
/// no body, and:
///
/// | rejection | `grpc-status` |
/// |---|---|
/// | [`Rejection::Denied`], [`Rejection::Busy`], [`Rejection::CostExceedsLimit`] | 8 `RESOURCE_EXHAUSTED` |
/// | [`Rejection::StoreUnavailable`] | 14 `UNAVAILABLE` |
/// | [`Rejection::KeyUnavailable`] | from the key error's status: 400 → 3 `INVALID_ARGUMENT`, 401 → 16, 403 → 7, 500 → 13 `INTERNAL`, ... |
///
/// `grpc-message` says why (percent-encoded, as gRPC requires). A denied or
/// busy call also carries its retry hint as metadata: `retry-after` (whole
/// seconds, as for HTTP, with `ratelimit` and `ratelimit-policy`) and
/// `grpc-retry-pushback-ms`, the server pushback a gRPC client's retry
/// policy honours (gRFC A6). A cost no window can hold gets a pushback of
/// `-1`, which asks the client not to retry.
///
/// The [`DefaultResponse`](super::DefaultResponse) answers gRPC calls this
/// way and everything else with an HTTP status. `GrpcResponse` answers every
/// rejection as a gRPC call, whatever the request's `content-type`; use it
/// for a gRPC-only server, or call it from your own [`Respond`]:
///
/// ```
/// use redis_ratelimit::{Limiter, Quota, RateLimitLayer, key::Global, respond::GrpcResponse};
///
/// let layer = RateLimitLayer::new(Limiter::new(Quota::per_second(10)), Global)
///     .responder(GrpcResponse);
/// # let _ = layer;
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcResponse;

impl<B: Default> Respond<Response<B>> for GrpcResponse {
    fn respond(&self, rejection: &Rejection) -> Response<B> {
        response(rejection)
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, Method, Version};

    use super::*;
    use crate::{Error, Limiter, Quota, key::KeyError, respond::Format};

    fn headers(content_type: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_str(content_type).unwrap());
        h
    }

    /// A gRPC call's format: a POST over HTTP/2.
    fn call_format(headers: &HeaderMap) -> Format {
        Format::of_request(&Method::POST, Version::HTTP_2, headers)
    }

    #[test]
    fn detects_grpc_content_types_only() {
        for ct in [
            "application/grpc",
            "application/grpc+proto",
            "application/grpc+json",
            "Application/GRPC",
            "application/grpc;charset=utf-8",
        ] {
            assert_eq!(call_format(&headers(ct)), Format::Grpc, "{ct}");
        }
        for ct in [
            "application/grpc-web",
            "application/grpc-web+proto",
            "application/grpcx",
            "application/json",
            "application/gr",
            "",
        ] {
            assert_ne!(call_format(&headers(ct)), Format::Grpc, "{ct}");
        }
        assert_ne!(call_format(&HeaderMap::new()), Format::Grpc);
    }

    /// A gRPC answer is an HTTP 200: only a request that can be a gRPC call
    /// gets one, never a GET (which a cache could store) or an HTTP/1.1
    /// request that does not ask for trailers.
    #[test]
    fn only_a_grpc_call_gets_a_grpc_answer() {
        let grpc = headers("application/grpc");
        let mut with_te = grpc.clone();
        with_te.insert(http::header::TE, HeaderValue::from_static("trailers"));
        let mut with_te_list = grpc.clone();
        with_te_list.insert(
            http::header::TE,
            HeaderValue::from_static("gzip;q=0.5, Trailers"),
        );
        let cases = [
            (Method::POST, Version::HTTP_2, &grpc, Format::Grpc),
            (Method::POST, Version::HTTP_3, &grpc, Format::Grpc),
            (Method::POST, Version::HTTP_11, &with_te, Format::Grpc),
            (Method::POST, Version::HTTP_11, &with_te_list, Format::Grpc),
            (Method::POST, Version::HTTP_11, &grpc, Format::Text),
            (Method::POST, Version::HTTP_10, &grpc, Format::Text),
            (Method::GET, Version::HTTP_11, &with_te, Format::Text),
            (Method::GET, Version::HTTP_2, &grpc, Format::Text),
            (Method::PUT, Version::HTTP_2, &grpc, Format::Text),
        ];
        for (method, version, headers, want) in cases {
            assert_eq!(
                Format::of_request(&method, version, headers),
                want,
                "{method} {version:?} {headers:?}"
            );
        }
    }

    async fn denied() -> Rejection {
        let limiter = Limiter::new(Quota::per_minute(1));
        limiter.check("k", 1).await.unwrap();
        let d = limiter.check("k", 1).await.unwrap();
        assert!(!d.is_allowed());
        Rejection::Denied(d)
    }

    #[tokio::test]
    async fn denied_is_trailers_only_resource_exhausted_with_pushback() {
        let res: Response<String> = response(&denied().await);
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["content-type"], "application/grpc");
        assert_eq!(res.headers()["grpc-status"], "8");
        assert_eq!(res.headers()["grpc-message"], "rate limit exceeded");
        let ms: u64 = res.headers()["grpc-retry-pushback-ms"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(ms > 0 && ms <= 60_000, "{ms}");
        assert!(res.body().is_empty());
    }

    #[test]
    fn a_denial_with_no_wait_left_pushes_back_one_ms() {
        // A custom store may answer a denial with 0 ms left.
        let policies = std::sync::Arc::new(crate::headers::Policies::new(&[(
            "default".into(),
            Quota::per_minute(5),
        )]));
        let state = crate::store::LimitState {
            allowed: false,
            remaining: 0,
            reset_ms: 0,
            retry_ms: 0,
        };
        let d = crate::Decision::new(vec![state], policies);
        let res: Response<String> = response(&Rejection::Denied(d));
        assert_eq!(res.headers()["grpc-retry-pushback-ms"], "1");
    }

    #[test]
    fn store_and_key_errors_map_to_their_codes() {
        let res: Response<String> = response(&Rejection::StoreUnavailable(Error::CircuitOpen));
        assert_eq!(res.headers()["grpc-status"], "14");
        assert_eq!(
            res.headers()["grpc-message"],
            "rate limit store unavailable"
        );
        assert!(res.headers().get("grpc-retry-pushback-ms").is_none());
        let missing = KeyError::MissingHeader(HeaderName::from_static("x-api-key"));
        let res: Response<String> = response(&Rejection::KeyUnavailable(missing));
        assert_eq!(res.headers()["grpc-status"], "3");
        let res: Response<String> = response(&Rejection::KeyUnavailable(KeyError::NoPeerAddr));
        assert_eq!(res.headers()["grpc-status"], "13");
        let res: Response<String> = response(&Rejection::CostExceedsLimit { cost: 5, limit: 1 });
        assert_eq!(res.headers()["grpc-status"], "8");
        assert_eq!(res.headers()["grpc-retry-pushback-ms"], "-1", "never retry");
        let status = |s: u16| code_for_status(StatusCode::from_u16(s).unwrap());
        assert_eq!(
            [400, 401, 403, 404, 418, 429, 500, 502, 503, 504].map(status),
            [3, 16, 7, 5, 9, 8, 13, 13, 14, 4]
        );
    }

    #[test]
    fn grpc_message_is_percent_encoded() {
        assert_eq!(grpc_message("50% über\n"), "50%25 %C3%BCber%0A");
        assert_eq!(grpc_message("plain text: ok"), "plain text: ok");
    }
}
