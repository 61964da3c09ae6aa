//! An axum server rate limited by `redis-ratelimit`, configured from the
//! environment (see `examples/support/mod.rs` for every variable).
//!
//! ```text
//! cargo run --example axum                                   # in memory, 100/1s per IP
//! REDIS_URL=redis://127.0.0.1:6379 RATE_LIMIT=5/10s cargo run --example axum
//! REDIS_CLUSTER_URLS=redis://127.0.0.1:7000,redis://127.0.0.1:7001 cargo run --features cluster --example axum
//! curl -i http://127.0.0.1:3000/
//! RATE_LIMIT_REFUND=server-errors cargo run --example axum   # then: curl -i http://127.0.0.1:3000/status/500
//! ```

#[path = "support/mod.rs"]
mod support;

use std::{convert::Infallible, net::SocketAddr, process::ExitCode};

use axum::{
    Router, ServiceExt,
    extract::{Path, Request},
    response::Response,
    routing::get,
};
use tower::{Layer, Service};

#[tokio::main]
async fn main() -> ExitCode {
    support::init_tracing();
    support::report(serve().await)
}

async fn serve() -> Result<(), support::Error> {
    let support::Setup {
        listener,
        layer,
        shutdown,
    } = support::setup().await?;
    let app = Router::new().route("/", get(|| async { "ok" })).route(
        "/status/{code}",
        get(|Path(code): Path<String>| async move { support::status(&code) }),
    );
    match layer {
        // The layer wraps the whole router, so it runs before routing: a
        // denied request costs no routing, and no per-route boxing is added
        // (`Router::layer(layer)` works too, and runs after routing).
        Some(layer) => serve_app(listener, layer.layer(app), shutdown).await,
        None => serve_app(listener, app, shutdown).await,
    }
}

/// Serves `app` until Ctrl-C or SIGTERM. `key::PeerIp` reads the peer
/// address that connect info provides.
async fn serve_app<S>(
    listener: tokio::net::TcpListener,
    app: S,
    shutdown: support::Shutdown,
) -> Result<(), support::Error>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    let app = ServiceExt::<Request>::into_make_service_with_connect_info::<SocketAddr>(app);
    let serving = axum::serve(listener, app).with_graceful_shutdown(shutdown.clone());
    support::drained(serving, shutdown).await?;
    Ok(())
}
