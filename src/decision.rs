//! [`Decision`]: the answer to one rate-limit check.

use std::{sync::Arc, time::Duration};

use crate::{Quota, headers::Policy};

/// The outcome of [`Limiter::check`](crate::Limiter::check).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), redis_ratelimit::Error> {
/// use redis_ratelimit::{Limiter, Quota};
///
/// let limiter = Limiter::new(Quota::per_minute(2));
/// let first = limiter.check("user:7", 1).await?;
/// assert!(first.is_allowed());
/// assert_eq!(first.remaining(), 1);
///
/// limiter.check("user:7", 1).await?;
/// let third = limiter.check("user:7", 1).await?;
/// assert!(!third.is_allowed());
/// assert_eq!(third.remaining(), 0);
/// // Denied decisions say how long to wait: until the window resets.
/// assert_eq!(third.retry_after(), Some(third.reset_after()));
/// assert!(third.reset_after() <= std::time::Duration::from_secs(60));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    allowed: bool,
    quota: Quota,
    used: u64,
    reset_after: Duration,
    policy: Arc<Policy>,
}

impl Decision {
    pub(crate) fn new(
        allowed: bool,
        quota: Quota,
        used: u64,
        reset_after: Duration,
        policy: Arc<Policy>,
    ) -> Self {
        Self {
            allowed,
            quota,
            used,
            reset_after,
            policy,
        }
    }

    /// Whether the request may proceed. A denied request consumed nothing.
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// The quota's limit: units per window.
    pub fn limit(&self) -> u64 {
        self.quota.limit()
    }

    /// The quota this decision was made under.
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// Units still available in the current window, after this decision.
    pub fn remaining(&self) -> u64 {
        self.quota.limit().saturating_sub(self.used)
    }

    /// Time until the current window resets, as Redis (or the memory store)
    /// reports it for this key.
    pub fn reset_after(&self) -> Duration {
        self.reset_after
    }

    /// How long to wait before retrying: `Some` exactly when denied, and then
    /// equal to [`reset_after`](Self::reset_after).
    pub fn retry_after(&self) -> Option<Duration> {
        (!self.allowed).then_some(self.reset_after)
    }

    /// The policy (limiter) name used in the `RateLimit` headers.
    pub fn policy(&self) -> &str {
        self.policy.name()
    }

    pub(crate) fn policy_info(&self) -> &Policy {
        &self.policy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remaining_never_underflows() {
        let q = Quota::per_second(5);
        let p = Arc::new(Policy::new("p", q));
        let d = Decision::new(false, q, 9, Duration::from_millis(300), p.clone());
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.retry_after(), Some(Duration::from_millis(300)));
        let d = Decision::new(true, q, 2, Duration::from_millis(300), p);
        assert_eq!((d.remaining(), d.retry_after()), (3, None));
    }
}
