//! [`Decision`]: the answer to one rate-limit check, over one or more limits.

use std::{sync::Arc, time::Duration};

use smallvec::SmallVec;

use crate::{Quota, headers::Policies, store::LimitState};

/// One state per limit; a lone limit's is held inline, without allocating.
pub(crate) type States = SmallVec<[LimitState; 1]>;

/// A store's answer to one request: each limit's state, and where each
/// GCRA limit's state resets on Redis's clock, in µs (0 for any other
/// limit, or where another store answered): see [`Stamp::Store`].
pub(crate) type Answered = (States, Ends);

/// The `pk` partition key of each limit's client key (one for all limits
/// when they share a key); empty unless the layer writes `pk`.
pub(crate) type Partition = SmallVec<[u64; 1]>;

/// Per limit, when its state after a spend resets, on the store's own
/// clock, in µs: the in-memory store's, or Redis's for a GCRA limit (0 for
/// any other there). For GCRA it is the theoretical arrival time the spend
/// left, rounded up to the µs, where the state's `reset_ms` is rounded up
/// to the whole ms: a refund bounded by "what is still outstanding of the
/// spend" is then short of it by nothing and over it by under a µs (with
/// the decision's time and whole ms, it was off by up to a ms either way,
/// and on Redis by the round trips too). A lone limit's is held inline: a
/// decision allocates nothing for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ends {
    /// A lone limit's.
    One(u64),
    /// Each limit's, in the limiter's order.
    Each(Box<[u64]>),
}

impl Ends {
    /// Limit `i`'s end, if the decision has that limit.
    pub(crate) fn get(&self, i: usize) -> Option<u64> {
        match self {
            Ends::One(end) => (i == 0).then_some(*end),
            Ends::Each(ends) => ends.get(i).copied(),
        }
    }

    /// No end known for any limit.
    pub(crate) fn none() -> Self {
        Ends::One(0)
    }

    /// Whether no end is known for any limit.
    fn is_none(&self) -> bool {
        match self {
            Ends::One(end) => *end == 0,
            Ends::Each(ends) => ends.iter().all(|e| *e == 0),
        }
    }
}

/// When a decision was made, on a clock a refund can compare with: the
/// in-memory store's own, or this process's clock for a store outside it
/// (whose time only the store knows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stamp {
    /// Where each limit's state resets on the
    /// [`MemoryStore`](crate::MemoryStore)'s clock.
    Memory(Ends),
    /// This process's clock when the store's answer arrived.
    Local(tokio::time::Instant),
    /// A lone GCRA limit's decision on Redis: where its state resets on
    /// Redis's clock (µs), which bounds a refund to the µs whatever the
    /// round trips took. Nothing else is needed for its refund.
    Gcra(u64),
    /// As `Local`, and where each GCRA limit of several resets on Redis's
    /// clock (µs; 0 for any other limit). Boxed: a larger stamp made every
    /// decision larger, and such decisions are rare.
    Store(Box<(tokio::time::Instant, Ends)>),
}

impl Stamp {
    /// For a store's answer, now: with the ends on Redis's clock, if it
    /// gave any (a lone GCRA limit's needs no clock of ours).
    pub(crate) fn answered(ends: Ends) -> Self {
        match ends {
            Ends::One(end) if end > 0 => Stamp::Gcra(end),
            ends if ends.is_none() => Stamp::Local(tokio::time::Instant::now()),
            ends => Stamp::Store(Box::new((tokio::time::Instant::now(), ends))),
        }
    }

    /// This process's clock when a store outside it answered, if kept.
    pub(crate) fn answered_at(&self) -> Option<tokio::time::Instant> {
        match self {
            Stamp::Local(at) => Some(*at),
            Stamp::Store(stamp) => Some(stamp.0),
            Stamp::Memory(_) | Stamp::Gcra(_) => None,
        }
    }

    /// Where limit `i`'s state resets on Redis's clock, if Redis said.
    pub(crate) fn redis_end(&self, i: usize) -> Option<u64> {
        let end = match self {
            Stamp::Gcra(end) => (i == 0).then_some(*end),
            Stamp::Store(stamp) => stamp.1.get(i),
            Stamp::Memory(_) | Stamp::Local(_) => None,
        };
        end.filter(|end| *end > 0)
    }
}

/// How tightly a limit holds a client it admitted, the tightest least: the
/// fewest units left and, on a tie, the longest until it is fully available
/// again (`reset`, in any one unit). An allowed decision's binding limit is
/// its first tightest enforced limit (of all its limits, if every one is a
/// shadow); the legacy `X-RateLimit-*` headers of nested
/// layers keep the tightest of theirs by the same rule
/// ([`headers`](crate::headers)).
pub(crate) fn tightness(remaining: u64, reset: u64) -> (u64, std::cmp::Reverse<u64>) {
    (remaining, std::cmp::Reverse(reset))
}

/// What a decision spent, for a refund: its cost and when it was decided.
/// `None` for a decision that spent nothing (a denial, a peek, a cost of 0,
/// a cached denial).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spent {
    pub(crate) cost: u64,
    pub(crate) at: Stamp,
}

/// The outcome of [`Limiter::check`](crate::Limiter::check).
///
/// A limiter may hold several limits; the decision admits only if every one
/// does, and then all of them spent the cost. The accessors without a limit
/// name report the **binding** limit: when denied, the denying limit with
/// the longest wait; when allowed, the enforced one with the fewest units
/// left (a [shadow](crate::LimiterBuilder::shadow_limit) limit only if every
/// limit is one, so that headers never make clients back off for a limit
/// that denies nothing). [`limits`](Self::limits) lists every limit.
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
/// // A fixed window's denial waits until the window resets.
/// assert_eq!(third.retry_after(), Some(third.reset_after()));
/// assert!(third.reset_after() <= std::time::Duration::from_secs(60));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    allowed: bool,
    states: States,
    binding: u32,
    policies: Arc<Policies>,
    partition: Partition,
    spent: Option<Spent>,
}

/// One limit's part in a [`Decision`]; see [`Decision::limits`].
#[derive(Debug, Clone, Copy)]
pub struct LimitDecision<'a> {
    name: &'a str,
    quota: Quota,
    shadow: bool,
    state: LimitState,
}

impl<'a> LimitDecision<'a> {
    /// The limit's name.
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// The limit's quota.
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// Whether this limit alone admitted the cost.
    pub fn is_allowed(&self) -> bool {
        self.state.allowed
    }

    /// Whether this limit only observes (dry run): its denial blocks nothing.
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// Units left in this limit after the decision.
    pub fn remaining(&self) -> u64 {
        self.state.remaining
    }

    /// Time until this limit is fully available again.
    pub fn reset_after(&self) -> Duration {
        Duration::from_millis(self.state.reset_ms)
    }

    /// When this limit denied: how long until it would admit the cost.
    pub fn retry_after(&self) -> Option<Duration> {
        (!self.state.allowed).then(|| Duration::from_millis(self.state.retry_ms))
    }
}

impl Decision {
    pub(crate) fn new(states: impl Into<States>, policies: Arc<Policies>) -> Self {
        let states = states.into();
        let enforced = |i: &usize| !policies.is_shadow(*i);
        let allowed = (0..states.len())
            .filter(enforced)
            .all(|i| states[i].allowed);
        let binding = if allowed {
            // Among the enforced limits: a shadow limit's `r=0` on a 200
            // would make a client that follows the headers back off for a
            // limit that denies nothing. Among all, if all are shadows.
            let by = |i: &usize| tightness(states[*i].remaining, states[*i].reset_ms);
            let tightest = (0..states.len()).filter(enforced).min_by_key(by);
            tightest.or_else(|| (0..states.len()).min_by_key(by))
        } else {
            // The longest wait among the denying limits; the first on a tie.
            let denying = (0..states.len()).filter(|i| !states[*i].allowed && enforced(i));
            denying.rev().max_by_key(|i| states[*i].retry_ms)
        };
        Self {
            allowed,
            binding: binding.unwrap_or(0) as u32,
            states,
            policies,
            partition: Partition::new(),
            spent: None,
        }
    }

    /// The same decision, recording that it spent `cost` (if it admitted
    /// and `cost` > 0) at `at`, for [`Limiter::refund`](crate::Limiter::refund).
    pub(crate) fn with_spent(mut self, cost: u64, at: Stamp) -> Self {
        if self.allowed && cost > 0 {
            self.spent = Some(Spent { cost, at });
        }
        self
    }

    /// What the decision spent, if anything.
    pub(crate) fn spent(&self) -> Option<&Spent> {
        self.spent.as_ref()
    }

    /// Limit `i`'s state.
    pub(crate) fn state_of(&self, i: usize) -> &LimitState {
        &self.states[i]
    }

    /// The policies it was made under: which limiter made it (a copy of
    /// that limiter's, for a decision of the hot path).
    pub(crate) fn policies_arc(&self) -> &Arc<Policies> {
        &self.policies
    }

    /// The number of limits.
    pub(crate) fn len(&self) -> usize {
        self.states.len()
    }

    /// The same decision, with the partition keys of its request's keys.
    pub(crate) fn with_partition(self, partition: Partition) -> Self {
        Self { partition, ..self }
    }

    /// The binding limit's partition key, when the layer writes `pk`.
    pub(crate) fn partition_key(&self) -> Option<u64> {
        let last = self.partition.len().checked_sub(1)?;
        self.partition.get(self.binding().min(last)).copied()
    }

    /// The index of the binding limit.
    pub(crate) fn binding(&self) -> usize {
        self.binding as usize
    }

    fn state(&self) -> &LimitState {
        &self.states[self.binding()]
    }

    /// Whether the request may proceed. A denied request consumed nothing,
    /// in any of the limits. Shadow (dry-run) limits never deny.
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// Whether a shadow (dry-run) limit would have denied this request; see
    /// [`LimiterBuilder::shadow`](crate::LimiterBuilder::shadow).
    pub fn is_shadow_denied(&self) -> bool {
        self.limits().any(|l| l.is_shadow() && !l.is_allowed())
    }

    /// The same decision, `elapsed` later: the waits are shorter (a wait
    /// never drops below 1 ms while denied). For the local deny cache.
    pub(crate) fn aged(mut self, elapsed: Duration) -> Self {
        self.spent = None;
        let ms = elapsed.as_millis() as u64;
        for s in self.states.iter_mut() {
            s.reset_ms = s.reset_ms.saturating_sub(ms);
            if !s.allowed {
                s.retry_ms = s.retry_ms.saturating_sub(ms).max(1);
            }
        }
        self
    }

    /// The binding limit's units per window.
    pub fn limit(&self) -> u64 {
        self.quota().limit()
    }

    /// The binding limit's quota.
    pub fn quota(&self) -> Quota {
        self.policies.quota(self.binding())
    }

    /// Units the binding limit still has after this decision.
    pub fn remaining(&self) -> u64 {
        self.state().remaining
    }

    /// Time until the binding limit is fully available again, as the store
    /// reports it (for a fixed window: until the window resets).
    pub fn reset_after(&self) -> Duration {
        Duration::from_millis(self.state().reset_ms)
    }

    /// How long to wait before retrying: `Some` exactly when denied, and then
    /// the longest wait among the limits that denied.
    pub fn retry_after(&self) -> Option<Duration> {
        (!self.allowed).then(|| Duration::from_millis(self.state().retry_ms))
    }

    /// The binding limit's name, as used in the `RateLimit` header.
    pub fn policy(&self) -> &str {
        self.policies.name(self.binding())
    }

    /// Every limit's part, in the limiter's order.
    pub fn limits(&self) -> impl Iterator<Item = LimitDecision<'_>> {
        self.states.iter().enumerate().map(|(i, s)| LimitDecision {
            name: self.policies.name(i),
            quota: self.policies.quota(i),
            shadow: self.policies.is_shadow(i),
            state: *s,
        })
    }

    pub(crate) fn policies(&self) -> &Policies {
        &self.policies
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(allowed: bool, remaining: u64, reset_ms: u64, retry_ms: u64) -> LimitState {
        LimitState {
            allowed,
            remaining,
            reset_ms,
            retry_ms,
        }
    }

    fn policies() -> Arc<Policies> {
        let limits = [("second", "5/1s"), ("day", "100/1d"), ("global", "1000/1s")];
        let limits = limits.map(|(n, q)| (n.to_owned(), q.parse().unwrap()));
        Arc::new(Policies::new(&limits))
    }

    #[test]
    fn binding_limit_is_the_longest_wait_when_denied() {
        let d = Decision::new(
            vec![
                state(false, 0, 300, 300),
                state(false, 0, 40_000, 40_000),
                state(true, 7, 1000, 0),
            ],
            policies(),
        );
        assert!(!d.is_allowed());
        assert_eq!(d.policy(), "day");
        assert_eq!(d.retry_after(), Some(Duration::from_secs(40)));
        let denied: Vec<_> = d.limits().filter(|l| !l.is_allowed()).collect();
        assert_eq!(denied.len(), 2);
    }

    #[test]
    fn binding_limit_is_the_fewest_remaining_when_allowed() {
        let d = Decision::new(
            vec![
                state(true, 4, 900, 0),
                state(true, 2, 80_000, 0),
                state(true, 2, 500, 0),
            ],
            policies(),
        );
        assert!(d.is_allowed());
        assert_eq!((d.policy(), d.remaining(), d.limit()), ("day", 2, 100));
        assert_eq!(d.retry_after(), None);
    }
}
