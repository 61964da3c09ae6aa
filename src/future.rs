//! [`ResponseFuture`]: the response future of [`RateLimitService`](crate::RateLimitService).

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::{
    Decision, Error, Rejection, Respond,
    core::{Core, Verdict},
    limiter::Deciding,
    refund::Charged,
    respond::Format,
};

pin_project! {
    /// Waits for the rate-limit check, then either answers the rejection or
    /// calls the inner service and adds the rate-limit headers to its response.
    pub struct ResponseFuture<S, ReqBody, K, R>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody>,
        core: Arc<Core<K, R>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        Checking {
            check: Deciding,
            svc: Option<S>,
            req: Option<Request<ReqBody>>,
            spent: Option<Charged>,
        },
        Calling {
            #[pin]
            fut: S::Future,
            decision: Option<Decision>,
            spent: Option<Charged>,
        },
        Answered {
            rejection: Option<Rejection>,
            format: Format,
        },
    }
}

impl<S, ReqBody, K, R> fmt::Debug for ResponseFuture<S, ReqBody, K, R>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, ReqBody, K, R> ResponseFuture<S, ReqBody, K, R>
where
    S: Service<Request<ReqBody>>,
{
    pub(crate) fn checking(
        check: Deciding,
        svc: S,
        req: Request<ReqBody>,
        core: Arc<Core<K, R>>,
        spent: Option<Charged>,
    ) -> Self {
        Self {
            state: State::Checking {
                check,
                svc: Some(svc),
                req: Some(req),
                spent,
            },
            core,
        }
    }

    /// The future of a request whose decision is known: the inner service,
    /// which the caller has polled ready, is called now if it passes. A
    /// rejected request leaves it ready (tower allows that) for the next.
    pub(crate) fn decided(
        result: Result<Decision, Error>,
        svc: &mut S,
        req: Request<ReqBody>,
        core: &Arc<Core<K, R>>,
        spent: Option<Charged>,
    ) -> Self {
        match core.verdict(result) {
            Verdict::Pass(decision) => Self {
                state: State::Calling {
                    fut: svc.call(req),
                    decision,
                    spent,
                },
                core: core.clone(),
            },
            Verdict::Reject(rejection) => {
                Self::rejected(core, rejection, Format::of_headers(req.headers()))
            }
        }
    }

    /// The future of a skipped request: the ready inner service is called
    /// now, and its response left as it is.
    pub(crate) fn skipped(svc: &mut S, req: Request<ReqBody>, core: &Arc<Core<K, R>>) -> Self {
        Self {
            state: State::Calling {
                fut: svc.call(req),
                decision: None,
                spent: None,
            },
            core: core.clone(),
        }
    }

    pub(crate) fn rejected(core: &Arc<Core<K, R>>, rejection: Rejection, format: Format) -> Self {
        Self {
            state: State::Answered {
                rejection: Some(rejection),
                format,
            },
            core: core.clone(),
        }
    }
}

impl<S, ReqBody, ResBody, K, R> Future for ResponseFuture<S, ReqBody, K, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    R: Respond<Response<ResBody>>,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking {
                    check,
                    svc,
                    req,
                    spent,
                } => {
                    let result = ready!(Pin::new(check).poll(cx));
                    match this.core.verdict(result) {
                        Verdict::Pass(decision) => {
                            let mut svc = svc.take().expect("polled after completion");
                            let req = req.take().expect("polled after completion");
                            let fut = svc.call(req);
                            let spent = spent.take();
                            this.state.set(State::Calling {
                                fut,
                                decision,
                                spent,
                            });
                        }
                        Verdict::Reject(rejection) => {
                            let req = req.as_ref().expect("polled after completion");
                            let format = Format::of_headers(req.headers());
                            return Poll::Ready(Ok(this.core.reject(rejection, format)));
                        }
                    }
                }
                StateProj::Calling {
                    fut,
                    decision,
                    spent,
                } => {
                    let mut res = ready!(fut.poll(cx))?;
                    if let Some(d) = decision.take() {
                        if let Some(spent) = spent.take() {
                            this.core.settle(res.status(), &d, spent);
                        }
                        this.core.decorate(&mut res, &d);
                    }
                    return Poll::Ready(Ok(res));
                }
                StateProj::Answered { rejection, format } => {
                    let rejection = rejection.take().expect("polled after completion");
                    return Poll::Ready(Ok(this.core.reject(rejection, *format)));
                }
            }
        }
    }
}
