//! [`MemoryStore`]: counters in this process, with the Redis store's semantics.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::time::Instant;

use self::{
    algorithms::{Checked, Entry, Now, Packed},
    ids::{KeyId, Line32, Line64, Secret, Table},
};
use super::{BoxFuture, LimitCheck, LimitState, Store};
use crate::{Algorithm, Error, Quota};

mod algorithms;
mod ids;
mod lease;

/// Counters in process memory: the default when no Redis is configured.
///
/// It decides exactly like the Redis script, for every
/// [`Algorithm`](crate::Algorithm) (same formulas, windows, expiries and cost
/// rules, all or nothing across limits, never over-admits under concurrency),
/// with time from its own monotonic clock. But each process counts alone,
/// so replicas do not share a limit. Memory stays bounded: expired windows are
/// reclaimed whenever the map has doubled since the last sweep, so it holds at
/// most about twice the keys that are live at once, at 32 bytes per key (64
/// for a sliding window; plus the table's slack) whatever the key's length:
/// a key is held as its 128-bit SipHash under a secret of the store's, not
/// as its bytes.
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
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Mutex<Counters>>,
    secret: Secret,
    epoch: Instant,
    leases: lease::Leases,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
            secret: Secret::new(),
            epoch: Instant::now(),
            leases: lease::Leases::default(),
        }
    }
}

/// Every key's entry, in the table of its algorithm's size: see [`ids`].
#[derive(Debug, Default)]
struct Counters {
    /// Fixed-window and GCRA keys: 32-byte slots, two to a cache line.
    short: Table<Packed<2>, Line32>,
    /// Sliding-window keys: 64-byte slots.
    long: Table<Packed<4>, Line64>,
    sweep_at: usize,
}

/// The smallest map size at which a sweep is considered.
const MIN_SWEEP: usize = 1024;

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of keys held, live or not yet reclaimed.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no keys are held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counters> {
        // A panic while holding the lock cannot leave an entry half-written.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> Now {
        let us = self.epoch.elapsed().as_micros() as u64;
        Now { us, ms: us / 1000 }
    }

    /// One limit, the common case: see [`Counters::decide_one`].
    pub(crate) fn decide_one(&self, key: &[u8], quota: Quota, cost: u64) -> LimitState {
        let id = self.secret.id(key);
        let now = self.now();
        self.lock().decide_one(id, quota, cost, now)
    }

    /// Several limits, all or nothing.
    pub(crate) fn decide_now(&self, mut checks: Vec<LimitCheck>, cost: u64) -> Vec<LimitState> {
        if checks.len() == 1
            && let Some(check) = checks.pop()
        {
            return vec![self.decide_one(check.key.as_bytes(), check.quota, cost)];
        }
        let ids: Vec<_> = checks
            .iter()
            .map(|c| self.secret.id(c.key.as_bytes()))
            .collect();
        let now = self.now();
        let mut counters = self.lock();
        let checked: Vec<_> = checks
            .iter()
            .zip(&ids)
            .map(|(c, id)| counters.check(*id, c.quota, cost, now, false).0)
            .collect();
        let all = checks
            .iter()
            .zip(&checked)
            .all(|(l, c)| c.allowed || l.shadow);
        let mut states = Vec::with_capacity(checked.len());
        for (id, c) in ids.into_iter().zip(checked) {
            let spends = all && c.allowed;
            states.push(c.state(spends));
            if let (true, Some(entry)) = (spends, c.spent) {
                counters.spend(id, entry, now);
            }
        }
        states
    }
}

impl Counters {
    /// One limit, the common case: no intermediate vector, and one lookup
    /// for a held key. A lone limit spends when it admits, shadow or not.
    fn decide_one(&mut self, id: KeyId, quota: Quota, cost: u64, now: Now) -> LimitState {
        let (c, new) = self.check(id, quota, cost, now, true);
        if new {
            self.sweep(now);
        }
        c.state(c.allowed)
    }

    /// Checks `cost` against the key's live entry, if any, healing that
    /// entry in place where the scripts would. With `spend`, an admitted
    /// cost is stored at once; then says whether that stored a new key.
    fn check(
        &mut self,
        id: KeyId,
        quota: Quota,
        cost: u64,
        now: Now,
        spend: bool,
    ) -> (Checked, bool) {
        match quota.algorithm() {
            Algorithm::SlidingWindow => check_in(&mut self.long, id, quota, cost, now, spend),
            _ => check_in(&mut self.short, id, quota, cost, now, spend),
        }
    }

    /// Stores a spent entry (several limits' decision, once all admitted).
    fn spend(&mut self, id: KeyId, entry: Entry, now: Now) {
        let new = match entry {
            Entry::Sliding { .. } => self.long.insert(id, Packed::pack(entry)),
            Entry::Fixed { .. } | Entry::Gcra { .. } => self.short.insert(id, Packed::pack(entry)),
        };
        if new {
            self.sweep(now);
        }
    }

    /// After a new key: sweeps expired windows once the tables have doubled.
    fn sweep(&mut self, now: Now) {
        if self.len() >= self.sweep_at {
            self.short.retain(|e| e.expires_ms() > now.ms);
            self.long.retain(|e| e.expires_ms() > now.ms);
            self.sweep_at = (self.len() * 2).max(MIN_SWEEP);
        }
    }

    fn len(&self) -> usize {
        self.short.len() + self.long.len()
    }
}

/// [`Counters::check`] in one algorithm's table.
fn check_in<const N: usize, A>(
    table: &mut Table<Packed<N>, A>,
    id: KeyId,
    quota: Quota,
    cost: u64,
    now: Now,
    spend: bool,
) -> (Checked, bool) {
    let Some(held) = table.get_mut(id) else {
        let c = algorithms::check(None, quota, cost, now);
        let new = match (spend && c.allowed, c.spent) {
            (true, Some(spent)) => table.insert(id, Packed::pack(spent)),
            _ => false,
        };
        return (c, new);
    };
    let live = held.expires_ms() > now.ms;
    let mut entry = held.unpack(quota);
    let c = algorithms::check(live.then_some(&mut entry), quota, cost, now);
    match (spend && c.allowed, c.spent) {
        (true, Some(spent)) => *held = Packed::pack(spent),
        // The entry as healed (an over-long expiry shortened).
        _ if live => *held = Packed::pack(entry),
        _ => {}
    }
    (c, false)
}

impl Store for MemoryStore {
    fn decide(
        &self,
        checks: Vec<LimitCheck>,
        cost: u64,
    ) -> BoxFuture<'static, Result<Vec<LimitState>, Error>> {
        let states = self.decide_now(checks, cost);
        Box::pin(std::future::ready(Ok(states)))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::Quota;

    fn one(store: &MemoryStore, key: &str, quota: &str, cost: u64) -> LimitState {
        let quota: Quota = quota.parse().unwrap();
        let check = LimitCheck {
            key: key.into(),
            quota,
            shadow: false,
        };
        store.decide_now(vec![check], cost)[0]
    }

    #[tokio::test(start_paused = true)]
    async fn windows_expire_and_memory_is_reclaimed() {
        let store = MemoryStore::new();
        for i in 0..5000 {
            assert!(one(&store, &format!("k{i}"), "1/1s", 1).allowed);
        }
        assert!(!one(&store, "k1", "1/1s", 1).allowed);
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert!(one(&store, "k1", "1/1s", 1).allowed);
        for i in 0..5000 {
            one(&store, &format!("n{i}"), "1/1s", 1);
        }
        // The 5000 expired "k" windows were swept when the map doubled.
        assert!(store.len() <= 5001 + MIN_SWEEP, "{}", store.len());
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
