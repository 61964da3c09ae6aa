//! The algorithms of `lua/fixed_window.lua`, `sliding_window.lua` and
//! `gcra.lua`, in Rust, with the same formulas in the same order (so the same
//! floating-point results) for [`MemoryStore`](super::MemoryStore).

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
    Gcra {
        tat: f64,
        expires_ms: u64,
    },
}

impl Entry {
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

impl<const N: usize> Packed<N> {
    pub(super) fn expires_ms(&self) -> u64 {
        self.0[0]
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
                tat: f64::from_bits(a),
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
            Entry::Gcra { tat, expires_ms } => [expires_ms, tat.to_bits(), 0, 0],
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
        remaining_after: limit.saturating_sub(count + cost),
        reset_ms: ttl,
        reset_after_ms: ttl,
        retry_ms: ttl,
        spent: (cost > 0).then(|| Entry::Fixed {
            count: count + cost,
            expires_ms: expires.unwrap_or(now.ms + window),
        }),
    }
}

fn sliding_window(entry: Option<&mut Entry>, q: Quota, cost: u64, now: Now) -> Checked {
    let (limit, window) = (q.limit(), q.window_ms());
    let (mut s, mut c, mut p) = match entry {
        Some(&mut Entry::Sliding { s, c, p, .. }) => (s.min(now.ms), c, p),
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
    let retry = if c + cost <= limit {
        (w - (l - cf - costf) * w / pf - e).ceil()
    } else {
        left + (w - (l - costf) * w / cf).max(0.0).ceil()
    };
    Checked {
        allowed,
        remaining: floor0(l - cf - weighted),
        remaining_after: floor0(l - (cf + costf) - weighted),
        reset_ms: drain(c),
        reset_after_ms: drain(c + cost),
        retry_ms: retry.max(1.0) as u64,
        spent: (cost > 0).then_some(Entry::Sliding {
            s,
            c: c + cost,
            p,
            expires_ms,
        }),
    }
}

fn gcra(entry: Option<&mut Entry>, q: Quota, burst: u64, cost: u64, now: Now) -> Checked {
    let interval = q.window_ms() as f64 * 1000.0 / q.limit() as f64;
    let capacity = burst as f64 * interval;
    // Rounding slack in microseconds, as in `gcra.lua`: none for a whole
    // interval (exact integers), half a microsecond for a fraction, less
    // than any interval (> 1 µs), so a full bucket never fits another unit.
    let slack = if (q.window_ms() * 1000).is_multiple_of(q.limit()) {
        0.0
    } else {
        0.5
    };
    let now_us = now.us as f64;
    let ahead = match entry {
        Some(&mut Entry::Gcra { tat, .. }) => (tat - now_us).max(0.0).min(capacity),
        _ => 0.0,
    };
    let after = ahead + cost as f64 * interval;
    let fits = |a: f64| ((capacity - a + slack) / interval).floor().max(0.0) as u64;
    let ms = |us: f64| (us / 1000.0).ceil() as u64;
    Checked {
        allowed: after <= capacity + slack,
        remaining: fits(ahead),
        remaining_after: fits(after),
        reset_ms: ms(ahead),
        reset_after_ms: ms(after),
        retry_ms: ms(after - capacity).max(1),
        spent: (cost > 0).then(|| Entry::Gcra {
            tat: now_us + after,
            expires_ms: now.ms + ms(after).max(1),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GCRA quotas at the edges of what [`Quota::gcra`] accepts: one unit per
    /// microsecond, just slower, whole and fractional intervals, the longest
    /// window.
    const EDGES: [(&str, u64); 8] = [
        ("1000/1ms", 10),
        ("1000/1ms", 1),
        ("999/1ms", 10),
        ("1/1ms", 1),
        ("7/1ms", 5),
        ("3/1s", 3),
        ("31622400000000/366d", 4),
        ("1/366d", 1),
    ];

    /// `n` requests of cost 1 at one instant, each spending what it
    /// admits: how many were admitted.
    fn admitted(entry: &mut Option<Entry>, q: Quota, n: u64, us: u64) -> u64 {
        let now = Now { us, ms: us / 1000 };
        let mut count = 0;
        for _ in 0..n {
            let c = check(entry.as_mut(), q, 1, now);
            if c.allowed {
                *entry = c.spent;
                count += 1;
            }
        }
        count
    }

    /// At one instant a bucket admits exactly its burst, however fast the
    /// rate (1000/1ms once admitted everything: its 1 µs tolerance let a
    /// clamped, full bucket fit one more unit each time). Later, a whole
    /// interval refills exactly one unit; a fractional one at least one, at
    /// most half a microsecond early, and never another at the same instant.
    #[test]
    fn gcra_admits_exactly_the_burst_at_every_edge_quota() {
        for (text, burst) in EDGES {
            let q = text.parse::<Quota>().unwrap().gcra(burst).unwrap();
            let window_us = q.window_ms() * 1000;
            let whole = window_us.is_multiple_of(q.limit());
            let context = format!("{text} burst {burst}");
            let t0 = 1_000_000_000_000;
            let mut entry = None;
            assert_eq!(
                admitted(&mut entry, q, 2 * burst + 10, t0),
                burst,
                "{context}"
            );
            let later = t0 + window_us.div_ceil(q.limit());
            let refilled = admitted(&mut entry, q, 5, later);
            match whole {
                true => assert_eq!(refilled, 1, "{context}, one interval later"),
                false => assert!((1..=2).contains(&refilled), "{context}: {refilled}"),
            }
            assert_eq!(
                admitted(&mut entry, q, 5, later),
                0,
                "{context}, same instant"
            );
        }
    }
}
