//! [`RateLimitService`]: the tower service.

use std::{
    mem,
    sync::Arc,
    task::{Context, Poll},
};

use http::{Request, Response, request::Parts};
use tower_service::Service;

use crate::{
    Respond, ResponseFuture,
    core::{Core, Start},
    key::KeyExtractor,
    respond::Format,
};

/// The service made by [`RateLimitLayer`](crate::RateLimitLayer).
///
/// `poll_ready` forwards to the inner service; a rejection is a response,
/// never backpressure, and errors are the inner service's own.
#[derive(Debug)]
pub struct RateLimitService<S, K, R> {
    inner: S,
    core: Arc<Core<K, R>>,
}

impl<S: Clone, K, R> Clone for RateLimitService<S, K, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            core: self.core.clone(),
        }
    }
}

impl<S, K, R> RateLimitService<S, K, R> {
    pub(crate) fn new(inner: S, core: Arc<Core<K, R>>) -> Self {
        Self { inner, core }
    }
}

impl<S, K, R, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimitService<S, K, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor<Parts>,
    R: Respond<Response<ResBody>>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, K, R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let (parts, body) = req.into_parts();
        let (mut check, spent) = match self.core.start(&parts) {
            Ok(Start::Check(check, spent)) => (check, spent),
            Ok(Start::Skip) => {
                let req = Request::from_parts(parts, body);
                return ResponseFuture::skipped(&mut self.inner, req, &self.core);
            }
            Err(rejection) => {
                let format = Format::of_headers(&parts.headers);
                return ResponseFuture::rejected(&self.core, rejection, format);
            }
        };
        let req = Request::from_parts(parts, body);
        match check.now() {
            // Decided already (the memory store, a cached denial): the ready
            // inner service is called here, in place, so nothing is cloned.
            Some(result) => {
                ResponseFuture::decided(result, &mut self.inner, req, &self.core, spent)
            }
            None => {
                // The ready service goes to the future; a fresh clone stays.
                let clone = self.inner.clone();
                let inner = mem::replace(&mut self.inner, clone);
                ResponseFuture::checking(check, inner, req, self.core.clone(), spent)
            }
        }
    }
}
