//! [`TrailersLayer`]: refunds by a `grpc-status` that comes in the
//! trailers (or gRPC-Web's trailer frame), which the rate-limit layer
//! cannot wait for.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll, ready},
};

use http::Response;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::{
    deferred::{Deferred, Pending},
    web::{Found, WebTrailers},
};

/// Refunds gRPC calls by the `grpc-status` in their trailers: put it
/// **outside** a [`RateLimitLayer`](crate::RateLimitLayer) that has
/// [`refund_when`](crate::RateLimitLayer::refund_when).
///
/// A served gRPC call is HTTP 200 with its `grpc-status` in the trailers,
/// after the body: the rate-limit layer has let the response go by then.
/// So when it would refund by a status it cannot see, it leaves the refund
/// in the response's extensions, and this layer carries it in the body
/// ([`TrailersBody`]) until the trailers come:
///
/// * their `grpc-status` is mapped to HTTP as for a status at the head
///   (0 `OK` is 200, 5 `NOT_FOUND` 404, 13 `INTERNAL` 500, ...; see
///   [`refund`](crate::refund)), and the rule decides; trailers without one
///   are 2 `UNKNOWN`, a 500;
/// * a body that ends without trailers, fails, or is dropped first (the
///   client went away) refunds nothing: the call stays charged.
///
/// A **gRPC-Web** answer (`application/grpc-web...`, `-text` too) carries
/// its trailers as its body's last frame: with a refund pending, the body's
/// frames are read as they pass (messages skipped, never kept) to that
/// frame, whose `grpc-status` decides as above. A trailer frame that is
/// compressed, larger than 16 KiB or not well-formed base64 refunds
/// nothing.
///
/// Without this layer such calls are never refunded, and a warning says so
/// once per rate-limit layer. Responses with nothing left to refund (every non-gRPC response,
/// and gRPC answers whose status was at the head) pass through as they are,
/// in a body that only forwards.
///
/// The layer changes the response body's type (to [`TrailersBody`]), which
/// tonic's `Server::layer` and axum's `Router::layer` accept. Around a
/// whole axum `Router` given to `axum::serve`, map the response back with
/// `axum::response::IntoResponse::into_response`.
///
/// ```
/// use redis_ratelimit::{Limiter, Quota, RateLimitLayer, key::PeerIp, refund::{Refund, TrailersLayer}};
/// use tower::ServiceBuilder;
///
/// // Count only failed calls: served calls are refunded by their trailers.
/// let limiter = Limiter::new(Quota::per_minute(5));
/// let layers = ServiceBuilder::new()
///     .layer(TrailersLayer::new())
///     .layer(RateLimitLayer::new(limiter, PeerIp).refund_when(Refund::Successes));
/// // tonic: Server::builder().layer(layers).add_service(..)
/// # let _ = layers;
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct TrailersLayer {
    _priv: (),
}

impl TrailersLayer {
    /// The layer.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<S> Layer<S> for TrailersLayer {
    type Service = Trailers<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Trailers { inner }
    }
}

/// The service made by [`TrailersLayer`]. `poll_ready` forwards to the
/// inner service, and errors are the inner service's own.
#[derive(Debug, Clone)]
pub struct Trailers<S> {
    inner: S,
}

impl<S, Req, B> Service<Req> for Trailers<S>
where
    S: Service<Req, Response = Response<B>>,
{
    type Response = Response<TrailersBody<B>>;
    type Error = S::Error;
    type Future = TrailersFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        TrailersFuture {
            inner: self.inner.call(req),
        }
    }
}

pin_project! {
    /// The response future of [`Trailers`]: the inner response, with its
    /// pending refund moved into its body.
    #[derive(Debug)]
    pub struct TrailersFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F, B, E> Future for TrailersFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<TrailersBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut res = ready!(self.project().inner.poll(cx))?;
        let pending = res.extensions_mut().remove::<Pending>();
        let deferred = pending.map(|p| p.take()).unwrap_or_default();
        // A gRPC-Web answer's status comes in its body's trailer frame.
        let web = (!deferred.is_empty())
            .then(|| WebTrailers::for_content_type(res.headers().get(http::header::CONTENT_TYPE)))
            .flatten()
            .map(Box::new);
        Poll::Ready(Ok(res.map(|inner| TrailersBody {
            inner,
            deferred,
            web,
        })))
    }
}

pin_project! {
    /// A response body that holds its call's refund, if it has one, until
    /// the trailers say whether to give it ([`TrailersLayer`]). Frames pass
    /// through unchanged.
    #[derive(Debug)]
    pub struct TrailersBody<B> {
        #[pin]
        inner: B,
        deferred: Vec<Deferred>,
        // For a gRPC-Web answer with a refund: the reader of its trailer
        // frame.
        web: Option<Box<WebTrailers>>,
    }
}

impl<B> TrailersBody<B> {
    /// The wrapped body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// Whether the body still holds a refund that its trailers will decide.
    pub fn holds_a_refund(&self) -> bool {
        !self.deferred.is_empty()
    }
}

impl<B: Body> Body for TrailersBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let next = ready!(this.inner.poll_frame(cx));
        match &next {
            Some(Ok(frame)) => {
                if let Some(trailers) = frame.trailers_ref() {
                    for deferred in this.deferred.drain(..) {
                        deferred.settle(trailers);
                    }
                } else if let (Some(web), Some(data)) = (this.web.as_mut(), frame.data_ref()) {
                    match web.read(data) {
                        Found::Nothing => {}
                        Found::Status(code) => {
                            for deferred in this.deferred.drain(..) {
                                deferred.settle_code(code);
                            }
                        }
                        Found::Unreadable => this.deferred.clear(),
                    }
                    if this.deferred.is_empty() {
                        *this.web = None;
                    }
                }
            }
            // The end without trailers, or an error: no refund.
            None | Some(Err(_)) => this.deferred.clear(),
        }
        Poll::Ready(next)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
