//! [`Header`]: keys by the first value of a request header.

use http::HeaderName;

use super::{Key, KeyError, KeyExtractor, RequestInfo};

/// The longest header value [`Header`] keys by: longer values are answered
/// with 400 ([`KeyError::HeaderTooLong`]) rather than hashed. No API key or
/// tenant id needs 8 KiB, and the bound caps the hashing work a client can
/// cause.
pub const MAX_HEADER_KEY_LEN: usize = 8 * 1024;

/// Keys by the first value of a request header, such as `x-api-key`.
///
/// The value is taken as raw bytes (it need not be UTF-8; the limiter hashes
/// any value that is not short and plain before it reaches Redis). A missing
/// or empty header is [`KeyError::MissingHeader`] (400); a value over
/// [`MAX_HEADER_KEY_LEN`] bytes is [`KeyError::HeaderTooLong`] (400).
#[derive(Debug, Clone)]
pub struct Header {
    name: HeaderName,
}

impl Header {
    /// Keys by header `name`.
    ///
    /// # Panics
    /// If `name` is not a valid header name; use [`Header::from_name`] for
    /// names that come from configuration.
    pub fn new(name: &str) -> Self {
        match HeaderName::try_from(name) {
            Ok(name) => Self { name },
            Err(_) => panic!("{name:?} is not a valid HTTP header name"),
        }
    }

    /// Keys by header `name`.
    pub fn from_name(name: HeaderName) -> Self {
        Self { name }
    }

    /// The header read.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }
}

impl<R: RequestInfo + ?Sized> KeyExtractor<R> for Header {
    fn extract(&self, req: &R) -> Result<Key, KeyError> {
        match req.header_values(&self.name).next() {
            Some(v) if v.len() > MAX_HEADER_KEY_LEN => {
                Err(KeyError::HeaderTooLong(self.name.clone()))
            }
            Some(v) if !v.is_empty() => Ok(Key::copy_from(v)),
            _ => Err(KeyError::MissingHeader(self.name.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use http::{Request, StatusCode};

    use super::*;
    use crate::key::request::parts;

    #[test]
    fn header_takes_raw_bytes_and_rejects_missing_or_empty() {
        let h = Header::new("x-api-key");
        let p = parts(Request::get("/").header("x-api-key", &b"\xff\xfe{}"[..]));
        assert_eq!(h.extract(&p).unwrap().as_bytes(), b"\xff\xfe{}");
        let p = parts(
            Request::get("/")
                .header("x-api-key", "")
                .header("x-api-key", "b"),
        );
        assert_eq!(h.extract(&p).unwrap_err().status(), StatusCode::BAD_REQUEST);
        let p = parts(
            Request::get("/")
                .header("x-api-key", "a")
                .header("x-api-key", "b"),
        );
        assert_eq!(h.extract(&p).unwrap().as_bytes(), b"a");
    }

    #[test]
    fn header_refuses_values_over_the_bound() {
        let h = Header::new("x-api-key");
        let at_bound = vec![b'a'; MAX_HEADER_KEY_LEN];
        let p = parts(Request::get("/").header("x-api-key", &at_bound[..]));
        assert_eq!(h.extract(&p).unwrap().as_bytes().len(), MAX_HEADER_KEY_LEN);
        let over = vec![b'a'; MAX_HEADER_KEY_LEN + 1];
        let p = parts(Request::get("/").header("x-api-key", &over[..]));
        let err = h.extract(&p).unwrap_err();
        assert!(matches!(err, KeyError::HeaderTooLong(_)), "{err}");
        assert_eq!(err.status(), StatusCode::BAD_REQUEST);
        assert!(!err.is_server_error());
    }
}
