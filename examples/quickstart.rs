//! Quickstart: an axum server with one rate-limited route, counting in
//! memory (one process; see `RedisStore` to share the limit across replicas).
//!
//! ```text
//! cargo run --example quickstart
//! curl -i http://127.0.0.1:3000/api/search   # 200 five times a minute per IP, then 429
//! curl -i http://127.0.0.1:3000/             # never limited
//! ```

use std::net::SocketAddr;

use axum::{Router, routing::get};
use redis_ratelimit::{Limiter, RateLimitLayer, key::PeerIp};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 5 requests per minute per client IP, counted in this process.
    let limiter = Limiter::builder("5/1m".parse()?).name("search").build()?;

    let app = Router::new()
        // `route_layer` limits only the routes added before it.
        .route("/api/search", get(|| async { "results\n" }))
        .route_layer(RateLimitLayer::new(limiter, PeerIp))
        .route("/", get(|| async { "home, not limited\n" }));

    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    println!("listening on http://{bind}");
    // `PeerIp` reads the peer address that connect info records.
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}
