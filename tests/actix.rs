//! The actix-web middleware end to end: the shared HTTP scenarios (the same
//! code the tower tests run), actix-specific keys and responses, and parity
//! with the tower layer. Real redis-server per test.

mod support;

use actix_web::{
    App, HttpResponse,
    dev::{ServiceRequest, ServiceResponse},
    error::ErrorServiceUnavailable,
    web,
};
use redis_ratelimit::{
    Tiers,
    actix::RateLimitMiddleware,
    key::{self, Key, PeerIp},
    refund::Refund,
    skip::Networks,
};
use support::{
    Backend,
    http::{Caller, Reply, get_forwarded, get_with},
    scenarios::{self, exact_count, log},
    servers::{Actix, Axum, spawn_actix},
};

#[tokio::test]
async fn actix_with_redis_admits_exactly_the_quota() {
    scenarios::exact_count_by_key(&Actix, &Backend::redis().await).await;
}

#[tokio::test]
async fn actix_with_redis_pool_admits_exactly_the_quota() {
    scenarios::exact_count_by_key(&Actix, &Backend::redis_pool().await).await;
}

#[tokio::test]
async fn actix_with_memory_store_admits_exactly_the_quota() {
    scenarios::exact_count_by_key(&Actix, &Backend::memory()).await;
}

#[tokio::test]
async fn actix_window_reopens_after_its_reset() {
    scenarios::window_reopens(&Actix, &Backend::redis().await).await;
}

#[tokio::test]
async fn actix_header_values() {
    scenarios::header_values(&Actix, &Backend::redis().await).await;
}

#[tokio::test]
async fn actix_nested_middlewares_legacy_headers_are_the_tightest_limits() {
    scenarios::nested_legacy_headers(&Actix, &Backend::memory()).await;
}

#[tokio::test]
async fn actix_requests_without_a_key_are_refused() {
    scenarios::missing_key_is_refused(&Actix, &Backend::redis().await).await;
}

#[tokio::test]
async fn actix_partition_key_is_opt_in_stable_and_opaque() {
    scenarios::partition_key(&Actix, &Backend::redis().await).await;
}

#[tokio::test]
async fn actix_default_answers_have_text_or_problem_details_bodies() {
    scenarios::default_answers(&Actix, &Backend::redis().await).await;
}

#[tokio::test]
async fn actix_concurrent_requests_admit_exactly_the_limit() {
    scenarios::concurrent_requests_admit_exactly_the_limit(&Actix, 1).await;
}

#[tokio::test]
async fn actix_two_servers_sharing_redis_admit_exactly_the_limit() {
    scenarios::concurrent_requests_admit_exactly_the_limit(&Actix, 2).await;
}

#[tokio::test]
async fn actix_script_flush_is_invisible() {
    scenarios::script_flush_is_invisible(&Actix, &Backend::redis().await).await;
}

#[tokio::test]
async fn actix_redis_killed_and_restarted() {
    scenarios::redis_killed_and_restarted(&Actix).await;
}

#[tokio::test]
async fn actix_keyed_by_peer_ip() {
    let b = Backend::redis().await;
    let layer = RateLimitMiddleware::new(b.limiter("5/10s"), PeerIp);
    let url = spawn_actix(move || {
        App::new()
            .wrap(layer.clone())
            .route("/", web::get().to(|| async { "ok" }))
    });
    let a = Caller::from_ip([127, 0, 0, 1]);
    let other = Caller::from_ip([127, 0, 0, 2]);
    exact_count(&b, &url, &a, &other).await;
}

#[tokio::test]
async fn actix_scope_wrap_limits_only_the_scope_with_a_closure_key_and_custom_body() {
    const JSON: &str = r#"{"error":"rate limited"}"#;
    let b = Backend::redis().await;
    // Keyed by path: every caller shares the /api count.
    let by_path = key::from_fn(|req: &ServiceRequest| Ok(Key::from(req.path().to_owned())));
    // The responder's argument needs no type: the middleware's bound says it.
    let layer = RateLimitMiddleware::new(b.limiter("2/1m"), by_path).respond_with(|r| {
        let status = actix_web::http::StatusCode::from_u16(r.status().as_u16()).unwrap();
        HttpResponse::build(status)
            .content_type("application/json")
            .body(JSON)
    });
    let url = spawn_actix(move || {
        App::new()
            .service(
                web::scope("/api")
                    .wrap(layer.clone())
                    .route("/x", web::get().to(|| async { "ok" })),
            )
            .route("/free", web::get().to(|| async { "ok" }))
    });
    let (one, two) = (Caller::with_key(Some("1")), Caller::with_key(Some("2")));
    let api = format!("{url}/api/x");
    one.get(&api).await.expect(200, &log(&b));
    two.get(&api).await.expect(200, &log(&b));
    let res = one.get(&api).await.expect(429, &log(&b));
    assert_eq!(res.body, JSON);
    assert_eq!(res.header("content-type"), Some("application/json"));
    assert!((55..=60).contains(&res.int("retry-after")), "{res:?}");
    assert_eq!(
        res.header("ratelimit-policy"),
        Some(r#""default";q=2;w=60"#)
    );
    for res in one.get_n(&format!("{url}/free"), 3).await {
        let res = res.expect(200, &log(&b));
        assert!(!res.has_ratelimit_headers(), "{res:?}");
    }
}

/// Seconds-to-reset values may differ by one between two runs that straddle
/// a second boundary; everything else must be identical.
fn split_seconds(r: &Reply) -> (Vec<(&'static str, Vec<String>)>, Vec<u64>) {
    let mut secs = Vec::new();
    let mut headers = r.rate_limit_headers();
    for (name, values) in &mut headers {
        for v in values.iter_mut() {
            if matches!(*name, "retry-after" | "x-ratelimit-reset") {
                secs.push(v.parse().unwrap());
                *v = "<secs>".into();
            } else if *name == "ratelimit" {
                let (rest, t) = v.rsplit_once(";t=").unwrap();
                secs.push(t.parse().unwrap());
                *v = format!("{rest};t=<secs>");
            }
        }
    }
    (headers, secs)
}

#[tokio::test]
async fn actix_and_tower_answer_the_same_sequence_identically() {
    let (tower_store, actix_store) = (Backend::redis().await, Backend::redis().await);
    let tower = scenarios::parity_sequence(&Axum, &tower_store).await;
    let actix = scenarios::parity_sequence(&Actix, &actix_store).await;
    let statuses = |r: &[Reply]| r.iter().map(|r| r.status.as_u16()).collect::<Vec<_>>();
    assert_eq!(
        statuses(&tower),
        [200, 200, 200, 429, 429, 200, 200, 400, 429]
    );
    assert_eq!(statuses(&tower), statuses(&actix));
    for (i, (t, a)) in tower.iter().zip(&actix).enumerate() {
        let ((t_headers, t_secs), (a_headers, a_secs)) = (split_seconds(t), split_seconds(a));
        assert_eq!(t_headers, a_headers, "request {i}: {t:?}\n{a:?}");
        assert_eq!(t_secs.len(), a_secs.len(), "request {i}");
        for (ts, as_) in t_secs.iter().zip(&a_secs) {
            assert!(ts.abs_diff(*as_) <= 1, "request {i}: {t:?}\n{a:?}");
            assert!((3598..=3600).contains(ts), "request {i}: {t:?}");
        }
        // "... retry in 3600 s" may straddle a second as well.
        let body = |r: &Reply| match r.body.rsplit_once("retry in ") {
            Some((head, _)) => format!("{head}retry in <secs>"),
            None => r.body.clone(),
        };
        assert_eq!(body(t), body(a), "request {i}");
        if t.status != 200 {
            assert_eq!(t.header("content-type"), a.header("content-type"), "{i}");
        }
    }
}

/// An actix app with `GET /` and `GET /status/{code}` behind `layer`.
fn spawn_status_app<K, R>(layer: RateLimitMiddleware<K, R>) -> String
where
    K: redis_ratelimit::KeyExtractor<ServiceRequest>,
    R: redis_ratelimit::Respond<HttpResponse>,
{
    spawn_actix(move || {
        App::new()
            .wrap(layer.clone())
            .route("/", web::get().to(|| async { "ok" }))
            .route(
                "/status/{code}",
                web::get().to(|code: web::Path<u16>| async move {
                    HttpResponse::new(actix_web::http::StatusCode::from_u16(*code).unwrap())
                }),
            )
    })
}

async fn actix_tiers(b: Backend) {
    let named = |q: &str, n: &str| b.builder(q).name(n).build().unwrap();
    let tiers = Tiers::new(b.limiter("1/60s")).tier(named("3/60s", "pro"));
    let layer = RateLimitMiddleware::tiered(
        tiers,
        key::Header::new("x-plan"),
        key::Header::new("x-api-key"),
    );
    let url = format!("{}/", spawn_status_app(layer));
    let client = Caller::with_key(None).client();
    let get = |plan: Option<&'static str>| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let mut h = vec![("x-api-key", "k")];
            h.extend(plan.map(|p| ("x-plan", p)));
            get_with(&client, &url, &h).await
        }
    };
    let pro = get(Some("pro")).await;
    assert_eq!(
        pro.header("ratelimit-policy"),
        Some(r#""pro";q=3;w=60"#),
        "{pro:?}"
    );
    assert_eq!(
        pro.header("ratelimit"),
        Some(r#""pro";r=2;t=60"#),
        "{pro:?}"
    );
    assert_eq!(get(None).await.status, 200);
    let unknown = get(Some("gold")).await;
    assert_eq!(unknown.status, 429, "{unknown:?}");
    assert_eq!(
        unknown.header("ratelimit-policy"),
        Some(r#""default";q=1;w=60"#)
    );
    assert_eq!(
        get(Some("pro")).await.header("ratelimit"),
        Some(r#""pro";r=1;t=60"#)
    );
}

async fn actix_skip(b: Backend) {
    let client_ip = key::ClientIp::new().trust("127.0.0.5").unwrap();
    let internal = Networks::new(client_ip.clone(), "10.0.0.0/8, 127.0.0.7").unwrap();
    let layer = RateLimitMiddleware::new(b.limiter("1/60s"), client_ip)
        .skip_networks(internal)
        .skip(|req| req.path() == "/status/204");
    let url = spawn_status_app(layer);
    if let Some(s) = b.server() {
        s.reset_stats().await;
    }
    let get = |ip, xff: &'static str, path: &'static str| {
        let url = format!("{url}{path}");
        async move { get_forwarded(ip, &url, xff).await }
    };
    for _ in 0..3 {
        for r in [
            get([127, 0, 0, 5], "10.9.9.9", "/").await,
            get([127, 0, 0, 7], "203.0.113.1", "/").await,
            get([127, 0, 0, 8], "10.9.9.9", "/status/204").await,
        ] {
            assert!(r.status.is_success(), "{r:?}");
            assert!(!r.has_ratelimit_headers(), "{r:?}");
        }
    }
    if let Backend::Memory(m) = &b {
        assert_eq!(m.len(), 0);
    }
    if let Some(s) = b.server() {
        assert_eq!(s.script_calls().await, 0, "{}", s.log());
    }
    // An untrusted peer's header is not read.
    let spoofed = [
        get([127, 0, 0, 6], "10.9.9.9", "/").await.status.as_u16(),
        get([127, 0, 0, 6], "10.9.9.9", "/").await.status.as_u16(),
    ];
    assert_eq!(spoofed, [200, 429]);
}

/// Waits (10 s at most) until `key` has `remaining` units left in
/// `limiter`: a refund, which lands after the response, has landed.
async fn refunded(limiter: &redis_ratelimit::Limiter, key: &str, remaining: u64) {
    let wait = async {
        while limiter.peek(key, 1).await.unwrap().remaining() != remaining {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), wait)
        .await
        .unwrap_or_else(|_| panic!("no refund landed: {key} never had {remaining} left"));
}

/// Server errors are refunded, each its whole cost (2 units here, of 4).
async fn actix_refunds(b: Backend) {
    let limiter = b.limiter("4/60s");
    let layer = RateLimitMiddleware::new(limiter.clone(), key::Header::new("x-api-key"))
        .refund_when(Refund::ServerErrors)
        .cost(|_| 2);
    let url = spawn_status_app(layer);
    let caller = Caller::with_key(Some("k"));
    for _ in 0..4 {
        let r = caller.get(&format!("{url}/status/500")).await;
        assert_eq!(r.status, 500, "{r:?}");
        refunded(&limiter, "k", 4).await;
    }
    let after = caller.statuses(&format!("{url}/status/404"), 3).await;
    assert_eq!(after, [404, 404, 429]);
}

/// With tiers, a refund goes back to the limiter of the tier that spent
/// (a pro request's to `pro`, not to the default), as under tower.
async fn actix_a_tier_is_refunded_in_its_own_limiter(b: Backend) {
    let pro = b.builder("2/60s").name("pro").build().unwrap();
    let default = b.limiter("1/60s");
    let tiers = Tiers::new(default.clone()).tier(pro.clone());
    let layer = RateLimitMiddleware::tiered(
        tiers,
        key::Header::new("x-plan"),
        key::Header::new("x-api-key"),
    )
    .refund_when(Refund::ServerErrors);
    let url = spawn_status_app(layer);
    let client = Caller::with_key(None).client();
    let headers = [("x-api-key", "k"), ("x-plan", "pro")];
    for _ in 0..4 {
        let r = get_with(&client, &format!("{url}/status/500"), &headers).await;
        assert_eq!(r.status, 500, "{r:?}");
        assert_eq!(
            r.header("ratelimit-policy"),
            Some(r#""pro";q=2;w=60"#),
            "{r:?}"
        );
        refunded(&pro, "k", 2).await;
    }
    // The default tier was neither charged nor credited.
    assert_eq!(default.peek("k", 1).await.unwrap().remaining(), 1);
    let after: Vec<u16> = [
        get_with(&client, &format!("{url}/status/404"), &headers).await,
        get_with(&client, &format!("{url}/status/404"), &headers).await,
        get_with(&client, &format!("{url}/status/404"), &headers).await,
    ]
    .iter()
    .map(|r| r.status.as_u16())
    .collect();
    assert_eq!(after, [404, 404, 429]);
}

/// An inner service's `Err` (here a `wrap_fn`'s, as actix-web-httpauth's
/// 401 or actix-cors's refusal are) is the answer the client gets: a 503,
/// refunded as a 503 response is and carrying the rate-limit headers, as
/// under tower. Without refunds it is charged: the third request is 429.
async fn actix_inner_errors_are_settled_as_their_answers(b: Backend) {
    let limiter = b.limiter("2/60s");
    for (key, refunds) in [("refunded", true), ("charged", false)] {
        let layer = RateLimitMiddleware::new(limiter.clone(), key::Header::new("x-api-key"));
        let layer = match refunds {
            true => layer.refund_when(Refund::ServerErrors),
            false => layer,
        };
        let url = spawn_actix(move || {
            App::new()
                .wrap_fn(|_, _| async {
                    Err::<ServiceResponse, _>(ErrorServiceUnavailable("down"))
                })
                .wrap(layer.clone())
        });
        let caller = Caller::with_key(Some(key));
        let mut statuses = Vec::new();
        for _ in 0..4 {
            let r = caller.get(&url).await;
            statuses.push(r.status.as_u16());
            if r.status == 503 {
                assert!(r.header("ratelimit").is_some(), "{key}: {r:?}");
                assert_eq!(r.header("ratelimit-policy"), Some(r#""default";q=2;w=60"#));
                assert_eq!(r.body, "down", "{key}: the inner error's own body");
            }
            if refunds {
                let wait = async {
                    while limiter.peek(key, 1).await.unwrap().remaining() != 2 {
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    }
                };
                tokio::time::timeout(std::time::Duration::from_secs(10), wait)
                    .await
                    .expect("the refund landed");
            }
        }
        let expected: &[u16] = match refunds {
            true => &[503, 503, 503, 503],
            false => &[503, 503, 429, 429],
        };
        assert_eq!(statuses, expected, "{key}");
    }
}

/// To the middlewares outside, an inner service's error is still an `Err`,
/// as actix-web's own middlewares pass errors on: with the inner error's
/// status, its `InnerError::cause` the inner error itself, and its response
/// carrying the rate-limit headers however often it is built.
#[tokio::test]
async fn actix_passes_an_inner_error_on_as_an_error() {
    use actix_web::{error::InternalError, test};
    use redis_ratelimit::{Limiter, Quota, actix::InnerError, key::Global};

    let limiter = Limiter::new(Quota::per_minute(2));
    let app = test::init_service(
        App::new()
            .wrap_fn(|_, _| async { Err::<ServiceResponse, _>(ErrorServiceUnavailable("down")) })
            .wrap(RateLimitMiddleware::new(limiter, Global)),
    )
    .await;
    let req = test::TestRequest::get().uri("/").to_request();
    let Err(err) = test::try_call_service(&app, req).await else {
        panic!("the inner error became a response");
    };
    assert_eq!(err.as_response_error().status_code(), 503);
    let inner = err.as_error::<InnerError>().expect("an InnerError").cause();
    assert!(
        inner.as_error::<InternalError<&str>>().is_some(),
        "{inner:?}"
    );
    assert_eq!(err.to_string(), "down");
    for _ in 0..2 {
        let res = err.error_response();
        assert_eq!(res.status(), 503);
        let ratelimit = res.headers().get("ratelimit").map(|v| v.to_str().unwrap());
        assert_eq!(ratelimit, Some(r#""default";r=1;t=60"#));
    }
}

/// An inner error whose response can be built once only
/// (`InternalError::from_response`, a common way to answer 401) reaches the
/// client as that response, with the rate-limit headers. Settling it took
/// the response, and the client got an empty 500.
#[tokio::test]
async fn actix_an_inner_error_built_once_reaches_the_client_whole() {
    use actix_web::{HttpResponse, error::InternalError, test};
    use redis_ratelimit::{Limiter, Quota, key::Global};

    let limiter = Limiter::new(Quota::per_minute(2));
    let app = test::init_service(
        App::new()
            .wrap_fn(|_, _| async {
                let res = HttpResponse::Unauthorized().body("who are you");
                Err::<ServiceResponse, _>(InternalError::from_response("no", res).into())
            })
            .wrap(RateLimitMiddleware::new(limiter, Global)),
    )
    .await;
    let req = test::TestRequest::get().uri("/").to_request();
    let Err(err) = test::try_call_service(&app, req).await else {
        panic!("the inner error became a response");
    };
    // What actix-web's dispatcher sends for an `Err`.
    assert_eq!(err.as_response_error().status_code(), 401);
    let res = err.error_response();
    assert_eq!(res.status(), 401);
    assert!(res.headers().contains_key("ratelimit"), "{res:?}");
    let body = actix_web::body::to_bytes(res.into_body()).await.unwrap();
    assert_eq!(&body[..], b"who are you");
}

/// `RateLimitMiddleware::each` keys each limit by its own extractor: 2 a
/// minute per API key, 3 a minute for everyone (`Global`). A third call
/// of one key is denied by its own limit, and a fourth key's first call by
/// the shared one, each 429 naming its limit.
async fn actix_each(b: Backend) {
    let limiter = b
        .builder("2/60s")
        .name("per-key")
        .limit("everyone", redis_ratelimit::Quota::per_minute(3))
        .build()
        .unwrap();
    let layer = RateLimitMiddleware::each(limiter, (key::Header::new("x-api-key"), key::Global));
    let url = format!("{}/", spawn_status_app(layer));
    let a = Caller::with_key(Some("a"));
    assert_eq!(a.statuses(&url, 2).await, [200, 200]);
    let denied = a.get(&url).await.expect(429, &log(&b));
    assert!(
        denied
            .header("ratelimit")
            .unwrap()
            .starts_with(r#""per-key";r=0"#),
        "{denied:?}"
    );
    Caller::with_key(Some("b"))
        .get(&url)
        .await
        .expect(200, &log(&b));
    let denied = Caller::with_key(Some("c"))
        .get(&url)
        .await
        .expect(429, &log(&b));
    assert!(
        denied
            .header("ratelimit")
            .unwrap()
            .starts_with(r#""everyone";r=0"#),
        "{denied:?}"
    );
}

/// With every limit in shadow, the actix middleware denies nothing: a
/// request without its key and one over the limit both pass, the second
/// carrying the headers of the denial it would have been.
async fn actix_shadow(b: Backend) {
    let limiter = b.builder("1/60s").shadow(true).build().unwrap();
    let layer = RateLimitMiddleware::new(limiter, key::Header::new("x-api-key"));
    let url = format!("{}/", spawn_status_app(layer));
    let keyless = Caller::with_key(None).get(&url).await.expect(200, &log(&b));
    assert!(!keyless.has_ratelimit_headers(), "{keyless:?}");
    let a = Caller::with_key(Some("a"));
    a.get(&url).await.expect(200, &log(&b));
    let over = a.get(&url).await.expect(200, &log(&b));
    assert_eq!(over.ratelimit("r"), 0, "{over:?}");
}

support::for_every_store!(
    actix_shadow,
    actix_each,
    actix_tiers,
    actix_skip,
    actix_refunds,
    actix_a_tier_is_refunded_in_its_own_limiter,
    actix_inner_errors_are_settled_as_their_answers
);

/// The actix middleware checks keys per limit against every tier as the
/// tower layer does (one check, `core::assert_keys_fit`).
#[test]
#[should_panic(expected = "RateLimitMiddleware::tiered: the extractor gives 2 keys per request")]
fn actix_keys_per_limit_must_fit_every_tier() {
    let _ = RateLimitMiddleware::tiered(
        support::limits::tiers_of_two_limits_and_one(),
        key::Header::new("x-plan"),
        key::each((key::Header::new("x-api-key"), key::Global)),
    );
}

/// A limited gRPC call (a `POST` of `application/grpc` with `te: trailers`)
/// gets the same trailers-only answer from both adapters: HTTP 200 with
/// `grpc-status` 8 `RESOURCE_EXHAUSTED`, not a 429, which a gRPC client
/// reads as `UNAVAILABLE` and retries.
#[tokio::test]
async fn actix_and_tower_answer_a_limited_grpc_call_alike() {
    use http_body_util::Full;
    use redis_ratelimit::{Limiter, Quota, RateLimitLayer, key::Global};
    use tower::{Layer, ServiceExt, service_fn};

    // Either adapter's headers (http 1's types or actix-web's), as text.
    fn pairs<'a>(headers: impl Iterator<Item = (&'a str, &'a [u8])>) -> Vec<(String, String)> {
        let text = |v| String::from_utf8_lossy(v).into_owned();
        headers.map(|(n, v)| (n.to_owned(), text(v))).collect()
    }
    let limiter = || Limiter::builder(Quota::per_minute(1)).build().unwrap();
    let grpc = [("content-type", "application/grpc"), ("te", "trailers")];

    let tower = RateLimitLayer::new(limiter(), Global).layer(service_fn(|_| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Full::<bytes::Bytes>::default()))
    }));
    let mut tower_answers = Vec::new();
    for _ in 0..2 {
        let mut req = http::Request::post("/");
        for (name, value) in grpc {
            req = req.header(name, value);
        }
        let req = req.body(Full::<bytes::Bytes>::default()).unwrap();
        let res = tower.clone().oneshot(req).await.unwrap();
        let headers = res
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_bytes()));
        tower_answers.push((res.status().as_u16(), pairs(headers)));
    }

    let app = actix_web::test::init_service(
        App::new()
            .wrap(RateLimitMiddleware::new(limiter(), Global))
            .route("/", web::post().to(HttpResponse::Ok)),
    )
    .await;
    let mut actix_answers = Vec::new();
    for _ in 0..2 {
        let mut req = actix_web::test::TestRequest::post().uri("/");
        for header in grpc {
            req = req.insert_header(header);
        }
        let res = actix_web::test::call_service(&app, req.to_request()).await;
        let headers = res
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_bytes()));
        actix_answers.push((res.status().as_u16(), pairs(headers)));
    }

    let grpc_headers = |answer: &(u16, Vec<(String, String)>)| {
        let mut h: Vec<(String, String)> = answer
            .1
            .iter()
            .filter(|(n, _)| n.starts_with("grpc-") || n == "content-type")
            // Milliseconds left: the two runs are a moment apart.
            .map(|(n, v)| match n.as_str() {
                "grpc-retry-pushback-ms" => (n.clone(), "<ms>".into()),
                _ => (n.clone(), v.clone()),
            })
            .collect();
        h.sort();
        h
    };
    let pushback = |answer: &(u16, Vec<(String, String)>)| {
        let (_, ms) = answer
            .1
            .iter()
            .find(|(n, _)| n == "grpc-retry-pushback-ms")?;
        ms.parse::<u64>().ok()
    };
    let denied = &tower_answers[1];
    assert_eq!(denied.0, 200, "{denied:?}");
    assert!(
        grpc_headers(denied).contains(&("grpc-status".into(), "8".into())),
        "{denied:?}"
    );
    for (t, a) in tower_answers.iter().zip(&actix_answers) {
        assert_eq!(t.0, a.0, "{t:?}\n{a:?}");
        assert_eq!(grpc_headers(t), grpc_headers(a), "{t:?}\n{a:?}");
    }
    let (t, a) = (
        pushback(denied).unwrap(),
        pushback(&actix_answers[1]).unwrap(),
    );
    assert!(
        (59_000..=60_000).contains(&t) && t.abs_diff(a) <= 1000,
        "{t} {a}"
    );
}

/// As under tower, only a gRPC or gRPC-Web call (a `POST` of a gRPC
/// `content-type`) is judged by its `grpc-status`: a `GET` answered with
/// a gRPC-Web type and `grpc-status: 13` at its head is a 200, charged.
/// Before, it was refunded as a failed call.
#[tokio::test]
async fn actix_judges_only_a_grpc_call_by_its_grpc_status() {
    use redis_ratelimit::{Limiter, Quota, key::Global};

    let limiter = Limiter::builder(Quota::per_minute(5)).build().unwrap();
    let middleware =
        RateLimitMiddleware::new(limiter.clone(), Global).refund_when(Refund::ServerErrors);
    let app = actix_web::test::init_service(App::new().wrap(middleware).default_service(web::to(
        || async {
            HttpResponse::Ok()
                .content_type("application/grpc-web+proto")
                .insert_header(("grpc-status", "13"))
                .finish()
        },
    )))
    .await;
    let web = ("content-type", "application/grpc-web+proto");
    let requests = [
        (actix_web::test::TestRequest::get().insert_header(web), 4),
        (actix_web::test::TestRequest::post(), 3),
        (actix_web::test::TestRequest::post().insert_header(web), 3),
    ];
    for (i, (req, left)) in requests.into_iter().enumerate() {
        let res = actix_web::test::call_service(&app, req.uri("/").to_request()).await;
        assert_eq!(res.status(), 200);
        let _ = actix_web::test::read_body(res).await;
        assert_eq!(
            limiter.peek("global", 1).await.unwrap().remaining(),
            left,
            "request {i}"
        );
    }
}

/// actix-web has no trailers, so a gRPC or gRPC-Web answer whose
/// `grpc-status` is not at its head (in the trailers, or gRPC-Web's trailer
/// frame) is never refunded there: it stays charged, and a warning says so
/// once per middleware, as the tower layer's does without a `TrailersLayer`.
#[tokio::test]
async fn actix_never_refunds_a_status_it_cannot_read_and_says_so_once() {
    use redis_ratelimit::{Limiter, Quota, key::Global};
    use support::logs::Captured;

    let captured = Captured::default();
    let guard = captured.install();
    let limiter = Limiter::builder(Quota::per_minute(5)).build().unwrap();
    let middleware =
        RateLimitMiddleware::new(limiter.clone(), Global).refund_when(Refund::Successes);
    let app = actix_web::test::init_service(App::new().wrap(middleware).route(
        "/",
        web::post().to(|| async {
            HttpResponse::Ok()
                .content_type("application/grpc-web+proto")
                .body(&b"\x80\x00\x00\x00\x0fgrpc-status:0\r\n"[..])
        }),
    ))
    .await;
    for _ in 0..3 {
        let req = actix_web::test::TestRequest::post()
            .uri("/")
            .insert_header(("content-type", "application/grpc-web+proto"))
            .to_request();
        let res = actix_web::test::call_service(&app, req).await;
        assert_eq!(res.status(), 200);
        let _ = actix_web::test::read_body(res).await;
    }
    // A refund would be a task on this runtime: give it time to land.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    drop(guard);
    assert_eq!(limiter.peek("global", 1).await.unwrap().remaining(), 2);
    let warnings = captured.warning_lines();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("refund::TrailersLayer"),
        "{warnings:?}"
    );
}

/// A gRPC-Web call answered with a trailers-only gRPC answer (by a custom
/// responder: actix-web's default answers gRPC-Web with a 429) gets the
/// call's own gRPC-Web content type, through the code the tower layer uses.
#[tokio::test]
async fn actix_gives_a_grpc_answer_to_a_grpc_web_call_its_type() {
    use redis_ratelimit::{Limiter, Quota, key::Global};

    let limiter = Limiter::builder(Quota::per_minute(1)).build().unwrap();
    let grpc_only = RateLimitMiddleware::new(limiter, Global).respond_with(|r| {
        HttpResponse::Ok()
            .insert_header(("content-type", "application/grpc"))
            .insert_header(("grpc-status", r.grpc_code().to_string()))
            .finish()
    });
    let app = actix_web::test::init_service(
        App::new()
            .wrap(grpc_only)
            .route("/", web::post().to(HttpResponse::Ok)),
    )
    .await;
    let call = |content_type: &'static str| {
        let req = actix_web::test::TestRequest::post().uri("/");
        req.insert_header(("content-type", content_type))
            .to_request()
    };
    let res = actix_web::test::call_service(&app, call("application/grpc-web-text+proto")).await;
    assert_eq!(res.status(), 200, "served");
    for (request, answer) in [
        (
            "application/grpc-web-text+proto",
            "application/grpc-web-text+proto",
        ),
        ("application/grpc-web", "application/grpc-web"),
        ("application/grpc", "application/grpc"),
    ] {
        let res = actix_web::test::call_service(&app, call(request)).await;
        assert_eq!(res.status(), 200, "{request}");
        let header = |name: &str| res.headers().get(name).map(|v| v.to_str().unwrap());
        assert_eq!(header("grpc-status"), Some("8"), "{request}");
        assert_eq!(header("content-type"), Some(answer), "{request}");
    }
}
