//! [`WithCost`]: an extractor with a cost function.

use std::{fmt, sync::Arc};

use super::{Key, KeyError, KeyExtractor};

/// An extractor with a cost function; see
/// [`RateLimitLayer::cost`](crate::RateLimitLayer::cost).
pub struct WithCost<K, F> {
    keys: Arc<K>,
    cost: F,
}

impl<K, F> WithCost<K, F> {
    /// Keys with `keys`; each request spends `cost(request)` units.
    pub fn new(keys: K, cost: F) -> Self {
        Self::shared(Arc::new(keys), cost)
    }

    /// Keys with an extractor a layer already holds, without cloning it.
    pub(crate) fn shared(keys: Arc<K>, cost: F) -> Self {
        Self { keys, cost }
    }
}

impl<K, F: Clone> Clone for WithCost<K, F> {
    fn clone(&self) -> Self {
        Self::shared(self.keys.clone(), self.cost.clone())
    }
}

impl<K: fmt::Debug, F> fmt::Debug for WithCost<K, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WithCost")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl<R: ?Sized, K, F> KeyExtractor<R> for WithCost<K, F>
where
    K: KeyExtractor<R>,
    F: Fn(&R) -> u64 + Send + Sync + 'static,
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
        (self.cost)(req)
    }

    fn skip(&self, req: &R) -> bool {
        self.keys.skip(req)
    }

    fn tier(&self, req: &R) -> Option<&crate::Limiter> {
        self.keys.tier(req)
    }
}
