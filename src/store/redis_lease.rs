//! [`LeaseStore`] for [`RedisStore`]: one Lua script call per acquire,
//! renewal and release, all on Redis's clock.
//!
//! A child module of `redis.rs`, so that it reaches the store's `run`.

use super::{Call, RedisStore};
use crate::{
    Error,
    store::{
        BoxFuture, LeaseState, LeaseStore,
        scripts::{ACQUIRE, RELEASE, RENEW},
    },
};

/// A reply of 0 or 1 as a bool.
fn flag(script: &str, n: i64) -> Result<bool, Error> {
    match n {
        0 | 1 => Ok(n == 1),
        _ => Err(Error::UnexpectedReply(format!("{script} returned {n}"))),
    }
}

impl LeaseStore for RedisStore {
    fn instance(&self) -> Option<usize> {
        crate::Store::instance(self)
    }

    fn acquire(
        &self,
        key: &str,
        token: &str,
        limit: u64,
        lease_ms: u64,
    ) -> BoxFuture<'static, Result<LeaseState, Error>> {
        let mut call = Call::new(&ACQUIRE, &[key]);
        call.arg(limit).arg(lease_ms).arg(token);
        let reply = self.run::<(i64, i64)>(call);
        Box::pin(async move {
            let (acquired, held) = reply.await?;
            match (flag("concurrency_acquire", acquired), u64::try_from(held)) {
                (Ok(acquired), Ok(held)) => Ok(LeaseState { acquired, held }),
                _ => Err(Error::UnexpectedReply(format!(
                    "concurrency_acquire returned [{acquired}, {held}]"
                ))),
            }
        })
    }

    fn renew(
        &self,
        key: &str,
        token: &str,
        lease_ms: u64,
    ) -> BoxFuture<'static, Result<bool, Error>> {
        let mut call = Call::new(&RENEW, &[key]);
        call.arg(lease_ms).arg(token);
        let reply = self.run::<i64>(call);
        Box::pin(async move { flag("concurrency_renew", reply.await?) })
    }

    fn release(&self, key: &str, token: &str) -> BoxFuture<'static, Result<bool, Error>> {
        let mut call = Call::new(&RELEASE, &[key]);
        call.arg(token);
        let reply = self.run::<i64>(call);
        Box::pin(async move { flag("concurrency_release", reply.await?) })
    }

    /// The same domains as the rate limits': a range of hash slots on a
    /// cluster, one for the rest.
    fn fault_domain(&self, key: &str) -> usize {
        crate::Store::fault_domain(self, key)
    }
}
