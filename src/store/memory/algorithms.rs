//! The algorithms of `lua/fixed_window.lua`, `sliding_window.lua` and
//! `gcra.lua`, in Rust, with the same formulas in the same order (so the same
//! floating-point results; GCRA's are exact integers in both) for
//! [`MemoryStore`](super::MemoryStore).

use crate::{Algorithm, Quota, store::LimitState};

/// The store's clock: microseconds, and whole milliseconds of the same instant
/// (as the scripts get from Redis `TIME`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Now {
    pub(super) us: u64,
    pub(super) ms: u64,
}

/// One key's state.
#[derive(Debug, Clone, Copy)]
pub(super) enum Entry {
    Fixed {
        count: u64,
        expires_ms: u64,
    },
    Sliding {
        s: u64,
        c: u64,
        p: u64,
        expires_ms: u64,
    },
    /// The entry expires when its bucket is full, at the TAT rounded up to a
    /// whole millisecond, and `early` says where in that ms the TAT falls,
    /// as `gcra.lua`'s `a:b` does: `a`, the TAT's whole µs, is `expires_ms ×
    /// 1000 − early_us`, and `b`, the remainder in the writer's units of
    /// `1/per_us` µs, is below the writer's `per_us`; `early` is `b << 10 |
    /// early_us` (`early_us` ≤ 1000, `b` below `MAX_LIMIT`, 2^50). So a
    /// quota of another rate reads it as the script does (see
    /// [`Entry::gcra_ahead`]).
    Gcra {
        early: u64,
        expires_ms: u64,
    },
}

/// The low bits of a GCRA entry's `early` that hold its whole µs below the
/// expiry's ms (0 to 1000); the bits above hold the remainder.
const EARLY_US_BITS: u32 = 10;

impl Entry {
    /// A GCRA entry whose TAT is `tat_l` (in units of `1/per_us` µs, with
    /// `per_ms = 1000 × per_us`): it expires at the TAT rounded up to a whole
    /// ms (see [`Entry::Gcra`]).
    pub(super) fn gcra_at(tat_l: u128, per_ms: u128) -> Entry {
        let per_us = per_ms / 1000;
        let expires_ms = tat_l.div_ceil(per_ms);
        let (whole_us, b) = (tat_l / per_us, tat_l % per_us);
        let early_us = expires_ms * 1000 - whole_us;
        Entry::Gcra {
            early: ((b << EARLY_US_BITS) | early_us) as u64,
            expires_ms: expires_ms as u64,
        }
    }

    /// How far a GCRA entry's TAT runs ahead of `now_l` (both in units of
    /// `1/per_us` µs, with `per_ms = 1000 × per_us`), unclamped; 0 for an
    /// entry of another algorithm.
    pub(super) fn gcra_ahead(&self, now_l: u128, per_ms: u128) -> u128 {
        let Entry::Gcra { early, expires_ms } = *self else {
            return 0;
        };
        let per_us = per_ms / 1000;
        let early_us = u128::from(early) & ((1 << EARLY_US_BITS) - 1);
        let mut whole_us = (u128::from(expires_ms) * 1000).saturating_sub(early_us);
        let mut b = u128::from(early) >> EARLY_US_BITS;
        // As the script reads it: a remainder not below this quota's
        // `per_us` (written by one with a larger `per_us`) rounds the TAT up
        // to the next whole µs; a smaller one is read in this quota's
        // units, which for a larger `per_us` is up to 1 µs early.
        if b >= per_us {
            (whole_us, b) = (whole_us + 1, 0);
        }
        (whole_us * per_us + b).saturating_sub(now_l)
    }

    /// When the entry's key expires (ms).
    pub(super) fn expires_ms(&self) -> u64 {
        match *self {
            Entry::Fixed { expires_ms, .. }
            | Entry::Sliding { expires_ms, .. }
            | Entry::Gcra { expires_ms, .. } => expires_ms,
        }
    }
}

/// An [`Entry`] as a table holds it: `N` words, its expiry first, and no
/// enum tag, because the key names its algorithm (the `{algo}` part of
/// every store key), so the quota that reads an entry is always of the
/// algorithm that wrote it. A fixed window or GCRA entry needs 2 words, a
/// sliding window's 4.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Packed<const N: usize>([u64; N]);

/// A free slot's filler: never read as an entry.
impl<const N: usize> Default for Packed<N> {
    fn default() -> Self {
        Self([0; N])
    }
}

impl<const N: usize> Packed<N> {
    pub(super) fn expires_ms(&self) -> u64 {
        self.0[0]
    }

    /// Expires the entry now: it reads as absent from then on.
    pub(super) fn expire(&mut self) {
        self.0[0] = 0;
    }

    /// The entry, read as `q`'s algorithm's.
    pub(super) fn unpack(self, q: Quota) -> Entry {
        const { assert!(N >= 2 && N <= 4) };
        let mut words = [0; 4];
        words[..N].copy_from_slice(&self.0);
        let [expires_ms, a, b, c] = words;
        match q.algorithm() {
            Algorithm::SlidingWindow => Entry::Sliding {
                s: a,
                c: b,
                p: c,
                expires_ms,
            },
            Algorithm::Gcra { .. } => Entry::Gcra {
                early: a,
                expires_ms,
            },
            _ => Entry::Fixed {
                count: a,
                expires_ms,
            },
        }
    }

    /// The first `N` words of `entry` (all of them, for its algorithm's
    /// table).
    pub(super) fn pack(entry: Entry) -> Self {
        const { assert!(N >= 2 && N <= 4) };
        let words = match entry {
            Entry::Fixed { count, expires_ms } => [expires_ms, count, 0, 0],
            Entry::Sliding {
                s,
                c,
                p,
                expires_ms,
            } => [expires_ms, s, c, p],
            Entry::Gcra { early, expires_ms } => [expires_ms, early, 0, 0],
        };
        let mut packed = [0; N];
        packed.copy_from_slice(&words[..N]);
        Self(packed)
    }
}

/// What one limit says, before and after spending.
#[derive(Debug, Clone, Copy)]
pub(super) struct Checked {
    pub(super) allowed: bool,
    pub(super) remaining: u64,
    pub(super) remaining_after: u64,
    pub(super) reset_ms: u64,
    pub(super) reset_after_ms: u64,
    /// µs from now until the state after a spend has reset: exact (rounded
    /// up to the µs) for GCRA, whose reset the caller sees in whole ms;
    /// `reset_after_ms` in µs for the windows, which count in ms.
    pub(super) reset_after_us: u64,
    pub(super) retry_ms: u64,
    /// The entry to store if the decision spends.
    pub(super) spent: Option<Entry>,
}

impl Checked {
    /// What the caller learns: the state after the spend, or before it when
    /// nothing was spent.
    pub(super) fn state(&self, spends: bool) -> LimitState {
        LimitState {
            allowed: self.allowed,
            remaining: if spends {
                self.remaining_after
            } else {
                self.remaining
            },
            reset_ms: if spends {
                self.reset_after_ms
            } else {
                self.reset_ms
            },
            retry_ms: if self.allowed { 0 } else { self.retry_ms },
        }
    }
}

/// Checks `cost` against `entry` (a live entry of this key, if any). Heals
/// `entry` in place where the scripts would (an over-long expiry).
pub(super) fn check(entry: Option<&mut Entry>, q: Quota, cost: u64, now: Now) -> Checked {
    match q.algorithm() {
        Algorithm::SlidingWindow => sliding_window(entry, q, cost, now),
        Algorithm::Gcra { burst } => gcra(entry, q, burst, cost, now),
        _ => fixed_window(entry, q, cost, now),
    }
}

fn fixed_window(entry: Option<&mut Entry>, q: Quota, cost: u64, now: Now) -> Checked {
    let (limit, window) = (q.limit(), q.window_ms());
    let (count, expires) = match entry {
        Some(Entry::Fixed { count, expires_ms }) => {
            *expires_ms = (*expires_ms).min(now.ms + window);
            (*count, Some(*expires_ms))
        }
        _ => (0, None),
    };
    let ttl = expires.map_or(window, |e| e - now.ms);
    let allowed = count.saturating_add(cost) <= limit;
    Checked {
        allowed,
        remaining: limit.saturating_sub(count),
        remaining_after: limit.saturating_sub(count.saturating_add(cost)),
        reset_ms: ttl,
        reset_after_ms: ttl,
        reset_after_us: ttl.saturating_mul(1000),
        retry_ms: ttl,
        spent: (cost > 0).then(|| Entry::Fixed {
            count: count.saturating_add(cost),
            expires_ms: expires.unwrap_or(now.ms + window),
        }),
    }
}

fn sliding_window(entry: Option<&mut Entry>, q: Quota, cost: u64, now: Now) -> Checked {
    let (limit, window) = (q.limit(), q.window_ms());
    let (mut s, mut c, mut p) = match entry.as_deref() {
        Some(&Entry::Sliding { s, c, p, .. }) => (s.min(now.ms), c, p),
        _ => (now.ms, 0, 0),
    };
    let mut elapsed = now.ms - s;
    if elapsed >= window {
        let k = elapsed / window;
        p = if k == 1 { c } else { 0 };
        c = 0;
        s += k * window;
        elapsed = now.ms - s;
    }
    let expires_ms = s + 2 * window;
    if let Some(Entry::Sliding {
        expires_ms: held, ..
    }) = entry
    {
        // An expiry beyond two windows (the window shortened since) is cut,
        // as `sliding_window.lua`'s undo heals the key's TTL.
        *held = (*held).min(expires_ms);
    }
    let (l, w, e) = (limit as f64, window as f64, elapsed as f64);
    let (cf, pf, costf) = (c as f64, p as f64, cost as f64);
    let left = w - e;
    let weighted = pf * left / w;
    let allowed = cf + costf + weighted <= l;
    let floor0 = |x: f64| x.floor().max(0.0) as u64;
    let drain = |count: u64| {
        if count > 0 {
            window - elapsed + window
        } else if p > 0 {
            window - elapsed
        } else {
            0
        }
    };
    let retry = if c.saturating_add(cost) <= limit {
        (w - (l - cf - costf) * w / pf - e).ceil()
    } else {
        // As the script: never past the next window's end (a cost beyond
        // the limit, with c = 0, would be +inf).
        left + (w - (l - costf) * w / cf).clamp(0.0, w).ceil()
    };
    Checked {
        allowed,
        remaining: floor0(l - cf - weighted),
        remaining_after: floor0(l - (cf + costf) - weighted),
        reset_ms: drain(c),
        reset_after_ms: drain(c.saturating_add(cost)),
        reset_after_us: drain(c.saturating_add(cost)).saturating_mul(1000),
        retry_ms: retry.max(1.0) as u64,
        spent: (cost > 0).then_some(Entry::Sliding {
            s,
            c: c.saturating_add(cost),
            p,
            expires_ms,
        }),
    }
}

/// GCRA as `gcra.lua` decides it, in whole numbers: time in units of
/// `1/per_us` µs, a unit costs `step` of them, the bucket holds `cap =
/// burst × step` (at most [`MAX_GCRA_CAPACITY`](crate::quota::MAX_GCRA_CAPACITY),
/// which [`Quota::gcra`] checks). Exact, so the script's answers to the
/// same question are the same.
fn gcra(entry: Option<&mut Entry>, q: Quota, burst: u64, cost: u64, now: Now) -> Checked {
    let (step, per_us) = q.gcra_units();
    let cap = u128::from(burst * step);
    let per_ms = 1000 * u128::from(per_us);
    let now_l = u128::from(now.us) * u128::from(per_us);
    // µs in units of 1/per_us, to ms, rounded up.
    let ms = |x: u128| saturate(x.div_ceil(u128::from(per_us)).div_ceil(1000));
    // A TAT beyond a full bucket (booked by a wider burst: one lowered
    // since, or a limiter of the old quota sharing the key) is obeyed, as
    // `gcra.lua` obeys it: the key admits again once the booking has
    // drained to within this bucket.
    let ahead = entry.map_or(0, |entry| entry.gcra_ahead(now_l, per_ms));
    let spend = u128::from(cost) * u128::from(step);
    let allowed = cost <= burst && ahead + spend <= cap;
    let after = if allowed { ahead + spend } else { ahead };
    let retry_ms = match (allowed, cost <= burst) {
        (true, _) => 0,
        (false, true) => ms(ahead + spend - cap).max(1),
        // Never fits: the wait until the bucket is full.
        (false, false) => ms(ahead).max(1),
    };
    Checked {
        allowed,
        remaining: saturate(cap.saturating_sub(ahead) / u128::from(step)),
        remaining_after: if allowed {
            saturate((cap - after) / u128::from(step))
        } else {
            0
        },
        reset_ms: ms(ahead),
        reset_after_ms: ms(after),
        reset_after_us: saturate(after.div_ceil(u128::from(per_us))),
        retry_ms,
        spent: (allowed && cost > 0).then(|| Entry::gcra_at(now_l + after, per_ms)),
    }
}

/// `x`, or `u64::MAX` if it does not fit.
fn saturate(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GCRA quotas at the edges of what [`Quota::gcra`] accepts: one unit per
    /// microsecond, just slower, whole and fractional intervals (999/1ms is
    /// 1.001 µs, 3/1s 333 333.3 µs), the longest window, and the largest
    /// burst × window the exact arithmetic takes (`1/366d` with the burst at
    /// the bound).
    const EDGES: [(&str, u64); 13] = [
        ("1000/1ms", 10),
        ("1000/1ms", 1),
        ("999/1ms", 10),
        ("999/1ms", 1),
        ("1/1ms", 1),
        ("7/1ms", 5),
        ("3/1s", 3),
        ("3/1s", 1),
        ("7/1h", 7),
        ("999983/1d", 52_124),
        ("31622400000000/366d", 4),
        ("31622399999999/366d", 3),
        ("1/366d", 142),
    ];

    /// One request of `cost` at `us`, as the store decides it: against the
    /// entry if it is live, healing it in place, and spending what it
    /// admits.
    fn decide(entry: &mut Option<Entry>, q: Quota, cost: u64, us: u64) -> Checked {
        let now = Now { us, ms: us / 1000 };
        let live = entry.as_ref().is_some_and(|e| e.expires_ms() > now.ms);
        let c = check(entry.as_mut().filter(|_| live), q, cost, now);
        if c.allowed && c.spent.is_some() {
            *entry = c.spent;
        }
        c
    }

    /// `n` requests of cost 1 at one instant, each spending what it
    /// admits: how many were admitted.
    fn admitted(entry: &mut Option<Entry>, q: Quota, n: u64, us: u64) -> u64 {
        (0..n).filter(|_| decide(entry, q, 1, us).allowed).count() as u64
    }

    /// A sliding window's expiry is cut to two windows after its (rolled)
    /// start when read, as `sliding_window.lua`'s undo cuts the key's TTL:
    /// a limit's window shortened on a live key (10/1h to 10/1m) forgets
    /// the hour's count when Redis does, and a window begun after it is
    /// weighed as Redis weighs it.
    #[test]
    fn sliding_window_heals_an_expiry_beyond_a_shortened_window() {
        let hour = "10/1h".parse::<Quota>().unwrap().sliding_window();
        let minute = "10/1m".parse::<Quota>().unwrap().sliding_window();
        let t0 = 1_000_000_000_000;
        let sec = 1_000_000;
        let mut entry = None;
        assert!(decide(&mut entry, hour, 10, t0).allowed);
        assert!(!decide(&mut entry, minute, 1, t0 + 30 * sec).allowed);
        let expires_ms = entry.map(|e| e.expires_ms());
        assert_eq!(expires_ms, Some(t0 / 1000 + 120_000));
        // Redis: the key is gone, a window begins at 150 s.
        assert!(decide(&mut entry, minute, 10, t0 + 150 * sec).allowed);
        let c = decide(&mut entry, minute, 1, t0 + 186 * sec);
        assert!(!c.allowed, "{c:?}");
    }

    /// A key booked further ahead than its bucket holds (a limit's burst
    /// lowered on a live key, or a limiter still on the wider quota sharing
    /// it) keeps its booking, as `gcra.lua` keeps it: the narrow quota
    /// denies, with the wait until the booking is within its bucket, and
    /// admits then; the wide one never sees its booking shortened, so the
    /// two together admit no more than the wide one alone.
    #[test]
    fn gcra_obeys_a_booking_beyond_a_lowered_burst() {
        let wide = "1/1s".parse::<Quota>().unwrap().gcra(100).unwrap();
        let narrow = "1/1s".parse::<Quota>().unwrap().gcra(1).unwrap();
        let t0 = 1_000_000_000_000;
        let mut entry = None;
        assert_eq!(admitted(&mut entry, wide, 100, t0), 100);
        let c = decide(&mut entry, narrow, 1, t0);
        assert_eq!(
            (c.allowed, c.remaining, c.retry_ms, c.reset_ms),
            (false, 0, 100_000, 100_000)
        );
        let expires_ms = entry.map(|e| e.expires_ms());
        assert_eq!(expires_ms, Some(t0 / 1000 + 100_000));
        // The wide quota's booking is whole: nothing to admit.
        assert!(!decide(&mut entry, wide, 1, t0 + 500_000).allowed);
        let c = decide(&mut entry, narrow, 1, t0 + 99_000_000);
        assert_eq!((c.allowed, c.retry_ms), (false, 1_000), "{c:?}");
        let c = decide(&mut entry, narrow, 1, t0 + 100_000_000);
        assert!(c.allowed, "{c:?}");
    }

    /// Exact GCRA, in rationals: the TAT times the limit, in µs (so every
    /// value is an integer). Admits `cost` at `now` iff
    /// `max(TAT, now) + cost × window / limit − now <= burst × window / limit`.
    struct Exact {
        tat_l: u128,
        limit: u128,
        window_us: u128,
        burst: u128,
    }

    impl Exact {
        fn new(q: Quota, burst: u64) -> Self {
            Self {
                tat_l: 0,
                limit: q.limit().into(),
                window_us: u128::from(q.window_ms()) * 1000,
                burst: burst.into(),
            }
        }

        /// (allowed, remaining before the spend), spending if allowed.
        fn decide(&mut self, now_us: u64, cost: u64) -> (bool, u64) {
            let now_l = u128::from(now_us) * self.limit;
            let ahead = self.tat_l.max(now_l) - now_l;
            let cap = self.burst * self.window_us;
            let remaining = ((cap - ahead) / self.window_us) as u64;
            let after = ahead + u128::from(cost) * self.window_us;
            let allowed = after <= cap;
            if allowed {
                self.tat_l = now_l + after;
            }
            (allowed, remaining)
        }

        /// The first whole µs at which `cost` fits.
        fn fits_at(&self, cost: u64) -> u64 {
            let need = self.tat_l + u128::from(cost) * self.window_us;
            let cap = self.burst * self.window_us;
            need.saturating_sub(cap).div_ceil(self.limit) as u64
        }
    }

    /// At one instant a bucket admits exactly its burst, however fast the
    /// rate (1000/1ms once admitted everything: its 1 µs tolerance let a
    /// clamped, full bucket fit one more unit each time), and whether the
    /// interval is a whole number of microseconds or not. One interval
    /// later, rounded up to a whole microsecond, exactly one more.
    #[test]
    fn gcra_admits_exactly_the_burst_at_every_edge_quota() {
        for (text, burst) in EDGES {
            let q = text.parse::<Quota>().unwrap().gcra(burst).unwrap();
            let window_us = q.window_ms() * 1000;
            let context = format!("{text} burst {burst}");
            let t0 = 1_000_000_000_000;
            let mut entry = None;
            assert_eq!(
                admitted(&mut entry, q, 2 * burst + 10, t0),
                burst,
                "{context}"
            );
            let later = t0 + window_us.div_ceil(q.limit());
            assert_eq!(
                admitted(&mut entry, q, 5, later - 1),
                0,
                "{context}, 1 µs early"
            );
            assert_eq!(
                admitted(&mut entry, q, 5, later),
                1,
                "{context}, one interval later"
            );
        }
    }

    /// Over a long run, at instants chosen to land just before and just at
    /// the exact moment a cost fits (where any rounding shows), and at
    /// pseudo-random ones, every decision and `remaining` is exact GCRA's.
    #[test]
    fn gcra_matches_exact_rational_gcra_over_a_long_run() {
        for (text, burst) in EDGES {
            let q = text.parse::<Quota>().unwrap().gcra(burst).unwrap();
            let mut exact = Exact::new(q, burst);
            let mut entry: Option<Entry> = None;
            let mut now = 1_700_000_000_000_000_u64;
            let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
            let mut admits = 0;
            for step in 0..3000 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let cost = 1 + seed % burst.min(3);
                now = match step % 3 {
                    0 => now.max(exact.fits_at(cost).saturating_sub(1)),
                    1 => now.max(exact.fits_at(cost)),
                    _ => now + seed % (q.window_ms() * 1000 / q.limit() + 2),
                };
                let at = Now {
                    us: now,
                    ms: now / 1000,
                };
                let live = entry.as_ref().is_some_and(|e| e.expires_ms() > at.ms);
                let c = check(entry.as_mut().filter(|_| live), q, cost, at);
                let (allowed, remaining) = exact.decide(now, cost);
                let context = format!("{text} burst {burst}, step {step} at {now}, cost {cost}");
                assert_eq!(c.allowed, allowed, "{context}");
                assert_eq!(c.remaining, remaining, "{context}");
                if c.allowed {
                    entry = c.spent;
                    admits += 1;
                }
            }
            assert!(admits >= 1000, "{text}: only {admits} admitted");
        }
    }
}
