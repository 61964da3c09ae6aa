//! [`Deciding`]: a decision on its way, and what follows the store's answer
//! (the breaker's record, the decision, the deny cache, metrics and logs).

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, Waker},
};

use super::Inner;
use crate::{
    Decision, Error, Key,
    breaker::Pass,
    decision::{Partition, Stamp, States},
    metrics,
    store::BoxFuture,
};

/// The future of [`Limiter::decide`](super::Limiter::decide).
///
/// Most decisions are known before anything waits (bad input, a cached
/// denial, an open breaker, the in-memory store): those are `Ready` and cost
/// no allocation and no task switch. The tower service takes them with
/// [`now`](Self::now) and calls the inner service at once.
pub(crate) enum Deciding {
    Ready(Option<Result<Decision, Error>>),
    Waiting(BoxFuture<'static, Result<Decision, Error>>),
}

impl Deciding {
    /// The result, if it is known without waiting.
    pub(crate) fn now(&mut self) -> Option<Result<Decision, Error>> {
        match self {
            Deciding::Ready(result) => result.take(),
            Deciding::Waiting(_) => None,
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
            Deciding::Waiting(fut) => fut.as_mut().poll(cx),
        }
    }
}

impl Inner {
    /// The decision from the store's states: checks their number, picks the
    /// binding limit, caches a denial under `cache_key`, counts and logs it.
    /// `at` is when it was decided, for a refund; `None` for a peek, which
    /// is neither cached nor counted.
    pub(super) fn conclude(
        &self,
        states: States,
        cost: u64,
        cache_key: Option<Key>,
        at: Option<Stamp>,
    ) -> Result<Decision, Error> {
        let limits = self.limits.len();
        if states.len() != limits {
            let reply = format!("{} states for {limits} limits", states.len());
            return Err(Error::UnexpectedReply(reply));
        }
        let mut decision = Decision::new(states, self.policies.clone());
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
        if let (Some(cache), Some(key)) = (&self.deny_cache, cache_key)
            && !decision.is_allowed()
        {
            cache.insert(key.as_bytes(), cost, &decision);
        }
        metrics::decision(&decision, false);
        tracing::debug!(
            limit = decision.policy(),
            allowed = decision.is_allowed(),
            remaining = decision.remaining(),
            shadow_denied = decision.is_shadow_denied(),
            "rate limit decision"
        );
        Ok(decision)
    }
}

/// One store call on its way: records its outcome with the breaker, and if
/// it is dropped unfinished (the request went away), frees the breaker's
/// probe slot so the next check can probe.
pub(super) struct ProbeGuard {
    pub(super) inner: Arc<Inner>,
    pub(super) pass: Pass,
    pub(super) settled: bool,
}

impl ProbeGuard {
    /// Settles the decision from `states`; `bounded` as for
    /// [`call`](Self::call).
    pub(super) async fn settle<S: Into<States>>(
        self,
        states: impl Future<Output = Result<S, Error>> + Unpin,
        bounded: bool,
        cost: u64,
        cache_key: Option<Key>,
        spends: bool,
    ) -> Result<Decision, Error> {
        let inner = self.inner.clone();
        let states = self.call_bounded(states, bounded).await?;
        let at = spends.then(|| Stamp::Local(tokio::time::Instant::now()));
        inner.conclude(states.into(), cost, cache_key, at)
    }

    /// A decision that spends, settled from `states` in `span`; `bounded`
    /// as for [`call`](Self::call).
    pub(super) fn settling<S: Into<States> + Send + 'static>(
        self,
        states: impl Future<Output = Result<S, Error>> + Unpin + Send + 'static,
        bounded: bool,
        cost: u64,
        cache_key: Option<Key>,
        span: tracing::Span,
    ) -> Deciding {
        let settled = self.settle(states, bounded, cost, cache_key, true);
        Deciding::Waiting(Box::pin(tracing::Instrument::instrument(settled, span)))
    }

    /// Awaits one store call, bounded by the timeout, and records its
    /// outcome with the breaker and the metrics.
    pub(super) async fn call<T>(
        self,
        reply: impl Future<Output = Result<T, Error>> + Unpin,
    ) -> Result<T, Error> {
        self.call_bounded(reply, false).await
    }

    /// As [`call`](Self::call); a `bounded` reply is one that ends with
    /// [`Error::Timeout`] by the timeout of its own accord (the batching
    /// task's [`Deadline`](crate::store::Deadline)), and gets no timer.
    async fn call_bounded<T>(
        mut self,
        mut reply: impl Future<Output = Result<T, Error>> + Unpin,
        bounded: bool,
    ) -> Result<T, Error> {
        let inner = self.inner.clone();
        let started = metrics::clock();
        let result = match bounded {
            true => reply.await,
            // A store that answers at once needs no timer: registering one
            // in Tokio's wheel costs more than such a store's whole decision.
            false => {
                let now = Pin::new(&mut reply).poll(&mut Context::from_waker(Waker::noop()));
                match now {
                    Poll::Ready(result) => result,
                    Poll::Pending => match tokio::time::timeout(inner.timeout, reply).await {
                        Ok(result) => result,
                        Err(_) => Err(Error::Timeout(inner.timeout)),
                    },
                }
            }
        };
        metrics::store_latency(inner.policies.metric_keys(0), started);
        self.settled = true;
        match result {
            Ok(value) => {
                inner.breaker.record(self.pass, true);
                Ok(value)
            }
            Err(e) => {
                if inner.breaker.record(self.pass, false) {
                    tracing::warn!(error = %e, "rate limit store failing: circuit breaker open; store-error policy applies without calling the store until it recovers");
                }
                metrics::store_error(inner.policies.all_metric_keys());
                Err(e)
            }
        }
    }
}

impl Drop for ProbeGuard {
    fn drop(&mut self) {
        if !self.settled {
            self.inner.breaker.abandon(self.pass);
        }
    }
}
