//! [`KeyError`]: why no key could be derived, and the status it is answered
//! with.

use http::{HeaderName, StatusCode};

use super::MAX_HEADER_KEY_LEN;

/// Why no key could be derived for a request.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The header the [`Header`](super::Header) extractor reads was missing or empty.
    /// Answered with 400: the client must send it.
    #[error("request has no (or an empty) `{0}` header to rate limit by")]
    MissingHeader(HeaderName),
    /// The header the [`Header`](super::Header) extractor reads was longer than
    /// [`MAX_HEADER_KEY_LEN`] bytes. Answered with 400.
    #[error("the `{0}` header to rate limit by is over {MAX_HEADER_KEY_LEN} bytes")]
    HeaderTooLong(HeaderName),
    /// The server never told the request its peer address. Answered with 500
    /// and logged once: the server is misconfigured (axum needs
    /// `into_make_service_with_connect_info::<SocketAddr>()`; hyper servers
    /// must insert the `SocketAddr` into the request extensions; tonic's
    /// server needs the `tonic` feature).
    #[error(
        "no peer address on the request: serve axum with \
         `into_make_service_with_connect_info::<SocketAddr>()`, insert the \
         peer `SocketAddr` into the request extensions in a hyper server, or \
         enable the `tonic` feature under tonic's server"
    )]
    NoPeerAddr,
    /// A custom extractor refused the request with this status and reason.
    #[error("{reason}")]
    Rejected {
        /// The status to answer with.
        status: StatusCode,
        /// Why, for logs.
        reason: String,
    },
}

impl KeyError {
    /// The HTTP status a request with this error is answered with by default.
    pub fn status(&self) -> StatusCode {
        match self {
            KeyError::MissingHeader(_) | KeyError::HeaderTooLong(_) => StatusCode::BAD_REQUEST,
            KeyError::NoPeerAddr => StatusCode::INTERNAL_SERVER_ERROR,
            KeyError::Rejected { status, .. } => *status,
        }
    }

    /// Whether the error is the server's fault (logged at error level) rather
    /// than the client's.
    pub fn is_server_error(&self) -> bool {
        self.status().is_server_error()
    }
}
