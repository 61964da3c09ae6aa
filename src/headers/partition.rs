//! The draft's `pk` partition key: a keyed hash of the client's key, which
//! names its quota partition without revealing it.

use std::{fmt, hash::Hasher};

use sha2::{Digest, Sha256};
use siphasher::sip::SipHasher13;

/// The secret of the `pk` hash: SipHash-1-3 keys, drawn at random per layer
/// or derived from a configured secret (so that replicas agree).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct PartitionKeys {
    k0: u64,
    k1: u64,
}

impl fmt::Debug for PartitionKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PartitionKeys(..)")
    }
}

impl PartitionKeys {
    /// Fresh keys from the OS's random source: stable for this process only.
    pub(crate) fn random() -> Self {
        let mut bytes = [0u8; 16];
        crate::random::fill(&mut bytes);
        Self::from_bytes(bytes)
    }

    /// Keys derived from `secret` (SHA-256, first 16 bytes): every process
    /// configured with the same secret gives a client the same `pk`.
    pub(crate) fn from_secret(secret: &[u8]) -> Self {
        let digest = Sha256::digest(secret);
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        Self::from_bytes(bytes)
    }

    /// SipHash's two keys: the low and high halves of `b`, little-endian,
    /// as the memory store's secret splits its bytes.
    fn from_bytes(b: [u8; 16]) -> Self {
        let n = u128::from_le_bytes(b);
        Self {
            k0: n as u64,
            k1: (n >> 64) as u64,
        }
    }

    /// The partition key of the client key `key`.
    pub(crate) fn hash(&self, key: &[u8]) -> u64 {
        let mut h = SipHasher13::new_with_keys(self.k0, self.k1);
        h.write(key);
        h.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_per_secret_and_different_across_secrets_and_keys() {
        let a = PartitionKeys::from_secret(b"replica secret");
        let b = PartitionKeys::from_secret(b"replica secret");
        assert_eq!(a.hash(b"alice"), b.hash(b"alice"));
        assert_ne!(a.hash(b"alice"), a.hash(b"bob"));
        let other = PartitionKeys::from_secret(b"another secret");
        assert_ne!(a.hash(b"alice"), other.hash(b"alice"));
        let (r1, r2) = (PartitionKeys::random(), PartitionKeys::random());
        assert_ne!(r1, r2);
        assert_ne!(r1.hash(b"alice"), r2.hash(b"alice"));
        assert_eq!(
            format!("{r1:?}"),
            "PartitionKeys(..)",
            "the secret is not logged"
        );
    }
}
