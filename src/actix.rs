//! actix-web 4 middleware (the `actix` feature): the same limiter, keys,
//! store-error policy, headers and 429 as the tower layer.
//!
//! [`RateLimitMiddleware`] is what you register with `App::wrap` or
//! `Scope::wrap` (an actix [`Transform`]); it makes a
//! [`RateLimitMiddlewareService`] per worker. Its builder methods are
//! [`RateLimitLayer`](crate::RateLimitLayer)'s, over actix types: `cost` and
//! [`from_fn`](crate::key::from_fn) closures get the `&ServiceRequest`, and
//! `respond_with` closures return an [`HttpResponse`].
//!
//! * Keys: [`PeerIp`](struct@crate::key::PeerIp) reads the connection's peer
//!   address, [`Header`](crate::key::Header) and
//!   [`Global`](crate::key::Global) work as under tower, and a
//!   [`from_fn`](crate::key::from_fn) closure gets the `&ServiceRequest`.
//!   A request without a key gets the same answer as under tower (see
//!   [`key`]).
//! * Responses: a passed request keeps the inner service's body; the
//!   middleware's own answers (429 and the rest) are the right side of
//!   [`EitherBody`]. A custom answer is a `Fn(&Rejection) -> HttpResponse`
//!   given to [`RateLimitMiddleware::respond_with`].
//! * Errors: an `Err` of the services inside (a `wrap_fn`'s, an auth
//!   middleware's 401) is the answer the client gets, so it is settled as
//!   that answer, as the tower layer settles a response (an inner `Err`
//!   under tower is passed on unsettled: there it is no answer): refunded
//!   if its status is one to refund, with the rate-limit headers. It is passed on as an `Err`, an
//!   [`InnerError`].
//! * gRPC: a `grpc-status` at the response's head is judged for a refund as
//!   under tower, but one in the trailers (or a gRPC-Web body's trailer
//!   frame) is never refunded here: [`TrailersLayer`](crate::refund::TrailersLayer)
//!   is a tower layer. [`GrpcResponse`] answers
//!   tower's responses only; a `respond_with` closure builds actix's.
//!
//! ```no_run
//! use actix_web::{App, HttpResponse, HttpServer, web};
//! use redis_ratelimit::{Limiter, Quota, RedisStore, actix::RateLimitMiddleware, key::PeerIp};
//!
//! fn main() -> std::io::Result<()> {
//!     actix_web::rt::System::new().block_on(async {
//!         let store = RedisStore::connect("redis://127.0.0.1:6379").await.map_err(std::io::Error::other)?;
//!         let limiter = Limiter::builder(Quota::per_minute(100)).store(store).build().unwrap();
//!         let limit = RateLimitMiddleware::new(limiter, PeerIp)
//!             .cost(|req| if req.path() == "/search" { 5 } else { 1 })
//!             .respond_with(|_| HttpResponse::TooManyRequests().body("slow down"));
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
    future::{Future, Ready, poll_fn, ready},
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

mod error;

pub use self::error::InnerError;

use crate::{
    Limiter, OnStoreError, Rejection, Respond,
    core::{Core, assert_keys_fit},
    gate::{Admit, Gate, Start},
    headers::PartitionKeys,
    headers::{self, HeaderSink},
    key::{self, KeyExtractor, RequestInfo},
    refund::{Refund, RequestHead, ResponseHead, grpc_call},
    respond::{Asked, Call, DefaultResponse, Format, GrpcResponse, problem},
    skip::{ClientAddr, Networks, Skipping},
    tier::{Tiered, Tiers},
};

/// The actix middleware, renamed [`RateLimitMiddleware`]: the old name read
/// like the tower service.
#[deprecated(note = "renamed `RateLimitMiddleware`")]
pub type RateLimit<K, R = DefaultResponse> = RateLimitMiddleware<K, R>;

/// actix-web middleware that limits requests with its gate `L`, keyed by a
/// [`KeyExtractor`] of actix's `ServiceRequest`: [`RateLimitMiddleware`]
/// when `L` is a [`Limiter`],
/// [`InFlightLimitMiddleware`](crate::concurrency::actix::InFlightLimitMiddleware)
/// when it is a [`ConcurrencyLimiter`](crate::ConcurrencyLimiter). Register
/// it with `App::wrap` or `Scope::wrap`. The builder methods here are both
/// middlewares'; the rate limit has more.
///
/// Clones, and every service they make, share one `Arc` of state.
#[derive(Debug)]
pub struct LimitMiddleware<K, R, L> {
    core: Arc<Core<K, R, L>>,
}

impl<K, R, L> Clone for LimitMiddleware<K, R, L> {
    fn clone(&self) -> Self {
        Self {
            core: self.core.clone(),
        }
    }
}

/// Serves a tower layer's configuration under actix, sharing its state: the
/// limiter, keys (which must also key a `ServiceRequest`, as the built-in
/// extractors do), store-error policy, headers and responder.
impl<K: KeyExtractor<ServiceRequest>, R, L> From<crate::LimitLayer<K, R, L>>
    for LimitMiddleware<K, R, L>
{
    fn from(layer: crate::LimitLayer<K, R, L>) -> Self {
        Self {
            core: layer.into_core(),
        }
    }
}

impl<K, R, L: Clone> LimitMiddleware<K, R, L> {
    pub(crate) fn from_core(core: Core<K, R, L>) -> Self {
        Self {
            core: Arc::new(core),
        }
    }

    fn map<K2, R2>(
        self,
        f: impl FnOnce(Core<K, R, L>) -> Core<K2, R2, L>,
    ) -> LimitMiddleware<K2, R2, L> {
        LimitMiddleware {
            core: Core::rebuild(self.core, f),
        }
    }

    fn set(self, f: impl FnOnce(&mut Core<K, R, L>)) -> Self {
        Self {
            core: Core::with(self.core, f),
        }
    }

    /// What to do when the store fails or times out (default: allow).
    #[must_use]
    pub fn on_store_error(self, policy: OnStoreError) -> Self {
        self.set(|c| c.on_error = policy)
    }

    /// Builds rejections with a `Fn(&Rejection) -> HttpResponse` closure.
    /// Rate-limit headers are added to what it returns. Under the
    /// concurrency limit, a refused request is [`Rejection::Busy`].
    #[must_use]
    pub fn respond_with<F>(self, respond: F) -> LimitMiddleware<K, F, L>
    where
        F: Fn(&Rejection) -> HttpResponse + Send + Sync + 'static,
    {
        self.responder(respond)
    }

    /// Builds rejections with a [`Respond`] implementation.
    #[must_use]
    pub fn responder<R2>(self, respond: R2) -> LimitMiddleware<K, R2, L> {
        self.map(|c| c.with_respond(respond))
    }
}

/// Rate limits an actix-web app or scope with a [`Limiter`], keyed by a
/// [`KeyExtractor`] of actix's `ServiceRequest`: register it with
/// `App::wrap` or `Scope::wrap`.
///
/// The actix counterpart of [`RateLimitLayer`](crate::RateLimitLayer), with
/// the same builder methods. Clones, and every service they make, share one
/// `Arc` of state, so they count against the same limiter.
pub type RateLimitMiddleware<K, R = DefaultResponse> = LimitMiddleware<K, R, Limiter>;

impl<K: KeyExtractor<ServiceRequest>> RateLimitMiddleware<K> {
    /// Limits with `limiter`, keying requests with `extractor`.
    ///
    /// # Panics
    /// If `extractor` gives neither one key (for all of the limiter's
    /// limits) nor one per limit ([`KeyExtractor::key_count`]).
    pub fn new(limiter: Limiter, extractor: K) -> Self {
        let limiters = std::iter::once(&limiter).chain(extractor.tier_limiters());
        assert_keys_fit("RateLimitMiddleware::new", extractor.key_count(), limiters);
        Self::from_core(Core::new(limiter, extractor, DefaultResponse))
    }
}

impl<K, T> RateLimitMiddleware<Tiered<K, T>>
where
    K: KeyExtractor<ServiceRequest>,
    T: KeyExtractor<ServiceRequest>,
{
    /// Limits each request by its tier's limiter, `select` naming the
    /// tier; see [`RateLimitLayer::tiered`](crate::RateLimitLayer::tiered).
    ///
    /// # Panics
    /// If `extractor` gives neither one key nor one per limit, for the
    /// default's limiter and every tier's.
    pub fn tiered(tiers: Tiers, select: T, extractor: K) -> Self {
        let keys = extractor.key_count();
        assert_keys_fit("RateLimitMiddleware::tiered", keys, tiers.limiters());
        let default = tiers.default_limiter().clone();
        Self::new(default, Tiered::new(extractor, select, tiers))
    }
}

impl<T: key::KeyTuple> RateLimitMiddleware<key::Each<T>>
where
    key::Each<T>: KeyExtractor<ServiceRequest>,
{
    /// Keys each of the limiter's limits with its own extractor, in order,
    /// as [`RateLimitLayer::each`](crate::RateLimitLayer::each) does.
    ///
    /// # Panics
    /// If the tuple's length is not the limiter's number of limits.
    pub fn each(limiter: Limiter, extractors: T) -> Self {
        let limits = limiter.limits().count();
        assert_eq!(
            T::LEN,
            limits,
            "RateLimitMiddleware::each got {} extractors for a limiter with {limits} limits; \
             give one per limit, in order",
            T::LEN
        );
        Self::new(limiter, key::each(extractors))
    }
}

impl<K, R> RateLimitMiddleware<K, R> {
    /// Also send the `X-RateLimit-*` headers (default: off); see
    /// [`RateLimitLayer::legacy_headers`](crate::RateLimitLayer::legacy_headers),
    /// including how nested middlewares keep the tightest limit's.
    #[must_use]
    pub fn legacy_headers(self, enabled: bool) -> Self {
        self.set(|c| c.legacy_headers = enabled)
    }

    /// Also write the draft's `pk` partition key on `RateLimit`; see
    /// [`RateLimitLayer::partition_key`](crate::RateLimitLayer::partition_key).
    #[must_use]
    pub fn partition_key(self, enabled: bool) -> Self {
        let keys = enabled.then(PartitionKeys::random);
        self.set(|c| c.partition_keys = keys)
    }

    /// Write `pk` hashed with a key derived from `secret`, so replicas
    /// agree; see
    /// [`RateLimitLayer::partition_key_secret`](crate::RateLimitLayer::partition_key_secret).
    #[must_use]
    pub fn partition_key_secret(self, secret: impl AsRef<[u8]>) -> Self {
        let keys = PartitionKeys::from_secret(secret.as_ref());
        self.set(|c| c.partition_keys = Some(keys))
    }

    /// Makes each request spend `cost(request)` units instead of 1; see
    /// [`RateLimitLayer::cost`](crate::RateLimitLayer::cost).
    #[must_use]
    pub fn cost<F>(self, cost: F) -> RateLimitMiddleware<key::WithCost<K, F>, R>
    where
        F: Fn(&ServiceRequest) -> u64 + Send + Sync + 'static,
    {
        self.map(|c| c.map_extractor(|keys| key::WithCost::shared(keys, cost)))
    }

    /// Gives a passed request's cost back when its response's status is
    /// one `refund` picks; see
    /// [`RateLimitLayer::refund_when`](crate::RateLimitLayer::refund_when).
    #[must_use]
    pub fn refund_when(self, refund: Refund) -> Self {
        self.set(|c| c.refund = Some(refund))
    }

    /// Lets the requests `skip` picks through unlimited: no store call, no
    /// rate-limit headers; see
    /// [`RateLimitLayer::skip`](crate::RateLimitLayer::skip).
    #[must_use]
    pub fn skip<F>(self, skip: F) -> RateLimitMiddleware<Skipping<K, F>, R>
    where
        F: Fn(&ServiceRequest) -> bool + Send + Sync + 'static,
    {
        self.skip_by(skip)
    }

    /// Lets requests from clients in `networks` through unlimited; see
    /// [`RateLimitLayer::skip_networks`](crate::RateLimitLayer::skip_networks).
    #[must_use]
    pub fn skip_networks<A>(
        self,
        networks: Networks<A>,
    ) -> RateLimitMiddleware<Skipping<K, Networks<A>>, R>
    where
        A: ClientAddr<ServiceRequest>,
    {
        self.skip_by(networks)
    }

    /// Lets the requests a [`Skip`](crate::skip::Skip) picks through
    /// unlimited.
    #[must_use]
    pub fn skip_by<S>(self, skip: S) -> RateLimitMiddleware<Skipping<K, S>, R> {
        self.map(|c| c.map_extractor(|keys| Skipping::shared(keys, skip)))
    }
}

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

    fn only(&self, name: &HeaderName) -> Option<&[u8]> {
        let values = self.headers().get_all(name.as_str());
        headers::only_one(values.map(actix_header::HeaderValue::as_bytes))
    }
}

/// An `http` status as actix-web's (http 0.2's type), through the number.
fn status_of(status: http::StatusCode) -> actix_web::http::StatusCode {
    actix_web::http::StatusCode::from_u16(status.as_u16())
        .unwrap_or(actix_web::http::StatusCode::TOO_MANY_REQUESTS)
}

impl Respond<HttpResponse> for DefaultResponse {
    fn respond(&self, rejection: &Rejection) -> HttpResponse {
        self.respond_as(rejection, Format::Text)
    }

    /// The same status and body as under tower; for a gRPC call, the same
    /// trailers-only answer ([`GrpcResponse`]: HTTP 200, `grpc-status`),
    /// not an HTTP status that a gRPC client would read as `UNAVAILABLE`.
    fn respond_as(&self, rejection: &Rejection, format: Format) -> HttpResponse {
        if format == Format::Grpc {
            let grpc: http::Response<()> = GrpcResponse.respond(rejection);
            let mut res = HttpResponse::build(status_of(grpc.status())).finish();
            for (name, value) in grpc.headers() {
                res.append(name.clone(), value.clone());
            }
            return res;
        }
        let status = status_of(rejection.status());
        let body = problem::body(rejection, format);
        HttpResponse::build(status)
            .insert_header((actix_header::CONTENT_TYPE, body.content_type))
            .body(body.text)
    }
}

impl<S, B, K, R, L> Transform<S, ServiceRequest> for LimitMiddleware<K, R, L>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>> + 'static,
    S::Error: Into<actix_web::Error>,
    B: MessageBody + 'static,
    K: KeyExtractor<ServiceRequest>,
    R: Respond<HttpResponse>,
    L: Admit + 'static,
{
    type Response = ServiceResponse<EitherBody<<L as Gate>::Body<B>>>;
    type Error = actix_web::Error;
    type Transform = LimitMiddlewareService<S, K, R, L>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(LimitMiddlewareService {
            service: Rc::new(service),
            core: self.core.clone(),
        }))
    }
}

/// The actix-web service made by a [`LimitMiddleware`].
///
/// Readiness is the inner service's; a rejection is a response, never an
/// error, and errors are the inner service's own: one from a request the
/// middleware let through is settled as the response it becomes, and
/// passed on as an [`InnerError`].
pub struct LimitMiddlewareService<S, K, R, L> {
    service: Rc<S>,
    core: Arc<Core<K, R, L>>,
}

/// The actix-web service made by [`RateLimitMiddleware`].
pub type RateLimitMiddlewareService<S, K, R> = LimitMiddlewareService<S, K, R, Limiter>;

impl<S, K, R, L> fmt::Debug for LimitMiddlewareService<S, K, R, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitMiddlewareService")
            .finish_non_exhaustive()
    }
}

/// The middleware's own answer, on the right side of `EitherBody`.
fn answer<B, K, R, L>(
    req: ServiceRequest,
    core: &Core<K, R, L>,
    rejection: Rejection,
) -> ServiceResponse<EitherBody<B>>
where
    R: Respond<HttpResponse>,
{
    let call = Call {
        post: req.method() == actix_web::http::Method::POST,
        http2: req.version() >= actix_web::http::Version::HTTP_2,
    };
    let asked = Asked::negotiate(call, |name| req.header_values(name));
    req.into_response(core.reject::<HttpResponse>(rejection, asked))
        .map_into_right_body()
}

impl RequestHead for ServiceRequest {
    fn may_be_grpc(&self) -> bool {
        let content_type = self
            .headers()
            .get(actix_header::CONTENT_TYPE)
            .map(actix_header::HeaderValue::as_bytes);
        grpc_call(self.method() == actix_web::http::Method::POST, content_type)
    }
}

impl<B> ResponseHead for HttpResponse<B> {
    /// The status as an `http` 1 status (actix-web uses `http` 0.2).
    fn status(&self) -> http::StatusCode {
        http::StatusCode::from_u16(HttpResponse::status(self).as_u16())
            .unwrap_or(http::StatusCode::OK)
    }

    fn header(&self, name: &'static HeaderName) -> Option<&[u8]> {
        self.headers()
            .get(name.as_str())
            .map(actix_header::HeaderValue::as_bytes)
    }
}

/// The boxed future of [`LimitMiddlewareService`].
pub type MiddlewareFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<ServiceResponse<EitherBody<B>>, E>>>>;

impl<S, B, K, R, L> Service<ServiceRequest> for LimitMiddlewareService<S, K, R, L>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>> + 'static,
    S::Error: Into<actix_web::Error>,
    B: MessageBody + 'static,
    K: KeyExtractor<ServiceRequest>,
    R: Respond<HttpResponse>,
    L: Admit + 'static,
{
    type Response = ServiceResponse<EitherBody<<L as Gate>::Body<B>>>;
    type Error = actix_web::Error;
    type Future = MiddlewareFuture<<L as Gate>::Body<B>, actix_web::Error>;

    forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let core = Core::local(&self.core);
        let service = self.service.clone();
        let start = L::start(&core, &req);
        Box::pin(async move {
            let held = match start {
                Ok(Start::Check(mut check)) => {
                    match poll_fn(|cx| L::poll(&core, &mut check, cx)).await {
                        Ok(held) => Some(held),
                        Err(rejection) => return Ok(answer(req, &core, rejection)),
                    }
                }
                Ok(Start::Skip) => None,
                Err(rejection) => return Ok(answer(req, &core, rejection)),
            };
            // A panic in the inner service drops `held` here. An error is
            // what the client gets (actix-web answers it with its
            // `error_response`), so it is settled as that response. It
            // stays an `Err`, as actix-web's own middlewares pass errors
            // on: making it a response would need the `HttpRequest`, and a
            // copy of it kept across the call breaks routing (the router
            // mutates the request through `Rc::get_mut`).
            let mut res = match service.call(req).await {
                Ok(res) => res,
                Err(e) => {
                    return Err(match held {
                        // The error's body is built later, by actix-web:
                        // nothing to keep for it (a lease ends here).
                        Some(held) => InnerError::new(e.into(), |res| {
                            drop(L::finish(&core, held, res));
                        })
                        .into(),
                        None => e.into(),
                    });
                }
            };
            let kept = match held {
                Some(held) => L::finish(&core, held, res.response_mut()),
                None => L::Kept::default(),
            };
            Ok(res
                .map_body(|_, body| L::body(body, kept))
                .map_into_left_body())
        })
    }
}
