//! The second Redis peer: axum 0.8 behind `tower-rate-limit-redis` 1.0's
//! `RateLimitLayer`, configured like `examples/axum.rs` (see `src/lib.rs`).
//!
//! Each decision is one `EVALSHA` of the crate's GCRA script (`TIME`, `GET`
//! the key's theoretical arrival time, and on an allowed request `SET .. PX`)
//! on a redis-rs 0.32 `MultiplexedConnection`. The connection is opened once;
//! the layer clones it into every request. A denied request gets `429` with
//! `Retry-After` (whole seconds, rounded up) and an empty body; allowed
//! responses carry no rate-limit headers, as the crate writes none. A Redis
//! failure lets the request through (`fail_open`), as our
//! `RATE_LIMIT_ON_ERROR` default and the actix peer do. There is no Redis
//! timeout, the crate's default. The crate takes a plain
//! `MultiplexedConnection`, which does not reconnect: after a Redis restart
//! this peer lets every request through until it is restarted itself.
//!
//! # From `RATE_LIMIT` to GCRA
//!
//! The crate takes two parameters: a `capacity` (the burst a fresh key gets)
//! and an `emission_interval` (one more request is allowed per interval).
//! A quota `<count>/<window>` becomes:
//!
//! - capacity `count`;
//! - emission interval `window / count`, rounded to the nearest millisecond.
//!
//! So a fresh key gets `count` requests at once, then one per `window /
//! count`, like `tower_governor`'s mapping in `governor.rs`. Unlike our fixed
//! window, a spent key's allowance comes back a little at a time, not all at
//! the window's end. `3/1m` becomes capacity 3 and 20 s: the 4th request in a
//! minute is denied with `Retry-After: 20`. `1/1h` becomes capacity 1 and
//! 3,600,000 ms, the same decisions as a fixed window of one.
//!
//! The crate bounds both parameters. The capacity is a `u16`, so at most
//! 65,535, and the interval is whole milliseconds, at least 1 ms. Quotas
//! beyond that are clamped, and the startup line says so. Such a quota
//! allows a burst of at most 65,535, then at most 1,000 requests a second
//! per key. The load benchmark's "no run can exhaust it" quota
//! `1000000000/1h` becomes capacity 65,535 and 1 ms. On `allowed, 100k keys`
//! that never denies. On `allowed, 1 key`, the one key is spent after about
//! 65,535 requests plus 1,000 a second, and from then on this peer denies
//! most requests (the report's "not 2xx" column). An interval longer than
//! `u32::MAX` ms (about 49.7 days) is refused.
//!
//! # Keys
//!
//! `trl:ip:<peer IP>` for `RATE_LIMIT_KEY=ip`, from axum's `ConnectInfo`
//! (`serve_axum` serves with it), and `trl:h:<header value>` for
//! `header:<name>`. A request without the header gets `400`. The script
//! writes each key with `PX` set to its arrival time minus now, so every key
//! has a TTL, of at most `capacity × interval`. Denied requests write
//! nothing.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 RATE_LIMIT=3/1m RATE_LIMIT_KEY=header:x-api-key \
//!     cargo run --release --bin tower-redis
//! ```

use std::{fmt, net::SocketAddr, process::ExitCode, time::Duration};

use axum::{Router, body::Body, extract::ConnectInfo, response::IntoResponse, routing::get};
use http::{Request, Response, StatusCode};
use ratelimit_peers::{Config, Error, KeyBy, Limit, Store, report, serve_axum};
use tower::Layer;
use tower_rate_limit_redis::{KeyResolver, RateLimitLayer};

#[tokio::main]
async fn main() -> ExitCode {
    report(serve().await)
}

async fn serve() -> Result<(), Error> {
    let config = Config::from_env(Store::Redis)?;
    let app = Router::new().route("/", get(|| async { "ok" }));
    let what = config.describe();
    let Some(limit) = config.limit else {
        return serve_axum(
            config.bind,
            &format!("tower-rate-limit-redis peer ({what})"),
            app,
        )
        .await;
    };
    let gcra = Gcra::of(limit)?;
    let url = config
        .redis_url
        .as_deref()
        .expect("checked by Config::from_env");
    let unreachable = |e: redis032::RedisError| {
        Error::runtime(format!("cannot connect to Redis (REDIS_URL): {e}"))
    };
    let conn = redis032::Client::open(url)
        .map_err(unreachable)?
        .get_multiplexed_async_connection()
        .await
        .map_err(unreachable)?;
    let layer = RateLimitLayer::builder()
        .conn(conn)
        .key_resolver(Resolver(config.key.clone()))
        .capacity(gcra.capacity)
        .emission_interval(gcra.emission_interval)
        .fail_open(true)
        .build();
    // Around the whole router, as examples/axum.rs wraps ours.
    let app = layer.layer(app);
    let what = format!("tower-rate-limit-redis peer ({what}; {gcra})");
    serve_axum(config.bind, &what, app).await
}

/// The crate's GCRA parameters for a quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Gcra {
    capacity: u16,
    emission_interval: Duration,
    /// The quota asked for more than the crate can express.
    clamped: bool,
}

impl Gcra {
    /// Capacity `count` and interval `window / count`, within the crate's
    /// bounds (see the module docs).
    fn of(limit: Limit) -> Result<Self, Error> {
        let capacity = u16::try_from(limit.count).unwrap_or(u16::MAX);
        let count = u128::from(limit.count);
        let window_ms = limit.window.as_millis();
        let rounded = ((window_ms + count / 2) / count).max(1);
        let ms = u32::try_from(rounded).map_err(|_| {
            Error::runtime(format!(
                "tower-rate-limit-redis's emission interval is at most {} ms: \
                 use a quota of at least one request per 49 days",
                u32::MAX
            ))
        })?;
        Ok(Self {
            capacity,
            emission_interval: Duration::from_millis(ms.into()),
            clamped: u64::from(capacity) != limit.count || window_ms < count,
        })
    }
}

impl fmt::Display for Gcra {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GCRA capacity {}, emission interval {:?}",
            self.capacity, self.emission_interval
        )?;
        if self.clamped {
            f.write_str(
                " (clamped to the crate's bounds: capacity at most 65535, interval at least 1 ms)",
            )?;
        }
        Ok(())
    }
}

/// `RATE_LIMIT_KEY` for the crate: the Redis key of a request.
#[derive(Debug, Clone)]
struct Resolver(KeyBy);

impl KeyResolver for Resolver {
    type Key = Vec<u8>;
    type ErrorBody = Body;

    fn key<T>(&self, req: &Request<T>) -> Result<Vec<u8>, Response<Body>> {
        match &self.0 {
            KeyBy::Ip => match req.extensions().get::<ConnectInfo<SocketAddr>>() {
                Some(ConnectInfo(addr)) => Ok(format!("trl:ip:{}", addr.ip()).into_bytes()),
                None => Err((
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "no peer address: the server was not started with ConnectInfo",
                )
                    .into_response()),
            },
            KeyBy::Header(name) => match req.headers().get(name) {
                Some(v) if !v.is_empty() => Ok([b"trl:h:".as_slice(), v.as_bytes()].concat()),
                _ => {
                    Err((StatusCode::BAD_REQUEST, format!("missing {name} header")).into_response())
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gcra(count: u64, window_ms: u64) -> (u16, u64, bool) {
        let g = Gcra::of(Limit {
            count,
            window: Duration::from_millis(window_ms),
        })
        .unwrap();
        let ms = u64::try_from(g.emission_interval.as_millis()).unwrap();
        (g.capacity, ms, g.clamped)
    }

    #[test]
    fn quotas_map_to_capacity_and_interval() {
        assert_eq!(gcra(3, 60_000), (3, 20_000, false));
        assert_eq!(gcra(1, 3_600_000), (1, 3_600_000, false));
        assert_eq!(gcra(100, 1_000), (100, 10, false));
        // 333.3 ms, rounded to the nearest millisecond.
        assert_eq!(gcra(3, 1_000), (3, 333, false));
        assert_eq!(gcra(2, 1_001), (2, 501, false));
    }

    #[test]
    fn quotas_beyond_the_crate_are_clamped_or_refused() {
        assert_eq!(gcra(1_000_000_000, 3_600_000), (u16::MAX, 1, true));
        assert_eq!(gcra(10_000, 1_000), (10_000, 1, true));
        assert_eq!(gcra(100_000, 3_600_000), (u16::MAX, 36, true));
        assert!(
            Gcra::of(Limit {
                count: 1,
                window: Duration::from_secs(100 * 86_400),
            })
            .is_err()
        );
    }
}
