//! The concurrency limit as actix-web 4 middleware (the `actix` feature).
//!
//! [`InFlightLimitMiddleware`] is an actix [`Transform`]: register it with
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
    fmt,
    future::{Ready, ready},
    pin::Pin,
    rc::Rc,
    sync::Arc,
    task::{Context, Poll},
};

use actix_web::{
    HttpResponse,
    body::{BodySize, EitherBody, MessageBody},
    dev::{Service, ServiceRequest, ServiceResponse, Transform, forward_ready},
    web::Bytes,
};

use super::{ConcurrencyLimiter, LeaseBody};
use crate::{
    DefaultResponse, OnStoreError, Rejection, Respond,
    actix::{MiddlewareFuture, answer},
    core::Core,
    key::KeyExtractor,
};

/// The actix middleware service, renamed [`InFlightLimitMiddlewareService`].
#[deprecated(note = "renamed `InFlightLimitMiddlewareService`")]
pub type ConcurrencyLimitMiddleware<S, K, R> = InFlightLimitMiddlewareService<S, K, R>;

/// Limits how many requests per key are in flight at once in an actix-web
/// app or scope, keyed by a [`KeyExtractor`] of actix's `ServiceRequest`:
/// the actix counterpart of [`InFlightLimitLayer`](super::InFlightLimitLayer).
///
/// Clones, and every service they make, share one `Arc` of state.
#[derive(Debug)]
pub struct InFlightLimitMiddleware<K, R = DefaultResponse> {
    core: Arc<Core<K, R, ConcurrencyLimiter>>,
}

impl<K, R> Clone for InFlightLimitMiddleware<K, R> {
    fn clone(&self) -> Self {
        Self {
            core: self.core.clone(),
        }
    }
}

impl<K: KeyExtractor<ServiceRequest>> InFlightLimitMiddleware<K> {
    /// Limits with `limiter`, keying requests with `extractor`.
    pub fn new(limiter: ConcurrencyLimiter, extractor: K) -> Self {
        Self {
            core: Arc::new(Core::new(limiter, extractor, DefaultResponse)),
        }
    }
}

/// Serves a tower layer's configuration under actix, sharing its state.
impl<K: KeyExtractor<ServiceRequest>, R> From<super::InFlightLimitLayer<K, R>>
    for InFlightLimitMiddleware<K, R>
{
    fn from(layer: super::InFlightLimitLayer<K, R>) -> Self {
        Self {
            core: layer.into_core(),
        }
    }
}

impl<K, R> InFlightLimitMiddleware<K, R> {
    /// What to do when the store fails or times out (default: allow).
    #[must_use]
    pub fn on_store_error(self, policy: OnStoreError) -> Self {
        let mut core = Arc::unwrap_or_clone(self.core);
        core.on_error = policy;
        Self {
            core: Arc::new(core),
        }
    }

    /// Builds rejections with a `Fn(&Rejection) -> HttpResponse` closure; a
    /// refused request is [`Rejection::Busy`].
    #[must_use]
    pub fn respond_with<F>(self, respond: F) -> InFlightLimitMiddleware<K, F>
    where
        F: Fn(&Rejection) -> HttpResponse + Send + Sync + 'static,
    {
        self.responder(respond)
    }

    /// Builds rejections with a [`Respond`] implementation.
    #[must_use]
    pub fn responder<R2>(self, respond: R2) -> InFlightLimitMiddleware<K, R2> {
        let core = Arc::unwrap_or_clone(self.core);
        InFlightLimitMiddleware {
            core: Arc::new(core.with_respond(respond)),
        }
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

impl<S, B, K, R> Transform<S, ServiceRequest> for InFlightLimitMiddleware<K, R>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>> + 'static,
    B: MessageBody + 'static,
    K: KeyExtractor<ServiceRequest>,
    R: Respond<HttpResponse>,
{
    type Response = ServiceResponse<EitherBody<LeaseBody<B>>>;
    type Error = S::Error;
    type Transform = InFlightLimitMiddlewareService<S, K, R>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(InFlightLimitMiddlewareService {
            service: Rc::new(service),
            core: self.core.clone(),
        }))
    }
}

/// The actix-web service made by [`InFlightLimitMiddleware`].
///
/// Readiness is the inner service's; a full key is answered with a 429
/// response, never an error, and errors are the inner service's own.
pub struct InFlightLimitMiddlewareService<S, K, R> {
    service: Rc<S>,
    core: Arc<Core<K, R, ConcurrencyLimiter>>,
}

impl<S, K, R> fmt::Debug for InFlightLimitMiddlewareService<S, K, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightLimitMiddlewareService")
            .finish_non_exhaustive()
    }
}

impl<S, B, K, R> Service<ServiceRequest> for InFlightLimitMiddlewareService<S, K, R>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>> + 'static,
    B: MessageBody + 'static,
    K: KeyExtractor<ServiceRequest>,
    R: Respond<HttpResponse>,
{
    type Response = ServiceResponse<EitherBody<LeaseBody<B>>>;
    type Error = S::Error;
    type Future = MiddlewareFuture<LeaseBody<B>, S::Error>;

    forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let core = self.core.clone();
        let service = self.service.clone();
        let acquire = core.acquire(&req);
        Box::pin(async move {
            let result = match acquire {
                Ok(acquire) => acquire.await,
                Err(rejection) => return Ok(answer(req, &core, rejection)),
            };
            match core.admit(result) {
                Ok(lease) => {
                    // An error or a panic in the inner service drops the lease here.
                    let mut res = service.call(req).await?;
                    if let Some(lease) = &lease {
                        lease.write_headers(res.response_mut());
                    }
                    let res = res.map_body(|_, body| LeaseBody::new(body, lease));
                    Ok(res.map_into_left_body())
                }
                Err(rejection) => Ok(answer(req, &core, rejection)),
            }
        })
    }
}
