//! Local reservations of a hot key's units: see
//! [`LimiterBuilder::local_reservation`](super::LimiterBuilder::local_reservation)
//! for what they guarantee.
//!
//! Per key, a [`Pool`] (in the limiter's [`Slots`]) holds the units this
//! instance reserved (spent in the store already) and the end of the window
//! they belong to, by this process's clock. A request takes its cost from
//! the pool without a store call, under one lock. The request that leaves
//! it below a quarter of `n` starts a refill
//! in the background ([`refill_behind`]), so that a busy key rarely runs
//! dry: requests go on spending what is left meanwhile. Every reserve call
//! asks for what tops the key up to `n` (a request's for its cost at least),
//! and notes it in the pool while on its way, so a key never holds more
//! than `n` units, but for a gone request's cost ([`Awaiting`]); and none
//! is made in a window's last stretch ([`Pool::ending`]). One that finds
//! too little waits for the slot's single flight (one reserve call at a
//! time per key, refills included), then looks again, and shares the
//! flight's denial or error rather than asking again.
//!
//! The limiter's timeout bounds all of it, counted from when the request
//! was asked: a request still waiting for the flight when it ends is
//! [`Error::Timeout`], and it waits for the reserve call it makes once it
//! holds the flight only what is left of it, so that requests queued behind a
//! slow store follow the store-error policy in time rather than each
//! waiting for the calls of those before it. A refill waits within one
//! timeout too.
//!
//! A reserve call, once sent, is not the request's to cancel: Redis spends
//! its units whether or not anyone reads the answer. So the call and its
//! write-back run in a task of their own ([`fly`]) that holds the key's
//! flight, and waits a whole timeout from sending for the answer; the
//! request waits for that task within its own timeout. A grant that
//! arrives after its request has gone (dropped by its client, or timed
//! out) is kept for the requests after it.

mod flight;
mod refill;

use std::{fmt, sync::Arc, time::Duration};

use tokio::{sync::oneshot, time::Instant};

use self::flight::{Awaiting, Back, ReserveCall, fly};
pub(super) use self::refill::refill_behind;
use super::{Inner, deciding::ProbeGuard, slots::Slots};
use crate::{
    Decision, Error, LimitState,
    breaker::Pass,
    decision::Stamp,
    deny_cache::Miss,
    metrics,
    store::{LimitCheck, Reservation, Store},
};

/// The reservations of one limiter (its lone limit).
pub(super) struct Reservations {
    /// Units to reserve per store call.
    n: u64,
    slots: Slots<Pool>,
}

impl fmt::Debug for Reservations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservations")
            .field("n", &self.n)
            .field("keys", &self.slots.len())
            .finish()
    }
}

/// What [`Reservations::take`] found for a request.
pub(super) enum Take {
    /// Spent from the reservation: the state to report, and whether this
    /// request starts a refill ([`refill_behind`]): it left fewer than a
    /// quarter of `n` units and no refill is on its way.
    Taken(LimitState, bool),
    /// Too little held: the request reserves ([`reserving`]).
    Short,
    /// The request is decided by the store as any check without
    /// reservations is, for one of two reasons.
    ///
    /// The key is new to a crowded map (one that has had to drop keys:
    /// more keys are in use than it holds). It is noted, and its next
    /// request reserves, if it comes while the key is still held (before a
    /// pass drops it): only a key hit again soon, a hot one, gets units, so
    /// a stream of cold keys costs what it would without reservations (a
    /// batched check each, not a reserve call each) and leaves no units
    /// unspent.
    ///
    /// Or the key is in its window's last stretch ([`Pool::ending`]).
    Unreserved,
}

/// One key's reservation; its single flight is the [`Slots`] entry's.
#[derive(Default)]
struct Pool {
    /// Units reserved and not yet spent.
    units: u64,
    /// When they stop being spent: at or before the store's window ends.
    end: Option<Instant>,
    /// What the store had left after the last reservation.
    left: u64,
    /// Reserve calls finished, and how the last one ended if it granted
    /// nothing (boxed: most keys never see one, and a held key's entry
    /// stays small).
    flights: u64,
    last: Option<Box<Outcome>>,
    /// A refill is on its way (at most one per key).
    refilling: bool,
    /// How much later than `end` the store's window ends, by this clock,
    /// in ms (saturated): the thousandth and the ms `end` leaves for the
    /// store's clock, and the reserve call's way back. What a decision
    /// reports as its reset is `end` plus this: the window's end the store
    /// would report, never early but for clock drift. (Kept beside
    /// `refilling`, in its padding: the entry stays the same size.)
    late_ms: u32,
    /// The units the reserve call on its way (the key's single flight)
    /// will add at most, the cost of the request it is for aside: what is
    /// held plus this stays within `n`.
    coming: u64,
    /// The latest the store's window of the last grant may end, by this
    /// process's clock (see [`Pool::ending`]).
    until: Option<Instant>,
}

/// How a finished flight that granted nothing ended, for the requests
/// that waited on it.
enum Outcome {
    /// The store had `left` units; the denial, and when it was made.
    Denied(u64, Decision, Instant),
    Failed(Error),
}

impl super::slots::Holds for Pool {
    /// Units still to be spent: a pass drops such a key last.
    fn holds(&self, now: Instant) -> bool {
        self.units > 0 && self.end.is_some_and(|end| end > now)
    }
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

    /// Whether the key is in its window's last stretch: its units have
    /// stopped being spent (`end`, at or before the store's window ends),
    /// and the store's window may still run (`until`). Nothing is reserved
    /// then, as units reserved now would be spent in the same window as
    /// those that expired unspent, which can be up to `n`: requests are
    /// decided by the store as without reservations
    /// ([`Take::Unreserved`]), and a
    /// reserve call answered then keeps no units. That keeps what an
    /// instance leaves unspent within `n` per window. The stretch lasts
    /// from about a thousandth of the window (and a few ms, and a reserve
    /// call's round trip) before the store's end to as long after it.
    fn ending(&mut self, now: Instant) -> bool {
        !self.live(now) && self.until.is_some_and(|until| now < until)
    }

    /// The units held in a live window (none once it ended).
    fn held(&mut self, now: Instant) -> u64 {
        self.live(now);
        self.units
    }

    /// Takes `cost` (> 0) from the reservation if it holds that much: the
    /// state to report (its `reset` is the store's window's end, within
    /// half a window of the reservation's, by which a refund finds it
    /// again).
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
        // reserve.lua reports a window's time left as its PTTL + 1 ms (a
        // key lives through the tick its expiry names), which it may fall
        // short of by up to a ms, as the call ran within its tick: one ms
        // less, the PTTL, is what is sure (a key in its last ms keeps
        // nothing). And Redis ends the window on its own clock: a host clock
        // that runs fast (NTP lets one drift by up to 500 ppm) ends it
        // sooner than ours measures, so the units stop a thousandth of it
        // early.
        let sure = r.window_left_ms.saturating_sub(1);
        let left = sure - sure / 1000;
        let end = sent + Duration::from_millis(left);
        if self.ending(now) {
            // Admitted, the units spent in the store, but none kept: see
            // [`Pool::ending`]. Nor is the stretch made longer: an answer
            // from the store's next window (a call it ran after the end)
            // would otherwise keep reservations off for that whole window.
            self.left = r.remaining;
            return LimitState {
                allowed: true,
                remaining: r.remaining,
                reset_ms: r.window_left_ms,
                retry_ms: 0,
            };
        }
        // The latest the store's window ends by this clock: the script ran
        // before now, and the store's clock may run slow by 1,000 ppm (its
        // `wl` ms may take `wl / 0.999` of ours).
        let wl = r.window_left_ms;
        let until = now + Duration::from_millis(wl.saturating_add(wl / 999 + 2));
        self.until = Some(self.until.map_or(until, |u| u.max(until)));
        let end = match self.live(now) && self.units > 0 {
            true => self.end.map_or(end, |old| old.min(end)),
            false => end,
        };
        self.left = r.remaining;
        self.units += r.granted - cost;
        self.end = Some(end);
        // The store's window ends `wl` after it ran the script, which was
        // before now: reported from now, it is late by at most the answer's
        // way, never early (but for clock drift), as the store reports it.
        let reset = now + Duration::from_millis(wl);
        let late = reset.saturating_duration_since(end).as_millis();
        self.late_ms = u32::try_from(late).unwrap_or(u32::MAX);
        let mut state = LimitState {
            allowed: true,
            remaining: self.units.saturating_add(r.remaining),
            reset_ms: wl,
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

    /// Gives `units` back if the pool holds units of the window that ends
    /// (locally) at `end`: a reservation of the same window ends within the
    /// reserve calls' latency of it, one of a later window a whole window
    /// later, so `half_window` tells them apart. False if it holds none of
    /// that window, or if the pool would then hold more than `room` units,
    /// those on their way counted.
    fn give_back(&mut self, units: u64, end: Instant, half_window: Duration, room: u64) -> bool {
        let now = Instant::now();
        if self.units.saturating_add(self.coming).saturating_add(units) > room {
            return false;
        }
        // A window over here is over: what the pool holds now (once a
        // reserve call that Redis ran late, in the next window, answered)
        // is a later window's, however near its end.
        if end <= now {
            return false;
        }
        let Some(held) = self.end.filter(|_| self.live(now)) else {
            return false;
        };
        let apart = held.max(end) - held.min(end);
        if apart >= half_window {
            return false;
        }
        self.units = self.units.saturating_add(units);
        true
    }

    /// The state a request admitted now would report: `remaining` is the
    /// units held here plus what the store had left at the last reservation.
    fn peek(&self, now: Instant) -> Option<LimitState> {
        let reset = self.end? + Duration::from_millis(self.late_ms.into());
        Some(LimitState {
            allowed: true,
            remaining: self.units.saturating_add(self.left),
            reset_ms: reset.saturating_duration_since(now).as_millis() as u64,
            retry_ms: 0,
        })
    }
}

impl Reservations {
    /// Reservations of `n` units, for at most about `keys` keys.
    pub(super) fn new(n: u64, keys: usize) -> Self {
        Self {
            n,
            slots: Slots::with_capacity(keys),
        }
    }

    /// Spends `cost` from `key`'s reservation without a store call, if it
    /// holds that much in a live window ([`Take::Taken`]); else whether the
    /// request reserves ([`Take::Short`]) or, `key` being new to a crowded
    /// map or in its window's last stretch, is decided by the store as
    /// without reservations ([`Take::Unreserved`]).
    pub(super) fn take(&self, key: &[u8], cost: u64) -> Take {
        let low = self.low_water();
        let taken = self.slots.with_or_note(key, |pool| {
            let now = Instant::now();
            if pool.ending(now) {
                return Take::Unreserved;
            }
            let Some(state) = pool.take(cost, now) else {
                return Take::Short;
            };
            let refill = pool.units < low && !pool.refilling;
            pool.refilling |= refill;
            Take::Taken(state, refill)
        });
        match taken {
            Ok(take) => take,
            Err(false) => Take::Short,
            Err(true) => Take::Unreserved,
        }
    }

    /// Below this many units, a key is refilled ahead of need: a quarter of
    /// `n`, at least 1.
    fn low_water(&self) -> u64 {
        (self.n / 4).max(1)
    }

    /// What a request of `cost` would get from `key`'s reservation now,
    /// spending nothing (for a peek).
    pub(super) fn peek(&self, key: &str, cost: u64) -> Option<LimitState> {
        let peeked = self.slots.with(key.as_bytes(), |pool| {
            let now = Instant::now();
            if !pool.live(now) || pool.units < cost {
                return None;
            }
            pool.peek(now)
        });
        peeked.flatten()
    }

    /// Gives `cost` back to `key`'s reservation if it holds units of the
    /// window that ends (locally) at `end` ([`Pool::give_back`]), and room
    /// for them: it never holds more than `n`. False if not (the caller
    /// refunds the store instead).
    pub(super) fn give_back(
        &self,
        key: &str,
        cost: u64,
        end: Instant,
        half_window: Duration,
    ) -> bool {
        let given = self.slots.with(key.as_bytes(), |pool| {
            pool.give_back(cost, end, half_window, self.n)
        });
        given.unwrap_or(false)
    }

    /// Drops `key`'s reservation (a reset): its units are not spent, and a
    /// flight on its way keeps nothing.
    pub(super) fn drop_key(&self, key: &str) {
        self.slots.remove(key.as_bytes());
    }
}

impl Inner {
    /// The decision of a request admitted from a reservation.
    pub(super) fn reserved_decision(&self, state: LimitState, cost: u64) -> Decision {
        let d = Decision::new([state], self.policies_here())
            .with_spent(cost, Stamp::Local(Instant::now()));
        metrics::decision(&d, true);
        tracing::trace!(
            limit = d.policy(),
            "rate limit: admitted from the local reservation"
        );
        d
    }
}

/// What a request that waited for its key's flight found.
enum Looked {
    Taken(LimitState),
    /// The flight it waited on was denied, for at least this cost.
    Denied(Decision),
    /// The flight it waited on failed.
    Failed(Error),
    /// Nothing to share: it reserves.
    Reserve,
}

/// A request of `cost` (> 0), asked at `asked`, that found too little in
/// its key's reservation: waits for the key's single flight, looks again,
/// and if still short and no flight it waited on answered for it,
/// reserves; all within its timeout, else [`Error::Timeout`].
///
/// Its reserve call and the call's write-back run in a task of their own
/// ([`fly`]), which holds the key's flight until the answer is kept: a
/// request that goes away (dropped, or its timeout ended) once the call
/// is sent loses none of the units Redis spends for it. The task waits a
/// whole timeout from sending for the answer, and a grant that arrives
/// after the request has gone stays in the reservation for the requests
/// after it, the request's own cost included ([`Awaiting`]).
///
/// Should the key's entry be dropped meanwhile (a reset), its write-backs
/// find a new flight or none and keep nothing: the request is answered all
/// the same, and the units it reserved are not spent (they may be of the
/// counter the reset deleted, so keeping them could over-admit). Requests
/// that waited on the dropped entry's flight then join the new entry's,
/// so that a reset costs at most one more reserve call per key.
pub(super) async fn reserving(
    inner: Arc<Inner>,
    store: Arc<dyn Store>,
    check: LimitCheck,
    cost: u64,
    cache_key: Option<Miss>,
    asked: Instant,
) -> Result<Decision, Error> {
    let reservations = inner
        .reservations
        .as_ref()
        .expect("a limiter with reservations");
    let slots = &reservations.slots;
    let key = check.key.clone().into_bytes();
    let (flight, guard) = loop {
        let (flight, seen) = slots.entry(&key, |pool| pool.flights);
        let Ok(guard) =
            tokio::time::timeout(inner.time_left(asked), flight.clone().lock_owned()).await
        else {
            return Err(timed_out(&inner));
        };
        let now = Instant::now();
        let looked = slots.with_flight(&key, &flight, |pool| {
            if let Some(state) = pool.take(cost, now) {
                return Looked::Taken(state);
            }
            if pool.flights != seen {
                // A flight ended while this request waited: share its answer.
                match pool.last.as_deref() {
                    Some(Outcome::Denied(left, d, at)) if cost > *left => {
                        return Looked::Denied(d.clone().aged(now.saturating_duration_since(*at)));
                    }
                    Some(Outcome::Failed(e)) => return Looked::Failed(copy(e)),
                    _ => {}
                }
            }
            Looked::Reserve
        });
        match looked {
            Some(Looked::Taken(state)) => return Ok(inner.reserved_decision(state, cost)),
            Some(Looked::Denied(d)) => {
                metrics::decision(&d, true);
                return Ok(d);
            }
            Some(Looked::Failed(e)) => {
                metrics::store_error(std::iter::once(inner.policies.metric_keys(0)));
                return Err(e);
            }
            Some(Looked::Reserve) => break (flight, guard),
            // The entry was dropped while this request waited (a reset: a
            // key in a flight is never evicted), and what its flight got
            // was kept nowhere. The request joins the key's new entry and
            // its single flight, rather than each waiter reserving for
            // itself a grant that no one would keep.
            None => continue,
        }
    };
    if inner.time_left(asked).is_zero() {
        // No time to wait for a call of its own: none is made.
        return Err(timed_out(&inner));
    }
    let domain = crate::breaker::domain(store.fault_domain(&check.key));
    let pass = inner.breaker.pass(domain);
    if pass == Pass::Open {
        metrics::store_error(std::iter::once(inner.policies.metric_keys(0)));
        return Err(Error::CircuitOpen);
    }
    let probe = ProbeGuard {
        inner: inner.clone(),
        domain,
        pass,
        settled: false,
        epoch: 0,
    };
    // Up to `n` in one call, or the cost if more: what tops the key up to
    // `n`, which it never holds more than. The cost alone in the window's
    // last stretch, which keeps nothing, or if the entry was dropped.
    let n = reservations.n;
    let want = slots.with_flight(&key, &flight, |pool| {
        let now = Instant::now();
        let want = if pool.ending(now) {
            cost
        } else {
            cost.max(n.saturating_sub(pool.held(now)))
        };
        pool.coming = want - cost;
        want
    });
    let want = want.unwrap_or(cost);
    let back = Back {
        inner: inner.clone(),
        key,
        flight,
        half_window: Duration::from_millis(check.quota.window_ms() / 2),
    };
    let (tx, rx) = oneshot::channel();
    let mut awaiting = Awaiting {
        rx,
        back: back.clone(),
    };
    let call = ReserveCall {
        back,
        store,
        probe,
        check,
        cost,
        want,
        cache_key,
        guard,
    };
    let flying = tracing::Instrument::in_current_span(fly(call, tx));
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn(flying)),
        // No runtime to spawn it on (the timer above needs one all the
        // same): in place.
        Err(_) => flying.await,
    }
    match tokio::time::timeout(inner.time_left(asked), &mut awaiting.rx).await {
        Ok(Ok(flown)) => flown.taken(&inner),
        // The task was dropped unanswered (a runtime shutting down).
        Ok(Err(_)) => Err(timed_out(&inner)),
        // Timed out. Closed first, so that the flight either answered
        // already (and its answer is this request's) or finds the request
        // gone: the request is counted once, by what it gets.
        Err(_) => {
            awaiting.rx.close();
            match awaiting.rx.try_recv() {
                Ok(flown) => flown.taken(&inner),
                Err(_) => Err(timed_out(&inner)),
            }
        }
    }
}

/// A request whose timeout ended before the store answered it:
/// [`Error::Timeout`], counted as a store error (as a shared one is).
fn timed_out(inner: &Inner) -> Error {
    metrics::store_error(std::iter::once(inner.policies.metric_keys(0)));
    Error::Timeout(inner.timeout)
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
        r.slots.entry(key.as_bytes(), |pool| {
            pool.units = units;
            pool.end = Some(Instant::now() + Duration::from_millis(ms));
            pool.left = 50;
        });
    }

    #[tokio::test(start_paused = true)]
    async fn units_are_spent_only_while_their_window_lasts() {
        let r = Reservations::new(10, super::super::slots::RESERVED_KEYS);
        assert!(matches!(r.take(b"k", 1), Take::Short));
        holding(&r, "k", 3, 1_000);
        let Take::Taken(state, _) = r.take(b"k", 2) else {
            panic!("3 held");
        };
        assert_eq!((state.remaining, state.reset_ms), (51, 1_000));
        assert!(matches!(r.take(b"k", 2), Take::Short), "only 1 held");
        assert!(r.peek("k", 1).is_some());
        tokio::time::advance(Duration::from_millis(1_000)).await;
        assert!(matches!(r.take(b"k", 1), Take::Short), "the window ended");
        assert!(r.peek("k", 1).is_none());
    }

    /// A grant's units stop a thousandth of the window before Redis's
    /// window ends by this process's clock, measured from before the call
    /// was sent: a Redis host whose clock runs fast by up to 1,000 ppm ends
    /// the window no sooner. But its decisions report the store's window's
    /// end, as the store would (counted from the answer): they reported the
    /// units' end, an hour's window 3.6 s early.
    #[tokio::test(start_paused = true)]
    async fn a_grant_ends_a_thousandth_of_its_window_early() {
        let mut pool = Pool::default();
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(2)).await;
        let state = pool.grant(&Reservation::new(10, 5, 3_600_000), 1, sent);
        assert_eq!(pool.end, Some(sent + Duration::from_millis(3_596_400)));
        assert_eq!(state.reset_ms, 3_600_000);
        tokio::time::advance(Duration::from_millis(600_000)).await;
        let state = pool.take(1, Instant::now()).unwrap();
        assert_eq!(state.reset_ms, 3_000_000);
    }

    /// A time left of 1 ms is a key in its last millisecond (reserve.lua
    /// reports the PTTL + 1), whose window Redis may end at once: the request
    /// that asked is admitted (its units were spent in that window), and
    /// nothing is kept.
    #[tokio::test(start_paused = true)]
    async fn a_grant_in_the_windows_last_millisecond_keeps_nothing() {
        let mut pool = Pool::default();
        let sent = Instant::now();
        let state = pool.grant(&Reservation::new(10, 0, 1), 1, sent);
        assert!(state.allowed);
        assert_eq!(state.reset_ms, 0);
        assert!(pool.take(1, Instant::now()).is_none());
        // Two ms left keep the units for one.
        let mut pool = Pool::default();
        let state = pool.grant(&Reservation::new(10, 0, 2), 1, sent);
        assert_eq!(state.reset_ms, 2, "the store's window's end");
        assert!(pool.take(1, Instant::now()).is_some());
    }

    /// Once a grant's units stop, until the store's window has surely
    /// ended, nothing is reserved: a request is decided by the store, and
    /// a grant answered then keeps no units (they would be the same
    /// window's, on top of those that stopped unspent).
    #[tokio::test(start_paused = true)]
    async fn nothing_is_reserved_in_a_windows_last_stretch() {
        let r = Reservations::new(10, super::super::slots::RESERVED_KEYS);
        let sent = Instant::now();
        r.slots.entry(b"k", |pool| {
            // Redis's window ends 1,000 ms on (its PTTL + 1): the units
            // stop at 999 ms, the window has surely ended at 1,003 ms.
            pool.grant(&Reservation::new(10, 5, 1_000), 1, sent);
        });
        tokio::time::advance(Duration::from_millis(998)).await;
        assert!(matches!(r.take(b"k", 1), Take::Taken(..)));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(matches!(r.take(b"k", 1), Take::Unreserved));
        // A reserve call answered now admits its request and keeps nothing.
        let sent = Instant::now();
        let (_, state) = r.slots.entry(b"k", |pool| {
            pool.grant(&Reservation::new(10, 5, 4), 1, sent)
        });
        assert!(state.allowed);
        assert!(matches!(r.take(b"k", 1), Take::Unreserved));
        // Nor does an answer from the store's next window (a call it ran
        // after the end) make the stretch last that whole window.
        tokio::time::advance(Duration::from_millis(2)).await;
        let sent = Instant::now();
        r.slots.entry(b"k", |pool| {
            pool.grant(&Reservation::new(1, 9, 1_001), 1, sent);
        });
        assert!(matches!(r.take(b"k", 1), Take::Unreserved));
        // Past the latest end: the key reserves again.
        tokio::time::advance(Duration::from_millis(2)).await;
        assert!(matches!(r.take(b"k", 1), Take::Short));
    }

    /// A refund of a window that has ended here never goes to the pool,
    /// even when the pool's window (a later one, reserved by a call Redis
    /// ran late) ends within half a window of it.
    #[tokio::test(start_paused = true)]
    async fn a_refund_of_an_ended_window_is_not_given_to_a_later_one() {
        let r = Reservations::new(10, super::super::slots::RESERVED_KEYS);
        holding(&r, "k", 0, 400);
        let half = Duration::from_millis(500);
        assert!(!r.give_back("k", 1, Instant::now(), half));
        assert!(!r.give_back("k", 1, Instant::now() - Duration::from_millis(100), half));
        assert!(matches!(r.take(b"k", 1), Take::Short));
        // Its own window, still on: given back.
        assert!(r.give_back("k", 1, Instant::now() + Duration::from_millis(390), half));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refund_goes_back_only_to_a_reservation_of_its_window() {
        let r = Reservations::new(10, super::super::slots::RESERVED_KEYS);
        holding(&r, "k", 0, 10_000);
        let end = Instant::now() + Duration::from_millis(10_000);
        let half = Duration::from_millis(5_000);
        // Same window, measured a few ms apart: given back.
        assert!(r.give_back("k", 2, end - Duration::from_millis(3), half));
        assert!(matches!(r.take(b"k", 2), Take::Taken(s, _) if s.remaining == 50));
        // A window that ended before this one: not.
        assert!(!r.give_back("k", 1, end - Duration::from_millis(9_000), half));
        // No reservation: not.
        r.drop_key("k");
        assert!(!r.give_back("k", 1, end, half));
        assert!(matches!(r.take(b"k", 1), Take::Short));
    }
}
