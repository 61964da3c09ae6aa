//! Not a limiter: a floor for the memory store. axum 0.8 whose handler reads
//! the request's key, as any limiter must, and answers `200 ok` with the two
//! header fields that our layer writes on every allowed response:
//!
//! ```text
//! RateLimit-Policy: "default";q=1000000000;w=3600
//! RateLimit: "default";r=999999999;t=3600
//! ```
//!
//! Nothing is counted or decided. Any limiter that keeps the documented
//! behaviour ("every response on a limited route carries the headers of the
//! IETF draft", README) pays at least this: reading the key, one header value
//! made per request (its numbers change), one fixed value, and hyper and the
//! kernel carrying about 90 bytes more a response. It is written to be
//! cheaper than any middleware could be, so that it bounds every design from
//! below: in the handler (no layer around the router, no future of its own),
//! the fixed value a `'static` one (no reference count to touch), each
//! worker's numbers in a thread-local (no shared line). Its ratio to plain
//! axum in `benches/ab.py --headers-floor` is the ceiling, on the machine
//! measured, for an in-memory limiter that writes the draft's headers.
//!
//! It reads `BIND`, `RATE_LIMIT` (required: its one quota gives `q` and `w`)
//! and `RATE_LIMIT_KEY` as the peers read them.
//!
//! ```text
//! RATE_LIMIT=1000000000/1h RATE_LIMIT_KEY=header:x-api-key cargo run --release --bin headers-floor
//! ```

use std::{cell::Cell, convert::Infallible, net::SocketAddr, process::ExitCode};

use axum::{
    Router,
    extract::{ConnectInfo, FromRequestParts, State},
    http::request::Parts,
    response::IntoResponse,
    routing::get,
};
use http::{HeaderName, HeaderValue};
use ratelimit_peers::{Config, Error, KeyBy, Store, report, serve_axum};

const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

#[tokio::main]
async fn main() -> ExitCode {
    report(serve().await)
}

/// What every request's headers are made of, fixed at startup and leaked:
/// the handler's state is a `&'static`, which it copies, where a clone
/// would touch the key header name's reference count.
struct Headers {
    key: KeyBy,
    /// `RateLimit-Policy`, leaked once so that a response takes it without
    /// touching a reference count.
    policy: HeaderValue,
    limit: u64,
    /// `;t=<window seconds>`, the end of every `RateLimit` value.
    reset: &'static str,
}

async fn serve() -> Result<(), Error> {
    let config = Config::from_env(Store::Memory)?;
    let limit = config.limit.ok_or_else(|| {
        Error::runtime(
            "the headers floor needs RATE_LIMIT=<count>/<window> for its headers' values",
        )
    })?;
    let window = limit.window.as_millis().div_ceil(1000).max(1);
    let policy: &'static str = format!("\"default\";q={};w={window}", limit.count).leak();
    let headers: &'static Headers = Box::leak(Box::new(Headers {
        key: config.key.clone(),
        policy: HeaderValue::from_static(policy),
        limit: limit.count,
        reset: format!(";t={window}").leak(),
    }));
    let app = Router::new().route("/", get(answer)).with_state(headers);
    let what = format!(
        "headers floor (the draft's headers, no limiter; {})",
        config.describe()
    );
    serve_axum(config.bind, &what, app).await
}

thread_local! {
    /// Responses this worker has answered: the `r` it writes counts down.
    static ANSWERED: Cell<u64> = const { Cell::new(0) };
}

/// The key's length in bytes (the peer address's, or the header's; 0 if it
/// has none): read, as a limiter reads it, and folded into `r` so that the
/// read is not optimised away.
struct KeyLen(usize);

impl FromRequestParts<&'static Headers> for KeyLen {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &&'static Headers,
    ) -> Result<Self, Infallible> {
        let len = match &state.key {
            KeyBy::Header(name) => parts.headers.get(name).map_or(0, HeaderValue::len),
            KeyBy::Ip => parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map_or(0, |ConnectInfo(a)| if a.is_ipv4() { 4 } else { 16 }),
        };
        Ok(KeyLen(len))
    }
}

async fn answer(State(h): State<&'static Headers>, KeyLen(key): KeyLen) -> impl IntoResponse {
    let n = ANSWERED.with(|c| {
        let n = c.get();
        c.set(n + 1);
        n
    });
    let left = h.limit.saturating_sub(1 + (n + key as u64) % h.limit);
    let mut digits = itoa::Buffer::new();
    let mut value = String::with_capacity(48);
    value.push_str("\"default\";r=");
    value.push_str(digits.format(left));
    value.push_str(h.reset);
    // Only ASCII digits and the fixed parts above: always a valid value. The
    // policy is a `'static` one: its clone copies a pointer.
    let value = HeaderValue::try_from(value).unwrap_or(HeaderValue::from_static(""));
    (
        [(RATELIMIT_POLICY, h.policy.clone()), (RATELIMIT, value)],
        "ok",
    )
}
