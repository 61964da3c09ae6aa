//! [`Gate`]: what a middleware limits with, and the one shape both
//! middlewares share.
//!
//! The tower trio ([`LimitLayer`](crate::LimitLayer),
//! [`LimitService`](crate::LimitService), [`ResponseFuture`](crate::ResponseFuture))
//! and the actix middleware are written once, over a gate: a [`Limiter`]
//! (the rate limit) or a [`ConcurrencyLimiter`](crate::concurrency::ConcurrencyLimiter)
//! (requests in flight). A gate makes two choices, and the adapters make
//! none:
//!
//! 1. **before the call**, the decision: a rate-limit [`Decision`], or a
//!    lease on a slot ([`Admit::start`], [`Admit::poll`]);
//! 2. **while the response runs**, what the request holds and how it ends
//!    ([`Admit::finish`], [`Admit::body`]): the rate limit writes its
//!    headers and may refund; the concurrency limit writes its headers and
//!    hands its lease to the response body.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll, ready},
};

use crate::{
    Decision, Limiter, Rejection,
    core::{Core, Pending, Verdict},
    headers::HeaderSink,
    key::KeyExtractor,
    refund::{Charged, RequestHead, ResponseHead},
};

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::Limiter {}
    impl Sealed for crate::concurrency::ConcurrencyLimiter {}
}

/// What a middleware limits with: a [`Limiter`] for
/// [`RateLimitLayer`](crate::RateLimitLayer), a
/// [`ConcurrencyLimiter`](crate::concurrency::ConcurrencyLimiter) for
/// [`InFlightLimitLayer`](crate::InFlightLimitLayer). Sealed: the crate
/// implements it for those two.
pub trait Gate: sealed::Sealed {
    /// The body of a response through the middleware: the inner service's
    /// own under the rate limit, a [`LeaseBody`](crate::concurrency::LeaseBody)
    /// holding the lease under the concurrency limit.
    type Body<B>;
}

/// How a request's check starts.
pub(crate) enum Start<P> {
    /// The request is skipped: call the inner service, no headers.
    Skip,
    /// The check is on its way.
    Check(P),
}

/// How a check starts: skipped, on its way, or rejected at once.
pub(crate) type Started<P> = Result<Start<P>, Rejection>;

/// A gate's two choices, shared by the tower and actix adapters.
pub(crate) trait Admit: Gate + Clone + Sized {
    /// A check on its way.
    type Pending: 'static;
    /// What a passed request holds while the inner service runs.
    type Held: 'static;
    /// What the response body keeps once the response is out.
    type Kept: Default + 'static;

    /// Starts the check of `req`; or skips it, or rejects it at once (a
    /// request without a key).
    fn start<K: KeyExtractor<Req>, R, Req: ?Sized + RequestHead>(
        core: &Core<K, R, Self>,
        req: &Req,
    ) -> Started<Self::Pending>;

    /// The check's outcome, if it is known without waiting: the adapter
    /// then calls the ready inner service in place.
    fn now<K, R>(
        _core: &Core<K, R, Self>,
        _pending: &mut Self::Pending,
    ) -> Option<Result<Self::Held, Rejection>> {
        None
    }

    /// Polls the check: pass, holding what the response needs, or reject.
    fn poll<K, R>(
        core: &Core<K, R, Self>,
        pending: &mut Self::Pending,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::Held, Rejection>>;

    /// Ends a passed request's hold on its response `res`: its head to
    /// read, and its headers to write on.
    fn finish<K, R>(
        core: &Core<K, R, Self>,
        held: Self::Held,
        res: &mut (impl HeaderSink + ResponseHead),
    ) -> Self::Kept;

    /// The response body, keeping what it needs until it ends.
    fn body<B>(body: B, kept: Self::Kept) -> Self::Body<B>;
}

impl Gate for Limiter {
    type Body<B> = B;
}

/// The rate limit: decide, then write the decision's headers on the
/// response and refund its cost if the response's status says so (a gRPC
/// response's `grpc-status`, when it is at the head).
impl Admit for Limiter {
    /// The decision on its way and, with refunds on, what it spends.
    type Pending = Pending;
    /// The decision (none when a failed store let the request through) and
    /// what it spent.
    type Held = (Option<Decision>, Option<Charged>);
    type Kept = ();

    fn start<K: KeyExtractor<Req>, R, Req: ?Sized + RequestHead>(
        core: &Core<K, R, Self>,
        req: &Req,
    ) -> Started<Self::Pending> {
        core.start(req)
    }

    fn now<K, R>(
        core: &Core<K, R, Self>,
        check: &mut Self::Pending,
    ) -> Option<Result<Self::Held, Rejection>> {
        let result = check.deciding.now()?;
        Some(pass(core.verdict(result, check.dry), &mut check.spent))
    }

    fn poll<K, R>(
        core: &Core<K, R, Self>,
        check: &mut Self::Pending,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::Held, Rejection>> {
        let result = ready!(Pin::new(&mut check.deciding).poll(cx));
        Poll::Ready(pass(core.verdict(result, check.dry), &mut check.spent))
    }

    fn finish<K, R>(
        core: &Core<K, R, Self>,
        (decision, spent): Self::Held,
        res: &mut (impl HeaderSink + ResponseHead),
    ) {
        if let Some(d) = decision {
            if let Some(spent) = spent {
                core.settle(res, &d, spent);
            }
            core.decorate(res, &d);
        }
    }

    fn body<B>(body: B, (): ()) -> B {
        body
    }
}

fn pass(
    verdict: Verdict,
    spent: &mut Option<Charged>,
) -> Result<(Option<Decision>, Option<Charged>), Rejection> {
    match verdict {
        Verdict::Pass(decision) => Ok((decision, spent.take())),
        Verdict::Reject(rejection) => Err(rejection),
    }
}
