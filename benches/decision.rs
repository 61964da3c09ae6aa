//! What one request costs the server, without a network or Redis:
//!
//! * `check`: [`Limiter::check`] with the in-memory store, allowed (over
//!   many keys) and denied (one spent key);
//! * `layer`: a bare `tower::service_fn` next to the same service behind
//!   [`RateLimitLayer`] (memory store, `key::Header`), so their ratio is the
//!   layer's overhead;
//! * `two_threads`: the same, with two threads sending through one layer at
//!   once, as a server's two workers do: what the layer's shared state
//!   (reference counts, the store's lock and lines) costs when cores take
//!   turns writing it. A time is one thread's per request (both run at once).
//!
//! Header writing is in `headers.rs`, key extraction in `keys.rs` and a
//! decision against a real Redis in `redis.rs`.
//!
//! Run with `cargo bench --bench decision`; each benchmark takes about 4 s.

use std::{convert::Infallible, time::Duration};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use http::{HeaderName, HeaderValue, Request, Response};
use redis_ratelimit::{Limiter, Quota, RateLimitLayer, key};
use tokio::runtime::Runtime;
use tower::{Layer, ServiceExt, service_fn};

/// Distinct client keys the allowed paths rotate through.
const KEYS: usize = 10_000;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime")
}

/// A quota no benchmark run can exhaust.
fn roomy() -> Quota {
    Quota::new(1 << 40, Duration::from_secs(3600)).expect("a valid quota")
}

fn check(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("check");

    let limiter = Limiter::new(roomy());
    let keys: Vec<String> = (0..KEYS).map(|i| format!("client-{i}")).collect();
    let mut i = 0;
    group.bench_function("allowed_10k_keys", |b| {
        b.to_async(&rt).iter(|| {
            i = (i + 1) % KEYS;
            limiter.check(&keys[i], 1)
        })
    });

    let limiter = Limiter::new(Quota::per_hour(1));
    let spent = rt.block_on(limiter.check("hot", 1)).expect("memory store");
    assert!(spent.is_allowed());
    let denied = rt.block_on(limiter.check("hot", 1)).expect("memory store");
    assert!(!denied.is_allowed());
    group.bench_function("denied_one_key", |b| {
        b.to_async(&rt).iter(|| limiter.check("hot", 1))
    });
    group.finish();
}

fn layer(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("layer");

    let bare = service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::from("ok")))
    });
    let api_key = HeaderName::from_static("x-api-key");
    let limited = |quota| {
        RateLimitLayer::new(Limiter::new(quota), key::Header::from_name(api_key.clone()))
            .layer(bare)
    };
    let allowing = limited(roomy());
    let denying = limited(Quota::per_hour(1));

    let values: Vec<HeaderValue> = (0..KEYS)
        .map(|i| HeaderValue::try_from(format!("key-{i}")).expect("a header value"))
        .collect();
    let mut i = 0;
    // Building the request is setup, outside the measured time.
    let request = |value: &HeaderValue| {
        let mut req = Request::new(());
        req.headers_mut().insert(api_key.clone(), value.clone());
        req
    };

    let res = rt.block_on(allowing.clone().oneshot(request(&values[0])));
    assert!(res.is_ok_and(|r| r.status() == 200 && r.headers().contains_key("ratelimit")));
    let hot = HeaderValue::from_static("hot");
    let _ = rt.block_on(denying.clone().oneshot(request(&hot)));
    let res = rt.block_on(denying.clone().oneshot(request(&hot)));
    assert!(res.is_ok_and(|r| r.status() == 429));

    group.bench_function("bare_service", |b| {
        b.to_async(&rt).iter_batched(
            || request(&values[0]),
            |req| bare.oneshot(req),
            BatchSize::SmallInput,
        )
    });
    group.bench_function("rate_limited_allowed_10k_keys", |b| {
        b.to_async(&rt).iter_batched(
            || {
                i = (i + 1) % KEYS;
                request(&values[i])
            },
            |req| allowing.clone().oneshot(req),
            BatchSize::SmallInput,
        )
    });
    group.bench_function("rate_limited_denied_429", |b| {
        b.to_async(&rt).iter_batched(
            || request(&hot),
            |req| denying.clone().oneshot(req),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("two_threads");
    let bare = service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::from("ok")))
    });
    let api_key = HeaderName::from_static("x-api-key");
    let allowing = RateLimitLayer::new(
        Limiter::new(roomy()),
        key::Header::from_name(api_key.clone()),
    )
    .layer(bare);
    let values: Vec<HeaderValue> = (0..KEYS)
        .map(|i| HeaderValue::try_from(format!("key-{i}")).expect("a header value"))
        .collect();
    // Each thread sends `iters` requests through its clone of `svc` (a
    // clone a request, as hyper makes), on keys of its own turn; the time
    // is the slower thread's.
    fn both<S>(svc: &S, values: &[HeaderValue], api_key: &HeaderName, iters: u64) -> Duration
    where
        S: tower::Service<Request<()>> + Clone + Send + 'static,
        S::Future: Send,
    {
        std::thread::scope(|scope| {
            let run = |first: usize| {
                let svc = svc.clone();
                scope.spawn(move || {
                    runtime().block_on(async {
                        let start = std::time::Instant::now();
                        for n in 0..iters as usize {
                            let mut req = Request::new(());
                            let value = values[(first + n) % values.len()].clone();
                            req.headers_mut().insert(api_key.clone(), value);
                            let _ = svc.clone().oneshot(req).await;
                        }
                        start.elapsed()
                    })
                })
            };
            let (a, b) = (run(0), run(values.len() / 2));
            let a = a.join().expect("a thread of the benchmark");
            let b = b.join().expect("a thread of the benchmark");
            a.max(b)
        })
    }
    group.bench_function("bare_service", |b| {
        b.iter_custom(|iters| both(&bare, &values, &api_key, iters))
    });
    group.bench_function("rate_limited_allowed_10k_keys", |b| {
        b.iter_custom(|iters| both(&allowing, &values, &api_key, iters))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = check, layer, two_threads
}
criterion_main!(benches);
