//! [`Deciding`]: a decision on its way, and what follows the store's answer
//! (the breaker's record, the decision, the deny cache, metrics and logs).

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, Waker, ready},
    time::Duration,
};

use tokio::time::Instant;

use super::Inner;
use crate::{
    Decision, Error, Key,
    breaker::Pass,
    decision::{Answered, Partition, Stamp, States},
    deny_cache::Miss,
    headers::Policies,
    metrics,
    store::{BoxFuture, StoreReply},
};

/// The future of [`Limiter::decide`](super::Limiter::decide).
///
/// Most decisions are known before anything waits (bad input, a cached
/// denial, an open breaker, the in-memory store): those are `Ready` and cost
/// no allocation and no task switch. The tower service takes them with
/// [`now`](Self::now) and calls the inner service at once. A store's
/// decision is [`Settling`], held in place: boxing it cost every request on
/// the Redis path an allocation of about 500 bytes.
pub(crate) enum Deciding {
    Ready(Option<Result<Decision, Error>>),
    Settling(Settling),
    Waiting(BoxFuture<'static, Result<Decision, Error>>),
}

impl Deciding {
    /// The result, if it is known without waiting.
    pub(crate) fn now(&mut self) -> Option<Result<Decision, Error>> {
        match self {
            Deciding::Ready(result) => result.take(),
            Deciding::Settling(_) | Deciding::Waiting(_) => None,
        }
    }
}

impl Deciding {
    /// Attaches `partition` (the `pk` keys of the request's keys) to the
    /// decision, however it comes.
    pub(crate) fn partitioned(self, partition: Partition) -> Self {
        match self {
            Deciding::Ready(result) => {
                Deciding::Ready(result.map(|r| r.map(|d| d.with_partition(partition))))
            }
            Deciding::Settling(mut settling) => {
                settling.then.rare.get_or_insert_default().partition = Some(partition);
                Deciding::Settling(settling)
            }
            Deciding::Waiting(fut) => Deciding::Waiting(Box::pin(async move {
                fut.await.map(|d| d.with_partition(partition))
            })),
        }
    }
}

impl Future for Deciding {
    type Output = Result<Decision, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Deciding::Ready(result) => Poll::Ready(result.take().expect("polled after completion")),
            Deciding::Settling(settling) => Pin::new(settling).poll(cx),
            Deciding::Waiting(fut) => fut.as_mut().poll(cx),
        }
    }
}

/// A store's decision on its way ([`ProbeGuard::settling`]): the reply,
/// bounded by the timeout, then what follows it.
///
/// It is kept about as small as a ready decision, since the tower service
/// moves a [`Deciding`] a few times per request whichever it is: what only
/// some decisions carry (an enabled span, partition keys) is boxed.
pub(crate) struct Settling {
    reply: Timed<StoreReply>,
    then: Then,
}

/// What follows a store's reply: the breaker's record and the decision, in
/// the decision's span.
struct Then {
    probe: ProbeGuard,
    started: metrics::Clock,
    cost: u64,
    /// The miss's key; its epoch is the probe's, in room the probe's
    /// fields leave (a [`Miss`] here made [`Deciding`] a word larger).
    cache_key: Option<Key>,
    rare: Option<Box<Rare>>,
}

/// What only some decisions carry, boxed to keep [`Settling`] small.
#[derive(Default)]
struct Rare {
    /// The decision's span, when enabled (a disabled one records nothing).
    span: Option<tracing::Span>,
    /// Partition keys (`pk`), when the layer writes them.
    partition: Option<Partition>,
}

impl Future for Settling {
    type Output = Result<Decision, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Settling { reply, then } = self.get_mut();
        let result = {
            let _entered = then.span().map(tracing::Span::enter);
            ready!(reply.poll_within(then.probe.inner.timeout, cx))
        };
        Poll::Ready(then.finish(result))
    }
}

impl Drop for Settling {
    /// A decision its caller gave up on before the store answered (a
    /// timeout layer outside the limit, a `grpc-timeout`, a client that
    /// hung up): its call is awaited in a task of its own, within the
    /// limiter's timeout from when it was sent, and its outcome recorded
    /// with the breaker. Freeing the pass uncounted instead, a frozen Redis
    /// whose every check was given up before the timeout never opened the
    /// breaker, and every request waited until its caller's deadline. Not a
    /// decision counted in the metrics, nor a store error: no request gets
    /// it. Outside a Tokio runtime the pass is freed, as before.
    fn drop(&mut self) {
        if self.then.probe.settled {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let placeholder = Timed {
            reply: StoreReply::Alone(Box::pin(std::future::pending())),
            timer: None,
        };
        let mut reply = std::mem::replace(&mut self.reply, placeholder);
        let probe = &mut self.then.probe;
        probe.settled = true;
        let mut probe = ProbeGuard {
            inner: probe.inner.clone(),
            domain: probe.domain,
            pass: probe.pass,
            settled: false,
            epoch: 0,
        };
        let started = self.then.started;
        runtime.spawn(async move {
            let timeout = probe.inner.timeout;
            let result = std::future::poll_fn(|cx| reply.poll_within(timeout, cx)).await;
            let result = result.and_then(|answered| probe.inner.counted(answered));
            let _ = probe.record(result, started, false);
        });
    }
}

impl Then {
    /// The decision's span, when enabled.
    fn span(&self) -> Option<&tracing::Span> {
        self.rare.as_ref()?.span.as_ref()
    }

    /// The decision from the store's reply, in the decision's span.
    fn finish(&mut self, result: Result<Answered, Error>) -> Result<Decision, Error> {
        let Rare { span, partition } = self.rare.take().map(|rare| *rare).unwrap_or_default();
        let _entered = span.as_ref().map(tracing::Span::enter);
        let result = result.and_then(|answered| self.probe.inner.counted(answered));
        let (states, ends) = self.probe.record(result, self.started, true)?;
        let at = Stamp::answered(ends);
        let miss = (self.cache_key.take()).map(|key| Miss::from_parts(key, self.probe.epoch));
        let decision = (self.probe.inner).conclude(states, self.cost, miss, Some(at));
        match partition {
            Some(partition) => decision.map(|d| d.with_partition(partition)),
            None => decision,
        }
    }
}

/// A store's reply, bounded by the timeout. A `bounded` reply ends with
/// [`Error::Timeout`] by the timeout of its own accord (the batching task's
/// [`Deadline`](crate::store::Deadline)) and gets no timer; any other is
/// polled once at [`start`](Self::start) and gets one only if it is not
/// ready then: a store that answers at once needs none, and registering one
/// in Tokio's wheel costs more than such a store's whole decision.
struct Timed<F> {
    reply: F,
    /// `None` for a bounded reply.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T, F: Future<Output = Result<T, Error>> + Unpin> Timed<F> {
    /// The reply, timed to end by `timeout`; or its result, if it is ready
    /// at once.
    fn start(mut reply: F, bounded: bool, timeout: Duration) -> Result<Self, Result<T, Error>> {
        if bounded {
            return Ok(Self { reply, timer: None });
        }
        let noop = &mut Context::from_waker(Waker::noop());
        match Pin::new(&mut reply).poll(noop) {
            Poll::Ready(result) => Err(result),
            Poll::Pending => Ok(Self {
                reply,
                timer: Some(Box::pin(tokio::time::sleep(timeout))),
            }),
        }
    }

    /// Polls the reply; [`Error::Timeout`] (of `timeout`, the limiter's)
    /// once the timer fires.
    fn poll_within(&mut self, timeout: Duration, cx: &mut Context<'_>) -> Poll<Result<T, Error>> {
        if let Poll::Ready(result) = Pin::new(&mut self.reply).poll(cx) {
            return Poll::Ready(result);
        }
        match &mut self.timer {
            Some(sleep) => sleep
                .as_mut()
                .poll(cx)
                .map(|()| Err(Error::Timeout(timeout))),
            None => Poll::Pending,
        }
    }
}

impl Inner {
    /// This thread's copy of the policies, for a decision to hold: its
    /// clone writes a count no other thread's decisions write.
    pub(super) fn policies_here(&self) -> Arc<Policies> {
        self.thread_policies
            .get(|| self.policies.thread_copy())
            .clone()
    }

    /// Whether `policies` are this limiter's (its decision's).
    pub(super) fn owns(&self, policies: &Arc<Policies>) -> bool {
        Arc::ptr_eq(policies, &self.policies) || self.thread_policies.holds(policies)
    }

    /// What is left of the timeout of a request asked at `asked`.
    pub(super) fn time_left(&self, asked: Instant) -> Duration {
        self.timeout.saturating_sub(asked.elapsed())
    }

    /// A store's answer with one state per limit; else an
    /// [`Error::UnexpectedReply`], before the breaker records the call: a
    /// reply of the wrong shape is a failing store, not a success.
    pub(super) fn counted(&self, answered: Answered) -> Result<Answered, Error> {
        let limits = self.limits.len();
        match answered.0.len() {
            n if n == limits => Ok(answered),
            n => Err(Error::UnexpectedReply(format!(
                "{n} states for {limits} limits"
            ))),
        }
    }

    /// The decision from the store's states: checks their number, picks the
    /// binding limit, caches a denial under `cache_key`, counts and logs it.
    /// `at` is when it was decided, for a refund; `None` for a peek, which
    /// is neither cached nor counted.
    pub(super) fn conclude(
        &self,
        states: States,
        cost: u64,
        cache_key: Option<Miss>,
        at: Option<Stamp>,
    ) -> Result<Decision, Error> {
        let counted = at.is_some();
        let decision = self.conclude_uncounted(states, cost, cache_key, at)?;
        if counted {
            count(&decision);
        }
        Ok(decision)
    }

    /// As [`conclude`](Self::conclude), without counting the decision:
    /// for a caller that answers it only if its request is still there,
    /// and [`count`]s it then.
    pub(super) fn conclude_uncounted(
        &self,
        states: States,
        cost: u64,
        cache_key: Option<Miss>,
        at: Option<Stamp>,
    ) -> Result<Decision, Error> {
        let limits = self.limits.len();
        if states.len() != limits {
            let reply = format!("{} states for {limits} limits", states.len());
            return Err(Error::UnexpectedReply(reply));
        }
        let mut decision = Decision::new(states, self.policies_here());
        let Some(at) = at else {
            // A peek: not a decision to count in the metrics.
            tracing::trace!(
                limit = decision.policy(),
                allowed = decision.is_allowed(),
                "rate limit peek"
            );
            return Ok(decision);
        };
        decision = decision.with_spent(cost, at);
        if let (Some(cache), Some(key)) = (&self.deny_cache, cache_key) {
            match decision.is_allowed() {
                true => cache.admitted(&key),
                false => cache.insert(&key, cost, &decision),
            }
        }
        Ok(decision)
    }
}

/// Counts a decision the store made, in the metrics and the debug log.
pub(super) fn count(decision: &Decision) {
    metrics::decision(decision, false);
    tracing::debug!(
        limit = decision.policy(),
        allowed = decision.is_allowed(),
        remaining = decision.remaining(),
        shadow_denied = decision.is_shadow_denied(),
        "rate limit decision"
    );
}

/// One store call on its way: records its outcome with the breaker, and if
/// it is dropped unfinished, frees the breaker's probe slot so the next
/// check can probe. A decision its caller gave up on hands its guard to a
/// task that awaits the call instead ([`Settling`]'s `Drop`).
pub(super) struct ProbeGuard {
    pub(super) inner: Arc<Inner>,
    /// The fault domain of the call's keys, whose breaker it answers to
    /// ([`breaker::domain`](crate::breaker::domain)).
    pub(super) domain: u8,
    pub(super) pass: Pass,
    pub(super) settled: bool,
    /// The deny cache's epoch when the call was sent, for a decision's
    /// [`Miss`] (0 for any other call).
    pub(super) epoch: u32,
}

impl ProbeGuard {
    /// Settles the decision from `states`; `bounded` as for [`Timed`].
    pub(super) async fn settle(
        self,
        answer: impl Future<Output = Result<Answered, Error>> + Unpin,
        bounded: bool,
        cost: u64,
        cache_key: Option<Miss>,
        spends: bool,
    ) -> Result<Decision, Error> {
        let inner = self.inner.clone();
        let timeout = inner.timeout;
        let counting = inner.clone();
        let answer = Box::pin(async move { answer.await.and_then(|a| counting.counted(a)) });
        // A peek (`spends` false) decides nothing: its failure is not
        // counted as a store error.
        let (states, ends) = self.call_bounded(answer, bounded, timeout, spends).await?;
        let at = spends.then(|| Stamp::answered(ends));
        inner.conclude(states, cost, cache_key, at)
    }

    /// A decision that spends, settled from `reply` in `span`, in place
    /// (no box); `bounded` as for [`Timed`].
    pub(super) fn settling(
        self,
        reply: StoreReply,
        bounded: bool,
        cost: u64,
        cache_key: Option<Miss>,
        span: tracing::Span,
    ) -> Deciding {
        // An unbounded reply is polled and timed at once, which needs a
        // Tokio runtime: a tower service called outside one (its future
        // polled in one later) gets the decision started on its first poll.
        if !bounded && tokio::runtime::Handle::try_current().is_err() {
            let settled = self.settle(reply, false, cost, cache_key, true);
            return Deciding::Waiting(Box::pin(tracing::Instrument::instrument(settled, span)));
        }
        let timeout = self.inner.timeout;
        let rare = (!span.is_disabled()).then(|| {
            Box::new(Rare {
                span: Some(span),
                partition: None,
            })
        });
        let started = metrics::clock();
        let reply = {
            let _entered = rare
                .as_ref()
                .and_then(|r| r.span.as_ref())
                .map(tracing::Span::enter);
            Timed::start(reply, bounded, timeout)
        };
        let (cache_key, epoch) = match cache_key.map(Miss::into_parts) {
            Some((key, epoch)) => (Some(key), epoch),
            None => (None, 0),
        };
        let mut probe = self;
        probe.epoch = epoch;
        let mut then = Then {
            probe,
            started,
            cost,
            cache_key,
            rare,
        };
        match reply {
            Ok(reply) => Deciding::Settling(Settling { reply, then }),
            // Ready at once (a store that answers in place): no timer.
            Err(result) => Deciding::Ready(Some(then.finish(result))),
        }
    }

    /// Awaits one store call for a request asked at `asked`, bounded by
    /// what is left of its timeout (a request that waited for its key's
    /// flight has less than all of it), and records its outcome with the
    /// breaker and its latency. A failure is not counted as a store error:
    /// the caller counts it once it knows a request got it (a reservation's
    /// flight, whose request may have timed out and counted itself).
    pub(super) async fn call<T>(
        self,
        reply: impl Future<Output = Result<T, Error>> + Unpin,
        asked: Instant,
    ) -> Result<T, Error> {
        let left = self.inner.time_left(asked);
        self.call_bounded(reply, false, left, false).await
    }

    /// As [`call`](Self::call), within `left`; `bounded` as for [`Timed`];
    /// a failure counted as a store error if `counts`. A timeout is
    /// [`Error::Timeout`] of the limiter's timeout, however little was
    /// left of it.
    async fn call_bounded<T>(
        mut self,
        reply: impl Future<Output = Result<T, Error>> + Unpin,
        bounded: bool,
        left: Duration,
        counts: bool,
    ) -> Result<T, Error> {
        let started = metrics::clock();
        let timeout = self.inner.timeout;
        let result = match Timed::start(reply, bounded, left) {
            Ok(mut reply) => std::future::poll_fn(|cx| reply.poll_within(timeout, cx)).await,
            Err(result) => result,
        };
        self.record(result, started, counts)
    }

    /// Records a call's outcome (`started` by [`metrics::clock`]) with the
    /// breaker and its latency, and a failure as a store error if
    /// `counts`; the guard is settled.
    fn record<T>(
        &mut self,
        result: Result<T, Error>,
        started: metrics::Clock,
        counts: bool,
    ) -> Result<T, Error> {
        let inner = &self.inner;
        metrics::store_latency(inner.policies.metric_keys(0), started);
        self.settled = true;
        match result {
            Ok(value) => {
                inner.breaker.record(self.domain, self.pass, true);
                Ok(value)
            }
            // A store that lacks a method (a custom store's `peek`) is not
            // failing: the pass is given back, not counted against it.
            Err(e @ Error::Unsupported(_)) => {
                inner.breaker.abandon(self.domain, self.pass);
                if counts {
                    metrics::store_error(inner.policies.all_metric_keys());
                }
                Err(e)
            }
            Err(e) => {
                if inner.breaker.record(self.domain, self.pass, false)
                    && let Some(unlogged) = inner.breaker.log_opening()
                {
                    tracing::warn!(error = %e, domain = self.domain, unlogged, "rate limit store failing: circuit breaker open; store-error policy applies without calling the store until it recovers");
                }
                if counts {
                    metrics::store_error(inner.policies.all_metric_keys());
                }
                Err(e)
            }
        }
    }
}

impl Drop for ProbeGuard {
    fn drop(&mut self) {
        if !self.settled {
            self.inner.breaker.abandon(self.domain, self.pass);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tower service moves a `Deciding` a few times per request, so a
    /// store's decision on its way keeps it no larger than when only a
    /// ready decision and a box could be in it: a larger one cost the
    /// in-memory path about 130 instructions a request in copies
    /// (callgrind, `benches/server-cost.sh`).
    #[test]
    fn a_decision_on_its_way_keeps_deciding_as_small_as_a_ready_one() {
        use std::mem::size_of;
        #[allow(dead_code)]
        enum ReadyOrBoxed {
            Ready(Option<Result<Decision, Error>>),
            Waiting(BoxFuture<'static, Result<Decision, Error>>),
        }
        assert!(
            size_of::<Deciding>() <= size_of::<ReadyOrBoxed>(),
            "Deciding {} bytes, Settling {}, a ready decision or a box {}",
            size_of::<Deciding>(),
            size_of::<Settling>(),
            size_of::<ReadyOrBoxed>()
        );
    }
}
