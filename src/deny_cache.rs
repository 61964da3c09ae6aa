//! The local deny cache; see [`Limiter`](crate::Limiter#the-local-deny-cache)
//! for what it guarantees.

use std::{
    fmt,
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use quick_cache::sync::Cache;

use crate::{Decision, Key};

/// Bounded in entries: the least recently useful are evicted first.
pub(crate) struct DenyCache {
    cache: Cache<String, Entry>,
    /// The longest an entry is used, whatever its retry time.
    max_age: Duration,
    /// When the last entry to expire does, as nanoseconds since `base`:
    /// past it nothing cached is live, and a lookup is skipped (a key
    /// rarely denied, as most are, costs a clock read, not a hash and a
    /// shard's lock).
    live_until: AtomicU64,
    base: Instant,
    /// Moves at every `clear`, and `stripes[stripe(key)]` at every
    /// `remove(key)`: a denial the store made before one of them is stale
    /// once it has run, so a miss taken before it (see [`Miss`]) caches
    /// nothing. A key's epoch is the sum of the two, which moves whenever
    /// either does (both only grow); it wraps, so a miss would be mistaken
    /// only after exactly 2^32 moves while its call was on its way. Striped
    /// so that refunds, one `remove` each (every success under
    /// `Refund::Successes`), leave other keys' denials cached.
    epoch: AtomicU32,
    stripes: [AtomicU32; STRIPES],
    /// Some limit is a sliding window or GCRA, whose denial of one cost an
    /// admission of another lengthens: see [`DenyCache::admitted`].
    admissions_lengthen: bool,
}

/// How many stripes of `remove` epochs a cache keeps.
const STRIPES: usize = 64;

/// The stripe of `key`'s `remove` epoch: a cheap hash of its bytes.
fn stripe(key: &[u8]) -> usize {
    let hash = key.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    });
    (hash >> 26) as usize % STRIPES
}

/// A key the cache did not hold when its store call was sent: the store's
/// denial is cached under it only if no `remove` or `clear` ran since, so
/// a reply that crossed a reset or a refund is not cached after it.
#[derive(Debug)]
pub(crate) struct Miss {
    key: Key,
    epoch: u32,
}

impl Miss {
    /// The key and the epoch, held apart by a decision on its way (the
    /// epoch in padding of its own: see `ProbeGuard`).
    pub(crate) fn into_parts(self) -> (Key, u32) {
        (self.key, self.epoch)
    }

    pub(crate) fn from_parts(key: Key, epoch: u32) -> Self {
        Self { key, epoch }
    }

    fn key(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(self.key.as_bytes())
    }
}

#[derive(Clone)]
struct Entry {
    decision: Decision,
    at: Instant,
    until: Instant,
    cost: u64,
    /// Whether a larger cost waits no longer: see [`waits_as_long`].
    larger_too: bool,
}

/// Whether every limit of a denial would make a larger cost wait as long
/// as the cost it denied: a fixed window that denied waits for its window's
/// end, whatever the cost; a sliding window's and GCRA's wait grows with
/// it; and a limit that admitted the cost can deny a larger one, with a
/// wait of its own (a window of a day beside the second's that denied). So
/// only a denial by every limit, each a fixed window, answers a larger cost;
/// any other answers only the cost it was made for (a larger one served
/// from it would be told to retry too soon).
fn waits_as_long(decision: &Decision) -> bool {
    decision
        .limits()
        .all(|l| !l.is_allowed() && l.quota().algorithm() == crate::Algorithm::FixedWindow)
}

impl fmt::Debug for DenyCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DenyCache")
            .field("len", &self.cache.len())
            .field("capacity", &self.cache.capacity())
            .field("max_age", &self.max_age)
            .finish()
    }
}

impl DenyCache {
    /// A cache for a limiter of `quotas`.
    pub(crate) fn new(capacity: usize, max_age: Duration, quotas: &[crate::Quota]) -> Self {
        Self {
            admissions_lengthen: quotas
                .iter()
                .any(|q| q.algorithm() != crate::Algorithm::FixedWindow),
            cache: Cache::new(capacity),
            max_age,
            live_until: AtomicU64::new(0),
            base: Instant::now(),
            epoch: AtomicU32::new(0),
            stripes: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }

    /// `t` as nanoseconds since `base` (saturating).
    fn since_base(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The cached denial for `key` at `cost`, aged to now, if there is one.
    pub(crate) fn get(&self, key: &str, cost: u64) -> Option<Decision> {
        let now = Instant::now();
        if self.since_base(now) >= self.live_until.load(Ordering::Relaxed) {
            return None;
        }
        // `get` hands out a copy of the entry; it is aged in place.
        let entry = self.cache.get(key)?;
        if now >= entry.until {
            self.cache.remove(key);
            return None;
        }
        let answers = cost == entry.cost || (entry.larger_too && cost > entry.cost);
        answers.then(|| entry.decision.aged(now - entry.at))
    }

    /// `key` (store keys, UTF-8), missed now: taken before its store call
    /// is sent.
    pub(crate) fn miss(&self, key: &[u8]) -> Miss {
        Miss {
            key: Key::copy_from(key),
            epoch: self.epoch_of(key),
        }
    }

    /// `key`'s epoch now: see `epoch`.
    fn epoch_of(&self, key: &[u8]) -> u32 {
        let removes = self.stripes[stripe(key)].load(Ordering::SeqCst);
        self.epoch.load(Ordering::SeqCst).wrapping_add(removes)
    }

    /// Forgets the denial of `key`, if any, and any denial of it on its way.
    pub(crate) fn remove(&self, key: &str) {
        self.stripes[stripe(key.as_bytes())].fetch_add(1, Ordering::SeqCst);
        self.cache.remove(key);
    }

    /// The store admitted a request on `miss`'s key: a denial cached for
    /// another cost is stale if a limit is a sliding window or GCRA, as the
    /// admission spent units that denial's wait counted on (a fixed window's
    /// wait is its end, which an admission does not move). So it is
    /// forgotten, with any on its way: the key's epoch moves whatever the
    /// cache holds (a denial decided before this admission may conclude
    /// after it, on another thread), and the entry is dropped if some
    /// denial is live. Nothing when every limit is a fixed window.
    pub(crate) fn admitted(&self, miss: &Miss) {
        if !self.admissions_lengthen {
            return;
        }
        let key = miss.key.as_bytes();
        self.stripes[stripe(key)].fetch_add(1, Ordering::SeqCst);
        if self.since_base(Instant::now()) < self.live_until.load(Ordering::Relaxed) {
            self.cache.remove(&*miss.key());
        }
    }

    /// Forgets every denial, and any on its way.
    pub(crate) fn clear(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.cache.clear();
    }

    /// Remembers a denial of `miss`'s key at `cost`, until its retry time
    /// or for the cache's max age, whichever is sooner, unless a `remove`
    /// or `clear` ran since the miss (the denial may be stale: the reset or
    /// refund may have run in the store after it). The key is copied only
    /// here: a request carries it inline until its denial.
    pub(crate) fn insert(&self, miss: &Miss, cost: u64, decision: &Decision) {
        if self.epoch_of(miss.key.as_bytes()) != miss.epoch {
            return;
        }
        let Some(wait) = decision.retry_after() else {
            return;
        };
        let wait = wait.min(self.max_age);
        if wait < Duration::from_millis(1) {
            return;
        }
        let at = Instant::now();
        let until = at + wait;
        let entry = Entry {
            decision: decision.clone(),
            at,
            until,
            cost,
            larger_too: waits_as_long(decision),
        };
        // Before the entry is in: a lookup that finds it sees it live.
        self.live_until
            .fetch_max(self.since_base(until), Ordering::Relaxed);
        self.cache.insert(miss.key().into_owned(), entry);
        // A `remove` or `clear` that began after the check above may have
        // run before the insert: undone here, after it.
        if self.epoch_of(miss.key.as_bytes()) != miss.epoch {
            self.cache.remove(&*miss.key());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use super::DenyCache;
    use crate::{Decision, LimitState, headers::Policies};

    fn denied(retry_ms: u64) -> Decision {
        denied_by("1/1m".parse().unwrap(), retry_ms)
    }

    fn denied_by(quota: crate::Quota, retry_ms: u64) -> Decision {
        let limits = [("default".to_owned(), quota)];
        let state = LimitState {
            allowed: false,
            remaining: 0,
            reset_ms: retry_ms,
            retry_ms,
        };
        Decision::new(vec![state], Arc::new(Policies::new(&limits)))
    }

    /// The skip of lookups while nothing is live never hides a live denial,
    /// and a lookup after the last one has expired finds nothing.
    #[test]
    fn a_denial_is_found_while_live_and_not_after() {
        let cache = DenyCache::new(100, Duration::from_millis(50), &[]);
        assert!(cache.get("a", 1).is_none());
        cache.insert(&cache.miss(b"a"), 1, &denied(60_000));
        cache.insert(&cache.miss(b"b"), 1, &denied(20));
        assert!(cache.get("a", 1).is_some_and(|d| !d.is_allowed()));
        assert!(cache.get("b", 1).is_some());
        assert!(cache.get("c", 1).is_none());
        std::thread::sleep(Duration::from_millis(30));
        assert!(cache.get("b", 1).is_none(), "past its retry time");
        assert!(
            cache.get("a", 1).is_some(),
            "a is capped at 50 ms, not gone"
        );
        std::thread::sleep(Duration::from_millis(30));
        assert!(cache.get("a", 1).is_none(), "past the max age");
        // A denial cached later is live again.
        cache.insert(&cache.miss(b"a"), 1, &denied(60_000));
        assert!(cache.get("a", 1).is_some());
    }

    /// Fails with every denial answering larger costs: a GCRA or sliding
    /// window denial of cost 1 told a request of cost 10 to retry when one
    /// unit would be free, not ten.
    #[test]
    fn only_a_fixed_windows_denial_answers_a_larger_cost() {
        let cache = DenyCache::new(100, Duration::from_secs(60), &[]);
        let q: crate::Quota = "10/1m".parse().unwrap();
        for (key, quota) in [
            ("gcra", q.gcra(10).unwrap()),
            ("sliding", q.sliding_window()),
        ] {
            cache.insert(&cache.miss(key.as_bytes()), 2, &denied_by(quota, 6_000));
            assert!(cache.get(key, 2).is_some(), "{key}: its own cost");
            assert!(cache.get(key, 10).is_none(), "{key}: a larger cost");
            assert!(cache.get(key, 1).is_none(), "{key}: a smaller cost");
        }
        cache.insert(&cache.miss(b"fixed"), 2, &denied_by(q, 6_000));
        assert!(cache.get("fixed", 10).is_some());
        assert!(cache.get("fixed", 1).is_none());
    }

    /// Fails with every fixed-window denial answering larger costs: a
    /// second's limit denied cost 1 while the day's admitted it with 2
    /// left, and a request of cost 3, which the day's limit denies for
    /// hours, was told to retry in a second.
    #[test]
    fn a_denial_answers_a_larger_cost_only_if_every_limit_denied() {
        let cache = DenyCache::new(100, Duration::from_secs(60), &[]);
        let limits = [
            ("second".to_owned(), "10/1s".parse().unwrap()),
            ("day".to_owned(), "100/1d".parse().unwrap()),
        ];
        let policies = Arc::new(Policies::new(&limits));
        let state = |allowed, remaining, ms| LimitState {
            allowed,
            remaining,
            reset_ms: ms,
            retry_ms: if allowed { 0 } else { ms },
        };
        let second_only = Decision::new(
            vec![state(false, 0, 600), state(true, 2, 80_000_000)],
            policies.clone(),
        );
        cache.insert(&cache.miss(b"one"), 1, &second_only);
        assert!(cache.get("one", 1).is_some(), "its own cost");
        assert!(cache.get("one", 3).is_none(), "a cost the day may deny");
        let both = Decision::new(
            vec![state(false, 0, 600), state(false, 0, 80_000_000)],
            policies,
        );
        cache.insert(&cache.miss(b"both"), 1, &both);
        assert!(cache.get("both", 3).is_some());
    }

    /// Fails without `admitted`: a GCRA denial of cost 5 outlived the
    /// store's admission of cost 1, which lengthened the wait for 5, and
    /// told the next request of cost 5 a retry time the store would deny.
    #[test]
    fn an_admission_forgets_a_denial_it_lengthened() {
        let q: crate::Quota = "10/1m".parse().unwrap();
        let gcra = q.gcra(10).unwrap();
        let cache = DenyCache::new(100, Duration::from_secs(60), &[gcra]);
        cache.insert(&cache.miss(b"a"), 5, &denied_by(gcra, 18_000));
        cache.insert(&cache.miss(b"b"), 5, &denied_by(gcra, 18_000));
        cache.admitted(&cache.miss(b"a"));
        assert!(cache.get("a", 5).is_none());
        assert!(cache.get("b", 5).is_some(), "another key's stays");
        // A denial decided before the admission, concluded after it (on
        // another thread) while nothing was cached, is not cached.
        let empty = DenyCache::new(100, Duration::from_secs(60), &[gcra]);
        let before = empty.miss(b"a");
        empty.admitted(&empty.miss(b"a"));
        empty.insert(&before, 5, &denied_by(gcra, 18_000));
        assert!(empty.get("a", 5).is_none());
        // A fixed window's end does not move: its denial stays.
        let fixed = DenyCache::new(100, Duration::from_secs(60), &[q]);
        fixed.insert(&fixed.miss(b"a"), 5, &denied_by(q, 18_000));
        fixed.admitted(&fixed.miss(b"a"));
        assert!(fixed.get("a", 5).is_some());
    }

    /// Fails without the epoch: a denial the store made before a reset or
    /// a refund, answered after it, was cached after the cache was cleared,
    /// and repeated for up to the max age to a client the reset had freed.
    #[test]
    fn a_denial_answered_across_a_clear_or_remove_is_not_cached() {
        let cache = DenyCache::new(100, Duration::from_secs(60), &[]);
        let before_clear = cache.miss(b"a");
        cache.clear();
        cache.insert(&before_clear, 1, &denied(60_000));
        assert!(cache.get("a", 1).is_none(), "crossed a clear");
        let before_remove = cache.miss(b"a");
        cache.remove("a");
        cache.insert(&before_remove, 1, &denied(60_000));
        assert!(cache.get("a", 1).is_none(), "crossed a remove");
        // A miss taken after them caches as ever.
        cache.insert(&cache.miss(b"a"), 1, &denied(60_000));
        assert!(cache.get("a", 1).is_some());
    }

    /// Fails with one epoch for every key: a refund of any key (every
    /// success under `Refund::Successes`) kept every denial on its way from
    /// being cached, so a hammered key cost a store call a request again.
    #[test]
    fn a_remove_of_another_key_leaves_a_denial_on_its_way_cached() {
        let cache = DenyCache::new(100, Duration::from_secs(60), &[]);
        let other = (0..)
            .map(|i| format!("other-{i}"))
            .find(|k| super::stripe(k.as_bytes()) != super::stripe(b"a"))
            .unwrap();
        let miss = cache.miss(b"a");
        cache.remove(&other);
        cache.insert(&miss, 1, &denied(60_000));
        assert!(cache.get("a", 1).is_some());
    }
}
