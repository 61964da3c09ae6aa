//! [`ResponseFuture`]: the response future of
//! [`InFlightLimitService`](super::InFlightLimitService).

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

use super::{Acquired, ConcurrencyLimiter, Lease, LeaseBody};
use crate::{Error, Rejection, Respond, core::Core, respond::Format, store::BoxFuture};

pin_project! {
    /// Waits for a slot, then either answers the rejection or calls the inner
    /// service, holding the lease, and hands the lease to the response body.
    pub struct ResponseFuture<S, ReqBody, K, R>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody>,
        core: Arc<Core<K, R, ConcurrencyLimiter>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        Acquiring {
            acquire: BoxFuture<'static, Result<Acquired, Error>>,
            svc: Option<S>,
            req: Option<Request<ReqBody>>,
        },
        Calling {
            #[pin]
            fut: S::Future,
            // Dropped with the future: on an error, a panic or a disconnect.
            lease: Option<Lease>,
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
    pub(crate) fn acquiring(
        acquire: BoxFuture<'static, Result<Acquired, Error>>,
        svc: S,
        req: Request<ReqBody>,
        core: Arc<Core<K, R, ConcurrencyLimiter>>,
    ) -> Self {
        Self {
            state: State::Acquiring {
                acquire,
                svc: Some(svc),
                req: Some(req),
            },
            core,
        }
    }

    pub(crate) fn rejected(
        core: &Arc<Core<K, R, ConcurrencyLimiter>>,
        rejection: Rejection,
        format: Format,
    ) -> Self {
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
    type Output = Result<Response<LeaseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Acquiring { acquire, svc, req } => {
                    let result = ready!(acquire.as_mut().poll(cx));
                    match this.core.admit(result) {
                        Ok(lease) => {
                            let mut svc = svc.take().expect("polled after completion");
                            let req = req.take().expect("polled after completion");
                            let fut = svc.call(req);
                            this.state.set(State::Calling { fut, lease });
                        }
                        Err(rejection) => {
                            let req = req.as_ref().expect("polled after completion");
                            let format = Format::of_headers(req.headers());
                            let res = this.core.reject::<Response<ResBody>>(rejection, format);
                            return Poll::Ready(Ok(res.map(|body| LeaseBody::new(body, None))));
                        }
                    }
                }
                StateProj::Calling { fut, lease } => {
                    let result = ready!(fut.poll(cx));
                    let lease = lease.take();
                    let mut res = result?;
                    if let Some(lease) = &lease {
                        lease.write_headers(&mut res);
                    }
                    return Poll::Ready(Ok(res.map(|body| LeaseBody::new(body, lease))));
                }
                StateProj::Answered { rejection, format } => {
                    let rejection = rejection.take().expect("polled after completion");
                    let res = this.core.reject::<Response<ResBody>>(rejection, *format);
                    return Poll::Ready(Ok(res.map(|body| LeaseBody::new(body, None))));
                }
            }
        }
    }
}
