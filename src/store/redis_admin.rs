//! The Redis store's peek, refund and reset: one script call each, never
//! batched with decisions (they are rare, and each must be its own call).

use super::{RedisStore, general_invocation};
use crate::{
    Algorithm, Error,
    store::{BoxFuture, LimitCheck, LimitState, Refund, call::Call, scripts},
};

/// refund.lua's call.
fn refund_invocation(refunds: &[Refund]) -> Call {
    let keys: Vec<&str> = refunds.iter().map(|r| r.key.as_str()).collect();
    let mut call = Call::new(&scripts::REFUND, &keys);
    for r in refunds {
        let burst = match r.quota.algorithm() {
            Algorithm::Gcra { burst } => burst,
            _ => 0,
        };
        call.arg(r.quota.algorithm().code())
            .arg(r.quota.limit())
            .arg(r.quota.window_ms())
            .arg(burst)
            .arg(r.cost)
            .arg(r.window_end_in_ms);
    }
    call
}

impl RedisStore {
    pub(super) fn peek_call(
        &self,
        checks: Vec<LimitCheck>,
        cost: u64,
    ) -> BoxFuture<'static, Result<Vec<LimitState>, Error>> {
        self.call_one(checks, cost, |request| {
            general_invocation(&scripts::PEEK, request)
        })
    }

    pub(super) fn refund_call(
        &self,
        refunds: Vec<Refund>,
    ) -> BoxFuture<'static, Result<(), Error>> {
        if refunds.is_empty() {
            return Box::pin(std::future::ready(Ok(())));
        }
        let reply = self.run::<i64>(refund_invocation(&refunds));
        Box::pin(async move { reply.await.map(drop) })
    }

    pub(super) fn reset_call(&self, keys: Vec<String>) -> BoxFuture<'static, Result<(), Error>> {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let reply = self.run::<i64>(Call::new(&scripts::RESET, &keys));
        Box::pin(async move { reply.await.map(drop) })
    }
}
