//! A request's flight: the task that sends its key's reserve call and
//! writes the answer back ([`fly`]), holding the key's flight until it is
//! kept, and the request's side of it ([`Awaiting`]).

use std::{sync::Arc, time::Duration};

use tokio::{
    sync::{OwnedMutexGuard, oneshot},
    time::Instant,
};

use super::{Outcome, Pool, copy};
use crate::{
    Decision, Error, LimitState,
    decision::Stamp,
    deny_cache::Miss,
    limiter::{
        Inner,
        deciding::{self, ProbeGuard},
        slots::Flight,
    },
    metrics,
    store::{LimitCheck, Store},
};

/// Where a flight writes back: `key`'s entry, while it is `flight`'s.
#[derive(Clone)]
pub(super) struct Back {
    pub(super) inner: Arc<Inner>,
    pub(super) key: Vec<u8>,
    pub(super) flight: Flight,
    /// Half the limit's window: see [`Reservations::give_back`].
    ///
    /// [`Reservations::give_back`]: super::Reservations::give_back
    pub(super) half_window: Duration,
}

impl Back {
    /// `f` on the key's pool, if the entry is still the flight's.
    fn with<R>(&self, f: impl FnOnce(&mut Pool) -> R) -> Option<R> {
        let reservations = self.inner.reservations.as_ref()?;
        reservations.slots.with_flight(&self.key, &self.flight, f)
    }

    /// Gives units a grant kept for a request that has gone back to the
    /// pool, if it still holds that grant's window: all of them, even past
    /// `n` (the store spent them; they are kept for the requests after it).
    fn give_back(&self, held: Held) {
        self.with(|pool| pool.give_back(held.units, held.end, self.half_window, u64::MAX));
    }
}

/// One reserve call, sent by [`fly`] for the request that holds the
/// key's flight.
pub(super) struct ReserveCall {
    pub(super) back: Back,
    pub(super) store: Arc<dyn Store>,
    pub(super) probe: ProbeGuard,
    pub(super) check: LimitCheck,
    pub(super) cost: u64,
    pub(super) want: u64,
    pub(super) cache_key: Option<Miss>,
    /// The key's flight, held until the call's answer is kept.
    pub(super) guard: OwnedMutexGuard<()>,
}

/// What a flight answers the request that sent it.
pub(super) struct Flown {
    pub(super) result: Result<Decision, Error>,
    /// The units of a grant that are the request's (its cost), if the
    /// pool kept the grant.
    held: Option<Held>,
}

impl Flown {
    /// The answer, taken by the request that sent the flight: counted
    /// here, once, as a decision or a store error.
    pub(super) fn taken(self, inner: &Inner) -> Result<Decision, Error> {
        match &self.result {
            Ok(decision) => deciding::count(decision),
            Err(_) => metrics::store_error(std::iter::once(inner.policies.metric_keys(0))),
        }
        self.result
    }
}

/// A request's units in a grant the pool kept, of the window that ends
/// (locally) at `end`.
#[derive(Clone, Copy)]
struct Held {
    units: u64,
    end: Instant,
}

/// The request that sent a flight, waiting for its answer. Dropped
/// before it took the answer (the request went away, or its timeout
/// ended), it gives the units the grant held for it back to the pool:
/// Redis spent them, and the requests after it spend them now.
pub(super) struct Awaiting {
    pub(super) rx: oneshot::Receiver<Flown>,
    pub(super) back: Back,
}

impl Drop for Awaiting {
    fn drop(&mut self) {
        // Closed first: the flight then either answered already (and the
        // answer is taken here) or finds no one to answer, and gives the
        // units back itself.
        self.rx.close();
        if let Ok(Flown {
            held: Some(held), ..
        }) = self.rx.try_recv()
        {
            self.back.give_back(held);
        }
    }
}

/// Sends `call`'s reserve call and keeps its answer: a grant in the pool
/// (less the request's cost), a denial or an error for the requests that
/// waited on the flight; then answers the request, or, if it has gone,
/// gives its cost back to the pool. The call has a whole timeout from
/// when it is sent, whatever is left of the request's: an answer dropped
/// unread would lose the units Redis spent. The flight is held until all
/// of it is done.
pub(super) async fn fly(call: ReserveCall, tx: oneshot::Sender<Flown>) {
    let ReserveCall {
        back,
        store,
        probe,
        check,
        cost,
        want,
        cache_key,
        guard: _guard,
    } = call;
    let inner = &back.inner;
    // The window ends `window_left_ms` after Redis ran the script, which
    // was after this instant: counting from here ends the local units first.
    let sent = Instant::now();
    let reply = probe.call(store.reserve(check, cost, want), sent).await;
    let flown = match reply {
        Err(e) => {
            back.with(|pool| {
                pool.coming = 0;
                pool.flights += 1;
                pool.last = Some(Box::new(Outcome::Failed(copy(&e))));
            });
            Flown {
                result: Err(e),
                held: None,
            }
        }
        Ok(r) if r.granted < cost => {
            // Nothing taken: a denial until the window ends, as the store
            // would give it.
            let state = LimitState {
                allowed: false,
                remaining: r.remaining,
                reset_ms: r.window_left_ms,
                retry_ms: r.window_left_ms,
            };
            let stamp = Some(Stamp::Local(sent));
            let result = inner.conclude_uncounted([state].into(), cost, None, stamp);
            let at = Instant::now();
            back.with(|pool| {
                pool.coming = 0;
                let Ok(d) = &result else { return };
                // Cached only while the key's entry lives, under its lock:
                // a reset drops the entry, then clears the cache once the
                // store has forgotten the key, so a denial of the counter
                // it deleted is never left cached.
                if let (Some(cache), Some(key)) = (&inner.deny_cache, &cache_key) {
                    cache.insert(key, cost, d);
                }
                pool.flights += 1;
                pool.left = r.remaining;
                pool.last = Some(Box::new(Outcome::Denied(r.remaining, d.clone(), at)));
            });
            Flown { result, held: None }
        }
        Ok(r) => {
            let granted = back.with(|pool| {
                pool.coming = 0;
                pool.flights += 1;
                pool.last = None;
                let state = pool.grant(&r, cost, sent);
                let held = (pool.end)
                    .filter(|end| *end > Instant::now())
                    .map(|end| Held { units: cost, end });
                (state, held)
            });
            // A dropped entry keeps nothing: the request's own state still
            // counts.
            let (state, held) =
                granted.unwrap_or_else(|| (Pool::default().grant(&r, cost, sent), None));
            let stamp = Some(Stamp::Local(Instant::now()));
            let result = inner.conclude_uncounted([state].into(), cost, None, stamp);
            Flown { result, held }
        }
    };
    // Counted by the request once it takes the answer ([`Flown::taken`]):
    // one that had gone (or timed out, and counted its timeout) took
    // nothing, and its units, given back, are counted by the request that
    // spends them.
    match tx.send(flown) {
        Ok(()) => {}
        // The request has gone: its units stay for the next ones.
        Err(Flown {
            held: Some(held), ..
        }) => back.give_back(held),
        Err(_) => {}
    }
}
