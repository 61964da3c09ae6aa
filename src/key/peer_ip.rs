//! [`PeerIp`](struct@PeerIp): keys by the peer's IP address.

use std::net::IpAddr;

use super::{Grouping, Key, KeyError, KeyExtractor, RequestInfo};

/// Keys by the peer's IP address (the port is dropped), IPv6 by /64.
///
/// Under tower it reads a `SocketAddr` request extension (insert one in a
/// hyper server), with the `axum` feature (on by default) axum's
/// `ConnectInfo<SocketAddr>`, and with the `tonic` feature the
/// `TcpConnectInfo` of `tonic::transport::Server`; under actix, the
/// connection's peer address.
/// Behind a proxy every request comes from the proxy's address: use
/// [`ClientIp`](super::ClientIp) there instead (see [`proxies`](super::proxies)).
///
/// The keys are [`ClientIp`](super::ClientIp)'s, from the same code, so switching between
/// the two keeps the counters:
///
/// * an IPv4-mapped IPv6 address (`::ffff:192.0.2.1`, as a dual-stack
///   listener such as `[::]:3000` reports IPv4 peers) is keyed as IPv4
///   (`192.0.2.1`);
/// * an IPv6 peer is keyed by its /64 network (`2001:db8:1:2::/64`), as one
///   host often has a whole /64 to pick addresses from; change it with
///   [`ipv6_prefix`](Self::ipv6_prefix) (128: by address);
/// * an IPv4 peer is keyed by its address; group it with
///   [`ipv4_prefix`](Self::ipv4_prefix);
/// * an IPv6 zone (scope id) is dropped.
///
/// Before, `PeerIp` keyed every address as written, `::ffff:127.0.0.1` and
/// each IPv6 address on its own: counters under those keys are not carried
/// over.
///
/// `PeerIp` is also a constant of this type with the defaults, so it is
/// written like a unit value:
///
/// ```
/// use std::net::SocketAddr;
/// use http::Request;
/// use redis_ratelimit::key::{KeyExtractor, PeerIp};
///
/// let req = |peer: &str| {
///     let peer: SocketAddr = peer.parse().unwrap();
///     Request::get("/").extension(peer).body(()).unwrap().into_parts().0
/// };
/// let key = |k: PeerIp, peer| k.extract(&req(peer)).unwrap().as_bytes().to_vec();
/// assert_eq!(key(PeerIp, "203.0.113.9:4711"), b"203.0.113.9");
/// assert_eq!(key(PeerIp, "[::ffff:203.0.113.9]:4711"), b"203.0.113.9");
/// assert_eq!(key(PeerIp, "[2001:db8:1:2:aaaa::1]:4711"), b"2001:db8:1:2::/64");
/// assert_eq!(key(PeerIp.ipv6_prefix(48), "[2001:db8:1:2::1]:1"), b"2001:db8:1::/48");
/// assert_eq!(key(PeerIp::new().ipv6_prefix(128), "[2001:db8::1]:1"), b"2001:db8::1");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use]
pub struct PeerIp {
    grouping: Grouping,
}

/// [`PeerIp::new()`]: the peer's address, IPv6 by /64. Lets `PeerIp` be
/// written as a value, as in `RateLimitLayer::new(limiter, PeerIp)`.
#[allow(non_upper_case_globals)]
pub const PeerIp: PeerIp = PeerIp::new();

impl PeerIp {
    /// Keys by the peer address: IPv4 by address (IPv4-mapped IPv6 as
    /// IPv4), IPv6 by /64.
    pub const fn new() -> Self {
        Self {
            grouping: Grouping::DEFAULT,
        }
    }

    /// Groups IPv6 peers by networks of this prefix length (default 64; 128
    /// keys by address). Values above 128 are clamped to 128. As
    /// [`ClientIp::ipv6_prefix`](super::ClientIp::ipv6_prefix).
    pub const fn ipv6_prefix(self, len: u8) -> Self {
        Self {
            grouping: self.grouping.ipv6_prefix(len),
        }
    }

    /// Groups IPv4 peers by networks of this prefix length (default 32: by
    /// address; 24 groups each /24). Values above 32 are clamped to 32. As
    /// [`ClientIp::ipv4_prefix`](super::ClientIp::ipv4_prefix).
    pub const fn ipv4_prefix(self, len: u8) -> Self {
        Self {
            grouping: self.grouping.ipv4_prefix(len),
        }
    }
}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

impl PeerIp {
    /// The peer's address for `req`, before grouping (IPv4-mapped IPv6 as
    /// IPv4): the address its key is made from, or `None` without one.
    /// [`skip::Networks`](crate::skip::Networks) matches on it.
    pub fn client_addr<R: RequestInfo + ?Sized>(&self, req: &R) -> Option<IpAddr> {
        req.peer_addr().map(|a| a.ip().to_canonical())
    }
}

impl<R: RequestInfo + ?Sized> KeyExtractor<R> for PeerIp {
    fn extract(&self, req: &R) -> Result<Key, KeyError> {
        let addr = req.peer_addr().ok_or(KeyError::NoPeerAddr)?;
        Ok(self.grouping.key(addr.ip()))
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use http::{Request, StatusCode};

    use super::*;
    use crate::key::{ClientIp, request::parts};

    #[test]
    fn peer_ip_reads_socket_addr_or_connect_info() {
        let addr: SocketAddr = "203.0.113.9:4711".parse().unwrap();
        let p = parts(Request::get("/").extension(addr));
        assert_eq!(PeerIp.extract(&p).unwrap().as_bytes(), b"203.0.113.9");
        #[cfg(feature = "axum")]
        {
            let v6: SocketAddr = "[2001:db8::1]:80".parse().unwrap();
            let p = parts(Request::get("/").extension(axum::extract::ConnectInfo(v6)));
            assert_eq!(PeerIp.extract(&p).unwrap().as_bytes(), b"2001:db8::/64");
        }
        let err = PeerIp.extract(&parts(Request::get("/"))).unwrap_err();
        assert_eq!(err.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(err.is_server_error());
    }

    fn peer_key(extractor: PeerIp, peer: SocketAddr) -> Key {
        extractor
            .extract(&parts(Request::get("/").extension(peer)))
            .unwrap()
    }

    /// A dual-stack listener reports IPv4 peers as `::ffff:a.b.c.d`; an IPv6
    /// peer picks any address of its /64; a zone is not part of the client.
    #[test]
    fn peer_ip_keys_mapped_ipv4_as_ipv4_and_ipv6_by_64() {
        let key = |peer: &str| peer_key(PeerIp, peer.parse().unwrap());
        assert_eq!(key("[::ffff:127.0.0.1]:5000").as_bytes(), b"127.0.0.1");
        assert_eq!(key("[::ffff:127.0.0.1]:5000"), key("127.0.0.1:1"));
        assert_eq!(key("[2001:db8:1:2::1]:1").as_bytes(), b"2001:db8:1:2::/64");
        for host in ["::2", ":aaaa:bbbb:cccc:dddd", ":ffff:ffff:ffff:ffff"] {
            let rotated = key(&format!("[2001:db8:1:2{host}]:1"));
            assert_eq!(rotated.as_bytes(), b"2001:db8:1:2::/64", "{host}");
        }
        assert_eq!(key("[2001:db8:1:3::1]:1").as_bytes(), b"2001:db8:1:3::/64");
        // Short keys stay inline: no allocation per request.
        for peer in ["[2001:db8:1:2::1]:1", "[::ffff:127.0.0.1]:1"] {
            assert!(key(peer).is_inline(), "{peer}");
        }
        let widest = "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:1"
            .parse()
            .unwrap();
        let k = peer_key(PeerIp.ipv6_prefix(127), widest);
        assert_eq!(k.as_bytes(), b"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/127");
        assert!(k.is_inline());
        // A zone (scope id) is dropped.
        let scoped = std::net::SocketAddrV6::new("fe80::1".parse().unwrap(), 1, 0, 7);
        assert_eq!(peer_key(PeerIp, scoped.into()).as_bytes(), b"fe80::/64");
        // The unit-like constant is `new()` and `default()`.
        assert_eq!(PeerIp, PeerIp::new());
        assert_eq!(PeerIp, PeerIp::default());
    }

    #[test]
    fn peer_ip_prefixes_are_configurable_and_clamped() {
        let key = |k: PeerIp, peer: &str| peer_key(k, peer.parse().unwrap());
        let wide = PeerIp.ipv6_prefix(48).ipv4_prefix(24);
        assert_eq!(
            key(wide, "[2001:db8:1:2::1]:1").as_bytes(),
            b"2001:db8:1::/48"
        );
        assert_eq!(key(wide, "203.0.113.77:1").as_bytes(), b"203.0.113.0/24");
        assert_eq!(
            key(wide, "[::ffff:203.0.113.77]:1").as_bytes(),
            b"203.0.113.0/24"
        );
        let exact = PeerIp::new().ipv6_prefix(200).ipv4_prefix(99);
        assert_eq!(key(exact, "[2001:db8::1]:1").as_bytes(), b"2001:db8::1");
        assert_eq!(key(exact, "203.0.113.77:1").as_bytes(), b"203.0.113.77");
        // The same keys as ClientIp's, for the same prefixes.
        let client_ip = ClientIp::new().ipv6_prefix(48).ipv4_prefix(24);
        for peer in [
            "[2001:db8:1:2::1]:1",
            "203.0.113.77:1",
            "[::ffff:1.2.3.4]:1",
        ] {
            let p = parts(Request::get("/").extension(peer.parse::<SocketAddr>().unwrap()));
            assert_eq!(client_ip.extract(&p).unwrap(), key(wide, peer), "{peer}");
        }
    }
}
