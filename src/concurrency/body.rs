//! [`LeaseBody`]: a response body that holds its request's lease until it
//! ends.

use std::{
    pin::Pin,
    task::{Context, Poll, ready},
};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::Lease;

pin_project! {
    /// A response body holding the request's [`Lease`], if it has one, so
    /// that a slot stays taken while the response streams. The lease is
    /// released when the body ends or fails, or when the server drops it (a
    /// client that went away); a body the server never polls is dropped, and
    /// releases, when the response is done.
    ///
    /// It implements [`http_body::Body`] and, with the `actix` feature,
    /// actix-web's `MessageBody`.
    #[derive(Debug)]
    pub struct LeaseBody<B> {
        #[pin]
        inner: B,
        lease: Option<Lease>,
    }
}

/// An empty body holding no lease: what a layer's rejection above an
/// in-flight limit is made of ([`DefaultResponse`](crate::DefaultResponse)
/// and [`GrpcResponse`](crate::respond::GrpcResponse) fill other bodies with
/// their `Default`), so that any layer of this crate can stand above one.
impl<B: Default> Default for LeaseBody<B> {
    fn default() -> Self {
        Self::new(B::default(), None)
    }
}

/// `body` holding no lease: what a [`respond_with`](crate::RateLimitLayer::respond_with)
/// answer of a layer above an in-flight limit is made of.
impl<B> From<B> for LeaseBody<B> {
    fn from(body: B) -> Self {
        Self::new(body, None)
    }
}

impl<B> LeaseBody<B> {
    pub(crate) fn new(inner: B, lease: Option<Lease>) -> Self {
        Self { inner, lease }
    }

    /// The wrapped body, to fill (the default answer's text).
    pub(crate) fn get_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// The wrapped body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// The lease, while the body still holds it.
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// Forwards one poll of the inner body, releasing the lease once it
    /// yields its end (`None`) or an error.
    pub(crate) fn poll_inner<T, E>(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        poll: impl FnOnce(Pin<&mut B>, &mut Context<'_>) -> Poll<Option<Result<T, E>>>,
    ) -> Poll<Option<Result<T, E>>> {
        let this = self.project();
        let next = ready!(poll(this.inner, cx));
        if !matches!(next, Some(Ok(_))) {
            this.lease.take();
        }
        Poll::Ready(next)
    }
}

impl<B: Body> Body for LeaseBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.poll_inner(cx, B::poll_frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
