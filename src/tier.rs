//! Tiers: the limiter chosen per request, by name.
//!
//! A [`Tiers`] holds a default [`Limiter`] and one limiter per named tier;
//! each tier is named after its limiter's (first) limit name, so the
//! `RateLimit` and `RateLimit-Policy` headers show the tier's own policy
//! name and quota, and its counters are its own (see
//! [`LimiterBuilder::name`](crate::LimiterBuilder::name)).
//!
//! The tier of a request is picked by a [`KeyExtractor`] whose key is the
//! tier's name: [`Header::new("x-plan")`](crate::key::Header), or
//! [`from_fn`](crate::key::from_fn) over a JWT claim or a request extension
//! that an auth layer set. A request whose selector fails (no header), or
//! names no tier, uses the default (a selector's server error, such as a
//! [`from_fn`](crate::key::from_fn) that finds no extension, is logged
//! once, at `warn`). Tier names come from clients: an unknown
//! name is only looked up, and never creates a limiter or a key space. A
//! header is the client's to write: `Header::new("x-plan")` picks the tier
//! only behind a gateway that sets or strips it (replaces it: `Header`
//! reads the first value, so a gateway that appends its own leaves the
//! client's first); anywhere else a client names the tier itself, and since
//! each tier counts apart, one that switches names between requests is
//! admitted every tier's quota in a window, the default's included. Pick
//! the tier from what your auth step
//! established (a request extension, a verified claim), as
//! `examples/behind_proxy.rs` does.
//!
//! ```
//! use redis_ratelimit::{Limiter, Quota, RateLimitLayer, key::{Header, PeerIp}, tier::Tiers};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let tiers = Tiers::new(Limiter::builder(Quota::per_hour(100)).name("anonymous").build()?)
//!     .tier(Limiter::builder(Quota::per_hour(1_000)).name("free").build()?)
//!     .tier(Limiter::builder(Quota::per_hour(10_000)).name("pro").build()?);
//! let layer = RateLimitLayer::tiered(tiers.clone(), Header::new("x-plan"), PeerIp);
//! assert_eq!(tiers.get("pro").quota(), Quota::per_hour(10_000));
//! assert_eq!(tiers.get("gold").name(), "anonymous");
//! # let _ = layer;
//! # Ok(()) }
//! ```

use std::{
    collections::HashMap,
    fmt,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use crate::{
    Decision, Error, Limiter,
    key::{KeyExtractor, Part, With},
};

/// A default [`Limiter`] and named tiers, each with its own limiter.
///
/// Clones are cheap and share the tiers. Business code can use it too:
/// [`get`](Self::get) a tier's limiter, or [`check`](Self::check) a key in
/// a tier.
#[derive(Clone)]
pub struct Tiers {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    default: Limiter,
    tiers: HashMap<Box<[u8]>, Limiter>,
}

impl fmt::Debug for Tiers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tiers")
            .field("default", &self.inner.default)
            .field("tiers", &self.names().collect::<Vec<_>>())
            .finish()
    }
}

impl Tiers {
    /// Tiers whose default, for requests without a known tier, is
    /// `default`.
    pub fn new(default: Limiter) -> Self {
        Self {
            inner: Arc::new(Inner {
                default,
                tiers: HashMap::new(),
            }),
        }
    }

    /// Adds a tier named after `limiter`'s [name](Limiter::name), limited by
    /// it.
    ///
    /// # Panics
    /// If a tier, or the default, already has that name: two tiers of one
    /// name would be ambiguous, and would share counters in one store.
    #[must_use]
    pub fn tier(self, limiter: Limiter) -> Self {
        let mut inner = Arc::unwrap_or_clone(self.inner);
        let name = limiter.name().to_owned();
        assert!(
            name != inner.default.name() && !inner.tiers.contains_key(name.as_bytes()),
            "Tiers::tier: a tier named {name:?} is already there; name every tier's limiter \
             after its tier (LimiterBuilder::name), each name once, other than the default's"
        );
        inner.tiers.insert(name.into_bytes().into(), limiter);
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The limiter of tier `name`, or the default's if there is no such tier.
    pub fn get<N: AsRef<[u8]> + ?Sized>(&self, name: &N) -> &Limiter {
        self.find(name.as_ref()).unwrap_or(&self.inner.default)
    }

    /// The limiter of tier `name`, if there is one.
    pub fn find(&self, name: &[u8]) -> Option<&Limiter> {
        self.inner.tiers.get(name)
    }

    /// The default limiter.
    pub fn default_limiter(&self) -> &Limiter {
        &self.inner.default
    }

    /// The tiers' names, in no particular order (the default's not among
    /// them).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.inner.tiers.values().map(Limiter::name)
    }

    /// The default limiter, then every tier's.
    pub(crate) fn limiters(&self) -> impl Iterator<Item = &Limiter> {
        std::iter::once(&self.inner.default).chain(self.inner.tiers.values())
    }

    /// Whether there is no tier but the default.
    pub fn is_empty(&self) -> bool {
        self.inner.tiers.is_empty()
    }

    /// Checks `key` in tier `tier` (the default if there is no such tier);
    /// see [`Limiter::check`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use redis_ratelimit::{Limiter, Quota, tier::Tiers};
    ///
    /// let tiers = Tiers::new(Limiter::new(Quota::per_minute(1)))
    ///     .tier(Limiter::builder(Quota::per_minute(2)).name("pro").build()?);
    /// let d = tiers.check("pro", "user:7", 1).await?;
    /// assert_eq!((d.policy(), d.remaining()), ("pro", 1));
    /// let d = tiers.check("nope", "user:7", 1).await?;
    /// assert_eq!((d.policy(), d.remaining()), ("default", 0));
    /// # Ok(()) }
    /// ```
    pub async fn check<N, K>(&self, tier: &N, key: &K, cost: u64) -> Result<Decision, Error>
    where
        N: AsRef<[u8]> + ?Sized,
        K: AsRef<[u8]> + ?Sized,
    {
        self.get(tier).check(key, cost).await
    }
}

/// An extractor that also picks each request's tier; made by
/// [`RateLimitLayer::tiered`](crate::RateLimitLayer::tiered).
pub type Tiered<K, T> = With<K, TierBy<T>>;

/// The [`Part`] of [`Tiered`]: the tier named by `T`'s key for the request.
#[derive(Clone, Debug)]
pub struct TierBy<T> {
    select: T,
    tiers: Tiers,
    /// A selector's server error was logged (once per layer).
    logged: Arc<AtomicBool>,
}

impl<K, T> Tiered<K, T> {
    /// Keys with `keys`, and limits each request by the tier `select` names
    /// (its key is the tier's name).
    pub fn new(keys: K, select: T, tiers: Tiers) -> Self {
        let logged = Arc::default();
        Self::wrap(
            Arc::new(keys),
            TierBy {
                select,
                tiers,
                logged,
            },
        )
    }

    /// The tiers.
    pub fn tiers(&self) -> &Tiers {
        &self.part().tiers
    }
}

impl<R: ?Sized, K, T> Part<R, K> for TierBy<T>
where
    K: KeyExtractor<R>,
    T: KeyExtractor<R>,
{
    /// The named tier's limiter; the default's (`Some`) when the selector
    /// fails or names no tier.
    fn tier_limiters<'a>(&'a self, _: &'a K) -> Vec<&'a Limiter> {
        self.tiers.limiters().collect()
    }

    fn tier<'a>(&'a self, _: &'a K, req: &R) -> Option<&'a Limiter> {
        if self.tiers.is_empty() {
            return Some(self.tiers.default_limiter());
        }
        Some(match self.select.extract(req) {
            Ok(name) => self.tiers.get(name.as_bytes()),
            Err(e) => {
                // A missing header is the client's; a server error (a
                // selector reading what an auth step inside the limit never
                // set) puts every such request in the default tier, quietly
                // but for this line.
                if e.is_server_error() && !self.logged.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "rate limit: the tier selector failed with a server error; such requests get the default tier (logged once)");
                }
                self.tiers.default_limiter()
            }
        })
    }
}
