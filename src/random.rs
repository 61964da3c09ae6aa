//! Random bytes drawn once, for a store's hash secret, and ids unique
//! across processes: lease tokens, and the ids that make a refund or a reset
//! run once however often it is sent.

use std::{
    hash::{BuildHasher, Hasher, RandomState},
    sync::{
        LazyLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{SystemTime, UNIX_EPOCH},
};

/// A new id, never given before by any process: `<process id>-<counter>`,
/// in lowercase hex and at most 41 bytes. The process id is 96 random bits
/// drawn once, so ids are unique across replicas as well as within this
/// process.
pub(crate) fn unique_id() -> String {
    static PROCESS: LazyLock<String> = LazyLock::new(|| {
        let mut bytes = [0u8; 12];
        fill(&mut bytes);
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    });
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{}-{n:x}", *PROCESS)
}

/// Fills `out` from the OS's random source; without one, from
/// [`fallback`].
pub(crate) fn fill(out: &mut [u8]) {
    if getrandom::fill(out).is_err() {
        fallback(out);
    }
}

/// Bytes from std's `RandomState` (seeded from the OS where it can be),
/// mixed with the process id, the time and the position, so that they still
/// differ between processes and along `out`.
fn fallback(out: &mut [u8]) {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let state = RandomState::new();
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let mut h = state.build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(nanos);
        h.write_usize(i);
        chunk.copy_from_slice(&h.finish().to_le_bytes()[..chunk.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_short() {
        let (a, b) = (unique_id(), unique_id());
        assert_ne!(a, b);
        assert_eq!(a.split('-').next(), b.split('-').next(), "one process id");
        assert!(a.len() <= 24 + 1 + 16, "{a}");
        assert!(
            a.bytes()
                .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f' | b'-')),
            "{a}"
        );
    }

    #[test]
    fn draws_differ_and_the_fallback_fills_every_byte() {
        let (mut a, mut b) = ([0u8; 16], [0u8; 16]);
        fill(&mut a);
        fill(&mut b);
        assert_ne!(a, b);
        let mut c = [0u8; 12];
        fallback(&mut c);
        assert_ne!(c[..8], c[4..], "positions differ");
        assert!(c[8..].iter().any(|&x| x != 0), "the tail is filled: {c:?}");
    }
}
