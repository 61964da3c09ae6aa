//! [`MemoryStore`]: counters in this process, with the Redis store's semantics.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::time::Instant;

use super::{BoxFuture, Store, WindowState};
use crate::Error;

#[path = "memory_lease.rs"]
mod lease;

/// Counters in process memory: the default when no Redis is configured.
///
/// It decides exactly like the Redis script (same windows, TTLs and cost
/// rules, never over-admits under concurrency) but each process counts alone,
/// so replicas do not share a limit. Memory stays bounded: expired windows are
/// reclaimed whenever the map has doubled since the last sweep, so it holds at
/// most about twice the keys that are live at once.
///
/// Clones share the same counters.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), redis_ratelimit::Error> {
/// use redis_ratelimit::{Limiter, MemoryStore, Quota};
///
/// let store = MemoryStore::new();
/// let a = Limiter::builder(Quota::per_minute(1)).store(store.clone()).build().unwrap();
/// let b = Limiter::builder(Quota::per_minute(1)).store(store).build().unwrap();
/// assert!(a.check("k", 1).await?.is_allowed());
/// assert!(!b.check("k", 1).await?.is_allowed()); // same store, same counter
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Counters>>,
    leases: lease::Leases,
}

#[derive(Debug, Default)]
struct Counters {
    map: HashMap<String, Window>,
    sweep_at: usize,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    count: u64,
    expires: Instant,
}

/// The smallest map size at which a sweep is considered.
const MIN_SWEEP: usize = 1024;

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of counters held, live or not yet reclaimed.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether no counters are held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counters> {
        // A panic while holding the lock cannot leave a counter half-written.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn decide(&self, key: String, limit: u64, window_ms: u64, cost: u64) -> WindowState {
        let now = Instant::now();
        let window = Duration::from_millis(window_ms);
        let mut counters = self.lock();
        let live = counters.map.get_mut(&key).filter(|w| w.expires > now);
        let (mut count, mut expires) = live.map_or((0, None), |w| {
            // Mirror the script: a window longer than this quota's is healed.
            w.expires = w.expires.min(now + window);
            (w.count, Some(w.expires))
        });
        let allowed = count.saturating_add(cost) <= limit;
        if allowed && cost > 0 {
            count += cost;
            let exp = *expires.get_or_insert(now + window);
            counters.insert(
                key,
                Window {
                    count,
                    expires: exp,
                },
                now,
            );
        }
        let ttl = expires.map_or(window, |e| e - now);
        WindowState {
            allowed,
            count,
            ttl_ms: ttl.as_millis().max(1) as u64,
        }
    }
}

impl Counters {
    fn insert(&mut self, key: String, window: Window, now: Instant) {
        if self.map.insert(key, window).is_none() && self.map.len() >= self.sweep_at {
            self.map.retain(|_, w| w.expires > now);
            self.sweep_at = (self.map.len() * 2).max(MIN_SWEEP);
        }
    }
}

impl Store for MemoryStore {
    fn fixed_window(
        &self,
        key: String,
        limit: u64,
        window_ms: u64,
        cost: u64,
    ) -> BoxFuture<'static, Result<WindowState, Error>> {
        let state = self.decide(key, limit, window_ms, cost);
        Box::pin(std::future::ready(Ok(state)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn windows_expire_and_memory_is_reclaimed() {
        let store = MemoryStore::new();
        for i in 0..5000 {
            assert!(store.decide(format!("k{i}"), 1, 1000, 1).allowed);
        }
        assert!(!store.decide("k1".into(), 1, 1000, 1).allowed);
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert!(store.decide("k1".into(), 1, 1000, 1).allowed);
        for i in 0..5000 {
            store.decide(format!("n{i}"), 1, 1000, 1);
        }
        // The 5000 expired "k" windows were swept when the map doubled.
        assert!(store.len() <= 5001 + MIN_SWEEP, "{}", store.len());
    }

    #[tokio::test(start_paused = true)]
    async fn denied_and_peek_consume_nothing() {
        let store = MemoryStore::new();
        assert_eq!(store.decide("k".into(), 3, 1000, 0).count, 0);
        assert!(store.is_empty());
        assert!(!store.decide("k".into(), 3, 1000, 4).allowed);
        assert!(store.is_empty());
        let s = store.decide("k".into(), 3, 1000, 2);
        assert_eq!((s.allowed, s.count, s.ttl_ms), (true, 2, 1000));
        tokio::time::advance(Duration::from_millis(400)).await;
        let s = store.decide("k".into(), 3, 1000, 2);
        assert_eq!((s.allowed, s.count, s.ttl_ms), (false, 2, 600));
    }
}
