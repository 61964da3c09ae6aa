//! Counters and a latency histogram through the `metrics` facade, with the
//! `metrics` feature; without it every function here does nothing.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `ratelimit_allowed_total` | counter | `limit` (every limit of an admitted request that admitted it) |
//! | `ratelimit_denied_total` | counter | `limit` (the limits that denied) |
//! | `ratelimit_denied_locally_total` | counter | `limit` (deny-cache hits) |
//! | `ratelimit_shadow_denied_total` | counter | `limit` (shadow limits that would have denied, whether or not an enforced limit denied too) |
//! | `ratelimit_store_errors_total` | counter | `limit` (every limit of the failed decision; also breaker-open) |
//! | `ratelimit_store_latency_seconds` | histogram | `limit` (the limiter's first limit) |
//! | `ratelimit_store_full_total` | counter | none (a new key denied because the in-memory store was full; see `MemoryStore`) |

use std::time::Instant;

use crate::Decision;

/// Counts a decision: allowed or denied, per limit, and shadow denials.
pub(crate) fn decision(d: &Decision, locally: bool) {
    #[cfg(feature = "metrics")]
    for l in d.limits() {
        let limit = l.name().to_owned();
        if l.is_shadow() && !l.is_allowed() {
            metrics::counter!("ratelimit_shadow_denied_total", "limit" => limit).increment(1);
        } else if d.is_allowed() {
            metrics::counter!("ratelimit_allowed_total", "limit" => limit).increment(1);
        } else if locally && !l.is_allowed() {
            metrics::counter!("ratelimit_denied_locally_total", "limit" => limit).increment(1);
        } else if !l.is_allowed() {
            metrics::counter!("ratelimit_denied_total", "limit" => limit).increment(1);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (d, locally);
}

/// Counts a failed (or breaker-refused) store call for every limit.
pub(crate) fn store_error<'a>(limits: impl Iterator<Item = &'a str>) {
    #[cfg(feature = "metrics")]
    for limit in limits {
        metrics::counter!("ratelimit_store_errors_total", "limit" => limit.to_owned()).increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = limits;
}

/// Records how long a store call took, from its [`clock`].
pub(crate) fn store_latency(limit: &str, started: Option<Instant>) {
    #[cfg(feature = "metrics")]
    if let Some(started) = started {
        metrics::histogram!("ratelimit_store_latency_seconds", "limit" => limit.to_owned())
            .record(started.elapsed().as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (limit, started);
}

/// The start of a store call, for [`store_latency`]; `None` (no clock read)
/// when the `metrics` feature is off and nothing would record it.
pub(crate) fn clock() -> Option<Instant> {
    cfg!(feature = "metrics").then(Instant::now)
}

/// Counts a new key refused (denied) by a full in-memory store.
pub(crate) fn store_full() {
    #[cfg(feature = "metrics")]
    metrics::counter!("ratelimit_store_full_total").increment(1);
}
