//! The concurrency limit as a [`Gate`]: acquire a lease before the call,
//! hold it while the response runs, and hand it to the response body.

use std::task::{Context, Poll, ready};

use super::{Acquired, ConcurrencyLimiter, Lease, LeaseBody};
use crate::{
    Error, Rejection,
    core::Core,
    gate::{Admit, Gate, Start, Started},
    headers::HeaderSink,
    key::KeyExtractor,
    refund::{RequestHead, ResponseHead},
    store::BoxFuture,
};

impl Gate for ConcurrencyLimiter {
    type Body<B> = LeaseBody<B>;
}

impl Admit for ConcurrencyLimiter {
    type Pending = BoxFuture<'static, Result<Acquired, Error>>;
    /// The lease; none when a failed store let the request through.
    /// Dropped with the response future: on an error, a panic or a
    /// disconnect.
    type Held = Option<Lease>;
    type Kept = Option<Lease>;

    /// Skips the request if its extractor says so (a
    /// [`Skipping`](crate::skip::Skipping) one), as the rate limit does; else
    /// derives its key and starts its acquire.
    fn start<K: KeyExtractor<Req>, R, Req: ?Sized + RequestHead>(
        core: &Core<K, R, Self>,
        req: &Req,
    ) -> Started<Self::Pending> {
        if core.extractor.skip(req) {
            return Ok(Start::Skip);
        }
        let key = core.key(req)?;
        Ok(Start::Check(core.limiter.start(key.as_bytes())))
    }

    /// Applies the store-error policy to a finished acquire: pass with the
    /// lease (or with none, when the store failed and the policy allows),
    /// or reject.
    fn poll<K, R>(
        core: &Core<K, R, Self>,
        acquire: &mut Self::Pending,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::Held, Rejection>> {
        Poll::Ready(match ready!(acquire.as_mut().poll(cx)) {
            Ok(Acquired::Lease(lease)) => Ok(Some(lease)),
            Ok(Acquired::Busy(busy)) => Err(Rejection::Busy(busy)),
            Err(e) => core.store_failed(e).map_or(Ok(None), Err),
        })
    }

    fn finish<K, R>(
        _core: &Core<K, R, Self>,
        lease: Self::Held,
        res: &mut (impl HeaderSink + ResponseHead),
    ) -> Option<Lease> {
        if let Some(lease) = &lease {
            lease.write_headers(res);
        }
        lease
    }

    fn body<B>(body: B, lease: Option<Lease>) -> LeaseBody<B> {
        LeaseBody::new(body, lease)
    }
}
