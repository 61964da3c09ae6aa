//! [`RequestInfo`]: what the built-in extractors read off a request, in any
//! framework.

use std::net::SocketAddr;

use http::{HeaderName, request::Parts};

/// What the built-in extractors read off a request, in any framework.
///
/// Implemented for `http::request::Parts` (tower: axum, hyper, tonic) and,
/// with the `actix` feature, for `actix_web::dev::ServiceRequest`.
pub trait RequestInfo {
    /// The peer's socket address, if the server recorded it.
    fn peer_addr(&self) -> Option<SocketAddr>;

    /// Every value of header `name`, in the order received.
    fn header_values<'a>(&'a self, name: &HeaderName) -> impl Iterator<Item = &'a [u8]> + 'a;
}

impl RequestInfo for Parts {
    /// A `SocketAddr` request extension (insert one in a hyper server),
    /// with the `axum` feature axum's `ConnectInfo<SocketAddr>`, and with
    /// the `tonic` feature tonic's `TcpConnectInfo`.
    fn peer_addr(&self) -> Option<SocketAddr> {
        if let Some(addr) = self.extensions.get::<SocketAddr>() {
            return Some(*addr);
        }
        #[cfg(feature = "axum")]
        if let Some(info) = self
            .extensions
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
        {
            return Some(info.0);
        }
        #[cfg(feature = "tonic")]
        if let Some(addr) = super::tonic::peer_addr(&self.extensions) {
            return Some(addr);
        }
        None
    }

    fn header_values<'a>(&'a self, name: &HeaderName) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers.get_all(name).into_iter().map(|v| v.as_bytes())
    }
}

/// A request's parts, for the extractors' unit tests.
#[cfg(test)]
pub(super) fn parts(req: http::request::Builder) -> Parts {
    req.body(()).unwrap().into_parts().0
}
