//! `RATE_LIMIT`, `RATE_LIMIT_ALGORITHM`, `RATE_LIMIT_BURST`,
//! `RATE_LIMIT_DENY_CACHE`, `RATE_LIMIT_SHADOW`, `RATE_LIMIT_RESERVE` and
//! `RATE_LIMIT_RESERVE_KEYS`: the limits an example server enforces, and how.

use redis_ratelimit::{Limiter, LimiterBuilder, Quota, QuotaError, quota::MAX_LIMIT};

use super::{Error, var};

/// One or more quotas, all counted with one algorithm.
pub(super) struct Limits {
    quotas: Vec<Quota>,
    algorithm: String,
    burst: Option<u64>,
    deny_cache: bool,
    shadow: bool,
    /// `RATE_LIMIT_RESERVE`: units reserved per Redis call (hot keys).
    reserve: Option<u64>,
    /// `RATE_LIMIT_RESERVE_KEYS`: how many keys may hold a reservation.
    reserve_keys: Option<usize>,
    /// For the startup line, e.g. `10/1s;1000/1d (gcra, burst 20)`.
    described: String,
}

impl Limits {
    /// Reads the variables; `None` for `RATE_LIMIT=off`.
    pub(super) fn from_env() -> Result<Option<Self>, Error> {
        let text = var("RATE_LIMIT")?.unwrap_or_else(|| "100/1s".into());
        let algorithm = var("RATE_LIMIT_ALGORITHM")?.unwrap_or_else(|| "fixed-window".into());
        let burst = var("RATE_LIMIT_BURST")?;
        let burst = match burst {
            Some(b) => Some(b.trim().parse::<u64>().map_err(|_| {
                Error::config(
                    "RATE_LIMIT_BURST",
                    &b,
                    "use a whole number of requests, such as 20",
                )
            })?),
            None => None,
        };
        let algorithm = algorithm.to_ascii_lowercase();
        if !matches!(
            algorithm.as_str(),
            "fixed-window" | "sliding-window" | "gcra"
        ) {
            let fix = "use `fixed-window` (the default), `sliding-window` or `gcra`";
            return Err(Error::config("RATE_LIMIT_ALGORITHM", &algorithm, fix));
        }
        if burst.is_some() && algorithm != "gcra" {
            return Err(Error::usage(format!(
                "RATE_LIMIT_BURST is set but RATE_LIMIT_ALGORITHM is {algorithm}: a burst is a GCRA setting; \
                 set RATE_LIMIT_ALGORITHM=gcra or unset RATE_LIMIT_BURST"
            )));
        }
        // Read even with `off`, so that a typo is reported all the same.
        let deny_cache = switch("RATE_LIMIT_DENY_CACHE", true)?;
        let shadow = switch("RATE_LIMIT_SHADOW", false)?;
        // At most MAX_LIMIT, as `local_reservation` takes: refused here,
        // naming the variable, not later by the limiter's build.
        let reserve = match var("RATE_LIMIT_RESERVE")? {
            Some(n) => Some(
                n.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        let fix = format!(
                            "use a whole number of requests from 1 to {MAX_LIMIT}, such as 50, \
                             or unset it"
                        );
                        Error::config("RATE_LIMIT_RESERVE", &n, fix)
                    })?,
            ),
            None => None,
        };
        let reserve_keys = match var("RATE_LIMIT_RESERVE_KEYS")? {
            Some(n) => Some(
                n.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=10_000_000).contains(n))
                    .ok_or_else(|| {
                        Error::config(
                            "RATE_LIMIT_RESERVE_KEYS",
                            &n,
                            "use a whole number of keys from 1 to 10000000, such as 200000, or unset it",
                        )
                    })?,
            ),
            None => None,
        };
        if reserve_keys.is_some() && reserve.is_none() {
            return Err(Error::usage(
                "RATE_LIMIT_RESERVE_KEYS sizes the local reservations: set RATE_LIMIT_RESERVE too, \
                 or unset RATE_LIMIT_RESERVE_KEYS"
                    .into(),
            ));
        }
        if text.trim().eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        let mut quotas = Vec::new();
        for part in text.split(';') {
            let fix = |e: &dyn std::fmt::Display| {
                let fix = format!(
                    "{e}; give one or more quotas separated by `;`, such as 10/1s;1000/1d, or `off`"
                );
                Error::config("RATE_LIMIT", &text, fix)
            };
            let quota: Quota = part.trim().parse().map_err(|e| fix(&e))?;
            let quota = shape(quota, "RATE_LIMIT", &algorithm, burst)?;
            if quotas.contains(&quota) {
                return Err(fix(&format!("{part} is given twice")));
            }
            quotas.push(quota);
        }
        if reserve.is_some() && (algorithm != "fixed-window" || quotas.len() > 1) {
            return Err(Error::usage(
                "RATE_LIMIT_RESERVE needs one fixed-window quota: set RATE_LIMIT_ALGORITHM=fixed-window \
                 and one quota in RATE_LIMIT, or unset RATE_LIMIT_RESERVE"
                    .into(),
            ));
        }
        let list: Vec<String> = quotas.iter().map(Quota::to_string).collect();
        let burst_text = burst.map(|b| format!(", burst {b}")).unwrap_or_default();
        let cache = if deny_cache {
            "deny cache on"
        } else {
            "deny cache off"
        };
        let dry = if shadow {
            ", shadow mode: nothing denied"
        } else {
            ""
        };
        let reserved = match (reserve, reserve_keys) {
            (Some(n), Some(keys)) => format!(", local reservation of {n} for up to {keys} keys"),
            (Some(n), None) => format!(", local reservation of {n}"),
            _ => String::new(),
        };
        let described = format!(
            "{} ({algorithm}{burst_text}, {cache}{dry}{reserved})",
            list.join(";")
        );
        Ok(Some(Self {
            quotas,
            algorithm,
            burst,
            deny_cache,
            shadow,
            reserve,
            reserve_keys,
            described,
        }))
    }

    /// A builder with every quota. One quota is named `default`; several are
    /// named by their text (`"10/1s"`), which the `RateLimit` headers show.
    pub(super) fn builder(&self) -> LimiterBuilder {
        let mut builder = self.reserving(Limiter::builder(self.quotas[0]).shadow(self.shadow));
        if !self.deny_cache {
            builder = builder.deny_cache(0);
        }
        if self.quotas.len() > 1 {
            builder = builder.name(self.quotas[0].to_string());
            for q in &self.quotas[1..] {
                builder = builder.limit(q.to_string(), *q);
            }
        }
        builder
    }
}

impl Limits {
    /// `builder` with `RATE_LIMIT_RESERVE` and `RATE_LIMIT_RESERVE_KEYS`.
    fn reserving(&self, mut builder: LimiterBuilder) -> LimiterBuilder {
        if let Some(n) = self.reserve {
            builder = builder.local_reservation(n);
        }
        if let Some(keys) = self.reserve_keys {
            builder = builder.local_reservation_keys(keys);
        }
        builder
    }

    /// Whether `RATE_LIMIT_RESERVE` is set.
    pub(super) fn reserves(&self) -> bool {
        self.reserve.is_some()
    }

    /// `quota` under `RATE_LIMIT_ALGORITHM` and `RATE_LIMIT_BURST`, as
    /// every quota of `RATE_LIMIT`; errors blame `source`, the setting that
    /// gave it (such as `RATE_LIMIT_TIERS tier pro`).
    pub(super) fn shape(&self, quota: Quota, source: &str) -> Result<Quota, Error> {
        shape(quota, source, &self.algorithm, self.burst)
    }

    /// A builder for one tier's limiter: `quota`, named `name`, with the
    /// deny cache and shadow settings of the default.
    pub(super) fn tier_builder(&self, name: &str, quota: Quota) -> LimiterBuilder {
        let mut builder = self.reserving(Limiter::builder(quota).name(name).shadow(self.shadow));
        if !self.deny_cache {
            builder = builder.deny_cache(0);
        }
        builder
    }
}

/// `quota` counted with `algorithm` (and `burst`, for GCRA); errors name
/// `source`, the setting `quota` comes from, as in `{source}={quota}`.
fn shape(quota: Quota, source: &str, algorithm: &str, burst: Option<u64>) -> Result<Quota, Error> {
    Ok(match algorithm {
        "sliding-window" => quota.sliding_window(),
        // Default burst: the quota's own count.
        "gcra" => quota.gcra(burst.unwrap_or(quota.limit())).map_err(|e| {
            // The burst's own error, or the quota's (too fast, too fine),
            // named by the variables that set them.
            match (e, burst) {
                (e @ QuotaError::BadBurst(_), Some(burst)) => {
                    Error::config("RATE_LIMIT_BURST", &burst.to_string(), e)
                }
                (e, Some(burst)) => Error::usage(format!(
                    "{source}={quota} with RATE_LIMIT_ALGORITHM=gcra and \
                     RATE_LIMIT_BURST={burst} is invalid: {e}"
                )),
                (e, None) => Error::usage(format!(
                    "{source}={quota} with RATE_LIMIT_ALGORITHM=gcra (a burst of its \
                     limit) is invalid: {e}"
                )),
            }
        })?,
        _ => quota,
    })
}

impl std::fmt::Display for Limits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.described)
    }
}

/// An `on`/`off` variable.
fn switch(name: &'static str, default: bool) -> Result<bool, Error> {
    match var(name)?.map(|v| v.to_ascii_lowercase()) {
        None => Ok(default),
        Some(v) if v == "on" => Ok(true),
        Some(v) if v == "off" => Ok(false),
        Some(v) => Err(Error::config(name, &v, "use `on` or `off`")),
    }
}
