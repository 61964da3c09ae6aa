//! Counters and a latency histogram through the `metrics` facade, with the
//! `metrics` feature; without it every function here does nothing.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `ratelimit_allowed_total` | counter | `limit` (every limit of an admitted request that admitted it, once per request the decision reached; a concurrency limiter's granted lease) |
//! | `ratelimit_denied_total` | counter | `limit` (a concurrency limiter's `Busy`; the limits that denied; and each enforced limit a request's cost exceeds the whole quota of, [`Error::CostExceedsLimit`](crate::Error::CostExceedsLimit), a 429 from the layers) |
//! | `ratelimit_denied_locally_total` | counter | `limit` (deny-cache hits; and a denial shared by the requests that waited for one reserve call of a [local reservation](crate::LimiterBuilder::local_reservation)) |
//! | `ratelimit_shadow_denied_total` | counter | `limit` (shadow limits that would have denied, whether or not an enforced limit denied too; this includes a shadow limit whose whole quota the cost exceeds, when the check is `CostExceedsLimit`) |
//! | `ratelimit_store_errors_total` | counter | `limit` (every limit of the failed decision, once per request that got the error; not a failed [`peek`](crate::Limiter::peek), which decides nothing; also breaker-open; for a concurrency limiter, a failed or breaker-refused acquire and a failed renewal) |
//! | `ratelimit_store_latency_seconds` | histogram | `limit` (the limiter's first limit; a concurrency limiter's acquires) |
//! | `ratelimit_lease_lost_total` | counter | `limit` (a [`ConcurrencyLimiter`](crate::concurrency::ConcurrencyLimiter)'s lease the store no longer held at a renewal: it expired while renewals failed, or the store lost it; it is taken back at once, beyond the limit if newcomers filled the key meanwhile) |
//! | `ratelimit_store_full_total` | counter | none (a new key denied because the in-memory store was full, or a new key's concurrency acquire refused because its lease table was; see `MemoryStore`) |

#[cfg(feature = "metrics")]
use std::time::Instant;

use crate::Decision;

/// One limit's metric keys (its `limit` label on each metric's name),
/// built once per limiter: a decision then counts without copying the
/// limit's name, building a label or hashing a key. Empty without the
/// `metrics` feature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keys {
    #[cfg(feature = "metrics")]
    keys: Box<[metrics::Key; 7]>,
}

#[cfg(feature = "metrics")]
mod names {
    pub(super) const ALLOWED: usize = 0;
    pub(super) const DENIED: usize = 1;
    pub(super) const DENIED_LOCALLY: usize = 2;
    pub(super) const SHADOW_DENIED: usize = 3;
    pub(super) const STORE_ERRORS: usize = 4;
    pub(super) const STORE_LATENCY: usize = 5;
    pub(super) const LEASE_LOST: usize = 6;
    /// In the order of the indices above.
    pub(super) const ALL: [&str; 7] = [
        "ratelimit_allowed_total",
        "ratelimit_denied_total",
        "ratelimit_denied_locally_total",
        "ratelimit_shadow_denied_total",
        "ratelimit_store_errors_total",
        "ratelimit_store_latency_seconds",
        "ratelimit_lease_lost_total",
    ];
}

/// What the `metrics` macros record with each metric.
#[cfg(feature = "metrics")]
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

impl Keys {
    /// The keys of the limit named `limit`.
    pub(crate) fn new(limit: &str) -> Self {
        #[cfg(feature = "metrics")]
        {
            let key = |name: &'static str| {
                metrics::Key::from_parts(name, vec![metrics::Label::new("limit", limit.to_owned())])
            };
            Self {
                keys: Box::new(names::ALL.map(key)),
            }
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = limit;
            Self {}
        }
    }

    /// Adds 1 to counter `i` (an index of `names`).
    #[cfg(feature = "metrics")]
    fn count(&self, i: usize) {
        metrics::with_recorder(|r| r.register_counter(&self.keys[i], &METADATA).increment(1));
    }
}

/// Counts a decision: allowed or denied, per limit, and shadow denials.
pub(crate) fn decision(d: &Decision, locally: bool) {
    #[cfg(feature = "metrics")]
    for (i, l) in d.limits().enumerate() {
        let keys = d.policies().metric_keys(i);
        if l.is_shadow() && !l.is_allowed() {
            keys.count(names::SHADOW_DENIED);
        } else if d.is_allowed() {
            keys.count(names::ALLOWED);
        } else if locally && !l.is_allowed() {
            keys.count(names::DENIED_LOCALLY);
        } else if !l.is_allowed() {
            keys.count(names::DENIED);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (d, locally);
}

/// Counts a check refused as [`Error::CostExceedsLimit`](crate::Error::CostExceedsLimit)
/// for limit `keys`, whose whole quota the cost exceeds: a denial, or for a
/// shadow limit a shadow denial, as [`decision`] counts a decided one.
pub(crate) fn cost_exceeds(keys: &Keys, shadow: bool) {
    #[cfg(feature = "metrics")]
    keys.count(if shadow {
        names::SHADOW_DENIED
    } else {
        names::DENIED
    });
    #[cfg(not(feature = "metrics"))]
    let _ = (keys, shadow);
}

/// Counts a concurrency acquire's answer: a lease, or `Busy`.
pub(crate) fn leased(keys: &Keys, granted: bool) {
    #[cfg(feature = "metrics")]
    keys.count(if granted {
        names::ALLOWED
    } else {
        names::DENIED
    });
    #[cfg(not(feature = "metrics"))]
    let _ = (keys, granted);
}

/// Counts a concurrency lease found lost at a renewal.
pub(crate) fn lease_lost(keys: &Keys) {
    #[cfg(feature = "metrics")]
    keys.count(names::LEASE_LOST);
    #[cfg(not(feature = "metrics"))]
    let _ = keys;
}

/// Counts a failed (or breaker-refused) store call for every limit.
pub(crate) fn store_error<'a>(limits: impl Iterator<Item = &'a Keys>) {
    #[cfg(feature = "metrics")]
    for keys in limits {
        keys.count(names::STORE_ERRORS);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = limits;
}

/// Records how long a store call took, from its [`clock`].
pub(crate) fn store_latency(limit: &Keys, started: Clock) {
    #[cfg(feature = "metrics")]
    {
        let seconds = since_start().saturating_sub(started.0) as f64 / 1e9;
        let key = &limit.keys[names::STORE_LATENCY];
        metrics::with_recorder(|r| r.register_histogram(key, &METADATA).record(seconds));
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (limit, started);
}

/// The start of a store call, for [`store_latency`]: nanoseconds since the
/// first clock read, 8 bytes where an `Instant` takes 16, since a decision
/// on its way carries it. With the `metrics` feature off, nothing would
/// record it, so it reads no clock and holds nothing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock(#[cfg(feature = "metrics")] u64);

/// Starts a store call's [`Clock`].
pub(crate) fn clock() -> Clock {
    Clock(
        #[cfg(feature = "metrics")]
        since_start(),
    )
}

/// Nanoseconds since the first call.
#[cfg(feature = "metrics")]
fn since_start() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    u64::try_from(START.get_or_init(Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Counts a new key refused (denied) by a full in-memory store.
pub(crate) fn store_full() {
    #[cfg(feature = "metrics")]
    metrics::counter!("ratelimit_store_full_total").increment(1);
}
