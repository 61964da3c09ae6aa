//! A refund that waits for the trailers: [`Pending`], which the rate-limit
//! service leaves in a gRPC or gRPC-Web response's extensions when its
//! `grpc-status` is not at the head, and which a
//! [`TrailersLayer`](super::TrailersLayer) outside it takes into the
//! response body.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, Ordering},
};

use http::HeaderMap;

use super::{Charged, GRPC_STATUS, Refund, grpc_code};
use crate::Decision;

/// What a refund by the trailers needs: the rule, what was spent, and the
/// decision that spent it.
#[derive(Debug)]
pub(crate) struct Deferred {
    refund: Refund,
    spent: Charged,
    decision: Decision,
    /// The layer's flag: whether it said already that such a refund found
    /// no [`TrailersLayer`](super::TrailersLayer).
    logged: Arc<AtomicBool>,
}

impl Deferred {
    pub(crate) fn new(
        refund: Refund,
        spent: Charged,
        decision: Decision,
        logged: Arc<AtomicBool>,
    ) -> Self {
        Self {
            refund,
            spent,
            decision,
            logged,
        }
    }

    /// Gives the cost back if the trailers' `grpc-status` is one to refund.
    /// Trailers without one are read as gRPC reads them, 2 `UNKNOWN` (a
    /// 500).
    pub(crate) fn settle(self, trailers: &HeaderMap) {
        let code = trailers
            .get(&GRPC_STATUS)
            .map_or(&b""[..], |v| v.as_bytes());
        self.settle_code(grpc_code(code));
    }

    /// Gives the cost back if `code`, a `grpc-status` read off the
    /// trailers ([`grpc_code`]; `None` is 2 `UNKNOWN`), is one to refund.
    pub(crate) fn settle_code(self, code: Option<u8>) {
        if self.refund.applies_to_grpc(code) {
            self.spent.refund(&self.decision);
        }
    }
}

/// The [`Deferred`] refunds of a response, in its extensions, which need
/// `Clone`: clones share one slot, and only the first [`take`](Self::take)
/// gets them, so a refund is never given twice. Each rate-limit layer with
/// refunds adds its own (layers may be nested).
#[derive(Debug, Clone)]
pub(crate) struct Pending(Arc<Slot>);

impl Pending {
    /// Adds `deferred` to the response's pending refunds.
    pub(crate) fn defer(extensions: &mut http::Extensions, deferred: Deferred) {
        match extensions.get::<Pending>() {
            Some(pending) => pending.lock().push(deferred),
            None => {
                let slot = Slot(Mutex::new(vec![deferred]));
                extensions.insert(Pending(Arc::new(slot)));
            }
        }
    }

    /// The refunds, unless a clone took them already.
    pub(crate) fn take(&self) -> Vec<Deferred> {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Deferred>> {
        // A panic while it was held left a list that is still whole.
        self.0
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[derive(Debug)]
struct Slot(Mutex<Vec<Deferred>>);

/// Refunds nobody took: no [`TrailersLayer`](super::TrailersLayer) stood
/// outside the rate-limit layer, so the call stays charged. Said once per
/// rate-limit layer.
impl Drop for Slot {
    fn drop(&mut self) {
        // As in `lock`: a poisoned list is still whole, and still untaken.
        let untaken = self
            .0
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if untaken.iter().any(Deferred::first_untaken) {
            warn_untaken();
        }
    }
}

impl Deferred {
    /// Drops a refund that no [`TrailersLayer`](super::TrailersLayer) can
    /// take (a response kind without trailers: actix-web's), saying so once
    /// per rate-limit layer.
    pub(crate) fn untaken(self) {
        if self.first_untaken() {
            warn_untaken();
        }
    }

    /// Whether this is the first of its layer's refunds left untaken.
    fn first_untaken(&self) -> bool {
        !self.logged.swap(true, Ordering::Relaxed)
    }
}

fn warn_untaken() {
    tracing::warn!(
        "rate limit: a gRPC response's grpc-status is in its trailers (or a gRPC-Web \
         body's trailer frame), and no refund::TrailersLayer outside the rate-limit layer \
         read them: such calls are never refunded (logged once per layer)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limiter, Quota};

    #[tokio::test]
    async fn clones_share_the_refunds_and_give_them_once() {
        let limiter = Limiter::new(Quota::per_minute(1));
        let decision = limiter.check("k", 1).await.unwrap();
        let deferred = || {
            let spent = Charged::new(&limiter, smallvec::smallvec![], true);
            Deferred::new(
                Refund::Successes,
                spent,
                decision.clone(),
                Default::default(),
            )
        };
        let mut extensions = http::Extensions::new();
        Pending::defer(&mut extensions, deferred());
        // A second rate-limit layer's refund joins the first.
        Pending::defer(&mut extensions, deferred());
        let clone = extensions.clone();
        let pending = extensions.get::<Pending>().unwrap();
        assert_eq!(clone.get::<Pending>().unwrap().take().len(), 2);
        assert!(pending.take().is_empty());
    }
}
