//! [`Algorithm`]: how a [`Quota`](crate::Quota) counts.
//!
//! Every algorithm is one atomic step per decision, in Redis (`lua/*.lua`)
//! and in the [`MemoryStore`](crate::MemoryStore) alike, with time taken from
//! the store (Redis `TIME` or `PTTL`), never from the app server.
//!
//! | algorithm | state per key | admits | burst across a boundary |
//! |---|---|---|---|
//! | [`FixedWindow`](Algorithm::FixedWindow) (default) | one counter, expiring one window after the key's first request | `limit` per window | up to 2 × `limit` within a moment |
//! | [`SlidingWindow`](Algorithm::SlidingWindow) | this and the previous window's counts | `limit` per rolling window, approximately | at most `limit` × (1 + d / window) in any span d ≤ window |
//! | [`Gcra`](Algorithm::Gcra) | one theoretical arrival time | `burst` at once, then one per `window / limit` | none: exactly `burst`, then the rate |
//!
//! **Sliding window.** Windows start at the key's first request and follow
//! each other; the count used is `current + previous × (window − elapsed) /
//! window`, the previous window's count weighted by how much of it the rolling
//! window still covers. It assumes the previous window's requests were spread
//! evenly; when they were not, it can admit more than `limit` in a rolling
//! window, but never more than `limit × (1 + d / window)` within any span of
//! length `d ≤ window` (a fixed window admits `2 × limit` within 2 ms). A
//! denied request is told when its cost will fit (`Retry-After`), and `t` in
//! `RateLimit` is when the count will have drained to zero.
//!
//! **GCRA** (the generic cell rate algorithm, a token bucket kept as one
//! timestamp). One unit is emitted every `window / limit` (the emission
//! interval); a key may run up to `burst` units ahead. A denied request gets
//! the exact wait until its cost fits; `t` is when the bucket will be full
//! again. The emission interval must be at least 1 µs (`limit` per
//! millisecond of window ≤ 1000), which [`Quota::gcra`](crate::Quota::gcra)
//! checks. Time is whole microseconds (Redis `TIME`), and GCRA is exact at
//! every quota it accepts, whole intervals (`1000/1ms`, `100/1s`) or
//! fractional ones (`3/1s`, 333 333⅓ µs): at one instant a key gets exactly
//! `burst` units, and a unit is admitted exactly when exact rational GCRA
//! admits it, never a fraction of a microsecond early. It counts in whole
//! numbers (Redis's Lua has only doubles, exact up to `2^53`): time in units
//! of `1/per_us` µs, where `step / per_us` is the interval in lowest terms,
//! so the bucket is `burst × step` of them, which must be at most
//! [`MAX_GCRA_CAPACITY`](crate::quota::MAX_GCRA_CAPACITY) (`2^52`).
//! [`Quota::gcra`](crate::Quota::gcra) rejects a quota above it with
//! [`QuotaError::GcraTooPrecise`](crate::QuotaError::GcraTooPrecise); only a
//! limit sharing few factors with the window and a large burst get there
//! (`1/366d` takes a burst of up to 142, `999983/1d` up to 52 124,
//! `1000000/1d` up to 52 billion).

/// How a quota counts; see the [module docs](self).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// A counter per window; the window starts at the key's first request
    /// and lasts the quota's window, to the millisecond, in either store
    /// (but for a window of 1 ms, which lasts 2 on Redis: `PEXPIRE 0`
    /// deletes a key, so the shortest expiry Redis keeps is 1 ms past the
    /// current one, and its wait says 2 ms).
    #[default]
    FixedWindow,
    /// A weighted count over this and the previous window.
    SlidingWindow,
    /// GCRA: `burst` units at once, then one per emission interval.
    Gcra {
        /// Units a key may spend at once (at least 1).
        burst: u64,
    },
}

impl Algorithm {
    /// The short name used in store keys: `fw`, `sw` or `gcra`.
    pub fn key_name(&self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fw",
            Algorithm::SlidingWindow => "sw",
            Algorithm::Gcra { .. } => "gcra",
        }
    }

    /// The number the store scripts use for it (1, 2 or 3).
    pub(crate) fn code(&self) -> u8 {
        match self {
            Algorithm::FixedWindow => 1,
            Algorithm::SlidingWindow => 2,
            Algorithm::Gcra { .. } => 3,
        }
    }
}
