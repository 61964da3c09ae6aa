//! The concurrency limit as actix-web 4 middleware (the `actix` feature).
//!
//! [`InFlightLimitMiddleware`] is an actix
//! [`Transform`](actix_web::dev::Transform): register it with
//! `App::wrap` or `Scope::wrap`; it makes an
//! [`InFlightLimitMiddlewareService`] per worker. Keys, answers, headers and the
//! store-error policy are the tower layer's, and so is the lease's span: it is
//! held until the response body has been sent ([`LeaseBody`] is also an
//! actix [`MessageBody`]). Leases are released and renewed on the worker's
//! Tokio runtime.
//!
//! ```no_run
//! use actix_web::{App, HttpServer, web};
//! use redis_ratelimit::{
//!     RedisStore,
//!     concurrency::{ConcurrencyLimiter, actix::InFlightLimitMiddleware},
//!     key::PeerIp,
//! };
//!
//! fn main() -> std::io::Result<()> {
//!     actix_web::rt::System::new().block_on(async {
//!         let store = RedisStore::connect("redis://127.0.0.1:6379").await.map_err(std::io::Error::other)?;
//!         let limiter = ConcurrencyLimiter::builder(10).store(store).build().unwrap();
//!         let limit = InFlightLimitMiddleware::new(limiter, PeerIp);
//!         HttpServer::new(move || {
//!             App::new()
//!                 .wrap(limit.clone())
//!                 .route("/", web::get().to(|| async { "ok" }))
//!         })
//!         .bind("127.0.0.1:3000")?
//!         .run()
//!         .await
//!     })
//! }
//! ```

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use actix_web::{
    body::{BodySize, MessageBody},
    web::Bytes,
};

use super::{ConcurrencyLimiter, LeaseBody};
use crate::{
    DefaultResponse,
    actix::{LimitMiddleware, LimitMiddlewareService},
    core::Core,
    key::KeyExtractor,
};

/// The actix middleware service, renamed [`InFlightLimitMiddlewareService`].
#[deprecated(note = "renamed `InFlightLimitMiddlewareService`")]
pub type ConcurrencyLimitMiddleware<S, K, R> = InFlightLimitMiddlewareService<S, K, R>;

/// Limits how many requests per key are in flight at once in an actix-web
/// app or scope, keyed by a [`KeyExtractor`] of actix's `ServiceRequest`:
/// the actix counterpart of [`InFlightLimitLayer`](super::InFlightLimitLayer),
/// a [`LimitMiddleware`] over a [`ConcurrencyLimiter`].
///
/// Clones, and every service they make, share one `Arc` of state.
pub type InFlightLimitMiddleware<K, R = DefaultResponse> =
    LimitMiddleware<K, R, ConcurrencyLimiter>;

/// The actix-web service made by [`InFlightLimitMiddleware`].
///
/// Readiness is the inner service's; a full key is answered with a 429
/// response, never an error. An error of the services inside ends the
/// request's lease and is passed on as an
/// [`InnerError`](crate::actix::InnerError), with the headers.
pub type InFlightLimitMiddlewareService<S, K, R> =
    LimitMiddlewareService<S, K, R, ConcurrencyLimiter>;

impl<K: KeyExtractor<actix_web::dev::ServiceRequest>> InFlightLimitMiddleware<K> {
    /// Limits with `limiter`, keying requests with `extractor`, as
    /// [`InFlightLimitLayer::new`](crate::concurrency::InFlightLimitLayer::new)
    /// does: skips honoured, one key a request.
    ///
    /// # Panics
    ///
    /// If `extractor` gives more than one key a request (`key::each`).
    pub fn new(limiter: ConcurrencyLimiter, extractor: K) -> Self {
        crate::core::assert_one_key("InFlightLimitMiddleware::new", extractor.key_count());
        Self::from_core(Core::new(limiter, extractor, DefaultResponse))
    }
}

impl<B: MessageBody> MessageBody for LeaseBody<B> {
    type Error = B::Error;

    fn size(&self) -> BodySize {
        self.get_ref().size()
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        self.poll_inner(cx, B::poll_next)
    }
}
