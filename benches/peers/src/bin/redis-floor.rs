//! Not a limiter: a floor. axum 0.8 that makes one Redis round trip per
//! request (`PING`, through redis-rs 1's multiplexed `ConnectionManager`, the
//! client and connection our `RedisStore` uses, with `TCP_NODELAY` as it
//! sets it) and answers `200 ok`.
//!
//! Any limiter that asks Redis once per request pays at least this: the
//! round trip, the client's work and the task wake-ups around it, and
//! Redis's own per-command work, on the same cores as the server and the load
//! generator. Its ratio to plain axum in the load benchmark is the ceiling
//! for such a design on the machine measured; batching several decisions
//! into one call is the only way past it.
//!
//! It reads `BIND` and `REDIS_URL` (required). `RATE_LIMIT` and
//! `RATE_LIMIT_KEY` are read as the peers read them, but nothing is limited.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --release --bin redis-floor
//! ```

use std::process::ExitCode;

use axum::{Router, extract::State, http::StatusCode, routing::get};
use ratelimit_peers::{Config, Error, Store, report, serve_axum};
use redis1::aio::ConnectionManager;

#[tokio::main]
async fn main() -> ExitCode {
    report(serve().await)
}

async fn serve() -> Result<(), Error> {
    let config = Config::from_env(Store::Redis)?;
    let url = config
        .redis_url
        .clone()
        .ok_or_else(|| Error::runtime("REDIS_URL is not set: the floor needs a Redis to ping"))?;
    // TCP_NODELAY, as our store sets it: with Nagle's algorithm on (redis-rs
    // 1's default), a PING sent while another is in flight waits for its
    // reply, which only a network's round trip shows (`ab.py --rtt`).
    let info = redis1::IntoConnectionInfo::into_connection_info(url.as_str())
        .map_err(|e| Error::runtime(format!("REDIS_URL: {e}")))?
        .set_tcp_settings(redis1::io::tcp::TcpSettings::default().set_nodelay(true));
    let client =
        redis1::Client::open(info).map_err(|e| Error::runtime(format!("REDIS_URL: {e}")))?;
    let conn = ConnectionManager::new(client)
        .await
        .map_err(|e| Error::runtime(format!("connecting to Redis: {e}")))?;
    let app = Router::new().route("/", get(ping)).with_state(conn);
    let what = "redis floor (one PING per request, no limiter)";
    serve_axum(config.bind, what, app).await
}

/// One `PING`; a Redis error answers 503, so a broken floor is seen.
async fn ping(State(mut conn): State<ConnectionManager>) -> Result<&'static str, StatusCode> {
    let pong: Result<String, _> = redis1::cmd("PING").query_async(&mut conn).await;
    match pong {
        Ok(_) => Ok("ok"),
        Err(_) => Err(StatusCode::SERVICE_UNAVAILABLE),
    }
}
