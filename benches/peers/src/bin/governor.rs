//! The in-memory peer: axum 0.8 behind `tower_governor` (GCRA from the
//! `governor` crate), configured like `examples/axum.rs` (see `src/lib.rs`).
//!
//! A quota `<count>/<window>` becomes governor's burst of `count` with one
//! request replenished every `window / count`. That is GCRA, not our fixed
//! window, but on the load benchmark's workloads they decide alike: a
//! quota of a billion an hour never denies, and `1/1h` denies every request
//! after a key's first. Allowed responses carry governor's
//! `x-ratelimit-limit` / `x-ratelimit-remaining` headers (`use_headers`), as
//! ours carry `RateLimit` and `RateLimit-Policy`: both sides pay for headers.
//!
//! ```text
//! RATE_LIMIT=1000/1s RATE_LIMIT_KEY=header:x-api-key cargo run --release --bin governor
//! ```

use std::{net::IpAddr, process::ExitCode, time::Duration};

use axum::{Router, routing::get};
use http::{HeaderValue, Request, StatusCode};
use ratelimit_peers::{Config, Error, KeyBy, Limit, Store, report, serve_axum};
use tower::Layer;
use tower_governor::{
    GovernorError, GovernorLayer,
    governor::GovernorConfigBuilder,
    key_extractor::{KeyExtractor, PeerIpKeyExtractor},
};

#[tokio::main]
async fn main() -> ExitCode {
    report(serve().await)
}

async fn serve() -> Result<(), Error> {
    let config = Config::from_env(Store::Memory)?;
    let app = Router::new().route("/", get(|| async { "ok" }));
    let what = format!("tower_governor peer ({})", config.describe());
    let Some(limit) = config.limit else {
        return serve_axum(config.bind, &what, app).await;
    };
    let (period, burst) = gcra(limit)?;
    let governor = GovernorConfigBuilder::default()
        .key_extractor(Extractor(config.key.clone()))
        .use_headers()
        .period(period)
        .burst_size(burst)
        .finish()
        .ok_or_else(|| Error::runtime("governor refused the quota"))?;
    // Around the whole router, as examples/axum.rs wraps ours.
    let app = GovernorLayer::new(governor).layer(app);
    serve_axum(config.bind, &what, app).await
}

/// Governor's replenishment period and burst for a quota.
fn gcra(limit: Limit) -> Result<(Duration, u32), Error> {
    let burst = u32::try_from(limit.count)
        .map_err(|_| Error::runtime("governor's burst is a u32: use a count up to 4294967295"))?;
    let nanos = limit.window.as_nanos() / u128::from(limit.count);
    match u64::try_from(nanos) {
        Ok(n) if n > 0 => Ok((Duration::from_nanos(n), burst)),
        _ => Err(Error::runtime(
            "the quota replenishes faster than one request per nanosecond",
        )),
    }
}

/// `RATE_LIMIT_KEY` for governor: the peer IP through governor's own
/// extractor, or a header value.
#[derive(Debug, Clone)]
struct Extractor(KeyBy);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Ip(IpAddr),
    Header(HeaderValue),
}

impl KeyExtractor for Extractor {
    type Key = Key;

    fn extract<T>(&self, req: &Request<T>) -> Result<Key, GovernorError> {
        match &self.0 {
            KeyBy::Ip => PeerIpKeyExtractor.extract(req).map(Key::Ip),
            KeyBy::Header(name) => match req.headers().get(name) {
                Some(v) if !v.is_empty() => Ok(Key::Header(v.clone())),
                _ => Err(GovernorError::Other {
                    code: StatusCode::BAD_REQUEST,
                    msg: Some(format!("missing {name} header")),
                    headers: None,
                }),
            },
        }
    }
}
