//! How [`MemoryStore`](super::MemoryStore) names a key in its map: a 128-bit
//! keyed hash of the key's bytes, not the bytes.
//!
//! Each slot is then small, fixed and aligned so that it never straddles
//! two cache lines: 16 bytes of identity and 16 of state for a fixed window
//! or GCRA (32 bytes, two slots to a line), 16 and 32 for a sliding window
//! (64 bytes). A slot keyed by the bytes was about 104 bytes and spanned two
//! or three lines. On a server with many clients every lookup misses the
//! caches, and that is most of what the limiter costs there. Under
//! callgrind's model of a 1 MB L2, a request over 100,000 keys missed it
//! 3.6 times with bytes as keys, 2.0 with 64-byte slots, 1.9 with 32-byte
//! ones, and 0.65 times with no limiter. Hashing happens once per decision,
//! outside the lock, and a table rehashes no key when it grows.
//!
//! Two different keys would share a counter only if their 128-bit hashes
//! collided. The hash is SipHash-1-3 (the function of std's `HashMap`)
//! under a secret drawn from the OS when the store is made, so a client
//! cannot aim for a collision, and a chance one needs about 2^64 live keys:
//! for a billion keys the odds are about 1 in 10^21.

use std::hash::Hasher;

use hashbrown::{HashTable, hash_table::Entry};
use siphasher::sip128::{Hasher128, SipHasher13};

/// A key's identity: its 128-bit SipHash-1-3 under the store's secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct KeyId(u64, u64);

impl KeyId {
    /// Which of `n` shards holds the key: uniform, from the half of the id
    /// the tables do not hash by.
    pub(super) fn shard(self, n: usize) -> usize {
        ((u128::from(self.1) * n as u128) >> 64) as usize
    }
}

/// One key's slot: its identity, then its entry `T`, aligned to `A` (a
/// [`Line32`] or [`Line64`]), so that no slot straddles two cache lines.
#[derive(Debug)]
#[repr(C)]
struct Slot<T, A> {
    align: [A; 0],
    id: KeyId,
    entry: T,
}

/// Aligns a 32-byte slot: two to a cache line.
#[derive(Debug)]
#[repr(align(32))]
pub(super) struct Line32;

/// Aligns a slot of up to 64 bytes: one cache line.
#[derive(Debug)]
#[repr(align(64))]
pub(super) struct Line64;

/// Every key's entry, by [`KeyId`]. The id is already a keyed hash, so its
/// first half is the table's hash as it is.
#[derive(Debug)]
pub(super) struct Table<T, A>(HashTable<Slot<T, A>>);

impl<T, A> Default for Table<T, A> {
    fn default() -> Self {
        Self(HashTable::new())
    }
}

impl<T, A> Table<T, A> {
    pub(super) fn get_mut(&mut self, id: KeyId) -> Option<&mut T> {
        let slot = self.0.find_mut(id.0, |s| s.id == id)?;
        Some(&mut slot.entry)
    }

    /// Stores `entry`; true when the key is new.
    pub(super) fn insert(&mut self, id: KeyId, entry: T) -> bool {
        if self.0.len() == self.0.capacity() {
            self.rebuild_if_worn();
        }
        match self.0.entry(id.0, |s| s.id == id, |s| s.id.0) {
            Entry::Occupied(mut held) => {
                held.get_mut().entry = entry;
                false
            }
            Entry::Vacant(free) => {
                free.insert(Slot {
                    align: [],
                    id,
                    entry,
                });
                true
            }
        }
    }

    pub(super) fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        self.0.retain(|s| keep(&s.entry));
    }

    /// Removes the entries that `keep` rejects among buckets `from..`, at
    /// most `n` of them; returns how many buckets it looked at (0 once
    /// `from` is past the end). Removing moves no other entry, so a cursor
    /// over bucket indices sees every entry that stays put.
    pub(super) fn reclaim(
        &mut self,
        from: usize,
        n: usize,
        mut keep: impl FnMut(&T) -> bool,
    ) -> usize {
        let end = from.saturating_add(n).min(self.0.num_buckets());
        for i in from..end {
            if let Ok(held) = self.0.get_bucket_entry(i)
                && !keep(&held.get().entry)
            {
                held.remove();
            }
        }
        end.saturating_sub(from)
    }

    /// The next insert would resize: if removed entries' tombstones are what
    /// filled the table (it holds at most 7/8 of what its buckets can), it
    /// is rebuilt at the same size instead of doubling. (hashbrown would
    /// double a table more than half full, tombstones or not.)
    fn rebuild_if_worn(&mut self) {
        let buckets = self.0.num_buckets();
        let full = bucket_capacity(buckets);
        if buckets > 0 && self.0.len() <= full / 8 * 7 {
            let old = std::mem::replace(&mut self.0, HashTable::with_capacity(full));
            for slot in old {
                self.0.insert_unique(slot.id.0, slot, |s| s.id.0);
            }
        }
    }

    /// Gives memory back when the table holds under an eighth of what it
    /// could: shrinks it to twice its entries.
    pub(super) fn shrink_if_sparse(&mut self) {
        if self.0.num_buckets() > 64 && self.0.len() * 8 < self.0.capacity() {
            self.0.shrink_to(self.0.len() * 2, |s| s.id.0);
        }
    }

    /// Buckets allocated (an empty table has none, whatever hashbrown says).
    #[cfg(test)]
    pub(super) fn num_buckets(&self) -> usize {
        if self.0.capacity() == 0 {
            0
        } else {
            self.0.num_buckets()
        }
    }

    /// Whether one more key would resize (or rebuild) the table.
    pub(super) fn is_full(&self) -> bool {
        self.0.len() == self.0.capacity()
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }
}

/// How many entries hashbrown lets `buckets` hold: 7/8 of them, or all but
/// one below 8 (its `bucket_mask_to_capacity`).
fn bucket_capacity(buckets: usize) -> usize {
    if buckets < 8 {
        buckets.saturating_sub(1)
    } else {
        buckets / 8 * 7
    }
}

/// The secret a store hashes its keys with; clones share it with the map.
#[derive(Debug, Clone, Copy)]
pub(super) struct Secret(u64, u64);

impl Secret {
    /// A secret from the OS's random source.
    pub(super) fn new() -> Self {
        let mut bytes = [0u8; 16];
        crate::random::fill(&mut bytes);
        let n = u128::from_le_bytes(bytes);
        Self(n as u64, (n >> 64) as u64)
    }

    /// The identity of `key`.
    pub(super) fn id(&self, key: &[u8]) -> KeyId {
        let mut h = SipHasher13::new_with_keys(self.0, self.1);
        h.write(key);
        let hash = h.finish128();
        KeyId(hash.h1, hash.h2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_per_secret_distinct_per_key_and_secret() {
        let (s, t) = (Secret::new(), Secret::new());
        assert_eq!(s.id(b"rl:fw:default:{a}"), s.id(b"rl:fw:default:{a}"));
        assert_ne!(s.id(b"rl:fw:default:{a}"), s.id(b"rl:fw:default:{b}"));
        assert_ne!(s.id(b"k"), t.id(b"k"), "each store draws its own secret");
        let ids: std::collections::HashSet<_> = (0..100_000u32)
            .map(|i| s.id(i.to_string().as_bytes()))
            .map(|KeyId(a, b)| (a, b))
            .collect();
        assert_eq!(ids.len(), 100_000);
    }

    #[test]
    fn slots_fill_whole_cache_lines_and_the_table_finds_by_id() {
        use std::mem::{align_of, size_of};
        assert_eq!(
            (
                size_of::<Slot<[u64; 2], Line32>>(),
                align_of::<Slot<[u64; 2], Line32>>()
            ),
            (32, 32)
        );
        assert_eq!(
            (
                size_of::<Slot<[u64; 4], Line64>>(),
                align_of::<Slot<[u64; 4], Line64>>()
            ),
            (64, 64)
        );
        let s = Secret::new();
        let mut t = Table::<u64, Line32>::default();
        for i in 0..1000u32 {
            assert!(t.insert(s.id(&i.to_le_bytes()), u64::from(i)));
        }
        assert!(!t.insert(s.id(&7u32.to_le_bytes()), 7000));
        assert_eq!(t.len(), 1000);
        assert_eq!(t.get_mut(s.id(&7u32.to_le_bytes())).copied(), Some(7000));
        assert_eq!(t.get_mut(s.id(b"absent")), None);
        t.retain(|e| *e != 7000);
        assert_eq!((t.len(), t.get_mut(s.id(&7u32.to_le_bytes()))), (999, None));
    }
}
