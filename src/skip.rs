//! Requests that are not limited at all: [`Skip`] predicates, and
//! [`Networks`], a ready-made skip by IP address or CIDR range that matches
//! the same client address the key is made from.
//!
//! A skipped request makes no store call and gets no rate-limit headers: the
//! inner service answers it as if there were no layer. Set one with
//! [`RateLimitLayer::skip`](crate::RateLimitLayer::skip) (a closure over the
//! request) or [`RateLimitLayer::skip_networks`](crate::RateLimitLayer::skip_networks);
//! the actix middleware has the same methods.
//!
//! [`Networks`] asks its *identity* for the client address: give it the
//! extractor that keys the requests, so the skip and the key agree on who
//! the client is.
//!
//! | identity | the client address |
//! |---|---|
//! | [`PeerIp`](struct@crate::key::PeerIp) | the peer address |
//! | [`ClientIp`] | the client behind the trusted proxies, with the same settings |
//!
//! Addresses are compared as the key sees them: an IPv4-mapped IPv6 address
//! (`::ffff:127.0.0.1`) as IPv4, and a range of mapped addresses
//! (`::ffff:10.0.0.0/104`) as the IPv4 range (`10.0.0.0/8`). A client that
//! is not a trusted proxy cannot be skipped by writing a forwarding header:
//! `ClientIp` never reads it from such a peer. The exception is
//! [`ClientIp::hops`] without [`ClientIp::trust`], which trusts whatever
//! peer it hears from, and so is only for a server that no client reaches
//! but through those proxies: there a client that reaches it directly
//! names its own address, and so can name one of the skip list's.
//!
//! Keep the skip list apart from the trusted proxies: where `ClientIp`'s
//! walk ends on a trusted proxy (a request with no forwarding header, or
//! one whose nearest entry a proxy wrote as `unknown` or obfuscated), the
//! client *is* that proxy, and a skip list that holds it lets every such
//! request through unlimited (skipping `10.0.0.0/8` while trusting it
//! skips a proxy that hides its clients' addresses).
//!
//! ```
//! use std::net::SocketAddr;
//! use http::Request;
//! use redis_ratelimit::{Limiter, Quota, RateLimitLayer, key::ClientIp, skip::Networks};
//!
//! let client_ip = ClientIp::new().trust("10.0.0.0/8")?;
//! let internal = Networks::new(client_ip.clone(), "127.0.0.0/8, ::1, 192.168.0.0/16")?;
//! let req = |peer: &str, xff: &str| {
//!     let peer: SocketAddr = peer.parse().unwrap();
//!     let req = Request::get("/").header("x-forwarded-for", xff).extension(peer);
//!     req.body(()).unwrap().into_parts().0
//! };
//! // Through a trusted proxy: the client behind it.
//! assert!(internal.matches(&req("10.0.0.2:4000", "192.168.1.9")));
//! assert!(!internal.matches(&req("10.0.0.2:4000", "203.0.113.7")));
//! // A spoofed header from an untrusted peer is not read.
//! assert!(!internal.matches(&req("203.0.113.7:4000", "127.0.0.1")));
//!
//! let layer = RateLimitLayer::new(Limiter::new(Quota::per_second(10)), client_ip)
//!     .skip_networks(internal)
//!     .skip(|p| p.uri.path() == "/healthz");
//! # let _ = layer;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::{fmt, net::IpAddr, sync::Arc};

use ipnet::IpNet;

use crate::{
    ConfigError,
    key::{self, ClientIp, KeyExtractor, Part, PeerIp, RequestInfo, With},
};

/// Says whether a request of type `R` is not limited at all.
///
/// Implemented for closures `Fn(&R) -> bool` and for [`Networks`].
pub trait Skip<R: ?Sized>: Send + Sync + 'static {
    /// `true`: let `req` through unlimited, without a store call.
    fn skip(&self, req: &R) -> bool;
}

impl<R: ?Sized, F> Skip<R> for F
where
    F: Fn(&R) -> bool + Send + Sync + 'static,
{
    fn skip(&self, req: &R) -> bool {
        self(req)
    }
}

/// The client address of a request, as a key extractor sees it: what
/// [`Networks`] matches on.
pub trait ClientAddr<R: ?Sized>: Send + Sync + 'static {
    /// The client's address (IPv4-mapped IPv6 as IPv4), if there is one.
    fn client_addr(&self, req: &R) -> Option<IpAddr>;
}

impl<R: RequestInfo + ?Sized> ClientAddr<R> for PeerIp {
    fn client_addr(&self, req: &R) -> Option<IpAddr> {
        PeerIp::client_addr(self, req)
    }
}

impl<R: RequestInfo + ?Sized> ClientAddr<R> for ClientIp {
    fn client_addr(&self, req: &R) -> Option<IpAddr> {
        ClientIp::client_addr(self, req)
    }
}

/// Skips requests whose client address is in one of a list of networks.
///
/// The address comes from `A`, the *identity*: the key extractor's own
/// reading ([`PeerIp`](struct@PeerIp), [`ClientIp`], or any [`ClientAddr`]). A request
/// without an address is never skipped. Clones share the list.
#[derive(Clone)]
pub struct Networks<A> {
    nets: Arc<[IpNet]>,
    identity: A,
}

impl<A: fmt::Debug> fmt::Debug for Networks<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Networks")
            .field("nets", &self.nets)
            .field("identity", &self.identity)
            .finish()
    }
}

impl<A> Networks<A> {
    /// Skips clients, as `identity` reads them, in `list`: IP addresses or
    /// CIDR ranges separated by commas or whitespace, such as
    /// `"127.0.0.0/8, ::1"`.
    ///
    /// Fails with [`ConfigError::InvalidNetwork`], naming the entry, if one
    /// is neither.
    ///
    /// ```
    /// use redis_ratelimit::{key::PeerIp, skip::Networks};
    ///
    /// assert!(Networks::new(PeerIp, "127.0.0.0/8 ::1").is_ok());
    /// let err = Networks::new(PeerIp, "10.0.0.0/33").unwrap_err();
    /// assert!(err.to_string().contains("10.0.0.0/33"));
    /// ```
    pub fn new(identity: A, list: &str) -> Result<Self, ConfigError> {
        let nets =
            key::parse_networks(list).map_err(|value| ConfigError::InvalidNetwork { value })?;
        Ok(Self::from_nets(identity, nets))
    }

    /// Skips clients, as `identity` reads them, in `nets`.
    pub fn from_nets(identity: A, nets: impl IntoIterator<Item = IpNet>) -> Self {
        Self {
            nets: nets.into_iter().map(key::canonical_net).collect(),
            identity,
        }
    }

    /// The networks, in order.
    pub fn nets(&self) -> &[IpNet] {
        &self.nets
    }

    /// Whether there are no networks (nothing is skipped).
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    /// Whether `req`'s client is in one of the networks.
    pub fn matches<R: ?Sized>(&self, req: &R) -> bool
    where
        A: ClientAddr<R>,
    {
        if self.nets.is_empty() {
            return false;
        }
        match self.identity.client_addr(req) {
            Some(ip) => self.nets.iter().any(|net| net.contains(&ip)),
            None => false,
        }
    }
}

impl<R: ?Sized, A: ClientAddr<R>> Skip<R> for Networks<A> {
    fn skip(&self, req: &R) -> bool {
        self.matches(req)
    }
}

/// An extractor that also skips some requests; made by
/// [`RateLimitLayer::skip`](crate::RateLimitLayer::skip).
pub type Skipping<K, S> = With<K, SkipWith<S>>;

/// The [`Part`] of [`Skipping`]: a request either the extractor or `S`
/// skips goes through unlimited.
#[derive(Clone)]
pub struct SkipWith<S>(S);

impl<S> fmt::Debug for SkipWith<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SkipWith").finish_non_exhaustive()
    }
}

impl<K, S> Skipping<K, S> {
    /// Keys with `keys`, and lets the requests `skip` picks through
    /// unlimited.
    pub fn new(keys: K, skip: S) -> Self {
        Self::shared(Arc::new(keys), skip)
    }

    /// With an extractor a layer already holds, without cloning it.
    pub(crate) fn shared(keys: Arc<K>, skip: S) -> Self {
        Self::wrap(keys, SkipWith(skip))
    }
}

impl<R: ?Sized, K, S> Part<R, K> for SkipWith<S>
where
    K: KeyExtractor<R>,
    S: Skip<R>,
{
    fn skip(&self, keys: &K, req: &R) -> bool {
        keys.skip(req) || self.0.skip(req)
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use http::{Request, request::Parts};

    use super::*;

    fn req(peer: &str, xff: Option<&str>) -> Parts {
        let peer: SocketAddr = peer.parse().unwrap();
        let mut b = Request::get("/").extension(peer);
        if let Some(xff) = xff {
            b = b.header("x-forwarded-for", xff);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn peer_networks_match_mapped_addresses_as_ipv4() {
        let nets = Networks::new(PeerIp, "127.0.0.0/8,::1").unwrap();
        assert!(nets.matches(&req("127.0.0.1:1", None)));
        assert!(nets.matches(&req("[::ffff:127.0.0.9]:1", None)));
        assert!(nets.matches(&req("[::1]:1", None)));
        assert!(!nets.matches(&req("[::2]:1", None)));
        assert!(!nets.matches(&req("10.0.0.1:1", Some("127.0.0.1"))));
        let mapped = Networks::new(PeerIp, "::ffff:10.0.0.0/104").unwrap();
        assert!(mapped.matches(&req("10.9.9.9:1", None)));
        let none = Request::get("/").body(()).unwrap().into_parts().0;
        assert!(!nets.matches(&none));
    }

    #[test]
    fn client_ip_networks_use_the_client_behind_trusted_proxies() {
        let client_ip = ClientIp::new().trust("10.0.0.0/8").unwrap();
        let nets = Networks::new(client_ip, "192.168.0.0/16").unwrap();
        assert!(nets.matches(&req("10.0.0.2:1", Some("192.168.3.4"))));
        assert!(!nets.matches(&req("10.0.0.2:1", Some("192.168.3.4, 203.0.113.1"))));
        // Untrusted peer: its header is never read.
        assert!(!nets.matches(&req("203.0.113.1:1", Some("192.168.3.4"))));
        assert!(Networks::new(PeerIp, "nope").is_err());
        assert!(Networks::new(PeerIp, "").unwrap().is_empty());
    }
}
