//! gRPC answers: [`GrpcResponse`], and how a gRPC call is recognised.

use std::time::Duration;

use http::{HeaderName, HeaderValue, Response, StatusCode, header::CONTENT_TYPE};
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

use super::{Rejection, Respond, format::CONTENT_TYPE_NAME};
use crate::{headers::HeaderSink, refund::ResponseHead};

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

/// A gRPC-Web `content-type` value, read: whether it is the text (base64)
/// form, `application/grpc-web-text`, and its codec (what follows `+`,
/// before any parameter; empty without one). `None` for anything that is
/// not `application/grpc-web` or `application/grpc-web-text`, each with an
/// optional `+<codec>` and parameters (ASCII case ignored).
fn grpc_web_parts(ct: &[u8]) -> Option<(bool, &[u8])> {
    const WEB: &[u8] = b"application/grpc-web";
    if !ct.get(..WEB.len())?.eq_ignore_ascii_case(WEB) {
        return None;
    }
    let rest = &ct[WEB.len()..];
    let (text, rest) = match rest.get(..5) {
        Some(text) if text.eq_ignore_ascii_case(b"-text") => (true, &rest[5..]),
        _ => (false, rest),
    };
    // `split` yields at least one piece: what comes before any parameter.
    let media = rest.split(|&b| b == b';').next()?;
    match media.split_first() {
        None => Some((text, &[])),
        Some((b'+', codec)) => Some((text, codec.trim_ascii())),
        Some(_) => None,
    }
}

/// Whether a `content-type` value marks gRPC-Web: `application/grpc-web`
/// or `application/grpc-web-text`, each with an optional `+<codec>` and
/// parameters (ASCII case ignored).
pub(crate) fn is_grpc_web_content_type(ct: &[u8]) -> bool {
    grpc_web_parts(ct).is_some()
}

/// For a gRPC-Web `content-type` value ([`is_grpc_web_content_type`]),
/// whether it is `application/grpc-web-text` (the body in base64); `None`
/// for any other.
pub(crate) fn grpc_web_text(ct: &[u8]) -> Option<bool> {
    grpc_web_parts(ct).map(|(text, _)| text)
}

/// The `content-type` of a gRPC answer to a call whose `content-type` is
/// `request`, when that is gRPC-Web: the request's own media type,
/// lowercased and without parameters (`application/grpc-web-text+proto`
/// for `Application/grpc-web-text+Proto; charset=utf-8`), which keeps the
/// text form and the codec a gRPC-Web client reads the answer by. A codec
/// that is not a token is left out (`application/grpc-web`). `None` for a
/// request that is not gRPC-Web.
pub(crate) fn grpc_web_answer_type(request: &[u8]) -> Option<HeaderValue> {
    let (text, codec) = grpc_web_parts(request)?;
    let family: &[u8] = if text {
        b"application/grpc-web-text"
    } else {
        b"application/grpc-web"
    };
    let mut value = family.to_vec();
    if super::format::is_token(codec) {
        value.push(b'+');
        value.extend(codec.iter().map(u8::to_ascii_lowercase));
    }
    HeaderValue::from_bytes(&value).ok()
}

/// Gives a trailers-only gRPC answer (HTTP 200, a gRPC `content-type`, its
/// `grpc-status` at the head) the `content-type` of the gRPC-Web call it
/// answers ([`grpc_web_answer_type`]), as a gRPC-Web translation (tonic-web,
/// Envoy's `grpc_web` filter) does: a trailers-only answer is the same in
/// both protocols but for its type, since gRPC-Web sends a trailers-only
/// answer's trailers as headers too. Any other answer is left as it is: an
/// HTTP error, one without `grpc-status` at its head, or one whose type is
/// not gRPC.
pub(crate) fn answer_as_grpc_web(res: &mut (impl HeaderSink + ResponseHead), web: HeaderValue) {
    if res.status() == StatusCode::OK
        && res
            .header(&CONTENT_TYPE_NAME)
            .is_some_and(is_grpc_content_type)
        && res.header(&crate::refund::GRPC_STATUS).is_some()
    {
        res.insert(CONTENT_TYPE, web);
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
/// Its rejection is answered with HTTP 200, `content-type: application/grpc`
/// (a gRPC-Web call's own type instead: see [below](#grpc-web)), no body,
/// and:
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
///
/// # gRPC-Web
///
/// A gRPC-Web call reaches the layer when the layer is outside the gRPC-Web
/// translation (tonic-web's `GrpcWebLayer` inside it) or the server speaks
/// gRPC-Web itself. Its `content-type` is `application/grpc-web` or
/// `application/grpc-web-text` (base64), each with an optional `+<codec>`,
/// and its client reads the answer by that type. So the layer gives a
/// trailers-only gRPC answer to a gRPC-Web call the call's own media type,
/// lowercased and without parameters: `application/grpc-web+proto` for
/// `application/grpc-web+proto`, `application/grpc-web-text` for
/// `application/grpc-web-text`, and so on. A plain gRPC call keeps
/// `application/grpc`. The layer does this after the responder runs,
/// whichever responder built the answer (a custom [`Respond`] that calls
/// `GrpcResponse` too): `GrpcResponse::respond` on its own has no request
/// to read, and says `application/grpc`.
///
/// The answer stays trailers-only: HTTP 200, `grpc-status`, `grpc-message`
/// and the retry hints as headers, no body. The gRPC-Web protocol allows
/// this ("trailers may be sent together with response headers, with no
/// message in the body"), and gRPC-Web clients (grpc-web's JavaScript
/// client, tonic-web's) read the call's status from those headers. A
/// browser sees them only where CORS exposes them
/// (`Access-Control-Expose-Headers: grpc-status, grpc-message`), as for
/// every gRPC-Web answer. The [`DefaultResponse`](super::DefaultResponse)
/// answers a gRPC-Web call with an HTTP status (429), as above.
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
    fn a_grpc_web_call_is_answered_in_its_own_family_and_codec() {
        let cases = [
            ("application/grpc-web", Some("application/grpc-web")),
            (
                "application/grpc-web+proto",
                Some("application/grpc-web+proto"),
            ),
            (
                "application/grpc-web+json",
                Some("application/grpc-web+json"),
            ),
            (
                "application/grpc-web-text",
                Some("application/grpc-web-text"),
            ),
            (
                "application/grpc-web-text+proto",
                Some("application/grpc-web-text+proto"),
            ),
            (
                "Application/GRPC-Web-Text+Proto; charset=utf-8",
                Some("application/grpc-web-text+proto"),
            ),
            (
                "application/grpc-web;charset=utf-8",
                Some("application/grpc-web"),
            ),
            (
                "application/grpc-web+proto ;x=y",
                Some("application/grpc-web+proto"),
            ),
            // A codec that is not a token: the family alone.
            ("application/grpc-web+", Some("application/grpc-web")),
            (
                "application/grpc-web-text+a/b",
                Some("application/grpc-web-text"),
            ),
            ("application/grpc", None),
            ("application/grpc+proto", None),
            ("application/grpc-webx", None),
            ("application/grpc-web-textual", None),
            ("application/grpc-we", None),
            ("text/plain", None),
            ("", None),
        ];
        for (request, want) in cases {
            let got = grpc_web_answer_type(request.as_bytes());
            assert_eq!(got.as_ref().map(|v| v.to_str().unwrap()), want, "{request}");
            assert_eq!(is_grpc_web_content_type(request.as_bytes()), want.is_some());
        }
    }

    #[tokio::test]
    async fn only_a_trailers_only_grpc_answer_takes_the_grpc_web_type() {
        let web = HeaderValue::from_static("application/grpc-web-text+proto");
        let mut res: Response<String> = response(&denied().await);
        answer_as_grpc_web(&mut res, web.clone());
        assert_eq!(res.headers()["content-type"], web);
        assert_eq!(res.headers()["grpc-status"], "8");
        // An HTTP answer, a gRPC answer without its status at the head, and
        // an answer of another type are left as they are.
        let http = Response::builder()
            .status(429)
            .header("content-type", "application/grpc")
            .header("grpc-status", "8");
        let no_status = Response::builder().header("content-type", "application/grpc");
        let other = Response::builder()
            .header("content-type", "application/json")
            .header("grpc-status", "8");
        for builder in [http, no_status, other] {
            let mut res = builder.body(String::new()).unwrap();
            let before = res.headers().clone();
            answer_as_grpc_web(&mut res, web.clone());
            assert_eq!(res.headers(), &before);
        }
    }

    #[test]
    fn grpc_message_is_percent_encoded() {
        assert_eq!(grpc_message("50% über\n"), "50%25 %C3%BCber%0A");
        assert_eq!(grpc_message("plain text: ok"), "plain text: ok");
    }
}
