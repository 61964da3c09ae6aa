//! Skip lists over real HTTP, on the memory store and on Redis: a skipped
//! request makes no store call and gets no rate-limit headers; networks are
//! matched on the key's own client (the peer, or the client behind trusted
//! proxies), and a spoofed forwarding header cannot get a client skipped.

mod support;

use redis_ratelimit::{
    RateLimitLayer,
    key::{ClientIp, PeerIp},
    skip::Networks,
};
use support::{
    Backend,
    http::{Caller, get_with},
    servers::{app, spawn_axum},
};

/// How many keys the store holds and, on Redis, how many scripts ran.
async fn store_calls(b: &Backend) -> (usize, u64) {
    match b {
        Backend::Memory(m) => (m.len(), 0),
        Backend::Redis(server, _) => (
            server.keys_with_ttl().await.len(),
            server.script_calls().await,
        ),
    }
}

async fn skipped_networks_make_no_store_call_and_get_no_headers(b: Backend) {
    let limiter = b.limiter("1/60s");
    let layer = RateLimitLayer::new(limiter, PeerIp)
        .skip_networks(Networks::new(PeerIp, "127.0.0.2, ::1, 127.0.1.0/24").unwrap());
    let url = spawn_axum(app().layer(layer), true).await;
    if let Some(s) = b.server() {
        s.reset_stats().await;
    }
    for ip in [[127, 0, 0, 2], [127, 0, 1, 7]] {
        let caller = Caller::from_ip(ip);
        for r in caller.get_n(&format!("{url}/"), 5).await {
            assert_eq!(r.status, 200, "{r:?}");
            assert!(!r.has_ratelimit_headers(), "{r:?}");
        }
    }
    assert_eq!(store_calls(&b).await, (0, 0));
    // Everyone else is limited.
    let other = Caller::from_ip([127, 0, 0, 3]);
    assert_eq!(other.statuses(&format!("{url}/"), 2).await, [200, 429]);
    assert_eq!(store_calls(&b).await.0, 1);
}

async fn a_skip_closure_skips_by_request(b: Backend) {
    let layer = RateLimitLayer::new(b.limiter("1/60s"), PeerIp).skip(|p| p.uri.path() == "/");
    let router = app().route("/limited", axum::routing::get(|| async { "ok" }));
    let url = spawn_axum(router.layer(layer), true).await;
    let caller = Caller::from_ip([127, 0, 0, 4]);
    for r in caller.get_n(&format!("{url}/"), 3).await {
        assert_eq!(r.status, 200, "{r:?}");
        assert!(!r.has_ratelimit_headers(), "{r:?}");
    }
    assert_eq!(store_calls(&b).await.0, 0);
    assert_eq!(
        caller.statuses(&format!("{url}/limited"), 2).await,
        [200, 429]
    );
}

/// `ClientIp` trusting the proxy at 127.0.0.5: the skip reads the client
/// behind it; a peer that is not trusted cannot spoof its way in.
async fn client_ip_skips_the_client_behind_trusted_proxies(b: Backend) {
    let client_ip = ClientIp::new().trust("127.0.0.5").unwrap();
    let internal = Networks::new(client_ip.clone(), "10.0.0.0/8").unwrap();
    let layer = RateLimitLayer::new(b.limiter("1/60s"), client_ip).skip_networks(internal);
    let url = spawn_axum(app().layer(layer), true).await;
    let url = format!("{url}/");
    let get = |ip, xff: &'static str| {
        let url = url.clone();
        async move {
            let caller = Caller::from_ip(ip);
            get_with(&caller.client(), &url, &[("x-forwarded-for", xff)]).await
        }
    };
    // Through the trusted proxy, from an internal client: skipped.
    for _ in 0..3 {
        let r = get([127, 0, 0, 5], "10.1.2.3").await;
        assert_eq!(r.status, 200, "{r:?}");
        assert!(!r.has_ratelimit_headers(), "{r:?}");
    }
    // A spoofed internal entry left of the real client is not read.
    let r = get([127, 0, 0, 5], "10.1.2.3, 203.0.113.9").await;
    assert!(r.has_ratelimit_headers(), "{r:?}");
    // An untrusted peer claiming to be internal is limited by its own address.
    let spoofed: Vec<u16> = [
        get([127, 0, 0, 6], "10.1.2.3").await,
        get([127, 0, 0, 6], "10.1.2.3").await,
    ]
    .iter()
    .map(|r| r.status.as_u16())
    .collect();
    assert_eq!(spoofed, [200, 429]);
    assert_eq!(store_calls(&b).await.0, 2);
}

support::for_every_store!(
    skipped_networks_make_no_store_call_and_get_no_headers,
    a_skip_closure_skips_by_request,
    client_ip_skips_the_client_behind_trusted_proxies,
);
