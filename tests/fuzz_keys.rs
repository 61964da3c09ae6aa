//! Property tests (proptest) over forwarding-header parsing and store-key
//! building: arbitrary bytes in `X-Forwarded-For`, `Forwarded`, `X-Real-IP`
//! and key headers, from arbitrary peers, under arbitrary `ClientIp`
//! configurations. Nothing panics, every key is an address or a network,
//! an untrusted peer never moves its key, what the nearest proxy appended is
//! the key whatever the client wrote before it, and every Redis key is
//! bounded with its hash tag intact.
//!
//! `cargo test` runs 256 cases per property; for a longer run:
//! `PROPTEST_CASES=100000 cargo test --release --test fuzz_keys`.

use std::net::{IpAddr, SocketAddr};

use http::HeaderName;
use ipnet::IpNet;
use proptest::prelude::*;
use redis_ratelimit::{
    Limiter, Quota, RAW_KEY_MAX,
    concurrency::ConcurrencyLimiter,
    key::{ClientIp, ForwardedHeader, Header, KeyError, KeyExtractor, RequestInfo},
};

/// A request with raw header bytes, bypassing `http`'s header validation so
/// that any byte reaches the parsers.
#[derive(Debug)]
struct RawRequest {
    peer: Option<SocketAddr>,
    headers: Vec<(HeaderName, Vec<u8>)>,
}

impl RequestInfo for RawRequest {
    fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    fn header_values<'a>(&'a self, name: &HeaderName) -> impl Iterator<Item = &'a [u8]> + 'a {
        let name = name.clone();
        self.headers
            .iter()
            .filter(move |(n, _)| *n == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// The trusted proxies of the appended-address property.
const PROXIES: &str = "10.0.0.0/8";

/// Pieces that make header lines look almost right.
const PIECES: &[&str] = &[
    "10.0.0.1",
    "10.255.1.2",
    "192.168.1.1",
    "203.0.113.7",
    "198.51.100.17",
    "::1",
    "2001:db8::1",
    "2001:db8:1:2::5",
    "::ffff:10.0.0.1",
    "::ffff:203.0.113.7",
    "fe80::1%eth0",
    "[2001:db8:cafe::17]:4711",
    "192.0.2.43:47011",
    "1.2.3.4:_p",
    "unknown",
    "_hidden",
    "for=",
    "For=",
    "by=",
    "proto=http",
    "\"",
    "\\",
    ",",
    ", ",
    ";",
    "=",
    "[",
    "]",
    ":",
    " ",
    "\t",
    "{",
    "}",
    "#",
    "\u{e9}",
    "\u{ff}",
];

/// One header line: structured-ish pieces, or raw bytes of any length.
fn line() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::collection::vec(prop::sample::select(PIECES), 0..24)
            .prop_map(|p| p.concat().into_bytes()),
        2 => prop::collection::vec(any::<u8>(), 0..200),
        1 => prop::collection::vec(any::<u8>(), 8_000..20_000),
    ]
}

fn ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(IpAddr::from),
        any::<[u8; 16]>().prop_map(IpAddr::from),
        (any::<u8>(), any::<u8>()).prop_map(|(a, b)| IpAddr::from([10, 0, a, b])),
        any::<[u8; 4]>().prop_map(|v4| IpAddr::from(std::net::Ipv4Addr::from(v4).to_ipv6_mapped())),
    ]
}

fn header_kind() -> impl Strategy<Value = ForwardedHeader> {
    prop::sample::select(vec![
        ForwardedHeader::XForwardedFor,
        ForwardedHeader::Forwarded,
        ForwardedHeader::XRealIp,
    ])
}

/// A `ClientIp` configuration, and its parts for the properties to use.
#[derive(Debug, Clone)]
struct Config {
    trusted: Vec<IpNet>,
    hops: Option<u8>,
    header: ForwardedHeader,
    v4: u8,
    v6: u8,
}

impl Config {
    fn client_ip(&self) -> ClientIp {
        let mut c = ClientIp::new()
            .trusted_proxies(self.trusted.clone())
            .header(self.header)
            .ipv4_prefix(self.v4)
            .ipv6_prefix(self.v6);
        if let Some(n) = self.hops {
            c = c.hops(n);
        }
        c
    }
}

fn config() -> impl Strategy<Value = Config> {
    let nets = [
        "10.0.0.0/8",
        "192.168.0.0/16",
        "2001:db8::/32",
        "::1/128",
        "0.0.0.0/0",
    ];
    let nets: Vec<IpNet> = nets.iter().map(|n| n.parse().unwrap()).collect();
    (
        prop::sample::subsequence(nets, 0..=3),
        prop::option::of(any::<u8>()),
        header_kind(),
        any::<u8>(),
        any::<u8>(),
    )
        .prop_map(|(trusted, hops, header, v4, v6)| Config {
            trusted,
            hops,
            header,
            v4,
            v6,
        })
}

/// Client bytes: mostly the safe alphabet with the characters that matter
/// around it (braces, `#`, space, non-ASCII), sometimes any bytes, sometimes
/// long.
fn client_bytes() -> impl Strategy<Value = Vec<u8>> {
    let near_safe = prop::sample::select(b"aZ09-._~:@/+={}# \xff\x00".to_vec());
    prop_oneof![
        4 => prop::collection::vec(near_safe.clone(), 0..140),
        1 => prop::collection::vec(near_safe, 120..300),
        3 => prop::collection::vec(any::<u8>(), 0..300),
        1 => prop::collection::vec(any::<u8>(), 8_000..70_000),
    ]
}

fn limiter() -> impl Strategy<Value = Limiter> {
    (
        "[a-zA-Z0-9._~:@/+=-]{1,64}",
        "[a-zA-Z0-9._~:@/+=-]{1,64}",
        0..3,
    )
        .prop_map(|(prefix, name, algorithm)| {
            let quota = match algorithm {
                0 => Quota::per_second(1),
                1 => Quota::per_second(1).sliding_window(),
                _ => Quota::per_second(1).gcra(1).unwrap(),
            };
            Limiter::builder(quota)
                .prefix(prefix)
                .name(name)
                .build()
                .unwrap()
        })
}

/// The documented bound: prefix, `:fw:` (`:sw:`, `:gcra:`), name, `:`, and
/// a client part of at most `RAW_KEY_MAX + 2` bytes (265 with the longest
/// prefix and name, and GCRA's).
fn assert_store_key_sound(limiter: &Limiter, key: &[u8]) -> Result<(), TestCaseError> {
    let store_key = limiter.store_key(key);
    let fixed = limiter.store_key("").len() - 67; // the hashed empty key is `{#<64 hex>}`
    prop_assert!(store_key.len() <= fixed + RAW_KEY_MAX + 2, "{store_key}");
    prop_assert!(store_key.len() <= 64 + 6 + 64 + 1 + RAW_KEY_MAX + 2);
    let open = store_key.find('{');
    prop_assert!(open.is_some(), "{store_key}");
    prop_assert_eq!(store_key.matches('{').count(), 1, "{}", store_key);
    prop_assert_eq!(store_key.matches('}').count(), 1, "{}", store_key);
    prop_assert_eq!(open, Some(fixed), "{}", store_key);
    prop_assert!(store_key.ends_with('}'), "{}", store_key);
    Ok(())
}

proptest! {
    #[test]
    fn client_ip_keys_are_addresses_and_untrusted_peers_cannot_move_them(
        config in config(),
        peer in prop::option::weighted(0.95, ip()),
        lines in prop::collection::vec((header_kind(), line()), 0..6),
        limiter in limiter(),
    ) {
        let client_ip = config.client_ip();
        let headers = lines.into_iter().map(|(kind, value)| (kind.name(), value)).collect();
        let req = RawRequest { peer: peer.map(|ip| SocketAddr::new(ip, 443)), headers };
        let key = match client_ip.extract(&req) {
            Ok(key) => key,
            Err(e) => {
                prop_assert!(peer.is_none());
                prop_assert!(matches!(e, KeyError::NoPeerAddr));
                return Ok(());
            }
        };
        let text = std::str::from_utf8(key.as_bytes()).expect("keys are ASCII");
        prop_assert!(
            text.parse::<IpAddr>().is_ok() || text.parse::<IpNet>().is_ok(),
            "not an address or network: {:?}", text
        );
        prop_assert!(text.len() <= 43, "{}", text);
        assert_store_key_sound(&limiter, key.as_bytes())?;

        // A peer whose headers are not read keeps the key of its address.
        let peer = peer.unwrap().to_canonical();
        let trusted = config.trusted.iter().any(|n| n.contains(&peer));
        let reads_headers = match config.hops {
            Some(n) => n > 0 && (config.trusted.is_empty() || trusted),
            None => trusted,
        };
        if !reads_headers {
            let alone = RawRequest { peer: req.peer, headers: Vec::new() };
            let own = config.client_ip().extract(&alone).unwrap();
            prop_assert_eq!(key, own);
        }
    }

    /// The nearest (trusted) proxy appends the client's address to whatever
    /// the client sent, on its line (`, <addr>`, `, for=<addr>`) or as a line
    /// of its own. Whatever the client wrote before it (quotes, backslashes,
    /// commas, semicolons, any bytes), the key is that address, or (for an
    /// `X-Real-IP` the client wrote part of) the proxy's own bucket: never
    /// anything the client wrote.
    #[test]
    fn the_key_is_what_the_proxy_appended_whatever_the_client_wrote_before_it(
        kind in header_kind(),
        client_lines in prop::collection::vec(line(), 0..3),
        client in ip().prop_filter("an untrusted client", |ip| {
            !PROXIES.parse::<IpNet>().unwrap().contains(&ip.to_canonical())
        }),
        port in prop::option::of(any::<u16>()),
        own_line in any::<bool>(),
        hops in prop::option::of(Just(1u8)),
        (v4, v6) in (any::<u8>(), any::<u8>()),
    ) {
        let mut client_ip = ClientIp::new()
            .trust(PROXIES)
            .unwrap()
            .header(kind)
            .ipv4_prefix(v4)
            .ipv6_prefix(v6);
        if let Some(n) = hops {
            client_ip = client_ip.hops(n);
        }
        let node = match port {
            Some(port) => SocketAddr::new(client, port).to_string(),
            None => client.to_string(),
        };
        let appended = match kind {
            ForwardedHeader::Forwarded if port.is_none() && client.is_ipv4() => format!("for={node}"),
            ForwardedHeader::Forwarded => format!("for=\"{node}\";proto=https"),
            _ => node,
        };
        let mut lines = client_lines;
        let own_line = own_line || lines.is_empty();
        match lines.last_mut() {
            Some(last) if !own_line => last.extend_from_slice(format!(", {appended}").as_bytes()),
            _ => lines.push(appended.into_bytes()),
        }
        let peer = SocketAddr::from(([10, 0, 0, 1], 443));
        let req = RawRequest {
            peer: Some(peer),
            headers: lines.into_iter().map(|l| (kind.name(), l)).collect(),
        };
        let key = client_ip.extract(&req).unwrap();

        let alone = |ip: IpAddr| {
            let req = RawRequest { peer: Some(SocketAddr::new(ip, 1)), headers: Vec::new() };
            ClientIp::new().ipv4_prefix(v4).ipv6_prefix(v6).extract(&req).unwrap()
        };
        let (client_key, proxy_key) = (alone(client), alone(peer.ip()));
        if kind == ForwardedHeader::XRealIp && !own_line {
            prop_assert!(key == client_key || key == proxy_key, "{:?}", key);
        } else {
            prop_assert_eq!(key, client_key);
        }
    }

    #[test]
    fn header_keys_are_refused_or_stored_bounded_with_the_tag_intact(
        value in client_bytes(),
        limiter in limiter(),
    ) {
        let name = HeaderName::from_static("x-api-key");
        let req = RawRequest { peer: None, headers: vec![(name.clone(), value.clone())] };
        match Header::from_name(name).extract(&req) {
            Ok(key) => {
                prop_assert_eq!(key.as_bytes(), &value[..]);
                assert_store_key_sound(&limiter, key.as_bytes())?;
            }
            Err(KeyError::MissingHeader(_)) => prop_assert!(value.is_empty()),
            Err(KeyError::HeaderTooLong(_)) => prop_assert!(value.len() > 8 * 1024),
            Err(e) => prop_assert!(false, "unexpected {}", e),
        }
        // Business keys go straight to the limiter, whatever their length.
        assert_store_key_sound(&limiter, &value)?;
    }

    /// A concurrency limiter's keys are made as a single limit's are:
    /// bounded, one hash tag around the client part, and apart for
    /// different client bytes.
    #[test]
    fn concurrency_keys_are_bounded_with_the_tag_intact_and_apart(
        a in client_bytes(),
        b in client_bytes(),
    ) {
        let limiter = ConcurrencyLimiter::new(1);
        let key = limiter.store_key(&a);
        let fixed = "rl:cc:concurrency:".len();
        prop_assert!(key.len() <= fixed + RAW_KEY_MAX + 2, "{}", key);
        prop_assert_eq!(key.find('{'), Some(fixed), "{}", key);
        prop_assert_eq!(key.matches('{').count(), 1, "{}", key);
        prop_assert_eq!(key.matches('}').count(), 1, "{}", key);
        prop_assert!(key.ends_with('}'), "{}", key);
        prop_assume!(a != b);
        prop_assert_ne!(key, limiter.store_key(&b));
    }

    /// Several limits' keys share the limiter's hash tag, and the client
    /// part after it can neither open nor close one (a client's braces
    /// would move the keys to another slot, or apart): bounded, and apart
    /// for different client bytes.
    #[test]
    fn several_limits_keys_share_one_tag_that_clients_cannot_touch(
        a in client_bytes(),
        b in client_bytes(),
    ) {
        let limiter = Limiter::builder(Quota::per_second(1))
            .name("second")
            .limit("day", Quota::per_day(9))
            .build()
            .unwrap();
        let keys = limiter.store_keys(&a);
        prop_assert_eq!(keys.len(), 2);
        let tag = |k: &str| k[k.find('{').unwrap()..=k.find('}').unwrap()].to_owned();
        for key in &keys {
            prop_assert_eq!(key.matches('{').count(), 1, "{}", key);
            prop_assert_eq!(key.matches('}').count(), 1, "{}", key);
            prop_assert_eq!(tag(key), tag(&keys[0]), "{:?}", keys);
            let client = &key[key.find('}').unwrap() + 1..];
            prop_assert!(client.len() <= RAW_KEY_MAX + 1, "{}", key);
        }
        prop_assume!(a != b);
        prop_assert_ne!(&keys, &limiter.store_keys(&b));
    }

    #[test]
    fn different_client_bytes_never_share_a_store_key(
        a in client_bytes(),
        b in client_bytes(),
    ) {
        let limiter = Limiter::new(Quota::per_second(1));
        prop_assume!(a != b);
        prop_assert_ne!(limiter.store_key(&a), limiter.store_key(&b));
        // Nor can a client send another's store form and land on it.
        let hashed = limiter.store_key(&a);
        let client_part = &hashed[hashed.find('{').unwrap() + 1..hashed.len() - 1];
        if client_part.as_bytes() != a.as_slice() {
            prop_assert_ne!(limiter.store_key(client_part), hashed);
        }
    }
}
