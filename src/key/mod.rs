//! Which client a request counts against: the [`KeyExtractor`] trait and the
//! built-in extractors [`PeerIp`](struct@PeerIp), [`ClientIp`], [`Header`], [`Global`] and
//! [`from_fn()`].
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
//! | [`from_fn()`] | whatever the closure returns | whatever the closure returns |
//!
//! The built-in extractors work on any request type that implements
//! [`RequestInfo`]: `http::request::Parts` for the tower layer and, with the
//! `actix` feature, actix-web's `ServiceRequest`. A [`from_fn()`] closure gets
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

mod client_ip;
mod each;
mod error;
mod extractor;
mod forwarded;
mod from_fn;
mod global;
mod grouping;
mod header;
mod peer_ip;
mod request;
#[cfg(feature = "tonic")]
mod tonic;
mod value;
mod warnings;
mod with;

pub use client_ip::ClientIp;
pub(crate) use client_ip::{canonical_net, parse_networks};
pub use each::{Each, KeyTuple, each};
pub use error::KeyError;
pub use extractor::KeyExtractor;
pub use forwarded::ForwardedHeader;
pub use from_fn::{FromFn, from_fn};
pub use global::Global;
use grouping::Grouping;
pub use header::{Header, MAX_HEADER_KEY_LEN};
pub use peer_ip::PeerIp;
pub use request::RequestInfo;
pub use value::Key;
pub use with::{Cost, Part, With, WithCost};

#[doc = include_str!("../../docs/proxies.md")]
pub mod proxies {}
