//! The limiter's business-code API beside `check`: [`Limiter::peek`],
//! [`Limiter::refund`] and [`Limiter::reset`].

use std::{future::Future, sync::Arc, time::Duration};

use super::{Backend, Inner, Limiter, deciding::ProbeGuard, reservation::Reservations};
use crate::{
    Algorithm, Decision, Error, MemoryStore, Quota,
    breaker::Pass,
    decision::{Ends, Stamp, States},
    deny_cache::DenyCache,
    store::{Credit, Refund, Store},
};

/// What a refund has to do, computed before it is awaited.
enum RefundWork {
    Nothing,
    /// The memory store: (key, quota, cost, window end in the store's ms).
    Memory(MemoryStore, Vec<(String, Quota, u64, i64)>),
    /// Another store; then what the refund makes stale in the deny cache.
    Store(Arc<dyn Store>, Vec<Refund>, Arc<Inner>, Option<Stale>),
}

/// The cached denials a refund makes stale.
enum Stale {
    /// The denials of these keys (the deny cache key of one client key).
    Keys(String),
    /// Every denial: a refund of several keys credits counters that other
    /// clients' denials may share (a global limit's, say), cached under
    /// their own keys.
    All,
}

impl RefundWork {
    /// Makes an in-process refund now; returns a store's call, still to
    /// be awaited.
    fn in_place(self) -> Option<impl Future<Output = Result<(), Error>> + Send + 'static> {
        match self {
            RefundWork::Nothing => None,
            RefundWork::Memory(memory, credits) => {
                let credits: Vec<_> = credits
                    .iter()
                    .map(|(key, quota, cost, end_us)| Credit {
                        key: key.as_bytes(),
                        quota: *quota,
                        cost: *cost,
                        end_us: *end_us,
                        exact: true,
                    })
                    .collect();
                memory.refund_now(&credits);
                None
            }
            RefundWork::Store(store, refunds, inner, stale) => Some(async move {
                let _forget = ForgetStale {
                    cache: inner.deny_cache.as_ref(),
                    stale,
                };
                let timeout = inner.timeout;
                match tokio::time::timeout(timeout, store.refund(refunds)).await {
                    Ok(result) => result,
                    Err(_) => Err(Error::Timeout(timeout)),
                }
            }),
        }
    }
}

/// The cached denials a store's refund makes stale, forgotten once its call
/// is over, whether or not it went through (it may have), or once the
/// refund is dropped on its way (a timeout around it, a handler whose
/// client went away): on drop.
struct ForgetStale<'a> {
    cache: Option<&'a DenyCache>,
    stale: Option<Stale>,
}

impl Drop for ForgetStale<'_> {
    fn drop(&mut self) {
        match (self.cache, self.stale.take()) {
            (Some(cache), Some(Stale::Keys(key))) => cache.remove(&key),
            (Some(cache), Some(Stale::All)) => cache.clear(),
            _ => {}
        }
    }
}

impl Limiter {
    /// Whether a request of `cost` for `key` would be admitted now, spending
    /// nothing: the decision [`check`](Self::check) would give, with
    /// `remaining` as it is now and [`retry_after`](Decision::retry_after)
    /// set when it would be denied.
    ///
    /// A peek never reads or fills the local deny cache, counts in no
    /// metric but the store's latency (not even as a store error when it
    /// fails), and refunding its decision does nothing. On Redis it is one script call (the decide
    /// script, keeping no spend) that needs no write: Redis answers it on a
    /// replica or out of memory. It heals a key's TTL (missing, or longer
    /// than its window) as a check would, where Redis takes the write, and
    /// answers as the heal leaves the key where it does not. Only a value
    /// this crate never writes, which a GCRA or sliding-window peek deletes,
    /// makes it fail on a replica.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redis_ratelimit::Error> {
    /// use redis_ratelimit::{Limiter, Quota};
    ///
    /// let limiter = Limiter::new(Quota::per_minute(2));
    /// assert!(limiter.peek("k", 2).await?.is_allowed());
    /// limiter.check("k", 2).await?;
    /// let peek = limiter.peek("k", 1).await?;
    /// assert!(!peek.is_allowed());
    /// assert!(peek.retry_after().is_some());
    /// # Ok(()) }
    /// ```
    pub async fn peek<K: AsRef<[u8]> + ?Sized>(
        &self,
        key: &K,
        cost: u64,
    ) -> Result<Decision, Error> {
        self.peeking(&[key.as_ref()], cost).await
    }

    /// Like [`peek`](Self::peek), with one key per limit (as
    /// [`check_each`](Self::check_each)).
    pub async fn peek_each<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
        cost: u64,
    ) -> Result<Decision, Error> {
        let keys: Vec<&[u8]> = keys.iter().map(AsRef::as_ref).collect();
        self.peeking(&keys, cost).await
    }

    async fn peeking(&self, keys: &[&[u8]], cost: u64) -> Result<Decision, Error> {
        let inner = &self.inner;
        self.key_count(keys)?;
        let checks: Vec<crate::LimitCheck> = self.checks(keys, cost)?;
        let store = match &inner.store {
            Backend::Memory(memory) => {
                let states = memory.peek_now(&checks, cost);
                return inner.conclude(states.into(), cost, None, None);
            }
            Backend::Other(store, _) => store,
        };
        // A reservation that holds enough answers for itself.
        if let Some(reservations) = &inner.reservations
            && cost > 0
            && let Some(state) = reservations.peek(&checks[0].key, cost)
        {
            return inner.conclude([state].into(), cost, None, None);
        }
        let domain =
            crate::breaker::domain(checks.first().map_or(0, |c| store.fault_domain(&c.key)));
        let pass = inner.breaker.pass(domain);
        if pass == Pass::Open {
            return Err(Error::CircuitOpen);
        }
        let probe = ProbeGuard {
            inner: inner.clone(),
            domain,
            pass,
            settled: false,
            epoch: 0,
        };
        let peek = store.peek(checks, cost);
        let answer = Box::pin(async move { Ok((States::from_vec(peek.await?), Ends::none())) });
        probe.settle(answer, false, cost, None, false).await
    }

    /// The deny cache's key for a decision on `keys`: its store keys,
    /// joined (see `Limiter::decide`).
    fn cache_key(&self, keys: &[&[u8]]) -> String {
        let keys: Vec<String> = (0..self.inner.limits.len())
            .map(|i| self.key_of(i, keys[i.min(keys.len() - 1)]))
            .collect();
        keys.join(" ")
    }

    fn key_count(&self, keys: &[&[u8]]) -> Result<(), Error> {
        let limits = self.inner.limits.len();
        if keys.len() != 1 && keys.len() != limits {
            return Err(Error::KeyCount {
                limits,
                got: keys.len(),
            });
        }
        Ok(())
    }

    /// Gives back what `decision` spent for `key`, in every limit that spent
    /// it: for "don't charge for our own errors" or "count only failed
    /// logins". `key` is the key the decision was checked with.
    ///
    /// - Only the window that was spent is credited: a fixed window that has
    ///   ended (and perhaps restarted) is not; a sliding window's bucket is
    ///   credited while it still counts (as the current or the previous
    ///   window); a GCRA's theoretical arrival time moves back by at most
    ///   the cost, by no more than is still outstanding of that spend, and
    ///   never before now.
    /// - How exactly the spent window is told from a later one depends on
    ///   the store. The [`MemoryStore`] knows every fixed or sliding window's
    ///   end to the ms on its own clock: a window begun after a
    ///   [reset](Self::reset) is never credited, unless it began in the very ms the spent one did
    ///   (a reset and the next request in the ms of the spend), which no
    ///   end told to the ms can tell apart. Redis knows a GCRA spend's end to the µs on its
    ///   clock (its reply says it), so no round trip, however slow, makes a
    ///   refund credit a spend already drained. For a fixed or sliding
    ///   window, Redis learns the end from this process (the decision's
    ///   reset less the time since its answer), which is later than the
    ///   true end by the answer's and the refund's way; windows of one key
    ///   follow each other a whole window apart, so the window that ends
    ///   within half a window of it is the spent one. So a refund credits
    ///   the window after the spent one (by its cost, once) only if it
    ///   reaches Redis more than half a window late (a stalled Redis, or a
    ///   window of a few ms), or if the key was reset (or lost) and its
    ///   next window began within half a window of the spent one's start.
    ///   A custom [`Store`] learns the end the same way, in whole ms
    ///   ([`Refund::window_end_in_ms`](crate::store::Refund)).
    /// - **GCRA across a reset**, on either store: a GCRA key has no
    ///   windows to tell apart, and a reset leaves nothing to tell a bucket
    ///   begun after it from the one spent in. So a decision made before a
    ///   [reset](Self::reset) and refunded after it moves the new bucket's
    ///   arrival time back as it would have the old one's (by at most its
    ///   cost, and only while the old spend would still be outstanding):
    ///   the key may admit up to that cost more, once per such refund. The
    ///   middleware can do this by itself, with refunds on, for a request
    ///   in flight when its key is reset. Where that matters, reset a GCRA
    ///   key when none of its requests is in flight.
    /// - Counts never drop below zero, and keys keep their expiry.
    /// - A decision that spent nothing (denied, a cost of 0, a
    ///   [`peek`](Self::peek), a cached denial) refunds nothing, without a
    ///   store call. Otherwise it is one atomic store call (in process for
    ///   the [`MemoryStore`]), bounded by the [timeout](super::LimiterBuilder::timeout).
    ///   A limit that denied in [shadow](super::LimiterBuilder::shadow) mode
    ///   spent nothing and gets nothing back, in the store or a
    ///   [local reservation](super::LimiterBuilder::local_reservation).
    /// - **Not idempotent**: refunding the same decision twice gives its cost
    ///   back twice (within the bounds above). Refund each decision once.
    /// - A decision from another limiter is [`Error::ForeignDecision`]; store
    ///   failures are errors, and touch no other key.
    /// - **Sent again, credited once**: the
    ///   [`RedisStore`](crate::RedisStore) sends a refund again when its
    ///   reply is lost (its connection dropped after Redis ran it), as it
    ///   does a decision, and redis-rs's cluster connection does so by
    ///   itself (also after a per-attempt response timeout). Redis credits
    ///   the call only the first time it runs: the call carries an id, and
    ///   its first run leaves a marker key (`<key>#rf:<id>`, about 100
    ///   bytes, for 10 s). The resends above come within the limiter's
    ///   [timeout](super::LimiterBuilder::timeout); with a timeout over
    ///   10 s, a refund sent again later than that would credit again.
    /// - A refund that fails (the limiter's timeout, an outage) may have been
    ///   made all the same: do not repeat it, since a new call is a new
    ///   refund.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redis_ratelimit::Error> {
    /// use redis_ratelimit::{Limiter, Quota};
    ///
    /// let logins = Limiter::new(Quota::per_minute(5));
    /// let decision = logins.check("alice", 1).await?;
    /// let password_ok = true;
    /// if password_ok {
    ///     // Count only failed logins.
    ///     logins.refund("alice", &decision).await?;
    /// }
    /// assert_eq!(logins.peek("alice", 1).await?.remaining(), 5);
    /// # Ok(()) }
    /// ```
    pub async fn refund<K: AsRef<[u8]> + ?Sized>(
        &self,
        key: &K,
        decision: &Decision,
    ) -> Result<(), Error> {
        self.refunding(&[key.as_ref()], decision).await
    }

    /// Like [`refund`](Self::refund), with the keys the decision was
    /// checked with by [`check_each`](Self::check_each).
    pub async fn refund_each<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
        decision: &Decision,
    ) -> Result<(), Error> {
        let keys: Vec<&[u8]> = keys.iter().map(AsRef::as_ref).collect();
        self.refunding(&keys, decision).await
    }

    /// The refund of `decision` for `keys` as an owned future: everything
    /// it needs is computed now.
    pub(crate) fn refunding(
        &self,
        keys: &[&[u8]],
        decision: &Decision,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'static {
        let work = self.refund_work(keys, decision);
        async move {
            match work.map(RefundWork::in_place)? {
                Some(call) => call.await,
                None => Ok(()),
            }
        }
    }

    /// The refund of `decision` for `keys`, for the middleware: made now
    /// when it is in process (the memory store's, which needs no runtime),
    /// or else the store call still to make, as an owned future (it needs
    /// a Tokio runtime for its timeout).
    pub(crate) fn refund_in_place(
        &self,
        keys: &[&[u8]],
        decision: &Decision,
    ) -> Result<Option<impl Future<Output = Result<(), Error>> + Send + 'static>, Error> {
        self.refund_work(keys, decision).map(RefundWork::in_place)
    }

    fn refund_work(&self, keys: &[&[u8]], decision: &Decision) -> Result<RefundWork, Error> {
        let Some(spent) = decision.spent() else {
            return Ok(RefundWork::Nothing);
        };
        let inner = &self.inner;
        if !inner.owns(decision.policies_arc()) || decision.len() != inner.limits.len() {
            return Err(Error::ForeignDecision);
        }
        self.key_count(keys)?;
        // Per limit that spent: its index, key and quota, and how long
        // before its state's reset its spent window ends (a sliding window's
        // bucket ends a window before the state drains; see
        // `Refund::window_end_in_ms`).
        let spent_limits = (0..inner.limits.len()).filter_map(|i| {
            if !decision.state_of(i).allowed {
                return None;
            }
            let quota = inner.limits[i].0;
            let back = match quota.algorithm() {
                Algorithm::SlidingWindow => quota.window_ms() as i64,
                _ => 0,
            };
            Some((i, self.key_of(i, keys[i.min(keys.len() - 1)]), quota, back))
        });
        match (&inner.store, &spent.at) {
            (Backend::Memory(memory), Stamp::Memory(ends)) => {
                let credits = spent_limits
                    .map(|(i, key, quota, back)| {
                        // A decision of this limiter has an end per limit; were one
                        // missing, an end long past credits nothing.
                        let end = ends.get(i).map_or(0, |e| e as i64);
                        let end_us = end - back.saturating_mul(1000);
                        (key, quota, spent.cost, end_us)
                    })
                    .collect();
                Ok(RefundWork::Memory(memory.clone(), credits))
            }
            (Backend::Other(store, _), stamp) if !matches!(stamp, Stamp::Memory(_)) => {
                let at = stamp.answered_at();
                if at.is_some_and(|at| self.gave_back(keys, decision, at)) {
                    // Back to the live reservation it came from: no store call.
                    return Ok(RefundWork::Nothing);
                }
                let elapsed = at.map_or(0, |at| at.elapsed().as_millis() as i64);
                let refunds = spent_limits
                    .map(|(i, key, quota, back)| {
                        let end = decision.state_of(i).reset_ms as i64 - back;
                        let refund =
                            Refund::new(key, quota, spent.cost, end.saturating_sub(elapsed));
                        // A GCRA spend's end on Redis's clock, when known.
                        match stamp.redis_end(i) {
                            Some(us) => refund.spent_until(us),
                            None => refund,
                        }
                    })
                    .collect::<Vec<_>>();
                if refunds.is_empty() {
                    // No limit spent (a shadow limit's denial admits, and
                    // spends nothing): no store call, which a store that
                    // cannot refund would answer with an error.
                    return Ok(RefundWork::Nothing);
                }
                let stale = inner.deny_cache.as_ref().map(|_| match keys {
                    [_] => Stale::Keys(self.cache_key(keys)),
                    _ => Stale::All,
                });
                Ok(RefundWork::Store(
                    store.clone(),
                    refunds,
                    inner.clone(),
                    stale,
                ))
            }
            _ => Err(Error::ForeignDecision),
        }
    }

    /// With reservations, gives an admitted decision's cost back to the
    /// reservation of the window it spent, if this limiter still holds one:
    /// the window ended (locally) `reset` after the decision. Only if its
    /// limit admitted it: a shadow limit's denial admits the request and
    /// spends nothing, in the store or the reservation.
    fn gave_back(&self, keys: &[&[u8]], decision: &Decision, at: tokio::time::Instant) -> bool {
        let (Some(reservations), Some(spent)) = (&self.inner.reservations, decision.spent()) else {
            return false;
        };
        if !decision.state_of(0).allowed {
            return false;
        }
        let end = at + Duration::from_millis(decision.state_of(0).reset_ms);
        let half_window = Duration::from_millis(self.quota().window_ms() / 2);
        reservations.give_back(&self.key_of(0, keys[0]), spent.cost, end, half_window)
    }

    /// Forgets `key`'s counters in every limit, in one atomic store call,
    /// and this limiter's local deny cache and
    /// [reservation](super::LimiterBuilder::local_reservation) of `key`: the
    /// client starts afresh.
    ///
    /// Other limiters' deny caches (other replicas) do not hear of it: a
    /// denial they cached before the reset is repeated for at most
    /// [`deny_cache_max_age`](super::LimiterBuilder::deny_cache_max_age)
    /// (1 s by default), then they ask the store again. See
    /// [the local deny cache](Limiter#the-local-deny-cache).
    ///
    /// Like a [refund](Self::refund), a reset whose reply is lost is sent
    /// again and takes effect once: run twice, it would forget what was
    /// charged in between, so its first run leaves a marker key
    /// (`<key>#rs:<id>`, for 10 s) and a second run deletes nothing. A reset
    /// runs when Redis is out of memory (`noeviction`) too: it frees memory.
    ///
    /// A reset dropped on its way (a timeout around it, a handler whose
    /// client went away) may still run in the store, so this limiter drops
    /// its deny cache's denials and the key's reservation all the same; a
    /// [refund](Self::refund) dropped on its way drops the cached denials
    /// it would.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redis_ratelimit::Error> {
    /// use redis_ratelimit::{Limiter, Quota};
    ///
    /// let limiter = Limiter::new(Quota::per_hour(1));
    /// limiter.check("k", 1).await?;
    /// assert!(!limiter.check("k", 1).await?.is_allowed());
    /// limiter.reset("k").await?;
    /// assert!(limiter.check("k", 1).await?.is_allowed());
    /// # Ok(()) }
    /// ```
    pub async fn reset<K: AsRef<[u8]> + ?Sized>(&self, key: &K) -> Result<(), Error> {
        self.resetting(&[key.as_ref()]).await
    }

    /// Like [`reset`](Self::reset), with one key per limit (as
    /// [`check_each`](Self::check_each)).
    pub async fn reset_each<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<(), Error> {
        let keys: Vec<&[u8]> = keys.iter().map(AsRef::as_ref).collect();
        self.resetting(&keys).await
    }

    async fn resetting(&self, keys: &[&[u8]]) -> Result<(), Error> {
        self.key_count(keys)?;
        let inner = &self.inner;
        let store_keys: Vec<String> = (0..inner.limits.len())
            .map(|i| self.key_of(i, keys[i.min(keys.len() - 1)]))
            .collect();
        let reserved = inner
            .reservations
            .as_ref()
            .map(|r| (r, store_keys[0].clone()));
        if let Some((reservations, key)) = &reserved {
            reservations.drop_key(key);
        }
        // Run when the store's call is over, or when this future is dropped
        // with the call on its way (a timeout around it, a handler whose
        // client went away): the store may still run the delete.
        let _after = AfterReset {
            reserved,
            cache: inner.deny_cache.as_ref(),
        };
        match &inner.store {
            Backend::Memory(memory) => {
                memory.reset_now(&store_keys);
                Ok(())
            }
            Backend::Other(store, _) => {
                match tokio::time::timeout(inner.timeout, store.reset(store_keys)).await {
                    Ok(result) => result,
                    Err(_) => Err(Error::Timeout(inner.timeout)),
                }
            }
        }
    }
}

/// What a reset does once its store call is over, whatever it answered, or
/// once the reset is dropped on its way (its call may still run in the
/// store): on drop, so that a reset given up leaves no reserved units or
/// cached denials of a counter it may have deleted.
struct AfterReset<'a> {
    reserved: Option<(&'a Reservations, String)>,
    cache: Option<&'a DenyCache>,
}

impl Drop for AfterReset<'_> {
    fn drop(&mut self) {
        // Dropped again: a reserve sent after the first drop may have run in
        // the store before the reset's delete, and its units (of the deleted
        // counter) be held here now.
        if let Some((reservations, key)) = &self.reserved {
            reservations.drop_key(key);
        }
        // Cleared whatever the store said: a cached denial may be stale now,
        // and the cache only ever saves store calls. Cleared whole: a denial
        // of several keys may hold this client's under another's name.
        if let Some(cache) = self.cache {
            cache.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send_static<F: Future + Send + 'static>(f: F) -> F {
        f
    }

    #[tokio::test(start_paused = true)]
    async fn refunding_is_an_owned_future_the_middleware_can_spawn() {
        let l = Limiter::new(Quota::per_minute(2));
        let d = l.check("k", 2).await.unwrap();
        let key = String::from("k");
        let refund = send_static(l.refunding(&[key.as_bytes()], &d));
        drop((key, d));
        tokio::spawn(refund).await.unwrap().unwrap();
        assert_eq!(l.peek("k", 1).await.unwrap().remaining(), 2);
    }
}
