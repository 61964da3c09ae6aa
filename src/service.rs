//! [`LimitService`]: the tower service, over either [`Gate`].

use std::{
    mem,
    sync::Arc,
    task::{Context, Poll},
};

use http::{Request, Response, request::Parts};
use tower_service::Service;

use crate::{
    Limiter, Respond, ResponseFuture,
    core::Core,
    gate::{Admit, Gate, Start},
    key::KeyExtractor,
    respond::Asked,
};

/// The service made by a [`LimitLayer`](crate::LimitLayer): a
/// [`RateLimitService`] or an
/// [`InFlightLimitService`](crate::concurrency::InFlightLimitService),
/// depending on its [`Gate`].
///
/// `poll_ready` forwards to the inner service; a rejection is a response,
/// never backpressure, and errors are the inner service's own.
#[derive(Debug)]
pub struct LimitService<S, K, R, L> {
    inner: S,
    core: Arc<Core<K, R, L>>,
}

/// The service made by [`RateLimitLayer`](crate::RateLimitLayer).
///
/// `poll_ready` forwards to the inner service; a rejection is a response,
/// never backpressure, and errors are the inner service's own.
pub type RateLimitService<S, K, R> = LimitService<S, K, R, Limiter>;

// A clone holds this thread's copy of the layer's core (`Core::local`):
// hyper, tonic and axum's routes clone the service for every request, and
// a clone of the one shared core would write its count from every worker.
impl<S: Clone, K, R, L: Clone> Clone for LimitService<S, K, R, L> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            core: Core::local(&self.core),
        }
    }
}

impl<S, K, R, L> LimitService<S, K, R, L> {
    pub(crate) fn new(inner: S, core: Arc<Core<K, R, L>>) -> Self {
        Self { inner, core }
    }
}

impl<S, K, R, L, ReqBody, ResBody> Service<Request<ReqBody>> for LimitService<S, K, R, L>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor<Parts>,
    R: Respond<Response<ResBody>>,
    L: Admit,
{
    type Response = Response<<L as Gate>::Body<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, K, R, L>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        Core::localize(&mut self.core);
        let (parts, body) = req.into_parts();
        let mut check = match L::start(&self.core, &parts) {
            Ok(Start::Check(check)) => check,
            Ok(Start::Skip) => {
                let req = Request::from_parts(parts, body);
                return ResponseFuture::calling(&mut self.inner, req, None, &self.core);
            }
            Err(rejection) => {
                let asked = Asked::of_request(&parts.method, parts.version, &parts.headers);
                return ResponseFuture::rejected(&self.core, rejection, asked);
            }
        };
        let req = Request::from_parts(parts, body);
        match L::now(&self.core, &mut check) {
            // Decided already (the memory store, a cached denial): the ready
            // inner service is called here, in place, so nothing is cloned.
            // A rejected request leaves it ready (tower allows that).
            Some(Ok(held)) => ResponseFuture::calling(&mut self.inner, req, Some(held), &self.core),
            Some(Err(rejection)) => {
                let asked = Asked::of_request(req.method(), req.version(), req.headers());
                ResponseFuture::rejected(&self.core, rejection, asked)
            }
            None => {
                // The ready service goes to the future; a fresh clone stays.
                let clone = self.inner.clone();
                let inner = mem::replace(&mut self.inner, clone);
                ResponseFuture::checking(check, inner, req, Arc::clone(&self.core))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{convert::Infallible, sync::Arc};

    use http::{Request, Response};
    use tower::{Layer, Service, ServiceExt, service_fn};

    use crate::{Limiter, Quota, RateLimitLayer, core::Core, key::Global};

    async fn ok(_: Request<()>) -> Result<Response<()>, Infallible> {
        Ok(Response::new(()))
    }

    fn layer() -> RateLimitLayer<Global> {
        RateLimitLayer::new(Limiter::new(Quota::per_minute(5)), Global)
    }

    /// hyper, tonic and axum's routes clone the service for every request:
    /// a clone holds this thread's copy of the core, so the clones of one
    /// thread never write the count of the core the layer shares.
    #[test]
    fn a_clone_of_the_service_holds_this_threads_copy_of_the_core() {
        let svc = layer().layer(service_fn(ok));
        let shared = Arc::clone(&svc.core);
        let count = Arc::strong_count(&shared);
        let clones: Vec<_> = (0..16).map(|_| svc.clone()).collect();
        let again: Vec<_> = clones.iter().map(Clone::clone).collect();
        assert_eq!(
            Arc::strong_count(&shared),
            count,
            "the shared core is not cloned"
        );
        let here = &clones[0].core;
        assert!(!Arc::ptr_eq(here, &shared));
        let all = clones.iter().chain(&again);
        assert!(all.into_iter().all(|c| Arc::ptr_eq(&c.core, here)));
    }

    /// A connection's service is made on the thread that accepted it and
    /// called on a worker: a call takes the worker's copy for good.
    #[tokio::test]
    async fn a_call_makes_the_service_hold_this_threads_copy() {
        let mut svc = layer().layer(service_fn(ok));
        let shared = Arc::clone(&svc.core);
        svc.ready().await.unwrap();
        let res = svc.call(Request::new(())).await.unwrap();
        assert_eq!(res.status(), 200);
        assert!(!Arc::ptr_eq(&svc.core, &shared));
        assert!(Arc::ptr_eq(&svc.core, &Core::local(&shared)));
    }
}
