//! [`LeaseStore`] for [`MemoryStore`]: the lease scripts' semantics, in this
//! process.
//!
//! A child module of `memory.rs`: the store holds a [`Leases`] table next to
//! its counters, shared by its clones.
//!
//! # Its bound
//!
//! A client can pick its key (a header key), so the table is bounded as the
//! counters are: it holds at most the store's `max_keys` keys, a bound of
//! its own beside theirs. When it is full, an acquire on a **new** key,
//! after the expired leases are swept out (at most every
//! [`SWEEP_GAP_MS`]), is refused: not granted, with `held` the limit (the
//! key reads as busy, nothing left), counted in `ratelimit_store_full_total`
//! and logged at most every 10 seconds, as a new counter key is denied by a
//! full store. Keys already held keep their leases, and acquire, renew and
//! release as ever; a released or expired key's place goes to a new key.
//! Evicting a held key instead would free a busy client's slots.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use tokio::time::Instant;

use super::{
    MemoryStore,
    shards::{Refusals, SWEEP_GAP_MS},
};
use crate::{
    Error,
    store::{BoxFuture, LeaseState, LeaseStore},
};

/// Every key's leases: owner token and expiry.
#[derive(Debug, Clone)]
pub(super) struct Leases(Arc<Mutex<Table>>);

#[derive(Debug)]
struct Table {
    keys: HashMap<String, Vec<(Box<str>, Instant)>>,
    /// The most keys held (at least 1).
    max_keys: usize,
    /// Below the bound, the size at which a new key first sweeps out keys
    /// whose holders all went away: twice what the last sweep left.
    sweep_at: usize,
    /// No lease held expires before this: lowered by every expiry written,
    /// exact after a sweep (`None`: none held then). So a full table that
    /// may hold an expired lease sweeps before it refuses a key.
    soonest: Option<Instant>,
    /// No sweep of a full table before this.
    sweep_after: Instant,
    refusals: Refusals,
    /// For the refusals' warning gap, in ms.
    epoch: Instant,
}

/// The smallest table at which a sweep of abandoned keys is considered.
const MIN_SWEEP: usize = 1024;

impl Table {
    /// Whether a new key fits. A table that has doubled since its last
    /// sweep is swept first; so is a full one, if a lease of its may have
    /// expired, at most every [`SWEEP_GAP_MS`].
    fn make_room(&mut self, now: Instant) -> bool {
        let len = self.keys.len();
        let full_and_stale = len >= self.max_keys
            && self.soonest.is_some_and(|soonest| soonest <= now)
            && now >= self.sweep_after;
        if len >= self.sweep_at || full_and_stale {
            self.sweep(now);
        }
        self.keys.len() < self.max_keys
    }

    /// Removes every expired lease, and every key left with none; learns
    /// the soonest expiry left.
    fn sweep(&mut self, now: Instant) {
        let mut soonest = None;
        self.keys.retain(|_, set| {
            set.retain(|(_, e)| *e > now);
            for (_, e) in set.iter() {
                lower(&mut soonest, *e);
            }
            !set.is_empty()
        });
        self.soonest = soonest;
        self.sweep_at = (self.keys.len() * 2).max(MIN_SWEEP);
        self.sweep_after = now + Duration::from_millis(SWEEP_GAP_MS);
    }

    /// Counts a refused key, and warns at most every 10 seconds.
    fn refused(&mut self, now: Instant) {
        let ms = now.saturating_duration_since(self.epoch).as_millis() as u64;
        let Some(refused) = self.refusals.refused(ms) else {
            return;
        };
        tracing::warn!(
            max_keys = self.max_keys,
            refused,
            "in-memory concurrency lease table full: acquires on new keys are refused (busy) \
             until held leases end or are released (keys already held work as usual); raise \
             the store's max_keys if these are real clients"
        );
    }
}

/// Lowers `soonest` to `expiry` if it is sooner.
fn lower(soonest: &mut Option<Instant>, expiry: Instant) {
    if soonest.is_none_or(|s| expiry < s) {
        *soonest = Some(expiry);
    }
}

impl Leases {
    /// An empty table for at most `max_keys` keys (at least 1).
    pub(super) fn new(max_keys: usize) -> Self {
        let now = Instant::now();
        Self(Arc::new(Mutex::new(Table {
            keys: HashMap::new(),
            max_keys: max_keys.max(1),
            sweep_at: MIN_SWEEP,
            soonest: None,
            sweep_after: now,
            refusals: Refusals::default(),
            epoch: now,
        })))
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // Every change below leaves the table consistent before it can panic.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn acquire(&self, key: &str, token: &str, limit: u64, lease: Duration) -> LeaseState {
        let now = Instant::now();
        let expiry = now + lease;
        let mut table = self.lock();
        let table = &mut *table;
        if !table.keys.contains_key(key) {
            if !table.make_room(now) {
                table.refused(now);
                // A full key's answer: busy, nothing left.
                return LeaseState {
                    acquired: false,
                    held: limit,
                };
            }
            table.keys.insert(key.to_owned(), Vec::new());
        }
        let set = table.keys.get_mut(key).expect("inserted above");
        set.retain(|(_, e)| *e > now);
        for (t, e) in set.iter_mut() {
            // As the script does: a lease that outlives the one granted now
            // is cut to its own length from now (a token says it), or to
            // the one granted now (a token that does not). One that does
            // not outlive it is left as it is, whatever its token ends in.
            if *e > expiry {
                let longest = crate::concurrency::token_lease(t).map_or(expiry, |own| now + own);
                *e = (*e).min(longest);
                lower(&mut table.soonest, *e);
            }
        }
        let acquired = if let Some((_, e)) = set.iter_mut().find(|(t, _)| &**t == token) {
            *e = expiry;
            true
        } else if (set.len() as u64) < limit {
            set.push((token.into(), expiry));
            true
        } else {
            false
        };
        if acquired {
            lower(&mut table.soonest, expiry);
        }
        let held = set.len() as u64;
        if set.is_empty() {
            table.keys.remove(key);
        }
        LeaseState { acquired, held }
    }

    fn renew(&self, key: &str, token: &str, lease: Duration) -> bool {
        let now = Instant::now();
        let mut table = self.lock();
        let table = &mut *table;
        let Some(set) = table.keys.get_mut(key) else {
            return false;
        };
        let Some(i) = set.iter().position(|(t, _)| &**t == token) else {
            return false;
        };
        if set[i].1 <= now {
            set.swap_remove(i);
            if set.is_empty() {
                table.keys.remove(key);
            }
            return false;
        }
        set[i].1 = now + lease;
        lower(&mut table.soonest, now + lease);
        true
    }

    fn release(&self, key: &str, token: &str) -> bool {
        let now = Instant::now();
        let mut table = self.lock();
        let Some(set) = table.keys.get_mut(key) else {
            return false;
        };
        let Some(i) = set.iter().position(|(t, _)| &**t == token) else {
            return false;
        };
        let (_, expiry) = set.swap_remove(i);
        if set.is_empty() {
            table.keys.remove(key);
        }
        expiry > now
    }

    /// Keys held, live or not yet reclaimed.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().keys.len()
    }
}

fn ready<T: Send + 'static>(value: Result<T, Error>) -> BoxFuture<'static, Result<T, Error>> {
    Box::pin(std::future::ready(value))
}

/// The largest whole number the scripts take for `limit` or `lease_ms`:
/// 2^53 - 1, below where their doubles stop telling n from n + 1 (`whole`
/// in `lua/lib.lua`).
const MAX_WHOLE: u64 = (1 << 53) - 1;

/// The scripts' argument checks, with their messages: `Err` where `script`
/// answers an error reply, before it changes anything. `limit` and
/// `lease_ms` are checked when the script takes them.
fn valid(
    script: &str,
    limit: Option<u64>,
    lease_ms: Option<u64>,
    token: &str,
) -> Result<(), Error> {
    let whole = |n: Option<u64>| n.is_none_or(|n| (1..=MAX_WHOLE).contains(&n));
    if !whole(limit) || !whole(lease_ms) {
        let what = if limit.is_some() {
            "limit and lease_ms must be integers >= 1"
        } else {
            "lease_ms must be an integer >= 1"
        };
        return Err(refused(script, what));
    }
    if token.is_empty() || token.len() > 128 {
        return Err(refused(script, "token must be 1 to 128 bytes"));
    }
    Ok(())
}

/// The error a script's error reply becomes through the Redis store: an
/// [`Error::Redis`] of kind `ResponseError`, naming the script and what to
/// fix, as its reply does.
fn refused(script: &str, what: &str) -> Error {
    let kind = redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError);
    Error::Redis((kind, "invalid lease call", format!("{script}: {what}")).into())
}

impl LeaseStore for MemoryStore {
    fn instance(&self) -> Option<usize> {
        crate::Store::instance(self)
    }

    fn acquire(
        &self,
        key: &str,
        token: &str,
        limit: u64,
        lease_ms: u64,
    ) -> BoxFuture<'static, Result<LeaseState, Error>> {
        let acquired = valid("concurrency_acquire", Some(limit), Some(lease_ms), token).map(|()| {
            let lease = Duration::from_millis(lease_ms);
            self.leases.acquire(key, token, limit, lease)
        });
        ready(acquired)
    }

    fn renew(
        &self,
        key: &str,
        token: &str,
        lease_ms: u64,
    ) -> BoxFuture<'static, Result<bool, Error>> {
        let renewed = valid("concurrency_renew", None, Some(lease_ms), token).map(|()| {
            self.leases
                .renew(key, token, Duration::from_millis(lease_ms))
        });
        ready(renewed)
    }

    fn release(&self, key: &str, token: &str) -> BoxFuture<'static, Result<bool, Error>> {
        let released = valid("concurrency_release", None, None, token)
            .map(|()| self.leases.release(key, token));
        ready(released)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn admits_up_to_the_limit_and_frees_expired_slots() {
        let l = Leases::new(usize::MAX);
        assert_eq!(
            l.acquire("k", "a", 2, SEC),
            LeaseState {
                acquired: true,
                held: 1
            }
        );
        assert_eq!(
            l.acquire("k", "b", 2, SEC),
            LeaseState {
                acquired: true,
                held: 2
            }
        );
        assert_eq!(
            l.acquire("k", "c", 2, SEC),
            LeaseState {
                acquired: false,
                held: 2
            }
        );
        // A retried acquire renews rather than taking a second slot.
        assert_eq!(
            l.acquire("k", "a", 2, SEC),
            LeaseState {
                acquired: true,
                held: 2
            }
        );
        tokio::time::advance(SEC).await;
        assert_eq!(
            l.acquire("k", "c", 2, SEC),
            LeaseState {
                acquired: true,
                held: 1
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn renew_and_release_touch_only_the_owners_live_lease() {
        let l = Leases::new(usize::MAX);
        l.acquire("k", "old", 1, SEC);
        tokio::time::advance(SEC / 2).await;
        assert!(l.renew("k", "old", SEC));
        tokio::time::advance(SEC).await;
        // Expired: lost, and the slot goes to someone else.
        assert!(!l.renew("k", "old", SEC));
        assert!(l.acquire("k", "new", 1, SEC).acquired);
        assert!(!l.release("k", "old"));
        assert!(!l.renew("k", "old", SEC));
        assert!(
            !l.acquire("k", "third", 1, SEC).acquired,
            "new still holds it"
        );
        assert!(l.release("k", "new"));
        assert!(!l.release("k", "new"), "releasing twice is harmless");
        assert_eq!(l.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn abandoned_keys_are_reclaimed() {
        let l = Leases::new(usize::MAX);
        for i in 0..5000 {
            l.acquire(&format!("k{i}"), "t", 1, SEC);
        }
        tokio::time::advance(SEC).await;
        for i in 0..5000 {
            l.acquire(&format!("n{i}"), "t", 1, SEC);
        }
        assert!(l.len() <= 5000 + MIN_SWEEP, "{}", l.len());
    }

    /// The table holds at most the store's `max_keys` keys, however many a
    /// client makes up: a new key is refused (busy, nothing left) while it
    /// is full, keys held keep acquiring and releasing, and a key released
    /// or expired makes room again. It once took every new key, growing
    /// without bound until the leases expired.
    #[tokio::test(start_paused = true)]
    async fn a_full_table_refuses_new_keys_and_serves_held_ones() {
        let store = MemoryStore::with_max_keys(100);
        let l = &store.leases;
        let busy = LeaseState {
            acquired: false,
            held: 2,
        };
        for i in 0..100 {
            assert!(l.acquire(&format!("k{i}"), "a", 2, SEC).acquired, "k{i}");
        }
        for i in 0..1000 {
            assert_eq!(l.acquire(&format!("n{i}"), "a", 2, SEC), busy, "n{i}");
            assert!(!l.renew(&format!("n{i}"), "a", SEC));
        }
        assert_eq!(l.len(), 100);
        tokio::time::advance(SEC / 2).await;
        // A held key: its second slot, refused a third, released, retaken.
        assert!(l.acquire("k5", "b", 2, SEC).acquired);
        assert_eq!(l.acquire("k5", "c", 2, SEC), busy);
        assert!(l.release("k5", "b"));
        assert!(l.acquire("k5", "c", 2, SEC).acquired);
        assert!(l.renew("k5", "a", SEC));
        // A released key's place goes to a new key, and only one.
        assert!(l.release("k0", "a"));
        assert!(l.acquire("n0", "a", 2, SEC).acquired);
        assert_eq!(l.acquire("n1", "a", 2, SEC), busy);
        assert_eq!(l.len(), 100);
        // Expired leases are swept out before a new key is refused: all
        // but k5's and n0's (taken or renewed since) have ended.
        tokio::time::advance(SEC / 2).await;
        for i in 0..98 {
            assert!(l.acquire(&format!("m{i}"), "a", 2, SEC).acquired, "m{i}");
        }
        assert_eq!(l.acquire("m98", "a", 2, SEC), busy);
        assert!(l.release("k5", "a"));
        assert!(l.acquire("k5", "d", 2, SEC).acquired);
        assert_eq!(l.len(), 100);
    }
}
