//! [`LeaseStore`] for [`MemoryStore`]: the lease scripts' semantics, in this
//! process.
//!
//! A child module of `memory.rs`: the store holds a [`Leases`] table next to
//! its counters, shared by its clones.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use tokio::time::Instant;

use super::MemoryStore;
use crate::{
    Error,
    store::{BoxFuture, LeaseState, LeaseStore},
};

/// Every key's leases: owner token and expiry.
#[derive(Debug, Clone, Default)]
pub(super) struct Leases(Arc<Mutex<Table>>);

#[derive(Debug, Default)]
struct Table {
    keys: HashMap<String, Vec<(Box<str>, Instant)>>,
    sweep_at: usize,
}

/// The smallest table at which a sweep of abandoned keys is considered.
const MIN_SWEEP: usize = 1024;

impl Leases {
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
            if table.keys.len() >= table.sweep_at {
                // Reclaim keys whose holders all went away without releasing.
                table
                    .keys
                    .retain(|_, set| set.iter().any(|(_, e)| *e > now));
                table.sweep_at = (table.keys.len() * 2).max(MIN_SWEEP);
            }
            table.keys.insert(key.to_owned(), Vec::new());
        }
        let set = table.keys.get_mut(key).expect("inserted above");
        set.retain(|(_, e)| *e > now);
        for (t, e) in set.iter_mut() {
            // As the script does: no lease outlives its own length from now
            // (a token says it), or one granted now (a token that does not).
            let longest = crate::concurrency::token_lease(t).map_or(expiry, |own| now + own);
            *e = (*e).min(longest);
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
        let held = set.len() as u64;
        if set.is_empty() {
            table.keys.remove(key);
        }
        LeaseState { acquired, held }
    }

    fn renew(&self, key: &str, token: &str, lease: Duration) -> bool {
        let now = Instant::now();
        let mut table = self.lock();
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
/// 2^53, the largest their doubles hold exactly (`whole` in `lua/lib.lua`).
const MAX_WHOLE: u64 = 1 << 53;

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
        let l = Leases::default();
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
        let l = Leases::default();
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
        let l = Leases::default();
        for i in 0..5000 {
            l.acquire(&format!("k{i}"), "t", 1, SEC);
        }
        tokio::time::advance(SEC).await;
        for i in 0..5000 {
            l.acquire(&format!("n{i}"), "t", 1, SEC);
        }
        assert!(l.len() <= 5000 + MIN_SWEEP, "{}", l.len());
    }
}
