//! Writing `Retry-After` and the IETF `RateLimit` / `RateLimit-Policy` headers.
//!
//! Values follow the structured-field form of the IETF httpapi draft
//! "RateLimit header fields for HTTP" (draft-ietf-httpapi-ratelimit-headers-11):
//!
//! ```text
//! RateLimit-Policy: "default";q=100;w=60
//! RateLimit: "default";r=42;t=17
//! Retry-After: 17                      (denied responses only)
//! ```
//!
//! * `RateLimit-Policy` lists every limit of the limiter: `q` is its limit
//!   and `w` its window in seconds, rounded up (a 500 ms window says `w=1`).
//!   A GCRA limit whose burst is above its limit says its burst and the
//!   time the whole burst takes to come back, the same rate:
//!   `Quota::per_second(10).gcra(20)` is `q=20;w=2`, so that `r`, which
//!   counts what is left of the burst, is never above `q`.
//! * `RateLimit` reports the binding limit (see [`Decision`]): `r` is what
//!   remains after this request and `t` the seconds, rounded up, until the
//!   request could be admitted (when denied: the same as `Retry-After`) or
//!   until the quota is fully available (when allowed; for a fixed window,
//!   when it resets).
//! * `Retry-After` is in whole seconds, rounded up from the longest wait
//!   among the limits that denied, and never less than 1: a 300 ms wait says
//!   `1`, never `0`.
//!
//! * With [`RateLimitLayer::partition_key`](crate::RateLimitLayer::partition_key),
//!   `RateLimit` also carries the draft's `pk` partition key, a byte
//!   sequence: `"default";r=42;t=17;pk=:3q2+7w5EZ1k=:`. It is a keyed hash
//!   (SipHash-1-3, 8 bytes) of the binding limit's client key, so it reveals
//!   nothing about the key yet stays the same for one client. The concurrency
//!   layer does not write it.
//!
//! With [`RateLimitLayer::legacy_headers`](crate::RateLimitLayer::legacy_headers)
//! the layer also writes `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
//! `X-RateLimit-Reset`; the last is `RateLimit`'s `t`, in seconds: until the
//! limit resets, or on a denial until a retry may be admitted (for GCRA and
//! sliding windows sooner than the whole reset), a delta, not an epoch time,
//! because the app server's clock is not the one that counts. They describe
//! one limit, the binding one, as `RateLimit` does.
//!
//! # Nested layers
//!
//! A response can pass through several layers: a global layer outside a
//! per-route one, say. Each adds its `RateLimit-Policy` and `RateLimit`
//! items to the lists already there (an sf-list takes several), so the
//! client sees every layer's limits, the inner layer's first. Give the
//! layers' limits different names
//! ([`LimiterBuilder::name`](crate::LimiterBuilder::name)): two items both
//! named `"default"` cannot be told apart.
//!
//! The legacy headers hold one value each, so they describe the tightest
//! limit of all the layers, chosen by the rule that picks an allowed
//! decision's binding limit: the fewest remaining and, on a tie, the later
//! reset. A layer writes its set (all three headers) only where the
//! response has no tighter one: it keeps a set already there (an inner
//! layer's, or the handler's own) with fewer remaining, or as many and a
//! reset as late or later. A set already there that it cannot read (any of
//! the three missing, repeated, or not a plain non-negative integer, such
//! as a handler's `X-RateLimit-Reset: soon` or an HTTP date) is replaced
//! by the layer's own, whole, as without nesting: never an error. A
//! handler's own set in this form is compared like a layer's, so it should
//! say seconds in `X-RateLimit-Reset`, not an epoch time.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), redis_ratelimit::Error> {
//! use redis_ratelimit::{Limiter, Quota};
//!
//! let limiter = Limiter::builder(Quota::per_minute(10)).name("api").build().unwrap();
//! let decision = limiter.check("client-1", 3).await?;
//! let mut headers = http::HeaderMap::new();
//! decision.write_headers(&mut headers);
//! assert_eq!(headers["ratelimit-policy"], r#""api";q=10;w=60"#);
//! assert!(headers["ratelimit"].to_str().unwrap().starts_with(r#""api";r=7;t="#));
//! # Ok(()) }
//! ```

use std::{
    cell::RefCell,
    sync::{Arc, Weak},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, header::RETRY_AFTER};
use sfv::{KeyRef, ListSerializer, RefBareItem, StringRef};

use crate::{Algorithm, Decision, Quota, decision::tightness, metrics};

mod partition;

pub(crate) use self::partition::PartitionKeys;

/// `RateLimit` (draft IETF structured field).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `RateLimit-Policy` (draft IETF structured field).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `X-RateLimit-Limit` (legacy, optional).
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining` (legacy, optional).
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset` (legacy, optional): seconds until reset.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The largest integer a structured field may carry.
const SF_INT_MAX: u64 = 999_999_999_999_999;

/// Whole seconds, rounded up (a nanosecond past a second is two).
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    let part = u64::from(d.subsec_nanos() > 0);
    d.as_secs().saturating_add(part).min(SF_INT_MAX)
}

/// A limit's `q` and `w` in `RateLimit-Policy`: its limit and its window in
/// seconds, rounded up, at least 1. A GCRA limit whose burst is above its
/// limit says its burst and how long the whole burst takes to come back
/// (`burst × window / limit`, rounded up): the same rate, or a little less
/// where seconds round it. So `r` (which counts the burst) is never above
/// `q`, for every algorithm, and `t` (until the limit is whole again) never
/// above `w` for a fixed window or GCRA; a sliding window's `t` can reach
/// `2 × w`, until its previous window no longer weighs on it.
pub(crate) fn policy_of(quota: &Quota) -> (u64, u64) {
    match quota.algorithm() {
        Algorithm::Gcra { burst } if burst > quota.limit() => {
            let refill_ms = (u128::from(quota.window_ms()) * u128::from(burst))
                .div_ceil(u128::from(quota.limit()));
            let w = refill_ms.div_ceil(1000).clamp(1, SF_INT_MAX as u128) as u64;
            (burst, w)
        }
        _ => (quota.limit(), ceil_secs(quota.window()).max(1)),
    }
}

/// The `Retry-After` seconds for a wait: rounded up, at least 1.
pub(crate) fn retry_after_secs(wait: Duration) -> u64 {
    ceil_secs(wait).max(1)
}

pub(crate) fn sf_int(n: u64) -> sfv::Integer {
    sfv::Integer::constant(n.min(SF_INT_MAX) as i64)
}

fn key(k: &'static str) -> &'static KeyRef {
    KeyRef::constant(k)
}

/// Serialises `"<name>";k=v;...` items as one sf-list.
pub(crate) fn sf_list<'a, 'b, P>(items: impl IntoIterator<Item = (&'a str, P)>) -> HeaderValue
where
    P: IntoIterator<Item = (&'static str, RefBareItem<'b>)>,
{
    let mut ser = ListSerializer::new();
    for (name, params) in items {
        // Policy names are validated at build time to a token-like alphabet,
        // so they are always valid sf-strings; fall back to a fixed name.
        let name = StringRef::from_str(name).unwrap_or(StringRef::constant("default"));
        let mut item = ser.bare_item(name);
        for (k, v) in params {
            item = item.parameter(key(k), v);
        }
    }
    let text = ser.finish().unwrap_or_default();
    HeaderValue::try_from(text).unwrap_or(HeaderValue::from_static(""))
}

/// Bytes whose `Bytes::from_owner` allocation (the bytes' count, then
/// this) is aligned as [`Policies`], so no other value shares its lines.
#[repr(align(128))]
struct Aligned(Box<[u8]>);

impl AsRef<[u8]> for Aligned {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// A one-item sf-list: the string `name` with `params`, e.g.
/// `"concurrency";q=5;qu="concurrent-requests"`.
pub(crate) fn sf_item<'b>(
    name: &str,
    params: impl IntoIterator<Item = (&'static str, RefBareItem<'b>)>,
) -> HeaderValue {
    sf_list([(name, params)])
}

/// An sf-list of items with integer parameters.
fn list<'a>(items: impl IntoIterator<Item = (&'a str, [(&'static str, u64); 2])>) -> HeaderValue {
    let int = |(k, v): (&'static str, u64)| (k, RefBareItem::Integer(sf_int(v)));
    sf_list(
        items
            .into_iter()
            .map(|(name, params)| (name, params.map(int))),
    )
}

/// A limiter's named quotas and their `RateLimit-Policy` value, built once.
///
/// Aligned to keep a copy per thread ([`PerThread`](crate::per_thread)):
/// a decision holds them, and each response clones `header`.
#[derive(Debug, PartialEq, Eq)]
#[repr(align(128))]
pub(crate) struct Policies {
    limits: Box<[(Box<str>, Quota)]>,
    /// Per limit: whether it is a shadow (dry-run) limit.
    shadow: Box<[bool]>,
    /// `"<name>";q=<limit>;w=<window secs>, ...`: every limit.
    header: HeaderValue,
    /// Per limit: `"<name>";r=`, the start of its `RateLimit` value, as the
    /// sf serialiser writes it (built once; numbers are appended per request).
    ratelimit_prefix: Box<[Box<str>]>,
    /// Per limit: its metric keys.
    metric_keys: Box<[metrics::Keys]>,
}

impl Policies {
    pub(crate) fn new(limits: &[(String, Quota)]) -> Self {
        let items = limits.iter().map(|(name, q)| {
            let (q, w) = policy_of(q);
            (name.as_str(), [("q", q), ("w", w)])
        });
        let ratelimit_prefix = limits.iter().map(|(name, _)| {
            let item = list([(name.as_str(), [("r", 0), ("t", 0)])]);
            let text = item.to_str().unwrap_or("\"default\";r=0;t=0");
            text.strip_suffix("0;t=0")
                .unwrap_or("\"default\";r=")
                .into()
        });
        Self {
            header: list(items),
            ratelimit_prefix: ratelimit_prefix.collect(),
            limits: limits
                .iter()
                .map(|(n, q)| (n.as_str().into(), *q))
                .collect(),
            shadow: vec![false; limits.len()].into(),
            metric_keys: limits.iter().map(|(n, _)| metrics::Keys::new(n)).collect(),
        }
    }

    /// An equal copy for another thread (see [`PerThread`](crate::per_thread)):
    /// its `RateLimit-Policy` value gets bytes of its own, whose count a
    /// response's clone writes, on a cache line that no other copy shares.
    pub(crate) fn thread_copy(&self) -> Self {
        let bytes = Bytes::from_owner(Aligned(self.header.as_bytes().into()));
        Self {
            limits: self.limits.clone(),
            shadow: self.shadow.clone(),
            header: HeaderValue::from_maybe_shared(bytes).unwrap_or_else(|_| self.header.clone()),
            ratelimit_prefix: self.ratelimit_prefix.clone(),
            metric_keys: self.metric_keys.clone(),
        }
    }

    /// Marks the limits whose flag is set as shadow (dry-run) limits.
    pub(crate) fn with_shadow(self, shadow: Vec<bool>) -> Self {
        Self {
            shadow: shadow.into(),
            ..self
        }
    }

    pub(crate) fn ratelimit_prefix(&self, i: usize) -> &str {
        &self.ratelimit_prefix[i]
    }

    pub(crate) fn is_shadow(&self, i: usize) -> bool {
        self.shadow[i]
    }

    pub(crate) fn name(&self, i: usize) -> &str {
        &self.limits[i].0
    }

    pub(crate) fn quota(&self, i: usize) -> Quota {
        self.limits[i].1
    }

    /// Limit `i`'s metric keys.
    pub(crate) fn metric_keys(&self, i: usize) -> &metrics::Keys {
        &self.metric_keys[i]
    }

    /// Every limit's metric keys.
    pub(crate) fn all_metric_keys(&self) -> impl Iterator<Item = &metrics::Keys> {
        self.metric_keys.iter()
    }
}

/// Seconds for `t`: when denied, until the request could be admitted (as
/// `Retry-After` says, so at least 1, even for a store that said 0 ms);
/// when allowed, until the quota is fully available.
fn t_secs(d: &Decision) -> u64 {
    match d.retry_after() {
        Some(wait) => retry_after_secs(wait),
        None => ceil_secs(d.reset_after()),
    }
}

/// `RateLimit` for a decision: the binding limit,
/// `"<name>";r=<remaining>;t=<secs>`.
pub(crate) fn ratelimit_value(d: &Decision) -> HeaderValue {
    if let Some(pk) = d.partition_key() {
        // Opt-in: `"<name>";r=<remaining>;t=<secs>;pk=:<8 bytes, base64>:`.
        let pk = pk.to_be_bytes();
        let params = [
            ("r", RefBareItem::Integer(sf_int(d.remaining()))),
            ("t", RefBareItem::Integer(sf_int(t_secs(d)))),
            ("pk", RefBareItem::ByteSequence(&pk)),
        ];
        return sf_item(d.policy(), params);
    }
    // The hot path: the prefix is built once by the sf serialiser; this only
    // appends two integers (sf integers: at most 15 digits), written once
    // into the value's own buffer, which the value then keeps (no copy).
    let prefix = d.policies().ratelimit_prefix(d.binding()).as_bytes();
    let (mut r, mut t) = (itoa::Buffer::new(), itoa::Buffer::new());
    let parts = [
        prefix,
        r.format(d.remaining().min(SF_INT_MAX)).as_bytes(),
        b";t=",
        t.format(t_secs(d)).as_bytes(),
    ];
    let mut value = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for part in parts {
        value.extend_from_slice(part);
    }
    HeaderValue::from_maybe_shared(Bytes::from(value)).unwrap_or(HeaderValue::from_static(""))
}

/// The `RateLimit` and `Retry-After` values a denial writes, the last ones
/// this thread built, with what they were built from.
struct LastDenial {
    /// The decision's policies: held weakly, so they are never freed while
    /// the memo compares their address (and never kept alive by it).
    policies: Weak<Policies>,
    /// The binding limit, what remained of it, `t` and `Retry-After`.
    of: (usize, u64, u64, u64),
    values: (HeaderValue, HeaderValue),
}

thread_local! {
    static LAST_DENIAL: RefCell<Option<LastDenial>> = const { RefCell::new(None) };
}

/// `RateLimit` and `Retry-After` (`retry` seconds) for a denial. A client
/// hammering a spent key gets the same values for a second at a time, so
/// each thread keeps the last ones it built and clones them while nothing
/// they are built from changes: a count to raise instead of two
/// allocations and three numbers to format.
fn denial_values(d: &Decision, retry: u64) -> (HeaderValue, HeaderValue) {
    if d.partition_key().is_some() {
        return (ratelimit_value(d), retry.into());
    }
    let of = (d.binding(), d.remaining(), t_secs(d), retry);
    let policies = d.policies_arc();
    LAST_DENIAL.with_borrow_mut(|last| {
        if let Some(last) = last
            && last.of == of
            && std::ptr::eq(last.policies.as_ptr(), Arc::as_ptr(policies))
        {
            return last.values.clone();
        }
        let values = (ratelimit_value(d), HeaderValue::from(retry));
        *last = Some(LastDenial {
            policies: Arc::downgrade(policies),
            of,
            values: values.clone(),
        });
        values
    })
}

/// Where [`write()`] puts headers: an `http` 1 header map or response, or an
/// actix-web response (which uses `http` 0.2 types, converted through bytes).
pub(crate) trait HeaderSink {
    /// Adds a value, keeping those already there (for sf-lists).
    fn append(&mut self, name: HeaderName, value: HeaderValue);
    /// Sets the only value.
    fn insert(&mut self, name: HeaderName, value: HeaderValue);
    /// The value of `name` when it has exactly one.
    fn only(&self, name: &HeaderName) -> Option<&[u8]>;
}

/// The one value among `values`, if there is exactly one.
pub(crate) fn only_one<'a>(mut values: impl Iterator<Item = &'a [u8]>) -> Option<&'a [u8]> {
    let first = values.next()?;
    values.next().is_none().then_some(first)
}

impl HeaderSink for HeaderMap {
    fn append(&mut self, name: HeaderName, value: HeaderValue) {
        HeaderMap::append(self, name, value);
    }

    fn insert(&mut self, name: HeaderName, value: HeaderValue) {
        HeaderMap::insert(self, name, value);
    }

    fn only(&self, name: &HeaderName) -> Option<&[u8]> {
        only_one(self.get_all(name).iter().map(HeaderValue::as_bytes))
    }
}

impl<B> HeaderSink for http::Response<B> {
    fn append(&mut self, name: HeaderName, value: HeaderValue) {
        self.headers_mut().append(name, value);
    }

    fn insert(&mut self, name: HeaderName, value: HeaderValue) {
        self.headers_mut().insert(name, value);
    }

    fn only(&self, name: &HeaderName) -> Option<&[u8]> {
        self.headers().only(name)
    }
}

/// Writes the IETF headers, and `Retry-After` when denied.
pub(crate) fn write(d: &Decision, headers: &mut impl HeaderSink, legacy: bool) {
    headers.append(RATELIMIT_POLICY, d.policies().header.clone());
    match d.retry_after() {
        None => headers.append(RATELIMIT, ratelimit_value(d)),
        Some(wait) => {
            let (ratelimit, retry_after) = denial_values(d, retry_after_secs(wait));
            headers.append(RATELIMIT, ratelimit);
            headers.insert(RETRY_AFTER, retry_after);
        }
    }
    if legacy {
        Legacy::of(d).write(headers);
    }
}

/// The legacy `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
/// `X-RateLimit-Reset` values: one limit's, as a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Legacy {
    limit: u64,
    remaining: u64,
    /// Seconds, as `RateLimit`'s `t`.
    reset: u64,
}

impl Legacy {
    /// A decision's: its binding limit's.
    fn of(d: &Decision) -> Legacy {
        Legacy {
            limit: policy_of(&d.quota()).0,
            remaining: d.remaining(),
            reset: t_secs(d),
        }
    }

    /// The values already on a response (an inner layer's, or the
    /// handler's), when all three are there, each one value of decimal
    /// digits that fits a `u64`; else `None`.
    fn read(headers: &impl HeaderSink) -> Option<Legacy> {
        let int = |name: &HeaderName| {
            let v = headers.only(name)?;
            if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
                return None;
            }
            std::str::from_utf8(v).ok()?.parse::<u64>().ok()
        };
        Some(Legacy {
            limit: int(&X_RATELIMIT_LIMIT)?,
            remaining: int(&X_RATELIMIT_REMAINING)?,
            reset: int(&X_RATELIMIT_RESET)?,
        })
    }

    /// Writes the three values, unless the response already has a set
    /// that holds the client at least as tightly ([`tightness`]: fewer
    /// remaining or, as many, a reset as late or later), which it keeps. A
    /// set that cannot be read ([`read`](Self::read)) is replaced whole.
    fn write(self, headers: &mut impl HeaderSink) {
        let tighter = |l: &Legacy| tightness(l.remaining, l.reset);
        if Legacy::read(headers).is_some_and(|there| tighter(&there) <= tighter(&self)) {
            return;
        }
        headers.insert(X_RATELIMIT_LIMIT, self.limit.into());
        headers.insert(X_RATELIMIT_REMAINING, self.remaining.into());
        headers.insert(X_RATELIMIT_RESET, self.reset.into());
    }
}

impl Decision {
    /// Writes `RateLimit-Policy`, `RateLimit` and, when denied, `Retry-After`
    /// into `headers`, as the tower layer does. See the [module
    /// docs](crate::headers) for the format.
    pub fn write_headers(&self, headers: &mut HeaderMap) {
        write(self, headers, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LimitState;
    use std::sync::Arc;

    fn decision(allowed: bool, quota: &str, remaining: u64, reset_ms: u64) -> Decision {
        let quota: Quota = quota.parse().unwrap();
        let policies = Arc::new(Policies::new(&[("default".into(), quota)]));
        let state = LimitState {
            allowed,
            remaining,
            reset_ms,
            retry_ms: if allowed { 0 } else { reset_ms },
        };
        Decision::new(vec![state], policies)
    }

    /// Fails rounding milliseconds: a wait of 2 s and 1 µs (a concurrency
    /// limiter's `retry_after` can be any duration) said 2.
    #[test]
    fn a_wait_a_fraction_of_a_millisecond_past_a_second_rounds_up() {
        assert_eq!(retry_after_secs(Duration::from_nanos(2_000_000_001)), 3);
        assert_eq!(retry_after_secs(Duration::from_micros(2_000_001)), 3);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }

    #[test]
    fn a_denial_with_no_wait_left_says_one_second_in_both_headers() {
        // A custom store may answer a denial with 0 ms left.
        let mut h = HeaderMap::new();
        write(&decision(false, "5/60s", 0, 0), &mut h, false);
        assert_eq!(h["retry-after"], "1");
        assert_eq!(h["ratelimit"], r#""default";r=0;t=1"#);
    }

    #[test]
    fn a_denials_values_are_its_own_whatever_was_denied_before() {
        let policies =
            |name: &str| Arc::new(Policies::new(&[(name.into(), "5/60s".parse().unwrap())]));
        let denied = |policies: &Arc<Policies>, remaining, reset_ms| {
            let state = LimitState {
                allowed: false,
                remaining,
                reset_ms,
                retry_ms: reset_ms,
            };
            Decision::new(vec![state], policies.clone())
        };
        let written = |d: &Decision| {
            let mut h = HeaderMap::new();
            write(d, &mut h, false);
            (h["ratelimit"].clone(), h["retry-after"].clone())
        };
        let (default, other) = (policies("default"), policies("other"));
        let first = written(&denied(&default, 0, 5_000));
        assert_eq!(first.0, r#""default";r=0;t=5"#);
        assert_eq!(first.1, "5");
        // The same denial again: the values built the first time.
        let again = written(&denied(&default, 0, 5_000));
        assert_eq!(again, first);
        assert_eq!(again.0.as_bytes().as_ptr(), first.0.as_bytes().as_ptr());
        // Anything they are built from changes: values of its own.
        let cases = [
            (&default, 0, 6_000, r#""default";r=0;t=6"#, "6"),
            (&default, 0, 5_000, r#""default";r=0;t=5"#, "5"),
            (&other, 0, 5_000, r#""other";r=0;t=5"#, "5"),
            (&other, 2, 5_000, r#""other";r=2;t=5"#, "5"),
            (&other, 2, 4_001, r#""other";r=2;t=5"#, "5"),
            (&other, 2, 59_000, r#""other";r=2;t=59"#, "59"),
            (&default, 2, 59_000, r#""default";r=2;t=59"#, "59"),
        ];
        for (p, remaining, reset_ms, ratelimit, retry_after) in cases {
            let want = (ratelimit.parse().unwrap(), retry_after.parse().unwrap());
            assert_eq!(written(&denied(p, remaining, reset_ms)), want);
        }
        // Policies gone, and new ones of another name: never the old values.
        drop(default);
        let renamed = policies("renamed");
        let (ratelimit, _) = written(&denied(&renamed, 2, 59_000));
        assert_eq!(ratelimit, r#""renamed";r=2;t=59"#);
    }

    #[test]
    fn a_thread_copy_is_equal_with_bytes_of_its_own() {
        let limits = [("second".to_owned(), "5/1s".parse().unwrap())];
        let p = Policies::new(&limits).with_shadow(vec![true]);
        let copy = p.thread_copy();
        assert_eq!(copy, p);
        assert_ne!(
            copy.header.as_bytes().as_ptr(),
            p.header.as_bytes().as_ptr()
        );
        let clone = copy.header.clone();
        assert_eq!(clone.as_bytes().as_ptr(), copy.header.as_bytes().as_ptr());
    }

    /// The legacy set on `h`, as (limit, remaining, reset) strings.
    fn legacy(h: &HeaderMap) -> [&str; 3] {
        [X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET]
            .map(|n| h.get(&n).map_or("-", |v| v.to_str().unwrap()))
    }

    /// Nested layers: each writes after the one inside it, and the set
    /// left is the tightest: the fewest remaining, then the later reset.
    #[test]
    fn nested_layers_leave_the_tightest_legacy_set() {
        // (quota, remaining, reset ms) written first (inner), then second.
        let cases = [
            // The inner limit is tighter: the outer keeps it.
            (
                ("10/1m", 2, 30_000),
                ("100/1m", 50, 50_000),
                ["10", "2", "30"],
            ),
            // The outer is: its set, whole.
            (
                ("10/1m", 5, 30_000),
                ("100/1m", 1, 10_000),
                ["100", "1", "10"],
            ),
            // As many remaining: the later reset, whichever wrote it.
            (
                ("10/1m", 3, 20_000),
                ("100/1m", 3, 40_000),
                ["100", "3", "40"],
            ),
            (
                ("10/1m", 3, 40_000),
                ("100/1m", 3, 20_000),
                ["10", "3", "40"],
            ),
            // A full tie keeps the first.
            (
                ("10/1m", 3, 40_000),
                ("100/1m", 3, 40_000),
                ["10", "3", "40"],
            ),
        ];
        for (inner, outer, want) in cases {
            let mut h = HeaderMap::new();
            write(&decision(true, inner.0, inner.1, inner.2), &mut h, true);
            write(&decision(true, outer.0, outer.1, outer.2), &mut h, true);
            assert_eq!(legacy(&h), want, "{inner:?} then {outer:?}");
            assert_eq!(h.get_all(X_RATELIMIT_REMAINING).iter().count(), 1);
            // Both layers' IETF items, the inner's first.
            assert_eq!(h.get_all(RATELIMIT).iter().count(), 2, "{h:?}");
            assert_eq!(h.get_all(RATELIMIT_POLICY).iter().count(), 2, "{h:?}");
        }
        // A layer without legacy headers leaves the set alone.
        let mut h = HeaderMap::new();
        write(&decision(true, "10/1m", 2, 30_000), &mut h, true);
        write(&decision(true, "100/1m", 0, 50_000), &mut h, false);
        assert_eq!(legacy(&h), ["10", "2", "30"]);
    }

    /// A set already there that cannot be read (a handler's own, say) is
    /// replaced whole, never a panic; a readable one is compared.
    #[test]
    fn an_unreadable_legacy_set_is_replaced_whole() {
        let ours = decision(true, "100/1m", 50, 50_000);
        let unreadable: [&[(&str, &str)]; 9] = [
            &[("x-ratelimit-remaining", "soon")],
            &[
                ("x-ratelimit-limit", "10"),
                ("x-ratelimit-remaining", "-1"),
                ("x-ratelimit-reset", "5"),
            ],
            &[
                ("x-ratelimit-limit", "10"),
                ("x-ratelimit-remaining", "1"),
                ("x-ratelimit-reset", "Wed, 21 Oct 2026 07:28:00 GMT"),
            ],
            &[
                ("x-ratelimit-limit", "10"),
                ("x-ratelimit-remaining", " 1"),
                ("x-ratelimit-reset", "5"),
            ],
            &[
                ("x-ratelimit-limit", "10"),
                ("x-ratelimit-remaining", "1"),
                ("x-ratelimit-reset", "99999999999999999999999"),
            ],
            &[
                ("x-ratelimit-limit", "10"),
                ("x-ratelimit-remaining", ""),
                ("x-ratelimit-reset", "5"),
            ],
            // Missing one.
            &[("x-ratelimit-limit", "10"), ("x-ratelimit-remaining", "1")],
            // Repeated.
            &[
                ("x-ratelimit-limit", "10"),
                ("x-ratelimit-remaining", "1"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "5"),
            ],
            &[
                ("x-ratelimit-limit", "10"),
                ("x-ratelimit-remaining", "1"),
                ("x-ratelimit-reset", "+5"),
            ],
        ];
        for there in unreadable {
            let mut h = HeaderMap::new();
            for (name, value) in there {
                h.append(*name, HeaderValue::from_str(value).unwrap());
            }
            write(&ours, &mut h, true);
            assert_eq!(legacy(&h), ["100", "50", "50"], "{there:?}");
            assert_eq!(h.get_all(X_RATELIMIT_REMAINING).iter().count(), 1);
        }
        let mut h = HeaderMap::new();
        for (name, value) in [
            ("x-ratelimit-limit", "10"),
            ("x-ratelimit-remaining", "1"),
            ("x-ratelimit-reset", "5"),
        ] {
            h.insert(name, HeaderValue::from_static(value));
        }
        write(&ours, &mut h, true);
        assert_eq!(
            legacy(&h),
            ["10", "1", "5"],
            "a handler's tighter set stays"
        );
    }

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        assert_eq!(retry_after_secs(Duration::from_millis(300)), 1);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(59)), 59);
    }

    #[test]
    fn writes_ietf_structured_fields() {
        let mut h = HeaderMap::new();
        write(&decision(false, "5/500ms", 0, 300), &mut h, false);
        assert_eq!(h["ratelimit-policy"], r#""default";q=5;w=1"#);
        assert_eq!(h["ratelimit"], r#""default";r=0;t=1"#);
        assert_eq!(h["retry-after"], "1");
        assert!(h.get("x-ratelimit-limit").is_none());

        let mut h = HeaderMap::new();
        write(&decision(true, "100/1m", 42, 41_200), &mut h, true);
        assert_eq!(h["ratelimit-policy"], r#""default";q=100;w=60"#);
        assert_eq!(h["ratelimit"], r#""default";r=42;t=42"#);
        assert!(h.get("retry-after").is_none());
        assert_eq!(h["x-ratelimit-limit"], "100");
        assert_eq!(h["x-ratelimit-remaining"], "42");
        assert_eq!(h["x-ratelimit-reset"], "42");
    }

    #[test]
    fn the_fast_ratelimit_value_is_what_the_serialiser_writes() {
        for name in ["default", "10/1s", "per-key", "a:b@c+d=e~f.g_h"] {
            let q: Quota = "5/1m".parse().unwrap();
            let policies = Arc::new(Policies::new(&[(name.into(), q)]));
            for (allowed, remaining, ms) in [(true, 4, 59_001), (false, 0, 300), (true, 0, 0)] {
                let state = LimitState {
                    allowed,
                    remaining,
                    reset_ms: ms,
                    retry_ms: if allowed { 0 } else { ms },
                };
                let d = Decision::new(vec![state], policies.clone());
                let slow = list([(name, [("r", remaining), ("t", t_secs(&d))])]);
                assert_eq!(ratelimit_value(&d), slow);
            }
        }
    }

    #[test]
    fn pk_is_an_opt_in_byte_sequence_of_the_binding_limits_key() {
        let quota: Quota = "5/1m".parse().unwrap();
        let limits = [("second".to_owned(), quota), ("day".to_owned(), quota)];
        let policies = Arc::new(Policies::new(&limits));
        let state = |remaining| LimitState {
            allowed: true,
            remaining,
            reset_ms: 60_000,
            retry_ms: 0,
        };
        let d = Decision::new(vec![state(4), state(2)], policies);
        assert_eq!(ratelimit_value(&d), r#""day";r=2;t=60"#, "off by default");
        let keys = PartitionKeys::from_secret(b"s");
        let pks = smallvec::smallvec![keys.hash(b"ip"), keys.hash(b"user")];
        let value = ratelimit_value(&d.clone().with_partition(pks));
        let list = sfv::Parser::new(value.to_str().unwrap())
            .parse::<sfv::List>()
            .unwrap();
        let sfv::ListEntry::Item(item) = &list[0] else {
            panic!("{value:?}")
        };
        assert_eq!(
            item.bare_item,
            sfv::BareItem::String("day".to_owned().try_into().unwrap())
        );
        let pk = item.params.get("pk").unwrap().as_byte_sequence().unwrap();
        assert_eq!(
            pk,
            keys.hash(b"user").to_be_bytes(),
            "the binding limit's key"
        );
        assert!(
            value
                .to_str()
                .unwrap()
                .starts_with(r#""day";r=2;t=60;pk=:"#),
            "{value:?}"
        );
        // One key for every limit.
        let one = ratelimit_value(&d.with_partition(smallvec::smallvec![keys.hash(b"ip")]));
        assert!(one.to_str().unwrap().contains(";pk=:"), "{one:?}");
    }

    /// `r` counts a GCRA limit's burst: `q` says the burst where it is
    /// above the limit, so that `r` never exceeds it, nor `t` `w`.
    #[tokio::test]
    async fn a_gcra_limits_remaining_never_exceeds_its_advertised_quota() {
        let cases = [
            // quota, burst, RateLimit-Policy
            ("10/1s", 20, r#""default";q=20;w=2"#),
            ("5/1s", 7, r#""default";q=7;w=2"#), // 1.4 s, rounded up
            ("100/1m", 150, r#""default";q=150;w=90"#),
            ("10/1s", 10, r#""default";q=10;w=1"#),
            ("10/1s", 1, r#""default";q=10;w=1"#),
        ];
        for (quota, burst, policy) in cases {
            let quota = quota.parse::<Quota>().unwrap().gcra(burst).unwrap();
            let limiter = crate::Limiter::builder(quota).build().unwrap();
            let d = limiter.check("k", 1).await.unwrap();
            let mut h = HeaderMap::new();
            write(&d, &mut h, true);
            assert_eq!(h["ratelimit-policy"], policy, "{quota:?}");
            let (q, w) = policy_of(&quota);
            assert_eq!(d.remaining(), burst - 1, "{quota:?}");
            assert!(d.remaining() <= q, "{quota:?}: {h:?}");
            assert!(t_secs(&d) <= w, "{quota:?}: {h:?}");
            assert_eq!(h["x-ratelimit-limit"], q.to_string().as_str());
        }
    }

    #[test]
    fn every_policy_is_listed_once() {
        let limits = [("second", "10/1s"), ("day", "1000/1d")];
        let limits = limits.map(|(n, q)| (n.to_owned(), q.parse().unwrap()));
        let p = Policies::new(&limits);
        assert_eq!(p.header, r#""second";q=10;w=1, "day";q=1000;w=86400"#);
    }

    #[test]
    fn values_parse_as_structured_field_lists() {
        let d = decision(true, "1000/1d", 1, 86_400_000);
        for v in [d.policies().header.clone(), ratelimit_value(&d)] {
            let list = sfv::Parser::new(v.to_str().unwrap())
                .parse::<sfv::List>()
                .unwrap();
            assert_eq!(list.len(), 1, "{v:?}");
        }
        let q = Quota::per_day(crate::quota::MAX_LIMIT);
        let state = LimitState {
            allowed: true,
            remaining: 0,
            reset_ms: u64::MAX,
            retry_ms: 0,
        };
        let huge = Decision::new(vec![state], Arc::new(Policies::new(&[("x".into(), q)])));
        let value = ratelimit_value(&huge);
        assert!(value.to_str().unwrap().contains("t=999999999999999"));
    }
}
