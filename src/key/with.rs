//! [`With`]: an extractor plus one part of the request's policy (its cost,
//! a skip list or its tier), the one wrapper behind the layers' `cost`,
//! `skip` and `tiered` methods.

use std::{fmt, sync::Arc};

use super::{Key, KeyError, KeyExtractor};
use crate::Limiter;

/// An extractor `K` with a [`Part`] `P` that answers one more question
/// about each request: [`WithCost`] (what it spends),
/// [`Skipping`](crate::skip::Skipping) (whether it is limited at all) or
/// [`Tiered`](crate::tier::Tiered) (which limiter decides it). Keys come
/// from `K` unchanged; the layers' builder methods make these.
pub struct With<K, P> {
    keys: Arc<K>,
    part: P,
}

/// An extractor with a cost function; see
/// [`RateLimitLayer::cost`](crate::RateLimitLayer::cost).
pub type WithCost<K, F> = With<K, Cost<F>>;

/// What a [`With`] adds to its extractor `K`, for requests of type `R`.
/// Every method defaults to `K`'s own answer; a part overrides one.
pub trait Part<R: ?Sized, K: KeyExtractor<R>>: Send + Sync + 'static {
    /// The units the request spends.
    fn cost(&self, keys: &K, req: &R) -> u64 {
        keys.cost(req)
    }

    /// Whether the request goes through unlimited.
    fn skip(&self, keys: &K, req: &R) -> bool {
        keys.skip(req)
    }

    /// The limiter that decides the request (`None`: the layer's own).
    fn tier<'a>(&'a self, keys: &'a K, req: &R) -> Option<&'a Limiter> {
        keys.tier(req)
    }

    /// Every limiter `tier` may pick.
    fn tier_limiters<'a>(&'a self, keys: &'a K) -> Vec<&'a Limiter> {
        keys.tier_limiters()
    }
}

impl<K, P> With<K, P> {
    /// With an extractor a layer already holds, without cloning it.
    pub(crate) fn wrap(keys: Arc<K>, part: P) -> Self {
        Self { keys, part }
    }

    /// What this wrapper adds.
    pub(crate) fn part(&self) -> &P {
        &self.part
    }
}

impl<K, F> WithCost<K, F> {
    /// Keys with `keys`; each request spends `cost(request)` units.
    pub fn new(keys: K, cost: F) -> Self {
        Self::shared(Arc::new(keys), cost)
    }

    /// With an extractor a layer already holds, without cloning it.
    pub(crate) fn shared(keys: Arc<K>, cost: F) -> Self {
        Self::wrap(keys, Cost(cost))
    }
}

impl<K, P: Clone> Clone for With<K, P> {
    fn clone(&self) -> Self {
        Self::wrap(self.keys.clone(), self.part.clone())
    }
}

impl<K: fmt::Debug, P: fmt::Debug> fmt::Debug for With<K, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("With")
            .field("keys", &self.keys)
            .field("part", &self.part)
            .finish()
    }
}

impl<R: ?Sized, K, P> KeyExtractor<R> for With<K, P>
where
    K: KeyExtractor<R>,
    P: Part<R, K>,
{
    fn extract(&self, req: &R) -> Result<Key, KeyError> {
        self.keys.extract(req)
    }

    fn key_count(&self) -> usize {
        self.keys.key_count()
    }

    fn extract_all(&self, req: &R, keys: &mut Vec<Key>) -> Result<(), KeyError> {
        self.keys.extract_all(req, keys)
    }

    fn cost(&self, req: &R) -> u64 {
        self.part.cost(&self.keys, req)
    }

    fn skip(&self, req: &R) -> bool {
        self.part.skip(&self.keys, req)
    }

    fn tier(&self, req: &R) -> Option<&Limiter> {
        self.part.tier(&self.keys, req)
    }

    fn tier_limiters(&self) -> Vec<&Limiter> {
        self.part.tier_limiters(&self.keys)
    }
}

/// The [`Part`] of [`WithCost`]: each request spends `F(request)` units.
#[derive(Clone)]
pub struct Cost<F>(F);

impl<F> fmt::Debug for Cost<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cost").finish_non_exhaustive()
    }
}

impl<R: ?Sized, K, F> Part<R, K> for Cost<F>
where
    K: KeyExtractor<R>,
    F: Fn(&R) -> u64 + Send + Sync + 'static,
{
    fn cost(&self, _: &K, req: &R) -> u64 {
        (self.0)(req)
    }
}
