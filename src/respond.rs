//! What the middleware answers when it does not pass a request on:
//! [`Rejection`], the [`Respond`] hook and the [`OnStoreError`] policy.
//!
//! | case | default status | default body (text) | rate-limit headers |
//! |---|---|---|---|
//! | [`Rejection::Denied`]: over the quota | 429 | `rate limit exceeded; retry in 12 s` | `Retry-After`, `RateLimit`, `RateLimit-Policy` |
//! | [`Rejection::Busy`]: the key's concurrency limit is in flight | 429 | `too many concurrent requests; retry in 1 s` | `Retry-After`, `RateLimit`, `RateLimit-Policy` |
//! | [`Rejection::KeyUnavailable`]: no key for the request | the [`KeyError`]'s (400, 500, ...) | `missing rate limit key: header x-api-key` (400, [`KeyError::MissingHeader`]), `rate limit key too long: header x-api-key` (400, [`KeyError::HeaderTooLong`]), `rate limit key unavailable` (500, [`KeyError::NoPeerAddr`]), `request refused by the rate limiter` ([`KeyError::Rejected`]'s status: a custom extractor's refusal, or 500 for its wrong number of keys) | none |
//! | [`Rejection::StoreUnavailable`]: store failed, policy [`OnStoreError::Deny`] | 503 | `rate limit store unavailable` | none |
//! | [`Rejection::CostExceedsLimit`]: a cost no window can hold | 429 | `request cost 9 exceeds the rate limit of 5` | none (there is nothing to wait for) |
//!
//! The bodies of [`DefaultResponse`] say what to do and nothing internal:
//! never a store error, a key's value or a custom extractor's reason (those
//! go to the logs). They are `text/plain; charset=utf-8`, unless the
//! request's `Accept` prefers `application/problem+json` or
//! `application/json` to `text/plain` ([`Format`]): then they are RFC 9457
//! problem details, `application/problem+json` (or `application/json`, for
//! a client whose `Accept` refuses `application/problem+json`). A denial by quota (or by
//! concurrency) uses the problem type of the IETF draft "RateLimit header
//! fields for HTTP" (draft-ietf-httpapi-ratelimit-headers-11, section 5.1),
//! with `violated-policies` naming the limits that denied (never a shadow
//! limit):
//!
//! ```text
//! {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
//!  "title":"Quota Exceeded","status":429,
//!  "detail":"rate limit exceeded; retry in 12 s","violated-policies":["burst"]}
//! ```
//!
//! Every other rejection is `about:blank` with the status's reason phrase as
//! its title, e.g. `{"type":"about:blank","title":"Service
//! Unavailable","status":503,"detail":"rate limit store unavailable"}`.
//! The tower and actix adapters build the same bodies from the same code.
//!
//! The rate-limit headers are added after [`Respond::respond`] runs, so a
//! custom response keeps them:
//!
//! ```
//! use axum::{Router, routing::get};
//! use http::Response;
//! use redis_ratelimit::{Limiter, Quota, RateLimitLayer, key::Global};
//!
//! let layer = RateLimitLayer::new(Limiter::new(Quota::per_second(10)), Global)
//!     .respond_with(|r| {
//!         Response::builder()
//!             .status(r.status())
//!             .header("content-type", "application/json")
//!             .body(format!(r#"{{"error":"{}"}}"#, r.status().as_u16()))
//!             .unwrap()
//!     });
//! // The `String` body converts into axum's `Body`.
//! let app: Router = Router::new().route("/", get(|| async { "ok" })).layer(layer);
//! # let _ = app;
//! ```

use std::any::Any;

use http::{HeaderValue, Response, StatusCode, header::CONTENT_TYPE};

use crate::{Decision, Error, concurrency::Busy, key::KeyError};

mod format;
mod grpc;
pub(crate) mod problem;

pub(crate) use self::format::Asked;
#[cfg(feature = "actix")]
pub(crate) use self::format::Call;
pub use self::format::{ACCEPT_MAX, Format};
pub use self::grpc::GrpcResponse;
pub(crate) use self::grpc::answer_as_grpc_web;
pub(crate) use self::grpc::{grpc_web_text, is_grpc_content_type, is_grpc_web_content_type};

/// What to do when the store fails or times out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnStoreError {
    /// Let the request through without rate-limit headers, and log the error
    /// at `warn` (at most once a second, with a count of the rest). The
    /// default: a Redis outage must not take the API down.
    #[default]
    Allow,
    /// Answer 503 Service Unavailable ([`Rejection::StoreUnavailable`]).
    Deny,
}

/// Why the middleware answered a request itself instead of passing it on.
#[derive(Debug)]
#[non_exhaustive]
pub enum Rejection {
    /// The key is over its quota.
    Denied(Decision),
    /// The key already has its limit of requests in flight (the
    /// [`InFlightLimitLayer`](crate::concurrency::InFlightLimitLayer)).
    Busy(Busy),
    /// No key could be derived for the request.
    KeyUnavailable(KeyError),
    /// The store failed or timed out and the policy is [`OnStoreError::Deny`].
    StoreUnavailable(Error),
    /// The request's cost is larger than the quota's limit.
    CostExceedsLimit {
        /// The request's cost.
        cost: u64,
        /// The quota's limit.
        limit: u64,
    },
}

impl Rejection {
    /// The status the default response uses.
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::Denied(_) | Rejection::Busy(_) | Rejection::CostExceedsLimit { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            Rejection::KeyUnavailable(e) => e.status(),
            Rejection::StoreUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The decision, when the request was denied by its quota.
    pub fn decision(&self) -> Option<&Decision> {
        match self {
            Rejection::Denied(d) => Some(d),
            _ => None,
        }
    }
}

/// Builds the response of type `Res` for a [`Rejection`]: `http::Response<B>`
/// under tower, `actix_web::HttpResponse` under actix. Implemented by
/// [`DefaultResponse`], by [`FromFn`] (what `respond_with` makes of a
/// closure) and by every `Fn(&Rejection) -> Res` closure. Give an
/// implementation to a layer's `responder(..)`.
pub trait Respond<Res>: Send + Sync + 'static {
    /// The response to send. Rate-limit headers are added afterwards, and a
    /// trailers-only gRPC answer (HTTP 200, `content-type:
    /// application/grpc`, `grpc-status`) to a gRPC-Web call gets the call's
    /// gRPC-Web `content-type` (see [`GrpcResponse`](GrpcResponse#grpc-web)).
    fn respond(&self, rejection: &Rejection) -> Res;

    /// The response for a request whose headers ask for `format` (a gRPC
    /// call is [`Format::Grpc`]): what the middleware calls. By default
    /// [`respond`](Self::respond), which ignores the format.
    fn respond_as(&self, rejection: &Rejection, format: Format) -> Res {
        let _ = format;
        self.respond(rejection)
    }
}

/// The default answer: [`Rejection::status`] with a short body in the
/// [`Format`] the request asks for (see the [module docs](self)); a gRPC
/// call gets [`GrpcResponse`]'s trailers-only answer with
/// [`Rejection::grpc_code`] instead.
///
/// Under tower the body is written into `String`, `Vec<u8>`, `Bytes`,
/// `http_body_util::Full<Bytes>` and `axum::body::Body` responses, and into
/// those inside the [`LeaseBody`](crate::concurrency::LeaseBody) of one or
/// two in-flight limits below the layer; any other body type (a boxed body,
/// say) gets its `Default`, empty and without `Content-Type`. Use
/// [`respond_with`](crate::RateLimitLayer::respond_with) for those (a
/// `LeaseBody` is made `From` its body).
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultResponse;

impl<B: Default + Any> Respond<Response<B>> for DefaultResponse {
    fn respond(&self, rejection: &Rejection) -> Response<B> {
        self.respond_as(rejection, Format::Text)
    }

    fn respond_as(&self, rejection: &Rejection, format: Format) -> Response<B> {
        if format == Format::Grpc {
            return GrpcResponse.respond(rejection);
        }
        let mut res = Response::new(B::default());
        *res.status_mut() = rejection.status();
        let body = problem::body(rejection, format);
        if problem::fill(res.body_mut(), body.text) {
            let content_type = HeaderValue::from_static(body.content_type);
            res.headers_mut().insert(CONTENT_TYPE, content_type);
        }
        res
    }
}

impl<Res, F> Respond<Res> for F
where
    F: Fn(&Rejection) -> Res + Send + Sync + 'static,
{
    fn respond(&self, rejection: &Rejection) -> Res {
        self(rejection)
    }
}

/// A `Fn(&Rejection) -> http::Response<B>` closure as a [`Respond`] for any
/// response body that `B` converts [`Into`]: made by
/// [`RateLimitLayer::respond_with`](crate::RateLimitLayer::respond_with), so
/// a closure returning `Response<String>` (or axum's `Response`) fits a
/// service whose body is axum's `Body`, hyper's, or anything `From<B>`.
#[derive(Clone, Copy)]
pub struct FromFn<F>(F);

impl<F> FromFn<F> {
    /// Wraps `f`.
    pub fn new(f: F) -> Self {
        Self(f)
    }
}

impl<F> std::fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FromFn(..)")
    }
}

impl<F, B, ResBody> Respond<Response<ResBody>> for FromFn<F>
where
    F: Fn(&Rejection) -> Response<B> + Send + Sync + 'static,
    B: Into<ResBody>,
{
    fn respond(&self, rejection: &Rejection) -> Response<ResBody> {
        (self.0)(rejection).map(Into::into)
    }
}
