//! The rate-limit layer around a handler answering "ok", called in process
//! (no sockets), so that many requests measure the limiter, not the network.

use std::convert::Infallible;

use http::{Request, Response};
use redis_ratelimit::{Limiter, OnStoreError, RateLimitLayer, key::Global};
use tower::{Service, ServiceExt, service_fn};

/// The layered service, boxed so tests can hold and clone it.
pub type Svc = tower::util::BoxCloneService<Request<()>, Response<String>, Infallible>;

/// `limiter` under `policy`, keyed by [`Global`], around "ok".
pub fn service(limiter: &Limiter, policy: OnStoreError) -> Svc {
    let layer = RateLimitLayer::new(limiter.clone(), Global).on_store_error(policy);
    let svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new("ok".to_owned()))
        }));
    tower::util::BoxCloneService::new(svc)
}

/// One `GET /` through a clone of `svc`, after `poll_ready`.
pub async fn call(svc: &Svc) -> Response<String> {
    let req = Request::get("/").body(()).unwrap();
    let mut svc = svc.clone();
    svc.ready().await.unwrap().call(req).await.unwrap()
}

/// Whether the limiter decided the request (it carries rate-limit headers,
/// admitted or denied), rather than the store-error policy.
pub fn decided(res: &Response<String>) -> bool {
    res.headers().contains_key("ratelimit")
}
