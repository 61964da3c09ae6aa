//! The in-memory store's bound: at `max_keys`, a new key is denied (a 429
//! with a Retry-After, never an error or a 5xx, never unlimited), held keys
//! are still limited exactly, and once windows end new keys are admitted
//! again without the store growing past its bound. The concurrency
//! limiter's leases on it are bounded the same way.

mod support;

use std::time::Duration;

use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use redis_ratelimit::{
    Limiter, MemoryStore, OnStoreError, Quota, RateLimitLayer,
    concurrency::{Acquired, ConcurrencyLimiter},
    key::Header,
    store::LeaseStore,
};
use support::{
    http::get,
    servers::{app, spawn_axum},
};

#[tokio::test(start_paused = true)]
async fn a_full_store_denies_new_keys_and_limits_held_ones_exactly() {
    let store = MemoryStore::with_max_keys(50);
    let limiter = Limiter::builder("3/10s".parse::<Quota>().unwrap())
        .store(store.clone())
        .build()
        .unwrap();
    for i in 0..50 {
        let d = limiter.check(&format!("k{i}"), 1).await.unwrap();
        assert!(d.is_allowed(), "k{i}: {d:?}");
    }
    tokio::time::advance(Duration::from_secs(3)).await;
    // A decision, not a store error: OnStoreError never sees it.
    let d = limiter.check("newcomer", 1).await.unwrap();
    assert!(!d.is_allowed(), "{d:?}");
    assert_eq!(d.remaining(), 0);
    // Until the soonest held window ends.
    assert_eq!(d.retry_after(), Some(Duration::from_secs(7)));
    assert!(!limiter.check("newcomer", 1).await.unwrap().is_allowed());
    // Held keys: exactly their quota, no more.
    assert!(limiter.check("k9", 2).await.unwrap().is_allowed());
    let d = limiter.check("k9", 1).await.unwrap();
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Some(Duration::from_secs(7)));
    assert_eq!(store.len(), 50);

    tokio::time::advance(Duration::from_secs(7)).await;
    for i in 0..50 {
        let d = limiter.check(&format!("n{i}"), 1).await.unwrap();
        assert!(d.is_allowed(), "n{i}: {d:?}");
    }
    assert!(!limiter.check("late", 1).await.unwrap().is_allowed());
    assert_eq!(store.len(), 50);
}

#[tokio::test]
async fn over_http_a_full_store_answers_429_with_retry_after_never_5xx() {
    let limiter = Limiter::builder("2/2s".parse::<Quota>().unwrap())
        .store(MemoryStore::with_max_keys(4))
        .build()
        .unwrap();
    // Deny: were a full store a store error, this would be a 503.
    let layer =
        RateLimitLayer::new(limiter, Header::new("x-api-key")).on_store_error(OnStoreError::Deny);
    let url = spawn_axum(app().layer(layer), false).await;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let call = |key: String| {
        let (client, url) = (client.clone(), url.clone());
        async move { get(&client, &url, Some(&key)).await }
    };
    for key in ["a", "b", "c", "d"] {
        let r = call(key.into()).await;
        assert_eq!(r.status, 200, "{key}: {r:?}");
    }
    let full = call("e".into()).await;
    assert_eq!(full.status, 429, "{full:?}");
    assert_eq!(full.ratelimit("r"), 0);
    let wait = full.int("retry-after");
    assert!((1..=2).contains(&wait), "{full:?}");
    // The held key "a": its second request, then a denial of its own.
    assert_eq!(call("a".into()).await.status, 200);
    let r = call("a".into()).await;
    assert_eq!(r.status, 429, "{r:?}");

    // As a client would: retry after Retry-After.
    tokio::time::sleep(Duration::from_secs(wait)).await;
    for key in ["e", "f", "g", "h"] {
        let r = call(key.into()).await;
        assert_eq!(r.status, 200, "{key}: {r:?}");
    }
    let r = call("i".into()).await;
    assert_eq!(r.status, 429, "{r:?}");
    assert!(r.int("retry-after") >= 1);
}

/// The concurrency limiter's leases on the memory store are bounded by its
/// `max_keys` too: a client making up keys gets a new key refused (busy,
/// nothing left) while the lease table is full, held keys acquire and
/// release as ever, and keys whose leases expired or were released make
/// room again. Leases once took every new key, without bound.
#[tokio::test(start_paused = true)]
async fn a_full_lease_table_refuses_new_keys_and_serves_held_ones() {
    let store = MemoryStore::with_max_keys(50);
    let limiter = ConcurrencyLimiter::builder(2)
        .store(store.clone())
        .build()
        .unwrap();
    let mut held = Vec::new();
    for i in 0..40 {
        let lease = limiter.acquire(&format!("user{i}")).await.unwrap();
        held.push(lease.lease().expect("room"));
    }
    // Ten more keys, whose holder went away (a replica that crashed): their
    // 1-second leases are never renewed.
    for i in 0..10 {
        let key = limiter.store_key(&format!("gone{i}"));
        let lease = LeaseStore::acquire(&store, &key, "token/1000", 2, 1000);
        assert!(lease.await.unwrap().acquired, "{key}");
    }
    for i in 0..200 {
        let Acquired::Busy(busy) = limiter.acquire(&format!("new{i}")).await.unwrap() else {
            panic!("new{i} was granted a lease past the store's 50 keys");
        };
        assert_eq!((busy.in_flight(), busy.limit()), (2, 2));
        assert_eq!(busy.retry_after(), Duration::from_secs(1));
    }
    // A held key: its second slot, refused a third, released, retaken.
    let second = limiter.acquire("user7").await.unwrap().lease().unwrap();
    assert_eq!(second.remaining(), 0);
    assert!(!limiter.acquire("user7").await.unwrap().is_acquired());
    assert!(second.release().await.unwrap());
    held.push(limiter.acquire("user7").await.unwrap().lease().unwrap());

    // Released: that key's place goes to a new one, and only one.
    assert!(held.swap_remove(0).release().await.unwrap());
    held.push(limiter.acquire("new0").await.unwrap().lease().unwrap());
    assert!(!limiter.acquire("new1").await.unwrap().is_acquired());
    // Expired: the abandoned keys' places are free once their leases end.
    tokio::time::advance(Duration::from_millis(1001)).await;
    let mut late = Vec::new();
    for i in 0..10 {
        let lease = limiter.acquire(&format!("late{i}")).await.unwrap();
        late.push(lease.lease().unwrap_or_else(|| panic!("late{i}")));
    }
    assert!(!limiter.acquire("late10").await.unwrap().is_acquired());
}
