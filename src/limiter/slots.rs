//! [`Slots`]: the bounded map of a limiter's reservations, by store key.
//!
//! A hot key's requests all come here, from every worker thread, so a hit
//! takes one lock and writes nothing else that is shared: no reference
//! count, no cache's own lock. Each key's entry holds its value inline, a
//! second-chance count of its hits since the last pass (saturating at
//! 255), and the key's single flight (a Tokio mutex behind an `Arc`,
//! cloned only by the requests that call the store).
//!
//! The map holds at most its capacity ([`RESERVED_KEYS`] unless
//! [`LimiterBuilder::local_reservation_keys`](super::LimiterBuilder::local_reservation_keys)
//! says otherwise), in shards of at most [`SHARD_KEYS`] keys (at least
//! [`SHARDS`] of them) picked by a hash seeded at random per map
//! (foldhash's quality variant, the hash quick_cache uses), so a client
//! cannot aim at one shard, and a shard holds so few keys that even a
//! chosen collision costs a bounded scan. A shard that is full when a key
//! is new drops, in one pass, every entry neither hit since the last pass,
//! nor in a flight, nor holding live units, and if that leaves it above 7/8
//! full, idle entries until it is not: those not hit since the last pass
//! first, then those hit that hold no units, then any, the fewest hit
//! first in each. A pass frees at least an eighth of the shard, so it
//! costs a few slots per new key, and a key that is hit between passes (a
//! hot key) is kept unless more than 7/8 of its shard was hit since the
//! last pass too, at least as often. Dropping an entry only drops its
//! unspent units: an under-admission, never an over-admission. Every entry
//! that holds no units and was not hit goes before any that holds units,
//! so a flood of new keys (which hold none: see below) cannot make a
//! tenant's reservation go to waste between its requests; nor can a flood
//! of keys each hit twice, which reserve and so hold units, drop a key hit
//! more often since the last pass, even on the shard's first pass, when
//! every key in it was hit (they once did, and a hot key lost its units
//! again and again).
//!
//! Once a pass has dropped a key, the map is *crowded*: more keys are in
//! use than it holds. From then on a key it does not hold is only noted
//! ([`Slots::with_or_note`]), and the limiter checks that request as it
//! would without reservations; the key reserves from its next request, if
//! that comes while it is still held. So a stream of cold keys does not
//! cycle through the map reserving units it never spends, while a hot key,
//! hit between passes, keeps its place.

use std::{
    hash::BuildHasher,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
};

use foldhash::quality::RandomState;
use hashbrown::HashTable;
use tokio::time::Instant;

/// How many keys hold a live reservation at most, per limiter, by default.
pub(crate) const RESERVED_KEYS: usize = 10_000;

/// The most keys a map may be asked to hold: about 3 GB at 300 bytes a key.
pub(crate) const MAX_RESERVED_KEYS: usize = 10_000_000;

/// Shards of the map at least.
const SHARDS: usize = 8;

/// Keys per shard at most, unless the map holds more than
/// [`MAX_SHARDS`] shards of them: a full shard's pass visits that many
/// entries under its lock.
const SHARD_KEYS: usize = RESERVED_KEYS / SHARDS;

/// Shards of the map at most.
const MAX_SHARDS: usize = MAX_RESERVED_KEYS / SHARD_KEYS;

/// A key's single flight: held by the one request calling the store for it.
pub(super) type Flight = Arc<tokio::sync::Mutex<()>>;

struct Entry<V> {
    key: Box<[u8]>,
    hash: u64,
    value: V,
    flight: Flight,
    /// Hits since the last pass (second chance; saturating): a pass that
    /// must drop keys hit since the last one drops the fewest hit first.
    hits: u8,
}

impl<V> Entry<V> {
    /// A request holds its flight: it may write back soon.
    fn busy(&self) -> bool {
        Arc::strong_count(&self.flight) > 1
    }
}

/// What a pass asks of a value: whether it holds units still to be spent
/// at `now`, which it keeps over entries that hold none.
pub(super) trait Holds {
    fn holds(&self, now: Instant) -> bool;
}

/// Values of type `V` by key, bounded; see the module's docs.
pub(super) struct Slots<V> {
    shards: Box<[Mutex<HashTable<Entry<V>>>]>,
    hasher: RandomState,
    /// Entries per shard at most.
    cap: usize,
    /// Set by the first pass that drops a key: see [`crowded`](Self::crowded).
    crowded: AtomicBool,
}

impl<V: Default + Holds> Slots<V> {
    /// A map of at most about `keys` keys (1 to [`MAX_RESERVED_KEYS`]; the
    /// builder checks): `keys` rounded up to whole shards.
    pub(super) fn with_capacity(keys: usize) -> Self {
        let shards = keys.div_ceil(SHARD_KEYS).clamp(SHARDS, MAX_SHARDS);
        Self {
            shards: (0..shards).map(|_| Mutex::default()).collect(),
            hasher: RandomState::default(),
            cap: keys.div_ceil(shards).max(1),
            crowded: AtomicBool::new(false),
        }
    }

    fn shard(&self, key: &[u8]) -> (MutexGuard<'_, HashTable<Entry<V>>>, u64) {
        let hash = self.hasher.hash_one(key);
        let i = ((u128::from(hash) * self.shards.len() as u128) >> 64) as usize;
        // Every write below leaves an entry whole: a poisoned lock (a panic
        // elsewhere) leaves the map consistent.
        let shard = self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        (shard, hash)
    }

    /// `f` on `key`'s value, if the key is held; counts as a hit.
    pub(super) fn with<R>(&self, key: &[u8], f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let (mut shard, hash) = self.shard(key);
        hit(&mut shard, key, hash).map(|entry| f(&mut entry.value))
    }

    /// `f` on `key`'s value if the key is held (a hit), as [`with`](Self::with).
    /// If not, `Err(crowded)`: whether the map is [crowded](Self::crowded),
    /// in which case the key is noted now (room made, the default value),
    /// so that its next request finds it if that comes before a pass drops
    /// it.
    pub(super) fn with_or_note<R>(
        &self,
        key: &[u8],
        f: impl FnOnce(&mut V) -> R,
    ) -> Result<R, bool> {
        let (mut shard, hash) = self.shard(key);
        if let Some(entry) = hit(&mut shard, key, hash) {
            return Ok(f(&mut entry.value));
        }
        if !self.crowded() {
            return Err(false);
        }
        self.make(&mut shard, key, hash);
        Err(true)
    }

    /// Whether a pass has ever dropped a key that was not hit again (the
    /// map has had more keys than it holds).
    pub(super) fn crowded(&self) -> bool {
        self.crowded.load(Ordering::Relaxed)
    }

    /// `f` on `key`'s value if it still belongs to `flight` (it was not
    /// dropped, or dropped and made again, since the flight was taken).
    pub(super) fn with_flight<R>(
        &self,
        key: &[u8],
        flight: &Flight,
        f: impl FnOnce(&mut V) -> R,
    ) -> Option<R> {
        let (mut shard, hash) = self.shard(key);
        let entry = shard.find_mut(hash, |e| *e.key == *key)?;
        Arc::ptr_eq(&entry.flight, flight).then(|| f(&mut entry.value))
    }

    /// `f` on `key`'s value, made (with room for it) if the key is new; and
    /// the key's flight.
    pub(super) fn entry<R>(&self, key: &[u8], f: impl FnOnce(&mut V) -> R) -> (Flight, R) {
        let (mut shard, hash) = self.shard(key);
        let entry = match hit(&mut shard, key, hash) {
            Some(entry) => entry,
            None => self.make(&mut shard, key, hash),
        };
        (entry.flight.clone(), f(&mut entry.value))
    }

    /// A new entry for `key` (not held) in its `shard`, with the default
    /// value, after a pass if the shard is full.
    fn make<'s>(
        &self,
        shard: &'s mut HashTable<Entry<V>>,
        key: &[u8],
        hash: u64,
    ) -> &'s mut Entry<V> {
        if shard.len() >= self.cap {
            let held = shard.len();
            make_room(shard, self.cap);
            if shard.len() < held {
                self.crowded.store(true, Ordering::Relaxed);
            }
        }
        let entry = Entry {
            key: key.into(),
            hash,
            value: V::default(),
            flight: Flight::default(),
            hits: 0,
        };
        shard.insert_unique(hash, entry, |e| e.hash).into_mut()
    }

    /// Drops `key`'s entry.
    pub(super) fn remove(&self, key: &[u8]) {
        let (mut shard, hash) = self.shard(key);
        if let Ok(entry) = shard.find_entry(hash, |e| *e.key == *key) {
            entry.remove();
        }
    }

    /// Keys held.
    pub(super) fn len(&self) -> usize {
        let len =
            |s: &Mutex<HashTable<Entry<V>>>| s.lock().unwrap_or_else(PoisonError::into_inner).len();
        self.shards.iter().map(len).sum()
    }
}

/// `key`'s entry in its `shard`, if held, marked as hit.
fn hit<'s, V>(
    shard: &'s mut HashTable<Entry<V>>,
    key: &[u8],
    hash: u64,
) -> Option<&'s mut Entry<V>> {
    let entry = shard.find_mut(hash, |e| *e.key == *key)?;
    entry.hits = entry.hits.saturating_add(1);
    Some(entry)
}

/// One pass over a full shard: see the module's docs. Entries in a flight
/// are kept, so a shard may stay full while `cap` flights run in it; the
/// new key is held all the same (the map then exceeds its bound by the
/// flights running, which end within the store's timeout).
fn make_room<V: Holds>(shard: &mut HashTable<Entry<V>>, cap: usize) {
    let now = Instant::now();
    shard.retain(|e| e.busy() || e.hits > 0 || e.value.holds(now));
    let keep = cap - cap / 8;
    let mut excess = shard.len().saturating_sub(keep);
    // Still above 7/8: idle entries not hit since the last pass (they hold
    // units, or the retain above dropped them), then those hit that hold
    // nothing, then any idle ones, the fewest hit first in each. Keys hit
    // since the last pass go last: keys that hold units could once fill a
    // shard (a flood of keys hit twice, each reserving), and a pass dropped
    // a hot key among them; and when the whole shard was hit (its first
    // pass, in such a flood), a key hit between every two new ones
    // outnumbers their hits.
    for (hit_too, units_too) in [(false, true), (true, false), (true, true)] {
        if excess == 0 {
            break;
        }
        let idle = |e: &Entry<V>| {
            !e.busy() && (hit_too || e.hits == 0) && (units_too || !e.value.holds(now))
        };
        excess -= drop_fewest_hit(shard, excess, idle);
    }
    for e in shard.iter_mut() {
        e.hits = 0;
    }
}

/// Drops up to `n` entries for which `idle` holds, those with the fewest
/// hits first (in the table's order among equals); returns how many.
fn drop_fewest_hit<V>(
    shard: &mut HashTable<Entry<V>>,
    n: usize,
    idle: impl Fn(&Entry<V>) -> bool,
) -> usize {
    let mut by_hits = [0usize; 256];
    for e in shard.iter().filter(|e| idle(e)) {
        by_hits[usize::from(e.hits)] += 1;
    }
    // Every entry with fewer hits than `cut` goes (`below` of them, fewer
    // than `n`), and `n - below` of those with `cut` hits.
    let (mut cut, mut below) = (0, 0);
    while cut < 255 && below + by_hits[cut] < n {
        below += by_hits[cut];
        cut += 1;
    }
    let mut at_cut = n - below;
    let mut dropped = 0;
    shard.retain(|e| {
        let hits = usize::from(e.hits);
        let drop = hits <= cut && idle(e) && (hits < cut || at_cut > 0);
        if drop && hits == cut {
            at_cut -= 1;
        }
        dropped += usize::from(drop);
        !drop
    });
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test value holds units when it is not 0.
    impl Holds for u64 {
        fn holds(&self, _: Instant) -> bool {
            *self > 0
        }
    }

    /// A key holding units, not hit between passes (a tenant between its
    /// requests), outlasts a flood of new keys, which hold none; once the
    /// shard holds nothing but units, the bound still holds.
    #[test]
    fn a_full_shard_drops_keys_holding_units_last() {
        let slots: Slots<u64> = Slots::with_capacity(SHARDS * 16);
        slots.entry(b"tenant", |v| *v = 7);
        for i in 0..10_000u32 {
            slots.entry(format!("k{i}").as_bytes(), |_| ());
        }
        assert_eq!(slots.with(b"tenant", |v| *v), Some(7));
        for i in 0..10_000u32 {
            slots.entry(format!("u{i}").as_bytes(), |v| *v = 1);
        }
        assert!(slots.len() <= SHARDS * 16, "{} keys held", slots.len());
    }

    /// A flood of new keys that each hold units and are hit again (a
    /// client's keys hit twice, each reserving) fills a shard with entries a
    /// pass keeps for their units: the hot key, hit between every two new
    /// keys, was dropped among them (after 116 keys, in a review's run).
    /// Then, on a shard's first pass, where every key was hit, it went one
    /// time in five (the hash is seeded per map, so 32 maps are tried).
    #[test]
    fn a_flood_of_keys_holding_units_drops_no_key_hit_since_the_last_pass() {
        for map in 0..32 {
            let slots: Slots<u64> = Slots::with_capacity(SHARDS * 16);
            slots.entry(b"tenant", |v| *v = 7);
            for i in 0..2_000u32 {
                let key = format!("u{i}");
                slots.entry(key.as_bytes(), |v| *v = 1);
                slots.with(key.as_bytes(), |_| ());
                let tenant = slots.with(b"tenant", |v| *v);
                assert_eq!(tenant, Some(7), "map {map}, after {i} keys");
            }
            assert!(slots.len() <= SHARDS * 16, "{} keys held", slots.len());
        }
    }

    /// When more keys must go than were not hit, the fewest hit go first.
    #[test]
    fn a_pass_drops_the_fewest_hit_first() {
        let hasher = RandomState::default();
        let mut shard = HashTable::new();
        for (i, hits) in [5u8, 1, 255, 0, 3, 1, 2].into_iter().enumerate() {
            let key = [i as u8];
            let hash = hasher.hash_one(key);
            let entry = Entry {
                key: key.into(),
                hash,
                value: 1u64,
                flight: Flight::default(),
                hits,
            };
            shard.insert_unique(hash, entry, |e| e.hash);
        }
        assert_eq!(drop_fewest_hit(&mut shard, 4, |_| true), 4);
        let mut left: Vec<u8> = shard.iter().map(|e| e.hits).collect();
        left.sort_unstable();
        assert_eq!(left, [3, 5, 255]);
        // More asked than there are: every one goes, and the count says so.
        assert_eq!(drop_fewest_hit(&mut shard, 9, |e| e.hits < 100), 2);
        assert_eq!(shard.len(), 1);
    }

    #[test]
    fn a_full_shard_keeps_keys_hit_since_its_last_pass_and_in_flights() {
        let slots: Slots<u64> = Slots::with_capacity(SHARDS * 16);
        let (_held, ()) = slots.entry(b"in-flight", |_| ());
        slots.entry(b"hot", |v| *v = 7);
        for i in 0..10_000u32 {
            slots.entry(format!("k{i}").as_bytes(), |_| ());
            // A hit between passes.
            assert_eq!(slots.with(b"hot", |v| *v), Some(7), "after {i} new keys");
        }
        assert!(slots.with(b"in-flight", |_| ()).is_some());
        assert!(slots.len() <= SHARDS * 16, "{} keys held", slots.len());
        assert!(slots.with(b"k0", |_| ()).is_none(), "a cold key is dropped");
    }

    #[test]
    fn a_crowded_map_notes_a_new_key_and_finds_it_on_its_next_hit() {
        let slots: Slots<u64> = Slots::with_capacity(SHARDS * 4);
        assert_eq!(slots.with_or_note(b"k", |_| ()), Err(false));
        assert!(slots.with(b"k", |_| ()).is_none(), "not noted: not crowded");
        slots.entry(b"k0", |_| ());
        assert!(!slots.crowded(), "nothing dropped yet");
        for i in 0..SHARDS * 8 {
            slots.entry(format!("j{i}").as_bytes(), |_| ());
        }
        assert!(slots.crowded());
        assert_eq!(slots.with_or_note(b"new", |v| *v), Err(true));
        assert_eq!(slots.with_or_note(b"new", |v| *v), Ok(0));
        assert!(slots.len() <= SHARDS * 4, "{} keys held", slots.len());
    }

    #[test]
    fn keys_in_flights_are_kept_past_the_bound_and_only_they() {
        let slots: Slots<u64> = Slots::with_capacity(SHARDS * 2);
        let held: Vec<_> = (0..40)
            .map(|i| slots.entry(format!("f{i}").as_bytes(), |_| ()).0)
            .collect();
        for i in 0..1_000u32 {
            slots.entry(format!("k{i}").as_bytes(), |_| ());
        }
        for i in 0..40 {
            let key = format!("f{i}");
            assert!(
                slots.with(key.as_bytes(), |_| ()).is_some(),
                "{key} dropped"
            );
        }
        // Each shard: its flights, and at most its bound of others.
        assert!(slots.len() <= 40 + SHARDS * 2, "{} keys held", slots.len());
        drop(held);
        for i in 0..1_000u32 {
            slots.entry(format!("j{i}").as_bytes(), |_| ());
        }
        assert!(slots.len() <= SHARDS * 2, "{} keys held", slots.len());
    }

    #[test]
    fn a_flights_write_back_misses_a_key_dropped_and_made_again() {
        let slots: Slots<u64> = Slots::with_capacity(RESERVED_KEYS);
        let (flight, ()) = slots.entry(b"k", |v| *v = 1);
        assert_eq!(slots.with_flight(b"k", &flight, |v| *v), Some(1));
        slots.remove(b"k");
        assert_eq!(slots.with_flight(b"k", &flight, |v| *v), None);
        slots.entry(b"k", |v| *v = 2);
        assert_eq!(slots.with_flight(b"k", &flight, |v| *v), None);
        assert_eq!(slots.with(b"k", |v| *v), Some(2));
    }

    #[test]
    fn a_larger_map_holds_more_keys_in_shards_of_a_bounded_size() {
        // Well below capacity, nothing is dropped: 30,000 keys in a map of
        // 40,000 (the default of 10,000 would hold about a third of them).
        let slots: Slots<u64> = Slots::with_capacity(40_000);
        assert_eq!(slots.shards.len(), 40_000 / SHARD_KEYS);
        for i in 0..30_000u32 {
            slots.entry(format!("k{i}").as_bytes(), |_| ());
        }
        assert_eq!(slots.len(), 30_000);
        assert!(!slots.crowded());
        // The default map: eight shards of 1,250 keys.
        let small: Slots<u64> = Slots::with_capacity(RESERVED_KEYS);
        assert_eq!((small.shards.len(), small.cap), (SHARDS, SHARD_KEYS));
        // A tiny map keeps its eight shards, one key each; the largest, at
        // most MAX_SHARDS shards.
        let tiny: Slots<u64> = Slots::with_capacity(1);
        assert_eq!((tiny.shards.len(), tiny.cap), (SHARDS, 1));
        let most: Slots<u64> = Slots::with_capacity(MAX_RESERVED_KEYS);
        assert_eq!((most.shards.len(), most.cap), (MAX_SHARDS, SHARD_KEYS));
    }
}
