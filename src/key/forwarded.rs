//! Reading the hops of a forwarding header, nearest first, without panicking
//! on any bytes and with bounded work.
//!
//! A header lists the addresses a request passed through, the client first:
//! each proxy appends the address of the peer it received the request from.
//! [`hops`] returns them the other way round, nearest hop first, so that
//! [`ClientIp`](super::ClientIp) can walk back from its own peer.
//!
//! Bounds: at most [`MAX_HOPS`] hops are read, taking header lines from the
//! last one back; entries further left are never looked at. Of a
//! header line longer than [`MAX_LINE`] bytes only the last `MAX_LINE` bytes
//! are read and the cut-off rest counts as one [`Hop::Unknown`]. An entry
//! longer than [`MAX_ENTRY`] bytes is `Hop::Unknown`.
//!
//! Lines are read from the right, so that what the nearest proxy appended is
//! read the same whatever the client wrote before it, and reading stops at
//! the first `Forwarded` element that is not well-formed RFC 7239 (an
//! unterminated quote, a stray character): it is one `Hop::Unknown`, and
//! nothing left of it is read (see [`reverse`]).
//!
//! A node with an IPv6 zone (`fe80::1%eth0`, `"[fe80::1%eth0]:80"`) is its
//! address: the zone names an interface of the host that wrote it and says
//! nothing about the client, as with the peer address, whose zone (scope id)
//! is dropped too.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use http::HeaderName;

/// Which forwarding header [`ClientIp`](super::ClientIp) reads. Only that one
/// is believed; the others are ignored even from trusted proxies, so a client
/// cannot slip its own address in through a header your proxy does not
/// overwrite.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: <client>, <proxy1>, <proxy2>` (the default): set by
    /// nginx, HAProxy, Envoy, and the AWS, Google Cloud and Azure load
    /// balancers and most CDNs, so it is the one most deployments have.
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=192.0.2.43, for="[2001:db8:cafe::17]:4711"`.
    /// Only its `for=` parameters are read.
    Forwarded,
    /// `X-Real-IP: <client>`: one address, which the nearest proxy must set
    /// (overwriting any the client sent), such as nginx's
    /// `proxy_set_header X-Real-IP $remote_addr`. Only its last line is read.
    XRealIp,
}

impl ForwardedHeader {
    /// Every forwarding header, whichever is configured.
    pub(crate) const ALL: [ForwardedHeader; 3] = [
        ForwardedHeader::XForwardedFor,
        ForwardedHeader::Forwarded,
        ForwardedHeader::XRealIp,
    ];

    /// The header's name, such as `x-forwarded-for`.
    pub fn name(self) -> HeaderName {
        match self {
            ForwardedHeader::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            ForwardedHeader::Forwarded => http::header::FORWARDED,
            ForwardedHeader::XRealIp => HeaderName::from_static("x-real-ip"),
        }
    }
}

/// The most hops read from a request's forwarding header.
pub(crate) const MAX_HOPS: usize = 32;
/// The most bytes read from one header line.
pub(crate) const MAX_LINE: usize = 8 * 1024;
/// The longest entry that may hold an address: a bracketed IPv6 address with
/// a port is at most 47 bytes; the slack allows for quoting and spaces.
pub(crate) const MAX_ENTRY: usize = 64;

/// One entry of a forwarding header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hop {
    /// An address (its port, if any, dropped).
    Addr(IpAddr),
    /// Anything else: `unknown`, an obfuscated identifier such as `_hidden`,
    /// a malformed or overlong entry, or a part cut off by the bounds.
    Unknown,
}

/// Up to [`MAX_HOPS`] hops, nearest first, on the stack.
#[derive(Debug)]
pub(crate) struct Hops {
    buf: [Hop; MAX_HOPS],
    len: usize,
}

impl Hops {
    fn new() -> Self {
        Self {
            buf: [Hop::Unknown; MAX_HOPS],
            len: 0,
        }
    }

    /// Adds the next hop further from us; `false` once full.
    fn push(&mut self, hop: Hop) -> bool {
        if self.len == MAX_HOPS {
            return false;
        }
        self.buf[self.len] = hop;
        self.len += 1;
        self.len < MAX_HOPS
    }

    /// The hops, nearest first.
    pub(crate) fn as_slice(&self) -> &[Hop] {
        &self.buf[..self.len]
    }
}

/// The hops recorded in header `kind`, nearest first. No header (or only
/// blank lines) gives no hops.
pub(crate) fn hops<'a>(kind: ForwardedHeader, lines: impl Iterator<Item = &'a [u8]>) -> Hops {
    let mut hops = Hops::new();
    let (last, more) = last_lines(lines);
    if kind == ForwardedHeader::XRealIp {
        // One address, set by the nearest proxy: the last line.
        if let Some(line) = last.last() {
            let line = trim(line);
            if !line.is_empty() {
                hops.push(node(line));
            }
        }
        return hops;
    }
    for line in last.iter().rev() {
        let room = match kind {
            ForwardedHeader::Forwarded => forwarded_line(line, &mut hops),
            _ => x_forwarded_for_line(line, &mut hops),
        };
        if !room {
            return hops;
        }
    }
    if more {
        hops.push(Hop::Unknown);
    }
    hops
}

/// The last [`MAX_HOPS`] lines in order, and whether there were more: every
/// non-blank line holds at least one hop, so older lines are never needed.
fn last_lines<'a>(lines: impl Iterator<Item = &'a [u8]>) -> (Vec<&'a [u8]>, bool) {
    let mut last: Vec<&[u8]> = Vec::new();
    let mut more = false;
    for line in lines.filter(|l| !trim(l).is_empty()) {
        if last.len() == MAX_HOPS {
            last.remove(0);
            more = true;
        }
        last.push(line);
    }
    (last, more)
}

/// Pushes one `X-Forwarded-For` line's hops, right to left.
fn x_forwarded_for_line(line: &[u8], hops: &mut Hops) -> bool {
    let (line, cut) = match line.len().checked_sub(MAX_LINE) {
        Some(start) if start > 0 => match line[start..].iter().position(|&b| b == b',') {
            Some(comma) => (&line[start + comma + 1..], true),
            None => (&line[..0], true),
        },
        _ => (line, false),
    };
    if !line.is_empty() || !cut {
        for entry in line.rsplit(|&b| b == b',') {
            if !hops.push(node(trim(entry))) {
                return false;
            }
        }
    }
    !cut || hops.push(Hop::Unknown)
}

/// Pushes one RFC 7239 `Forwarded` line's hops, right to left; `false` once
/// no more are to be read.
///
/// The line is parsed from the right, so that the elements the nearest proxy
/// appended are read the same whatever the client wrote before them. The
/// first element that is not well-formed (see [`reverse`]) is one
/// [`Hop::Unknown`], and nothing to its left is read. Of a line longer than
/// [`MAX_LINE`] bytes only the last `MAX_LINE` bytes are read, and an element
/// that reaches into the cut-off rest is unknown.
fn forwarded_line(line: &[u8], hops: &mut Hops) -> bool {
    let cut = line.len() > MAX_LINE;
    let mut rest = &line[line.len().saturating_sub(MAX_LINE)..];
    loop {
        let Ok((element, before)) = reverse::last_element(rest, cut) else {
            hops.push(Hop::Unknown);
            return false;
        };
        if !hops.push(element.map_or(Hop::Unknown, for_node)) {
            return false;
        }
        match before {
            Some(before) => rest = before,
            None => return true,
        }
    }
}

/// The node of a `for=` value: a token, or a quoted-string's content with
/// its quoted-pairs undone.
fn for_node(value: reverse::Value<'_>) -> Hop {
    match value {
        reverse::Value::Token(token) => node(token),
        reverse::Value::Quoted(content) if content.len() <= 2 * MAX_ENTRY => {
            let mut buf = [0u8; 2 * MAX_ENTRY];
            let (mut len, mut escaped) = (0, false);
            for &b in content {
                if !escaped && b == b'\\' {
                    escaped = true;
                    continue;
                }
                escaped = false;
                buf[len] = b;
                len += 1;
            }
            node(&buf[..len])
        }
        reverse::Value::Quoted(_) => Hop::Unknown,
    }
}

/// Parses one node: `192.0.2.43`, `2001:db8::1`, `[2001:db8::1]`, or any of
/// those with a port (`192.0.2.43:47011`, `[2001:db8::1]:4711`), the port
/// possibly obfuscated (`_p1`), an IPv6 address possibly with a zone
/// (`fe80::1%eth0`, `[fe80::1%eth0]:80`), which is dropped. Everything else
/// (`unknown`, `_hidden`, garbage) is [`Hop::Unknown`].
pub(crate) fn node(bytes: &[u8]) -> Hop {
    if bytes.is_empty() || bytes.len() > MAX_ENTRY {
        return Hop::Unknown;
    }
    let mut unzoned = [0u8; MAX_ENTRY];
    let (bytes, zoned) = match without_zone(bytes, &mut unzoned) {
        Some(len) => (&unzoned[..len], true),
        None => (bytes, false),
    };
    match address(bytes) {
        Hop::Addr(IpAddr::V4(_)) if zoned => Hop::Unknown,
        hop => hop,
    }
}

/// `bytes` without its zone (`%eth0`, up to a `]` or the end) in `out`, and
/// its length; `None` if it has no `%`. A zone that is empty or not made of
/// RFC 6874 characters (unreserved, and `%` for `%25`) stays, so the node is
/// not an address.
fn without_zone(bytes: &[u8], out: &mut [u8; MAX_ENTRY]) -> Option<usize> {
    let pct = bytes.iter().position(|&b| b == b'%')?;
    let end = bytes[pct..]
        .iter()
        .position(|&b| b == b']')
        .map_or(bytes.len(), |i| pct + i);
    let zone = &bytes[pct + 1..end];
    let zone_ok = !zone.is_empty()
        && zone
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b));
    if !zone_ok {
        return None;
    }
    let rest = &bytes[end..];
    out[..pct].copy_from_slice(&bytes[..pct]);
    out[pct..pct + rest.len()].copy_from_slice(rest);
    Some(pct + rest.len())
}

/// [`node`] without zones.
fn address(bytes: &[u8]) -> Hop {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Hop::Unknown;
    };
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Hop::Addr(ip);
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Hop::Addr(addr.ip());
    }
    // `[v6]` alone, or an address with an obfuscated port.
    let (host, port) = match text.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((v6, "")) => {
                return v6
                    .parse::<Ipv6Addr>()
                    .map_or(Hop::Unknown, |ip| Hop::Addr(ip.into()));
            }
            Some((v6, port)) => (v6, port),
            None => return Hop::Unknown,
        },
        None => match text.find(':') {
            Some(colon) => text.split_at(colon),
            None => return Hop::Unknown,
        },
    };
    let obfuscated_port = port.strip_prefix(":_").is_some_and(|p| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    });
    match host.parse::<IpAddr>() {
        Ok(ip) if obfuscated_port => Hop::Addr(ip),
        _ => Hop::Unknown,
    }
}

/// Strips optional whitespace (spaces and tabs) from both ends.
fn trim(mut bytes: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = bytes {
        bytes = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = bytes {
        bytes = rest;
    }
    bytes
}

mod reverse;

#[cfg(test)]
mod tests;
