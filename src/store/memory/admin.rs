//! The memory store's `Store` impl, and its peek, refund and reset: the
//! peek script (decide.lua keeping no spend), `lua/refund.lua` and
//! `lua/reset.lua`, in Rust.

use std::sync::MutexGuard;

use smallvec::SmallVec;

use super::{
    KeyId, MemoryStore,
    algorithms::{Entry, Now, Packed},
    ascending, locked_shard,
    shards::Shard,
};
use crate::{
    Algorithm, Error, Quota,
    store::{BoxFuture, LimitCheck, LimitState, Refund, Store},
};

impl Store for MemoryStore {
    fn decide(
        &self,
        checks: Vec<LimitCheck>,
        cost: u64,
    ) -> BoxFuture<'static, Result<Vec<LimitState>, Error>> {
        let states = self.decide_now(checks, cost);
        Box::pin(std::future::ready(Ok(states)))
    }

    fn instance(&self) -> Option<usize> {
        Some(std::sync::Arc::as_ptr(&self.inner) as *const () as usize)
    }

    fn peek(
        &self,
        checks: Vec<LimitCheck>,
        cost: u64,
    ) -> BoxFuture<'static, Result<Vec<LimitState>, Error>> {
        Box::pin(std::future::ready(Ok(self.peek_now(&checks, cost))))
    }

    fn refund(&self, refunds: Vec<Refund>) -> BoxFuture<'static, Result<(), Error>> {
        let now = self.now().us as i64;
        let credits: Vec<_> = refunds
            .iter()
            .map(|r| Credit {
                key: r.key.as_bytes(),
                quota: r.quota,
                cost: r.cost,
                end_us: now.saturating_add(r.window_end_in_ms.saturating_mul(1000)),
                exact: false,
            })
            .collect();
        self.refund_now(&credits);
        Box::pin(std::future::ready(Ok(())))
    }

    fn reset(&self, keys: Vec<String>) -> BoxFuture<'static, Result<(), Error>> {
        self.reset_now(&keys);
        Box::pin(std::future::ready(Ok(())))
    }
}

/// One limit's refund, with its window's end on the store's own clock (µs;
/// past once it has ended): for GCRA, the TAT the spend left, rounded up to
/// the µs ([`Ends`](crate::decision::Ends)); the credit takes more than
/// `end - 1` µs to be outstanding (never over what is, short of it by
/// under a µs), as refund.lua does. Through [`Store::refund`] (whole ms from now, as the trait
/// takes it), what the caller measured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Credit<'a> {
    pub(crate) key: &'a [u8],
    pub(crate) quota: Quota,
    pub(crate) cost: u64,
    pub(crate) end_us: i64,
    /// `end_us` is the store's own, from the decision (a limiter's refund),
    /// not a caller's measure: a fixed or sliding window is the spent one
    /// only if it ends then, to the ms.
    pub(crate) exact: bool,
}

impl Credit<'_> {
    /// The window's end, in the store's ms.
    fn end_ms(&self) -> i64 {
        self.end_us.div_euclid(1000)
    }
}

impl MemoryStore {
    /// Whether `cost` would be admitted now by every limit, spending
    /// nothing: the states a check would report, before spending.
    pub(crate) fn peek_now(&self, checks: &[LimitCheck], cost: u64) -> Vec<LimitState> {
        self.decide_all(checks, cost, false).0
    }

    /// Gives back each credit's cost to the window it names, if that window
    /// still holds it; never below zero. All in one step, as `refund.lua`:
    /// every credit's shard is locked (in ascending order, as a decision of
    /// several limits locks them) before any is credited.
    ///
    /// Credited one shard after the other, a decision could see one limit
    /// credited and another not, which no Redis shows. Crediting only adds
    /// room, so such a decision's admission is one the refund's before or
    /// after would make too; but a credit and a spend do not commute when
    /// the credit is more than the window still holds (it stops at zero: a
    /// window begun by a reset, a burst lowered since), so the state it
    /// left could admit past a limit. With limits A (1/h, used up) and B
    /// (2/h, 1 used), and a refund crediting A 1 and B 2: a decision
    /// between the credits sees A credited and B not, is admitted, spends B
    /// to 2, which B's credit then takes to 0, so B admits 2 more, 3 in
    /// all where Redis (either order) allows 2.
    pub(crate) fn refund_now(&self, credits: &[Credit<'_>]) {
        let ids: SmallVec<[_; 4]> = credits.iter().map(|c| self.secret.id(c.key)).collect();
        let now = self.now();
        let (indices, mut locked) = self.lock_keys(&ids);
        for (c, &id) in credits.iter().zip(&ids) {
            let shard = locked_shard(&mut locked, &indices, self.inner.index(id));
            let credited = match c.quota.algorithm() {
                Algorithm::SlidingWindow => refund_in(shard.long.get_mut(id), c, now),
                _ => refund_in(shard.short.get_mut(id), c, now),
            };
            // A credit can end an entry sooner (GCRA), or at once.
            if let Some(expires_ms) = credited {
                shard.expires_at(expires_ms);
            }
        }
    }

    /// Forgets `keys`' counters, all in one step, as `reset.lua`'s one
    /// `DEL`: every key's shard is locked (in ascending order, as a
    /// decision of several limits locks them) before any is reset, so no
    /// decision sees some of the keys reset and others not.
    pub(crate) fn reset_now<K: AsRef<[u8]>>(&self, keys: &[K]) {
        let ids: SmallVec<[_; 4]> = keys.iter().map(|k| self.secret.id(k.as_ref())).collect();
        let (indices, mut locked) = self.lock_keys(&ids);
        for id in ids {
            let shard = locked_shard(&mut locked, &indices, self.inner.index(id));
            // Marked expired: they read as absent, and are reclaimed as
            // expired entries are (a full shard sweeps them out).
            if let Some(e) = shard.short.get_mut(id) {
                e.expire();
                shard.expires_at(0);
            }
            if let Some(e) = shard.long.get_mut(id) {
                e.expire();
                shard.expires_at(0);
            }
        }
    }

    /// The shards of `ids`' keys ([`ascending`]: each once, ascending), all
    /// locked, in that order, for a change to every key in one step.
    fn lock_keys(&self, ids: &[KeyId]) -> (SmallVec<[usize; 4]>, Locked<'_>) {
        let at: SmallVec<[usize; 4]> = ids.iter().map(|&id| self.inner.index(id)).collect();
        let indices = ascending(&at);
        let locked = self.inner.lock_all(&indices);
        (indices, locked)
    }
}

/// Shards locked together ([`Shards::lock_all`](super::shards::Shards::lock_all)).
type Locked<'a> = SmallVec<[MutexGuard<'a, Shard>; 4]>;

/// Credits `c` to a live held entry; says when that entry now expires (at
/// once, marked expired, when the credit leaves nothing).
fn refund_in<const N: usize>(
    held: Option<&mut Packed<N>>,
    c: &Credit<'_>,
    now: Now,
) -> Option<u64> {
    let held = held?;
    if held.expires_ms() <= now.ms {
        return None;
    }
    match credit(held.unpack(c.quota), c, now) {
        Some(entry) => *held = Packed::pack(entry),
        None => held.expire(),
    }
    Some(held.expires_ms())
}

/// The entry after the credit; `None` when it is back to nothing (a fixed
/// window at 0 counts as absent, as in the script).
fn credit(entry: Entry, r: &Credit<'_>, now: Now) -> Option<Entry> {
    let window = r.quota.window_ms() as i64;
    // The spent window ends where the decision said, to the ms, on this
    // store's clock: a window begun after a reset (or an eviction) ends
    // later, though perhaps by a single ms, and is not credited (one begun
    // in the same ms cannot be told apart). A caller's measure (the
    // `Store` trait's whole ms from now) is only that close: windows of
    // one key that follow each other are a whole window apart, so within
    // half a window of it is the spent one.
    let half = (window / 2).max(1);
    let within = if r.exact { 1 } else { half };
    let same = |end: i64| (end - r.end_ms()).abs() < within;
    match entry {
        Entry::Fixed { count, expires_ms } => {
            if !same(expires_ms as i64) {
                return Some(entry);
            }
            let count = count.saturating_sub(r.cost);
            (count > 0).then_some(Entry::Fixed { count, expires_ms })
        }
        Entry::Sliding {
            s,
            mut c,
            mut p,
            expires_ms,
        } => {
            // The stored window, or the one before it (its count is `p`).
            let end = s as i64 + window;
            if same(end) {
                c = c.saturating_sub(r.cost);
            } else if same(end - window) {
                p = p.saturating_sub(r.cost);
            }
            Some(Entry::Sliding {
                s,
                c,
                p,
                expires_ms,
            })
        }
        Entry::Gcra { .. } => {
            if !matches!(r.quota.algorithm(), Algorithm::Gcra { .. }) {
                return Some(entry);
            }
            let (step, per_us) = r.quota.gcra_units();
            let per_ms = 1000 * u128::from(per_us);
            let now_l = u128::from(now.us) * u128::from(per_us);
            // A booking beyond a full bucket (a wider quota's) is credited
            // as it stands, as in the script: never shortened to a bucket.
            let ahead = entry.gcra_ahead(now_l, per_ms);
            // At most the spend, and at most what is still outstanding of it.
            // Saturating: an end long past (`i64::MIN`) is no credit, not
            // an overflow.
            // The end is the spend's TAT rounded up to the whole µs: more
            // than `left_us - 1` µs of it is outstanding, and perhaps not
            // all of `left_us` (as in refund.lua, which credits the same).
            let left_us = r.end_us.saturating_sub(now.us as i64).max(0) as u128;
            let outstanding = match left_us {
                0 => 0,
                left => (left - 1) * u128::from(per_us) + 1,
            };
            let back = (u128::from(r.cost) * u128::from(step)).min(outstanding);
            let ahead = ahead.saturating_sub(back);
            if ahead == 0 {
                return None;
            }
            Some(Entry::gcra_at(now_l + ahead, per_ms))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn gcra(burst: u64) -> Quota {
        "1/1s".parse::<Quota>().unwrap().gcra(burst).unwrap()
    }

    fn check(store: &MemoryStore, key: &str, quota: Quota, cost: u64) -> LimitState {
        let check = LimitCheck {
            key: key.into(),
            quota,
            shadow: false,
        };
        store.decide_now(vec![check], cost)[0]
    }

    /// A GCRA credit comes off the booking as it stands, as in `refund.lua`:
    /// a key booked 100 s ahead (by a burst of 100), credited one unit under
    /// a burst of 1, is 99 s ahead, not an empty bucket: the narrow quota
    /// still waits for it, and the wide one gets one unit back, no more.
    #[tokio::test(start_paused = true)]
    async fn a_gcra_credit_comes_off_a_wider_booking_as_it_stands() {
        let store = MemoryStore::new();
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(check(&store, "k", gcra(100), 100).allowed);
        let refund = Refund {
            key: "k".into(),
            quota: gcra(1),
            cost: 1,
            window_end_in_ms: 100_000,
            spend_ends_at_us: None,
        };
        Store::refund(&store, vec![refund]).await.unwrap();
        let s = check(&store, "k", gcra(1), 1);
        assert!(!s.allowed, "{s:?}");
        assert!(check(&store, "k", gcra(100), 1).allowed);
        assert!(!check(&store, "k", gcra(100), 1).allowed);
    }

    /// A GCRA credit whose spend ended before the clock's epoch, however
    /// long before (`i64::MIN`, as an absurd `window_end_in_ms` saturates
    /// to), credits nothing, as in the script: not an overflow (a panic in
    /// a debug build, the whole spend credited in a release one).
    #[tokio::test(start_paused = true)]
    async fn a_gcra_credit_of_a_spend_ended_long_ago_credits_nothing() {
        let store = MemoryStore::new();
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(check(&store, "k", gcra(2), 1).allowed);
        store.refund_now(&[Credit {
            key: b"k",
            quota: gcra(2),
            cost: 1,
            end_us: i64::MIN,
            exact: false,
        }]);
        assert_eq!(check(&store, "k", gcra(2), 0).remaining, 1);
    }

    /// Fails crediting the rounded-up spend end whole: a unit is 1/3 µs
    /// here, and a spend that ends 1/3 µs into its last µs got up to 2/3
    /// µs (2 units) more back than was outstanding, so a request 1/3 µs
    /// too early was admitted. refund.lua credits `(left - 1) µs + 1 unit`.
    #[tokio::test(start_paused = true)]
    async fn a_gcra_credit_gives_back_no_more_than_the_rounded_spend_end_allows() {
        let store = MemoryStore::new();
        let q = "3/1s".parse::<Quota>().unwrap().gcra(2).unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        let (a, a_end) = store.decide_one(b"k", q, 1);
        assert!(a.allowed);
        assert_eq!(a_end, 1_333_334, "A ends 1/3 µs into its last µs");
        assert!(check(&store, "k", q, 1).allowed);
        tokio::time::advance(Duration::from_millis(1)).await;
        store.refund_now(&[Credit {
            key: b"k",
            quota: q,
            cost: 1,
            end_us: a_end as i64,
            exact: false,
        }]);
        assert!(check(&store, "k", q, 1).allowed);
        // The next unit fits 1,334,333 1/3 µs in: the first whole µs is
        // 1,334,334.
        tokio::time::advance(Duration::from_micros(333_333)).await;
        let early = check(&store, "k", q, 1);
        assert!(!early.allowed, "{early:?}");
        tokio::time::advance(Duration::from_micros(1)).await;
        assert!(check(&store, "k", q, 1).allowed);
    }

    /// A reset of several keys is one step, as `reset.lua`'s one `DEL`:
    /// while one key's shard is held (by this test, standing for a
    /// decision of several limits), the reset of another key, in another
    /// shard and first in the reset, waits too. It once locked one key's
    /// shard after the other, so a decision could see the first limit
    /// reset and the second not.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_reset_of_several_keys_is_one_step() {
        let store = MemoryStore::new();
        let (first, second, quota) = first_after_second(&store);
        let held = store
            .inner
            .lock(store.inner.index(store.secret.id(second.as_bytes())));
        let resetting = spawn_until_blocked({
            let (store, keys) = (store.clone(), [first.clone(), second.to_owned()]);
            move || store.reset_now(&keys)
        });
        assert!(live(&store, &first), "the first key was reset alone");
        drop(held);
        resetting.join().unwrap();
        assert!(check(&store, &first, quota, 1).allowed);
        assert!(check(&store, second, quota, 1).allowed);
    }

    /// Two keys whose "1/1h" windows are spent, the first in a shard after
    /// the second's: locking in ascending order, an operation on both
    /// (a reset, a refund) that holds every shard first waits on the
    /// second's, having touched nothing.
    #[cfg(target_os = "linux")]
    fn first_after_second(store: &MemoryStore) -> (String, &'static str, Quota) {
        let shard = |key: &str| store.inner.index(store.secret.id(key.as_bytes()));
        let second = "second";
        let first = (0..)
            .map(|i| format!("first{i}"))
            .find(|key| shard(key) > shard(second))
            .unwrap();
        let quota = Quota::per_hour(1);
        assert!(check(store, &first, quota, 1).allowed);
        assert!(check(store, second, quota, 1).allowed);
        (first, second, quota)
    }

    /// Whether `key` holds a live fixed window or GCRA entry (locking its
    /// shard).
    #[cfg(target_os = "linux")]
    fn live(store: &MemoryStore, key: &str) -> bool {
        let id = store.secret.id(key.as_bytes());
        let now = store.now().ms;
        let mut shard = store.inner.lock(store.inner.index(id));
        shard
            .short
            .get_mut(id)
            .is_some_and(|e| e.expires_ms() > now)
    }

    /// Runs `f` on a thread of its own, and returns once that thread
    /// sleeps (its state in `/proc`, `S`): the test's only thread that can
    /// block, blocked on the one lock the test holds. A deterministic
    /// signal that it got as far as it can, where a sleep of a guessed
    /// length is only a likely one.
    #[cfg(target_os = "linux")]
    fn spawn_until_blocked<T: Send + 'static>(
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let me = std::fs::read_link("/proc/thread-self").unwrap();
            tx.send(format!("/proc/{}/stat", me.display())).unwrap();
            f()
        });
        let stat = rx.recv().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read_to_string(&stat).unwrap();
            // "tid (comm) S ...": the state follows the command's ')'.
            let state = text[text.rfind(')').unwrap() + 1..].trim_start();
            if state.starts_with('S') {
                return thread;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never blocked: {text}"
            );
            std::thread::yield_now();
        }
    }

    /// A refund of several keys is one step, as `refund.lua` is: while one
    /// key's shard is held (by this test, standing for a decision of
    /// several limits), the refund of another key, in another shard and
    /// first in the refund, waits too. It once credited one key's shard
    /// after the other, so a decision could see one limit credited and
    /// the other not: a state no Redis could show, which (with a credit
    /// of more than the window still holds, as after a reset) admitted
    /// past a limit (see `refund_now`).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_refund_of_several_keys_is_one_step() {
        let store = MemoryStore::new();
        let (first, second, quota) = first_after_second(&store);
        let held = store
            .inner
            .lock(store.inner.index(store.secret.id(second.as_bytes())));
        let refunding = spawn_until_blocked({
            let (store, first) = (store.clone(), first.clone());
            move || {
                // The windows' end, an hour after they began.
                let end_us = store.now().us as i64 + 3_600_000_000;
                let credit = |key| Credit {
                    key,
                    quota,
                    cost: 1,
                    end_us,
                    exact: false,
                };
                store.refund_now(&[credit(first.as_bytes()), credit(b"second")]);
            }
        });
        assert!(live(&store, &first), "the first key was credited alone");
        drop(held);
        refunding.join().unwrap();
        assert!(check(&store, &first, quota, 1).allowed);
        assert!(check(&store, second, quota, 1).allowed);
    }
}
