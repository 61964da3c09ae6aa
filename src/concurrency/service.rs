//! [`InFlightLimitService`]: the tower service.

use std::{
    mem,
    sync::Arc,
    task::{Context, Poll},
};

use http::{Request, Response, request::Parts};
use tower_service::Service;

use super::{ConcurrencyLimiter, LeaseBody, ResponseFuture};
use crate::{Respond, core::Core, key::KeyExtractor, respond::Format};

/// The service made by [`InFlightLimitLayer`](super::InFlightLimitLayer).
///
/// `poll_ready` forwards to the inner service: a full key is answered with a
/// 429 response, never with backpressure, and errors are the inner service's
/// own. Response bodies are wrapped in a [`LeaseBody`], which holds the lease
/// until the body ends.
#[derive(Debug)]
pub struct InFlightLimitService<S, K, R> {
    inner: S,
    core: Arc<Core<K, R, ConcurrencyLimiter>>,
}

impl<S: Clone, K, R> Clone for InFlightLimitService<S, K, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            core: self.core.clone(),
        }
    }
}

impl<S, K, R> InFlightLimitService<S, K, R> {
    pub(crate) fn new(inner: S, core: Arc<Core<K, R, ConcurrencyLimiter>>) -> Self {
        Self { inner, core }
    }
}

impl<S, K, R, ReqBody, ResBody> Service<Request<ReqBody>> for InFlightLimitService<S, K, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor<Parts>,
    R: Respond<Response<ResBody>>,
{
    type Response = Response<LeaseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, K, R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The ready service goes to the future; a fresh clone stays here.
        let clone = self.inner.clone();
        let inner = mem::replace(&mut self.inner, clone);
        let (parts, body) = req.into_parts();
        match self.core.acquire(&parts) {
            Ok(acquire) => {
                let req = Request::from_parts(parts, body);
                ResponseFuture::acquiring(acquire, inner, req, self.core.clone())
            }
            Err(rejection) => {
                let format = Format::of_headers(&parts.headers);
                ResponseFuture::rejected(&self.core, rejection, format)
            }
        }
    }
}
