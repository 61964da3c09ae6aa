//! Refunds by response over real HTTP, on the memory store and on Redis:
//! server errors not charged, only failures counted, several limits, every
//! algorithm, exactly one extra store call per refunded response, and the
//! middleware's own rejections never refunded; and, on the memory store,
//! without a Tokio runtime.

mod support;

use std::time::Duration;

use redis_ratelimit::{Limiter, Quota, RateLimitLayer, Tiers, key::Header, refund::Refund};
use support::{
    Backend, RedisServer,
    http::{Caller, Reply, get_with},
    servers::{spawn_axum, status_app},
};

async fn serve(limiter: &Limiter, refund: Refund) -> String {
    let layer = RateLimitLayer::new(limiter.clone(), Header::new("x-api-key")).refund_when(refund);
    spawn_axum(status_app().layer(layer), true).await
}

/// Waits (at most 10 s) until `key` has `remaining` left in every limit,
/// that is until the refunds sent so far have landed. Peeks spend nothing.
async fn settled(limiter: &Limiter, key: &str, remaining: &[u64]) {
    let wait = async {
        loop {
            let d = limiter.peek(key, 1).await.unwrap();
            let now: Vec<u64> = d.limits().map(|l| l.remaining()).collect();
            if now == remaining {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap_or_else(|_| panic!("{key} never got back to {remaining:?}"));
}

fn statuses(replies: &[Reply]) -> Vec<u16> {
    replies.iter().map(|r| r.status.as_u16()).collect()
}

/// 500s are refunded: the client is never charged for them.
async fn server_errors_are_not_charged(b: Backend) {
    for quota in [
        Quota::per_minute(2),
        Quota::per_minute(2).sliding_window(),
        Quota::per_minute(2).gcra(2).unwrap(),
    ] {
        let limiter = b.builder_for(quota).build().unwrap();
        let url = serve(&limiter, Refund::ServerErrors).await;
        let caller = Caller::with_key(Some("k"));
        for _ in 0..5 {
            let r = caller.get(&format!("{url}/status/500")).await;
            assert_eq!(r.status, 500, "{quota:?}: {r:?}");
            // The headers are the decision's, before the refund.
            assert_eq!(r.ratelimit("r"), 1, "{quota:?}: {r:?}");
            settled(&limiter, "k", &[2]).await;
        }
        let after = caller.statuses(&format!("{url}/"), 3).await;
        assert_eq!(after, [200, 200, 429], "{quota:?}");
        // A 404 is not refunded under this preset.
        let limiter = b.builder_for(quota).name("other").build().unwrap();
        let url = serve(&limiter, Refund::ServerErrors).await;
        let r = caller.get_n(&format!("{url}/status/404"), 3).await;
        assert_eq!(statuses(&r), [404, 404, 429], "{quota:?}");
    }
}

/// Count only failed logins: 2xx are refunded, 401s count, and once the
/// limit is reached even a good password is refused.
async fn successes_are_free_failures_count(b: Backend) {
    let limiter = b.limiter("3/60s");
    let url = serve(&limiter, Refund::Successes).await;
    let caller = Caller::with_key(Some("login:alice"));
    for _ in 0..5 {
        let r = caller.get(&format!("{url}/status/200")).await;
        assert_eq!(r.status, 200, "{r:?}");
        settled(&limiter, "login:alice", &[3]).await;
    }
    let failed = caller.get_n(&format!("{url}/status/401"), 4).await;
    assert_eq!(statuses(&failed), [401, 401, 401, 429]);
    let ok = caller.get(&format!("{url}/status/200")).await;
    assert_eq!(ok.status, 429, "{ok:?}");
}

/// Several limits: a refund credits every one of them.
async fn several_limits_are_all_refunded(b: Backend) {
    let limiter = b
        .builder("2/60s")
        .name("minute")
        .limit("hour", "3/1h".parse::<Quota>().unwrap().sliding_window())
        .build()
        .unwrap();
    let url = serve(&limiter, Refund::ServerErrors).await;
    let caller = Caller::with_key(Some("k"));
    for _ in 0..4 {
        let r = caller.get(&format!("{url}/status/503")).await;
        assert_eq!(r.status, 503, "{r:?}");
        settled(&limiter, "k", &[2, 3]).await;
    }
    let after = caller.statuses(&format!("{url}/"), 3).await;
    assert_eq!(after, [200, 200, 429]);
    settled(&limiter, "k", &[0, 1]).await;
}

/// With tiers, the refund goes to the tier's limiter that spent.
async fn a_tier_is_refunded_in_its_own_limiter(b: Backend) {
    let pro = b.builder("2/60s").name("pro").build().unwrap();
    let tiers = Tiers::new(b.limiter("1/60s")).tier(pro.clone());
    let layer = RateLimitLayer::tiered(tiers, Header::new("x-plan"), Header::new("x-api-key"))
        .refund_when(Refund::ServerErrors);
    let url = spawn_axum(status_app().layer(layer), true).await;
    let client = Caller::with_key(None).client();
    let headers = [("x-api-key", "k"), ("x-plan", "pro")];
    for _ in 0..4 {
        let r = get_with(&client, &format!("{url}/status/500"), &headers).await;
        assert_eq!(
            r.header("ratelimit-policy"),
            Some(r#""pro";q=2;w=60"#),
            "{r:?}"
        );
        assert_eq!(r.status, 500, "{r:?}");
        settled(&pro, "k", &[2]).await;
    }
}

support::for_every_store!(
    a_tier_is_refunded_in_its_own_limiter,
    server_errors_are_not_charged,
    successes_are_free_failures_count,
    several_limits_are_all_refunded,
);

/// Exactly one extra store call for a refunded response, none for others.
#[tokio::test]
async fn one_extra_store_call_per_refunded_response_only() {
    let server = RedisServer::start();
    let limiter = server.limiter("10/60s").await;
    let url = serve(&limiter, Refund::ServerErrors).await;
    let caller = Caller::with_key(Some("k"));
    server.reset_stats().await;
    for path in [
        "/",
        "/status/500",
        "/status/404",
        "/status/502",
        "/status/201",
    ] {
        caller.get(&format!("{url}{path}")).await;
    }
    // 5 decisions and 2 refunds, and nothing more once they have landed.
    let wait = async {
        while server.script_calls().await < 7 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap_or_else(|_| panic!("refunds never landed\n{}", server.log()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(server.script_calls().await, 7, "{}", server.log());
    // Only the 200, the 404 and the 201 are charged.
    let d = limiter.peek("k", 1).await.unwrap();
    assert_eq!(d.remaining(), 7, "{d:?}");
    server.assert_every_key_has_ttl().await;
}

/// Without refunds, a 500 costs one store call and stays charged.
#[tokio::test]
async fn without_refunds_nothing_is_refunded() {
    let server = RedisServer::start();
    let limiter = server.limiter("2/60s").await;
    let layer = RateLimitLayer::new(limiter.clone(), Header::new("x-api-key"));
    let url = spawn_axum(status_app().layer(layer), true).await;
    let caller = Caller::with_key(Some("k"));
    server.reset_stats().await;
    let r = caller.get_n(&format!("{url}/status/500"), 3).await;
    assert_eq!(statuses(&r), [500, 500, 429]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.script_calls().await, 3, "{}", server.log());
}

/// The memory store needs no Tokio runtime, and neither do its refunds: a
/// tower service driven on a thread without one refunds its 500s in place,
/// so a limit of 1 answers every request (each future ready at its first
/// poll, the memory store deciding at once).
#[test]
fn a_memory_refund_needs_no_runtime() {
    use std::convert::Infallible;

    use futures_util::FutureExt;
    use http::{Request, Response, StatusCode};
    use redis_ratelimit::key::Global;
    use tower::{Layer, Service, ServiceExt, service_fn};

    assert!(tokio::runtime::Handle::try_current().is_err());
    let limiter = Limiter::new(Quota::per_minute(1));
    let layer = RateLimitLayer::new(limiter.clone(), Global).refund_when(Refund::ServerErrors);
    let mut svc = layer.layer(service_fn(|_req: Request<()>| async {
        let mut res = Response::new(String::new());
        *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        Ok::<_, Infallible>(res)
    }));
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let ready = svc.ready().now_or_never().expect("ready").unwrap();
        let res = ready.call(Request::new(())).now_or_never();
        statuses.push(res.expect("answered at once").unwrap().status().as_u16());
    }
    assert_eq!(statuses, [500, 500, 500]);
    let d = limiter
        .peek("global", 1)
        .now_or_never()
        .expect("peeked at once");
    assert_eq!(d.unwrap().remaining(), 1);
}
