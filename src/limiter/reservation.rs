//! Local reservations of a hot key's units: see
//! [`LimiterBuilder::local_reservation`](super::LimiterBuilder::local_reservation)
//! for what they guarantee.
//!
//! Per key, a [`Slot`] holds the units this instance reserved (spent in the
//! store already) and the end of the window they belong to, by this
//! process's clock. A request takes its cost from the slot without a store
//! call. The request that leaves it below a quarter of `n` starts a refill
//! in the background ([`refill_behind`]), so that a busy key rarely runs
//! dry: requests go on spending what is left meanwhile. One that finds too
//! little waits for the slot's single flight (one reserve call at a time per
//! key, refills included), then looks again, and shares the flight's denial
//! or error rather than asking again.

use std::{
    fmt,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use quick_cache::sync::Cache;
use tokio::time::Instant;

use super::{Inner, deciding::ProbeGuard};
use crate::{
    Decision, Error, LimitState,
    breaker::Pass,
    decision::Stamp,
    metrics,
    store::{LimitCheck, Reservation, Store},
};

/// How many keys hold a live reservation at most, per limiter. Evicting a
/// key only drops its unspent units (an under-admission).
pub(crate) const RESERVED_KEYS: usize = 10_000;

/// The reservations of one limiter (its lone limit).
pub(super) struct Reservations {
    /// Units to reserve per store call.
    n: u64,
    slots: Cache<String, Arc<Slot>>,
}

impl fmt::Debug for Reservations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservations")
            .field("n", &self.n)
            .field("keys", &self.slots.len())
            .finish()
    }
}

/// One key's reservation and its single flight.
#[derive(Default)]
struct Slot {
    pool: Mutex<Pool>,
    /// Held by the one request calling the store for this key.
    flight: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Pool {
    /// Units reserved and not yet spent.
    units: u64,
    /// When they stop being spent: at or before the store's window ends.
    end: Option<Instant>,
    /// What the store had left after the last reservation.
    left: u64,
    /// Reserve calls finished, and how the last one ended.
    flights: u64,
    last: Option<Outcome>,
    /// A refill is on its way (at most one per key).
    refilling: bool,
}

/// How a finished flight ended, for the requests that waited on it.
enum Outcome {
    Granted,
    /// The store had `left` units; the denial, and when it was made.
    Denied(u64, Decision, Instant),
    Failed(Error),
}

impl Pool {
    /// Forgets units whose window has ended; whether any are live.
    fn live(&mut self, now: Instant) -> bool {
        match self.end {
            Some(end) if end > now => true,
            _ => {
                self.units = 0;
                self.end = None;
                false
            }
        }
    }

    /// Takes `cost` (> 0) from the reservation if it holds that much: the
    /// state to report (its `reset` is the reservation's end, which a
    /// refund uses to find it again).
    fn take(&mut self, cost: u64, now: Instant) -> Option<LimitState> {
        if !self.live(now) || self.units < cost {
            return None;
        }
        self.units -= cost;
        self.peek(now)
    }

    /// Adds a grant of `r.granted` units, `cost` of them spent at once by
    /// the request that asked, reserved by a call sent at `sent`: the state
    /// that request reports. Units left from before are kept, but never
    /// past either window.
    fn grant(&mut self, r: &Reservation, cost: u64, sent: Instant) -> LimitState {
        let now = Instant::now();
        let end = sent + Duration::from_millis(r.window_left_ms);
        let end = match self.live(now) && self.units > 0 {
            true => self.end.map_or(end, |old| old.min(end)),
            false => end,
        };
        self.left = r.remaining;
        self.units += r.granted - cost;
        self.end = Some(end);
        let mut state = LimitState {
            allowed: true,
            remaining: self.units.saturating_add(r.remaining),
            reset_ms: end.saturating_duration_since(now).as_millis() as u64,
            retry_ms: 0,
        };
        if end <= now {
            // The window ended before the answer arrived: admitted (the
            // units were spent in it), but nothing is kept.
            self.units = 0;
            state.reset_ms = 0;
        }
        state
    }

    /// The state a request admitted now would report: `remaining` is the
    /// units held here plus what the store had left at the last reservation.
    fn peek(&self, now: Instant) -> Option<LimitState> {
        let end = self.end?;
        Some(LimitState {
            allowed: true,
            remaining: self.units.saturating_add(self.left),
            reset_ms: end.saturating_duration_since(now).as_millis() as u64,
            retry_ms: 0,
        })
    }
}

impl Reservations {
    pub(super) fn new(n: u64) -> Self {
        Self {
            n,
            slots: Cache::new(RESERVED_KEYS),
        }
    }

    fn slot(&self, key: &str) -> Arc<Slot> {
        if let Some(slot) = self.slots.get(key) {
            return slot;
        }
        let slot = Arc::new(Slot::default());
        // Another request may have inserted one meanwhile: use that one.
        match self.slots.get_or_insert_with(key, || Ok::<_, ()>(slot)) {
            Ok(slot) => slot,
            Err(()) => unreachable!("the slot constructor cannot fail"),
        }
    }

    fn pool<'a>(slot: &'a Slot) -> MutexGuard<'a, Pool> {
        // The pool's invariants hold between statements: a poisoned lock
        // (a panic elsewhere) leaves it consistent.
        slot.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Spends `cost` from `key`'s reservation without a store call, if it
    /// holds that much in a live window; and whether this request is the
    /// one to start a refill ([`refill_behind`]): it left fewer than a
    /// quarter of `n` units and no refill is on its way.
    pub(super) fn take(&self, key: &str, cost: u64) -> Option<(LimitState, bool)> {
        let slot = self.slots.get(key)?;
        let mut pool = Self::pool(&slot);
        let state = pool.take(cost, Instant::now())?;
        let refill = pool.units < self.low_water() && !pool.refilling;
        pool.refilling |= refill;
        Some((state, refill))
    }

    /// Below this many units, a key is refilled ahead of need: a quarter of
    /// `n`, at least 1.
    fn low_water(&self) -> u64 {
        (self.n / 4).max(1)
    }

    /// What a request of `cost` would get from `key`'s reservation now,
    /// spending nothing (for a peek).
    pub(super) fn peek(&self, key: &str, cost: u64) -> Option<LimitState> {
        let slot = self.slots.get(key)?;
        let mut pool = Self::pool(&slot);
        let now = Instant::now();
        if !pool.live(now) || pool.units < cost {
            return None;
        }
        pool.peek(now)
    }

    /// Gives `cost` back to `key`'s reservation if it holds units of the
    /// window that ends (locally) at `end`: a reservation of the same
    /// window ends within the reserve calls' latency of it, one of a later
    /// window a whole window later, so `half_window` tells them apart.
    /// False if there is none (the caller refunds the store instead).
    pub(super) fn give_back(
        &self,
        key: &str,
        cost: u64,
        end: Instant,
        half_window: Duration,
    ) -> bool {
        let Some(slot) = self.slots.get(key) else {
            return false;
        };
        let mut pool = Self::pool(&slot);
        let Some(held) = pool.end.filter(|_| pool.live(Instant::now())) else {
            return false;
        };
        let apart = held.max(end) - held.min(end);
        if apart >= half_window {
            return false;
        }
        pool.units = pool.units.saturating_add(cost);
        true
    }

    /// Drops `key`'s reservation (a reset): its units are not spent.
    pub(super) fn drop_key(&self, key: &str) {
        if let Some(slot) = self.slots.get(key) {
            *Self::pool(&slot) = Pool::default();
        }
        self.slots.remove(key);
    }
}

impl Inner {
    /// The decision of a request admitted from a reservation.
    pub(super) fn reserved_decision(&self, state: LimitState, cost: u64) -> Decision {
        let d = Decision::new([state], self.policies.clone())
            .with_spent(cost, Stamp::Local(Instant::now()));
        metrics::decision(&d, true);
        tracing::trace!(
            limit = d.policy(),
            "rate limit: admitted from the local reservation"
        );
        d
    }
}

/// A request of `cost` (> 0) that found too little in its key's
/// reservation: waits for the key's single flight, looks again, and if
/// still short and no flight it waited on answered for it, reserves.
pub(super) async fn reserving(
    inner: Arc<Inner>,
    store: Arc<dyn Store>,
    check: LimitCheck,
    cost: u64,
    cache_key: Option<String>,
) -> Result<Decision, Error> {
    let reservations = inner
        .reservations
        .as_ref()
        .expect("a limiter with reservations");
    let slot = reservations.slot(&check.key);
    let seen = Reservations::pool(&slot).flights;
    let _flight = slot.flight.lock().await;
    {
        let mut pool = Reservations::pool(&slot);
        let now = Instant::now();
        if let Some(state) = pool.take(cost, now) {
            drop(pool);
            return Ok(inner.reserved_decision(state, cost));
        }
        if pool.flights != seen {
            // A flight ended while this request waited: share its answer.
            match &pool.last {
                Some(Outcome::Denied(left, d, at)) if cost > *left => {
                    let d = d.clone().aged(now.saturating_duration_since(*at));
                    metrics::decision(&d, true);
                    return Ok(d);
                }
                Some(Outcome::Failed(e)) => {
                    metrics::store_error(std::iter::once(inner.policies.name(0)));
                    return Err(copy(e));
                }
                _ => {}
            }
        }
    }
    let pass = inner.breaker.pass();
    if pass == Pass::Open {
        metrics::store_error(std::iter::once(inner.policies.name(0)));
        return Err(Error::CircuitOpen);
    }
    let probe = ProbeGuard {
        inner: inner.clone(),
        pass,
        settled: false,
    };
    let want = reservations.n.max(cost);
    // The window ends `window_left_ms` after Redis ran the script, which
    // was after this instant: counting from here ends the local units first.
    let sent = Instant::now();
    let reply = probe.call(store.reserve(check, cost, want)).await;
    let mut pool = Reservations::pool(&slot);
    pool.flights += 1;
    let r = match reply {
        Ok(r) => r,
        Err(e) => {
            pool.last = Some(Outcome::Failed(copy(&e)));
            return Err(e);
        }
    };
    if r.granted < cost {
        // Nothing taken: a denial until the window ends, as the store
        // would give it.
        pool.left = r.remaining;
        let state = LimitState {
            allowed: false,
            remaining: r.remaining,
            reset_ms: r.window_left_ms,
            retry_ms: r.window_left_ms,
        };
        let d = inner.conclude([state].into(), cost, cache_key, Some(Stamp::Local(sent)))?;
        pool.last = Some(Outcome::Denied(r.remaining, d.clone(), Instant::now()));
        return Ok(d);
    }
    let state = pool.grant(&r, cost, sent);
    pool.last = Some(Outcome::Granted);
    drop(pool);
    inner.conclude(
        [state].into(),
        cost,
        None,
        Some(Stamp::Local(Instant::now())),
    )
}

/// Starts refilling `check`'s key in the background, for the request that
/// [`Reservations::take`] named: `n` more units, so that a busy key is
/// topped up before it runs dry and its requests need not wait. Without a
/// Tokio runtime to run it, nothing is refilled ahead (requests then
/// reserve as they run short, as ever).
pub(super) fn refill_behind(inner: &Arc<Inner>, store: &Arc<dyn Store>, check: &LimitCheck) {
    let refilling = Refilling {
        inner: inner.clone(),
        key: check.key.clone(),
    };
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(refill(refilling, store.clone(), check.clone()));
    }
}

/// A refill on its way: clears the key's `refilling` flag when it ends,
/// or is dropped unfinished (a runtime shutting down).
struct Refilling {
    inner: Arc<Inner>,
    key: String,
}

impl Drop for Refilling {
    fn drop(&mut self) {
        if let Some(slot) = self
            .inner
            .reservations
            .as_ref()
            .and_then(|r| r.slots.get(&self.key))
        {
            Reservations::pool(&slot).refilling = false;
        }
    }
}

/// One refill: in the key's single flight, reserves `n` more units (so a
/// key holds fewer than `n + n / 4`), if the breaker lets it. A denial goes
/// to the deny cache, for the requests that run short next. An error keeps
/// nothing and answers no one: requests that then run short reserve
/// themselves and get the store's answer (the breaker and the metrics have
/// recorded it).
async fn refill(refilling: Refilling, store: Arc<dyn Store>, check: LimitCheck) {
    let inner = refilling.inner.clone();
    let reservations = inner
        .reservations
        .as_ref()
        .expect("a limiter with reservations");
    let slot = reservations.slot(&check.key);
    let _flight = slot.flight.lock().await;
    {
        let mut pool = Reservations::pool(&slot);
        if pool.live(Instant::now()) && pool.units >= reservations.low_water() {
            return; // refilled meanwhile, by a request that ran short
        }
    }
    let pass = inner.breaker.pass();
    if pass == Pass::Open {
        return;
    }
    let probe = ProbeGuard {
        inner: inner.clone(),
        pass,
        settled: false,
    };
    let sent = Instant::now();
    let key = check.key.clone();
    if let Ok(r) = probe.call(store.reserve(check, 1, reservations.n)).await {
        let mut pool = Reservations::pool(&slot);
        pool.left = r.remaining;
        if r.granted > 0 {
            pool.grant(&r, 0, sent);
        } else if let Some(cache) = &inner.deny_cache {
            // The store is spent: the requests that run short next are
            // denied from the deny cache, as after any denial, rather than
            // each asking again.
            let state = LimitState {
                allowed: false,
                remaining: r.remaining,
                reset_ms: r.window_left_ms,
                retry_ms: r.window_left_ms,
            };
            let d =
                Decision::new([state], inner.policies.clone()).with_spent(1, Stamp::Local(sent));
            cache.insert(key, 1, &d);
        }
    }
}

/// The same error, for each request that waited on a failed flight.
fn copy(e: &Error) -> Error {
    match e {
        Error::Redis(e) => Error::Redis(e.clone()),
        Error::Pool(s) => Error::Pool(s.clone()),
        Error::Timeout(d) => Error::Timeout(*d),
        Error::CircuitOpen => Error::CircuitOpen,
        Error::UnexpectedReply(s) => Error::UnexpectedReply(s.clone()),
        Error::Unsupported(s) => Error::Unsupported(s),
        other => Error::UnexpectedReply(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `key` holding `units` until `ms` from now, as a grant leaves it.
    fn holding(r: &Reservations, key: &str, units: u64, ms: u64) {
        let slot = r.slot(key);
        let mut pool = Reservations::pool(&slot);
        pool.units = units;
        pool.end = Some(Instant::now() + Duration::from_millis(ms));
        pool.left = 50;
    }

    #[tokio::test(start_paused = true)]
    async fn units_are_spent_only_while_their_window_lasts() {
        let r = Reservations::new(10);
        assert!(r.take("k", 1).is_none());
        holding(&r, "k", 3, 1_000);
        let (state, _) = r.take("k", 2).unwrap();
        assert_eq!((state.remaining, state.reset_ms), (51, 1_000));
        assert!(r.take("k", 2).is_none(), "only 1 held");
        assert!(r.peek("k", 1).is_some());
        tokio::time::advance(Duration::from_millis(1_000)).await;
        assert!(r.take("k", 1).is_none(), "the window ended");
        assert!(r.peek("k", 1).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_refund_goes_back_only_to_a_reservation_of_its_window() {
        let r = Reservations::new(10);
        holding(&r, "k", 0, 10_000);
        let end = Instant::now() + Duration::from_millis(10_000);
        let half = Duration::from_millis(5_000);
        // Same window, measured a few ms apart: given back.
        assert!(r.give_back("k", 2, end - Duration::from_millis(3), half));
        assert_eq!(r.take("k", 2).unwrap().0.remaining, 50);
        // A window that ended before this one: not.
        assert!(!r.give_back("k", 1, end - Duration::from_millis(9_000), half));
        // No reservation: not.
        r.drop_key("k");
        assert!(!r.give_back("k", 1, end, half));
        assert!(r.take("k", 1).is_none());
    }
}
