//! Tiers over real HTTP: a header picks the tier, a request without it or
//! naming no tier gets the default, the headers show the tier's own policy,
//! and every tier counts on its own; on the memory store and on Redis.

mod support;

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use redis_ratelimit::{
    Limiter, RateLimitLayer, Tiers,
    key::{self, Global, Header},
    tier::Tiered,
};
use support::{
    Backend,
    http::{Reply, get_with},
    servers::{app, spawn_axum},
};

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// Tiers `free` (2/60s) and `pro` (4/60s) over a default of 1/60s, keyed
/// by `x-api-key`, tier from `x-plan`.
fn tiers(b: &Backend) -> Tiers {
    let named = |quota: &str, name: &str| b.builder(quota).name(name).build().unwrap();
    Tiers::new(b.limiter("1/60s"))
        .tier(named("2/60s", "free"))
        .tier(named("4/60s", "pro"))
}

async fn serve(b: &Backend) -> String {
    let layer = RateLimitLayer::tiered(tiers(b), Header::new("x-plan"), Header::new("x-api-key"));
    spawn_axum(app().layer(layer), true).await
}

async fn get(client: &HttpClient, url: &str, key: &str, plan: Option<&str>) -> Reply {
    let mut headers = vec![("x-api-key", key)];
    headers.extend(plan.map(|p| ("x-plan", p)));
    get_with(client, &format!("{url}/"), &headers).await
}

fn statuses(replies: &[Reply]) -> Vec<u16> {
    replies.iter().map(|r| r.status.as_u16()).collect()
}

async fn a_header_picks_the_tier_and_its_own_policy(b: Backend) {
    let url = serve(&b).await;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let mut pro = Vec::new();
    for _ in 0..5 {
        pro.push(get(&client, &url, "alice", Some("pro")).await);
    }
    assert_eq!(statuses(&pro), [200, 200, 200, 200, 429], "{pro:?}");
    assert_eq!(pro[0].header("ratelimit-policy"), Some(r#""pro";q=4;w=60"#));
    assert_eq!(pro[0].header("ratelimit"), Some(r#""pro";r=3;t=60"#));
    assert!(
        pro[4]
            .header("ratelimit")
            .unwrap()
            .starts_with(r#""pro";r=0"#)
    );

    // Alice's free tier is a counter of its own.
    let free = get(&client, &url, "alice", Some("free")).await;
    assert_eq!(free.status, 200, "{free:?}");
    assert_eq!(free.header("ratelimit-policy"), Some(r#""free";q=2;w=60"#));
    assert_eq!(free.header("ratelimit"), Some(r#""free";r=1;t=60"#));
}

async fn no_tier_or_an_unknown_one_gets_the_default(b: Backend) {
    let url = serve(&b).await;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let first = get(&client, &url, "bob", None).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(
        first.header("ratelimit-policy"),
        Some(r#""default";q=1;w=60"#)
    );
    // An unknown tier is the default tier: the same counter, now spent.
    for plan in ["gold", "PRO", "", "pro2"] {
        let r = get(&client, &url, "bob", Some(plan)).await;
        assert_eq!(r.status, 429, "{plan:?}: {r:?}");
        assert_eq!(r.header("ratelimit-policy"), Some(r#""default";q=1;w=60"#));
    }
    // The tiers are untouched.
    let pro = get(&client, &url, "bob", Some("pro")).await;
    assert_eq!(
        pro.header("ratelimit"),
        Some(r#""pro";r=3;t=60"#),
        "{pro:?}"
    );
    // Client-chosen names never made a key space: only the default's and
    // pro's keys exist.
    if let Some(server) = b.server() {
        let mut keys: Vec<String> = server
            .keys_with_ttl()
            .await
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        keys.sort();
        assert_eq!(
            keys,
            ["rl:fw:default.1-60000:{bob}", "rl:fw:pro:{bob}"],
            "{}",
            server.log()
        );
        server.assert_every_key_has_ttl().await;
    }
    if let Backend::Memory(m) = &b {
        assert_eq!(m.len(), 2);
    }
}

support::for_every_store!(
    a_header_picks_the_tier_and_its_own_policy,
    no_tier_or_an_unknown_one_gets_the_default,
);

#[tokio::test]
async fn business_code_checks_a_tier_by_name() {
    let b = Backend::memory();
    let tiers = tiers(&b);
    let d = tiers.check("free", "carol", 1).await.unwrap();
    assert_eq!((d.policy(), d.remaining()), ("free", 1));
    let d = tiers.check("nope", "carol", 1).await.unwrap();
    assert_eq!((d.policy(), d.remaining()), ("default", 0));
    assert_eq!(tiers.get("pro").name(), "pro");
    assert!(tiers.find(b"nope").is_none());
    let mut names: Vec<_> = tiers.names().collect();
    names.sort();
    assert_eq!(names, ["free", "pro"]);
}

#[test]
#[should_panic(expected = "already there")]
fn a_tier_named_twice_is_refused() {
    let l = |name: &str| {
        Limiter::builder("1/1s".parse().unwrap())
            .name(name)
            .build()
            .unwrap()
    };
    let _ = Tiers::new(l("default")).tier(l("pro")).tier(l("pro"));
}

/// One key per limit must fit every tier's limiter, not only the default's:
/// a tier with fewer limits is refused when the layer is built, where it
/// would otherwise answer 500 to every request of that tier.
#[test]
#[should_panic(expected = "gives 2 keys per request, and limiter \"pro\" has 1 limits")]
fn keys_per_limit_must_fit_every_tier() {
    let _ = RateLimitLayer::tiered(
        support::limits::tiers_of_two_limits_and_one(),
        Header::new("x-plan"),
        key::each((Header::new("x-api-key"), Global)),
    );
}

/// The same through `RateLimitLayer::new` with a `Tiered` extractor made
/// by hand: fails with only the layer's own limiter checked (it built, and
/// every request of the "pro" tier was a 500).
#[test]
#[should_panic(expected = "gives 2 keys per request, and limiter \"pro\" has 1 limits")]
fn keys_per_limit_must_fit_every_tier_of_a_tiered_extractor() {
    let tiers = support::limits::tiers_of_two_limits_and_one();
    let default = Limiter::builder("1/1s".parse().unwrap())
        .limit("global", "100/1s".parse().unwrap())
        .build()
        .unwrap();
    let keys = key::each((Header::new("x-api-key"), Global));
    let _ = RateLimitLayer::new(default, Tiered::new(keys, Header::new("x-plan"), tiers));
}

/// A selector's server error (here a `from_fn` that finds no plan an auth
/// step should have set) puts the request in the default tier, and is
/// logged once, at `warn`: it was not logged at all, so a misordered auth
/// layer quietly gave every client the default tier. A client's own error
/// (no `x-plan` header) is not logged.
#[tokio::test]
async fn a_selectors_server_error_is_logged_once() {
    use http::{Request, Response, StatusCode, request::Parts};
    use redis_ratelimit::key::KeyError;
    use support::logs::Captured;
    use tower::{Layer, Service, ServiceExt, service_fn};

    let b = Backend::memory();
    let no_plan = key::from_fn(|_: &Parts| {
        Err(KeyError::Rejected {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            reason: "no plan extension".into(),
        })
    });
    let ok = || {
        service_fn(|_: Request<()>| async { Ok::<_, std::convert::Infallible>(Response::new(())) })
    };
    let mut failing = RateLimitLayer::tiered(tiers(&b), no_plan, Global).layer(ok());
    let mut by_header =
        RateLimitLayer::tiered(tiers(&Backend::memory()), Header::new("x-plan"), Global)
            .layer(ok());
    let captured = Captured::default();
    let guard = captured.install();
    for _ in 0..3 {
        let req = Request::new(());
        let res = failing.ready().await.unwrap().call(req).await.unwrap();
        // The default tier's policy.
        let policy = res.headers().get("ratelimit-policy").unwrap();
        assert!(!policy.to_str().unwrap().contains("pro"), "{policy:?}");
        let req = Request::new(());
        by_header.ready().await.unwrap().call(req).await.unwrap();
    }
    drop(guard);
    let warnings = captured.warning_lines();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("tier selector"), "{warnings:?}");
    assert!(warnings[0].contains("no plan extension"), "{warnings:?}");
}
