//! [`InFlightLimitLayer`]: the tower layer, a [`LimitLayer`] over a
//! [`ConcurrencyLimiter`].

use http::request::Parts;

use super::ConcurrencyLimiter;
use crate::{DefaultResponse, LimitLayer, core::Core, key::KeyExtractor};

/// Limits how many requests per key are in flight at once, across every
/// replica that shares the [`ConcurrencyLimiter`]'s store; keys come from a
/// [`KeyExtractor`].
///
/// A request that finds its key at the limit is answered `429 Too Many
/// Requests` with `Retry-After` (see
/// [`retry_after`](super::ConcurrencyLimiterBuilder::retry_after)); the
/// others pass through holding a [`Lease`](super::Lease). Both carry
/// `RateLimit-Policy: "concurrency";q=5;qu="concurrent-requests"` and
/// `RateLimit: "concurrency";r=<slots left>`; a request that took no slot
/// (skipped, or let through by a store error) carries neither. The lease is
/// held until the response body has been sent (or dropped), and released
/// early if the inner service fails, panics or the client goes away. Store
/// errors and timeouts follow [`OnStoreError`](crate::OnStoreError): allowed
/// requests then run without a lease.
///
/// What counts is the HTTP exchange, so an upgraded connection (a `101
/// Switching Protocols` answer, such as a WebSocket's) holds its slot only
/// until the 101 is sent: its body is empty. To cap open WebSockets, hold a
/// lease from [`ConcurrencyLimiter::acquire`] in the upgraded connection's
/// task for as long as it runs.
///
/// Clones of the layer, and every service it makes, share one `Arc` of
/// state.
///
/// It is named for what it limits, requests in flight per key, and so that it
/// does not clash with `tower::limit::ConcurrencyLimitLayer`, which bounds one
/// service's concurrency in one process. For actix-web, see
/// `concurrency::actix::InFlightLimitMiddleware` (feature `actix`).
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
pub type InFlightLimitLayer<K, R = DefaultResponse> = LimitLayer<K, R, ConcurrencyLimiter>;

impl<K: KeyExtractor<Parts>> InFlightLimitLayer<K> {
    /// Limits with `limiter`, keying requests with `extractor`: any
    /// [`KeyExtractor`] of `http::request::Parts` that gives one key a
    /// request. A request it skips (a [`Skipping`](crate::skip::Skipping)
    /// extractor) goes through without a slot; a cost or a tier it carries
    /// is not used (a request takes one slot of the one limiter). For one
    /// limit per key beside one for everyone, stack two layers.
    ///
    /// # Panics
    ///
    /// If `extractor` gives more than one key a request (`key::each`).
    pub fn new(limiter: ConcurrencyLimiter, extractor: K) -> Self {
        crate::core::assert_one_key("InFlightLimitLayer::new", extractor.key_count());
        Self::from_core(Core::new(limiter, extractor, DefaultResponse))
    }
}
