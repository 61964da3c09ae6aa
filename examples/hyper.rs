//! A plain hyper 1 server rate limited by `redis-ratelimit`: the tower
//! service is adapted with `TowerToHyperService`, and each connection inserts
//! its peer `SocketAddr` into the request extensions for `key::PeerIp`.
//! Configured from the environment (see `examples/support/mod.rs`).
//!
//! ```text
//! cargo run --example hyper                                  # in memory, 100/1s per IP
//! REDIS_URL=redis://127.0.0.1:6379 REDIS_POOL=32 cargo run --example hyper
//! curl -i http://127.0.0.1:3000/
//! ```

#[path = "support/mod.rs"]
mod support;

use std::{convert::Infallible, process::ExitCode, time::Duration};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::{body::Incoming, server::conn::http1};
use hyper_util::{rt::TokioIo, server::graceful::GracefulShutdown, service::TowerToHyperService};
use percent_encoding::percent_decode_str;
use tower::{ServiceBuilder, util::MapRequest};

#[tokio::main]
async fn main() -> ExitCode {
    support::init_tracing();
    support::report(serve().await)
}

/// `GET /`: `ok`; `GET /status/<code>`: that status; any other path 404,
/// and any other method 405, as the axum and actix-web examples answer
/// (so a refund by status charges the same requests on each). The code is
/// percent-decoded, as axum's `Path` and actix-web's router decode it
/// (`/status/%35%30%30` is a 500); the route is matched on the raw path,
/// as axum's is, so an encoded `/` stays in the code (a 400).
async fn hello(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path();
    let code = path
        .strip_prefix("/status/")
        .filter(|c| !c.is_empty() && !c.contains('/'));
    let status = match (path, code) {
        _ if !matches!(*req.method(), Method::GET | Method::HEAD)
            && (path == "/" || code.is_some()) =>
        {
            let mut res = Response::new(Full::new(Bytes::new()));
            *res.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
            res.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET,HEAD"));
            return Ok(res);
        }
        ("/", _) => return Ok(Response::new(Full::new(Bytes::from_static(b"ok")))),
        (_, Some(code)) => match percent_decode_str(code).decode_utf8() {
            Ok(code) => support::status(&code),
            // Not UTF-8, so no number: axum's `Path` answers 400 too.
            Err(_) => StatusCode::BAD_REQUEST,
        },
        _ => StatusCode::NOT_FOUND,
    };
    let mut res = Response::new(Full::new(Bytes::new()));
    *res.status_mut() = status;
    Ok(res)
}

async fn serve() -> Result<(), support::Error> {
    let support::Setup {
        listener,
        layer,
        shutdown,
    } = support::setup().await?;
    // One service for every connection; without a layer it is `hello` alone.
    let app = ServiceBuilder::new().option_layer(layer).service_fn(hello);
    let graceful = GracefulShutdown::new();
    let mut shutdown = shutdown;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Such as EMFILE: wait for connections to close, like axum.
                tracing::error!("accept error: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let app = MapRequest::new(app.clone(), move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(peer);
            req
        });
        let conn = http1::Builder::new()
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, "connection error: {e}");
            }
        });
    }
    // New clients are refused from here, as axum, actix and tonic refuse
    // them: not taken into the backlog and left there through the drain.
    drop(listener);
    support::within_drain(graceful.shutdown()).await;
    Ok(())
}
