//! The [`KeyExtractor`] trait, and its forwarding through `Box` and `Arc`.

use http::request::Parts;

use super::{Key, KeyError};

/// Derives the rate-limit [`Key`] (and the cost) of a request of type `R`.
///
/// `R` is `http::request::Parts` for the tower layer and
/// `actix_web::dev::ServiceRequest` for the actix middleware. Implement it for
/// your own extractor, or use [`from_fn()`](super::from_fn()) with a closure.
///
/// For a limiter with several limits, one extractor keys all of them, or
/// [`each`](super::each()) keys each limit with its own extractor, in order:
/// `each((PeerIp, Header::new("x-api-key"), Global))`. A request's cost is 1
/// unless the extractor says otherwise; see
/// [`RateLimitLayer::cost`](crate::RateLimitLayer::cost).
pub trait KeyExtractor<R: ?Sized = Parts>: Send + Sync + 'static {
    /// The key for this request, or why there is none.
    fn extract(&self, req: &R) -> Result<Key, KeyError>;

    /// How many keys [`extract_all`](Self::extract_all) yields: 1 (one key
    /// for every limit), or one per limit (for [`each`](super::each())).
    fn key_count(&self) -> usize {
        1
    }

    /// Pushes [`key_count`](Self::key_count) keys for the request.
    fn extract_all(&self, req: &R, keys: &mut Vec<Key>) -> Result<(), KeyError> {
        keys.push(self.extract(req)?);
        Ok(())
    }

    /// The units this request spends (default 1).
    fn cost(&self, req: &R) -> u64 {
        let _ = req;
        1
    }

    /// Whether the request is not limited at all: no store call, no
    /// rate-limit headers (default `false`). Set with
    /// [`RateLimitLayer::skip`](crate::RateLimitLayer::skip), or
    /// [`Skipping`](crate::skip::Skipping) for any layer: the rate-limit
    /// and concurrency layers and middleware all ask it.
    fn skip(&self, req: &R) -> bool {
        let _ = req;
        false
    }

    /// The limiter of the request's tier, or `None` for the layer's own
    /// (default `None`). Set with
    /// [`RateLimitLayer::tiered`](crate::RateLimitLayer::tiered); the
    /// rate-limit layer and middleware ask it, the concurrency layer does
    /// not.
    fn tier(&self, req: &R) -> Option<&crate::Limiter> {
        let _ = req;
        None
    }

    /// Every limiter [`tier`](Self::tier) may pick (default none): the
    /// layers check, when built, that each fits
    /// [`key_count`](Self::key_count), so that a tier of a different number
    /// of limits is not a 500 on each of its requests.
    fn tier_limiters(&self) -> Vec<&crate::Limiter> {
        Vec::new()
    }
}

macro_rules! forward_key_extractor {
    ($($ptr:ident)::+) => {
        impl<R: ?Sized + 'static> KeyExtractor<R> for $($ptr)::+<dyn KeyExtractor<R>> {
            fn extract(&self, req: &R) -> Result<Key, KeyError> {
                (**self).extract(req)
            }

            fn key_count(&self) -> usize {
                (**self).key_count()
            }

            fn extract_all(&self, req: &R, keys: &mut Vec<Key>) -> Result<(), KeyError> {
                (**self).extract_all(req, keys)
            }

            fn cost(&self, req: &R) -> u64 {
                (**self).cost(req)
            }

            fn skip(&self, req: &R) -> bool {
                (**self).skip(req)
            }

            fn tier(&self, req: &R) -> Option<&crate::Limiter> {
                (**self).tier(req)
            }

            fn tier_limiters(&self) -> Vec<&crate::Limiter> {
                (**self).tier_limiters()
            }
        }
    };
}

forward_key_extractor!(Box);
forward_key_extractor!(std::sync::Arc);
