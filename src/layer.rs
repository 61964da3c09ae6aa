//! [`LimitLayer`]: the tower layer, over either [`Gate`](crate::Gate), and
//! [`RateLimitLayer`]'s own builder methods.

use std::sync::Arc;

use http::{Response, request::Parts};
use tower_layer::Layer;

use crate::{
    DefaultResponse, LimitService, Limiter, OnStoreError, Rejection,
    core::{Core, assert_keys_fit},
    headers::PartitionKeys,
    key::{self, KeyExtractor},
    refund::Refund,
    respond,
    skip::{ClientAddr, Networks, Skipping},
    tier::{Tiered, Tiers},
};

/// A tower layer that limits requests with its gate `L`, keyed by a
/// [`KeyExtractor`]: [`RateLimitLayer`] when `L` is a [`Limiter`],
/// [`InFlightLimitLayer`](crate::InFlightLimitLayer) when it is a
/// [`ConcurrencyLimiter`](crate::ConcurrencyLimiter). The builder methods
/// here are both layers'; the rate limit has more.
///
/// Clones of the layer, and every service it makes, share one `Arc` of
/// state.
#[derive(Debug)]
pub struct LimitLayer<K, R, L> {
    core: Arc<Core<K, R, L>>,
}

impl<K, R, L> Clone for LimitLayer<K, R, L> {
    fn clone(&self) -> Self {
        Self {
            core: self.core.clone(),
        }
    }
}

impl<K, R, L> LimitLayer<K, R, L> {
    pub(crate) fn from_core(core: Core<K, R, L>) -> Self {
        Self {
            core: Arc::new(core),
        }
    }

    /// The state shared by every service the layer makes.
    #[cfg(feature = "actix")]
    pub(crate) fn into_core(self) -> Arc<Core<K, R, L>> {
        self.core
    }
}

impl<K, R, L: Clone> LimitLayer<K, R, L> {
    fn map<K2, R2>(
        self,
        f: impl FnOnce(Core<K, R, L>) -> Core<K2, R2, L>,
    ) -> LimitLayer<K2, R2, L> {
        LimitLayer {
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

    /// Builds rejections with a closure: `Fn(&Rejection) -> http::Response<B>`
    /// for any body `B` that converts [`Into`] the service's response body,
    /// so `Response<String>` fits axum's `Body`. The argument needs no type
    /// annotation. Rate-limit headers are added to what it returns. Under
    /// the concurrency limit, a refused request is [`Rejection::Busy`].
    ///
    /// ```
    /// use axum::{Router, body::Body, response::{IntoResponse, Response}, routing::get};
    /// use redis_ratelimit::{Limiter, Quota, RateLimitLayer, key::Global};
    ///
    /// let limiter = Limiter::new(Quota::per_second(10));
    /// let short: Router = Router::new()
    ///     .route("/", get(|| async { "ok" }))
    ///     .layer(RateLimitLayer::new(limiter.clone(), Global)
    ///         .respond_with(|r| (r.status(), "slow down").into_response()));
    /// let built: Router = Router::new()
    ///     .route("/", get(|| async { "ok" }))
    ///     .layer(RateLimitLayer::new(limiter, Global).respond_with(|r| {
    ///         Response::builder().status(r.status()).body(Body::from("slow down")).unwrap()
    ///     }));
    /// # let _ = (short, built);
    /// ```
    #[must_use]
    pub fn respond_with<F, B>(self, respond: F) -> LimitLayer<K, respond::FromFn<F>, L>
    where
        F: Fn(&Rejection) -> Response<B> + Send + Sync + 'static,
    {
        self.responder(respond::FromFn::new(respond))
    }

    /// Builds rejections with a [`Respond`](crate::Respond) implementation
    /// (for a closure, [`respond_with`](Self::respond_with) infers more).
    #[must_use]
    pub fn responder<R2>(self, respond: R2) -> LimitLayer<K, R2, L> {
        self.map(|c| c.with_respond(respond))
    }
}

impl<S, K, R, L> Layer<S> for LimitLayer<K, R, L> {
    type Service = LimitService<S, K, R, L>;

    fn layer(&self, inner: S) -> Self::Service {
        LimitService::new(inner, self.core.clone())
    }
}

/// Rate limits requests with a [`Limiter`], keyed by a
/// [`KeyExtractor`].
///
/// Allowed requests pass through and their responses gain `RateLimit` and
/// `RateLimit-Policy` headers; denied ones are answered `429 Too Many
/// Requests` with `Retry-After` (see [`headers`](crate::headers) and
/// [`respond`]). Quota never makes `poll_ready` pending.
///
/// Clones of the layer, and every service it makes, share one `Arc` of
/// state, so they count against the same limiter.
///
/// ```no_run
/// use std::net::SocketAddr;
/// use axum::{Router, routing::get};
/// use redis_ratelimit::{Limiter, OnStoreError, Quota, RateLimitLayer, RedisStore, key::PeerIp};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
/// let limiter = Limiter::builder("100/1m".parse()?).store(store).build()?;
/// let app = Router::new()
///     .route("/", get(|| async { "ok" }))
///     .layer(RateLimitLayer::new(limiter, PeerIp).on_store_error(OnStoreError::Allow));
///
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
/// // PeerIp needs the peer address: serve with connect info.
/// axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
/// # Ok(()) }
/// ```
pub type RateLimitLayer<K, R = DefaultResponse> = LimitLayer<K, R, Limiter>;

impl<K: KeyExtractor<Parts>> RateLimitLayer<K> {
    /// Limits with `limiter`, keying requests with `extractor`: any
    /// [`KeyExtractor`] of `http::request::Parts` (for actix-web, see
    /// `actix::RateLimitMiddleware`, feature `actix`).
    ///
    /// An extractor for another request type is refused here, not later at
    /// `.layer(..)`:
    ///
    /// ```compile_fail
    /// use redis_ratelimit::{Key, KeyError, Limiter, Quota, RateLimitLayer, key};
    ///
    /// struct OtherRequest;
    /// let by_other = key::from_fn(|_: &OtherRequest| Ok::<_, KeyError>(Key::from("k")));
    /// let _ = RateLimitLayer::new(Limiter::new(Quota::per_second(1)), by_other);
    /// ```
    ///
    /// # Panics
    /// If `extractor` gives neither one key (for all of the limiter's
    /// limits) nor one per limit ([`KeyExtractor::key_count`]), for the
    /// limiter and for every tier's a [`Tiered`] extractor may pick
    /// ([`KeyExtractor::tier_limiters`]).
    pub fn new(limiter: Limiter, extractor: K) -> Self {
        let limiters = std::iter::once(&limiter).chain(extractor.tier_limiters());
        assert_keys_fit("RateLimitLayer::new", extractor.key_count(), limiters);
        Self::from_core(Core::new(limiter, extractor, DefaultResponse))
    }
}

impl<K: KeyExtractor<Parts>, T: KeyExtractor<Parts>> RateLimitLayer<Tiered<K, T>> {
    /// Limits each request by its tier's limiter: `select`'s key for the
    /// request names the tier (say [`Header::new("x-plan")`](crate::key::Header),
    /// or [`key::from_fn`] over a JWT claim or an extension an auth layer
    /// set), and `extractor` keys it within the tier. A request whose
    /// selector fails, or names no tier, gets the default limiter. See
    /// [`tier`](crate::tier).
    ///
    /// ```
    /// use http::request::Parts;
    /// use redis_ratelimit::{Key, KeyError, Limiter, Quota, RateLimitLayer, Tiers, key::{self, PeerIp}};
    ///
    /// #[derive(Clone)]
    /// struct Plan(&'static str); // set by an auth layer
    ///
    /// let tiers = Tiers::new(Limiter::builder(Quota::per_hour(100)).name("free").build().unwrap())
    ///     .tier(Limiter::builder(Quota::per_hour(10_000)).name("paid").build().unwrap());
    /// // A selector's error never rejects the request: it gets the default
    /// // limiter ("free"), as a request without a plan does here.
    /// let plan = key::from_fn(|p: &Parts| match p.extensions.get::<Plan>() {
    ///     Some(plan) => Ok::<_, KeyError>(Key::from(plan.0)),
    ///     None => Ok(Key::from("free")),
    /// });
    /// let layer = RateLimitLayer::tiered(tiers, plan, PeerIp);
    /// # let _ = layer;
    /// ```
    ///
    /// # Panics
    /// If `extractor` gives neither one key nor one per limit, for the
    /// default's limiter and every tier's ([`KeyExtractor::key_count`]).
    pub fn tiered(tiers: Tiers, select: T, extractor: K) -> Self {
        let keys = extractor.key_count();
        assert_keys_fit("RateLimitLayer::tiered", keys, tiers.limiters());
        let default = tiers.default_limiter().clone();
        Self::new(default, Tiered::new(extractor, select, tiers))
    }
}

impl<T: key::KeyTuple> RateLimitLayer<key::Each<T>>
where
    key::Each<T>: KeyExtractor<Parts>,
{
    /// Limits with `limiter`, keying each of its limits with its own
    /// extractor, in order: say `(PeerIp, Header::new("x-api-key"), Global)`
    /// for limits per IP, per API key and in total.
    ///
    /// ```
    /// use redis_ratelimit::{Limiter, Quota, RateLimitLayer, key::{Global, Header, PeerIp}};
    ///
    /// let limiter = Limiter::builder(Quota::per_second(10))
    ///     .name("per-ip")
    ///     .limit("per-key", Quota::per_day(1000))
    ///     .limit("global", Quota::per_second(5000))
    ///     .build()
    ///     .unwrap();
    /// let layer = RateLimitLayer::each(limiter, (PeerIp, Header::new("x-api-key"), Global));
    /// # let _ = layer;
    /// ```
    ///
    /// # Panics
    /// If the tuple's length is not the limiter's number of limits.
    pub fn each(limiter: Limiter, extractors: T) -> Self {
        let limits = limiter.limits().count();
        assert_eq!(
            T::LEN,
            limits,
            "RateLimitLayer::each got {} extractors for a limiter with {limits} limits; \
             give one per limit, in order",
            T::LEN
        );
        Self::new(limiter, key::each(extractors))
    }
}

impl<K, R> RateLimitLayer<K, R> {
    /// Also send `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` (default: off). They describe one limit, the
    /// tightest: within the layer, its decision's binding limit; across
    /// nested layers (a global layer outside a per-route one), the layer
    /// keeps the set already on the response when that holds the client at
    /// least as tightly (fewer remaining, or as many and a later reset),
    /// and a set it cannot read is replaced; see the
    /// [`headers`](crate::headers#nested-layers) module.
    #[must_use]
    pub fn legacy_headers(self, enabled: bool) -> Self {
        self.set(|c| c.legacy_headers = enabled)
    }

    /// Also write the draft's `pk` partition key on `RateLimit` (default:
    /// off): `"default";r=4;t=60;pk=:3q2+7w5EZ1k=:`, a byte sequence that
    /// names the client's quota partition without revealing its key. It is
    /// a keyed hash (SipHash-1-3) of the client's key under a secret drawn at
    /// random here, so it is stable for one client across requests to this
    /// layer (and its clones) for the life of the process, and differs
    /// between processes. Use
    /// [`partition_key_secret`](Self::partition_key_secret) for a `pk` that
    /// replicas agree on. With several limits, `pk` is the binding limit's
    /// key's (see [`Decision`](crate::Decision)).
    ///
    /// ```
    /// use redis_ratelimit::{Limiter, Quota, RateLimitLayer, key::Header};
    ///
    /// let layer = RateLimitLayer::new(Limiter::new(Quota::per_minute(60)), Header::new("x-api-key"))
    ///     .partition_key(true);
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn partition_key(self, enabled: bool) -> Self {
        let keys = enabled.then(PartitionKeys::random);
        self.set(|c| c.partition_keys = keys)
    }

    /// Write `pk` (see [`partition_key`](Self::partition_key)) hashed with a
    /// key derived from `secret`, so that every replica configured with the
    /// same secret gives a client the same `pk`. Keep the secret secret:
    /// whoever has it can test guesses of a client's key against its `pk`.
    #[must_use]
    pub fn partition_key_secret(self, secret: impl AsRef<[u8]>) -> Self {
        let keys = PartitionKeys::from_secret(secret.as_ref());
        self.set(|c| c.partition_keys = Some(keys))
    }

    /// Makes each request spend `cost(request)` units instead of 1: say 5
    /// for `/search` and 1 for everything else. `cost` gets the request's
    /// `&http::request::Parts`.
    ///
    /// A cost of 0 lets the request through without spending. A cost above
    /// an enforced limit's [capacity](crate::Quota::capacity) could never be
    /// admitted: it is answered at once with
    /// [`Rejection::CostExceedsLimit`] (429 without `Retry-After`), and
    /// nothing is spent; it is counted as a denial of that limit
    /// (`ratelimit_denied_total`, with the `metrics` feature) and logged at
    /// `warn`, at most once a second. Above a shadow limit's, that limit
    /// reports a denial and blocks nothing.
    ///
    /// ```
    /// use redis_ratelimit::{Limiter, Quota, RateLimitLayer, key::Header};
    ///
    /// let layer = RateLimitLayer::new(Limiter::new(Quota::per_minute(100)), Header::new("x-api-key"))
    ///     .cost(|p| if p.uri.path() == "/search" { 5 } else { 1 });
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn cost<F>(self, cost: F) -> RateLimitLayer<key::WithCost<K, F>, R>
    where
        F: Fn(&Parts) -> u64 + Send + Sync + 'static,
    {
        self.map(|c| c.map_extractor(|keys| key::WithCost::shared(keys, cost)))
    }

    /// Gives a passed request's cost back when its response's status is
    /// one `refund` picks: [`Refund::ServerErrors`], [`Refund::ClientErrors`],
    /// [`Refund::Successes`] or [`Refund::when`] a closure says so. One
    /// extra store call per refunded response, run as a task after the
    /// response; see [`refund`](crate::refund).
    ///
    /// ```
    /// use redis_ratelimit::{Limiter, Quota, RateLimitLayer, key::PeerIp, refund::Refund};
    ///
    /// let layer = RateLimitLayer::new(Limiter::new(Quota::per_minute(100)), PeerIp)
    ///     .refund_when(Refund::ServerErrors);
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn refund_when(self, refund: Refund) -> Self {
        self.set(|c| c.refund = Some(refund))
    }

    /// Lets the requests `skip` picks through unlimited: no store call, no
    /// rate-limit headers. `skip` gets the request's
    /// `&http::request::Parts`; several skips add up (a request any of them
    /// picks is skipped). See [`skip`](crate::skip).
    ///
    /// ```
    /// use redis_ratelimit::{Limiter, Quota, RateLimitLayer, key::PeerIp};
    ///
    /// let layer = RateLimitLayer::new(Limiter::new(Quota::per_minute(100)), PeerIp)
    ///     .skip(|p| p.uri.path() == "/healthz");
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn skip<F>(self, skip: F) -> RateLimitLayer<Skipping<K, F>, R>
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        self.skip_by(skip)
    }

    /// Lets requests from clients in `networks` through unlimited, as
    /// [`skip`](Self::skip) does; the client is the address `networks`'
    /// identity reads, normally the layer's own key extractor
    /// ([`PeerIp`](struct@crate::key::PeerIp), [`ClientIp`](crate::key::ClientIp)).
    ///
    /// ```
    /// use redis_ratelimit::{Limiter, Quota, RateLimitLayer, key::ClientIp, skip::Networks};
    ///
    /// let client_ip = ClientIp::new().trust("10.0.0.0/8")?;
    /// let layer = RateLimitLayer::new(Limiter::new(Quota::per_minute(100)), client_ip.clone())
    ///     .skip_networks(Networks::new(client_ip, "127.0.0.0/8, ::1")?);
    /// # let _ = layer;
    /// # Ok::<(), redis_ratelimit::ConfigError>(())
    /// ```
    #[must_use]
    pub fn skip_networks<A>(
        self,
        networks: Networks<A>,
    ) -> RateLimitLayer<Skipping<K, Networks<A>>, R>
    where
        A: ClientAddr<Parts>,
    {
        self.skip_by(networks)
    }

    /// Lets the requests a [`Skip`](crate::skip::Skip) picks through
    /// unlimited, as [`skip`](Self::skip) does.
    #[must_use]
    pub fn skip_by<S>(self, skip: S) -> RateLimitLayer<Skipping<K, S>, R> {
        self.map(|c| c.map_extractor(|keys| Skipping::shared(keys, skip)))
    }
}
