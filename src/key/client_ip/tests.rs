use std::net::SocketAddr;

use http::{Request, StatusCode, request::Parts};

use super::*;
use crate::key::warnings::NO_HEADER_STREAK;

fn req(peer: &str, headers: &[(&str, &str)]) -> Parts {
    let mut req = Request::get("/");
    if !peer.is_empty() {
        req = req.extension(peer.parse::<SocketAddr>().unwrap());
    }
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(()).unwrap().into_parts().0
}

fn key(ip: &ClientIp, peer: &str, headers: &[(&str, &str)]) -> String {
    let key = ip.extract(&req(peer, headers)).unwrap();
    String::from_utf8(key.as_bytes().to_vec()).unwrap()
}

fn xff(ip: &ClientIp, peer: &str, xff: &str) -> String {
    key(ip, peer, &[("x-forwarded-for", xff)])
}

fn proxies() -> ClientIp {
    ClientIp::new().trust("10.0.0.0/8, 192.168.0.0/16").unwrap()
}

#[test]
fn without_trust_the_peer_is_the_client() {
    let ip = ClientIp::new();
    assert_eq!(xff(&ip, "203.0.113.9:1", "1.1.1.1"), "203.0.113.9");
    assert_eq!(xff(&ip, "10.0.0.1:1", "1.1.1.1"), "10.0.0.1");
    let err = ip.extract(&req("", &[])).unwrap_err();
    assert!(matches!(err, KeyError::NoPeerAddr));
    assert_eq!(err.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

#[test]
fn spoofed_headers_from_untrusted_peers_are_ignored() {
    let ip = proxies();
    for header in ["x-forwarded-for", "forwarded", "x-real-ip"] {
        let k = key(&ip, "203.0.113.9:1", &[(header, "for=1.1.1.1")]);
        assert_eq!(k, "203.0.113.9");
    }
    assert_eq!(
        xff(&ip, "203.0.113.9:1", "1.1.1.1, 10.0.0.1"),
        "203.0.113.9"
    );
}

#[test]
fn the_walk_skips_trusted_hops_and_stops_at_the_first_untrusted() {
    let ip = proxies();
    assert_eq!(
        xff(&ip, "10.0.0.1:1", "203.0.113.7, 192.168.1.1"),
        "203.0.113.7"
    );
    assert_eq!(
        xff(&ip, "10.0.0.1:1", "6.6.6.6, 203.0.113.7"),
        "203.0.113.7"
    );
    assert_eq!(
        key(
            &ip,
            "10.0.0.1:1",
            &[
                ("x-forwarded-for", "6.6.6.6, 203.0.113.7"),
                ("x-forwarded-for", "10.9.9.9")
            ]
        ),
        "203.0.113.7"
    );
    // Every hop trusted: the leftmost.
    assert_eq!(xff(&ip, "10.0.0.1:1", "10.0.0.7, 10.0.0.3"), "10.0.0.7");
    // No header from a trusted proxy: the proxy.
    assert_eq!(key(&ip, "10.0.0.1:1", &[]), "10.0.0.1");
}

#[test]
fn garbage_stops_the_walk_at_the_last_trusted_hop() {
    let ip = proxies();
    for (header, client) in [
        ("unknown", "10.0.0.1"),
        ("_hidden", "10.0.0.1"),
        ("1.1.1.1, not-an-ip", "10.0.0.1"),
        ("1.1.1.1, not-an-ip, 10.0.0.5", "10.0.0.5"),
        ("1.1.1.1, , 192.168.0.3", "192.168.0.3"),
        ("1.1.1.1,", "10.0.0.1"),
        ("1.1.1.1, 1.2.3.4.5", "10.0.0.1"),
    ] {
        assert_eq!(xff(&ip, "10.0.0.1:1", header), client, "{header}");
    }
    let huge = "a".repeat(64 * 1024);
    assert_eq!(xff(&ip, "10.0.0.1:1", &huge), "10.0.0.1");
    // More than 32 trusted hops: the 32nd.
    let chain: Vec<String> = (1..=40).rev().map(|i| format!("10.0.1.{i}")).collect();
    assert_eq!(xff(&ip, "10.0.0.1:1", &chain.join(",")), "10.0.1.32");
}

#[test]
fn the_configured_header_is_the_only_one_read() {
    let fwd = proxies().header(ForwardedHeader::Forwarded);
    let headers = [
        ("x-forwarded-for", "6.6.6.6"),
        ("forwarded", r#"for="[2001:db8:cafe::17]:4711""#),
    ];
    assert_eq!(key(&fwd, "10.0.0.1:1", &headers), "2001:db8:cafe::/64");
    assert_eq!(key(&proxies(), "10.0.0.1:1", &headers), "6.6.6.6");
    let real = proxies().header(ForwardedHeader::XRealIp);
    let headers = [("x-forwarded-for", "6.6.6.6"), ("x-real-ip", "203.0.113.7")];
    assert_eq!(key(&real, "10.0.0.1:1", &headers), "203.0.113.7");
    assert_eq!(key(&real, "10.0.0.1:1", &headers[..1]), "10.0.0.1");
}

#[test]
fn hop_counting() {
    let chain = "6.6.6.6, 203.0.113.7, 198.51.100.10";
    assert_eq!(
        xff(&ClientIp::new().hops(1), "10.0.0.1:1", chain),
        "198.51.100.10"
    );
    assert_eq!(
        xff(&ClientIp::new().hops(2), "10.0.0.1:1", chain),
        "203.0.113.7"
    );
    assert_eq!(
        xff(&ClientIp::new().hops(3), "10.0.0.1:1", chain),
        "6.6.6.6"
    );
    // Fewer entries than hops: the leftmost.
    assert_eq!(
        xff(&ClientIp::new().hops(9), "10.0.0.1:1", chain),
        "6.6.6.6"
    );
    assert_eq!(
        xff(&ClientIp::new().hops(0), "10.0.0.1:1", chain),
        "10.0.0.1"
    );
    assert_eq!(key(&ClientIp::new().hops(2), "10.0.0.1:1", &[]), "10.0.0.1");
    // Garbage within the counted hops stops the walk.
    assert_eq!(
        xff(&ClientIp::new().hops(2), "10.0.0.1:1", "1.1.1.1, _x"),
        "10.0.0.1"
    );
    assert_eq!(
        xff(
            &ClientIp::new().hops(3),
            "10.0.0.1:1",
            "1.1.1.1, x, 2.2.2.2"
        ),
        "2.2.2.2"
    );
    // Hops plus trusted ranges: headers only from a trusted peer.
    let both = proxies().hops(1);
    assert_eq!(xff(&both, "10.0.0.1:1", chain), "198.51.100.10");
    assert_eq!(xff(&both, "203.0.113.1:1", chain), "203.0.113.1");
    assert_eq!(ClientIp::new().hops(200).hops, Some(32));
}

#[test]
fn addresses_are_normalised_and_grouped() {
    let ip = proxies();
    // IPv4-mapped peers and entries are IPv4, also for trust.
    assert_eq!(
        xff(&ip, "[::ffff:10.0.0.1]:1", "::ffff:203.0.113.7"),
        "203.0.113.7"
    );
    assert_eq!(xff(&ip, "[::ffff:203.0.113.9]:1", "1.1.1.1"), "203.0.113.9");
    // IPv6 by /64.
    let a = xff(&ip, "10.0.0.1:1", "2001:db8:1:2::1");
    let b = xff(&ip, "10.0.0.1:1", "[2001:db8:1:2:ffff:ffff:ffff:ffff]:80");
    let c = xff(&ip, "10.0.0.1:1", "2001:db8:1:3::1");
    assert_eq!(a, "2001:db8:1:2::/64");
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(
        key(&ClientIp::new(), "[2001:db8::5]:1", &[]),
        "2001:db8::/64"
    );
    // Configurable prefixes, clamped.
    let wide = ClientIp::new().ipv6_prefix(48).ipv4_prefix(24);
    assert_eq!(key(&wide, "[2001:db8:1:2::1]:1", &[]), "2001:db8:1::/48");
    assert_eq!(key(&wide, "203.0.113.77:1", &[]), "203.0.113.0/24");
    let exact = ClientIp::new().ipv6_prefix(200).ipv4_prefix(99);
    assert_eq!(key(&exact, "[2001:db8::1]:1", &[]), "2001:db8::1");
    assert_eq!(key(&exact, "203.0.113.77:1", &[]), "203.0.113.77");
    // Trusted ranges written as IPv4-mapped IPv6 are IPv4 ranges.
    let mapped = ClientIp::new().trust("::ffff:10.0.0.0/104").unwrap();
    assert_eq!(mapped.trusted, ["10.0.0.0/8".parse::<IpNet>().unwrap()]);
    assert_eq!(xff(&mapped, "10.1.1.1:1", "203.0.113.7"), "203.0.113.7");
}

#[test]
fn trust_parses_lists_and_names_the_bad_entry() {
    let ip = ClientIp::new()
        .trust("10.0.0.0/8,192.168.1.7 2001:db8::/32\t::1")
        .unwrap();
    assert_eq!(ip.trusted.len(), 4);
    assert_eq!(ip.trusted[1], "192.168.1.7/32".parse::<IpNet>().unwrap());
    for bad in ["10.0.0.0/33", "example.com", "10.0.0.0/8, nope", "::/129"] {
        let err = ClientIp::new().trust(bad).unwrap_err();
        assert!(
            matches!(err, ConfigError::InvalidTrustedProxy { .. }),
            "{bad}"
        );
        let entry = bad.rsplit(", ").next().unwrap();
        assert!(err.to_string().contains(entry), "{err}");
    }
    assert!(ClientIp::new().trust("").unwrap().trusted.is_empty());
    // Any whitespace separates: a list read from a file with CRLF lines.
    let lines = ClientIp::new().trust("10.0.0.0/8\r\n::1\r\n").unwrap();
    assert_eq!(lines.trusted.len(), 2);
}

#[test]
fn warns_once_about_headers_when_nothing_is_trusted() {
    let ip = ClientIp::new();
    let clone = ip.clone();
    key(&ip, "203.0.113.9:1", &[]);
    assert!(!ip.fired().untrusted_headers);
    key(&clone, "203.0.113.9:1", &[("x-real-ip", "1.1.1.1")]);
    assert!(ip.fired().untrusted_headers, "clones share the flags");
    // With a trusted proxy, headers from others are expected: no warning.
    let trusted = proxies();
    xff(&trusted, "203.0.113.9:1", "1.1.1.1");
    assert!(!trusted.fired().untrusted_headers);
}

#[test]
fn warns_once_when_a_trusted_proxy_never_sends_the_header() {
    let ip = proxies();
    for _ in 0..NO_HEADER_STREAK - 1 {
        key(&ip, "10.0.0.1:1", &[]);
    }
    assert!(!ip.fired().no_header_from_proxy);
    // A request with the header, or from another proxy, restarts the count.
    xff(&ip, "10.0.0.1:1", "203.0.113.7");
    for _ in 0..NO_HEADER_STREAK - 1 {
        key(&ip, "10.0.0.1:1", &[]);
    }
    key(&ip, "10.0.0.2:1", &[]);
    assert!(!ip.fired().no_header_from_proxy);
    for _ in 0..NO_HEADER_STREAK - 1 {
        key(&ip, "10.0.0.2:1", &[]);
    }
    assert!(ip.fired().no_header_from_proxy);
    // Untrusted peers without headers never count.
    let other = proxies();
    for _ in 0..NO_HEADER_STREAK * 2 {
        key(&other, "203.0.113.9:1", &[]);
    }
    assert_eq!(other.fired(), Default::default());
}

#[test]
fn warns_when_trusting_everyone() {
    assert!(!proxies().fired().trusts_everyone);
    assert!(
        ClientIp::new()
            .trust("0.0.0.0/0")
            .unwrap()
            .fired()
            .trusts_everyone
    );
    let net = "::/0".parse().unwrap();
    assert!(
        ClientIp::new()
            .trusted_proxies([net])
            .fired()
            .trusts_everyone
    );
}

#[test]
fn display_describes_the_configuration() {
    assert_eq!(
        ClientIp::new().to_string(),
        "client-ip (peer address, no proxy trusted; IPv4 by /32, IPv6 by /64)"
    );
    assert_eq!(
        proxies().header(ForwardedHeader::Forwarded).to_string(),
        "client-ip (forwarded from 10.0.0.0/8, 192.168.0.0/16; IPv4 by /32, IPv6 by /64)"
    );
    assert_eq!(
        ClientIp::new().hops(2).to_string(),
        "client-ip (x-forwarded-for trusting 2 hop(s); IPv4 by /32, IPv6 by /64)"
    );
}

/// The nearest proxy appends `, for=<client>` to the client's `Forwarded`
/// line: an unterminated quote the client left in any parameter neither
/// makes the client's own `for=` the key nor moves it into the proxy's
/// bucket.
#[test]
fn a_malformed_forwarded_element_never_picks_the_key() {
    let ip = proxies().header(ForwardedHeader::Forwarded);
    for n in 1..4 {
        for chosen in [format!("10.9.9.{n}"), format!("198.51.100.{n}")] {
            for client in [
                format!(r#"for={chosen};by=""#),
                format!(r#"for={chosen};proto=""#),
                format!(r#"for={chosen};x="\"#),
                format!(r#"for="{chosen}"#),
            ] {
                let line = format!("{client}, for=203.0.113.7");
                let k = key(&ip, "10.0.0.1:1", &[("forwarded", &line)]);
                assert_eq!(k, "203.0.113.7", "{line}");
                let k = key(&ip.clone().hops(1), "10.0.0.1:1", &[("forwarded", &line)]);
                assert_eq!(k, "203.0.113.7", "{line}");
            }
        }
    }
}

/// An IPv6 zone is dropped wherever the address comes from, so the key is
/// the address's (its /64 by default).
#[test]
fn zones_are_dropped_in_every_header_and_the_peer() {
    let ip = proxies();
    let fwd = proxies().header(ForwardedHeader::Forwarded);
    let real = proxies().header(ForwardedHeader::XRealIp);
    let peer = "10.0.0.1:1";
    assert_eq!(xff(&ip, peer, "fe80::1%eth0"), "fe80::/64");
    assert_eq!(xff(&ip, peer, "[fe80::1%eth0]:80"), "fe80::/64");
    let forwarded = [("forwarded", r#"for="[fe80::1%eth0]:80""#)];
    assert_eq!(key(&fwd, peer, &forwarded), "fe80::/64");
    let forwarded = [("forwarded", "for=fe80::1%25eth0")];
    assert_eq!(key(&fwd, peer, &forwarded), "fe80::/64");
    assert_eq!(
        key(&real, peer, &[("x-real-ip", "fe80::1%eth0")]),
        "fe80::/64"
    );
    let exact = proxies().ipv6_prefix(128);
    assert_eq!(xff(&exact, peer, "fe80::1%eth0"), "fe80::1");
    // Not a zone: the proxy's bucket.
    assert_eq!(xff(&ip, peer, "203.0.113.7%eth0"), "10.0.0.1");
    assert_eq!(xff(&ip, peer, "fe80::1%"), "10.0.0.1");
    // A peer with a scope id.
    let scoped = std::net::SocketAddrV6::new("fe80::1".parse().unwrap(), 1, 0, 2);
    let parts = Request::get("/")
        .extension(SocketAddr::from(scoped))
        .body(())
        .unwrap()
        .into_parts()
        .0;
    assert_eq!(ip.extract(&parts).unwrap().as_bytes(), b"fe80::/64");
    assert_eq!(exact.extract(&parts).unwrap().as_bytes(), b"fe80::1");
}
