//! [`Limiter::until_ready`]: waiting until a request fits.

use std::time::Duration;

use tokio::time::Instant;

use super::Limiter;
use crate::{Decision, Error};

impl Limiter {
    /// Checks `key`, and while denied, waits and checks again until the
    /// request is admitted or `max_wait` would be exceeded: a distributed
    /// throttle, say at most 10 calls a second to a third-party API across
    /// every replica.
    ///
    /// Each wait is the denial's [`retry_after`](Decision::retry_after) plus
    /// a small random jitter (at most an eighth of the wait, and at least
    /// up to 5 ms), so that waiting replicas do not all come back at the
    /// same instant. It returns the admitted decision; or, as soon as the
    /// next wait would end after `max_wait`, the last denial, at once: it
    /// never sleeps past `max_wait`. Every check spends as
    /// [`check`](Self::check) does (a denied one spends nothing); errors
    /// are returned at once.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), redis_ratelimit::Error> {
    /// use std::time::Duration;
    /// use redis_ratelimit::{Limiter, Quota};
    ///
    /// let api = Limiter::builder("10/1s".parse().unwrap()).name("partner-api").build().unwrap();
    /// for _ in 0..12 {
    ///     let go = api.until_ready("partner", 1, Duration::from_secs(2)).await?;
    ///     assert!(go.is_allowed());
    ///     // call the API
    /// }
    /// // 8 units are left of the window's 10: a cost of 10 cannot fit
    /// // within 1 ms, so the denial comes back without a wait.
    /// let late = api.until_ready("partner", 10, Duration::from_millis(1)).await?;
    /// assert!(!late.is_allowed());
    /// # Ok(()) }
    /// ```
    pub async fn until_ready<K: AsRef<[u8]> + ?Sized>(
        &self,
        key: &K,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        self.waiting(&[key.as_ref()], cost, max_wait).await
    }

    /// Like [`until_ready`](Self::until_ready), with one key per limit (as
    /// [`check_each`](Self::check_each)).
    pub async fn until_ready_each<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        let keys: Vec<&[u8]> = keys.iter().map(AsRef::as_ref).collect();
        self.waiting(&keys, cost, max_wait).await
    }

    async fn waiting(
        &self,
        keys: &[&[u8]],
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        let deadline = Instant::now().checked_add(max_wait);
        loop {
            let decision = self.decide(keys, cost).await?;
            let Some(wait) = decision.retry_after() else {
                return Ok(decision);
            };
            let left = match deadline {
                Some(deadline) => deadline.saturating_duration_since(Instant::now()),
                None => Duration::MAX,
            };
            if wait > left {
                return Ok(decision);
            }
            let spread = (wait / 8).max(Duration::from_millis(5)).min(left - wait);
            tokio::time::sleep(wait + jitter(spread)).await;
        }
    }
}

/// A random duration in `0..=spread`.
fn jitter(spread: Duration) -> Duration {
    let micros = spread.as_micros() as u64;
    if micros == 0 {
        return Duration::ZERO;
    }
    let mut bytes = [0; 8];
    crate::random::fill(&mut bytes);
    Duration::from_micros(u64::from_le_bytes(bytes) % (micros + 1))
}
