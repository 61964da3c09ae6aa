//! The concurrency limit as actix-web 4 middleware (the `actix` feature).
//!
//! [`ConcurrencyLimitLayer`] is itself an actix [`Transform`]: register it
//! with `App::wrap` or `Scope::wrap`. Keys, answers, headers and the
//! store-error policy are the tower layer's, and so is the lease's span: it is
//! held until the response body has been sent ([`LeaseBody`] is also an
//! actix [`MessageBody`]). Leases are released and renewed on the worker's
//! Tokio runtime.
//!
//! ```no_run
//! use actix_web::{App, HttpServer, web};
//! use redis_ratelimit::{
//!     RedisStore,
//!     concurrency::{ConcurrencyLimitLayer, ConcurrencyLimiter},
//!     key::PeerIp,
//! };
//!
//! fn main() -> std::io::Result<()> {
//!     actix_web::rt::System::new().block_on(async {
//!         let store = RedisStore::connect("redis://127.0.0.1:6379").await.map_err(std::io::Error::other)?;
//!         let limiter = ConcurrencyLimiter::builder(10).store(store).build().unwrap();
//!         let limit = ConcurrencyLimitLayer::new(limiter, PeerIp);
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

use super::{ConcurrencyLimitLayer, ConcurrencyLimiter, LeaseBody};
use crate::{
    Respond,
    actix::{MiddlewareFuture, answer},
    core::Core,
    key::KeyExtractor,
};

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

impl<S, B, K, R> Transform<S, ServiceRequest> for ConcurrencyLimitLayer<K, R>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>> + 'static,
    B: MessageBody + 'static,
    K: KeyExtractor<ServiceRequest>,
    R: Respond<HttpResponse>,
{
    type Response = ServiceResponse<EitherBody<LeaseBody<B>>>;
    type Error = S::Error;
    type Transform = ConcurrencyLimitMiddleware<S, K, R>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(ConcurrencyLimitMiddleware {
            service: Rc::new(service),
            core: self.core.clone(),
        }))
    }
}

/// The actix-web middleware service made by the [`ConcurrencyLimitLayer`]
/// transform.
///
/// Readiness is the inner service's; a full key is answered with a 429
/// response, never an error, and errors are the inner service's own.
pub struct ConcurrencyLimitMiddleware<S, K, R> {
    service: Rc<S>,
    core: Arc<Core<K, R, ConcurrencyLimiter>>,
}

impl<S, K, R> fmt::Debug for ConcurrencyLimitMiddleware<S, K, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitMiddleware")
            .finish_non_exhaustive()
    }
}

impl<S, B, K, R> Service<ServiceRequest> for ConcurrencyLimitMiddleware<S, K, R>
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
