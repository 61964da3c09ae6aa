//! The tower service keeps tower's readiness contract on every path: the
//! inner service is called only after its `poll_ready`, once per admitted
//! request, and a rejection leaves the service usable. The inner service is
//! `tower::limit::ConcurrencyLimit`, which panics when called without a
//! permit from `poll_ready`.

mod support;

use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use http::{Request, Response, StatusCode};
use redis_ratelimit::{RateLimitLayer, key::Global};
use support::Backend;
use tower::{Layer, Service, ServiceExt, limit::ConcurrencyLimitLayer, service_fn};

/// 3 admitted then 3 denied through one service value, sequentially, and
/// the inner service called exactly 3 times.
async fn readiness_is_kept(backend: Backend) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let mut svc = tower::ServiceBuilder::new()
        .layer(RateLimitLayer::new(backend.limiter("3/1h"), Global))
        .layer(ConcurrencyLimitLayer::new(1))
        .service(service_fn(move |_req: Request<()>| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Infallible>(Response::new("ok".to_owned())) }
        }));
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(Request::new(()))
            .await
            .unwrap();
        statuses.push(res.status());
    }
    let (ok, denied) = (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(statuses, [ok, ok, ok, denied, denied, denied]);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn memory_store_decides_in_call_and_keeps_readiness() {
    readiness_is_kept(Backend::memory()).await;
}

#[tokio::test]
async fn redis_store_decides_in_the_future_and_keeps_readiness() {
    readiness_is_kept(Backend::redis().await).await;
}

/// An inner service that counts its clones.
struct Cloned(Arc<AtomicUsize>);

impl Clone for Cloned {
    fn clone(&self) -> Self {
        self.0.fetch_add(1, Ordering::SeqCst);
        Self(self.0.clone())
    }
}

impl Service<Request<()>> for Cloned {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        std::future::ready(Ok(Response::new("ok".to_owned())))
    }
}

/// How many times the inner service is cloned over 2 admitted and 2
/// denied requests.
async fn clones_over_four_requests(backend: Backend) -> usize {
    let clones = Arc::new(AtomicUsize::new(0));
    let layer = RateLimitLayer::new(backend.limiter("2/1h"), Global);
    let mut svc = tower::Layer::layer(&layer, Cloned(clones.clone()));
    for _ in 0..4 {
        svc.ready()
            .await
            .unwrap()
            .call(Request::new(()))
            .await
            .unwrap();
    }
    clones.load(Ordering::SeqCst)
}

/// A decision known in `call` (the memory store, a cached denial) calls the
/// ready inner service in place: no clone. A decision that waits for the
/// store hands the ready service to the future and keeps a clone.
#[tokio::test]
async fn a_decision_known_in_call_clones_nothing() {
    assert_eq!(clones_over_four_requests(Backend::memory()).await, 0);
    // The admitted requests wait for Redis (a denial may come from the
    // deny cache, in call).
    let redis = clones_over_four_requests(Backend::redis().await).await;
    assert!(redis >= 2, "{redis} clones");
}

/// A tower service may be called outside a Tokio runtime and its future
/// polled inside one later: the Redis store's decision then starts on its
/// first poll (no timer or store call in `call`), and decides as usual.
#[test]
fn a_call_made_outside_a_runtime_decides_when_polled_in_one() {
    let server = support::RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let limiter = rt.block_on(server.limiter("2/1h"));
    let mut svc =
        RateLimitLayer::new(limiter, Global).layer(service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new("ok".to_owned()))
        }));
    let mut statuses = Vec::new();
    for _ in 0..3 {
        // Called here, on a thread without a runtime; polled in one.
        let response = svc.call(Request::new(()));
        statuses.push(rt.block_on(response).unwrap().status());
    }
    let (ok, denied) = (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(statuses, [ok, ok, denied]);
    rt.block_on(server.assert_every_key_has_ttl());
}

/// A layer reconfigured after it served requests (its services dropped)
/// answers with its new settings: the copies of its core made for those
/// requests are not kept (they once were, with the old settings).
#[tokio::test]
async fn a_layer_reconfigured_after_serving_answers_with_its_new_settings() {
    let ok = || service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new(())) });
    let layer = RateLimitLayer::new(Backend::memory().limiter("10/1h"), Global);
    let res = layer.layer(ok()).oneshot(Request::new(())).await.unwrap();
    assert!(
        res.headers().get("x-ratelimit-limit").is_none(),
        "off by default"
    );
    let layer = layer.legacy_headers(true);
    let res = layer.layer(ok()).oneshot(Request::new(())).await.unwrap();
    assert_eq!(
        res.headers().get("x-ratelimit-limit").map(|v| v.as_bytes()),
        Some(&b"10"[..]),
        "{res:?}"
    );
}
