//! Reading the hops of a forwarding header, nearest first, without panicking
//! on any bytes and with bounded work.
//!
//! A header lists the addresses a request passed through, the client first:
//! each proxy appends the address of the peer it received the request from.
//! [`hops`] returns them the other way round, nearest hop first, so that
//! [`ClientIp`](super::ClientIp) can walk back from its own peer.
//!
//! Bounds: at most [`MAX_HOPS`] hops are read, taking header lines from the
//! last one back; entries further left are never looked at. Of an
//! `X-Forwarded-For` line longer than [`MAX_LINE`] bytes only the last
//! `MAX_LINE` bytes are read and the cut-off rest counts as one
//! [`Hop::Unknown`]; a longer `Forwarded` line cannot be split safely without
//! reading all of it (its quoted strings may hold commas), so it is one
//! `Hop::Unknown`. An entry longer than [`MAX_ENTRY`] bytes is `Hop::Unknown`.

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

/// Pushes one RFC 7239 `Forwarded` line's hops, right to left.
fn forwarded_line(line: &[u8], hops: &mut Hops) -> bool {
    if line.len() > MAX_LINE {
        return hops.push(Hop::Unknown);
    }
    let elements: Vec<&[u8]> = split_unquoted(line, b',').collect();
    for element in elements.into_iter().rev() {
        if !hops.push(forwarded_element(element)) {
            return false;
        }
    }
    true
}

/// The `for=` node of one forwarded-element such as
/// `for=192.0.2.60;proto=http;by=203.0.113.43`. Parameter names are
/// case-insensitive; an element without exactly one `for` is unknown.
fn forwarded_element(element: &[u8]) -> Hop {
    let mut found = None;
    for pair in split_unquoted(element, b';') {
        let pair = trim(pair);
        if pair.is_empty() {
            continue;
        }
        let Some(eq) = pair.iter().position(|&b| b == b'=') else {
            return Hop::Unknown;
        };
        if !trim(&pair[..eq]).eq_ignore_ascii_case(b"for") {
            continue;
        }
        if found.is_some() {
            return Hop::Unknown;
        }
        found = Some(trim(&pair[eq + 1..]));
    }
    let Some(value) = found else {
        return Hop::Unknown;
    };
    match value {
        [b'"', inner @ .., b'"'] if inner.len() <= MAX_ENTRY => {
            // Unescape the quoted-string into a small stack buffer.
            let mut buf = [0u8; MAX_ENTRY];
            let (mut len, mut escaped) = (0, false);
            for &b in inner {
                if !escaped && b == b'\\' {
                    escaped = true;
                    continue;
                }
                if !escaped && b == b'"' {
                    return Hop::Unknown;
                }
                escaped = false;
                buf[len] = b;
                len += 1;
            }
            if escaped {
                Hop::Unknown
            } else {
                node(&buf[..len])
            }
        }
        [b'"', ..] => Hop::Unknown,
        token => node(token),
    }
}

/// Parses one node: `192.0.2.43`, `2001:db8::1`, `[2001:db8::1]`, or any of
/// those with a port (`192.0.2.43:47011`, `[2001:db8::1]:4711`), the port
/// possibly obfuscated (`_p1`). Everything else (`unknown`, `_hidden`,
/// garbage) is [`Hop::Unknown`].
pub(crate) fn node(bytes: &[u8]) -> Hop {
    if bytes.is_empty() || bytes.len() > MAX_ENTRY {
        return Hop::Unknown;
    }
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

/// Splits `bytes` at `sep`, except inside quoted strings (with `\` escapes).
/// An unterminated quote runs to the end.
fn split_unquoted(bytes: &[u8], sep: u8) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(bytes);
    std::iter::from_fn(move || {
        let s = rest?;
        let (mut quoted, mut escaped) = (false, false);
        for (i, &b) in s.iter().enumerate() {
            match b {
                _ if escaped => escaped = false,
                b'\\' if quoted => escaped = true,
                b'"' => quoted = !quoted,
                _ if b == sep && !quoted => {
                    rest = Some(&s[i + 1..]);
                    return Some(&s[..i]);
                }
                _ => {}
            }
        }
        rest = None;
        Some(s)
    })
}

#[cfg(test)]
mod tests;
