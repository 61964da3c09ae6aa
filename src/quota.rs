//! [`Quota`]: how many units a key may spend per window.
//!
//! ```
//! use std::time::Duration;
//! use redis_ratelimit::Quota;
//!
//! let a = Quota::per_second(10);
//! let b: Quota = "10/1s".parse()?;
//! assert_eq!(a, b);
//!
//! let c = Quota::new(5, Duration::from_millis(500))?;
//! assert_eq!(c, "5/500ms".parse()?);
//! assert_eq!(c.to_string(), "5/500ms");
//!
//! // Mistakes are rejected with a message that says what to fix.
//! let err = "0/1s".parse::<Quota>().unwrap_err();
//! assert!(err.to_string().contains("at least 1"));
//! # Ok::<(), redis_ratelimit::QuotaError>(())
//! ```

use std::{fmt, str::FromStr, time::Duration};

use crate::Algorithm;

/// The largest limit a quota accepts.
///
/// Counts travel through Lua, whose numbers are doubles (exact below 2^53),
/// so limits are kept well inside that. The `RateLimit` headers' integers
/// stop at 10^15 - 1: a larger limit (or units left) is sent as that, the
/// most a header can say.
pub const MAX_LIMIT: u64 = 1 << 50;

/// The longest window a quota accepts: 366 days.
pub const MAX_WINDOW: Duration = Duration::from_secs(366 * 24 * 60 * 60);

/// The largest GCRA capacity, in the exact units GCRA counts in: `2^52`.
///
/// GCRA decides in whole numbers, in Lua as in Rust: the emission interval
/// `window / limit` is the fraction `step / per_us` of microseconds in lowest
/// terms (`step = window_µs / gcd(window_µs, limit)`), time counts in units
/// of `1/per_us` µs, and a full bucket is `burst × step` of them. Lua's
/// numbers are doubles, exact up to `2^53`; with the capacity at most `2^52`,
/// every sum the script forms stays within that. [`Quota::gcra`] rejects a
/// quota above it with [`QuotaError::GcraTooPrecise`].
pub const MAX_GCRA_CAPACITY: u64 = 1 << 52;

/// A rate: at most `limit` units per `window`.
///
/// Windows are whole milliseconds, from 1 ms to [`MAX_WINDOW`]; limits are
/// from 1 to [`MAX_LIMIT`]. Build one in code with [`Quota::per_second`],
/// [`Quota::per_minute`], [`Quota::per_hour`], [`Quota::per_day`] or
/// [`Quota::new`], or parse the text form `<limit>/<window>`, where the window
/// is a number and a unit out of `ms`, `s`, `m`, `h`, `d` (`"100/1s"`,
/// `"5/500ms"`, `"1000/1h"`, `"10/1d"`; a bare unit means one of it, `"60/m"`).
///
/// A quota counts with a fixed window unless it selects another
/// [`Algorithm`]: [`Quota::sliding_window`] or [`Quota::gcra`].
///
/// ```
/// use redis_ratelimit::{Algorithm, Quota};
///
/// let smooth = Quota::per_second(10).sliding_window();
/// assert_eq!(smooth.algorithm(), Algorithm::SlidingWindow);
/// // 10 per second on average, up to 20 at once.
/// let bursty = Quota::per_second(10).gcra(20)?;
/// assert_eq!(bursty.capacity(), 20);
/// # Ok::<(), redis_ratelimit::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u64,
    window_ms: u64,
    algorithm: Algorithm,
}

/// Why a quota was rejected. Every message says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// The limit was zero; a quota must admit at least one unit.
    #[error(
        "rate limit count must be at least 1 (a quota of 0 would deny everything; remove the limiter instead)"
    )]
    ZeroLimit,
    /// The limit was above [`MAX_LIMIT`].
    #[error("rate limit count {0} is too large; use at most {MAX_LIMIT}")]
    LimitTooLarge(u64),
    /// The window was zero or not a whole number of milliseconds.
    #[error(
        "rate limit window {0:?} is not a positive whole number of milliseconds; use at least 1ms"
    )]
    BadWindow(Duration),
    /// The window was longer than [`MAX_WINDOW`].
    #[error("rate limit window {0:?} is too long; use at most 366d")]
    WindowTooLong(Duration),
    /// The text was not of the form `<limit>/<window>`.
    #[error(
        "cannot parse rate limit {0:?}: expected <count>/<window> such as \"100/1s\", \"5/500ms\", \"1000/1h\" or \"10/1d\""
    )]
    Syntax(String),
    /// A GCRA burst was zero or above [`MAX_LIMIT`].
    #[error("GCRA burst {0} is invalid; use 1 to {MAX_LIMIT} units")]
    BadBurst(u64),
    /// A GCRA quota emits more than one unit per microsecond.
    #[error(
        "GCRA quota {0} emits more than one unit per microsecond; use a longer window or a lower count"
    )]
    GcraTooFast(String),
    /// A GCRA quota whose bucket, counted exactly, exceeds
    /// [`MAX_GCRA_CAPACITY`].
    #[error(
        "GCRA quota {quota} with burst {burst} is too large to count exactly: burst × window in µs / gcd(window in µs, count) = {capacity} exceeds 2^52; lower the burst or the window, or use a count that divides the window in µs"
    )]
    GcraTooPrecise {
        /// The quota, as text.
        quota: String,
        /// The burst asked for.
        burst: u64,
        /// `burst × step`, the capacity in exact units.
        capacity: u128,
    },
    /// The window's unit was not one of `ms`, `s`, `m`, `h`, `d`.
    #[error("unknown time unit {unit:?} in rate limit {text:?}: use one of ms, s, m, h, d")]
    UnknownUnit {
        /// The unit as written.
        unit: String,
        /// The whole text.
        text: String,
    },
}

impl Quota {
    /// `limit` units per `window`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use redis_ratelimit::Quota;
    /// let q = Quota::new(100, Duration::from_secs(60))?;
    /// assert_eq!(q.limit(), 100);
    /// assert!(Quota::new(1, Duration::from_micros(10)).is_err());
    /// # Ok::<(), redis_ratelimit::QuotaError>(())
    /// ```
    pub fn new(limit: u64, window: Duration) -> Result<Self, QuotaError> {
        if limit == 0 {
            return Err(QuotaError::ZeroLimit);
        }
        if limit > MAX_LIMIT {
            return Err(QuotaError::LimitTooLarge(limit));
        }
        if window > MAX_WINDOW {
            return Err(QuotaError::WindowTooLong(window));
        }
        if window.is_zero() || !window.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(QuotaError::BadWindow(window));
        }
        Ok(Self {
            limit,
            window_ms: window.as_millis() as u64,
            algorithm: Algorithm::FixedWindow,
        })
    }

    /// `limit` per second.
    ///
    /// # Panics
    /// If `limit` is 0 or above [`MAX_LIMIT`]; use [`Quota::new`] for values
    /// that come from configuration.
    pub fn per_second(limit: u64) -> Self {
        Self::fixed(limit, 1_000)
    }

    /// `limit` per minute. Panics like [`Quota::per_second`].
    pub fn per_minute(limit: u64) -> Self {
        Self::fixed(limit, 60_000)
    }

    /// `limit` per hour. Panics like [`Quota::per_second`].
    pub fn per_hour(limit: u64) -> Self {
        Self::fixed(limit, 3_600_000)
    }

    /// `limit` per day. Panics like [`Quota::per_second`].
    pub fn per_day(limit: u64) -> Self {
        Self::fixed(limit, 86_400_000)
    }

    fn fixed(limit: u64, window_ms: u64) -> Self {
        match Self::new(limit, Duration::from_millis(window_ms)) {
            Ok(q) => q,
            Err(e) => panic!("invalid quota: {e}"),
        }
    }

    /// The number of units per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window.
    pub fn window(&self) -> Duration {
        Duration::from_millis(self.window_ms)
    }

    /// The window in whole milliseconds, as the store scripts take it.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// How this quota counts (default [`Algorithm::FixedWindow`]).
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The same rate, counted with a fixed window (the default).
    #[must_use]
    pub fn fixed_window(self) -> Self {
        Self {
            algorithm: Algorithm::FixedWindow,
            ..self
        }
    }

    /// The same rate, counted with a sliding window (see [`Algorithm`]).
    #[must_use]
    pub fn sliding_window(self) -> Self {
        Self {
            algorithm: Algorithm::SlidingWindow,
            ..self
        }
    }

    /// The same rate as GCRA: `limit` units per window on average, one every
    /// `window / limit`, and up to `burst` at once.
    ///
    /// Fails if `burst` is 0 or above [`MAX_LIMIT`], if units would be
    /// emitted faster than one per microsecond, or if the bucket is too
    /// large to count exactly: `burst × window_µs / gcd(window_µs, limit)`
    /// above [`MAX_GCRA_CAPACITY`] (`2^52`). That bound only bites when the
    /// limit shares few factors with the window in microseconds: `1000000/1d`
    /// (one unit per 86.4 ms) takes a burst of up to 52 billion, while
    /// `999983/1d` (999983 is prime) takes at most 52 124, and `1/366d` at
    /// most 142.
    ///
    /// ```
    /// # use redis_ratelimit::{Quota, QuotaError};
    /// let q: Quota = "1000000/1d".parse()?;
    /// assert!(q.gcra(q.limit()).is_ok());
    /// let prime: Quota = "999983/1d".parse()?;
    /// assert!(prime.gcra(52_124).is_ok());
    /// assert!(prime.gcra(52_125).is_err());
    /// let err = prime.gcra(prime.limit()).unwrap_err();
    /// assert!(matches!(err, QuotaError::GcraTooPrecise { .. }));
    /// assert!(err.to_string().contains("lower the burst or the window"));
    /// # Ok::<(), QuotaError>(())
    /// ```
    pub fn gcra(self, burst: u64) -> Result<Self, QuotaError> {
        if burst == 0 || burst > MAX_LIMIT {
            return Err(QuotaError::BadBurst(burst));
        }
        if self.limit > self.window_ms.saturating_mul(1000) {
            return Err(QuotaError::GcraTooFast(self.to_string()));
        }
        let (step, _) = self.gcra_units();
        let capacity = u128::from(burst) * u128::from(step);
        if capacity > u128::from(MAX_GCRA_CAPACITY) {
            return Err(QuotaError::GcraTooPrecise {
                quota: self.to_string(),
                burst,
                capacity,
            });
        }
        Ok(Self {
            algorithm: Algorithm::Gcra { burst },
            ..self
        })
    }

    /// GCRA's exact units (see [`MAX_GCRA_CAPACITY`]): the emission interval
    /// `window_µs / limit` in lowest terms, `(step, per_us)`. A unit costs
    /// `step`; one microsecond is `per_us`.
    pub(crate) fn gcra_units(&self) -> (u64, u64) {
        let window_us = self.window_ms * 1000;
        let (mut a, mut b) = (window_us, self.limit);
        while b > 0 {
            (a, b) = (b, a % b);
        }
        (window_us / a, self.limit / a)
    }

    /// The largest cost one request can ever be admitted with: the burst
    /// for GCRA, the limit otherwise.
    pub fn capacity(&self) -> u64 {
        match self.algorithm {
            Algorithm::Gcra { burst } => burst,
            _ => self.limit,
        }
    }
}

impl FromStr for Quota {
    type Err = QuotaError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let syntax = || QuotaError::Syntax(text.to_owned());
        let (count, window) = text.trim().split_once('/').ok_or_else(syntax)?;
        let count = count.trim();
        if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
            return Err(syntax());
        }
        let limit = count
            .parse::<u64>()
            .map_err(|_| QuotaError::LimitTooLarge(u64::MAX))?;
        let window = window.trim();
        let split = window
            .find(|c: char| !c.is_ascii_digit())
            .ok_or_else(syntax)?;
        let (amount, unit) = window.split_at(split);
        let amount = match amount {
            "" => 1,
            digits => digits
                .parse::<u64>()
                .map_err(|_| QuotaError::WindowTooLong(Duration::MAX))?,
        };
        let unit_ms = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => {
                return Err(QuotaError::UnknownUnit {
                    unit: unit.to_owned(),
                    text: text.to_owned(),
                });
            }
        };
        let window_ms = amount
            .checked_mul(unit_ms)
            .ok_or(QuotaError::WindowTooLong(Duration::MAX))?;
        Quota::new(limit, Duration::from_millis(window_ms))
    }
}

impl fmt::Display for Quota {
    /// Writes the text form, in the largest unit that divides the window.
    /// The algorithm is not part of it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = [
            (86_400_000, "d"),
            (3_600_000, "h"),
            (60_000, "m"),
            (1_000, "s"),
        ];
        let (n, unit) = units
            .iter()
            .find(|(ms, _)| self.window_ms.is_multiple_of(*ms))
            .map(|(ms, u)| (self.window_ms / ms, *u))
            .unwrap_or((self.window_ms, "ms"));
        write!(f, "{}/{}{}", self.limit, n, unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Result<Quota, QuotaError> {
        s.parse()
    }

    #[test]
    fn parses_every_unit() {
        assert_eq!(q("100/1s").unwrap(), Quota::per_second(100));
        assert_eq!(q("5/500ms").unwrap().window(), Duration::from_millis(500));
        assert_eq!(q("1000/1h").unwrap(), Quota::per_hour(1000));
        assert_eq!(q("10/1d").unwrap(), Quota::per_day(10));
        assert_eq!(q("60/m").unwrap(), Quota::per_minute(60));
        assert_eq!(q(" 7 / 2m ").unwrap().window(), Duration::from_secs(120));
    }

    #[test]
    fn rejects_mistakes_with_a_fix() {
        assert_eq!(q("0/1s"), Err(QuotaError::ZeroLimit));
        assert!(matches!(q("5/0s"), Err(QuotaError::BadWindow(_))));
        assert!(matches!(q("5/0ms"), Err(QuotaError::BadWindow(_))));
        assert!(matches!(q("5/1w"), Err(QuotaError::UnknownUnit { .. })));
        assert!(matches!(q("5/1sec"), Err(QuotaError::UnknownUnit { .. })));
        assert!(matches!(q("5"), Err(QuotaError::Syntax(_))));
        assert!(matches!(q("-5/1s"), Err(QuotaError::Syntax(_))));
        assert!(matches!(q("5/10"), Err(QuotaError::Syntax(_))));
        assert!(matches!(q("/1s"), Err(QuotaError::Syntax(_))));
        assert!(matches!(
            q("99999999999999999999/1s"),
            Err(QuotaError::LimitTooLarge(_))
        ));
        assert!(matches!(
            q("1/99999999999999999999d"),
            Err(QuotaError::WindowTooLong(_))
        ));
        assert!(matches!(
            q("1/9999999999999999d"),
            Err(QuotaError::WindowTooLong(_))
        ));
        assert!(matches!(q("1/367d"), Err(QuotaError::WindowTooLong(_))));
        let msg = q("5/1w").unwrap_err().to_string();
        assert!(msg.contains("ms, s, m, h, d"), "{msg}");
    }

    #[test]
    fn rejects_sub_millisecond_windows() {
        assert!(Quota::new(1, Duration::from_micros(999)).is_err());
        assert!(Quota::new(1, Duration::from_micros(1500)).is_err());
        assert!(Quota::new(1, Duration::from_millis(1)).is_ok());
        assert!(Quota::new(MAX_LIMIT + 1, Duration::from_secs(1)).is_err());
    }

    /// GCRA takes a quota only if it can count it exactly (a capacity in
    /// units of 1/per_us µs of at most 2^52); common quotas all fit.
    #[test]
    fn gcra_rejects_only_what_it_cannot_count_exactly() {
        let gcra = |s: &str, burst| q(s).unwrap().gcra(burst);
        for s in [
            "1000/1ms",
            "100/1s",
            "3/1s",
            "7/1h",
            "1000000/1d",
            "999999/1d",
        ] {
            let quota = q(s).unwrap();
            assert!(quota.gcra(quota.limit()).is_ok(), "{s}");
        }
        assert!(gcra("1/366d", 142).is_ok());
        assert!(gcra("999983/1d", 52_124).is_ok());
        assert!(gcra("1000000/1d", 52_124_995_687).is_ok());
        assert!(gcra("31622399999999/366d", 142).is_ok());
        for (s, burst) in [
            ("1/366d", 143),
            ("999983/1d", 52_125),
            ("1000000/1d", 52_124_995_688),
            ("999983/1d", 999_983),
            ("31622399999999/366d", 143),
        ] {
            let err = gcra(s, burst).unwrap_err();
            assert!(
                matches!(err, QuotaError::GcraTooPrecise { burst: b, .. } if b == burst),
                "{s}: {err:?}"
            );
            let msg = err.to_string();
            assert!(msg.contains("lower the burst or the window"), "{msg}");
            assert!(msg.contains(s), "{msg}");
        }
    }

    #[test]
    fn display_round_trips() {
        for s in ["100/1s", "5/500ms", "1000/1h", "10/1d", "3/90s", "1/1500ms"] {
            assert_eq!(q(s).unwrap().to_string(), s);
            assert_eq!(q(&q(s).unwrap().to_string()).unwrap(), q(s).unwrap());
        }
    }
}
