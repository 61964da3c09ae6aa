//! An actix-web 4 server rate limited by `redis-ratelimit` (the `actix`
//! feature), configured from the environment exactly like `axum.rs` (see
//! `examples/support/mod.rs` for every variable).
//!
//! ```text
//! cargo run --features actix --example actix                 # in memory, 100/1s per IP
//! REDIS_URL=redis://127.0.0.1:6379 RATE_LIMIT=5/10s cargo run --features actix --example actix
//! curl -i http://127.0.0.1:3000/
//! ```

#[path = "support/mod.rs"]
mod support;

use std::process::ExitCode;

use actix_web::{App, HttpResponse, HttpServer, guard, http::StatusCode, web};
use redis_ratelimit::actix::RateLimitMiddleware;

fn main() -> ExitCode {
    support::init_tracing();
    // actix-web runs on its own runtime (tokio underneath), so the store is
    // connected inside it.
    support::report(actix_web::rt::System::new().block_on(serve()))
}

/// `GET` (and `HEAD`, as axum's `get` takes it) `/` and `/status/{code}`;
/// another method on them is a 405, another path a 404, as on the other
/// examples.
fn routes(cfg: &mut web::ServiceConfig) {
    // A resource (not `App::route`, which moves the route's guards to the
    // path, so another method finds no path: a 404) answers 405 for a
    // method none of its routes takes.
    let get_or_head = || web::route().guard(guard::Any(guard::Get()).or(guard::Head()));
    cfg.service(web::resource("/").route(get_or_head().to(|| async { "ok" })))
        .service(web::resource("/status/{code}").route(get_or_head().to(
            |code: web::Path<String>| async move {
                // actix-web 4 has http 0.2's status type.
                let status = support::status(&code).as_u16();
                HttpResponse::new(StatusCode::from_u16(status).expect("a valid status"))
            },
        )));
}

async fn serve() -> Result<(), support::Error> {
    let support::Setup {
        listener,
        layer,
        shutdown,
    } = support::setup().await?;
    let listener = listener.into_std()?;
    // The tower layer's configuration, served as actix middleware. Its own
    // signal handling off (it stops at once on ctrl-c, and gracefully on
    // SIGTERM): it stops as the other examples do, finishing open requests.
    let server = match layer.map(RateLimitMiddleware::from) {
        Some(layer) => HttpServer::new(move || App::new().wrap(layer.clone()).configure(routes))
            .disable_signals()
            .shutdown_timeout(support::DRAIN.as_secs())
            .listen(listener)?
            .run(),
        None => HttpServer::new(|| App::new().configure(routes))
            .disable_signals()
            .shutdown_timeout(support::DRAIN.as_secs())
            .listen(listener)?
            .run(),
    };
    let handle = server.handle();
    actix_web::rt::spawn(async move {
        shutdown.await;
        handle.stop(true).await;
    });
    server.await?;
    Ok(())
}
