//! How [`MemoryStore`](super::MemoryStore) names a key in its map: a 128-bit
//! keyed hash of the key's bytes, not the bytes; and the map itself.
//!
//! Each slot is then small and fixed: 16 bytes of identity and 16 of state
//! for a fixed window or GCRA (32 bytes, two slots to a cache line), 16 and
//! 32 for a sliding window (one slot to a line). A slot keyed by the bytes
//! was about 104 bytes and spanned two or three lines. On a server with
//! many clients every lookup misses the caches, and that is most of what
//! the limiter costs there. Under callgrind's model of a 1 MB L2, a request
//! over 100,000 keys missed it 3.6 times with bytes as keys, 2.0 with
//! 64-byte slots, 1.9 with 32-byte ones, and 0.65 times with no limiter.
//! Hashing happens once per decision, outside the lock, and a table
//! rehashes no key when it grows.
//!
//! The ids sit in the slots, and a lookup starts at the cache line the id
//! names ([`Table`]), so it usually reads that one line. With hashbrown's
//! table, whose control bytes lie apart from its slots, it read two lines,
//! the second only once the first had arrived: on 100,000 keys, a profile
//! of the server put 39% of the lookup's time on the control bytes and 51%
//! on the slot. A lookup over 100,000 keys, alone in a loop, went from
//! about 290 ns to about 240 (a single key: about 170 either way).
//!
//! Two different keys would share a counter only if their 128-bit hashes
//! collided. The hash is SipHash-1-3 (the function of std's `HashMap`)
//! under a secret drawn from the OS when the store is made, so a client
//! cannot aim for a collision, and a chance one needs about 2^64 live keys:
//! for a billion keys the odds are about 1 in 10^21.

use std::hash::Hasher;

use siphasher::sip128::{Hasher128, SipHasher13};

use crate::keyspace::KeyBuf;

/// A key's identity: its 128-bit SipHash-1-3 under the store's secret. Its
/// first half is never [`EMPTY`] or [`REMOVED`] (see [`Secret::id`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyId(u64, u64);

/// The first half of a free slot's id: never used.
const EMPTY: u64 = 0;
/// The first half of a removed entry's id (a tombstone): its slot is free,
/// but lookups probe past it.
const REMOVED: u64 = 1;

impl KeyId {
    /// Which of `n` shards holds the key: uniform, from the half of the id
    /// the tables do not hash by.
    pub(super) fn shard(self, n: usize) -> usize {
        ((u128::from(self.1) * n as u128) >> 64) as usize
    }

    fn holds_a_key(self) -> bool {
        self.0 > REMOVED
    }
}

/// One key's slot: its identity, then its entry.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
struct Slot<T> {
    id: KeyId,
    entry: T,
}

/// One cache line: `K` slots, aligned so that a line is one cache line.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Line<T, const K: usize>([Slot<T>; K]);

/// Every key's entry, by [`KeyId`], in lines of `K` slots (2 for a fixed
/// window or GCRA, 1 for a sliding window), with the ids in the slots.
///
/// Open addressing, probing line after line from the line the id's first
/// half names; a lookup stops at the first free slot. So a lookup reads one
/// cache line, usually, where a table with its control bytes apart from its
/// slots (hashbrown's) reads two, one after the other. Removing an entry
/// moves no other entry: its slot becomes free if no probe needs to pass
/// it, a tombstone otherwise, and the tombstones go when the table is
/// rebuilt. The table is grown, or rebuilt at its size, when its entries
/// and tombstones would fill more than 7/8 of its slots.
#[derive(Debug)]
pub(super) struct Table<T, const K: usize> {
    lines: Box<[Line<T, K>]>,
    /// Entries held.
    len: usize,
    /// Slots not free: entries and tombstones.
    used: usize,
}

impl<T, const K: usize> Default for Table<T, K> {
    fn default() -> Self {
        Self {
            lines: Box::new([]),
            len: 0,
            used: 0,
        }
    }
}

impl<T: Copy + Default, const K: usize> Table<T, K> {
    /// Lines are powers of two in number, so slots are too.
    const K_IS_A_POWER_OF_TWO: () = assert!(K.is_power_of_two());

    pub(super) fn get_mut(&mut self, id: KeyId) -> Option<&mut T> {
        let (line, k) = self.find(id).ok()?;
        Some(&mut self.lines[line].0[k].entry)
    }

    /// Stores `entry`; true when the key is new.
    pub(super) fn insert(&mut self, id: KeyId, entry: T) -> bool {
        let at = match self.find(id) {
            Ok((line, k)) => {
                self.lines[line].0[k].entry = entry;
                return false;
            }
            Err(Some(free)) if self.used < most(self.slots()) || !self.is_free(free) => free,
            Err(_) => {
                self.grow_or_rebuild();
                self.free_slot(id)
            }
        };
        if self.is_free(at) {
            self.used += 1;
        }
        self.len += 1;
        self.lines[at / K].0[at % K] = Slot { id, entry };
        true
    }

    pub(super) fn retain(&mut self, keep: impl FnMut(&T) -> bool) {
        self.reclaim(0, self.slots(), keep);
    }

    /// Removes the entries that `keep` rejects among slots `from..`, at
    /// most `n` of them; returns how many slots it looked at (0 once `from`
    /// is past the end). Removing moves no other entry, so a cursor over
    /// slot indices sees every entry that stays put.
    pub(super) fn reclaim(
        &mut self,
        from: usize,
        n: usize,
        mut keep: impl FnMut(&T) -> bool,
    ) -> usize {
        let end = from.saturating_add(n).min(self.slots());
        for at in from..end {
            let slot = self.lines[at / K].0[at % K];
            if slot.id.holds_a_key() && !keep(&slot.entry) {
                self.remove(at);
            }
        }
        end.saturating_sub(from)
    }

    /// Gives memory back when the table holds under an eighth of what it
    /// could: rebuilds it for twice its entries.
    pub(super) fn shrink_if_sparse(&mut self) {
        if self.slots() > 64 && self.len * 8 < most(self.slots()) {
            self.rebuild(if self.len == 0 {
                0
            } else {
                slots_for(self.len * 2)
            });
        }
    }

    /// Slots allocated.
    #[cfg(test)]
    pub(super) fn num_buckets(&self) -> usize {
        self.slots()
    }

    /// Whether one more key might grow (or rebuild) the table.
    pub(super) fn is_full(&self) -> bool {
        self.used >= most(self.slots())
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    fn slots(&self) -> usize {
        self.lines.len() * K
    }

    fn id_at(&self, at: usize) -> KeyId {
        self.lines[at / K].0[at % K].id
    }

    fn is_free(&self, at: usize) -> bool {
        self.id_at(at).0 == EMPTY
    }

    /// The slot holding `id`; if none, the first slot an insert of `id`
    /// may take (a tombstone, or else the free slot that ended the probe),
    /// `None` in an empty table.
    fn find(&self, id: KeyId) -> Result<(usize, usize), Option<usize>> {
        let lines = self.lines.len();
        if lines == 0 {
            return Err(None);
        }
        let mut line = (id.0 as usize) & (lines - 1);
        let mut tombstone = None;
        // At least one slot is always free, so the probe ends within a lap.
        for _ in 0..lines {
            for (k, slot) in self.lines[line].0.iter().enumerate() {
                if slot.id == id {
                    return Ok((line, k));
                }
                match slot.id.0 {
                    EMPTY => return Err(Some(tombstone.unwrap_or(line * K + k))),
                    REMOVED if tombstone.is_none() => tombstone = Some(line * K + k),
                    _ => {}
                }
            }
            line = (line + 1) & (lines - 1);
        }
        Err(tombstone)
    }

    /// The first free slot or tombstone on `id`'s probe (the table has room).
    fn free_slot(&self, id: KeyId) -> usize {
        match self.find(id) {
            Err(Some(at)) => at,
            _ => unreachable!("a rebuilt table has a free slot and no copy of a new id"),
        }
    }

    /// Removes the entry at slot `at`. Its slot is free if the next slot is
    /// (no probe passes it), and then so are the tombstones just before it.
    fn remove(&mut self, at: usize) {
        let slots = self.slots();
        self.len -= 1;
        if !self.is_free((at + 1) % slots) {
            self.lines[at / K].0[at % K].id = KeyId(REMOVED, 0);
            return;
        }
        let mut at = at;
        for _ in 0..slots {
            self.lines[at / K].0[at % K].id = KeyId(EMPTY, 0);
            self.used -= 1;
            at = (at + slots - 1) % slots;
            if self.id_at(at).0 != REMOVED {
                break;
            }
        }
    }

    /// Before an insert that would fill more than [`most`] of the slots:
    /// if tombstones are what filled them (the entries fill at most 7/8 of
    /// that), rebuilds the table at its size; else doubles it.
    fn grow_or_rebuild(&mut self) {
        let slots = self.slots();
        if slots > 0 && self.len < most(slots) / 8 * 7 {
            self.rebuild(slots);
        } else {
            self.rebuild(slots_for(self.len + 1).max(slots * 2));
        }
    }

    /// Moves every entry to a new table of `slots` slots, with no tombstones.
    fn rebuild(&mut self, slots: usize) {
        let () = Self::K_IS_A_POWER_OF_TWO;
        let empty = Slot {
            id: KeyId(EMPTY, 0),
            entry: T::default(),
        };
        let lines = vec![Line([empty; K]); slots.div_ceil(K)].into_boxed_slice();
        let old = std::mem::replace(&mut self.lines, lines);
        self.used = self.len;
        for slot in old.iter().flat_map(|line| line.0) {
            if slot.id.holds_a_key() {
                let at = self.free_slot(slot.id);
                self.lines[at / K].0[at % K] = slot;
            }
        }
    }
}

/// The most slots that entries and tombstones may fill in a table of
/// `slots`: 7/8 of them, or all but one below 8, so one is always free.
fn most(slots: usize) -> usize {
    if slots < 8 {
        slots.saturating_sub(1)
    } else {
        slots / 8 * 7
    }
}

/// The fewest slots, a power of two and at least 8, that hold `n` entries.
fn slots_for(n: usize) -> usize {
    let mut slots = 8;
    while most(slots) < n {
        slots *= 2;
    }
    slots
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

    /// A hasher for a key's identity, empty.
    pub(super) fn hasher(&self) -> KeyHasher {
        KeyHasher(SipHasher13::new_with_keys(self.0, self.1))
    }

    /// The identity of `key`.
    pub(super) fn id(&self, key: &[u8]) -> KeyId {
        let mut h = self.hasher();
        h.push_safe(key);
        h.id()
    }
}

/// A key's identity on its way: the store's keyed hash, fed the store key
/// piece by piece as a [`KeyBuf`], so the key is never written out. Copied
/// once it has taken a limit's prefix, it names each key of that limit
/// without hashing the prefix again
/// ([`MemoryStore::key_hasher`](super::MemoryStore::key_hasher)). Whatever
/// the pieces, the identity is that of their bytes end to end
/// ([`Secret::id`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyHasher(SipHasher13);

impl KeyHasher {
    /// The identity of the bytes taken so far.
    pub(crate) fn id(self) -> KeyId {
        let hash = self.0.finish128();
        // The tables mark free slots and tombstones by the first half: a
        // key whose first half is one of those takes the next value up.
        KeyId(hash.h1.max(REMOVED + 1), hash.h2)
    }
}

impl KeyBuf for KeyHasher {
    fn push_str(&mut self, s: &str) {
        self.0.write(s.as_bytes());
    }

    /// Bytes, as they are, as a [`StackKey`](crate::keyspace::StackKey)
    /// takes them.
    fn push_safe(&mut self, safe: &[u8]) {
        self.0.write(safe);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_in_pieces_has_the_id_of_its_bytes() {
        let s = Secret::new();
        let key: Vec<u8> = (0..200u8).collect();
        for cut in [0, 1, 7, 8, 9, 40, 100, 200] {
            for second in [0, 1, 2, 7, 8, 60] {
                let (head, rest) = key.split_at(cut);
                let (middle, tail) = rest.split_at(second.min(rest.len()));
                let mut h = s.hasher();
                h.push_safe(head);
                h.push_safe(middle);
                h.push_str("{");
                h.push_safe(tail);
                let whole = [head, middle, b"{", tail].concat();
                assert_eq!(h.id(), s.id(&whole), "cut at {cut} and {second}");
            }
        }
    }

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
    fn lines_are_whole_cache_lines_and_the_table_finds_by_id() {
        use std::mem::{align_of, size_of};
        let line = |size, align| (size, align);
        assert_eq!(
            line(
                size_of::<Line<[u64; 2], 2>>(),
                align_of::<Line<[u64; 2], 2>>()
            ),
            (64, 64)
        );
        assert_eq!(
            line(
                size_of::<Line<[u64; 4], 1>>(),
                align_of::<Line<[u64; 4], 1>>()
            ),
            (64, 64)
        );
        let s = Secret::new();
        let mut t = Table::<u64, 2>::default();
        for i in 0..1000u32 {
            assert!(t.insert(s.id(&i.to_le_bytes()), u64::from(i)));
            // At most 7/8 of the slots taken, and one free at least.
            assert!(t.used <= most(t.num_buckets()) && t.used < t.num_buckets());
        }
        // 1,000 keys: more than 7/8 of 1,024 slots, so 2,048.
        assert_eq!(t.num_buckets(), 2048);
        assert!(!t.insert(s.id(&7u32.to_le_bytes()), 7000));
        assert_eq!(t.len(), 1000);
        assert_eq!(t.get_mut(s.id(&7u32.to_le_bytes())).copied(), Some(7000));
        assert_eq!(t.get_mut(s.id(b"absent")), None);
        t.retain(|e| *e != 7000);
        assert_eq!((t.len(), t.get_mut(s.id(&7u32.to_le_bytes()))), (999, None));
    }

    /// Ids that all probe from line 0 of a 16-line table (their first
    /// halves are multiples of 16): one cluster, the worst case of probing.
    fn clustered(n: u64) -> Vec<KeyId> {
        (1..=n).map(|i| KeyId(i * 16, i)).collect()
    }

    #[test]
    fn removing_from_a_cluster_keeps_every_other_key_found() {
        for k in [1, 2] {
            let ids = clustered(12);
            for gone in 0..ids.len() {
                let mut t = Table::<u64, 2>::default();
                let mut t1 = Table::<u64, 1>::default();
                for (i, &id) in ids.iter().enumerate() {
                    t.insert(id, i as u64);
                    t1.insert(id, i as u64);
                }
                let keep = |e: &u64| *e != gone as u64;
                if k == 2 {
                    t.retain(keep)
                } else {
                    t1.retain(keep)
                }
                for (i, &id) in ids.iter().enumerate() {
                    let found = if k == 2 {
                        t.get_mut(id)
                    } else {
                        t1.get_mut(id)
                    };
                    let want = (i != gone).then_some(i as u64);
                    assert_eq!(found.copied(), want, "K {k}: removed {gone}, looked up {i}");
                }
                // The removed key goes back in, once.
                let (len, again) = if k == 2 {
                    (t.len(), t.insert(ids[gone], 0))
                } else {
                    (t1.len(), t1.insert(ids[gone], 0))
                };
                assert_eq!((len, again), (ids.len() - 1, true));
            }
        }
    }

    #[test]
    fn tombstones_are_freed_or_rebuilt_away_so_churn_keeps_the_size() {
        let mut t = Table::<u64, 2>::default();
        let ids = clustered(20);
        for (i, &id) in ids.iter().enumerate() {
            t.insert(id, i as u64);
        }
        let slots = t.num_buckets();
        // Remove and add keys of the same cluster, over and over: the
        // table neither grows nor loses a key.
        for round in 0..200 {
            let gone = round % 20;
            assert_eq!(t.reclaim(0, slots, |e| *e != gone as u64), slots);
            assert_eq!((t.len(), t.get_mut(ids[gone])), (19, None));
            assert!(t.insert(ids[gone], gone as u64));
            assert_eq!(t.len(), 20);
            assert_eq!(t.num_buckets(), slots, "round {round}");
            assert!(t.used <= most(slots));
        }
        for &id in &ids {
            assert!(t.get_mut(id).is_some());
        }
        // Emptied, it gives its memory back.
        t.retain(|_| false);
        assert_eq!((t.len(), t.used), (0, 0));
    }

    #[test]
    fn a_key_id_never_looks_like_a_free_slot_or_a_tombstone() {
        let s = Secret::new();
        assert!((0..10_000u32).all(|i| s.id(&i.to_le_bytes()).holds_a_key()));
        assert!(!KeyId(EMPTY, 5).holds_a_key() && !KeyId(REMOVED, 5).holds_a_key());
    }
}
