//! A distributed concurrency limit: at most N requests in flight per key,
//! across every replica that shares a Redis (Stripe's "concurrent requests
//! limiter").
//!
//! * [`ConcurrencyLimiter`] is the framework-free semaphore:
//!   [`acquire`](ConcurrencyLimiter::acquire) grants a [`Lease`] or reports
//!   the key [`Busy`].
//! * [`InFlightLimitLayer`] is the tower layer (and, with the `actix`
//!   feature, `actix::InFlightLimitMiddleware` is the actix-web one): the same
//!   key extractors, [`Respond`](crate::Respond) hook and
//!   [`OnStoreError`](crate::OnStoreError) policy as
//!   [`RateLimitLayer`](crate::RateLimitLayer). Refused requests get `429`,
//!   `Retry-After` and the IETF headers with `qu="concurrent-requests"`
//!   (see [`InFlightLimitLayer`]).
//!
//! # Leases
//!
//! Each key is one Redis sorted set (`{prefix}:cc:{name}:{<client>}`, with
//! the client as hash tag) of owner tokens scored by their expiry in Redis
//! time. Three Lua scripts in `lua/` act on it, each documenting its KEYS,
//! ARGV and reply:
//!
//! * `concurrency_acquire.lua` drops expired leases, and adds the caller's
//!   token only while fewer than N remain;
//! * `concurrency_renew.lua` extends the caller's own lease, if it still has
//!   one;
//! * `concurrency_release.lua` removes the caller's own token, and only it.
//!
//! That avoids the classic distributed-lock bugs:
//!
//! | failure | what happens |
//! |---|---|
//! | a holder crashes and never releases | its lease expires after the lease time (default 30 s) and the slot comes back |
//! | a request runs longer than the lease | its lease is renewed every third of the lease time while it runs |
//! | a slow holder's lease expired and was taken over; it then releases | the release removes only its own (gone) token: the new holder keeps its slot |
//! | an acquire times out client-side but succeeded in Redis | its token is released once the call's real outcome arrives: no leaked slot |
//! | a key is abandoned | its TTL is its last lease's expiry: it disappears |
//!
//! A [`Lease`] is a guard: dropping it, on any path (a response, an error, a
//! panic, a client that disconnected), stops its renewals and spawns its
//! release. Under the layer, it is held until the response body ends, so a
//! streamed download counts as in flight until its last byte.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use redis_ratelimit::concurrency::{Acquired, ConcurrencyLimiter};
//!
//! let limiter = ConcurrencyLimiter::builder(1)
//!     .name("imports")
//!     .lease(Duration::from_secs(10))
//!     .build()?; // in memory; `.store(redis_store)` to share it across replicas
//! let lease = match limiter.acquire("tenant:42").await? {
//!     Acquired::Lease(lease) => lease,
//!     Acquired::Busy(busy) => return Ok(println!("retry in {:?}", busy.retry_after())),
//! };
//! assert!(!limiter.acquire("tenant:42").await?.is_acquired());
//! // ... do the work; the lease renews itself meanwhile ...
//! lease.release().await?;
//! # Ok(()) }
//! ```

#[cfg(feature = "actix")]
#[cfg_attr(docsrs, doc(cfg(feature = "actix")))]
pub mod actix;
mod body;
mod gate;
mod headers;
mod layer;
mod lease;
mod limiter;

pub(crate) use self::lease::token_lease;
pub use self::{
    body::LeaseBody,
    layer::InFlightLimitLayer,
    lease::{Acquired, Busy, Lease},
    limiter::{ConcurrencyLimiter, ConcurrencyLimiterBuilder, DEFAULT_LEASE, DEFAULT_RETRY_AFTER},
};

/// The service made by [`InFlightLimitLayer`]: a
/// [`LimitService`](crate::LimitService) over a [`ConcurrencyLimiter`].
///
/// `poll_ready` forwards to the inner service: a full key is answered with a
/// 429 response, never with backpressure, and errors are the inner service's
/// own. Response bodies are wrapped in a [`LeaseBody`], which holds the lease
/// until the body ends.
pub type InFlightLimitService<S, K, R> = crate::LimitService<S, K, R, ConcurrencyLimiter>;

/// The response future of [`InFlightLimitService`]: waits for a slot, then
/// either answers the rejection or calls the inner service, holding the
/// lease, and hands the lease to the response body.
pub type ResponseFuture<S, ReqBody, K, R> =
    crate::ResponseFuture<S, ReqBody, K, R, ConcurrencyLimiter>;

/// The tower layer, renamed [`InFlightLimitLayer`] so it does not clash with
/// `tower::limit::ConcurrencyLimitLayer`.
#[deprecated(note = "renamed `InFlightLimitLayer`")]
pub type ConcurrencyLimitLayer<K, R = crate::DefaultResponse> = InFlightLimitLayer<K, R>;

/// The tower service, renamed [`InFlightLimitService`] so it does not clash
/// with `tower::limit::ConcurrencyLimit`.
#[deprecated(note = "renamed `InFlightLimitService`")]
pub type ConcurrencyLimit<S, K, R> = InFlightLimitService<S, K, R>;
