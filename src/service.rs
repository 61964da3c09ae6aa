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
    respond::Format,
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

impl<S: Clone, K, R, L> Clone for LimitService<S, K, R, L> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            core: self.core.clone(),
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
        let (parts, body) = req.into_parts();
        let mut check = match L::start(&self.core, &parts) {
            Ok(Start::Check(check)) => check,
            Ok(Start::Skip) => {
                let req = Request::from_parts(parts, body);
                return ResponseFuture::calling(&mut self.inner, req, None, &self.core);
            }
            Err(rejection) => {
                let format = Format::of_request(&parts.method, parts.version, &parts.headers);
                return ResponseFuture::rejected(&self.core, rejection, format);
            }
        };
        let req = Request::from_parts(parts, body);
        match L::now(&self.core, &mut check) {
            // Decided already (the memory store, a cached denial): the ready
            // inner service is called here, in place, so nothing is cloned.
            // A rejected request leaves it ready (tower allows that).
            Some(Ok(held)) => ResponseFuture::calling(&mut self.inner, req, Some(held), &self.core),
            Some(Err(rejection)) => {
                let format = Format::of_request(req.method(), req.version(), req.headers());
                ResponseFuture::rejected(&self.core, rejection, format)
            }
            None => {
                // The ready service goes to the future; a fresh clone stays.
                let clone = self.inner.clone();
                let inner = mem::replace(&mut self.inner, clone);
                ResponseFuture::checking(check, inner, req, self.core.here().clone())
            }
        }
    }
}
