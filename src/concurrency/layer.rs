//! [`InFlightLimitLayer`]: the tower layer.

use std::sync::Arc;

use http::{Response, request::Parts};
use tower_layer::Layer;

use super::{Acquired, ConcurrencyLimiter, InFlightLimitService, Lease};
use crate::{
    DefaultResponse, Error, OnStoreError, Rejection, core::Core, key::KeyExtractor, respond,
    store::BoxFuture,
};

/// Limits how many requests per key are in flight at once, across every
/// replica that shares the [`ConcurrencyLimiter`]'s store; keys come from a
/// [`KeyExtractor`].
///
/// A request that finds its key at the limit is answered `429 Too Many
/// Requests` with `Retry-After` (see
/// [`retry_after`](super::ConcurrencyLimiterBuilder::retry_after)); the
/// others pass through holding a [`Lease`], and every response carries
/// `RateLimit-Policy: "concurrency";q=5;qu="concurrent-requests"` and
/// `RateLimit: "concurrency";r=<slots left>`. The lease is held until the
/// response body has been sent (or dropped), and released early if the inner
/// service fails, panics or the client goes away. Store errors and timeouts
/// follow [`OnStoreError`]: allowed requests then run without a lease.
///
/// Clones of the layer, and every service it makes, share one `Arc` of
/// state.
///
/// It is named for what it limits, requests in flight per key, and so that it
/// does not clash with `tower::limit::ConcurrencyLimitLayer`, which bounds one
/// service's concurrency in one process. For actix-web, see
/// [`InFlightLimitMiddleware`](crate::concurrency::actix).
///
/// ```no_run
/// use axum::{Router, routing::post};
/// use redis_ratelimit::{
///     RedisStore,
///     concurrency::{InFlightLimitLayer, ConcurrencyLimiter},
///     key::Header,
/// };
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
/// // At most 5 exports per API key at once, over all replicas.
/// let limiter = ConcurrencyLimiter::builder(5).name("exports").store(store).build()?;
/// let app: Router = Router::new()
///     .route("/export", post(|| async { "done" }))
///     .layer(InFlightLimitLayer::new(limiter, Header::new("x-api-key")));
/// # let _ = app; Ok(()) }
/// ```
#[derive(Debug)]
pub struct InFlightLimitLayer<K, R = DefaultResponse> {
    core: Arc<Core<K, R, ConcurrencyLimiter>>,
}

impl<K, R> Clone for InFlightLimitLayer<K, R> {
    fn clone(&self) -> Self {
        Self {
            core: self.core.clone(),
        }
    }
}

impl<K: KeyExtractor<Parts>> InFlightLimitLayer<K> {
    /// Limits with `limiter`, keying requests with `extractor`: any
    /// [`KeyExtractor`] of `http::request::Parts`.
    pub fn new(limiter: ConcurrencyLimiter, extractor: K) -> Self {
        Self {
            core: Arc::new(Core::new(limiter, extractor, DefaultResponse)),
        }
    }
}

impl<K, R> InFlightLimitLayer<K, R> {
    /// The state shared by every service the layer makes.
    #[cfg(feature = "actix")]
    pub(crate) fn into_core(self) -> Arc<Core<K, R, ConcurrencyLimiter>> {
        self.core
    }

    /// What to do when the store fails or times out (default: allow).
    #[must_use]
    pub fn on_store_error(self, policy: OnStoreError) -> Self {
        let mut core = Arc::unwrap_or_clone(self.core);
        core.on_error = policy;
        Self {
            core: Arc::new(core),
        }
    }

    /// Builds rejections with a closure, as
    /// [`RateLimitLayer::respond_with`](crate::RateLimitLayer::respond_with)
    /// does; a refused request is [`Rejection::Busy`].
    #[must_use]
    pub fn respond_with<F, B>(self, respond: F) -> InFlightLimitLayer<K, respond::FromFn<F>>
    where
        F: Fn(&Rejection) -> Response<B> + Send + Sync + 'static,
    {
        self.responder(respond::FromFn::new(respond))
    }

    /// Builds rejections with a [`Respond`](crate::Respond) implementation.
    #[must_use]
    pub fn responder<R2>(self, respond: R2) -> InFlightLimitLayer<K, R2> {
        let core = Arc::unwrap_or_clone(self.core);
        InFlightLimitLayer {
            core: Arc::new(core.with_respond(respond)),
        }
    }
}

impl<S, K, R> Layer<S> for InFlightLimitLayer<K, R> {
    type Service = InFlightLimitService<S, K, R>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlightLimitService::new(inner, self.core.clone())
    }
}

/// The concurrency layer's steps, shared by the tower and actix adapters.
impl<K, R> Core<K, R, ConcurrencyLimiter> {
    /// Derives the request's key and starts its acquire, or rejects the
    /// request at once when no key can be derived.
    pub(crate) fn acquire<Req: ?Sized>(
        &self,
        req: &Req,
    ) -> Result<BoxFuture<'static, Result<Acquired, Error>>, Rejection>
    where
        K: KeyExtractor<Req>,
    {
        let key = self.key(req)?;
        Ok(self.limiter.start(key.as_bytes()))
    }

    /// Applies the store-error policy to a finished acquire: pass with the
    /// lease (or with none, when the store failed and the policy allows), or
    /// reject.
    pub(crate) fn admit(
        &self,
        result: Result<Acquired, Error>,
    ) -> Result<Option<Lease>, Rejection> {
        match result {
            Ok(Acquired::Lease(lease)) => Ok(Some(lease)),
            Ok(Acquired::Busy(busy)) => Err(Rejection::Busy(busy)),
            Err(e) => self.store_failed(e).map_or(Ok(None), Err),
        }
    }
}
