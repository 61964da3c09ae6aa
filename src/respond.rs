//! What the middleware answers when it does not pass a request on:
//! [`Rejection`], the [`Respond`] hook and the [`OnStoreError`] policy.
//!
//! | case | default status | rate-limit headers |
//! |---|---|---|
//! | [`Rejection::Denied`]: over the quota | 429 | `Retry-After`, `RateLimit`, `RateLimit-Policy` |
//! | [`Rejection::Busy`]: the key's concurrency limit is in flight | 429 | `Retry-After`, `RateLimit`, `RateLimit-Policy` |
//! | [`Rejection::KeyUnavailable`]: no key for the request | the [`KeyError`]'s (400, 500, ...) | none |
//! | [`Rejection::StoreUnavailable`]: store failed, policy [`OnStoreError::Deny`] | 503 | none |
//! | [`Rejection::CostExceedsLimit`]: a cost no window can hold | 429 | none (there is nothing to wait for) |
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

use http::{Response, StatusCode};

use crate::{Decision, Error, concurrency::Busy, key::KeyError};

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
    /// The response to send. Rate-limit headers are added afterwards.
    fn respond(&self, rejection: &Rejection) -> Res;
}

/// The default answer: [`Rejection::status`] with an empty body.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultResponse;

impl<B: Default> Respond<Response<B>> for DefaultResponse {
    fn respond(&self, rejection: &Rejection) -> Response<B> {
        let mut res = Response::new(B::default());
        *res.status_mut() = rejection.status();
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
