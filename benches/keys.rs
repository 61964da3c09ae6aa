//! Turning a request into its rate-limit key, without a store:
//!
//! * `extract/peer_ip_*`: [`key::PeerIp`] from a `SocketAddr` extension (a
//!   hyper server) and from axum's `ConnectInfo`;
//! * `extract/header`: [`key::Header`] (`x-api-key`);
//! * `extract/client_ip_*`: [`key::ClientIp`] with no proxy trusted, and
//!   behind trusted proxies with an `X-Forwarded-For` chain of three entries
//!   (by trusted ranges and by hop count), for an IPv4 and an IPv6 client;
//! * `store_key/*`: [`Limiter::store_key`], the Redis key built from a
//!   client key: a plain one, and one that must be hashed (SHA-256).
//!
//! Run with `cargo bench --bench keys`.

use std::{hint::black_box, net::SocketAddr, time::Duration};

use axum::extract::ConnectInfo;
use criterion::{
    BenchmarkGroup, Criterion, criterion_group, criterion_main, measurement::WallTime,
};
use http::{Request, request::Parts};
use redis_ratelimit::{
    Limiter, Quota,
    key::{self, KeyExtractor},
};

fn parts(peer: &str, headers: &[(&str, &str)]) -> Parts {
    let peer: SocketAddr = peer.parse().expect("a socket address");
    let mut req = Request::get("/").extension(peer);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(()).expect("a request").into_parts().0
}

type Group<'a> = BenchmarkGroup<'a, WallTime>;

/// Benchmarks `extractor` on `req`, after checking it yields `want`.
fn bench<K: KeyExtractor>(g: &mut Group<'_>, name: &str, extractor: &K, req: &Parts, want: &str) {
    let key = extractor.extract(req).expect("a key");
    assert_eq!(key.as_bytes(), want.as_bytes(), "{name}");
    g.bench_function(name, |b| b.iter(|| extractor.extract(black_box(req))));
}

fn extract(c: &mut Criterion) {
    const CLIENT: &str = "203.0.113.7";
    let mut g = c.benchmark_group("extract");
    let direct = parts("203.0.113.7:50000", &[]);
    bench(&mut g, "peer_ip_socket_addr", &key::PeerIp, &direct, CLIENT);

    let addr: SocketAddr = "203.0.113.7:50000".parse().expect("a socket address");
    let axum = Request::get("/").extension(ConnectInfo(addr)).body(());
    let axum = axum.expect("a request").into_parts().0;
    bench(
        &mut g,
        "peer_ip_axum_connect_info",
        &key::PeerIp,
        &axum,
        CLIENT,
    );

    let api = parts("203.0.113.7:50000", &[("x-api-key", "k-0123456789abcdef")]);
    let header = key::Header::new("x-api-key");
    bench(&mut g, "header", &header, &api, "k-0123456789abcdef");

    let no_proxy = key::ClientIp::new();
    bench(&mut g, "client_ip_no_proxy", &no_proxy, &direct, CLIENT);

    // The client, then two proxies of ours; the peer is a third.
    let chain = [("x-forwarded-for", "203.0.113.7, 192.168.1.1, 10.1.2.3")];
    let behind = parts("10.0.0.2:4000", &chain);
    let trusted = key::ClientIp::new().trust("10.0.0.0/8, 192.168.0.0/16");
    let trusted = trusted.expect("valid ranges");
    bench(&mut g, "client_ip_trusted_xff_3", &trusted, &behind, CLIENT);
    let hops = key::ClientIp::new().hops(3);
    bench(&mut g, "client_ip_hops_xff_3", &hops, &behind, CLIENT);

    let chain = [("x-forwarded-for", "2001:db8:1:2::7, 192.168.1.1, 10.1.2.3")];
    let behind = parts("10.0.0.2:4000", &chain);
    let v6 = "2001:db8:1:2::/64";
    bench(
        &mut g,
        "client_ip_trusted_xff_3_ipv6",
        &trusted,
        &behind,
        v6,
    );
    g.finish();
}

fn store_key(c: &mut Criterion) {
    let limiter = Limiter::new(Quota::per_minute(100));
    let plain = "203.0.113.7";
    let hostile = "{evil} key with spaces and braces";
    assert!(limiter.store_key(plain).contains(plain));
    assert!(!limiter.store_key(hostile).contains("evil"));
    c.bench_function("store_key/plain", |b| {
        b.iter(|| limiter.store_key(black_box(plain)))
    });
    c.bench_function("store_key/hashed", |b| {
        b.iter(|| limiter.store_key(black_box(hostile)))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = extract, store_key
}
criterion_main!(benches);
