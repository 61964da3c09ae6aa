//! The in-memory store's bound: at `max_keys`, a new key is denied (a 429
//! with a Retry-After, never an error or a 5xx, never unlimited), held keys
//! are still limited exactly, and once windows end new keys are admitted
//! again without the store growing past its bound.

mod support;

use std::time::Duration;

use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use redis_ratelimit::{Limiter, MemoryStore, OnStoreError, Quota, RateLimitLayer, key::Header};
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
