//! Which client a request counts against: the [`KeyExtractor`] trait and the
//! built-in extractors [`PeerIp`](struct@PeerIp), [`ClientIp`], [`Header`], [`Global`] and
//! [`from_fn`].
//!
//! An extractor turns a request into a [`Key`], or into a [`KeyError`] when it
//! cannot. A request whose key cannot be derived is **never** let through
//! unlimited: the layer answers it at once with the error's status, which the
//! [`Respond`](crate::Respond) hook can change.
//!
//! | extractor | key | when it cannot derive one |
//! |---|---|---|
//! | [`PeerIp`](struct@PeerIp) | the peer's IP address (port dropped), IPv6 by /64 | 500, logged once as a server misconfiguration |
//! | [`ClientIp`] | the client's address behind trusted proxies, IPv6 by /64 ([`proxies`]) | 500, as `PeerIp` |
//! | [`Header`] | the first value of a header, as raw bytes | 400 if missing, empty or over [`MAX_HEADER_KEY_LEN`] bytes |
//! | [`Global`] | one shared key for every request | never fails |
//! | [`from_fn`] | whatever the closure returns | whatever the closure returns |
//!
//! The built-in extractors work on any request type that implements
//! [`RequestInfo`]: `http::request::Parts` for the tower layer and, with the
//! `actix` feature, actix-web's `ServiceRequest`. A [`from_fn`] closure gets
//! the framework's own request type.
//!
//! Keys are client-controlled bytes. The [`Limiter`](crate::Limiter) never
//! puts them into Redis raw unless they are short and made of a safe alphabet;
//! anything else (long, non-UTF-8, braces, spaces, a leading `#`) is stored as
//! a SHA-256 digest, so no value can reach outside its hash tag or pose as
//! another client's digest, and every client part of a Redis key is at most
//! 130 bytes. [`Header`] refuses values over [`MAX_HEADER_KEY_LEN`] bytes
//! before hashing them.
//!
//! ```
//! use http::Request;
//! use redis_ratelimit::key::{self, Header, KeyError, KeyExtractor};
//!
//! let (parts, ()) = Request::get("/").header("x-api-key", "k-123").body(()).unwrap().into_parts();
//! assert_eq!(Header::new("x-api-key").extract(&parts).unwrap().as_bytes(), b"k-123");
//! assert!(matches!(Header::new("x-tenant").extract(&parts), Err(KeyError::MissingHeader(_))));
//!
//! // Any closure over the request parts; here: per API version and method.
//! let by_route = key::from_fn(|p: &http::request::Parts| {
//!     Ok(format!("{} {}", p.method, p.uri.path()).into())
//! });
//! assert_eq!(by_route.extract(&parts).unwrap().as_bytes(), b"GET /");
//! ```

use std::{
    fmt,
    net::{IpAddr, SocketAddr},
};

use bytes::Bytes;
use http::{HeaderName, StatusCode, request::Parts};

mod client_ip;
mod forwarded;
mod grouping;
pub mod proxies;
#[cfg(feature = "tonic")]
mod tonic;
mod warnings;

pub use client_ip::ClientIp;
pub(crate) use client_ip::{canonical_net, parse_networks};
pub use forwarded::ForwardedHeader;
use grouping::Grouping;

/// The longest header value [`Header`] keys by: longer values are answered
/// with 400 ([`KeyError::HeaderTooLong`]) rather than hashed. No API key or
/// tenant id needs 8 KiB, and the bound caps the hashing work a client can
/// cause.
pub const MAX_HEADER_KEY_LEN: usize = 8 * 1024;

/// The client identity a request is counted against.
///
/// Build one from a `String`, `&'static str`, `Vec<u8>` or [`Bytes`]. Keys
/// the built-in extractors derive (an address, a short header value) are
/// held inline, without an allocation.
#[derive(Clone)]
pub struct Key(Repr);

#[derive(Clone)]
enum Repr {
    Inline { len: u8, buf: [u8; INLINE_KEY] },
    Shared(Bytes),
}

/// The longest key held inline: any IPv6 address as text (45 bytes) fits.
const INLINE_KEY: usize = 46;

impl Key {
    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, buf } => &buf[..usize::from(*len)],
            Repr::Shared(b) => b,
        }
    }

    /// A copy of `bytes`: inline when short, else shared.
    pub(crate) fn copy_from(bytes: &[u8]) -> Self {
        let mut buf = [0u8; INLINE_KEY];
        match buf.get_mut(..bytes.len()) {
            Some(to) => {
                to.copy_from_slice(bytes);
                // At most INLINE_KEY, so it fits in a u8.
                let len = bytes.len() as u8;
                Self(Repr::Inline { len, buf })
            }
            None => Self(Repr::Shared(Bytes::copy_from_slice(bytes))),
        }
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({:?})", String::from_utf8_lossy(self.as_bytes()))
    }
}

impl AsRef<[u8]> for Key {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl Key {
    /// An address as its usual text (`203.0.113.9`, `2001:db8::1`), inline.
    /// IPv4, the common case, is written without `Display`'s formatting
    /// machinery, which cost more than the rest of a memory-store decision.
    pub(crate) fn from_ip(ip: IpAddr) -> Self {
        let mut text = [0u8; INLINE_KEY];
        match write_ip(ip, &mut text) {
            Some(len) => Self::copy_from(&text[..len]),
            None => Self::from(ip.to_string()),
        }
    }

    /// A network as its usual text (`203.0.113.0/24`, `2001:db8:1:2::/64`),
    /// inline: `network`, already truncated, then `/len`.
    pub(crate) fn from_net(network: IpAddr, len: u8) -> Self {
        let mut text = [0u8; INLINE_KEY];
        if let Some(at) = write_ip(network, &mut text) {
            let mut digits = itoa::Buffer::new();
            let digits = digits.format(len).as_bytes();
            if let Some(to) = text.get_mut(at..at + 1 + digits.len()) {
                to[0] = b'/';
                to[1..].copy_from_slice(digits);
                return Self::copy_from(&text[..at + 1 + digits.len()]);
            }
        }
        Self::from(format!("{network}/{len}"))
    }
}

/// Writes `ip` as text at the start of `text`; its length, or `None` if it
/// does not fit (no address does not).
fn write_ip(ip: IpAddr, text: &mut [u8; INLINE_KEY]) -> Option<usize> {
    let mut len = 0;
    match ip {
        IpAddr::V4(v4) => {
            let mut digits = itoa::Buffer::new();
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    text[len] = b'.';
                    len += 1;
                }
                let octet = digits.format(octet).as_bytes();
                text[len..len + octet.len()].copy_from_slice(octet);
                len += octet.len();
            }
        }
        IpAddr::V6(v6) => {
            let mut out = &mut text[..];
            // 45 bytes at most: it always fits.
            std::io::Write::write_fmt(&mut out, format_args!("{v6}")).ok()?;
            len = INLINE_KEY - out.len();
        }
    }
    Some(len)
}

impl From<String> for Key {
    fn from(s: String) -> Self {
        Self(Repr::Shared(s.into()))
    }
}

impl From<&'static str> for Key {
    fn from(s: &'static str) -> Self {
        Self(Repr::Shared(Bytes::from_static(s.as_bytes())))
    }
}

impl From<Vec<u8>> for Key {
    fn from(v: Vec<u8>) -> Self {
        Self(Repr::Shared(v.into()))
    }
}

impl From<Bytes> for Key {
    fn from(b: Bytes) -> Self {
        Self(Repr::Shared(b))
    }
}

/// Why no key could be derived for a request.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The header the [`Header`] extractor reads was missing or empty.
    /// Answered with 400: the client must send it.
    #[error("request has no (or an empty) `{0}` header to rate limit by")]
    MissingHeader(HeaderName),
    /// The header the [`Header`] extractor reads was longer than
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
        if let Some(addr) = tonic::peer_addr(&self.extensions) {
            return Some(addr);
        }
        None
    }

    fn header_values<'a>(&'a self, name: &HeaderName) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers.get_all(name).into_iter().map(|v| v.as_bytes())
    }
}

/// Derives the rate-limit [`Key`] (and the cost) of a request of type `R`.
///
/// `R` is `http::request::Parts` for the tower layer and
/// `actix_web::dev::ServiceRequest` for the actix middleware. Implement it for
/// your own extractor, or use [`from_fn`] with a closure.
///
/// For a limiter with several limits, one extractor keys all of them, or
/// [`each`] keys each limit with its own extractor, in order:
/// `each((PeerIp, Header::new("x-api-key"), Global))`. A request's cost is 1
/// unless the extractor says otherwise; see
/// [`RateLimitLayer::cost`](crate::RateLimitLayer::cost).
pub trait KeyExtractor<R: ?Sized = Parts>: Send + Sync + 'static {
    /// The key for this request, or why there is none.
    fn extract(&self, req: &R) -> Result<Key, KeyError>;

    /// How many keys [`extract_all`](Self::extract_all) yields: 1 (one key
    /// for every limit), or one per limit (for [`each`]).
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
    /// [`RateLimitLayer::skip`](crate::RateLimitLayer::skip); the
    /// rate-limit layer and middleware ask it, the concurrency layer does
    /// not.
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
        }
    };
}

forward_key_extractor!(Box);
forward_key_extractor!(std::sync::Arc);

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

/// An extractor with a cost function; see
/// [`RateLimitLayer::cost`](crate::RateLimitLayer::cost).
pub struct WithCost<K, F> {
    keys: std::sync::Arc<K>,
    cost: F,
}

impl<K, F> WithCost<K, F> {
    /// Keys with `keys`; each request spends `cost(request)` units.
    pub fn new(keys: K, cost: F) -> Self {
        Self::shared(std::sync::Arc::new(keys), cost)
    }

    /// Keys with an extractor a layer already holds, without cloning it.
    pub(crate) fn shared(keys: std::sync::Arc<K>, cost: F) -> Self {
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

/// Keys by the peer's IP address (the port is dropped), IPv6 by /64.
///
/// Under tower it reads a `SocketAddr` request extension (insert one in a
/// hyper server), with the `axum` feature (on by default) axum's
/// `ConnectInfo<SocketAddr>`, and with the `tonic` feature the
/// `TcpConnectInfo` of `tonic::transport::Server`; under actix, the
/// connection's peer address.
/// Behind a proxy every request comes from the proxy's address: use
/// [`ClientIp`] there instead (see [`proxies`]).
///
/// The keys are [`ClientIp`]'s, from the same code, so switching between
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
    /// [`ClientIp::ipv6_prefix`].
    pub const fn ipv6_prefix(self, len: u8) -> Self {
        Self {
            grouping: self.grouping.ipv6_prefix(len),
        }
    }

    /// Groups IPv4 peers by networks of this prefix length (default 32: by
    /// address; 24 groups each /24). Values above 32 are clamped to 32. As
    /// [`ClientIp::ipv4_prefix`].
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

/// One key shared by every request: a global cap.
#[derive(Debug, Clone, Copy, Default)]
pub struct Global;

impl<R: ?Sized> KeyExtractor<R> for Global {
    fn extract(&self, _: &R) -> Result<Key, KeyError> {
        Ok(Key::from("global"))
    }
}

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
    use super::*;
    use http::Request;

    #[test]
    fn ip_keys_read_as_std_writes_them() {
        let ips = [
            "0.0.0.0",
            "1.2.3.4",
            "10.0.0.255",
            "203.0.113.9",
            "255.255.255.255",
            "99.100.9.10",
            "2001:db8::1",
            "::ffff:1.2.3.4",
            "::",
        ];
        for ip in ips {
            let parsed: IpAddr = ip.parse().unwrap();
            assert_eq!(Key::from_ip(parsed).as_bytes(), ip.as_bytes());
            assert_eq!(
                Key::from_ip(parsed).as_bytes(),
                parsed.to_string().as_bytes()
            );
        }
    }

    #[test]
    fn keys_are_their_bytes_inline_or_shared() {
        use std::hash::BuildHasher;
        let longest_v6 = "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255";
        assert_eq!(longest_v6.len(), 45);
        let parsed: IpAddr = "::ffff:ffff:ffff".parse().unwrap();
        assert_eq!(Key::from_ip(parsed).as_bytes(), b"::ffff:255.255.255.255");
        let hasher = std::collections::hash_map::RandomState::new();
        for len in [0, 1, INLINE_KEY - 1, INLINE_KEY, INLINE_KEY + 1, 4096] {
            let bytes = vec![b'k'; len];
            let copied = Key::copy_from(&bytes);
            let shared = Key::from(Bytes::from(bytes.clone()));
            assert_eq!(copied.as_bytes(), &bytes[..]);
            assert_eq!(copied, shared);
            assert_eq!(hasher.hash_one(&copied), hasher.hash_one(&shared));
        }
        assert_ne!(Key::copy_from(b"a"), Key::copy_from(b"b"));
    }

    fn parts(req: http::request::Builder) -> Parts {
        req.body(()).unwrap().into_parts().0
    }

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
            assert!(matches!(key(peer).0, Repr::Inline { .. }), "{peer}");
        }
        let widest = "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:1"
            .parse()
            .unwrap();
        let k = peer_key(PeerIp.ipv6_prefix(127), widest);
        assert_eq!(k.as_bytes(), b"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/127");
        assert!(matches!(k.0, Repr::Inline { .. }));
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

    #[test]
    fn global_and_closures() {
        let p = parts(Request::get("/x"));
        assert_eq!(
            KeyExtractor::<Parts>::extract(&Global, &p)
                .unwrap()
                .as_bytes(),
            b"global"
        );
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
