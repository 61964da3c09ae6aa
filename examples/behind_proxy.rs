//! Behind a load balancer: the client behind trusted proxies, per-plan tiers
//! and a skip list, in memory.
//!
//! ```text
//! cargo run --example behind_proxy
//! curl -i -H 'x-forwarded-for: 203.0.113.9' http://127.0.0.1:3000/               # free: 3/min
//! curl -i -H 'x-forwarded-for: 203.0.113.9' -H 'x-api-key: pro-key' http://127.0.0.1:3000/  # pro: 10/min
//! curl -i -H 'x-forwarded-for: 10.1.2.3' http://127.0.0.1:3000/                  # internal: never limited
//! ```

use std::net::SocketAddr;

use axum::{Router, extract::Request, middleware::Next, response::Response, routing::get};
use http::request::Parts;
use redis_ratelimit::{
    Key, KeyError, Limiter, Quota, RateLimitLayer, Tiers,
    key::{self, ClientIp},
    skip::Networks,
};

/// The caller's plan, set by the auth step below (never read from a header
/// the client could forge).
#[derive(Clone)]
struct Plan(&'static str);

/// A stand-in for real authentication: an API key maps to a plan.
async fn authenticate(mut req: Request, next: Next) -> Response {
    let plan = match req.headers().get("x-api-key").map(|v| v.as_bytes()) {
        Some(b"pro-key") => "pro",
        _ => "free",
    };
    req.extensions_mut().insert(Plan(plan));
    next.run(req).await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Believe X-Forwarded-For only when the peer is our load balancer.
    // (Here the "load balancer" is curl on this machine.)
    let client = ClientIp::new().trust("127.0.0.1/32, ::1")?;

    // Each tier is a limiter named after its plan: its headers and counters
    // are its own. Requests with no known plan get the first ("free").
    let tiers = Tiers::new(
        Limiter::builder(Quota::per_minute(3))
            .name("free")
            .build()?,
    )
    .tier(
        Limiter::builder(Quota::per_minute(10))
            .name("pro")
            .build()?,
    );
    let plan = key::from_fn(|p: &Parts| {
        let plan = p.extensions.get::<Plan>().map_or("free", |plan| plan.0);
        Ok::<_, KeyError>(Key::from(plan))
    });

    // Internal networks are never limited, matched on the same client
    // address the key is made from.
    let internal = Networks::new(client.clone(), "10.0.0.0/8, 192.168.0.0/16")?;
    let limit = RateLimitLayer::tiered(tiers, plan, client).skip_networks(internal);

    // Layers run outside-in from the last added: authenticate, then limit.
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(limit)
        .layer(axum::middleware::from_fn(authenticate));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://127.0.0.1:3000");
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}
