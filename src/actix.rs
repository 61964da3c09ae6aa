//! actix-web 4 middleware (the `actix` feature): the same limiter, keys,
//! store-error policy, headers and 429 as the tower layer.
//!
//! [`RateLimitLayer`](crate::RateLimitLayer) is itself an actix [`Transform`], so the one
//! configuration type serves both frameworks: register it with `App::wrap`
//! or `Scope::wrap`. It is re-exported here as [`RateLimit`] for readers who
//! look for actix middleware under an actix name; it is the same type.
//!
//! * Keys: [`PeerIp`](struct@crate::key::PeerIp) reads the connection's peer
//!   address, [`Header`](crate::key::Header) and
//!   [`Global`](crate::key::Global) work as under tower, and a
//!   [`from_fn`](crate::key::from_fn) closure gets the `&ServiceRequest`.
//!   A request without a key gets the same answer as under tower (see
//!   [`key`](crate::key)).
//! * Responses: a passed request keeps the inner service's body; the
//!   middleware's own answers (429 and the rest) are the right side of
//!   [`EitherBody`]. A custom answer is a `Fn(&Rejection) -> HttpResponse`
//!   given to [`RateLimitLayer::respond_with`](crate::RateLimitLayer::respond_with).
//!
//! ```no_run
//! use actix_web::{App, HttpServer, web};
//! use redis_ratelimit::{Limiter, Quota, RedisStore, actix::RateLimit, key::PeerIp};
//!
//! fn main() -> std::io::Result<()> {
//!     actix_web::rt::System::new().block_on(async {
//!         let store = RedisStore::connect("redis://127.0.0.1:6379").await.map_err(std::io::Error::other)?;
//!         let limiter = Limiter::builder(Quota::per_minute(100)).store(store).build().unwrap();
//!         let limit = RateLimit::new(limiter, PeerIp);
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
    future::{Future, Ready, ready},
    net::SocketAddr,
    pin::Pin,
    rc::Rc,
    sync::Arc,
};

use actix_web::{
    HttpResponse,
    body::{EitherBody, MessageBody},
    dev::{Service, ServiceRequest, ServiceResponse, Transform, forward_ready},
    http::header as actix_header,
};
use http::{HeaderName, HeaderValue};

use crate::{
    Rejection, Respond,
    core::{Core, Verdict},
    headers::HeaderSink,
    key::{KeyExtractor, RequestInfo},
    respond::{DefaultResponse, Format, problem},
};

pub use crate::RateLimitLayer as RateLimit;

impl RequestInfo for ServiceRequest {
    /// The connection's peer address, as actix-web records it.
    fn peer_addr(&self) -> Option<SocketAddr> {
        ServiceRequest::peer_addr(self)
    }

    fn header_values<'a>(&'a self, name: &HeaderName) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers()
            .get_all(name.as_str())
            .map(actix_header::HeaderValue::as_bytes)
    }
}

/// actix-web 4 uses `http` 0.2 header types; ours are `http` 1. Both are
/// validated byte strings, so the conversion cannot fail for values we made.
fn convert(
    name: HeaderName,
    value: HeaderValue,
) -> Option<(actix_header::HeaderName, actix_header::HeaderValue)> {
    let name = actix_header::HeaderName::from_bytes(name.as_str().as_bytes()).ok()?;
    let value = actix_header::HeaderValue::from_bytes(value.as_bytes()).ok()?;
    Some((name, value))
}

impl<B> HeaderSink for HttpResponse<B> {
    fn append(&mut self, name: HeaderName, value: HeaderValue) {
        if let Some((name, value)) = convert(name, value) {
            self.headers_mut().append(name, value);
        }
    }

    fn insert(&mut self, name: HeaderName, value: HeaderValue) {
        if let Some((name, value)) = convert(name, value) {
            self.headers_mut().insert(name, value);
        }
    }
}

impl Respond<HttpResponse> for DefaultResponse {
    fn respond(&self, rejection: &Rejection) -> HttpResponse {
        self.respond_as(rejection, Format::Text)
    }

    /// The same status and body as under tower.
    fn respond_as(&self, rejection: &Rejection, format: Format) -> HttpResponse {
        // The status through the number: actix-web uses http 0.2's type.
        let status = actix_web::http::StatusCode::from_u16(rejection.status().as_u16())
            .unwrap_or(actix_web::http::StatusCode::TOO_MANY_REQUESTS);
        let body = problem::body(rejection, format);
        HttpResponse::build(status)
            .insert_header((actix_header::CONTENT_TYPE, body.content_type))
            .body(body.text)
    }
}

impl<S, B, K, R> Transform<S, ServiceRequest> for crate::RateLimitLayer<K, R>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>> + 'static,
    B: MessageBody + 'static,
    K: KeyExtractor<ServiceRequest>,
    R: Respond<HttpResponse>,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = S::Error;
    type Transform = RateLimitMiddleware<S, K, R>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(RateLimitMiddleware {
            service: Rc::new(service),
            core: self.core().clone(),
        }))
    }
}

/// The actix-web middleware service made by the [`RateLimit`] transform.
///
/// Readiness is the inner service's; a rejection is a response, never an
/// error, and errors are the inner service's own.
pub struct RateLimitMiddleware<S, K, R> {
    service: Rc<S>,
    core: Arc<Core<K, R>>,
}

impl<S, K, R> fmt::Debug for RateLimitMiddleware<S, K, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitMiddleware")
            .finish_non_exhaustive()
    }
}

/// The middleware's own answer, on the right side of `EitherBody`.
pub(crate) fn answer<B, K, R, L>(
    req: ServiceRequest,
    core: &Core<K, R, L>,
    rejection: Rejection,
) -> ServiceResponse<EitherBody<B>>
where
    R: Respond<HttpResponse>,
{
    let format = Format::negotiate(|name| req.header_values(name));
    req.into_response(core.reject::<HttpResponse>(rejection, format))
        .map_into_right_body()
}

/// The boxed future of [`RateLimitMiddleware`].
pub type MiddlewareFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<ServiceResponse<EitherBody<B>>, E>>>>;

impl<S, B, K, R> Service<ServiceRequest> for RateLimitMiddleware<S, K, R>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>> + 'static,
    B: MessageBody + 'static,
    K: KeyExtractor<ServiceRequest>,
    R: Respond<HttpResponse>,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = S::Error;
    type Future = MiddlewareFuture<B, S::Error>;

    forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let core = self.core.clone();
        let service = self.service.clone();
        let check = core.start(&req);
        Box::pin(async move {
            let result = match check {
                Ok(check) => check.await,
                Err(rejection) => return Ok(answer(req, &core, rejection)),
            };
            match core.verdict(result) {
                Verdict::Pass(decision) => {
                    let mut res = service.call(req).await?;
                    if let Some(d) = decision {
                        core.decorate(res.response_mut(), &d);
                    }
                    Ok(res.map_into_left_body())
                }
                Verdict::Reject(rejection) => Ok(answer(req, &core, rejection)),
            }
        })
    }
}
