//! [`from_fn`]: a key extractor made from a closure.

use std::fmt;

use super::{Key, KeyError, KeyExtractor};

/// A key extractor made from a closure; see [`from_fn`].
#[derive(Clone)]
pub struct FromFn<F>(F);

impl<F> fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FromFn(..)")
    }
}

/// Keys by a closure over the request (`&http::request::Parts` for tower).
///
/// Return [`KeyError::Rejected`] to answer with a status of your choice.
pub fn from_fn<F>(f: F) -> FromFn<F> {
    FromFn(f)
}

impl<R: ?Sized, F> KeyExtractor<R> for FromFn<F>
where
    F: Fn(&R) -> Result<Key, KeyError> + Send + Sync + 'static,
{
    fn extract(&self, req: &R) -> Result<Key, KeyError> {
        (self.0)(req)
    }
}

#[cfg(test)]
mod tests {
    use http::{Request, StatusCode, request::Parts};

    use super::*;
    use crate::key::request::parts;

    #[test]
    fn a_closure_can_reject_with_its_own_status() {
        let p = parts(Request::get("/x"));
        let deny = from_fn(|_: &Parts| {
            Err(KeyError::Rejected {
                status: StatusCode::UNAUTHORIZED,
                reason: "no user".into(),
            })
        });
        assert_eq!(
            deny.extract(&p).unwrap_err().status(),
            StatusCode::UNAUTHORIZED
        );
    }
}
