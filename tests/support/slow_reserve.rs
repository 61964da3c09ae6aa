//! A store whose reserve calls are slow: for tests of what a limiter does
//! while a reservation's flight is out.

use std::time::Duration;

use redis_ratelimit::{
    Error, MemoryStore,
    store::{BoxFuture, LimitCheck, LimitState, Reservation, Store},
};

/// A store whose reserve calls each take 150 ms on Tokio's clock, granting
/// all they are asked from a window that never runs out here: a slow Redis,
/// without sockets, so that paused time drives the test. Checks go to the
/// in-memory store.
#[derive(Debug, Default)]
pub struct SlowReserve {
    memory: MemoryStore,
}

impl Store for SlowReserve {
    fn decide(
        &self,
        checks: Vec<LimitCheck>,
        cost: u64,
    ) -> BoxFuture<'static, Result<Vec<LimitState>, Error>> {
        self.memory.decide(checks, cost)
    }

    fn supports_reservation(&self) -> bool {
        true
    }

    fn reserve(
        &self,
        _check: LimitCheck,
        _need: u64,
        want: u64,
    ) -> BoxFuture<'static, Result<Reservation, Error>> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            Ok(Reservation::new(want, 1_000_000, 60_000))
        })
    }
}
