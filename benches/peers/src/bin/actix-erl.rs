//! The Redis peer: actix-web 4 behind `actix-extensible-rate-limit`'s
//! `RedisBackend` (a fixed window, like ours), configured like
//! `examples/axum.rs` (see `src/lib.rs`).
//!
//! Each decision is one atomic pipeline on a `ConnectionManager`: `MULTI`,
//! `BITFIELD ... INCRBY` (counts every request, denied ones too), `EXPIRE ..
//! NX`, `TTL`, `EXEC`. As in the crate's own example, the manager is
//! connected once and cloned into every worker. Allowed and denied responses
//! carry its `x-ratelimit-*` headers (`add_headers`), and a Redis failure
//! lets the request through (`fail_open`), as our `RATE_LIMIT_ON_ERROR`
//! default does.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 RATE_LIMIT=1/1h cargo run --release --bin actix-erl
//! ```

use std::process::ExitCode;

use actix_extensible_rate_limit::{
    RateLimiter,
    backend::{SimpleInputFunctionBuilder, redis::RedisBackend},
};
use actix_web::{App, HttpServer, dev::ServiceRequest, error::ErrorBadRequest, web};
use ratelimit_peers::{Config, Error, KeyBy, Store, report};
use redis::aio::ConnectionManager;

#[actix_web::main]
async fn main() -> ExitCode {
    report(serve().await)
}

async fn ok() -> &'static str {
    "ok"
}

async fn serve() -> Result<(), Error> {
    let config = Config::from_env(Store::Redis)?;
    let described = config.describe();
    let started = |addrs: Vec<std::net::SocketAddr>| {
        eprintln!("actix-extensible-rate-limit peer listening on {addrs:?} ({described})");
    };
    let Some(limit) = config.limit else {
        let server = HttpServer::new(|| App::new().route("/", web::get().to(ok)));
        let server = server.bind(config.bind)?;
        started(server.addrs());
        return Ok(server.run().await?);
    };
    let url = config.redis_url.expect("checked by Config::from_env");
    let unreachable =
        |e: redis::RedisError| Error::runtime(format!("cannot connect to Redis (REDIS_URL): {e}"));
    let client = redis::Client::open(url).map_err(unreachable)?;
    let manager = ConnectionManager::new(client).await.map_err(unreachable)?;
    let backend = RedisBackend::builder(manager).build();
    let key = config.key.clone();
    let server = HttpServer::new(move || {
        let input = SimpleInputFunctionBuilder::new(limit.window, limit.count);
        let input = match key.clone() {
            KeyBy::Ip => input.peer_ip_key(),
            KeyBy::Header(name) => input.custom_fn(move |req: &ServiceRequest| {
                match req.headers().get(name.as_str()).map(|v| v.to_str()) {
                    Some(Ok(v)) if !v.is_empty() => Ok(v.to_owned()),
                    _ => Err(ErrorBadRequest(format!(
                        "missing or non-ASCII {name} header"
                    ))),
                }
            }),
        };
        let limiter = RateLimiter::builder(backend.clone(), input.build())
            .add_headers()
            .fail_open(true)
            .build();
        App::new().wrap(limiter).route("/", web::get().to(ok))
    });
    let server = server.bind(config.bind)?;
    started(server.addrs());
    Ok(server.run().await?)
}
