//! [`MemoryStore`]: counters in this process, with the Redis store's semantics.

use std::sync::{Arc, MutexGuard};

use smallvec::SmallVec;

use tokio::time::Instant;

pub(crate) use self::admin::Credit;
use self::{
    algorithms::{Checked, Entry, Now, Packed},
    ids::{Secret, Table},
    shards::{Room, Shard, Shards},
};
use super::{LimitCheck, LimitState};
use crate::{Algorithm, Quota, decision::Ends};

pub(crate) use self::ids::{KeyHasher, KeyId};

mod admin;
mod algorithms;
mod ids;
mod lease;
mod shards;

/// Counters in process memory: the default when no Redis is configured.
///
/// It decides exactly like the Redis script, for every
/// [`Algorithm`] (same formulas, windows, expiries and cost
/// rules, all or nothing across limits, never over-admits under concurrency),
/// with time from its own monotonic clock. But each process counts alone,
/// so replicas do not share a limit.
///
/// # Memory: at most `max_keys` keys
///
/// A key is held as its 128-bit SipHash under a secret of the store's, not
/// as its bytes, so it costs the same whatever its length: a 32-byte slot
/// for a fixed window or GCRA, 64 for a sliding window, in tables kept at
/// most 3/4 full: about 43 and 86 bytes a key when the store is full.
/// The store holds at most [`max_keys`](Self::max_keys) keys,
/// [`DEFAULT_MAX_KEYS`](Self::DEFAULT_MAX_KEYS) (1,000,000: about 45 MB of
/// fixed windows, 90 MB of sliding ones) unless set with
/// [`with_max_keys`](Self::with_max_keys). Expired windows are reclaimed a
/// little at a time, as new keys arrive, and their memory is reused; no
/// request pays for sweeping or resizing the whole map, only one shard of a
/// few thousand keys at most.
///
/// # When it is full
///
/// A key it already holds is decided as usual, exactly. A **new** key that
/// arrives when its share of the store is full, after expired entries there
/// are reclaimed, is **denied**: an ordinary denial (a 429 from the layers,
/// with `remaining` 0), whose [`retry_after`](crate::Decision::retry_after)
/// is the time until the soonest entry of that share expires, or until
/// the share may next be swept (sweeps are at least 250 ms apart), if that
/// is later: the earliest the room may come free. It is a lower bound, not
/// a promise: an entry spent again since its expiry was last learned (a
/// GCRA or sliding-window key, or a key spent again after its window ended
/// or was reset) may end later, and a key that comes back then is refused
/// again, with the time learned by that sweep. Never an error. It is counted
/// (`ratelimit_store_full_total`, with the `metrics` feature) and logged at
/// `warn`, at most every 10 seconds. A [`peek`](crate::Limiter::peek) of
/// such a key answers as its check would (denied, with that
/// `retry_after`), and is neither counted nor logged: it spends nothing, so
/// nothing was refused. Refusing newcomers is deliberate: the
/// alternative, evicting a held counter, would reset a live client's limit,
/// so a flood of made-up keys could lift the limit of the clients it evicts.
/// Refusing lifts no limit; at worst, new clients wait while a flood holds
/// the store, so size `max_keys` above the clients live in one window. The
/// keys are spread over shards of about 3,000 by their keyed hash, each with
/// its share of `max_keys`, so under a flood the first refusals come a
/// little before `max_keys` (at about 94% of a million). Each shard has a
/// lock of its own: threads deciding keys of different shards do not wait
/// for each other (but for the few buckets a new key reclaims, which may
/// be in any shard).
///
/// # Concurrency leases
///
/// As a [`LeaseStore`](crate::store::LeaseStore) (the default store of a
/// [`ConcurrencyLimiter`](crate::concurrency::ConcurrencyLimiter)), it keeps
/// its leases in a table of their own, bounded the same way: at most
/// `max_keys` keys hold leases (besides the counters' `max_keys`), each
/// with at most its limiter's limit of leases, and a few hundred bytes a
/// key with one lease (its name and its owners' tokens are held as text).
/// When that table is full, an acquire on a **new** key, once expired
/// leases are swept out (at most every 250 ms), is refused as a full key is:
/// [`Busy`](crate::concurrency::Busy), with
/// [`in_flight`](crate::concurrency::Busy::in_flight) the limit (a 429 with
/// `RateLimit` `r=0` and the limiter's `Retry-After` from the layers), never
/// an error; it is counted in `ratelimit_store_full_total` and logged at
/// `warn`, at most every 10 seconds. Keys already holding leases acquire,
/// renew and release as usual, and a key whose leases were all released or
/// expired leaves its place to a new one.
///
/// Clones share the same counters and leases.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), redis_ratelimit::Error> {
/// use redis_ratelimit::{Limiter, MemoryStore, Quota};
///
/// let store = MemoryStore::new();
/// let a = Limiter::builder(Quota::per_minute(1)).store(store.clone()).build().unwrap();
/// let b = Limiter::builder(Quota::per_minute(1))
///     .store(store)
///     .share_counters() // on purpose (see LimiterBuilder::name)
///     .build()
///     .unwrap();
/// assert!(a.check("k", 1).await?.is_allowed());
/// assert!(!b.check("k", 1).await?.is_allowed()); // same store, same counter
///
/// // Room for two keys: a third is denied until a window ends.
/// let small = Limiter::builder(Quota::per_minute(5))
///     .store(MemoryStore::with_max_keys(2))
///     .build()
///     .unwrap();
/// assert!(small.check("a", 1).await?.is_allowed());
/// assert!(small.check("b", 1).await?.is_allowed());
/// let third = small.check("c", 1).await?;
/// assert!(!third.is_allowed());
/// assert!(third.retry_after() <= Some(std::time::Duration::from_secs(60)));
/// assert!(small.check("a", 1).await?.is_allowed()); // held keys as ever
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Shards>,
    secret: Secret,
    epoch: Instant,
    leases: lease::Leases,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::with_max_keys(Self::DEFAULT_MAX_KEYS)
    }
}

impl MemoryStore {
    /// The bound of [`new`](Self::new): a million keys, about 45 MB when
    /// all are fixed windows or GCRA, 90 MB when all are sliding windows.
    pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

    /// An empty store, for at most [`DEFAULT_MAX_KEYS`](Self::DEFAULT_MAX_KEYS).
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store for at most `max_keys` keys (at least 1; see "When it
    /// is full" above). It takes memory as keys arrive, not up front: what
    /// it allocates at once is about 42 bytes per 1,000 keys of `max_keys`,
    /// and never more than 8 MB, however large `max_keys` is (`usize::MAX`
    /// is a store without a practical bound).
    ///
    /// ```
    /// # use redis_ratelimit::MemoryStore;
    /// let store = MemoryStore::with_max_keys(usize::MAX);
    /// assert_eq!(store.max_keys(), usize::MAX);
    /// assert!(store.is_empty());
    /// ```
    pub fn with_max_keys(max_keys: usize) -> Self {
        Self {
            inner: Arc::new(Shards::new(max_keys)),
            secret: Secret::new(),
            epoch: Instant::now(),
            leases: lease::Leases::new(max_keys),
        }
    }

    /// The most keys the store holds (and, besides, the most that hold
    /// concurrency leases: see "Concurrency leases" above).
    pub fn max_keys(&self) -> usize {
        self.inner.max_keys()
    }

    /// The number of keys held, live or not yet reclaimed.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether no keys are held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn now(&self) -> Now {
        let us = self.epoch.elapsed().as_micros() as u64;
        Now { us, ms: us / 1000 }
    }

    /// One limit, the common case: `key` hashed to its identity, then
    /// [`decide_id`](Self::decide_id). Also
    /// returns when its state resets on the store's clock, in µs (what a
    /// refund is bounded by: see [`Ends`]).
    pub(crate) fn decide_one(&self, key: &[u8], quota: Quota, cost: u64) -> (LimitState, u64) {
        self.decide_id(self.secret.id(key), quota, cost)
    }

    /// [`decide_one`](Self::decide_one) for the key of identity `id`,
    /// hashed by a [`key_hasher`](Self::key_hasher) of this store's.
    pub(crate) fn decide_id(&self, id: KeyId, quota: Quota, cost: u64) -> (LimitState, u64) {
        let now = self.now();
        let shards = &*self.inner;
        let i = shards.index(id);
        let mut reclaimed = false;
        let c = loop {
            let mut shard = shards.lock(i);
            let pick = Pick::new(shards, &mut shard, i, reclaimed, true);
            if let Some((c, _)) = pick.check(id, quota, cost, now, true, 0) {
                break c;
            }
            drop(shard);
            shards.reclaim_step(now);
            reclaimed = true;
        };
        // A lone limit spends when it admits, shadow or not.
        (c.state(c.allowed), now.us.saturating_add(c.reset_after_us))
    }

    /// A hasher that has taken `prefix`, the start of a limit's store keys:
    /// a copy of it, fed the rest of a key, gives that key's identity here
    /// ([`KeyHasher::id`]), as [`decide_one`](Self::decide_one) would hash
    /// the whole key.
    pub(crate) fn key_hasher(&self, prefix: &str) -> KeyHasher {
        let mut hasher = self.secret.hasher();
        crate::keyspace::KeyBuf::push_str(&mut hasher, prefix);
        hasher
    }

    /// Several limits, all or nothing.
    pub(crate) fn decide_now(&self, checks: Vec<LimitCheck>, cost: u64) -> Vec<LimitState> {
        self.decide_now_at(checks, cost).0
    }

    /// Several limits, all or nothing, and when each one's state resets
    /// ([`Ends`]).
    pub(crate) fn decide_now_at(
        &self,
        mut checks: Vec<LimitCheck>,
        cost: u64,
    ) -> (Vec<LimitState>, Ends) {
        if checks.len() == 1
            && let Some(check) = checks.pop()
        {
            let (state, end) = self.decide_one(check.key.as_bytes(), check.quota, cost);
            return (vec![state], Ends::One(end));
        }
        self.decide_all(&checks, cost, true)
    }

    /// Several limits at once: each one's state, and when it resets
    /// ([`Ends`]).
    /// With `spend`, all or nothing, as [`decide_now_at`](Self::decide_now_at);
    /// without it a peek, which only looks.
    pub(crate) fn decide_all(
        &self,
        checks: &[LimitCheck],
        cost: u64,
        spend: bool,
    ) -> (Vec<LimitState>, Ends) {
        let ids: Vec<_> = checks
            .iter()
            .map(|c| self.secret.id(c.key.as_bytes()))
            .collect();
        let shards = &*self.inner;
        // Each check's shard, and the shards to lock: inline for the few
        // limits a decision has, so locking allocates nothing.
        let at: SmallVec<[usize; 4]> = ids.iter().map(|id| shards.index(*id)).collect();
        let indices = ascending(&at);
        let now = self.now();
        let mut reclaimed = false;
        let (mut locked, checked, refusals) = loop {
            let mut locked = shards.lock_all(&indices);
            // The shards of the new keys this decision would store, so that
            // two of them cannot both take a shard's last place.
            let mut placed: Vec<usize> = Vec::new();
            // New keys refused for want of room: counted once the decision
            // is final, not at each pass (a limit's sweep checks them all
            // again, and the same key is refused again).
            let mut refusals = 0;
            let checked: Option<Vec<_>> = checks
                .iter()
                .zip(&ids)
                .zip(&at)
                .map(|((c, id), &i)| {
                    let pending = placed.iter().filter(|&&p| p == i).count();
                    let shard = locked_shard(&mut locked, &indices, i);
                    let pick = Pick::new(shards, shard, i, reclaimed, false);
                    let (checked, new) = pick.check(*id, c.quota, cost, now, false, pending)?;
                    // A new key that fits, or a refused one (denied).
                    if new && checked.allowed {
                        placed.push(i);
                    } else if new {
                        refusals += 1;
                    }
                    Some(checked)
                })
                .collect();
            if let Some(checked) = checked {
                break (locked, checked, refusals);
            }
            drop(locked);
            shards.reclaim_step(now);
            reclaimed = true;
        };
        // A peek's are no refusals: it would store nothing.
        if spend {
            for _ in 0..refusals {
                shards.refused(now);
            }
        }
        let all = spend
            && checks
                .iter()
                .zip(&checked)
                .all(|(l, c)| c.allowed || l.shadow);
        let mut states = Vec::with_capacity(checked.len());
        // Ends only for a spend (a refund's); a peek allocates none.
        let mut ends = Vec::with_capacity(if spend { checked.len() } else { 0 });
        for ((id, c), &i) in ids.into_iter().zip(checked).zip(&at) {
            let spends = all && c.allowed;
            states.push(c.state(spends));
            if spend {
                ends.push(now.us.saturating_add(c.reset_after_us));
            }
            if let (true, Some(entry)) = (spends, c.spent) {
                spend_in(locked_shard(&mut locked, &indices, i), id, entry);
            }
        }
        (states, Ends::Each(ends.into()))
    }
}

/// A key's shard, locked, and the bound it answers to: where a decision
/// looks the key up.
struct Pick<'a> {
    shards: &'a Shards,
    shard: &'a mut Shard,
    i: usize,
    /// Whether this decision has moved the reclaiming cursor.
    reclaimed: bool,
    /// Whether a new key refused room is counted here
    /// ([`Shards::refused`]): a lone limit's check. A decision of several
    /// counts its refusals itself, once it is final (a sweep can make it
    /// check all its limits again), and a peek's answer is no refusal.
    counts: bool,
}

impl<'a> Pick<'a> {
    fn new(
        shards: &'a Shards,
        shard: &'a mut Shard,
        i: usize,
        reclaimed: bool,
        counts: bool,
    ) -> Self {
        Self {
            shards,
            shard,
            i,
            reclaimed,
            counts,
        }
    }

    /// Checks `cost` against the key's live entry, if any, healing that
    /// entry in place where the scripts would. A new key that would be
    /// stored needs room in its shard (besides `pending` new keys this
    /// decision placed there already), or it is refused (and, if the pick
    /// `counts`, counted: [`Shards::refused`]; a peek is answered as its
    /// check would be, and counts nothing). With `spend`, an admitted cost
    /// is stored at once. Also says whether the key was a new one that took
    /// room, or was refused it (and so denied); a new key denied for its
    /// cost needs no room and is not.
    ///
    /// A new key's room is checked only once the decision has moved the
    /// reclaiming cursor, as every new key does before it takes room
    /// ([`Shards::reclaim_step`]); until then, `None`: the caller lets go
    /// of its shards, moves the cursor (which locks shards of its own), and
    /// checks again. Also `None`, without `spend`, when making room swept
    /// the shard ([`Room::Swept`]): the caller checks all its limits again.
    fn check(
        self,
        id: KeyId,
        quota: Quota,
        cost: u64,
        now: Now,
        spend: bool,
        pending: usize,
    ) -> Option<(Checked, bool)> {
        let shard = self.shard;
        let found = match quota.algorithm() {
            Algorithm::SlidingWindow => check_in(&mut shard.long, id, quota, cost, now, spend),
            _ => check_in(&mut shard.short, id, quota, cost, now, spend),
        };
        let c = match found {
            Found::Held(c, shortened) => {
                if let Some(expires_ms) = shortened {
                    shard.expires_at(expires_ms);
                }
                return Some((c, false));
            }
            Found::New(c) => c,
        };
        let Some(spent) = c.spent.filter(|_| c.allowed) else {
            return Some((c, false));
        };
        if !self.reclaimed {
            return None;
        }
        let long = matches!(spent, Entry::Sliding { .. });
        match self.shards.make_room(shard, self.i, long, pending, now) {
            Err(retry_ms) => {
                if self.counts {
                    self.shards.refused(now);
                }
                return Some((refused(retry_ms), true));
            }
            // Without `spend`, a limit of a decision of several, which
            // stores its spends after checking them all: the sweep may have
            // removed an expired entry an earlier limit found in place, and
            // took no room for. Checked again, it takes room as a new key.
            Ok(Room::Swept) if !spend => return None,
            Ok(_) => {}
        }
        if spend {
            spend_in(shard, id, spent);
        }
        Some((c, true))
    }
}

/// The shards `at` names (each key's), ascending and without repeats: the
/// order in which a call that holds several locks them
/// ([`Shards::lock_all`]), so that no two such calls wait for each other,
/// and a change to all their keys is one step to every other such call.
fn ascending(at: &[usize]) -> SmallVec<[usize; 4]> {
    let mut indices = SmallVec::from_slice(at);
    indices.sort_unstable();
    indices.dedup();
    indices
}

/// The shard `i` among `locked`, the shards `indices` names, in its order.
fn locked_shard<'g>(
    locked: &'g mut [MutexGuard<'_, Shard>],
    indices: &[usize],
    i: usize,
) -> &'g mut Shard {
    let at = indices.binary_search(&i).expect("every shard is locked");
    &mut locked[at]
}

/// Stores a spent entry in its locked shard (for a new key, the shard's
/// room was found by [`Pick::check`]).
fn spend_in(shard: &mut Shard, id: KeyId, entry: Entry) {
    let new = match entry {
        Entry::Sliding { .. } => shard.long.insert(id, Packed::pack(entry)),
        Entry::Fixed { .. } | Entry::Gcra { .. } => shard.short.insert(id, Packed::pack(entry)),
    };
    if new {
        shard.expires_at(entry.expires_ms());
    }
}

/// What [`check_in`] found.
enum Found {
    /// The key is held: its entry healed in place, or spent with `spend`;
    /// and, if that made it end sooner (a heal), when it ends now. Only
    /// then is the shard's soonest expiry touched: it lies on the shard's
    /// second cache line, which a decision otherwise does not write (a
    /// write at every decision read 0.91x against 0.96x on 100k keys in
    /// one `benches/ab.py` run, a cause not told apart from the build's
    /// layout: docs/performance-notes.md, 2026-11-30).
    Held(Checked, Option<u64>),
    /// The key is not held: storing it would take a new slot.
    New(Checked),
}

/// A new key refused by a full store: denied, with nothing left until
/// `retry_ms`.
fn refused(retry_ms: u64) -> Checked {
    Checked {
        allowed: false,
        remaining: 0,
        remaining_after: 0,
        reset_ms: retry_ms,
        reset_after_ms: retry_ms,
        reset_after_us: retry_ms.saturating_mul(1000),
        retry_ms,
        spent: None,
    }
}

/// [`Pick::check`] in one algorithm's table.
fn check_in<const N: usize, const K: usize>(
    table: &mut Table<Packed<N>, K>,
    id: KeyId,
    quota: Quota,
    cost: u64,
    now: Now,
    spend: bool,
) -> Found {
    let Some(held) = table.get_mut(id) else {
        return Found::New(algorithms::check(None, quota, cost, now));
    };
    let was = held.expires_ms();
    let live = was > now.ms;
    let mut entry = held.unpack(quota);
    let c = algorithms::check(live.then_some(&mut entry), quota, cost, now);
    match (spend && c.allowed, c.spent) {
        (true, Some(spent)) => *held = Packed::pack(spent),
        // The entry as healed (an over-long expiry shortened).
        _ if live => *held = Packed::pack(entry),
        _ => {}
    }
    let ends = held.expires_ms();
    Found::Held(c, (ends < was).then_some(ends))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        Quota,
        store::{Refund, Store},
    };

    fn one(store: &MemoryStore, key: &str, quota: &str, cost: u64) -> LimitState {
        let quota: Quota = quota.parse().unwrap();
        let check = LimitCheck {
            key: key.into(),
            quota,
            shadow: false,
        };
        store.decide_now(vec![check], cost)[0]
    }

    fn buckets(store: &MemoryStore) -> usize {
        store.inner.buckets()
    }

    #[tokio::test(start_paused = true)]
    async fn windows_expire_and_memory_is_reused() {
        let store = MemoryStore::new();
        for i in 0..5000 {
            assert!(one(&store, &format!("k{i}"), "1/1s", 1).allowed);
        }
        assert!(!one(&store, "k1", "1/1s", 1).allowed);
        let grown = buckets(&store);
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert!(one(&store, "k1", "1/1s", 1).allowed);
        for i in 0..5000 {
            assert!(one(&store, &format!("n{i}"), "1/1s", 1).allowed);
        }
        // The expired "k" windows were reclaimed as the "n" keys came, and
        // their slots reused: tables grew only where a shard (of about 15
        // keys here) drew more "n" keys than it had held "k" keys.
        assert!(store.len() <= 5001 + 500, "{}", store.len());
        assert!(
            buckets(&store) <= grown * 5 / 4,
            "{} vs {grown}",
            buckets(&store)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn expired_entries_are_reclaimed_a_little_at_a_time() {
        let store = MemoryStore::with_max_keys(20_000);
        for i in 0..10_000 {
            one(&store, &format!("k{i}"), "1/1s", 1);
        }
        let grown = buckets(&store);
        tokio::time::advance(Duration::from_millis(1001)).await;
        // One new key pays for a few dozen buckets, not for the table.
        one(&store, "n", "1/1s", 1);
        let len = store.len();
        assert!((10_001 - 32..=10_000).contains(&len), "{len}");
        for i in 0..10_000 {
            assert!(one(&store, &format!("n{i}"), "1/1s", 1).allowed);
            assert!(store.len() <= 10_001 + 2000, "{}", store.len());
        }
        assert_eq!(buckets(&store), grown);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_store_refuses_new_keys_and_decides_held_ones() {
        let store = MemoryStore::with_max_keys(100);
        for i in 0..100 {
            assert!(one(&store, &format!("k{i}"), "2/10s", 1).allowed);
        }
        tokio::time::advance(Duration::from_secs(4)).await;
        let s = one(&store, "new", "2/10s", 1);
        // Denied until the soonest window ends, not an error, not a lift.
        assert_eq!((s.allowed, s.remaining, s.retry_ms), (false, 0, 6000));
        // A peek stores nothing, so it needs no room.
        assert_eq!(one(&store, "new", "2/10s", 0).remaining, 2);
        // Held keys are decided exactly as ever.
        let s = one(&store, "k7", "2/10s", 1);
        assert_eq!((s.allowed, s.remaining), (true, 0));
        assert!(!one(&store, "k7", "2/10s", 1).allowed);
        assert_eq!(store.len(), 100);
        tokio::time::advance(Duration::from_secs(6)).await;
        for i in 0..100 {
            assert!(one(&store, &format!("n{i}"), "2/10s", 1).allowed);
        }
        assert!(!one(&store, "late", "2/10s", 1).allowed);
        assert_eq!(store.len(), 100);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_store_says_when_its_soonest_window_ends() {
        let store = MemoryStore::with_max_keys(2);
        one(&store, "a", "1/100ms", 1);
        one(&store, "b", "1/10s", 1);
        // "a" ends at 100 ms; the shard, swept for the first key, may be
        // swept again at 250 ms: the room is sure then.
        let s = one(&store, "c", "1/10s", 1);
        assert_eq!((s.allowed, s.retry_ms, s.reset_ms), (false, 250, 250));
        tokio::time::advance(Duration::from_millis(60)).await;
        assert_eq!(one(&store, "c", "1/10s", 1).retry_ms, 190);
        tokio::time::advance(Duration::from_millis(190)).await;
        assert!(one(&store, "c", "1/10s", 1).allowed);
        // Full again: "b" ends soonest now, as the sweep found.
        assert_eq!(one(&store, "d", "1/10s", 1).retry_ms, 9750);
    }

    /// Fails with the refusal saying the soonest expiry alone: "a" ends at
    /// 100 ms, but the shard, swept at 0, may not be swept before 250 ms,
    /// so a key that came back at 100 ms, as told, was refused again
    /// (unless the cursor happened by "a", which on a large store it
    /// rarely does; here it is left out).
    #[tokio::test(start_paused = true)]
    async fn a_full_shard_refuses_no_key_that_comes_back_when_told() {
        let store = MemoryStore::with_max_keys(2);
        one(&store, "a", "1/100ms", 1);
        one(&store, "b", "1/10s", 1);
        let room = |store: &MemoryStore| {
            let now = store.now();
            let mut shard = store.inner.lock(0);
            store.inner.make_room(&mut shard, 0, false, 0, now)
        };
        let told = room(&store).unwrap_err();
        assert_eq!(told, 250, "the next sweep, after \"a\" ends");
        tokio::time::advance(Duration::from_millis(told)).await;
        assert!(room(&store).is_ok());
    }

    /// Entries that a reset, a refund back to nothing or a heal ended
    /// before their window did: a full shard sweeps them out before it
    /// refuses a new key, rather than refusing new keys (with a
    /// `Retry-After` of the hour) until its soonest window as first stored
    /// ends, or until the reclaiming cursor, which on a store of many shards
    /// may be tens of thousands of new keys away, comes by.
    #[tokio::test(start_paused = true)]
    async fn a_full_shard_sweeps_out_entries_ended_in_place() {
        for how in ["reset", "refund", "heal"] {
            let store = MemoryStore::with_max_keys(100);
            let keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
            for key in &keys {
                assert!(one(&store, key, "5/1h", 1).allowed);
            }
            match how {
                "reset" => store.reset_now(&keys),
                "refund" => {
                    let refunds = keys.iter().map(|key| Refund {
                        key: key.clone(),
                        quota: "5/1h".parse().unwrap(),
                        cost: 1,
                        window_end_in_ms: 3_600_000,
                        spend_ends_at_us: None,
                    });
                    Store::refund(&store, refunds.collect()).await.unwrap();
                }
                _ => {
                    // The same keys under a quota of a shorter window: each
                    // held window is cut to it, and then ends.
                    for key in &keys {
                        assert!(!one(&store, key, "1/1s", 1).allowed);
                    }
                    tokio::time::advance(Duration::from_secs(1)).await;
                }
            }
            // At most a sweep's gap later (filling the shard swept it), where
            // a new key goes once the cursor has moved (elsewhere).
            tokio::time::advance(Duration::from_millis(250)).await;
            let now = store.now();
            let mut shard = store.inner.lock(0);
            let room = store.inner.make_room(&mut shard, 0, false, 0, now);
            assert!(room.is_ok(), "{how}: {room:?}");
            drop(shard);
            assert_eq!(store.len(), 0, "{how}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn two_new_keys_of_one_decision_cannot_share_the_last_place() {
        let store = MemoryStore::with_max_keys(1);
        let check = |key: &str| LimitCheck {
            key: key.into(),
            quota: "5/1s".parse().unwrap(),
            shadow: false,
        };
        let states = store.decide_now(vec![check("a"), check("b")], 1);
        assert!(states[0].allowed && !states[1].allowed, "{states:?}");
        // All or nothing: "a" was not stored either.
        assert!(store.is_empty());
        assert!(store.decide_now(vec![check("a")], 1)[0].allowed);
    }

    /// A full shard's sweep, made for a new key of a decision of several
    /// limits, removes the expired entries that the decision's earlier
    /// limits found in place (and so took no room for): the decision checks
    /// its limits again, and they take room as the new keys they now are.
    /// It once stored them all, one shard of one store past its bound.
    #[tokio::test(start_paused = true)]
    async fn a_sweep_within_a_decision_never_stores_past_the_bound() {
        let store = MemoryStore::with_max_keys(3072);
        let check = |key: String, quota: &str| LimitCheck {
            key,
            quota: quota.parse().unwrap(),
            shadow: false,
        };
        let ended: Vec<_> = (0..10).map(|i| check(format!("a{i}"), "1/1s")).collect();
        assert!(store.decide_now(ended.clone(), 1).iter().all(|s| s.allowed));
        for i in 0..3062 {
            assert!(one(&store, &format!("k{i}"), "1/1h", 1).allowed);
        }
        assert_eq!(store.len(), 3072);
        tokio::time::advance(Duration::from_millis(1500)).await;
        let mut checks = ended;
        checks.push(check("new".into(), "1/1h"));
        let states = store.decide_now(checks, 1);
        assert!(store.len() <= 3072, "{} keys: {states:?}", store.len());
    }

    /// A new key refused by a full shard is counted once for its decision,
    /// though a later limit's sweep makes the decision check all its limits
    /// again. It was once counted at every pass: here twice, in
    /// `ratelimit_store_full_total` (and in the warning's count), for one
    /// denial.
    #[cfg(feature = "metrics")]
    #[tokio::test(start_paused = true)]
    async fn a_refusal_is_counted_once_though_a_sweep_checks_again() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};

        use super::shards::{RECLAIM_BUCKETS, SWEEP_GAP_MS};

        // Two shards, each filled with live windows up to its first
        // refusal (which sweeps it, finding nothing expired).
        let store = MemoryStore::with_max_keys(2 * 3072);
        let shard = |key: &String| store.inner.index(store.secret.id(key.as_bytes()));
        let keys_of = |s: usize, name: &'static str| {
            (0..)
                .map(move |i| format!("{name}{i}"))
                .filter(move |key| shard(key) == s)
        };
        let fill = |s| -> Vec<_> {
            keys_of(s, "held")
                .take_while(|key| one(&store, key, "1/1h", 1).allowed)
                .collect()
        };
        assert!(fill(0).len() > 1000);
        let ended = fill(1);
        assert!(ended.len() > 1000);
        // Shard 1's entries ended in place, to be swept out once its sweep
        // gap has passed; shard 0's still live.
        store.reset_now(&ended);
        tokio::time::advance(Duration::from_millis(SWEEP_GAP_MS)).await;
        // A new key of the full shard 0, refused; then more new keys of
        // shard 1 than the decision's one step of the reclaiming cursor can
        // make room for: the last of them has shard 1 swept, and the
        // decision checks all its limits again.
        let check = |key| LimitCheck {
            key,
            quota: "1/1h".parse().unwrap(),
            shadow: false,
        };
        let refused = keys_of(0, "new").take(1);
        let swept = keys_of(1, "new").take(RECLAIM_BUCKETS + 1);
        let checks = refused.chain(swept).map(check).collect();
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let states = metrics::with_local_recorder(&recorder, || store.decide_now(checks, 1));
        assert!(!states[0].allowed && states[1..].iter().all(|s| s.allowed));
        let counted: u64 = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(k, ..)| k.key().name() == "ratelimit_store_full_total")
            .map(|(.., v)| match v {
                DebugValue::Counter(n) => n,
                _ => 0,
            })
            .sum();
        assert_eq!(counted, 1, "refusals counted for one denial");
    }

    #[tokio::test(start_paused = true)]
    async fn churn_at_capacity_never_doubles_the_table() {
        let store = MemoryStore::with_max_keys(3072);
        for round in 0..20 {
            for i in 0..3072 {
                let key = format!("r{round}k{i}");
                assert!(one(&store, &key, "1/1s", 1).allowed, "{key}");
            }
            assert!(store.len() <= 3072);
            tokio::time::advance(Duration::from_millis(1001)).await;
        }
        assert_eq!(buckets(&store), 4096);
    }

    /// A decision of several limits locks several shards: threads naming
    /// the same keys in opposite orders neither wait for each other forever
    /// nor admit past any limit.
    #[test]
    fn threads_deciding_several_limits_at_once_stay_exact() {
        let store = MemoryStore::new();
        let per_user = Quota::per_hour(50);
        let total = Quota::per_hour(400).sliding_window();
        let users = 16;
        let (done, results) = std::sync::mpsc::channel();
        for t in 0..4 {
            let (store, done) = (store.clone(), done.clone());
            std::thread::spawn(move || {
                let mut admitted = vec![0u64; users];
                for n in 0..4000 {
                    let u = (n + t) % users;
                    let mine = LimitCheck {
                        key: format!("user:{u}"),
                        quota: per_user,
                        shadow: false,
                    };
                    let all = LimitCheck {
                        key: "all".into(),
                        quota: total,
                        shadow: false,
                    };
                    let checks = if t % 2 == 0 {
                        vec![mine, all]
                    } else {
                        vec![all, mine]
                    };
                    let states = store.decide_now(checks, 1);
                    if states.iter().all(|s| s.allowed) {
                        admitted[u] += 1;
                    }
                }
                done.send(admitted).unwrap();
            });
        }
        let mut by_user = vec![0u64; users];
        for _ in 0..4 {
            let wait = Duration::from_secs(60);
            let admitted = results.recv_timeout(wait).expect("a thread is stuck");
            for (sum, n) in by_user.iter_mut().zip(admitted) {
                *sum += n;
            }
        }
        assert_eq!(by_user.iter().sum::<u64>(), 400, "{by_user:?}");
        assert!(by_user.iter().all(|&n| n <= 50), "{by_user:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn denied_and_peek_consume_nothing() {
        let store = MemoryStore::new();
        assert_eq!(one(&store, "k", "3/1s", 0).remaining, 3);
        assert!(store.is_empty());
        assert!(!one(&store, "k", "3/1s", 4).allowed);
        assert!(store.is_empty());
        let s = one(&store, "k", "3/1s", 2);
        assert_eq!((s.allowed, s.remaining, s.reset_ms), (true, 1, 1000));
        tokio::time::advance(Duration::from_millis(400)).await;
        let s = one(&store, "k", "3/1s", 2);
        assert_eq!((s.allowed, s.remaining, s.retry_ms), (false, 1, 600));
    }
}
