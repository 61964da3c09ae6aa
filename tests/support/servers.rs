//! Servers for the HTTP tests, one per framework, each serving `GET /`
//! (answering `ok`) on a free port behind a rate-limit layer.

use std::net::SocketAddr;

use axum::{Router, routing::get};
use redis_ratelimit::{RateLimitLayer, key::Header};
use tokio::net::TcpListener;

use super::scenarios::{OWN_LEGACY_HEADERS, Serve};

/// `GET /` answering `ok`.
pub fn app() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

/// `GET /` answering `ok`, and `GET /status/{code}` answering that status.
pub fn status_app() -> Router {
    app().route(
        "/status/{code}",
        get(
            |axum::extract::Path(code): axum::extract::Path<u16>| async move {
                http::StatusCode::from_u16(code).unwrap()
            },
        ),
    )
}

/// Serves `app` on an ephemeral port, with or without axum's connect info.
pub async fn spawn_axum(app: Router, connect_info: bool) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        if connect_info {
            let app = app.into_make_service_with_connect_info::<SocketAddr>();
            axum::serve(listener, app).await
        } else {
            axum::serve(listener, app).await
        }
    });
    url
}

/// axum (the tower layer), for the shared scenarios.
pub struct Axum;

impl Serve for Axum {
    async fn serve(&self, layer: RateLimitLayer<Header>) -> String {
        spawn_axum(app().layer(layer), true).await
    }

    async fn serve_nested(
        &self,
        outer: RateLimitLayer<Header>,
        inner: RateLimitLayer<Header>,
    ) -> String {
        let own = get(|| async { (OWN_LEGACY_HEADERS, "ok") });
        let app = app().route("/own", own).layer(inner).layer(outer);
        spawn_axum(app, true).await
    }
}

#[cfg(feature = "actix")]
#[allow(unused_imports)]
pub use self::actix::{Actix, spawn_actix};

#[cfg(feature = "actix")]
mod actix {
    use actix_web::{
        App, HttpResponse, HttpServer,
        dev::{ServiceFactory, ServiceRequest, ServiceResponse},
        web,
    };
    use redis_ratelimit::{RateLimitLayer, actix::RateLimitMiddleware, key::Header};

    use super::{OWN_LEGACY_HEADERS, Serve};

    /// Runs an actix-web server on its own thread and runtime (as actix-web
    /// does in production), with one worker; `app` builds each worker's app.
    /// The server lives until the test process exits.
    pub fn spawn_actix<F, T, B>(app: F) -> String
    where
        F: Fn() -> App<T> + Send + Clone + 'static,
        T: ServiceFactory<
                ServiceRequest,
                Config = (),
                Response = ServiceResponse<B>,
                Error = actix_web::Error,
                InitError = (),
            > + 'static,
        B: actix_web::body::MessageBody + 'static,
    {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                HttpServer::new(app)
                    .workers(1)
                    .disable_signals()
                    .listen(listener)
                    .expect("actix-web listens")
                    .run()
                    .await
            })
        });
        url
    }

    /// actix-web (the `actix` feature), for the shared scenarios.
    pub struct Actix;

    impl Serve for Actix {
        async fn serve(&self, layer: RateLimitLayer<Header>) -> String {
            let layer = RateLimitMiddleware::from(layer);
            spawn_actix(move || {
                App::new()
                    .wrap(layer.clone())
                    .route("/", web::get().to(|| async { "ok" }))
            })
        }

        async fn serve_nested(
            &self,
            outer: RateLimitLayer<Header>,
            inner: RateLimitLayer<Header>,
        ) -> String {
            let (outer, inner) = (
                RateLimitMiddleware::from(outer),
                RateLimitMiddleware::from(inner),
            );
            let own = || async {
                let mut res = HttpResponse::Ok();
                for header in OWN_LEGACY_HEADERS {
                    res.insert_header(header);
                }
                res.body("ok")
            };
            // actix-web runs the middleware wrapped last first: `outer`.
            spawn_actix(move || {
                App::new()
                    .wrap(inner.clone())
                    .wrap(outer.clone())
                    .route("/", web::get().to(|| async { "ok" }))
                    .route("/own", web::get().to(own))
            })
        }
    }
}
