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
        b"fe80::1%eth0",
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
        "by=203.0.113.43;proto=https",
        "for=192.0.2.1;for=192.0.2.2",
        "for",
        ";;",
        ",",
    ] {
        assert_eq!(fwd(&[bad, "x"])[1], Hop::Unknown, "{bad}");
    }
    assert_eq!(fwd(&["", " \t"]), []);
    // Whitespace and empty parameters are tolerated.
    assert_eq!(
        fwd(&[" for = 192.0.2.1 ; ;proto=http "]),
        [addr("192.0.2.1")]
    );
    // An unterminated quote swallows the rest of its line.
    assert_eq!(fwd(&[r#"for="x, for=192.0.2.9"#]), [Hop::Unknown]);
    // Overlong lines are one unknown hop.
    let long = format!("for=192.0.2.1, {}", "for=192.0.2.2, ".repeat(MAX_LINE / 10));
    assert_eq!(fwd(&[&long]), [Hop::Unknown]);
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
