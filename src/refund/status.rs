//! The status a refund reads off a response: its HTTP status, or for a gRPC
//! response its `grpc-status`, at the head (a trailers-only answer) or in
//! the trailers.

use http::{HeaderName, StatusCode, header::CONTENT_TYPE};

use super::{Deferred, Pending};
use crate::respond::{is_grpc_content_type, is_grpc_web_content_type};

/// `grpc-status`, with a `'static` borrow for [`ResponseHead::header`].
pub(crate) static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static CONTENT_TYPE_NAME: HeaderName = CONTENT_TYPE;

/// What a refund reads off a request, for both adapters.
pub(crate) trait RequestHead {
    /// Whether the request may be a gRPC or gRPC-Web call
    /// ([`grpc_call`]), whose response is judged by its `grpc-status`.
    fn may_be_grpc(&self) -> bool;
}

impl RequestHead for http::request::Parts {
    fn may_be_grpc(&self) -> bool {
        let content_type = self
            .headers
            .get(CONTENT_TYPE)
            .map(http::HeaderValue::as_bytes);
        grpc_call(self.method == http::Method::POST, content_type)
    }
}

/// Whether a request may be a gRPC or gRPC-Web call: a POST whose
/// `content-type` is gRPC's or gRPC-Web's. Only such a request's response
/// is judged by its `grpc-status`, so that content a client chose (a file
/// it uploaded, served with the `content-type` it gave, holding a gRPC-Web
/// trailer frame) cannot pass for a failed call and have the request
/// refunded. A gRPC-typed 200 to any other request stays charged
/// ([`Outcome::Unjudged`]): a call sent without its `content-type` (tonic
/// serves it all the same) does not pass for a success by its 200.
pub(crate) fn grpc_call(post: bool, content_type: Option<&[u8]>) -> bool {
    post && content_type.is_some_and(|ct| is_grpc_content_type(ct) || is_grpc_web_content_type(ct))
}

/// What a response's head says of it, for both adapters.
pub(crate) trait ResponseHead {
    /// The HTTP status.
    fn status(&self) -> StatusCode;
    /// The first value of the header `name`.
    fn header(&self, name: &'static HeaderName) -> Option<&[u8]>;
    /// Leaves a refund that waits for the trailers where a
    /// [`TrailersLayer`](super::TrailersLayer) finds it. A response kind
    /// without trailers (actix-web's) drops it, with a warning once per
    /// layer: no refund.
    fn defer(&mut self, deferred: Deferred) {
        deferred.untaken();
    }
}

impl<B> ResponseHead for http::Response<B> {
    fn status(&self) -> StatusCode {
        http::Response::status(self)
    }

    fn header(&self, name: &'static HeaderName) -> Option<&[u8]> {
        self.headers().get(name).map(http::HeaderValue::as_bytes)
    }

    fn defer(&mut self, deferred: Deferred) {
        Pending::defer(self.extensions_mut(), deferred);
    }
}

/// A response's status, as far as its head tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The status to refund by.
    Known(StatusCode),
    /// A gRPC or gRPC-Web response with its `grpc-status` at its head: the
    /// code, if the value is one ([`grpc_code`]).
    Grpc(Option<u8>),
    /// A gRPC response whose `grpc-status` comes in its trailers.
    InTrailers,
    /// A gRPC-Web response whose `grpc-status` comes in its body (gRPC-Web
    /// sends the trailers as the body's last frame), which a
    /// [`TrailersLayer`](super::TrailersLayer) reads.
    InBody,
    /// A gRPC or gRPC-Web response (HTTP 200) to a request that is no
    /// gRPC call ([`grpc_call`]): neither its 200 (a failed call is a 200
    /// too) nor its `grpc-status` (content a client chose can carry one)
    /// says how the request went, so it stays charged.
    Unjudged,
}

impl Outcome {
    /// The outcome of the response with head `res`, to a request that
    /// may be a gRPC call if `grpc_call` ([`grpc_call`]). A gRPC response
    /// (its `content-type` is `application/grpc...`) or gRPC-Web response
    /// (`application/grpc-web...`) is HTTP 200 whatever the call's outcome:
    /// to a gRPC call its `grpc-status` decides, mapped to HTTP by
    /// [`http_status_of_code`], and never the 200; to any other request
    /// nothing does ([`Outcome::Unjudged`]). Any other response is judged
    /// by its HTTP status.
    pub(crate) fn of(res: &impl ResponseHead, grpc_call: bool) -> Outcome {
        let status = res.status();
        let content_type = res.header(&CONTENT_TYPE_NAME);
        let grpc = content_type.is_some_and(is_grpc_content_type);
        if status != StatusCode::OK || !(grpc || content_type.is_some_and(is_grpc_web_content_type))
        {
            return Outcome::Known(status);
        }
        if !grpc_call {
            return Outcome::Unjudged;
        }
        match res.header(&GRPC_STATUS) {
            Some(code) => Outcome::Grpc(grpc_code(code)),
            None if grpc => Outcome::InTrailers,
            None => Outcome::InBody,
        }
    }
}

/// The code a `grpc-status` value holds, if it holds one (a decimal number
/// up to 255; gRPC's codes are 0 to 16).
pub(crate) fn grpc_code(code: &[u8]) -> Option<u8> {
    std::str::from_utf8(code)
        .ok()
        .and_then(|c| c.trim().parse::<u8>().ok())
}

/// The HTTP status of a `grpc-status` code ([`grpc_code`]), by the mapping
/// of `google.rpc.Code` (as gRPC-HTTP gateways use): 0 `OK` is 200, 3
/// `INVALID_ARGUMENT` 400, 5 `NOT_FOUND` 404, 8 `RESOURCE_EXHAUSTED` 429, 13
/// `INTERNAL` 500, 14 `UNAVAILABLE` 503, and so on. A value that is not a
/// code (`None`) is 500, as gRPC reads it as 2 `UNKNOWN`.
pub(crate) fn http_status_of_code(code: Option<u8>) -> StatusCode {
    let http = match code {
        Some(0) => 200,
        Some(1) => 499,
        Some(3 | 9 | 11) => 400,
        Some(4) => 504,
        Some(5) => 404,
        Some(6 | 10) => 409,
        Some(7) => 403,
        Some(8) => 429,
        Some(12) => 501,
        Some(14) => 503,
        Some(16) => 401,
        // 2 UNKNOWN, 13 INTERNAL, 15 DATA_LOSS, and anything else.
        _ => 500,
    };
    StatusCode::from_u16(http).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: u16, headers: &[(&str, &str)]) -> http::Response<()> {
        let mut res = http::Response::builder().status(status);
        for (name, value) in headers {
            res = res.header(*name, *value);
        }
        res.body(()).unwrap()
    }

    #[test]
    fn grpc_codes_map_to_http() {
        let cases = [
            ("0", 200),
            ("1", 499),
            ("2", 500),
            ("3", 400),
            ("4", 504),
            ("5", 404),
            ("6", 409),
            ("7", 403),
            ("8", 429),
            ("9", 400),
            ("10", 409),
            ("11", 400),
            ("12", 501),
            ("13", 500),
            ("14", 503),
            ("15", 500),
            ("16", 401),
            ("17", 500),
            ("", 500),
            ("x", 500),
            ("256", 500),
        ];
        for (code, http) in cases {
            assert_eq!(
                http_status_of_code(grpc_code(code.as_bytes())).as_u16(),
                http,
                "{code:?}"
            );
        }
    }

    impl Outcome {
        /// [`Outcome::of`] a response to a gRPC call.
        fn of_call(res: &impl ResponseHead) -> Outcome {
            Outcome::of(res, true)
        }
    }

    #[test]
    fn a_grpc_response_is_judged_by_its_grpc_status() {
        let grpc = ("content-type", "application/grpc");
        let found = response(200, &[grpc, ("grpc-status", "5")]);
        assert_eq!(Outcome::of_call(&found), Outcome::Grpc(Some(5)));
        let ok = response(
            200,
            &[
                ("content-type", "application/grpc+proto"),
                ("grpc-status", "0"),
            ],
        );
        assert_eq!(Outcome::of_call(&ok), Outcome::Grpc(Some(0)));
        assert_eq!(
            Outcome::of_call(&response(200, &[grpc])),
            Outcome::InTrailers
        );
        // Not gRPC: the HTTP status, whatever the headers.
        let http = response(200, &[("grpc-status", "13")]);
        assert_eq!(Outcome::of_call(&http), Outcome::Known(StatusCode::OK));
        // gRPC-Web: the same at the head; without a status there, the
        // status is in the body, and a 200 is never taken for a success.
        let web = ("content-type", "application/grpc-web+proto");
        let denied = response(200, &[web, ("grpc-status", "16")]);
        assert_eq!(Outcome::of_call(&denied), Outcome::Grpc(Some(16)));
        assert_eq!(Outcome::of_call(&response(200, &[web])), Outcome::InBody);
        let text = ("content-type", "application/grpc-web-text");
        assert_eq!(Outcome::of_call(&response(200, &[text])), Outcome::InBody);
        for not_web in ["application/grpc-webx", "application/grpc-web-textual"] {
            let other = response(200, &[("content-type", not_web)]);
            assert_eq!(Outcome::of_call(&other), Outcome::Known(StatusCode::OK));
        }
        // An HTTP error from a gRPC server (a proxy, a 404 route) is what it says.
        let unavailable = response(503, &[grpc]);
        assert_eq!(
            Outcome::of_call(&unavailable),
            Outcome::Known(StatusCode::SERVICE_UNAVAILABLE)
        );
    }

    #[test]
    fn only_a_post_of_a_grpc_content_type_is_judged_as_a_call() {
        let web = b"application/grpc-web+proto".as_slice();
        assert!(grpc_call(true, Some(web)));
        assert!(grpc_call(true, Some(b"application/grpc")));
        assert!(!grpc_call(false, Some(web)), "a GET");
        assert!(!grpc_call(true, None));
        assert!(!grpc_call(true, Some(b"text/plain")));
        // A gRPC-typed 200 to any other request is judged by neither its
        // 200 nor its grpc-status; any other response by its HTTP status.
        for grpc_type in ["application/grpc-web", "application/grpc"] {
            let framed = response(200, &[("content-type", grpc_type), ("grpc-status", "13")]);
            assert_eq!(Outcome::of(&framed, false), Outcome::Unjudged);
            let bare = response(200, &[("content-type", grpc_type)]);
            assert_eq!(Outcome::of(&bare, false), Outcome::Unjudged);
            let failed = response(503, &[("content-type", grpc_type)]);
            let unavailable = Outcome::Known(StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(Outcome::of(&failed, false), unavailable);
        }
        let http = response(200, &[("content-type", "text/plain")]);
        assert_eq!(Outcome::of(&http, false), Outcome::Known(StatusCode::OK));
    }
}
