//! The Redis store's peek, refund and reset: one script call each, never
//! batched with decisions (they are rare, and each must be its own call).

use super::{RedisStore, general_invocation};
use crate::{
    Algorithm, Error,
    store::{BoxFuture, LimitCheck, LimitState, Refund, Reservation, call::Call, scripts},
};

/// `keys` and, last, the marker that makes a call of `kind` run once
/// however often it is sent (`lua/once.lua`), with the call's id.
fn once<'a>(keys: impl Iterator<Item = &'a str>, kind: &str) -> (Vec<String>, String) {
    let id = crate::random::unique_id();
    let mut keys: Vec<String> = keys.map(str::to_owned).collect();
    if let Some(first) = keys.first() {
        keys.push(format!("{first}#{kind}:{id}"));
    }
    (keys, id)
}

/// refund.lua's call, which credits once however often it is sent.
fn refund_invocation(refunds: &[Refund]) -> Call {
    let (keys, id) = once(refunds.iter().map(|r| r.key.as_str()), "rf");
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
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
            .arg(r.window_end_in_ms)
            .arg(r.spend_ends_at_us.unwrap_or(0));
    }
    call.arg(id);
    call
}

impl RedisStore {
    pub(super) fn peek_call(
        &self,
        checks: Vec<LimitCheck>,
        cost: u64,
    ) -> BoxFuture<'static, Result<Vec<LimitState>, Error>> {
        let peek = self.call_one(checks, cost, |request| {
            general_invocation(&scripts::PEEK, request)
        });
        Box::pin(async move { peek.await.map(|(states, _)| states.into_vec()) })
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

    /// reserve.lua's call: `{granted, remaining, ttl_ms}`.
    pub(super) fn reserve_call(
        &self,
        check: LimitCheck,
        need: u64,
        want: u64,
    ) -> BoxFuture<'static, Result<Reservation, Error>> {
        let mut call = Call::new(&scripts::RESERVE, &[check.key.as_str()]);
        call.arg(check.quota.limit())
            .arg(check.quota.window_ms())
            .arg(need)
            .arg(want);
        let reply = self.run::<Vec<i64>>(call);
        Box::pin(async move {
            let reply = reply.await?;
            let n = |i: usize| reply.get(i).and_then(|v| u64::try_from(*v).ok());
            match (reply.len(), n(0), n(1), n(2)) {
                (3, Some(granted), Some(remaining), Some(ttl)) if granted <= want => {
                    Ok(Reservation::new(granted, remaining, ttl))
                }
                _ => Err(Error::UnexpectedReply(format!(
                    "reserve returned {reply:?}"
                ))),
            }
        })
    }

    pub(super) fn reset_call(&self, keys: Vec<String>) -> BoxFuture<'static, Result<(), Error>> {
        if keys.is_empty() {
            return Box::pin(std::future::ready(Ok(())));
        }
        // Run twice, it would forget what was charged in between: once.lua.
        let (keys, id) = once(keys.iter().map(String::as_str), "rs");
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut call = Call::new(&scripts::RESET, &keys);
        call.arg(id);
        let reply = self.run::<i64>(call);
        Box::pin(async move { reply.await.map(drop) })
    }
}
