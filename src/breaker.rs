//! [`Breaker`]: a circuit breaker in front of the store.
//!
//! After [`failures`](Breaker::failures) store failures in a row, each within
//! [`span`](Breaker::span) of the one before, the breaker **opens**: for the
//! [`cooldown`](Breaker::cooldown) every check fails at once with
//! [`Error::CircuitOpen`](crate::Error::CircuitOpen), which the layers answer
//! by their store-error policy without waiting for a timeout, and the store
//! gets no traffic. Then one check at a time is let through as a **probe**:
//! if it succeeds the breaker closes, if it fails it opens for another
//! cooldown. A success resets the count. Failures of one domain in the same
//! millisecond count as one: the requests of one failed call (a batch of up
//! to 64 on Redis, all answered its error together, say when a connection
//! resets) are one failure of the store, not one each, so a single blip
//! does not open the breaker and put every request on the store-error
//! policy for a cooldown. An opening is logged at `warn`, a
//! closing at `info` (each at most once a second, with how many were not).
//!
//! A limiter keeps one breaker for each **fault domain** of its store
//! ([`Store::fault_domain`](crate::Store::fault_domain)): one for a
//! standalone Redis, the in-memory store or a custom store, and on a Redis
//! Cluster one for each range of 256 hash slots (64 in all). So one failing
//! master opens the breakers of its own slots only, and the keys of the
//! other masters are still decided by the store. A range that two masters
//! share (where one master's slots end and the next one's begin) opens for
//! both.
//!
//! When an open domain answers again, every other open domain probes at
//! once instead of at the end of its own cooldown: a master's slots span
//! several domains, opened at different moments, and would otherwise come
//! back up to a cooldown apart, their keys falling back meanwhile. A domain
//! still failing spends one probe (one check that waits up to the
//! timeout) and opens for another cooldown. On a cluster, a range two
//! masters share can answer while one of them is down, so during such an
//! outage the down master's domains probe more often than once a cooldown.
//!
//! ```
//! use std::time::Duration;
//! use redis_ratelimit::{Breaker, Limiter, Quota};
//!
//! let limiter = Limiter::builder(Quota::per_second(10))
//!     .breaker(Breaker::new().failures(3).cooldown(Duration::from_millis(500)))
//!     .build()
//!     .unwrap();
//! # let _ = limiter;
//! ```

use std::{
    sync::{
        OnceLock,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

/// Circuit-breaker settings; see the [module docs](self).
///
/// The defaults open after 5 failures in a row (each within 1 s of the
/// previous one) and probe again after 1 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Breaker {
    failures: u32,
    span: Duration,
    cooldown: Duration,
    enabled: bool,
}

impl Default for Breaker {
    fn default() -> Self {
        Self {
            failures: 5,
            span: Duration::from_secs(1),
            cooldown: Duration::from_secs(1),
            enabled: true,
        }
    }
}

impl Breaker {
    /// The default settings.
    pub fn new() -> Self {
        Self::default()
    }

    /// A breaker that never opens: every check goes to the store.
    pub fn disabled() -> Self {
        Self {
            enabled: false,
            ..Self::default()
        }
    }

    /// Failures in a row that open the breaker (at least 1; default 5),
    /// those of one millisecond counting as one (see the
    /// [module docs](self)).
    #[must_use]
    pub fn failures(self, failures: u32) -> Self {
        Self {
            failures: failures.max(1),
            ..self
        }
    }

    /// The longest gap between failures that still counts them in a row
    /// (default 1 s).
    #[must_use]
    pub fn span(self, span: Duration) -> Self {
        Self { span, ..self }
    }

    /// How long the breaker stays open before it probes (default 1 s), unless
    /// another fault domain of the store answers again first (see the
    /// [module docs](self)).
    #[must_use]
    pub fn cooldown(self, cooldown: Duration) -> Self {
        Self { cooldown, ..self }
    }
}

/// What the breaker lets a check do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Call the store.
    Call,
    /// Call the store as the one probe of a half-open breaker.
    Probe,
    /// Do not call the store: the breaker is open.
    Open,
}

/// The most fault domains a limiter keeps a breaker for; a store's domains
/// beyond share them (by their number modulo this).
pub(crate) const DOMAINS: usize = 64;

/// The breaker index of a store's fault domain `of`.
pub(crate) fn domain(of: usize) -> u8 {
    (of % DOMAINS) as u8
}

/// A limiter's breakers, one per fault domain of its store, lock-free.
pub(crate) struct State {
    config: Breaker,
    domains: Box<[Domain]>,
    /// Openings are logged at most once a second, whichever domain opens.
    logs: crate::core::Throttle,
    /// And so are closings.
    closings: crate::core::Throttle,
}

/// One fault domain's breaker.
#[derive(Debug, Default)]
struct Domain {
    /// Consecutive failures, and when the last one happened (ms).
    failures: AtomicU32,
    last_failure_ms: AtomicU64,
    /// 0 when closed; else when the cooldown ends (ms since start).
    open_until_ms: AtomicU64,
    probing: AtomicBool,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let open = self.domains.iter().filter(|d| d.is_open()).count();
        f.debug_struct("State")
            .field("config", &self.config)
            .field("open_domains", &open)
            .finish()
    }
}

fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    // +1 so that 0 can mean "closed".
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

impl State {
    pub(crate) fn new(config: Breaker) -> Self {
        Self {
            config,
            domains: (0..DOMAINS).map(|_| Domain::default()).collect(),
            logs: crate::core::Throttle::new(),
            closings: crate::core::Throttle::new(),
        }
    }

    /// Whether an opening may be logged now: `Some(openings not logged
    /// since the last)`, at most once a second.
    pub(crate) fn log_opening(&self) -> Option<u64> {
        self.logs.admit()
    }

    fn domain(&self, domain: u8) -> &Domain {
        &self.domains[usize::from(domain) % DOMAINS]
    }

    /// Whether a check of fault domain `domain` may call the store now.
    pub(crate) fn pass(&self, domain: u8) -> Pass {
        let d = self.domain(domain);
        let until = d.open_until_ms.load(Ordering::Acquire);
        if until == 0 {
            return Pass::Call;
        }
        if now_ms() < until {
            return Pass::Open;
        }
        match d
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Pass::Probe,
            Err(_) => Pass::Open,
        }
    }

    /// A store call that ended without an outcome (dropped unawaited, or a
    /// method the store lacks): a probe's slot is freed for the next check.
    pub(crate) fn abandon(&self, domain: u8, pass: Pass) {
        if pass == Pass::Probe {
            self.domain(domain).probing.store(false, Ordering::Release);
        }
    }

    /// Records the outcome of a store call of fault domain `domain`.
    /// Returns true when this failure opened that domain's breaker.
    pub(crate) fn record(&self, domain: u8, pass: Pass, ok: bool) -> bool {
        let d = self.domain(domain);
        if ok {
            // Written only when there is something to forget: every
            // decision of every worker succeeds here, and a store to the
            // domain's line would pass it between their caches each time.
            if d.failures.load(Ordering::Relaxed) != 0 {
                d.failures.store(0, Ordering::Release);
            }
            if d.last_failure_ms.load(Ordering::Relaxed) != 0 {
                d.last_failure_ms.store(0, Ordering::Release);
            }
            if pass == Pass::Probe || d.is_open() {
                let was_open = d.open_until_ms.swap(0, Ordering::AcqRel) != 0;
                d.probing.store(false, Ordering::Release);
                self.probe_the_others_now();
                if was_open && let Some(unlogged) = self.closings.admit() {
                    tracing::info!(
                        domain,
                        unlogged,
                        "rate limit store answering again: circuit breaker closed"
                    );
                }
            }
            return false;
        }
        if !self.config.enabled {
            return false;
        }
        let now = now_ms();
        if pass == Pass::Probe {
            d.open(now, self.config.cooldown);
            return true;
        }
        let last = d.last_failure_ms.swap(now, Ordering::AcqRel);
        if last == now {
            // Counted with the last: the requests of one failed call fail
            // together.
            return false;
        }
        let span = u64::try_from(self.config.span.as_millis()).unwrap_or(u64::MAX);
        let in_a_row = now.saturating_sub(last) <= span;
        let count = if in_a_row {
            d.failures.fetch_add(1, Ordering::AcqRel) + 1
        } else {
            d.failures.store(1, Ordering::Release);
            1
        };
        if count >= self.config.failures && !d.is_open() {
            d.open(now, self.config.cooldown);
            return true;
        }
        false
    }
}

impl State {
    /// A domain that was open answers again: the part that failed (say, a
    /// cluster master, whose slots span several domains) may be back, so
    /// every other open domain may probe at once rather than at the end of
    /// its own cooldown. Domains opened at different times would otherwise
    /// recover up to a cooldown apart, their keys falling back meanwhile.
    /// A domain still failing costs one probe, which opens it again.
    fn probe_the_others_now(&self) {
        for d in &self.domains {
            // 1: open, its cooldown over (0 means closed).
            let until = d.open_until_ms.load(Ordering::Acquire);
            if until > 1 {
                let _ = (d.open_until_ms).compare_exchange(
                    until,
                    1,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
            }
        }
    }
}

impl Domain {
    fn is_open(&self) -> bool {
        self.open_until_ms.load(Ordering::Acquire) != 0
    }

    fn open(&self, now: u64, cooldown: Duration) {
        // Saturating: a huge cooldown (`Duration::MAX`) means open for good,
        // not an overflow (or a wrap to a short one).
        let cooldown = u64::try_from(cooldown.as_millis()).unwrap_or(u64::MAX);
        let until = now.saturating_add(cooldown);
        self.open_until_ms.store(until.max(1), Ordering::Release);
        self.probing.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past the millisecond of the last failure, which later ones in it
    /// count with.
    fn next_ms() {
        std::thread::sleep(Duration::from_millis(2));
    }

    #[test]
    fn failures_in_one_millisecond_count_as_one() {
        let s = State::new(Breaker::new().failures(3));
        // One failed call's 64 requests, answered together.
        let opened = (0..64).filter(|_| s.record(0, Pass::Call, false)).count();
        assert_eq!(opened, 0, "one call's failure opened the breaker");
        assert_eq!(s.pass(0), Pass::Call);
        next_ms();
        assert!(!s.record(0, Pass::Call, false));
        next_ms();
        assert!(
            s.record(0, Pass::Call, false),
            "the third failed call opens"
        );
        // A success in between starts the count afresh, its ms included.
        let s = State::new(Breaker::new().failures(2));
        assert!(!s.record(1, Pass::Call, false));
        s.record(1, Pass::Call, true);
        assert!(!s.record(1, Pass::Call, false));
        next_ms();
        assert!(s.record(1, Pass::Call, false));
    }

    #[test]
    fn opens_after_failures_in_a_row_then_probes_one_at_a_time() {
        let s = State::new(
            Breaker::new()
                .failures(3)
                .cooldown(Duration::from_millis(50)),
        );
        for _ in 0..2 {
            assert_eq!(s.pass(0), Pass::Call);
            assert!(!s.record(0, Pass::Call, false));
            next_ms();
        }
        assert!(s.record(0, Pass::Call, false), "the third failure opens");
        assert_eq!(s.pass(0), Pass::Open);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(s.pass(0), Pass::Probe);
        assert_eq!(s.pass(0), Pass::Open, "one probe at a time");
        assert!(
            s.record(0, Pass::Probe, false),
            "a failed probe opens again"
        );
        assert_eq!(s.pass(0), Pass::Open);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(s.pass(0), Pass::Probe);
        s.record(0, Pass::Probe, true);
        assert_eq!(s.pass(0), Pass::Call, "a good probe closes");
    }

    #[test]
    fn a_cooldown_of_any_length_keeps_the_breaker_open() {
        for cooldown in [Duration::MAX, Duration::from_millis(u64::MAX)] {
            let s = State::new(Breaker::new().failures(1).cooldown(cooldown));
            assert!(s.record(0, Pass::Call, false));
            std::thread::sleep(Duration::from_millis(2));
            assert_eq!(s.pass(0), Pass::Open, "{cooldown:?}");
        }
    }

    /// A span too long for a u64 of ms counts every failure in a row: it
    /// was cut to its low 64 bits, and 2^61 s became 0 ms, so no two
    /// failures were ever in a row and the breaker never opened.
    #[test]
    fn a_span_of_any_length_counts_failures_in_a_row() {
        for span in [Duration::MAX, Duration::from_secs(1 << 61)] {
            let s = State::new(Breaker::new().failures(2).span(span));
            assert!(!s.record(0, Pass::Call, false));
            next_ms();
            assert!(s.record(0, Pass::Call, false), "{span:?}");
        }
    }

    #[test]
    fn a_success_resets_the_count_and_disabled_never_opens() {
        let s = State::new(Breaker::new().failures(2));
        s.record(0, Pass::Call, false);
        s.record(0, Pass::Call, true);
        next_ms();
        assert!(!s.record(0, Pass::Call, false));
        let off = State::new(Breaker::disabled().failures(1));
        assert!(!off.record(0, Pass::Call, false));
        assert_eq!(off.pass(0), Pass::Call);
    }

    #[test]
    fn a_domain_opens_alone() {
        let s = State::new(Breaker::new().failures(2));
        assert!(!s.record(3, Pass::Call, false));
        next_ms();
        assert!(
            s.record(3, Pass::Call, false),
            "the second failure opens domain 3"
        );
        assert_eq!(s.pass(3), Pass::Open);
        assert_eq!(
            s.pass(domain(3 + DOMAINS)),
            Pass::Open,
            "domains beyond share"
        );
        for other in [0, 2, 4, domain(DOMAINS - 1)] {
            assert_eq!(s.pass(other), Pass::Call, "domain {other}");
        }
        // Another domain's success does not close it, nor reset its count.
        s.record(4, Pass::Call, true);
        assert_eq!(s.pass(3), Pass::Open);
    }

    #[test]
    fn a_recovered_domain_lets_the_other_open_ones_probe_at_once() {
        let cooldown = Duration::from_secs(60);
        let s = State::new(Breaker::new().failures(1).cooldown(cooldown));
        let later = State::new(
            Breaker::new()
                .failures(1)
                .cooldown(Duration::from_millis(30)),
        );
        for d in [1, 2, 3] {
            assert!(s.record(d, Pass::Call, false));
        }
        assert!(later.record(1, Pass::Call, false));
        std::thread::sleep(Duration::from_millis(40));
        // Domain 1 of `later` probes and answers: back.
        assert_eq!(later.pass(1), Pass::Probe);
        later.record(1, Pass::Probe, true);
        assert_eq!(later.pass(1), Pass::Call);
        // In `s`, no domain's cooldown is over: all stay open...
        assert_eq!(
            (s.pass(1), s.pass(2), s.pass(3)),
            (Pass::Open, Pass::Open, Pass::Open)
        );
        // ...until one of them answers a call (here an ordinary one).
        s.record(1, Pass::Call, true);
        assert_eq!(s.pass(1), Pass::Call);
        assert_eq!(
            s.pass(2),
            Pass::Probe,
            "probes without waiting out its cooldown"
        );
        assert_eq!(s.pass(2), Pass::Open, "one probe at a time");
        assert_eq!(s.pass(3), Pass::Probe);
        // A domain still failing opens again for a whole cooldown.
        assert!(s.record(2, Pass::Probe, false));
        assert_eq!(s.pass(2), Pass::Open);
        // A closed domain's success wakes nobody.
        s.record(1, Pass::Call, true);
        assert_eq!(s.pass(2), Pass::Open);
    }

    #[test]
    fn openings_are_logged_at_most_once_a_second() {
        let s = State::new(Breaker::new().failures(1));
        assert!(s.record(1, Pass::Call, false) && s.log_opening().is_some());
        assert!(s.record(2, Pass::Call, false) && s.log_opening().is_none());
        assert!(s.record(3, Pass::Call, false) && s.log_opening().is_none());
        std::thread::sleep(Duration::from_millis(1010));
        assert!(s.record(4, Pass::Call, false));
        assert_eq!(s.log_opening(), Some(2), "the two openings left out");
    }
}
