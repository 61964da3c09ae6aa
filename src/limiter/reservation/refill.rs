//! The refill that runs behind a busy key's requests
//! ([`refill_behind`]): the units that top the key up to `n`, reserved in
//! the key's single flight before the key runs dry.

use std::sync::Arc;

use tokio::time::Instant;

use crate::{
    Decision, LimitState,
    breaker::Pass,
    decision::Stamp,
    limiter::{Inner, deciding::ProbeGuard},
    store::{LimitCheck, Store},
};

/// Starts refilling `check`'s key in the background, for the request that
/// [`Reservations::take`] named: up to `n` units held, so that a busy key is
/// topped up before it runs dry and its requests need not wait. Without a
/// Tokio runtime to run it, nothing is refilled ahead (requests then
/// reserve as they run short, as ever).
///
/// [`Reservations::take`]: super::Reservations::take
pub(in crate::limiter) fn refill_behind(
    inner: &Arc<Inner>,
    store: &Arc<dyn Store>,
    check: LimitCheck,
) {
    let refilling = Refilling {
        inner: inner.clone(),
        key: check.key.clone().into_bytes(),
    };
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(refill(refilling, store.clone(), check));
    }
}

/// A refill on its way: clears the key's `refilling` flag when it ends,
/// or is dropped unfinished (a runtime shutting down).
struct Refilling {
    inner: Arc<Inner>,
    key: Vec<u8>,
}

impl Drop for Refilling {
    fn drop(&mut self) {
        if let Some(r) = &self.inner.reservations {
            r.slots.with(&self.key, |pool| pool.refilling = false);
        }
    }
}

/// One refill: in the key's single flight, reserves what tops the key up
/// to `n` units (what it holds when the call is sent, plus the grant: a
/// key never holds more), if the breaker lets it, waiting for
/// the flight within one timeout (a refill that gets no time gives up:
/// requests that run short reserve themselves), and for the call's answer
/// a whole timeout from sending it, as [`fly`] does. A denial goes
/// to the deny cache, for the requests that run short next, unless a reset
/// dropped the key meanwhile. An error keeps
/// nothing and answers no one: requests that then run short reserve
/// themselves and get the store's answer (the breaker has recorded it; the
/// metrics count failed decisions, `ratelimit_store_errors_total`, and a
/// refill decides no request, so they count it only if those requests
/// fail too).
///
/// [`fly`]: super::flight::fly
async fn refill(refilling: Refilling, store: Arc<dyn Store>, check: LimitCheck) {
    let asked = Instant::now();
    let inner = refilling.inner.clone();
    let reservations = inner
        .reservations
        .as_ref()
        .expect("a limiter with reservations");
    let (slots, key) = (&reservations.slots, &refilling.key);
    let (flight, ()) = slots.entry(key, |_| ());
    let Ok(_flight) = tokio::time::timeout(inner.time_left(asked), flight.lock()).await else {
        return;
    };
    let low = reservations.low_water();
    let n = reservations.n;
    // What tops the key up to `n`: the units held now, less what requests
    // spend while the call is on its way, plus the grant stay within `n`.
    let want = slots.with_flight(key, &flight, |pool| {
        let now = Instant::now();
        if pool.ending(now) {
            // Nothing is reserved in the window's last stretch.
            return None;
        }
        let held = pool.held(now);
        let want = (held < low).then(|| n - held)?;
        pool.coming = want;
        Some(want)
    });
    let Some(Some(want)) = want else {
        // Refilled meanwhile, by a request that ran short, or dropped.
        return;
    };
    // Nothing is on its way after all, or no longer.
    let landed = || slots.with_flight(key, &flight, |pool| pool.coming = 0);
    let domain = crate::breaker::domain(store.fault_domain(&check.key));
    // No time left for the call is as good as an open breaker.
    let pass = if inner.time_left(asked).is_zero() {
        Pass::Open
    } else {
        inner.breaker.pass(domain)
    };
    if pass == Pass::Open {
        landed();
        return;
    }
    let probe = ProbeGuard {
        inner: inner.clone(),
        domain,
        pass,
        settled: false,
        epoch: 0,
    };
    // `key` is the check's store key: the deny cache's for one limit.
    let miss = inner.deny_cache.as_ref().map(|cache| cache.miss(key));
    // A whole timeout from sending, as a request's flight ([`fly`]).
    let sent = Instant::now();
    let Ok(r) = probe.call(store.reserve(check, 1, want), sent).await else {
        landed();
        return;
    };
    slots.with_flight(key, &flight, |pool| {
        pool.coming = 0;
        pool.left = r.remaining;
        if r.granted > 0 {
            pool.grant(&r, 0, sent);
        } else if let (Some(cache), Some(miss)) = (&inner.deny_cache, &miss) {
            // The store is spent: the requests that run short next are
            // denied from the deny cache, as after any denial, rather than
            // each asking again. Only while the key's entry lives, under
            // its lock: a reset drops the entry, then clears the cache once
            // the store has forgotten the key, so a denial of the counter
            // it deleted is never left cached.
            let state = LimitState {
                allowed: false,
                remaining: r.remaining,
                reset_ms: r.window_left_ms,
                retry_ms: r.window_left_ms,
            };
            let d = Decision::new([state], inner.policies_here()).with_spent(1, Stamp::Local(sent));
            cache.insert(miss, 1, &d);
        }
    });
}
