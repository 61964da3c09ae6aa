//! [`Global`]: one key shared by every request.

use super::{Key, KeyError, KeyExtractor};

/// One key shared by every request: a global cap.
#[derive(Debug, Clone, Copy, Default)]
pub struct Global;

impl<R: ?Sized> KeyExtractor<R> for Global {
    fn extract(&self, _: &R) -> Result<Key, KeyError> {
        Ok(Key::from("global"))
    }
}

#[cfg(test)]
mod tests {
    use http::{Request, request::Parts};

    use super::*;
    use crate::key::request::parts;

    #[test]
    fn global_is_one_key_for_every_request() {
        let p = parts(Request::get("/x"));
        assert_eq!(
            KeyExtractor::<Parts>::extract(&Global, &p)
                .unwrap()
                .as_bytes(),
            b"global"
        );
    }
}
