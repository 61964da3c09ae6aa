//! [`ResponseFuture`]: the response future of [`LimitService`](crate::LimitService).

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
    Limiter, Rejection, Respond,
    core::Core,
    gate::{Admit, Gate},
    respond::Asked,
};

pin_project! {
    /// Waits for the gate's check, then either answers the rejection or
    /// calls the inner service and ends the gate's hold on its response:
    /// under the rate limit ([`RateLimitService`](crate::RateLimitService),
    /// the default `L`), it adds the rate-limit headers; under the
    /// concurrency limit ([`InFlightLimitService`](crate::concurrency::InFlightLimitService)),
    /// it hands the lease to the response body.
    // `Admit` is sealed and crate-private: `L` is a `Limiter` or a
    // `ConcurrencyLimiter`, nothing else.
    #[allow(private_bounds)]
    pub struct ResponseFuture<S, ReqBody, K, R, L = Limiter>
    where
        S: Service<Request<ReqBody>>,
        L: Admit,
    {
        #[pin]
        state: State<S, ReqBody, L>,
        core: Arc<Core<K, R, L>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody, L>
    where
        S: Service<Request<ReqBody>>,
        L: Admit,
    {
        Checking {
            check: L::Pending,
            svc: Option<S>,
            req: Option<Request<ReqBody>>,
        },
        Calling {
            #[pin]
            fut: S::Future,
            // None for a skipped request.
            held: Option<L::Held>,
        },
        Answered {
            rejection: Option<Rejection>,
            asked: Asked,
        },
    }
}

impl<S, ReqBody, K, R, L> fmt::Debug for ResponseFuture<S, ReqBody, K, R, L>
where
    S: Service<Request<ReqBody>>,
    L: Admit,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

#[allow(private_bounds)] // as on the struct
impl<S, ReqBody, K, R, L> ResponseFuture<S, ReqBody, K, R, L>
where
    S: Service<Request<ReqBody>>,
    L: Admit,
{
    pub(crate) fn checking(
        check: L::Pending,
        svc: S,
        req: Request<ReqBody>,
        core: Arc<Core<K, R, L>>,
    ) -> Self {
        Self {
            state: State::Checking {
                check,
                svc: Some(svc),
                req: Some(req),
            },
            core,
        }
    }

    /// The future of a request that passed (or was skipped, with no
    /// `held`): the inner service, which the caller has polled ready, is
    /// called now. Inlined, so the inner future is built in place rather
    /// than moved through this function's frame. `core`, as for every
    /// constructor here, is the calling service's, already this thread's
    /// copy ([`Core::localize`]).
    #[inline(always)]
    pub(crate) fn calling(
        svc: &mut S,
        req: Request<ReqBody>,
        held: Option<L::Held>,
        core: &Arc<Core<K, R, L>>,
    ) -> Self {
        Self {
            state: State::Calling {
                fut: svc.call(req),
                held,
            },
            core: Arc::clone(core),
        }
    }

    pub(crate) fn rejected(core: &Arc<Core<K, R, L>>, rejection: Rejection, asked: Asked) -> Self {
        Self {
            state: State::Answered {
                rejection: Some(rejection),
                asked,
            },
            core: Arc::clone(core),
        }
    }
}

impl<S, ReqBody, ResBody, K, R, L> Future for ResponseFuture<S, ReqBody, K, R, L>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    R: Respond<Response<ResBody>>,
    L: Admit,
{
    type Output = Result<Response<<L as Gate>::Body<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let (rejection, asked) = match this.state.as_mut().project() {
                StateProj::Checking { check, svc, req } => {
                    match ready!(L::poll(this.core, check, cx)) {
                        Ok(held) => {
                            let mut svc = svc.take().expect("polled after completion");
                            let req = req.take().expect("polled after completion");
                            let fut = svc.call(req);
                            let held = Some(held);
                            this.state.set(State::Calling { fut, held });
                            continue;
                        }
                        Err(rejection) => {
                            let req = req.as_ref().expect("polled after completion");
                            let asked =
                                Asked::of_request(req.method(), req.version(), req.headers());
                            (rejection, asked)
                        }
                    }
                }
                StateProj::Calling { fut, held } => {
                    let result = ready!(fut.poll(cx));
                    // Taken first: an error drops what the request held now.
                    let held = held.take();
                    let mut res = result?;
                    let kept = match held {
                        Some(held) => L::finish(this.core, held, &mut res),
                        None => L::Kept::default(),
                    };
                    return Poll::Ready(Ok(res.map(|body| L::body(body, kept))));
                }
                StateProj::Answered { rejection, asked } => {
                    let rejection = rejection.take().expect("polled after completion");
                    let grpc_web = asked.grpc_web.take();
                    let format = asked.format;
                    (rejection, Asked { format, grpc_web })
                }
            };
            let res: Response<ResBody> = this.core.reject(rejection, asked);
            return Poll::Ready(Ok(res.map(|body| L::body(body, L::Kept::default()))));
        }
    }
}
