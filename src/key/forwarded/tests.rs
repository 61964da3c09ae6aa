use super::*;

fn addr(s: &str) -> Hop {
    Hop::Addr(s.parse().unwrap())
}

fn read(kind: ForwardedHeader, lines: &[&[u8]]) -> Vec<Hop> {
    hops(kind, lines.iter().copied()).as_slice().to_vec()
}

fn xff(lines: &[&str]) -> Vec<Hop> {
    let lines: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
    read(ForwardedHeader::XForwardedFor, &lines)
}

fn fwd(lines: &[&str]) -> Vec<Hop> {
    let lines: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
    read(ForwardedHeader::Forwarded, &lines)
}

#[test]
fn nodes() {
    assert_eq!(node(b"192.0.2.43"), addr("192.0.2.43"));
    assert_eq!(node(b"192.0.2.43:47011"), addr("192.0.2.43"));
    assert_eq!(node(b"2001:db8::1"), addr("2001:db8::1"));
    assert_eq!(node(b"[2001:db8::1]"), addr("2001:db8::1"));
    assert_eq!(node(b"[2001:db8:cafe::17]:4711"), addr("2001:db8:cafe::17"));
    assert_eq!(node(b"[2001:db8::1]:_port"), addr("2001:db8::1"));
    assert_eq!(node(b"192.0.2.43:_p1"), addr("192.0.2.43"));
    // IPv6 zones are dropped, in every form.
    assert_eq!(node(b"fe80::1%eth0"), addr("fe80::1"));
    assert_eq!(node(b"fe80::1%25eth0"), addr("fe80::1"));
    assert_eq!(node(b"[fe80::1%eth0]"), addr("fe80::1"));
    assert_eq!(node(b"[fe80::1%eth0]:80"), addr("fe80::1"));
    assert_eq!(node(b"[fe80::1%2]:_p"), addr("fe80::1"));
    assert_eq!(node(b"::ffff:1.2.3.4%eth0"), addr("::ffff:1.2.3.4"));
    for bad in [
        &b"unknown"[..],
        b"_gazonk",
        b"_hidden",
        b"",
        b"1.2.3",
        b"1.2.3.4.5",
        b"[2001:db8::1",
        b"[1.2.3.4]",
        b"192.0.2.43:",
        b"192.0.2.43:_",
        b"192.0.2.43:_a b",
        b"1.2.3.4%eth0",
        b"1.2.3.4:80%eth0",
        b"fe80::1%",
        b"fe80::1%eth 0",
        b"fe80::1%eth0:80",
        b"[fe80::1%]:80",
        b"[fe80::1%eth0",
        b"%eth0",
        b"\xff\xfe",
        b"example.com",
        &[b'1'; MAX_ENTRY + 1],
    ] {
        assert_eq!(
            node(bad),
            Hop::Unknown,
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn x_forwarded_for_is_read_right_to_left_across_lines() {
    assert_eq!(
        xff(&["203.0.113.7, 10.0.0.1", " 10.0.0.2 ,10.0.0.3"]),
        ["10.0.0.3", "10.0.0.2", "10.0.0.1", "203.0.113.7"].map(addr)
    );
    assert_eq!(xff(&[]), []);
    assert_eq!(xff(&["", "  "]), []);
    assert_eq!(
        xff(&["1.1.1.1,,unknown, 2.2.2.2"]),
        [addr("2.2.2.2"), Hop::Unknown, Hop::Unknown, addr("1.1.1.1")]
    );
}

#[test]
fn x_forwarded_for_reads_at_most_max_hops() {
    let long = vec!["10.0.0.1"; 100].join(",");
    let hops = xff(&[&long]);
    assert_eq!(hops.len(), MAX_HOPS);
    let many: Vec<&str> = vec!["10.0.0.1"; MAX_HOPS + 5];
    assert_eq!(xff(&many).len(), MAX_HOPS);
    // Fewer lines than the cap, but more before them: the rest is unknown.
    let mut lines = vec!["10.0.0.9"; MAX_HOPS + 1];
    lines[MAX_HOPS] = "10.0.0.1";
    let hops = xff(&lines);
    assert_eq!(hops.len(), MAX_HOPS);
    assert_eq!(hops[0], addr("10.0.0.1"));
}

#[test]
fn long_x_forwarded_for_lines_keep_their_tail() {
    // The client's padding, then what the proxy appended.
    let line = format!("{}, 203.0.113.7", "9".repeat(MAX_LINE * 2));
    assert_eq!(xff(&[&line]), [addr("203.0.113.7"), Hop::Unknown]);
    // A cut that lands inside an address never yields a piece of it.
    let line = format!("211.2.3.4,{},2.2.2.2", "9".repeat(MAX_LINE - 17));
    assert_eq!(line.len(), MAX_LINE + 1);
    assert_eq!(xff(&[&line]), [addr("2.2.2.2"), Hop::Unknown, Hop::Unknown]);
    let line = format!("{}0.0.0.1,1.1.1.1,2.2.2.2", ",".repeat(MAX_LINE));
    let hops = xff(&[&line]);
    assert_eq!(hops[..2], [addr("2.2.2.2"), addr("1.1.1.1")]);
    assert_eq!(hops.len(), MAX_HOPS);
}

#[test]
fn forwarded_rfc_7239_examples() {
    // RFC 7239 section 4.
    assert_eq!(fwd(&[r#"for="_gazonk""#]), [Hop::Unknown]);
    assert_eq!(
        fwd(&[r#"For="[2001:db8:cafe::17]:4711""#]),
        [addr("2001:db8:cafe::17")]
    );
    assert_eq!(
        fwd(&["for=192.0.2.60;proto=http;by=203.0.113.43"]),
        [addr("192.0.2.60")]
    );
    assert_eq!(
        fwd(&["for=192.0.2.43, for=198.51.100.17"]),
        [addr("198.51.100.17"), addr("192.0.2.43")]
    );
    // Section 7.1: the same, as separate lines.
    assert_eq!(
        fwd(&[
            "for=192.0.2.43",
            "for=198.51.100.17;by=203.0.113.60;proto=http;host=example.com"
        ]),
        [addr("198.51.100.17"), addr("192.0.2.43")]
    );
    // Section 6: unknown and obfuscated nodes, obfuscated ports.
    assert_eq!(
        fwd(&["for=unknown, for=_hidden"]),
        [Hop::Unknown, Hop::Unknown]
    );
    assert_eq!(
        fwd(&[r#"for="192.0.2.43:_p1""#, r#"FOR="[2001:db8::1]:_x""#]),
        [addr("2001:db8::1"), addr("192.0.2.43")]
    );
}

#[test]
fn forwarded_quoting_and_oddities() {
    // A comma or semicolon inside a quoted string does not split.
    assert_eq!(
        fwd(&[r#"for=192.0.2.1;host="a,b;c", for=192.0.2.2"#]),
        [addr("192.0.2.2"), addr("192.0.2.1")]
    );
    // Escapes are undone; a stray quote or a missing for= is unknown.
    assert_eq!(fwd(&[r#"for="192.0.2.\1""#]), [addr("192.0.2.1")]);
    for bad in [
        r#"for="192.0.2.1"#,
        r#"for="192.0.2.1\""#,
        r#"for="19"2.0.2.1""#,
        r#"for=192.0.2.1""#,
        r#"for=\"192.0.2.1""#,
        r#"for="192.0.2.1" "x""#,
        "for=\"192.0.2.1\x01\"",
        "for=\"192.0.2.1\\\x7f\"",
        "by=203.0.113.43;proto=https",
        "for=192.0.2.1;for=192.0.2.2",
        "for=192.0.2.1 x",
        "for=192.0.2.1=",
        "for=192.0.2.1/8",
        "=192.0.2.1",
        "for",
        ";;",
        ",",
    ] {
        let hops = fwd(&[bad, "for=192.0.2.7"]);
        assert_eq!(hops[..2], [addr("192.0.2.7"), Hop::Unknown], "{bad}");
    }
    assert_eq!(fwd(&["", " \t"]), []);
    // Whitespace and empty parameters are tolerated.
    assert_eq!(
        fwd(&[" for = 192.0.2.1 ; ;proto=http "]),
        [addr("192.0.2.1")]
    );
    // Quoted-pairs, and quoted commas, semicolons and quotes.
    assert_eq!(
        fwd(&[r#"for=192.0.2.1;x="a\"b,c;\\", for="[2001:db8::1]""#]),
        [addr("2001:db8::1"), addr("192.0.2.1")]
    );
    // Unquoted addresses with colons, as some proxies write them.
    assert_eq!(
        fwd(&["for=2001:db8::1, for=192.0.2.1:80, for=[2001:db8::2]:443"]),
        ["2001:db8::2", "192.0.2.1", "2001:db8::1"].map(addr)
    );
    // Overlong lines keep their tail, and the cut element is unknown.
    let long = format!("for=192.0.2.1, {}", "for=192.0.2.2, ".repeat(MAX_LINE / 10));
    let long = format!("{long}for=203.0.113.7");
    let hops = fwd(&[&long]);
    assert_eq!(hops.len(), MAX_HOPS);
    assert_eq!(hops[..2], [addr("203.0.113.7"), addr("192.0.2.2")]);
    let line = format!("for=192.0.2.1{}, for=203.0.113.7", " ".repeat(MAX_LINE));
    assert_eq!(fwd(&[&line]), [addr("203.0.113.7"), Hop::Unknown]);
}

/// The nearest proxy appends `, for=<client>` to the client's line, or adds
/// a line: whatever the client wrote, that element is read, and nothing the
/// client wrote is read as an address once an element is malformed.
#[test]
fn a_client_quote_never_reaches_past_what_the_proxy_appended() {
    for client in [
        r#"for=10.9.9.1;by=""#,
        r#"for=10.9.9.1;proto=""#,
        r#"for=10.9.9.1;x="\"#,
        r#"for="10.9.9.1"#,
        r#"for=10.9.9.1;by="a\"#,
        r#"for=10.9.9.1;by="a\""#,
        r#"for=10.9.9.1;by=x""#,
        r#"for=10.9.9.1, by=""#,
    ] {
        for proxy in ["for=203.0.113.7", r#"for="[2001:db8::7]:4711";proto=https"#] {
            let expected = match proxy.starts_with("for=2") {
                true => addr("203.0.113.7"),
                false => addr("2001:db8::7"),
            };
            let appended = format!("{client}, {proxy}");
            assert_eq!(fwd(&[&appended]), [expected, Hop::Unknown], "{appended}");
            assert_eq!(fwd(&[client, proxy]), [expected, Hop::Unknown], "{client}");
        }
    }
    // A quote left open past the cut of a long line: the tail's commas are
    // not element boundaries the client can fake.
    let padded = format!(
        r#"by="{}{}", for=203.0.113.7"#,
        "x".repeat(MAX_LINE),
        r#"\", for=6.6.6.6, y=\""#
    );
    assert_eq!(fwd(&[&padded]), [addr("203.0.113.7"), Hop::Unknown]);
}

#[test]
fn x_real_ip_is_one_address_from_the_last_line() {
    let real = |lines: &[&str]| {
        let lines: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
        read(ForwardedHeader::XRealIp, &lines)
    };
    assert_eq!(real(&["6.6.6.6", " 203.0.113.7 "]), [addr("203.0.113.7")]);
    assert_eq!(real(&["1.1.1.1, 2.2.2.2"]), [Hop::Unknown]);
    assert_eq!(real(&[]), []);
}
