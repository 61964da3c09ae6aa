//! The store's bound, and how it reclaims expired entries: [`Shards`].
//!
//! The keys are spread over shards of at most [`SHARD_KEYS`] keys each (of
//! more only in a store for over 200 million keys: [`MAX_SHARDS`]), by
//! their keyed hash (so a client cannot aim at one shard). A shard's two
//! tables (see [`ids`](super::ids)) only ever grow, shrink, rebuild or get
//! swept one shard at a time, so no request pays for the whole map: at most
//! a few thousand slots of work, and usually none.
//!
//! Expired entries are reclaimed two ways:
//! - a cursor walks every table's buckets, [`RECLAIM_BUCKETS`] of them each
//!   time a decision is about to take room for a new key (stored or
//!   refused; once for a decision of several limits), and removes what has
//!   expired. A pass over all buckets takes about twice as many new keys as
//!   the tables hold, so ended windows are reused rather than grown past.
//!   A step that finds another thread moving the cursor is left to it;
//! - a shard that is full sweeps itself whole before it refuses a key, if
//!   an entry of its may have expired, at most every [`SWEEP_GAP_MS`].
//!
//! A full shard refuses new keys; its keys already held are decided as
//! ever. See [`MemoryStore`](super::MemoryStore) for why.
//!
//! Each shard has its own lock, on cache lines of its own, so that
//! decisions on different shards write no line in common ([`Shards`]).

use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

use crossbeam_utils::CachePadded;
use smallvec::SmallVec;

use super::{
    algorithms::{Now, Packed},
    ids::{KeyId, Table},
};

/// The most keys a shard holds: 3/4 of the 4,096-bucket table that holds
/// them all (32 or 64 bytes a bucket), so the table is never doubled for
/// the last few and has room for tombstones between rebuilds.
const SHARD_KEYS: usize = 3072;

/// The most shards: a store for more than `MAX_SHARDS × SHARD_KEYS` keys
/// (about 201 million) has shards of more than [`SHARD_KEYS`] each, so
/// what it allocates up front (a padded lock and two empty tables a shard,
/// 128 bytes on x86-64) stays under 8 MB whatever `max_keys` says, where a
/// shard for every 3,072 of `usize::MAX` keys would not fit in any memory.
const MAX_SHARDS: usize = 1 << 16;

/// Buckets the cursor looks at for each new key.
pub(super) const RECLAIM_BUCKETS: usize = 32;

/// The least time between two whole-shard sweeps of one full shard (and
/// between two sweeps of a full lease table: [`lease`](super::lease)).
pub(super) const SWEEP_GAP_MS: u64 = 250;

/// The least time between two warnings that the store is full.
const WARN_GAP_MS: u64 = 10_000;

/// One shard's keys, by algorithm size.
#[derive(Debug, Default)]
pub(super) struct Shard {
    /// Fixed-window and GCRA keys: 32-byte slots, two to a cache line.
    pub(super) short: Table<Packed<2>, 2>,
    /// Sliding-window keys: 48-byte slots, one to a cache line.
    pub(super) long: Table<Packed<4>, 1>,
    /// No entry held expires before this (ms): exact after a sweep, lowered
    /// by every new key and by every entry whose expiry moves sooner in
    /// place (an over-long window healed, a reset, a refund back to
    /// nothing). So a full shard holding an entry that has ended sweeps it
    /// out, at most [`SWEEP_GAP_MS`] later, rather than refusing new keys
    /// until its soonest live window ends.
    soonest_ms: u64,
    /// No whole-shard sweep before this (ms).
    sweep_after_ms: u64,
}

impl Shard {
    fn len(&self) -> usize {
        self.short.len() + self.long.len()
    }

    /// An entry now expires at `expires_ms`: a new key, or a held one
    /// whose expiry moved (see `soonest_ms`).
    pub(super) fn expires_at(&mut self, expires_ms: u64) {
        if expires_ms < self.soonest_ms {
            self.soonest_ms = expires_ms;
        }
    }

    /// Removes every expired entry and learns the soonest expiry left.
    fn sweep(&mut self, now: Now) {
        let mut soonest = u64::MAX;
        let mut live = |expires_ms: u64| {
            let keep = expires_ms > now.ms;
            if keep {
                soonest = soonest.min(expires_ms);
            }
            keep
        };
        self.short.retain(|e| live(e.expires_ms()));
        self.long.retain(|e| live(e.expires_ms()));
        self.soonest_ms = soonest;
        self.sweep_after_ms = now.ms + SWEEP_GAP_MS;
    }
}

/// A new key fits in its shard: [`Shards::make_room`]'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Room {
    /// As the shard was.
    Fits,
    /// Once its expired entries were swept out: entries that a caller
    /// found in place before (expired, and so needing no room then) may be
    /// gone.
    Swept,
}

/// Where the reclaiming cursor is.
#[derive(Debug, Default)]
struct Cursor {
    shard: usize,
    long: bool,
    bucket: usize,
}

/// Keys refused since the last warning, and when the next may be given:
/// the counters' (in [`Shards`]) or the lease table's
/// ([`lease`](super::lease)).
#[derive(Debug, Default)]
pub(super) struct Refusals {
    count: u64,
    warn_after_ms: u64,
}

impl Refusals {
    /// Counts a new key refused by a full table
    /// (`ratelimit_store_full_total`). `Some(keys refused since the last
    /// warning)` when a warning is due: at most every [`WARN_GAP_MS`].
    pub(super) fn refused(&mut self, now_ms: u64) -> Option<u64> {
        crate::metrics::store_full();
        self.count += 1;
        if now_ms < self.warn_after_ms {
            return None;
        }
        let count = std::mem::take(&mut self.count);
        self.warn_after_ms = now_ms + WARN_GAP_MS;
        Some(count)
    }
}

/// Every shard, each behind its own lock on its own cache lines; the bound;
/// the cursor; and the full store's count.
///
/// A decision locks only its keys' shards, so two workers deciding
/// different clients' keys share no line that either writes: with one lock
/// for the whole map, its line moved between the cores at every request
/// that the other core had served last. No two threads can wait for each
/// other: shards are locked in ascending order (several only for a decision
/// of several limits); the cursor's lock is only tried, by a thread that
/// holds no shard; and nothing is locked under the refusals' count.
#[derive(Debug)]
pub(super) struct Shards {
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    max_keys: usize,
    cursor: Mutex<Cursor>,
    refusals: Mutex<Refusals>,
}

/// A lock, even if a panic poisoned it: a shard's entries are each written
/// whole, so a panic while one is held leaves none half-written.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shards {
    /// Room for `max_keys` keys (at least 1), in shards of at most
    /// [`SHARD_KEYS`] (but for more than [`MAX_SHARDS`] of them); their
    /// capacities add up to `max_keys` exactly.
    pub(super) fn new(max_keys: usize) -> Self {
        let max_keys = max_keys.max(1);
        let n = max_keys.div_ceil(SHARD_KEYS).min(MAX_SHARDS);
        Self {
            shards: (0..n).map(|_| CachePadded::default()).collect(),
            max_keys,
            cursor: Mutex::default(),
            refusals: Mutex::default(),
        }
    }

    pub(super) fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// The shard of `id`.
    pub(super) fn index(&self, id: KeyId) -> usize {
        id.shard(self.shards.len())
    }

    /// Shard `i`, locked. A caller that locks several takes them in
    /// ascending order ([`lock_all`](Self::lock_all)).
    pub(super) fn lock(&self, i: usize) -> MutexGuard<'_, Shard> {
        lock(&self.shards[i])
    }

    /// The shards `indices` names (ascending, without repeats), locked in
    /// that order.
    pub(super) fn lock_all(&self, indices: &[usize]) -> SmallVec<[MutexGuard<'_, Shard>; 4]> {
        debug_assert!(indices.windows(2).all(|w| w[0] < w[1]));
        indices.iter().map(|&i| self.lock(i)).collect()
    }

    /// How many keys shard `i` may hold.
    fn capacity(&self, i: usize) -> usize {
        let n = self.shards.len();
        self.max_keys / n + usize::from(i < self.max_keys % n)
    }

    /// Keys held, live or not yet reclaimed (each shard's count as it was
    /// when its lock was taken).
    pub(super) fn len(&self) -> usize {
        (0..self.shards.len()).map(|i| self.lock(i).len()).sum()
    }

    /// Buckets of every table, for tests of their growth.
    #[cfg(test)]
    pub(super) fn buckets(&self) -> usize {
        let n = 0..self.shards.len();
        n.map(|i| {
            let s = self.lock(i);
            s.short.num_buckets() + s.long.num_buckets()
        })
        .sum()
    }

    /// Before a new key goes into `shard`, shard `i`, locked by the caller
    /// (into its `long` table or its short one, where this decision already
    /// placed `pending` new keys), and after the caller moved the cursor
    /// ([`reclaim_step`](Self::reclaim_step)): says whether it fits, and
    /// whether the shard was swept for it; if not, in how many milliseconds
    /// the shard may have room. A shard that is full, or whose table would
    /// grow, is first swept if it may hold expired entries, so that tables
    /// grow for live keys only. A key that does not fit is the caller's to
    /// count ([`refused`](Self::refused)): a peek, which would store
    /// nothing, is refused no spend.
    pub(super) fn make_room(
        &self,
        shard: &mut Shard,
        i: usize,
        long: bool,
        pending: usize,
        now: Now,
    ) -> Result<Room, u64> {
        let cap = self.capacity(i);
        let fits = |s: &Shard| s.len() + pending < cap;
        let grows = |s: &Shard| {
            if long {
                s.long.is_full()
            } else {
                s.short.is_full()
            }
        };
        if fits(shard) && !grows(shard) {
            return Ok(Room::Fits);
        }
        let mut room = Room::Fits;
        if now.ms >= shard.soonest_ms.max(shard.sweep_after_ms) {
            shard.sweep(now);
            room = Room::Swept;
        }
        if fits(shard) {
            return Ok(room);
        }
        // The soonest expiry, or the next sweep if it comes later: only a
        // sweep is sure to free the soonest entry's room (the cursor may
        // free room sooner, but may be far away), so a key told to come
        // back at the soonest expiry alone could be refused again then.
        let free_at = match shard.soonest_ms {
            u64::MAX => now.ms + SWEEP_GAP_MS,
            soonest => soonest.max(shard.sweep_after_ms),
        };
        Err(free_at.saturating_sub(now.ms).max(1))
    }

    /// Counts a new key refused a spend, and warns at most every
    /// [`WARN_GAP_MS`].
    pub(super) fn refused(&self, now: Now) {
        let Some(refused) = lock(&self.refusals).refused(now.ms) else {
            return;
        };
        tracing::warn!(
            max_keys = self.max_keys,
            refused,
            "in-memory rate-limit store full: new keys are denied until held windows end \
             (keys already held are decided as usual); raise its max_keys \
             (RATE_LIMIT_MEMORY_MAX_KEYS in the examples) if these are real clients"
        );
    }

    /// Moves the cursor over [`RECLAIM_BUCKETS`] buckets, removing expired
    /// entries; gives a table memory back when the cursor leaves it sparse.
    /// Called before a new key takes room, by a decision that holds no
    /// shard's lock; it locks the cursor's shards one at a time. If another
    /// thread is moving the cursor, this step is left to it: reclaiming is
    /// gradual either way, and a full shard still sweeps itself before it
    /// refuses. (The cursor's lock is only tried, never awaited, so no
    /// thread waits for it while holding a shard.)
    pub(super) fn reclaim_step(&self, now: Now) {
        let mut c = match self.cursor.try_lock() {
            Ok(c) => c,
            Err(TryLockError::Poisoned(c)) => c.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        let live = |e: &Packed<2>| e.expires_ms() > now.ms;
        let live_long = |e: &Packed<4>| e.expires_ms() > now.ms;
        let n = self.shards.len();
        let mut budget = RECLAIM_BUCKETS;
        // Empty tables cost a step each: a bounded number of them.
        for _ in 0..8 {
            let mut shard = self.lock(c.shard);
            let seen = if c.long {
                shard.long.reclaim(c.bucket, budget, live_long)
            } else {
                shard.short.reclaim(c.bucket, budget, live)
            };
            c.bucket += seen;
            budget -= seen;
            if budget == 0 {
                return;
            }
            // Past this table's end.
            if c.long {
                shard.long.shrink_if_sparse();
                c.shard = (c.shard + 1) % n;
            } else {
                shard.short.shrink_if_sparse();
            }
            c.long = !c.long;
            c.bucket = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_capacities_add_up_to_max_keys() {
        for max in [1, 2, 100, 3072, 3073, 1_000_000, 1_000_003] {
            let s = Shards::new(max);
            let total: usize = (0..s.shards.len()).map(|i| s.capacity(i)).sum();
            assert_eq!(total, max);
            assert!((0..s.shards.len()).all(|i| s.capacity(i) <= SHARD_KEYS));
        }
        assert_eq!(Shards::new(0).max_keys(), 1);
    }

    /// Past `MAX_SHARDS × SHARD_KEYS` keys, shards hold more each, rather
    /// than there being more shards: what is allocated up front stays
    /// bounded (a shard for every 3,072 of `usize::MAX` keys would be about
    /// 770 PB).
    #[test]
    fn a_huge_bound_takes_at_most_max_shards() {
        if cfg!(target_arch = "x86_64") {
            assert!(std::mem::size_of::<CachePadded<Mutex<Shard>>>() <= 128);
        }
        let big = MAX_SHARDS * SHARD_KEYS;
        for (max, shards) in [
            (big, MAX_SHARDS),
            (big + 1, MAX_SHARDS),
            (usize::MAX, MAX_SHARDS),
        ] {
            let s = Shards::new(max);
            assert_eq!((s.shards.len(), s.max_keys()), (shards, max));
            let total: u128 = (0..shards).map(|i| s.capacity(i) as u128).sum();
            assert_eq!(total, max as u128);
        }
        assert_eq!(Shards::new(big - 1).shards.len(), MAX_SHARDS);
        assert_eq!(Shards::new(big - SHARD_KEYS).shards.len(), MAX_SHARDS - 1);
    }
}
