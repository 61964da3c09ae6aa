//! The local deny cache; see [`Limiter`](crate::Limiter#the-local-deny-cache)
//! for what it guarantees.

use std::{
    fmt,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use quick_cache::sync::Cache;

use crate::Decision;

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
}

#[derive(Clone)]
struct Entry {
    decision: Decision,
    at: Instant,
    until: Instant,
    cost: u64,
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
    pub(crate) fn new(capacity: usize, max_age: Duration) -> Self {
        Self {
            cache: Cache::new(capacity),
            max_age,
            live_until: AtomicU64::new(0),
            base: Instant::now(),
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
        (cost >= entry.cost).then(|| entry.decision.aged(now - entry.at))
    }

    /// Forgets the denial of `key`, if any.
    pub(crate) fn remove(&self, key: &str) {
        self.cache.remove(key);
    }

    /// Forgets every denial.
    pub(crate) fn clear(&self) {
        self.cache.clear();
    }

    /// Remembers a denial of `key` (store keys, UTF-8) at `cost`, until its
    /// retry time or for the cache's max age, whichever is sooner. The key
    /// is copied only here: a request carries it inline until its denial.
    pub(crate) fn insert(&self, key: &[u8], cost: u64, decision: &Decision) {
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
        };
        // Before the entry is in: a lookup that finds it sees it live.
        self.live_until
            .fetch_max(self.since_base(until), Ordering::Relaxed);
        self.cache
            .insert(String::from_utf8_lossy(key).into_owned(), entry);
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use super::DenyCache;
    use crate::{Decision, LimitState, headers::Policies};

    fn denied(retry_ms: u64) -> Decision {
        let limits = [("default".to_owned(), "1/1m".parse().unwrap())];
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
        let cache = DenyCache::new(100, Duration::from_millis(50));
        assert!(cache.get("a", 1).is_none());
        cache.insert(b"a", 1, &denied(60_000));
        cache.insert(b"b", 1, &denied(20));
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
        cache.insert(b"a", 1, &denied(60_000));
        assert!(cache.get("a", 1).is_some());
    }
}
