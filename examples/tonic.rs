//! A tonic gRPC server (the standard health service) rate limited by
//! `redis-ratelimit`, configured from the environment (see
//! `examples/support/mod.rs` for every variable).
//!
//! A rejected call is answered with gRPC status `RESOURCE_EXHAUSTED` and a
//! `retry-after` metadata value, not an HTTP 429; `key::PeerIp` reads the
//! peer address tonic's server records (the `tonic` feature). With
//! `RATE_LIMIT_REFUND`, `refund::TrailersLayer` refunds by the `grpc-status`
//! a served call sends in its trailers.
//!
//! ```text
//! cargo run --example tonic --features tonic                 # in memory, 100/1s per IP
//! BIND=[::]:50051 REDIS_URL=redis://127.0.0.1:6379 RATE_LIMIT=5/10s cargo run --example tonic --features tonic
//! grpc-health-probe -addr=127.0.0.1:3000            # or any client of grpc.health.v1.Health/Check
//! ```

#[path = "support/mod.rs"]
mod support;

use std::process::ExitCode;

use redis_ratelimit::refund::TrailersLayer;
use tonic::transport::{Server, server::TcpIncoming};
use tower::util::option_layer;

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
    let (_reporter, health) = tonic_health::server::health_reporter();
    // Outside the limit: refunds by a served call's `grpc-status`, which
    // comes in its trailers (RATE_LIMIT_REFUND); otherwise it only forwards.
    let serving = Server::builder()
        .layer(TrailersLayer::new())
        .layer(option_layer(layer))
        .add_service(health)
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), shutdown.clone());
    support::drained(serving, shutdown)
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(())
}
