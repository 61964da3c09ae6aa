//! The local deny cache; see [`Limiter`](crate::Limiter#the-local-deny-cache)
//! for what it guarantees.

use std::{
    fmt,
    time::{Duration, Instant},
};

use quick_cache::sync::Cache;

use crate::Decision;

/// Bounded in entries: the least recently useful are evicted first.
pub(crate) struct DenyCache {
    cache: Cache<String, Entry>,
    /// The longest an entry is used, whatever its retry time.
    max_age: Duration,
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
        }
    }

    /// The cached denial for `key` at `cost`, aged to now, if there is one.
    pub(crate) fn get(&self, key: &str, cost: u64) -> Option<Decision> {
        // `get` hands out a copy of the entry; it is aged in place.
        let entry = self.cache.get(key)?;
        let now = Instant::now();
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
        let entry = Entry {
            decision: decision.clone(),
            at,
            until: at + wait,
            cost,
        };
        self.cache
            .insert(String::from_utf8_lossy(key).into_owned(), entry);
    }
}
