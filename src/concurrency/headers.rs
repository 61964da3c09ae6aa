//! `RateLimit-Policy` and `RateLimit` for a concurrency limit.
//!
//! ```text
//! RateLimit-Policy: "concurrency";q=5;qu="concurrent-requests"
//! RateLimit: "concurrency";r=2
//! Retry-After: 1                       (refused requests only)
//! ```
//!
//! `q` is the limit and `qu` the draft's quota unit for it; `r` is how many
//! more requests could start now. There is no window, so no `w` and no `t`.

use std::time::Duration;

use http::{HeaderValue, header::RETRY_AFTER};
use sfv::{RefBareItem, StringRef};

use crate::headers::{HeaderSink, RATELIMIT, RATELIMIT_POLICY, retry_after_secs, sf_int, sf_item};

/// A named concurrency limit and its `RateLimit-Policy` value, built once per
/// limiter.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Policy {
    name: Box<str>,
    limit: u64,
    /// `"<name>";q=<limit>;qu="concurrent-requests"`.
    header: HeaderValue,
}

impl Policy {
    pub(crate) fn new(name: &str, limit: u64) -> Self {
        let unit = StringRef::constant("concurrent-requests");
        let params = [
            ("q", RefBareItem::Integer(sf_int(limit))),
            ("qu", RefBareItem::String(unit)),
        ];
        Self {
            name: name.into(),
            limit,
            header: sf_item(name, params),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }
}

/// Writes the policy, what remains with `held` requests in flight, and
/// `Retry-After` when the request was refused.
pub(crate) fn write(
    sink: &mut impl HeaderSink,
    policy: &Policy,
    held: u64,
    retry_after: Option<Duration>,
) {
    sink.append(RATELIMIT_POLICY, policy.header.clone());
    let remaining = policy.limit.saturating_sub(held);
    let params = [("r", RefBareItem::Integer(sf_int(remaining)))];
    sink.append(RATELIMIT, sf_item(&policy.name, params));
    if let Some(wait) = retry_after {
        sink.insert(RETRY_AFTER, retry_after_secs(wait).into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    #[test]
    fn writes_structured_fields_with_the_concurrent_requests_unit() {
        let policy = Policy::new("concurrency", 5);
        let mut h = HeaderMap::new();
        write(&mut h, &policy, 3, None);
        assert_eq!(
            h["ratelimit-policy"],
            r#""concurrency";q=5;qu="concurrent-requests""#
        );
        assert_eq!(h["ratelimit"], r#""concurrency";r=2"#);
        assert!(h.get("retry-after").is_none());

        let mut h = HeaderMap::new();
        write(&mut h, &policy, 7, Some(Duration::from_millis(1500)));
        assert_eq!(h["ratelimit"], r#""concurrency";r=0"#);
        assert_eq!(h["retry-after"], "2");
        for name in ["ratelimit-policy", "ratelimit"] {
            let v = h[name].to_str().unwrap();
            let list = sfv::Parser::new(v).parse::<sfv::List>().unwrap();
            assert_eq!(list.len(), 1, "{v}");
        }
    }
}
