//! [`Format`]: the kind of body the client reads, decided once per rejected
//! request from its headers.

use http::{
    HeaderMap, HeaderName, HeaderValue, Method, Version,
    header::{ACCEPT, CONTENT_TYPE, TE},
};

/// The body format of the middleware's own answers, decided from the
/// request's headers when a rejection is built (never on the allowed path).
///
/// A gRPC call is [`Grpc`](Self::Grpc): a `POST` with a gRPC
/// `content-type`, over HTTP/2 or later or asking for trailers (`te:
/// trailers`, which gRPC-Web translations such as tonic-web's add to the
/// HTTP/1.1 request they pass on). Any other request that claims a gRPC
/// `content-type` is answered as HTTP: a gRPC answer is an HTTP 200, which a
/// browser, a plain HTTP client or a cache would take for a success.
/// Otherwise `Accept`
/// decides: [`ProblemJson`](Self::ProblemJson) when it
/// prefers `application/problem+json` or `application/json` over
/// `text/plain` (q-values count; a tie keeps text), or [`Json`](Self::Json)
/// when it does so but refuses `application/problem+json` (a range that
/// matches it with `q=0`); else [`Text`](Self::Text). An `Accept` over [`ACCEPT_MAX`] bytes in total, or
/// a malformed one, is ignored: the answer is text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Format {
    /// `text/plain; charset=utf-8`: one short line.
    #[default]
    Text,
    /// `application/problem+json` (RFC 9457).
    ProblemJson,
    /// The same RFC 9457 body as `application/json`, for a client that
    /// accepts JSON but refuses `application/problem+json` by name.
    Json,
    /// A gRPC call (a `POST` with `content-type: application/grpc` or
    /// `application/grpc+..`, over HTTP/2 or with `te: trailers`): a
    /// trailers-only gRPC status ([`GrpcResponse`](super::GrpcResponse)),
    /// whatever `Accept` says.
    Grpc,
}

/// `Accept`, `Content-Type` and `TE`, with a `'static` borrow for
/// [`Format::negotiate`]'s lookups.
static ACCEPT_NAME: HeaderName = ACCEPT;
pub(super) static CONTENT_TYPE_NAME: HeaderName = CONTENT_TYPE;
static TE_NAME: HeaderName = TE;

/// What of a request, beside its headers, says whether it can be a gRPC
/// call: its method, and whether it came over HTTP/2 or later.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call {
    pub(crate) post: bool,
    pub(crate) http2: bool,
}

/// The most bytes of `Accept` (all its lines together) that are read; a
/// longer header is ignored.
pub const ACCEPT_MAX: usize = 4096;

impl Format {
    /// The format for a request whose header `name` has the values
    /// `header(name)`. Every request header a format depends on is read here,
    /// so both the tower and the actix adapters decide alike.
    pub(crate) fn negotiate<'a, I>(call: Call, header: impl Fn(&'static HeaderName) -> I) -> Format
    where
        I: Iterator<Item = &'a [u8]>,
    {
        if call.post
            && header(&CONTENT_TYPE_NAME)
                .next()
                .is_some_and(super::grpc::is_grpc_content_type)
            && (call.http2 || asks_for_trailers(header(&TE_NAME)))
        {
            return Format::Grpc;
        }
        negotiate_accept(header(&ACCEPT_NAME))
    }

    /// [`negotiate`](Self::negotiate) for an `http` 1 request.
    #[cfg(test)]
    pub(crate) fn of_request(method: &Method, version: Version, headers: &HeaderMap) -> Format {
        Self::negotiate(Call::of(method, version), |name| {
            headers.get_all(name).iter().map(HeaderValue::as_bytes)
        })
    }
}

/// What a rejected request's headers ask of the middleware's answer: its
/// [`Format`], and for a gRPC-Web call the `content-type` that a gRPC
/// answer to it carries instead of `application/grpc`
/// ([`answer_as_grpc_web`](super::grpc::answer_as_grpc_web)). Read once per
/// rejected request, the same way by both adapters.
#[derive(Debug, Clone)]
pub(crate) struct Asked {
    pub(crate) format: Format,
    /// [`grpc_web_answer_type`](super::grpc::grpc_web_answer_type) of the
    /// request's `content-type`: `None` unless it is gRPC-Web.
    pub(crate) grpc_web: Option<HeaderValue>,
}

impl Asked {
    /// [`Format::negotiate`], and the gRPC-Web answer type.
    pub(crate) fn negotiate<'a, I>(call: Call, header: impl Fn(&'static HeaderName) -> I) -> Asked
    where
        I: Iterator<Item = &'a [u8]>,
    {
        let grpc_web = header(&CONTENT_TYPE_NAME)
            .next()
            .and_then(super::grpc::grpc_web_answer_type);
        Asked {
            format: Format::negotiate(call, header),
            grpc_web,
        }
    }

    /// [`negotiate`](Self::negotiate) for an `http` 1 request.
    pub(crate) fn of_request(method: &Method, version: Version, headers: &HeaderMap) -> Asked {
        Self::negotiate(Call::of(method, version), |name| {
            headers.get_all(name).iter().map(HeaderValue::as_bytes)
        })
    }
}

impl Call {
    /// An `http` 1 request's.
    fn of(method: &Method, version: Version) -> Call {
        Call {
            post: method == Method::POST,
            http2: version >= Version::HTTP_2,
        }
    }
}

/// Whether the `TE` values list `trailers` (RFC 9110, section 10.1.4).
fn asks_for_trailers<'a>(values: impl Iterator<Item = &'a [u8]>) -> bool {
    values.flat_map(|v| v.split(|&b| b == b',')).any(|coding| {
        let name = coding.split(|&b| b == b';').next().unwrap_or_default();
        name.trim_ascii().eq_ignore_ascii_case(b"trailers")
    })
}

/// How well a media range matches one of the types we can answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Specificity {
    None,
    /// `*/*`
    Any,
    /// `type/*`
    Type,
    /// `type/subtype`
    Exact,
}

/// The q-value (in thousandths) the client gives `ty/subtype`: the one of the
/// most specific range that matches it (RFC 9110, section 12.5.1).
#[derive(Debug, Clone, Copy)]
struct Preference {
    ty: &'static [u8],
    subtype: &'static [u8],
    best: Specificity,
    q: u16,
}

impl Preference {
    const fn new(ty: &'static [u8], subtype: &'static [u8]) -> Self {
        Self {
            ty,
            subtype,
            best: Specificity::None,
            q: 0,
        }
    }

    fn offer(&mut self, ty: &[u8], subtype: &[u8], q: u16) {
        let spec = if ty == b"*" && subtype == b"*" {
            Specificity::Any
        } else if !ty.eq_ignore_ascii_case(self.ty) {
            return;
        } else if subtype == b"*" {
            Specificity::Type
        } else if subtype.eq_ignore_ascii_case(self.subtype) {
            Specificity::Exact
        } else {
            return;
        };
        // The first of equally specific ranges wins.
        if spec > self.best {
            (self.best, self.q) = (spec, q);
        }
    }
}

/// `ProblemJson` when the `Accept` values prefer a JSON type to `text/plain`.
fn negotiate_accept<'a>(values: impl Iterator<Item = &'a [u8]>) -> Format {
    let mut text = Preference::new(b"text", b"plain");
    let mut problem = Preference::new(b"application", b"problem+json");
    let mut json = Preference::new(b"application", b"json");
    let mut read = 0usize;
    for value in values {
        read = read.saturating_add(value.len());
        if read > ACCEPT_MAX {
            return Format::Text;
        }
        for range in value.split(|&b| b == b',') {
            let Some((ty, subtype, q)) = media_range(range) else {
                continue;
            };
            for pref in [&mut text, &mut problem, &mut json] {
                pref.offer(ty, subtype, q);
            }
        }
    }
    let json_q = problem.q.max(json.q);
    if json_q <= text.q {
        Format::Text
    } else if problem.q == 0 && problem.best != Specificity::None {
        // A range that matches it says q=0: not acceptable (RFC 9110,
        // section 12.4.2), though `application/json` is.
        Format::Json
    } else {
        Format::ProblemJson
    }
}

/// `type/subtype;params` with its q-value in thousandths (1000 without a
/// `q`); `None` for an empty or malformed range, which is skipped.
fn media_range(range: &[u8]) -> Option<(&[u8], &[u8], u16)> {
    let mut parts = range.split(|&b| b == b';');
    let media = parts.next()?.trim_ascii();
    let slash = media.iter().position(|&b| b == b'/')?;
    let (ty, subtype) = (&media[..slash], &media[slash + 1..]);
    if !is_token(ty) || !is_token(subtype) || (ty == b"*" && subtype != b"*") {
        return None;
    }
    let mut q = 1000;
    for param in parts {
        let param = param.trim_ascii();
        let eq = param.iter().position(|&b| b == b'=')?;
        let (name, value) = (param[..eq].trim_ascii(), param[eq + 1..].trim_ascii());
        if name.eq_ignore_ascii_case(b"q") {
            q = qvalue(value)?;
            // Parameters after the weight are accept-extensions: ignored.
            break;
        }
    }
    Some((ty, subtype, q))
}

/// RFC 9110's `qvalue`: `0[.ddd]` or `1[.000]`, in thousandths.
fn qvalue(v: &[u8]) -> Option<u16> {
    let (int, frac) = match v.iter().position(|&b| b == b'.') {
        Some(dot) => (&v[..dot], &v[dot + 1..]),
        None => (v, &b""[..]),
    };
    if frac.len() > 3 || !frac.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut thousandths = 0u16;
    for i in 0..3 {
        thousandths = thousandths * 10 + frac.get(i).map_or(0, |d| u16::from(d - b'0'));
    }
    match int {
        b"0" => Some(thousandths),
        b"1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// An RFC 9110 `token`.
pub(super) fn is_token(s: &[u8]) -> bool {
    !s.is_empty()
        && s.iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(values: &[&str]) -> Format {
        negotiate_accept(values.iter().map(|v| v.as_bytes()))
    }

    #[test]
    fn no_accept_or_a_wildcard_is_text() {
        assert_eq!(accept(&[]), Format::Text);
        assert_eq!(accept(&["*/*"]), Format::Text);
        assert_eq!(accept(&["text/html, */*;q=0.8"]), Format::Text);
        assert_eq!(accept(&["text/*"]), Format::Text);
    }

    #[test]
    fn json_types_are_problem_json() {
        assert_eq!(accept(&["application/json"]), Format::ProblemJson);
        assert_eq!(accept(&["application/problem+json"]), Format::ProblemJson);
        assert_eq!(accept(&["APPLICATION/JSON"]), Format::ProblemJson);
        assert_eq!(accept(&["application/*"]), Format::ProblemJson);
        assert_eq!(
            accept(&["text/html", "application/json;q=0.5"]),
            Format::ProblemJson,
            "text/plain is not acceptable, JSON is"
        );
    }

    #[test]
    fn q_values_decide() {
        let cases = [
            ("application/json;q=0.9, text/plain", Format::Text),
            ("application/json, text/plain;q=0.9", Format::ProblemJson),
            ("application/json;q=0.5, text/plain;q=0.5", Format::Text),
            ("text/plain;q=0, */*", Format::ProblemJson),
            ("application/json;q=0, */*", Format::Text),
            (
                "application/json ; Q=1.000 ; ext=1, text/plain;q=0.999",
                Format::ProblemJson,
            ),
            ("*/*;q=0.1, application/*;q=0.2", Format::ProblemJson),
            ("application/problem+json;q=0.001", Format::ProblemJson),
            ("application/json;q=0", Format::Text),
            // problem+json refused by name or by its type: plain JSON.
            (
                "application/problem+json;q=0, application/json",
                Format::Json,
            ),
            ("application/*;q=0, application/json", Format::Json),
            ("application/problem+json;q=0, text/plain", Format::Text),
        ];
        for (value, want) in cases {
            assert_eq!(accept(&[value]), want, "{value}");
        }
    }

    #[test]
    fn the_most_specific_range_wins() {
        // application/json is refused outright although application/* is fine.
        let v = "application/json;q=0, application/*;q=0.5, text/plain;q=0.4";
        assert_eq!(accept(&[v]), Format::ProblemJson, "via problem+json");
        let v =
            "application/json;q=0, application/problem+json;q=0, application/*, text/plain;q=0.1";
        assert_eq!(accept(&[v]), Format::Text);
    }

    #[test]
    fn malformed_ranges_are_skipped() {
        for bad in [
            "application/json;q=2",
            "application/json;q=1.5",
            "application/json;q=0.0001",
            "application/json;q=",
            "application/json;q=-1",
            "application/json;q=abc",
            "application/json;noequals",
            "application",
            "/json",
            "*/json",
            "appli cation/json",
            "application/json/x",
            "\u{e9}/json",
        ] {
            assert_eq!(accept(&[bad]), Format::Text, "{bad}");
        }
        assert_eq!(
            accept(&["application/json;q=7, application/json;q=0.3"]),
            Format::ProblemJson,
            "a bad range does not poison the rest"
        );
    }

    #[test]
    fn qvalue_grammar() {
        assert_eq!(qvalue(b"1"), Some(1000));
        assert_eq!(qvalue(b"1."), Some(1000));
        assert_eq!(qvalue(b"1.000"), Some(1000));
        assert_eq!(qvalue(b"0.5"), Some(500));
        assert_eq!(qvalue(b"0.05"), Some(50));
        assert_eq!(qvalue(b"0.123"), Some(123));
        assert_eq!(qvalue(b"0"), Some(0));
        for bad in [&b"1.001"[..], b"2", b"0.1234", b"", b".5", b"00.5", b"0.5 "] {
            assert_eq!(qvalue(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn hostile_accept_headers_are_ignored_without_panicking() {
        let long = format!("application/json, {}", "a/b;".repeat(ACCEPT_MAX));
        assert_eq!(accept(&[&long]), Format::Text, "over the cap: ignored");
        let many = vec!["text/html"; ACCEPT_MAX / 4];
        let mut lines = many.clone();
        lines.push("application/json");
        assert_eq!(accept(&lines), Format::Text, "the cap spans lines");
        for junk in [
            &b"\xff\xfe/\x00;q=\xff"[..],
            b";;;,,,",
            b"=,=;=/=",
            b"application/json;q=0.;q=1",
            b"application/json;=;q=1",
        ] {
            let _ = negotiate_accept([junk].into_iter());
        }
        let within = format!("{}application/json", " ".repeat(ACCEPT_MAX - 16));
        assert_eq!(accept(&[&within]), Format::ProblemJson, "at the cap: read");
    }

    #[test]
    fn headers_are_read_from_a_header_map() {
        let of = |h: &HeaderMap| Format::of_request(&Method::GET, Version::HTTP_11, h);
        let mut h = HeaderMap::new();
        assert_eq!(of(&h), Format::Text);
        h.append(ACCEPT, HeaderValue::from_static("text/html"));
        h.append(ACCEPT, HeaderValue::from_static("application/json;q=0.5"));
        assert_eq!(of(&h), Format::ProblemJson);
    }
}
