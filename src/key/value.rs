//! [`Key`]: the client identity a request counts against, held inline when
//! short (any IP address or network as text) and shared otherwise.

use std::{fmt, net::IpAddr};

use bytes::Bytes;

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
        // Written straight into the key's own buffer: no second copy.
        let mut buf = [0u8; INLINE_KEY];
        match write_ip(ip, &mut buf) {
            // At most INLINE_KEY, so it fits in a u8.
            Some(len) => Self(Repr::Inline {
                len: len as u8,
                buf,
            }),
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
            // By hand, a digit at a time: a formatter and a copy per octet
            // cost a decision on the memory store more than its lookup.
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    text[len] = b'.';
                    len += 1;
                }
                if octet >= 100 {
                    text[len] = b'0' + octet / 100;
                    len += 1;
                }
                if octet >= 10 {
                    text[len] = b'0' + octet / 10 % 10;
                    len += 1;
                }
                text[len] = b'0' + octet % 10;
                len += 1;
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

#[cfg(test)]
impl Key {
    /// Whether the key is held inline, without an allocation.
    pub(super) fn is_inline(&self) -> bool {
        matches!(self.0, Repr::Inline { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // Every octet, in every place, as std writes it.
        for octet in 0..=u8::MAX {
            for at in 0..4 {
                let mut octets = [7, 70, 170, 1];
                octets[at] = octet;
                let ip = IpAddr::from(octets);
                let key = Key::from_ip(ip);
                assert!(key.is_inline());
                assert_eq!(key.as_bytes(), ip.to_string().as_bytes());
            }
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
}
