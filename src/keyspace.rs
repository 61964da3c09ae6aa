//! Building store keys: `{prefix}:{algo}:{policy}:{<client>}`.
//!
//! `{policy}` is the limit's name, or for a first limit left unnamed its
//! name and quota, `default.{limit}-{window_ms}` (`-b{burst}` for GCRA):
//! safe characters, at most 63 bytes, within the 64 that `validate` allows
//! a name (see `LimiterBuilder::name`).
//!
//! For a limiter with one limit, the client part is the cluster hash tag, so
//! keys spread over the cluster by client. A limiter with several limits
//! may key them differently (per IP, per API key, global), and one atomic
//! decision needs all its keys in one slot, so there the tag is the
//! limiter's own, `{<prefix>:<first policy>}`, followed by the client part. Client bytes go in raw only when they are at most
//! [`RAW_KEY_MAX`] bytes of a safe alphabet (ASCII letters, digits and
//! `-._~:@/+=`); anything else becomes `#` followed by the hex SHA-256 of the
//! bytes. `#` is outside the safe alphabet, so no raw key can equal a hashed
//! one, and no client can close the hash tag early or reach outside it.
//!
//! So the client part, braces included, is at most `RAW_KEY_MAX + 2` = 130
//! bytes, and a lone limit's whole key (`<prefix>:<algorithm>:<name>:`,
//! the algorithm `fw`, `sw` or `gcra`, then the client part) at most
//! `prefix + name + 137` bytes: 265 with the longest prefix and name
//! `validate` allows. A limit of several adds the shared tag,
//! `{<prefix>:<first policy>}:`, so its keys are bounded too, by less
//! than twice that.

use sha2::{Digest, Sha256};

use crate::error::ConfigError;

/// The longest client key stored raw; longer keys are hashed.
pub const RAW_KEY_MAX: usize = 128;

/// The safe alphabet as a table: one load per byte on the hot path.
const SAFE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric();
        b += 1;
    }
    let extra = b"-._~:@/+=";
    let mut i = 0;
    while i < extra.len() {
        table[extra[i] as usize] = true;
        i += 1;
    }
    table
};

fn is_safe(b: u8) -> bool {
    SAFE[usize::from(b)]
}

/// Checks a configured prefix or policy name: 1 to 64 safe characters.
pub(crate) fn validate(what: &'static str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() || value.len() > 64 || !value.bytes().all(is_safe) {
        return Err(ConfigError::InvalidName {
            what,
            value: value.to_owned(),
        });
    }
    Ok(())
}

/// Where a store key is written: a `String`, a [`StackKey`] on the hot path
/// of local reservations, or the in-memory store's keyed hash, which takes
/// the key without keeping it. Every piece written is ASCII.
pub(crate) trait KeyBuf {
    fn push_str(&mut self, s: &str);

    /// Appends bytes of the safe alphabet: ASCII, so UTF-8. Were they not,
    /// each byte would still be written as a character of its own (never a
    /// replacement character that two keys could share).
    #[inline]
    fn push_safe(&mut self, safe: &[u8]) {
        match std::str::from_utf8(safe) {
            Ok(s) => self.push_str(s),
            Err(_) => {
                for &b in safe {
                    self.push_str(char::from(b).encode_utf8(&mut [0; 4]));
                }
            }
        }
    }
}

impl KeyBuf for String {
    fn push_str(&mut self, s: &str) {
        String::push_str(self, s);
    }
}

/// A store key built on the stack, for the local reservations' hot path: a
/// request spending a reserved unit allocates nothing. (The in-memory store
/// hashes the key as it is written instead: its `KeyHasher`.)
#[derive(Debug)]
pub(crate) struct StackKey {
    buf: [u8; STACK_KEY_MAX],
    len: usize,
    overflowed: bool,
}

/// Room for any key of a lone fixed-window limit, the only one a
/// reservation takes: prefix and name (64 bytes each), the algorithm
/// (`fw`), three colons and the client part (`RAW_KEY_MAX + 2`). A longer
/// key overflows, and is built on the heap.
const STACK_KEY_MAX: usize = 64 + 64 + 2 + 3 + RAW_KEY_MAX + 2;

impl StackKey {
    pub(crate) fn new() -> Self {
        Self {
            buf: [0; STACK_KEY_MAX],
            len: 0,
            overflowed: false,
        }
    }

    /// The key, or `None` if it did not fit (never, for validated names).
    pub(crate) fn get(&self) -> Option<&[u8]> {
        (!self.overflowed).then(|| &self.buf[..self.len])
    }
}

impl KeyBuf for StackKey {
    fn push_str(&mut self, s: &str) {
        self.push_safe(s.as_bytes());
    }

    /// Bytes, as they are: the key is bytes here, never read as text.
    #[inline]
    fn push_safe(&mut self, safe: &[u8]) {
        match self.buf.get_mut(self.len..self.len + safe.len()) {
            Some(to) => {
                to.copy_from_slice(safe);
                self.len += safe.len();
            }
            None => self.overflowed = true,
        }
    }
}

/// Appends the client part, with its hash tag braces, to `out`.
pub(crate) fn push_client(out: &mut impl KeyBuf, client: &[u8]) {
    out.push_str("{");
    push_escaped(out, client);
    out.push_str("}");
}

/// Appends the client bytes raw if safe, else hashed; never a brace.
pub(crate) fn push_escaped(out: &mut impl KeyBuf, client: &[u8]) {
    let raw =
        !client.is_empty() && client.len() <= RAW_KEY_MAX && client.iter().all(|&b| is_safe(b));
    if raw {
        out.push_safe(client);
        return;
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hex = [0u8; 65];
    hex[0] = b'#';
    for (i, b) in Sha256::digest(client).into_iter().enumerate() {
        hex[1 + 2 * i] = HEX[usize::from(b >> 4)];
        hex[2 + 2 * i] = HEX[usize::from(b & 15)];
    }
    out.push_str(std::str::from_utf8(&hex).unwrap_or("#"));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(k: &[u8]) -> String {
        let mut s = String::new();
        push_client(&mut s, k);
        s
    }

    #[test]
    fn bytes_pushed_as_safe_stay_distinct_even_if_not_utf8() {
        // Never reached with safe bytes (all ASCII), but a key is never
        // written lossily: distinct bytes give distinct keys.
        let pushed = |b: &[u8]| {
            let mut s = String::new();
            s.push_safe(b);
            s
        };
        assert_eq!(pushed(b"user:42"), "user:42");
        assert_ne!(pushed(b"a\xfe"), pushed(b"a\xff"));
        assert_ne!(pushed(b"a\xfe\xfe"), pushed(b"a\xfe"));
        let mut stack = StackKey::new();
        stack.push_safe(b"a\xfe");
        assert_eq!(stack.get(), Some(&b"a\xfe"[..]));
    }

    #[test]
    fn safe_short_keys_stay_readable() {
        assert_eq!(client(b"203.0.113.9"), "{203.0.113.9}");
        assert_eq!(client(b"2001:db8::1"), "{2001:db8::1}");
        assert_eq!(client(b"user:42"), "{user:42}");
    }

    #[test]
    fn hostile_keys_are_hashed_bounded_and_distinct() {
        let big = vec![b'a'; 1 << 20];
        let keys = [
            client(&big),
            client(b"a}b"),
            client(b"{x}"),
            client(b"\xff\xfe"),
            client(b""),
            client(b"with space"),
            client(&[b'a'; RAW_KEY_MAX + 1]),
        ];
        for k in &keys {
            assert_eq!(k.len(), 2 + 1 + 64, "{k}");
            assert!(k.starts_with("{#") && k.ends_with('}'));
            assert_eq!(k.matches(['{', '}']).count(), 2);
        }
        let distinct: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(distinct.len(), keys.len());
        // A client cannot pose as another client's hashed form.
        let hashed = client(b"a}b");
        let inner = &hashed[1..hashed.len() - 1];
        assert_ne!(client(inner.as_bytes()), hashed);
        assert_eq!(client(&[b'a'; RAW_KEY_MAX]).len(), RAW_KEY_MAX + 2);
    }

    #[test]
    fn values_starting_with_a_hash_are_never_stored_raw() {
        for raw in [&b"#abc"[..], b"#", b"#0123456789abcdef"] {
            let k = client(raw);
            assert_ne!(k.as_bytes()[1..k.len() - 1], *raw);
            assert_eq!(k.len(), 2 + 1 + 64, "{k}");
        }
    }

    #[test]
    fn a_stack_key_holds_the_longest_key_and_says_when_one_overflows() {
        let name = "n".repeat(64);
        let prefix = format!("{name}:fw:{name}:");
        let mut key = StackKey::new();
        key.push_str(&prefix);
        push_client(&mut key, &[b'a'; RAW_KEY_MAX]);
        let mut text = prefix.clone();
        push_client(&mut text, &[b'a'; RAW_KEY_MAX]);
        assert_eq!(key.get(), Some(text.as_bytes()));
        key.push_str("x");
        assert_eq!(key.get(), None);
    }

    #[test]
    fn validates_names() {
        assert!(validate("prefix", "rl").is_ok());
        assert!(validate("prefix", "my-app.v2").is_ok());
        for bad in ["", "a{b", "a}b", "a b", "é", &"x".repeat(65)] {
            assert!(validate("prefix", bad).is_err(), "{bad}");
        }
    }
}
