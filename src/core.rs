//! The framework-neutral middleware core, shared by the tower and actix
//! adapters: derive a key, start the check, turn its result into a verdict.

use std::sync::{
    Arc, OnceLock, Weak,
    atomic::{AtomicBool, AtomicU64, Ordering},
};

use std::time::Instant;

use crate::{
    Decision, Error, Limiter, OnStoreError, Rejection, Respond,
    gate::{Start, Started},
    headers::{self, HeaderSink, PartitionKeys},
    key::{Key, KeyError, KeyExtractor},
    limiter::Deciding,
    per_thread::{self, PerThread},
    refund::{Charged, Deferred, Outcome, Refund, RequestHead, ResponseHead},
    respond::{Asked, answer_as_grpc_web},
};
use smallvec::SmallVec;

/// What the middleware does with a request once its check is done.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Call the inner service; add headers for the decision, if there is one.
    Pass(Option<Decision>),
    /// Answer with this rejection.
    Reject(Rejection),
}

/// Everything one layer needs, behind one `Arc` shared by all its clones.
///
/// `L` is what decides: a [`Limiter`] for the rate-limit layer, a
/// [`ConcurrencyLimiter`](crate::concurrency::ConcurrencyLimiter) for the
/// concurrency layer. Keys, responses, headers on rejections and the
/// store-error policy are shared by both.
///
/// The extractor and the responder sit behind their own `Arc`s, so a layer
/// can be reconfigured (its by-value builder methods) without `K: Clone` or
/// `R: Clone`, even when it has been cloned already.
///
/// A request's future, and a clone of the service, hold this thread's copy
/// of the core ([`local`](Self::local)), so aligned as a value kept per
/// thread.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct Core<K, R, L = Limiter> {
    pub(crate) limiter: L,
    pub(crate) extractor: Arc<K>,
    pub(crate) respond: Arc<R>,
    pub(crate) on_error: OnStoreError,
    pub(crate) legacy_headers: bool,
    /// Writes the draft's `pk` on `RateLimit`, hashed with these keys.
    pub(crate) partition_keys: Option<PartitionKeys>,
    /// Which responses give their request's cost back.
    pub(crate) refund: Option<Refund>,
    /// Shared by the core's thread copies, so a warning given once is
    /// given once per layer.
    logs: Arc<Logs>,
    /// The core's copy for each thread (none in a copy).
    copies: PerThread<Self>,
    /// The copies again, by [`per_thread::index`], shared by the core and
    /// its copies: how a copy finds another thread's copy without writing
    /// the core's count. Weak, as a copy holds them.
    siblings: Arc<[OnceLock<Weak<Self>>]>,
    /// In a thread's copy: the core it copies, and the copy's index. Weak,
    /// as the core holds its copies.
    home: Option<(Weak<Self>, usize)>,
}

/// Panics unless an extractor gives one key per request, as a concurrency
/// limit takes: `who` names the constructor. Checked when a layer is built,
/// so that a second key is not silently dropped.
pub(crate) fn assert_one_key(who: &str, key_count: usize) {
    assert!(
        key_count == 1,
        "{who}: the extractor gives {key_count} keys per request, and a concurrency limit \
         takes one; stack one layer per key"
    );
}

/// Panics unless an extractor of `key_count` keys per request fits every
/// limiter of `limiters`: one key for all of a limiter's limits, or one per
/// limit. `who` names the constructor. Checked when a layer is built, so a
/// mismatch is not a 500 on every request.
pub(crate) fn assert_keys_fit<'a>(
    who: &str,
    key_count: usize,
    limiters: impl IntoIterator<Item = &'a Limiter>,
) {
    for limiter in limiters {
        let limits = limiter.limits().count();
        assert!(
            key_count == 1 || key_count == limits,
            "{who}: the extractor gives {key_count} keys per request, and limiter {:?} has \
             {limits} limits; give one key for all of them, or one per limit, in order",
            limiter.name()
        );
    }
}

impl<K, R, L: Clone> Clone for Core<K, R, L> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            extractor: self.extractor.clone(),
            respond: self.respond.clone(),
            on_error: self.on_error,
            legacy_headers: self.legacy_headers,
            partition_keys: self.partition_keys.clone(),
            refund: self.refund.clone(),
            logs: Arc::default(),
            copies: PerThread::new(),
            siblings: per_thread::weak_slots(),
            home: None,
        }
    }
}

impl<K, R, L: Clone> Core<K, R, L> {
    /// This thread's copy of `core`, for a request's future or a clone of
    /// the service to hold: cloning it writes a count that no other
    /// thread's requests write ([`PerThread`]). The copies share the logs.
    ///
    /// `core` may itself be a copy (a clone of a service holds one, and
    /// hyper, tonic and axum's routes clone the service for every request):
    /// this thread's is cloned as it is, and another thread's leads to this
    /// thread's through the copies' shared table (or, the first time, the
    /// layer's core), so neither writes a count that other threads write.
    /// Once the layer's core is gone (every service holding it dropped), a
    /// thread without a copy clones the one it has.
    #[inline]
    pub(crate) fn local(core: &Arc<Self>) -> Arc<Self> {
        let index = per_thread::index();
        match &core.home {
            Some((_, own)) if *own == index => Arc::clone(core),
            _ => match core.siblings[index].get().and_then(Weak::upgrade) {
                Some(copy) => copy,
                None => Self::first_local(core, index),
            },
        }
    }

    /// [`local`](Self::local) on a thread that has no copy yet: the core
    /// makes one; a copy leads to the core, if it lives.
    #[cold]
    fn first_local(core: &Arc<Self>, index: usize) -> Arc<Self> {
        let Some((home, _)) = &core.home else {
            let copy = core.copies.get(|| Self {
                logs: core.logs.clone(),
                siblings: core.siblings.clone(),
                home: Some((Arc::downgrade(core), index)),
                ..(**core).clone()
            });
            core.siblings[index].get_or_init(|| Arc::downgrade(copy));
            return Arc::clone(copy);
        };
        home.upgrade()
            .map_or_else(|| Arc::clone(core), |home| Self::local(&home))
    }

    /// Makes `core` this thread's copy, if it is not already: a service
    /// does at each call, so that a connection's service, made on the
    /// thread that accepted it, takes its worker's copy once, not at every
    /// request.
    pub(crate) fn localize(core: &mut Arc<Self>) {
        if !matches!(core.home, Some((_, index)) if index == per_thread::index()) {
            *core = Self::local(core);
        }
    }
}

impl<K, R, L> Core<K, R, L> {
    pub(crate) fn new(limiter: L, extractor: K, respond: R) -> Self {
        Self {
            limiter,
            extractor: Arc::new(extractor),
            respond: Arc::new(respond),
            on_error: OnStoreError::default(),
            legacy_headers: false,
            partition_keys: None,
            refund: None,
            logs: Arc::default(),
            copies: PerThread::new(),
            siblings: per_thread::weak_slots(),
            home: None,
        }
    }

    /// One by-value builder step on a layer's shared core: `f` rebuilds a
    /// copy (the core itself, when no clone of the layer shares it).
    pub(crate) fn rebuild<K2, R2>(
        core: Arc<Self>,
        f: impl FnOnce(Self) -> Core<K2, R2, L>,
    ) -> Arc<Core<K2, R2, L>>
    where
        L: Clone,
    {
        // A core taken back whole keeps no copy made before the step,
        // which would still hold the old settings.
        let core = Self {
            copies: PerThread::new(),
            siblings: per_thread::weak_slots(),
            home: None,
            ..Arc::unwrap_or_clone(core)
        };
        Arc::new(f(core))
    }

    /// [`rebuild`](Self::rebuild), changing settings only.
    pub(crate) fn with(core: Arc<Self>, f: impl FnOnce(&mut Self)) -> Arc<Self>
    where
        L: Clone,
    {
        Self::rebuild(core, |mut c| {
            f(&mut c);
            c
        })
    }

    /// Wraps the extractor, keeping everything else.
    pub(crate) fn map_extractor<K2>(self, f: impl FnOnce(Arc<K>) -> K2) -> Core<K2, R, L> {
        Core {
            limiter: self.limiter,
            extractor: Arc::new(f(self.extractor)),
            respond: self.respond,
            on_error: self.on_error,
            legacy_headers: self.legacy_headers,
            partition_keys: self.partition_keys,
            refund: self.refund,
            logs: self.logs,
            copies: PerThread::new(),
            siblings: per_thread::weak_slots(),
            home: None,
        }
    }

    /// Swaps the responder, keeping everything else.
    pub(crate) fn with_respond<R2>(self, respond: R2) -> Core<K, R2, L> {
        Core {
            limiter: self.limiter,
            extractor: self.extractor,
            respond: Arc::new(respond),
            on_error: self.on_error,
            legacy_headers: self.legacy_headers,
            partition_keys: self.partition_keys,
            refund: self.refund,
            logs: self.logs,
            copies: PerThread::new(),
            siblings: per_thread::weak_slots(),
            home: None,
        }
    }

    /// Derives the request's key, or the rejection for a request without one.
    pub(crate) fn key<Req: ?Sized>(&self, req: &Req) -> Result<Key, Rejection>
    where
        K: KeyExtractor<Req>,
    {
        self.extractor.extract(req).map_err(|e| {
            self.logs.key_error(&e);
            Rejection::KeyUnavailable(e)
        })
    }

    /// The response for a rejection, with the rate-limit headers when the
    /// quota or the concurrency limit denied it.
    /// `asked` is what the request's headers ask for ([`Asked::negotiate`]):
    /// the format the responder is given and, for a gRPC-Web call, the
    /// `content-type` a trailers-only gRPC answer gets instead of
    /// `application/grpc` ([`answer_as_grpc_web`]), whichever responder built it.
    pub(crate) fn reject<Res>(&self, rejection: Rejection, asked: Asked) -> Res
    where
        R: Respond<Res>,
        Res: HeaderSink + ResponseHead,
    {
        let mut res = self.respond.respond_as(&rejection, asked.format);
        if let Some(web) = asked.grpc_web {
            answer_as_grpc_web(&mut res, web);
        }
        match &rejection {
            Rejection::Denied(d) => headers::write(d, &mut res, self.legacy_headers),
            Rejection::Busy(busy) => busy.write_headers(&mut res),
            _ => {}
        }
        res
    }

    /// Adds the decision's rate-limit headers to a passed request's response.
    pub(crate) fn decorate(&self, res: &mut impl HeaderSink, decision: &Decision) {
        headers::write(decision, res, self.legacy_headers);
    }

    /// Applies the store-error policy to a failed store call: `None` lets
    /// the request through, unlimited.
    pub(crate) fn store_failed(&self, e: Error) -> Option<Rejection> {
        self.logs.store_error(&e, self.on_error);
        match self.on_error {
            OnStoreError::Deny => Some(Rejection::StoreUnavailable(e)),
            _ => None,
        }
    }
}

/// A rate-limit check the middleware started ([`Core::start`]).
pub(crate) struct Pending {
    /// The decision on its way.
    pub(crate) deciding: Deciding,
    /// With refunds on, what it spends.
    pub(crate) spent: Option<Charged>,
    /// Its limiter enforces nothing (every limit a shadow limit): no
    /// failure denies the request.
    pub(crate) dry: bool,
}

impl<K, R> Core<K, R> {
    /// Derives the request's keys, cost and limiter (its tier's) and starts
    /// its check; skips it; or rejects it at once when no key can be
    /// derived.
    ///
    /// A limiter whose every limit is a shadow limit denies nothing: a
    /// request it finds no key for is let through unchecked (the key error
    /// is logged as for an enforced limiter), and a failed store, or a cost
    /// no limit can hold, lets the request through whatever the
    /// store-error policy ([`verdict`](Self::verdict), from
    /// [`Pending::dry`]).
    pub(crate) fn start<Req: ?Sized + RequestHead>(&self, req: &Req) -> Started<Pending>
    where
        K: KeyExtractor<Req>,
    {
        if self.extractor.skip(req) {
            return Ok(Start::Skip);
        }
        let limiter = self.extractor.tier(req).unwrap_or(&self.limiter);
        let cost = self.extractor.cost(req);
        let dry = limiter.enforces_nothing();
        if self.extractor.key_count() == 1 {
            let key = match self.key(req) {
                Ok(key) => key,
                Err(_) if dry => return Ok(Start::Skip),
                Err(rejection) => return Err(rejection),
            };
            let deciding = limiter.decide(&[key.as_bytes()], cost);
            let deciding = self.partitioned(deciding, &[key.as_bytes()]);
            let spent = self
                .refund
                .as_ref()
                .map(|_| Charged::new(limiter, smallvec::smallvec![key], req.may_be_grpc()));
            return Ok(Start::Check(Pending {
                deciding,
                spent,
                dry,
            }));
        }
        let mut keys = Vec::with_capacity(self.extractor.key_count());
        if let Err(e) = self.extractor.extract_all(req, &mut keys) {
            self.logs.key_error(&e);
            if dry {
                return Ok(Start::Skip);
            }
            return Err(Rejection::KeyUnavailable(e));
        }
        let bytes: Vec<&[u8]> = keys.iter().map(Key::as_bytes).collect();
        let deciding = self.partitioned(limiter.decide(&bytes, cost), &bytes);
        drop(bytes);
        let spent = self
            .refund
            .as_ref()
            .map(|_| Charged::new(limiter, SmallVec::from_vec(keys), req.may_be_grpc()));
        Ok(Start::Check(Pending {
            deciding,
            spent,
            dry,
        }))
    }

    /// After a passed request's response head `res`: gives `spent` back
    /// if the response's status is one to refund. A gRPC or gRPC-Web
    /// response whose `grpc-status` is not at its head (it comes in the
    /// trailers, or gRPC-Web's trailer frame at the body's end, after the
    /// middleware has let the response go) gets the refund in its
    /// extensions, for a [`TrailersLayer`](crate::refund::TrailersLayer)
    /// outside to settle by that status; without one it stays charged.
    pub(crate) fn settle(&self, res: &mut impl ResponseHead, decision: &Decision, spent: Charged) {
        // A decision that spent nothing (a shadow denial) needs no task.
        let Some(refund) = self.refund.as_ref().filter(|_| decision.spent().is_some()) else {
            return;
        };
        match Outcome::of(res, spent.may_be_grpc()) {
            Outcome::Known(status) if refund.applies(status) => spent.refund(decision),
            Outcome::Grpc(code) if refund.applies_to_grpc(code) => spent.refund(decision),
            Outcome::Known(_) | Outcome::Grpc(_) | Outcome::Unjudged => {}
            Outcome::InTrailers | Outcome::InBody => {
                let logged = self.logs.untaken_logged.clone();
                res.defer(Deferred::new(
                    refund.clone(),
                    spent,
                    decision.clone(),
                    logged,
                ));
            }
        }
    }

    /// With `pk` on: the check, carrying the partition keys of `keys`.
    fn partitioned(&self, deciding: Deciding, keys: &[&[u8]]) -> Deciding {
        match &self.partition_keys {
            None => deciding,
            Some(pk) => deciding.partitioned(keys.iter().map(|k| pk.hash(k)).collect()),
        }
    }

    /// Applies the store-error policy to a finished check; for a limiter
    /// that enforces nothing (`dry`), every failure passes, but a custom
    /// extractor's wrong key count, which is a bug to fix. A cost no window
    /// can hold is no store failure: a 429, or under `dry` a pass (the
    /// limiter counted it, as a denial or a shadow denial).
    pub(crate) fn verdict(&self, result: Result<Decision, Error>, dry: bool) -> Verdict {
        match result {
            Ok(d) if d.is_allowed() => Verdict::Pass(Some(d)),
            Ok(d) => Verdict::Reject(Rejection::Denied(d)),
            Err(Error::CostExceedsLimit { cost, limit }) => {
                // A client's cost, so throttled.
                self.logs.cost_exceeds(cost, limit, dry);
                match dry {
                    true => Verdict::Pass(None),
                    false => Verdict::Reject(Rejection::CostExceedsLimit { cost, limit }),
                }
            }
            Err(e) if dry && !matches!(e, Error::KeyCount { .. }) => {
                self.logs.store_error(&e, OnStoreError::Allow);
                Verdict::Pass(None)
            }
            Err(e @ Error::KeyCount { .. }) => {
                // A custom extractor's `key_count` disagrees with the limiter.
                let e = KeyError::Rejected {
                    status: http::StatusCode::INTERNAL_SERVER_ERROR,
                    reason: e.to_string(),
                };
                self.logs.key_count(&e);
                Verdict::Reject(Rejection::KeyUnavailable(e))
            }
            Err(e) => match self.store_failed(e) {
                Some(rejection) => Verdict::Reject(rejection),
                None => Verdict::Pass(None),
            },
        }
    }
}

/// Log throttling: a misconfiguration is logged once; a store outage, and
/// requests whose cost no window can hold, at most once a second each
/// (with how many were not logged).
#[derive(Debug, Default)]
struct Logs {
    /// Set once an extractor's server-side failure (no peer address, a
    /// custom extractor's 5xx) was logged.
    key_error_logged: AtomicBool,
    /// Set once an extractor's wrong number of keys was logged: a
    /// misconfiguration of its own, not silenced by the one above.
    key_count_logged: AtomicBool,
    /// Set once a refund left for a `TrailersLayer` found none.
    untaken_logged: Arc<AtomicBool>,
    store: Throttle,
    /// A client chooses its requests' costs: its own throttle, so that a
    /// flood of them neither floods the log nor hides store errors.
    cost: Throttle,
}

/// At most one log line a second, counting the lines left out.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    next_ms: AtomicU64,
    unlogged: AtomicU64,
}

fn millis_since_start() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

impl Throttle {
    pub(crate) const fn new() -> Self {
        Self {
            next_ms: AtomicU64::new(0),
            unlogged: AtomicU64::new(0),
        }
    }

    /// `Some(lines left out since the last)` if a line may be logged now.
    pub(crate) fn admit(&self) -> Option<u64> {
        let now = millis_since_start();
        let next = self.next_ms.load(Ordering::Relaxed);
        if now < next
            || self
                .next_ms
                .compare_exchange(next, now + 1000, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.unlogged.swap(0, Ordering::Relaxed))
    }
}

impl Logs {
    fn key_error(&self, e: &KeyError) {
        if !e.is_server_error() {
            tracing::debug!(error = %e, "rate limit: no key for request");
        } else if !self.key_error_logged.swap(true, Ordering::Relaxed) {
            tracing::error!(error = %e, "rate limit: server misconfigured; answering such requests with 500, or letting them through unchecked under a limiter whose every limit is a shadow limit (logged once)");
        }
    }

    /// A custom extractor gives a number of keys the limiter does not take:
    /// a bug, answered with 500 even in shadow mode.
    fn key_count(&self, e: &KeyError) {
        if !self.key_count_logged.swap(true, Ordering::Relaxed) {
            tracing::error!(error = %e, "rate limit: the key extractor gives a wrong number of keys; answering such requests with 500, also under a limiter whose every limit is a shadow limit (logged once)");
        }
    }

    /// A request's cost exceeds a limit's whole quota (`limit`): a 429 that
    /// no wait clears, or under a limiter whose every limit is a shadow
    /// limit (`shadow`), the 429 it would be. Worth an operator's look (a
    /// quota smaller than the costs the layer gives), but a client can send
    /// any number of them.
    fn cost_exceeds(&self, cost: u64, limit: u64, shadow: bool) {
        let Some(unlogged) = self.cost.admit() else {
            return;
        };
        if shadow {
            tracing::warn!(
                cost,
                limit,
                unlogged,
                "rate limit: a request's cost exceeds the limit's whole quota; let through, as every limit is a shadow limit (enforced, it would be a 429)"
            );
        } else {
            tracing::warn!(
                cost,
                limit,
                unlogged,
                "rate limit: a request's cost exceeds the limit's whole quota, so no wait could admit it; answered 429, nothing spent"
            );
        }
    }

    fn store_error(&self, e: &Error, policy: OnStoreError) {
        if let Some(unlogged) = self.store.admit() {
            tracing::warn!(error = %e, ?policy, unlogged, "rate limit store failed; applying the store-error policy");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io,
        sync::{Arc, Mutex},
    };

    use super::{Core, Verdict};
    use crate::{
        DefaultResponse, Error, Limiter, Quota, Rejection,
        key::{Global, PeerIp},
    };

    /// What `tracing` prints while `f` runs, at INFO and above.
    fn logged(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Out(Arc<Mutex<Vec<u8>>>);
        impl io::Write for Out {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let out = Out::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        String::from_utf8(out.0.lock().unwrap().clone()).unwrap()
    }

    /// Two misconfigurations, a request without a peer address and an
    /// extractor giving the wrong number of keys, are each logged once at
    /// error level: the first logged does not silence the other. The key
    /// count's 500 is answered under shadow too, and its log says so.
    #[test]
    fn each_misconfiguration_is_logged_once_at_error_level() {
        let limiter = Limiter::new(Quota::per_minute(1));
        let core = Core::new(limiter, PeerIp, DefaultResponse);
        let no_peer = http::Request::new(()).into_parts().0;
        let key_count = || Err(Error::KeyCount { limits: 2, got: 3 });
        let text = logged(|| {
            for _ in 0..2 {
                assert!(core.key(&no_peer).is_err());
                for dry in [false, true] {
                    match core.verdict(key_count(), dry) {
                        Verdict::Reject(Rejection::KeyUnavailable(e)) => {
                            assert_eq!(e.status(), 500, "shadow: {dry}");
                        }
                        _ => panic!("a wrong key count passed (shadow: {dry})"),
                    }
                }
            }
        });
        let errors: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
        assert_eq!(errors.len(), 2, "{text}");
        assert!(errors[0].contains("no peer address"), "{text}");
        assert!(errors[1].contains("3 keys given for 2 limits"), "{text}");
        assert!(!errors[1].contains("unchecked"), "{text}");
    }

    #[test]
    fn a_threads_copy_of_the_core_shares_its_logs() {
        let limiter = Limiter::new(Quota::per_minute(1));
        let core = Arc::new(Core::new(limiter, Global, DefaultResponse));
        let here = Core::local(&core);
        assert!(
            !Arc::ptr_eq(&here, &core),
            "a copy, with a count of its own"
        );
        assert!(
            Arc::ptr_eq(&Core::local(&core), &here),
            "the same copy on one thread"
        );
        assert!(
            Arc::ptr_eq(&Core::local(&here), &here),
            "a copy is this thread's own, not copied again"
        );
        // A warning given once per layer stays once across its copies.
        assert!(Arc::ptr_eq(&here.logs, &core.logs));
        assert!(Arc::ptr_eq(&here.extractor, &core.extractor));
    }

    #[test]
    fn another_threads_copy_leads_to_this_threads() {
        let limiter = Limiter::new(Quota::per_minute(1));
        let core = Arc::new(Core::new(limiter, Global, DefaultResponse));
        let mine = Core::local(&core);
        std::thread::scope(|s| {
            s.spawn(|| {
                // This thread's first: through the layer's core.
                let theirs = Core::local(&mine);
                assert!(Arc::ptr_eq(&theirs, &Core::local(&core)));
                assert!(Arc::ptr_eq(&Core::local(&theirs), &theirs));
            });
        });
        // With the layer's core gone, a thread finds its copy through the
        // copies' table, and a thread without one clones the copy it has.
        let mine_too = Arc::clone(&mine);
        std::thread::scope(|s| {
            s.spawn(move || {
                let theirs = Core::local(&core);
                drop(core);
                assert!(Arc::ptr_eq(&Core::local(&mine_too), &theirs));
            });
        });
        assert!(Arc::ptr_eq(&Core::local(&mine), &mine));
    }

    #[test]
    fn a_rebuilt_core_keeps_no_copy_of_its_old_settings() {
        let limiter = Limiter::new(Quota::per_minute(1));
        let core = Arc::new(Core::new(limiter, Global, DefaultResponse));
        assert!(!Core::local(&core).legacy_headers);
        // The layer's core alone again (every service dropped), then a
        // builder step: this thread's copy has the new settings.
        let core = Core::with(core, |c| c.legacy_headers = true);
        assert!(Core::local(&core).legacy_headers);
    }
}
