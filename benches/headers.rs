//! Writing the rate-limit headers of a response: [`Decision::write_headers`]
//! into a fresh `HeaderMap`, as the layer does for every request.
//!
//! * `headers/allowed`: `RateLimit-Policy` and `RateLimit`;
//! * `headers/denied`: the same plus `Retry-After`;
//! * `headers/allowed_three_limits`: a limiter with three named limits, whose
//!   policy header lists all three.
//!
//! The first two keep the names they had in `decision.rs`, so earlier
//! figures stay comparable. Run with `cargo bench --bench headers`.

use std::{hint::black_box, time::Duration};

use criterion::{Criterion, criterion_group, criterion_main};
use http::HeaderMap;
use redis_ratelimit::{Decision, Limiter, Quota};
use tokio::runtime::Runtime;

fn decide(rt: &Runtime, limiter: &Limiter, key: &str, cost: u64) -> Decision {
    rt.block_on(limiter.check(key, cost)).expect("memory store")
}

fn headers(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime");
    let one = Limiter::new(Quota::per_minute(100));
    let allowed = decide(&rt, &one, "a", 100);
    let denied = decide(&rt, &one, "a", 100);
    assert!(allowed.is_allowed() && !denied.is_allowed());

    let three = Limiter::builder(Quota::per_second(10))
        .name("per-second")
        .limit("per-hour", Quota::per_hour(1000))
        .limit("per-day", Quota::per_day(10_000))
        .build()
        .expect("three valid limits");
    let allowed_three = decide(&rt, &three, "a", 1);
    assert!(allowed_three.is_allowed() && allowed_three.limits().count() == 3);

    let mut group = c.benchmark_group("headers");
    let cases = [
        ("allowed", &allowed),
        ("denied", &denied),
        ("allowed_three_limits", &allowed_three),
    ];
    for (name, decision) in cases {
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut headers = HeaderMap::new();
                black_box(decision).write_headers(&mut headers);
                headers
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = headers
}
criterion_main!(benches);
