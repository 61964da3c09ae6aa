//! `RATE_LIMIT_TIERS`, `RATE_LIMIT_TIER_HEADER`, `RATE_LIMIT_SKIP` and
//! `RATE_LIMIT_REFUND`: which limiter a request gets, which requests are
//! not limited, and which responses are refunded.

use std::net::IpAddr;

use http::HeaderName;
use redis_ratelimit::{
    ConfigError, Limiter, LimiterBuilder, MemoryStore, Quota, RateLimitLayer, Tiers,
    key::{self, RequestInfo},
    refund::Refund,
    skip::{ClientAddr, Networks, Skipping},
    tier::Tiered,
};

use super::{Error, KeyBy, limits::Limits, some_entry, var};

/// The layer the examples serve: keys by `RATE_LIMIT_KEY`, tiers by a
/// header, skips by network (an empty list or no tiers cost nothing).
pub type Layer = RateLimitLayer<Skipping<Tiered<KeyBy, key::Header>, Networks<KeyBy>>>;

/// The parsed variables.
pub(super) struct Policy {
    tiers: Vec<(String, Quota)>,
    tier_header: HeaderName,
    skip: Option<String>,
    refund: Option<(Refund, String)>,
}

impl Policy {
    pub(super) fn from_env(limits: Option<&Limits>) -> Result<Self, Error> {
        let tiers_text = var("RATE_LIMIT_TIERS")?;
        let header = var("RATE_LIMIT_TIER_HEADER")?;
        let tier_header = match (&tiers_text, header) {
            (None, Some(_)) => {
                return Err(Error::usage(
                    "RATE_LIMIT_TIER_HEADER is set but RATE_LIMIT_TIERS is not: list the tiers, \
                     such as RATE_LIMIT_TIERS=free=3/60s;pro=8/60s, or unset RATE_LIMIT_TIER_HEADER"
                        .into(),
                ));
            }
            (_, Some(h)) => HeaderName::try_from(h.trim()).map_err(|_| {
                Error::config(
                    "RATE_LIMIT_TIER_HEADER",
                    &h,
                    "use an HTTP header name, such as x-plan",
                )
            })?,
            (_, None) => HeaderName::from_static("x-plan"),
        };
        let mut tiers = Vec::new();
        if let Some(text) = &tiers_text {
            let fix = |why: &str| {
                let fix = format!(
                    "{why}; give tiers as <name>=<quota> separated by `;`, such as free=3/60s;pro=8/60s"
                );
                Error::config("RATE_LIMIT_TIERS", text, fix)
            };
            // Every limiter the layer builds, built now on a store of their
            // own and kept to the end: a tier that cannot be built, or that
            // would count on the default's counters (`default.100-1000`,
            // those of an unnamed 100/1s), is refused here, naming the
            // variable, not once the real store is connected.
            let probe = MemoryStore::new();
            let default = limits.and_then(|l| l.builder().store(probe.clone()).build().ok());
            let mut kept = Vec::new();
            for part in text.split(';').filter(|p| !p.trim().is_empty()) {
                let Some((name, quota)) = part.split_once('=') else {
                    return Err(fix(&format!("{:?} has no `=`", part.trim())));
                };
                let name = name.trim();
                let quota: Quota = quota.trim().parse().map_err(|e| fix(&format!("{e}")))?;
                let quota = match limits {
                    Some(l) => l.shape(quota, &format!("RATE_LIMIT_TIERS tier {name}"))?,
                    None => quota,
                };
                if tiers.iter().any(|(n, _)| n == name) {
                    return Err(fix(&format!("tier {name:?} is given twice")));
                }
                if default.as_ref().is_some_and(|d| d.name() == name) {
                    return Err(fix(&format!(
                        "tier {name:?} has the default limiter's name; pick another"
                    )));
                }
                let builder = match limits {
                    Some(l) => l.tier_builder(name, quota),
                    None => Limiter::builder(quota).name(name),
                };
                let limiter = builder.store(probe.clone()).build().map_err(|e| match e {
                    ConfigError::SharedCounters(taken) => fix(&format!(
                        "tier {name:?} would count on the default limiter's counters \
                         ({taken:?}); pick another name"
                    )),
                    e => fix(&e.to_string()),
                })?;
                kept.push(limiter);
                tiers.push((name.to_owned(), quota));
            }
            if tiers.is_empty() {
                return Err(fix("no tier given"));
            }
        }
        let skip = var("RATE_LIMIT_SKIP")?;
        if let Some(list) = &skip {
            some_entry("RATE_LIMIT_SKIP", list)?;
            Networks::new(key::PeerIp, list).map_err(|e| {
                Error::config(
                    "RATE_LIMIT_SKIP",
                    list,
                    format!("{e}; such as 127.0.0.0/8,::1"),
                )
            })?;
        }
        let refund = match var("RATE_LIMIT_REFUND")? {
            None => None,
            Some(text) => {
                let refund = text.parse::<Refund>().map_err(|_| {
                    let fix = "use `server-errors`, `client-errors` or `successes`";
                    Error::config("RATE_LIMIT_REFUND", &text, fix)
                })?;
                Some((refund, text.trim().to_ascii_lowercase()))
            }
        };
        Ok(Self {
            tiers,
            tier_header,
            skip,
            refund,
        })
    }

    /// The layer: `default` and the tiers (built by `builder`, then given
    /// the store by `store`), keyed by `key`.
    pub(super) fn layer(
        &self,
        limits: &Limits,
        default: Limiter,
        key: &KeyBy,
        store: impl Fn(LimiterBuilder) -> LimiterBuilder,
    ) -> Result<Layer, Error> {
        let mut tiers = Tiers::new(default);
        for (name, quota) in &self.tiers {
            let limiter = store(limits.tier_builder(name, *quota))
                .build()
                .map_err(|e| Error::runtime(format!("cannot build tier {name:?}: {e}")))?;
            tiers = tiers.tier(limiter);
        }
        let select = key::Header::from_name(self.tier_header.clone());
        let skip = Networks::new(key.clone(), self.skip.as_deref().unwrap_or(""))
            .map_err(|e| Error::config("RATE_LIMIT_SKIP", self.skip.as_deref().unwrap_or(""), e))?;
        let layer = RateLimitLayer::tiered(tiers, select, key.clone());
        let layer = match &self.refund {
            Some((refund, _)) => layer.refund_when(refund.clone()),
            None => layer,
        };
        Ok(layer.skip_networks(skip))
    }
}

impl std::fmt::Display for Policy {
    /// For the startup line, e.g. `; tiers by x-plan: free=3/60s, pro=8/60s`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.tiers.is_empty() {
            write!(f, "; tiers by {}:", self.tier_header)?;
            for (i, (name, quota)) in self.tiers.iter().enumerate() {
                write!(f, "{}{name}={quota}", if i == 0 { " " } else { ", " })?;
            }
        }
        if let Some(list) = &self.skip {
            write!(f, "; not limited: {list}")?;
        }
        if let Some((_, name)) = &self.refund {
            write!(f, "; refunds: {name}")?;
        }
        Ok(())
    }
}

/// `RATE_LIMIT_SKIP` matches the client the key is made from: the peer for
/// `ip`, the client behind the trusted proxies for `client-ip`, and the peer
/// for `header:<name>` keys (the header names no address; `TRUSTED_PROXIES`
/// needs `client-ip`).
impl<R: RequestInfo> ClientAddr<R> for KeyBy {
    fn client_addr(&self, req: &R) -> Option<IpAddr> {
        match self {
            KeyBy::PeerIp(k) => k.client_addr(req),
            KeyBy::ClientIp(k) => k.client_addr(req),
            KeyBy::Header(_) => key::PeerIp.client_addr(req),
        }
    }
}
