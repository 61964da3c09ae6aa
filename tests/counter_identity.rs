//! Counters are never shared by accident: unnamed limits of different
//! quotas count apart, a second live limiter on the same counters (or
//! concurrency limiter on the same slots) is a build error unless it opts
//! in, dropping a limiter frees its names, and a named limit keeps its
//! counter across a quota change (a rolling deploy).

mod support;

use redis_ratelimit::{ConfigError, Limiter, Quota};
use support::{Backend, for_every_store};

/// The README's per-route pattern: a 5/min login limiter and a 100/min
/// search limiter on one store. Fifty searches once locked out the login
/// route, both writing `rl:fw:default:{ip}`.
async fn fifty_searches_do_not_lock_out_the_login(b: Backend) {
    let login = b.builder_for(Quota::per_minute(5)).build().unwrap();
    let search = b.builder_for(Quota::per_minute(100)).build().unwrap();
    assert_ne!(
        login.store_key("203.0.113.9"),
        search.store_key("203.0.113.9")
    );
    for _ in 0..50 {
        assert!(search.check("203.0.113.9", 1).await.unwrap().is_allowed());
    }
    for _ in 0..5 {
        assert!(login.check("203.0.113.9", 1).await.unwrap().is_allowed());
    }
    assert!(!login.check("203.0.113.9", 1).await.unwrap().is_allowed());
    assert_eq!(search.peek("203.0.113.9", 1).await.unwrap().remaining(), 50);
}

async fn a_second_live_limiter_on_the_same_counters_is_refused(b: Backend) {
    for quota in [
        Quota::per_minute(5),
        Quota::per_minute(5).sliding_window(),
        Quota::per_minute(5).gcra(2).unwrap(),
    ] {
        let first = b.builder_for(quota).build().unwrap();
        let again = b.builder_for(quota).build();
        let Err(ConfigError::SharedCounters(key)) = again else {
            panic!("{again:?}")
        };
        assert!(first.store_key("x").starts_with(&key), "{key}");
        let message = ConfigError::SharedCounters(key).to_string();
        assert!(message.contains(".name(") && message.contains("share_counters"));
        // Named limits too, and a limit of a multi-limit limiter.
        let named = b.builder_for(quota).name("login").build().unwrap();
        assert!(b.builder_for(quota).name("login").build().is_err());
        let multi = b
            .builder_for(quota)
            .name("user")
            .limit("all", Quota::per_day(9))
            .build()
            .unwrap();
        let clash = b
            .builder_for(quota)
            .name("user")
            .limit("x", Quota::per_day(9));
        assert!(clash.build().is_err());
        // On purpose: opted in, counting together.
        let shared = b.builder_for(quota).share_counters().build().unwrap();
        assert!(
            first
                .check("k", quota.capacity())
                .await
                .unwrap()
                .is_allowed()
        );
        assert!(!shared.check("k", 1).await.unwrap().is_allowed());
        // Dropped (every clone), the names are free again.
        let clone = named.clone();
        drop(named);
        assert!(b.builder_for(quota).name("login").build().is_err());
        drop(clone);
        drop((first, shared, multi));
        b.builder_for(quota).name("login").build().unwrap();
        b.builder_for(quota).build().unwrap();
    }
}

/// The README's stacked in-flight limits, one per key and one for
/// everyone, unnamed on one store: they shared the slots
/// `rl:cc:concurrency:{..}`, so a client sending the everyone-layer's key
/// as its own took that layer's slots. The second is now refused unless
/// named apart or shared on purpose, as rate limiters are.
async fn a_second_live_concurrency_limiter_on_the_same_slots_is_refused(b: Backend) {
    let per_key = b.concurrency(5).build().unwrap();
    let everyone = b.concurrency(100).build();
    let Err(ConfigError::SharedCounters(prefix)) = everyone else {
        panic!("{everyone:?}")
    };
    assert!(per_key.store_key("x").starts_with(&prefix), "{prefix}");
    // Named apart: their own slots.
    let everyone = b.concurrency(1).name("everyone").build().unwrap();
    assert_ne!(everyone.store_key("k"), per_key.store_key("k"));
    let held = everyone.acquire("k").await.unwrap().lease().unwrap();
    assert!(per_key.acquire("k").await.unwrap().is_acquired());
    // On purpose: opted in, holding slots together.
    let shared = b.concurrency(1).name("everyone").share_counters();
    let shared = shared.build().unwrap();
    assert!(!shared.acquire("k").await.unwrap().is_acquired());
    assert!(held.release().await.unwrap());
    // Dropped (every clone: the released lease's renewal task holds one
    // until it has seen the release), the name is free again.
    drop((everyone, shared));
    let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while let Err(e) = b.concurrency(1).name("everyone").build() {
        assert!(std::time::Instant::now() < until, "{e}");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

async fn a_named_limit_keeps_its_counter_when_its_quota_changes(b: Backend) {
    // Version 1 of the service, then version 2 with a raised quota: the
    // same counter (in one process here, so v2 opts in, as a replica
    // elsewhere would not need to).
    let v1 = b
        .builder_for(Quota::per_minute(3))
        .name("login")
        .build()
        .unwrap();
    let v2 = (b.builder_for(Quota::per_minute(5)).name("login"))
        .share_counters()
        .build()
        .unwrap();
    assert_eq!(v1.store_key("ip"), v2.store_key("ip"));
    assert!(v1.check("ip", 3).await.unwrap().is_allowed());
    assert_eq!(v2.peek("ip", 1).await.unwrap().remaining(), 2);
}

for_every_store!(
    fifty_searches_do_not_lock_out_the_login,
    a_second_live_limiter_on_the_same_counters_is_refused,
    a_second_live_concurrency_limiter_on_the_same_slots_is_refused,
    a_named_limit_keeps_its_counter_when_its_quota_changes,
);

#[test]
fn unnamed_keys_carry_the_quota_in_the_safe_alphabet() {
    let l = Limiter::builder("5/1m".parse().unwrap()).build().unwrap();
    assert_eq!(l.store_key("ip"), "rl:fw:default.5-60000:{ip}");
    let g = Limiter::builder("5/1m".parse::<Quota>().unwrap().gcra(3).unwrap())
        .build()
        .unwrap();
    assert_eq!(g.store_key("ip"), "rl:gcra:default.5-60000-b3:{ip}");
    let named = Limiter::builder("5/1m".parse().unwrap())
        .name("default")
        .build()
        .unwrap();
    assert_eq!(named.store_key("ip"), "rl:fw:default:{ip}");
    // Headers still name the policy "default".
    assert_eq!(l.name(), "default");
}

/// Separate stores (other processes) are never refused: replicas share by name.
#[tokio::test]
async fn other_store_instances_are_other_processes() {
    let server = support::RedisServer::start();
    let a = Limiter::builder(Quota::per_minute(2)).name("api");
    let a = a.store(server.store().await).build().unwrap();
    let b = Limiter::builder(Quota::per_minute(2)).name("api");
    let b = b.store(server.store().await).build().unwrap();
    assert!(a.check("k", 2).await.unwrap().is_allowed());
    assert!(!b.check("k", 1).await.unwrap().is_allowed());
}
