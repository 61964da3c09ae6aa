//! [`each`]: one extractor per limit of a limiter, from a tuple.

use super::{Key, KeyError, KeyExtractor};

/// A tuple of extractors, one per limit; see [`each`].
pub trait KeyTuple: Send + Sync + 'static {
    /// The tuple's length.
    const LEN: usize;
}

/// One extractor per limit of a limiter, in order; made by [`each`].
#[derive(Debug, Clone)]
pub struct Each<T>(T);

/// Keys each limit of a limiter with its own extractor, in the order the
/// limits were added: `each((PeerIp, Header::new("x-api-key"), Global))`.
/// [`RateLimitLayer::each`](crate::RateLimitLayer::each) builds a layer
/// from it and checks the count.
pub fn each<T: KeyTuple>(extractors: T) -> Each<T> {
    Each(extractors)
}

impl<T> Each<T> {
    /// The extractors.
    pub fn into_inner(self) -> T {
        self.0
    }
}

macro_rules! tuple_key_extractor {
    ($n:literal; $first:ident $(, $rest:ident)*) => {
        impl<$first: Send + Sync + 'static, $($rest: Send + Sync + 'static),*> KeyTuple
            for ($first, $($rest),*)
        {
            const LEN: usize = $n;
        }

        impl<R: ?Sized, $first, $($rest),*> KeyExtractor<R> for Each<($first, $($rest),*)>
        where
            $first: KeyExtractor<R>,
            $($rest: KeyExtractor<R>,)*
        {
            /// The first extractor's key.
            fn extract(&self, req: &R) -> Result<Key, KeyError> {
                self.0.0.extract(req)
            }

            fn key_count(&self) -> usize {
                $n
            }

            #[allow(non_snake_case)]
            fn extract_all(&self, req: &R, keys: &mut Vec<Key>) -> Result<(), KeyError> {
                let ($first, $($rest),*) = &self.0;
                keys.push($first.extract(req)?);
                $(keys.push($rest.extract(req)?);)*
                Ok(())
            }
        }
    };
}

tuple_key_extractor!(2; A, B);
tuple_key_extractor!(3; A, B, C);
tuple_key_extractor!(4; A, B, C, D);
