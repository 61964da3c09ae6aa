//! The default answers' bodies: one short line of text, or RFC 9457 problem
//! details; shared by the tower and actix adapters.

use std::{
    any::{Any, TypeId},
    fmt::Write,
};

use bytes::Bytes;
use http::StatusCode;

use super::{Format, Rejection};
use crate::{concurrency::LeaseBody, headers::retry_after_secs, key::KeyError};

/// `Content-Type` of the text answers.
pub(crate) const TEXT: &str = "text/plain; charset=utf-8";
/// `Content-Type` of the problem details answers.
pub(crate) const PROBLEM_JSON: &str = "application/problem+json";
/// `Content-Type` of the same answers to a client that refuses
/// `application/problem+json`.
pub(crate) const JSON: &str = "application/json";

/// The problem type of a denial by quota, registered by the IETF draft
/// "RateLimit header fields for HTTP" (section 5.1), and its title there.
pub(crate) const QUOTA_EXCEEDED: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";
const QUOTA_EXCEEDED_TITLE: &str = "Quota Exceeded";

/// A default answer's `Content-Type` and body.
#[derive(Debug)]
pub(crate) struct Body {
    pub(crate) content_type: &'static str,
    pub(crate) text: String,
}

/// The body of the default answer to `rejection` in `format`.
pub(crate) fn body(rejection: &Rejection, format: Format) -> Body {
    let detail = detail(rejection);
    match format {
        Format::ProblemJson => Body {
            content_type: PROBLEM_JSON,
            text: problem_json(rejection, &detail),
        },
        Format::Json => Body {
            content_type: JSON,
            text: problem_json(rejection, &detail),
        },
        // Neither adapter asks for this: both answer a gRPC call with
        // GrpcResponse's trailers-only answer, which has no body. Were a
        // body wanted, it would be the text.
        Format::Text | Format::Grpc => Body {
            content_type: TEXT,
            text: detail,
        },
    }
}

/// One short line that says what happened and what to do, with nothing
/// internal: never a store error's text, a key's value or a custom
/// extractor's reason (those are for the logs).
pub(crate) fn detail(rejection: &Rejection) -> String {
    match rejection {
        // The answers a client hammering its limit gets, so built without
        // `format!`, whose machinery cost a 429 about 700 instructions, or
        // `concat`, whose generic joining cost it about 150.
        Rejection::Denied(d) => retry_in(
            "rate limit exceeded; retry in ",
            d.retry_after().unwrap_or_default(),
        ),
        Rejection::Busy(busy) => retry_in(
            "too many concurrent requests; retry in ",
            busy.retry_after(),
        ),
        Rejection::CostExceedsLimit { cost, limit } => {
            format!("request cost {cost} exceeds the rate limit of {limit}")
        }
        Rejection::KeyUnavailable(e) => match e {
            KeyError::MissingHeader(name) => format!("missing rate limit key: header {name}"),
            KeyError::HeaderTooLong(name) => format!("rate limit key too long: header {name}"),
            KeyError::NoPeerAddr => "rate limit key unavailable".to_owned(),
            KeyError::Rejected { .. } => "request refused by the rate limiter".to_owned(),
        },
        Rejection::StoreUnavailable(_) => "rate limit store unavailable".to_owned(),
    }
}

/// `what`, then `wait` in whole seconds (as `Retry-After` gives it), then
/// ` s`.
fn retry_in(what: &str, wait: std::time::Duration) -> String {
    let mut digits = itoa::Buffer::new();
    let secs = digits.format(retry_after_secs(wait));
    let mut out = String::with_capacity(what.len() + secs.len() + 2);
    out.push_str(what);
    out.push_str(secs);
    out.push_str(" s");
    out
}

/// The names of the enforced limits that denied: the draft's
/// `violated-policies`. `None` for a rejection that is not a denial by quota.
fn violated_policies(rejection: &Rejection) -> Option<Vec<&str>> {
    match rejection {
        Rejection::Denied(d) => Some(
            d.limits()
                .filter(|l| !l.is_allowed() && !l.is_shadow())
                .map(|l| l.name())
                .collect(),
        ),
        Rejection::Busy(busy) => Some(vec![busy.policy()]),
        _ => None,
    }
}

/// RFC 9457 problem details: `quota-exceeded` with `violated-policies` for a
/// denial by quota, `about:blank` with the status's reason phrase otherwise.
fn problem_json(rejection: &Rejection, detail: &str) -> String {
    let status = rejection.status();
    let policies = violated_policies(rejection);
    let (ty, title) = match policies {
        Some(_) => (QUOTA_EXCEEDED, QUOTA_EXCEEDED_TITLE),
        None => ("about:blank", reason(status)),
    };
    let mut out = String::with_capacity(160);
    out.push_str("{\"type\":");
    push_json_str(&mut out, ty);
    out.push_str(",\"title\":");
    push_json_str(&mut out, title);
    let _ = write!(out, ",\"status\":{}", status.as_u16());
    out.push_str(",\"detail\":");
    push_json_str(&mut out, detail);
    if let Some(names) = policies {
        out.push_str(",\"violated-policies\":[");
        for (i, name) in names.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_json_str(&mut out, name);
        }
        out.push(']');
    }
    out.push('}');
    out
}

/// The status's reason phrase, e.g. "Service Unavailable".
fn reason(status: StatusCode) -> &'static str {
    status.canonical_reason().unwrap_or("Error")
}

/// Appends `s` as a JSON string (RFC 8259): quoted, with `"`, `\` and the
/// control characters escaped.
fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c < ' ' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Puts `text` into `body` if its type is one the default answer knows how to
/// fill: `String`, `Vec<u8>`, `Bytes`, `http_body_util::Full<Bytes>` and
/// (with the `axum` feature) `axum::body::Body`, or one of those in the
/// [`LeaseBody`] of one or two in-flight limits below (the body a layer
/// above them answers with). Returns whether it did; any other body type
/// stays as its `Default` (empty).
pub(crate) fn fill<B: Any>(body: &mut B, text: String) -> bool {
    let body: &mut dyn Any = body;
    match known(body) {
        Some(Known::String(b)) => *b = text,
        Some(Known::Vec(b)) => *b = text.into_bytes(),
        Some(Known::Bytes(b)) => *b = Bytes::from(text),
        Some(Known::Full(b)) => *b = http_body_util::Full::new(Bytes::from(text)),
        #[cfg(feature = "axum")]
        Some(Known::Axum(b)) => *b = axum::body::Body::from(text),
        None => return false,
    }
    true
}

/// A body [`fill`] can write.
enum Known<'a> {
    String(&'a mut String),
    Vec(&'a mut Vec<u8>),
    Bytes(&'a mut Bytes),
    Full(&'a mut http_body_util::Full<Bytes>),
    #[cfg(feature = "axum")]
    Axum(&'a mut axum::body::Body),
}

/// `body` as a [`Known`] one: itself, or the body inside one or two
/// [`LeaseBody`]s. Its type is read once (a call through `dyn Any`), then
/// compared: axum's body first, the common one.
fn known(body: &mut dyn Any) -> Option<Known<'_>> {
    let id = (*body).type_id();
    macro_rules! as_known {
        ($ty:ty, $variant:ident) => {
            if id == TypeId::of::<$ty>() {
                return body.downcast_mut::<$ty>().map(Known::$variant);
            }
            if id == TypeId::of::<LeaseBody<$ty>>() {
                let lease = body.downcast_mut::<LeaseBody<$ty>>()?;
                return Some(Known::$variant(lease.get_mut()));
            }
            if id == TypeId::of::<LeaseBody<LeaseBody<$ty>>>() {
                let lease = body.downcast_mut::<LeaseBody<LeaseBody<$ty>>>()?;
                return Some(Known::$variant(lease.get_mut().get_mut()));
            }
        };
    }
    #[cfg(feature = "axum")]
    as_known!(axum::body::Body, Axum);
    as_known!(String, String);
    as_known!(Vec<u8>, Vec);
    as_known!(Bytes, Bytes);
    as_known!(http_body_util::Full<Bytes>, Full);
    None
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use super::*;
    use crate::{Decision, Error, Quota, headers::Policies, store::LimitState};

    fn state(allowed: bool, retry_ms: u64) -> LimitState {
        LimitState {
            allowed,
            remaining: 0,
            reset_ms: retry_ms,
            retry_ms,
        }
    }

    /// Two limits, "second" and "day"; `states` says which denied.
    fn denied(states: [LimitState; 2], shadow_day: bool) -> Rejection {
        let q: Quota = "5/1s".parse().unwrap();
        let limits = [("second".to_owned(), q), ("day".to_owned(), q)];
        let policies = Policies::new(&limits).with_shadow(vec![false, shadow_day]);
        Rejection::Denied(Decision::new(states.to_vec(), Arc::new(policies)))
    }

    fn missing() -> Rejection {
        Rejection::KeyUnavailable(KeyError::MissingHeader("x-api-key".parse().unwrap()))
    }

    #[test]
    fn text_bodies_are_short_and_say_what_to_do() {
        let r = denied([state(false, 11_200), state(true, 0)], false);
        assert_eq!(detail(&r), "rate limit exceeded; retry in 12 s");
        assert_eq!(
            detail(&missing()),
            "missing rate limit key: header x-api-key"
        );
        let long = KeyError::HeaderTooLong("x-api-key".parse().unwrap());
        let long = Rejection::KeyUnavailable(long);
        assert_eq!(detail(&long), "rate limit key too long: header x-api-key");
        let cost = Rejection::CostExceedsLimit { cost: 9, limit: 5 };
        assert_eq!(detail(&cost), "request cost 9 exceeds the rate limit of 5");
        let b = body(&missing(), Format::Text);
        assert_eq!(b.content_type, "text/plain; charset=utf-8");
        assert_eq!(b.text, detail(&missing()));
    }

    /// The bodies the tables in `src/respond.rs`'s docs and the README's
    /// "Responses" give are the ones sent (but `Busy`'s, built by the
    /// concurrency limiter only).
    #[test]
    fn the_docs_tables_give_the_bodies_sent() {
        let docs = include_str!("../respond.rs");
        let readme = include_str!("../../README.md");
        let readme = &readme[readme.find("### Responses").unwrap()..];
        let readme = &readme[..readme[1..].find("\n#").unwrap_or(readme.len())];
        let header = || "x-api-key".parse().unwrap();
        let rejected = |status: u16| {
            Rejection::KeyUnavailable(KeyError::Rejected {
                status: StatusCode::from_u16(status).unwrap(),
                reason: "3 keys given for 2 limits".into(),
            })
        };
        let denied = denied([state(false, 11_200), state(true, 0)], false);
        let store = Rejection::StoreUnavailable(Error::CircuitOpen);
        // Each case: its row in the module docs, and in the README (by its
        // status's cell), if it has one there.
        let cases = [
            (&denied, "Denied", Some("429")),
            (&missing(), "KeyUnavailable", Some("400")),
            (
                &Rejection::KeyUnavailable(KeyError::HeaderTooLong(header())),
                "KeyUnavailable",
                None,
            ),
            (
                &Rejection::KeyUnavailable(KeyError::NoPeerAddr),
                "KeyUnavailable",
                Some("500"),
            ),
            // A custom extractor's wrong number of keys (`Core::verdict`).
            (&rejected(500), "KeyUnavailable", Some("500")),
            (&rejected(401), "KeyUnavailable", Some("its status")),
            (&store, "StoreUnavailable", Some("503")),
            (
                &Rejection::CostExceedsLimit { cost: 9, limit: 5 },
                "CostExceedsLimit",
                None,
            ),
        ];
        for (rejection, variant, readme_status) in cases {
            let cell = format!("`{}`", detail(rejection));
            let row = format!("//! | [`Rejection::{variant}`]");
            let row = docs.lines().find(|l| l.starts_with(&row)).unwrap();
            assert!(row.contains(&cell), "{cell} not in {row}");
            if let Some(status) = readme_status {
                let (start, end) = (format!("| {status} |"), format!("| {cell} |"));
                assert!(
                    readme
                        .lines()
                        .any(|l| l.starts_with(&start) && l.ends_with(&end)),
                    "no README row {start} .. {end}"
                );
            }
        }
    }

    #[test]
    fn nothing_internal_leaks() {
        let store = Rejection::StoreUnavailable(Error::Timeout(Duration::from_millis(200)));
        let custom = Rejection::KeyUnavailable(KeyError::Rejected {
            status: StatusCode::UNAUTHORIZED,
            reason: "token secret-123 expired".into(),
        });
        for (r, want) in [
            (&store, "rate limit store unavailable"),
            (&custom, "request refused by the rate limiter"),
            (
                &Rejection::KeyUnavailable(KeyError::NoPeerAddr),
                "rate limit key unavailable",
            ),
        ] {
            for format in [Format::Text, Format::ProblemJson] {
                let text = body(r, format).text;
                assert!(text.contains(want), "{text}");
                for secret in ["200", "secret", "Timeout", "timed out", "ConnectInfo"] {
                    assert!(!text.contains(secret), "{secret} in {text}");
                }
            }
        }
    }

    #[test]
    fn a_denial_is_the_drafts_quota_exceeded_problem() {
        // "day" denies with the longer wait, "second" too; both are named.
        let r = denied([state(false, 900), state(false, 30_000)], false);
        let b = body(&r, Format::ProblemJson);
        assert_eq!(b.content_type, "application/problem+json");
        assert_eq!(
            b.text,
            r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Quota Exceeded","status":429,"detail":"rate limit exceeded; retry in 30 s","violated-policies":["second","day"]}"#
        );
        // Only the limit that denied, and never a shadow (dry-run) limit.
        let r = denied([state(false, 900), state(true, 0)], false);
        assert!(
            body(&r, Format::ProblemJson)
                .text
                .ends_with(r#""violated-policies":["second"]}"#)
        );
        let r = denied([state(false, 900), state(false, 5000)], true);
        let text = body(&r, Format::ProblemJson).text;
        assert!(
            text.ends_with(r#""violated-policies":["second"]}"#),
            "{text}"
        );
        assert!(text.contains("retry in 1 s"), "{text}");
    }

    #[test]
    fn other_rejections_are_about_blank_with_the_status_title() {
        let store = Rejection::StoreUnavailable(Error::CircuitOpen);
        assert_eq!(
            body(&store, Format::ProblemJson).text,
            r#"{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"rate limit store unavailable"}"#
        );
        assert_eq!(
            body(&missing(), Format::ProblemJson).text,
            r#"{"type":"about:blank","title":"Bad Request","status":400,"detail":"missing rate limit key: header x-api-key"}"#
        );
        let odd = Rejection::KeyUnavailable(KeyError::Rejected {
            status: StatusCode::from_u16(599).unwrap(),
            reason: String::new(),
        });
        assert!(
            body(&odd, Format::ProblemJson)
                .text
                .contains(r#""title":"Error","status":599"#)
        );
    }

    #[test]
    fn json_strings_are_escaped() {
        let mut out = String::new();
        push_json_str(&mut out, "a\"b\\c\nd\re\tf\u{1}g\u{1f}h\u{7f}é\u{2028}");
        assert_eq!(
            out,
            r#""a\"b\\c\nd\re\tf\u0001g\u001fh"#.to_owned() + "\u{7f}é\u{2028}\""
        );
        let mut out = String::new();
        push_json_str(&mut out, "");
        assert_eq!(out, r#""""#);
    }

    #[test]
    fn known_body_types_are_filled_and_others_left_empty() {
        let mut s = String::new();
        assert!(fill(&mut s, "hi".into()));
        assert_eq!(s, "hi");
        let mut v = Vec::<u8>::new();
        assert!(fill(&mut v, "hi".into()));
        assert_eq!(v, b"hi");
        let mut b = Bytes::new();
        assert!(fill(&mut b, "hi".into()));
        assert_eq!(b, "hi");
        let mut full = http_body_util::Full::<Bytes>::default();
        assert!(fill(&mut full, "hi".into()));
        let mut empty = http_body_util::Empty::<Bytes>::new();
        assert!(!fill(&mut empty, "hi".into()));
        let mut unit = ();
        assert!(!fill(&mut unit, "hi".into()));
    }
}
