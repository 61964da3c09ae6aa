//! `Limiter::refund`: what a decision spent goes back to the window it was
//! spent in, and only there, for every algorithm, on every store, with one
//! limit or several, never below zero, and never past the limit under
//! concurrency.

mod support;

use std::time::Duration;

use futures_util::future::join_all;
use redis_ratelimit::{Error, Quota};
use support::{
    Backend, for_every_store,
    limits::{admitted, algorithms, limiter},
};

async fn a_refund_gives_back_the_cost(b: Backend) {
    for (name, quota) in algorithms(3, "10s") {
        let l = limiter(&b, name, quota);
        let d = l.check("k", 2).await.unwrap();
        assert!(d.is_allowed(), "{name}");
        l.refund("k", &d).await.unwrap();
        assert_eq!(l.peek("k", 1).await.unwrap().remaining(), 3, "{name}");
        // Exhausted, one refunded: exactly one more fits.
        let spent: Vec<_> = join_all((0..3).map(|_| l.check("k", 1))).await;
        assert!(
            spent.iter().all(|d| d.as_ref().unwrap().is_allowed()),
            "{name}"
        );
        l.refund("k", spent[0].as_ref().unwrap()).await.unwrap();
        assert_eq!(admitted(&l, "k", 3).await, 1, "{name}");
    }
    if let Some(server) = b.server() {
        server.assert_every_key_has_ttl().await;
    }
}

async fn refunds_never_go_below_zero(b: Backend) {
    for (name, quota) in algorithms(3, "10s") {
        let l = limiter(&b, name, quota);
        let two = l.check("k", 2).await.unwrap();
        assert!(l.check("k", 1).await.unwrap().is_allowed(), "{name}");
        // Not idempotent: given back twice, but clamped at nothing spent.
        l.refund("k", &two).await.unwrap();
        l.refund("k", &two).await.unwrap();
        assert_eq!(admitted(&l, "k", 5).await, 3, "{name}");
    }
}

async fn what_spent_nothing_refunds_nothing(b: Backend) {
    for (name, quota) in algorithms(2, "10s") {
        let l = limiter(&b, name, quota);
        assert_eq!(admitted(&l, "k", 2).await, 2);
        let denied = l.check("k", 1).await.unwrap();
        assert!(!denied.is_allowed(), "{name}");
        l.refund("k", &denied).await.unwrap();
        let peeked = l.peek("k", 1).await.unwrap();
        l.refund("k", &peeked).await.unwrap();
        let nothing = l.check("k", 0).await.unwrap();
        l.refund("k", &nothing).await.unwrap();
        assert_eq!(admitted(&l, "k", 1).await, 0, "{name}");
    }
}

async fn every_limit_gets_its_refund(b: Backend) {
    for (name, quota) in algorithms(2, "10s") {
        let l = b
            .builder_for(quota)
            .name(format!("{name}-user"))
            .limit(format!("{name}-all"), Quota::per_minute(3))
            .build()
            .unwrap();
        let d = l.check_each(&["alice", "all"], 2).await.unwrap();
        assert!(d.is_allowed());
        l.refund_each(&["alice", "all"], &d).await.unwrap();
        let peek = l.peek_each(&["alice", "all"], 1).await.unwrap();
        let left: Vec<_> = peek.limits().map(|l| l.remaining()).collect();
        assert_eq!(left, [2, 3], "{name}");
        // Wrong number of keys, or another limiter's decision: an error.
        let err = l.refund_each(&["a", "b", "c"], &d).await.unwrap_err();
        assert!(matches!(err, Error::KeyCount { .. }), "{err}");
        let other = limiter(&b, &format!("{name}-other"), quota);
        let err = other.refund("alice", &d).await.unwrap_err();
        assert!(matches!(err, Error::ForeignDecision), "{err}");
    }
}

async fn an_ended_window_is_not_credited(b: Backend) {
    for (name, quota) in algorithms(2, "300ms") {
        let l = limiter(&b, name, quota);
        let old = l.check("k", 1).await.unwrap();
        assert!(old.is_allowed());
        // Two windows on: the spent window (a sliding window's bucket, the
        // GCRA spend) is gone, and a new one is full.
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(admitted(&l, "k", 2).await, 2, "{name}");
        l.refund("k", &old).await.unwrap();
        assert_eq!(
            admitted(&l, "k", 1).await,
            0,
            "{name}: a later window was credited"
        );
    }
}

async fn concurrent_spends_and_refunds_never_pass_the_limit(b: Backend) {
    for (name, quota) in algorithms(10, "30s") {
        let l = limiter(&b, name, quota);
        let tasks = (0..60).map(|i| {
            let l = l.clone();
            async move {
                let d = l.check("k", 1).await.unwrap();
                let refunded = d.is_allowed() && i % 3 == 0;
                if refunded {
                    l.refund("k", &d).await.unwrap();
                }
                (d.is_allowed(), refunded)
            }
        });
        let results = join_all(tasks).await;
        let allowed = results.iter().filter(|r| r.0).count() as u64;
        let refunded = results.iter().filter(|r| r.1).count() as u64;
        let kept = allowed - refunded;
        assert!(kept <= 10, "{name}: {kept} kept");
        assert_eq!(admitted(&l, "k", 20).await, 10 - kept, "{name}");
    }
}

for_every_store!(
    a_refund_gives_back_the_cost,
    refunds_never_go_below_zero,
    what_spent_nothing_refunds_nothing,
    every_limit_gets_its_refund,
    an_ended_window_is_not_credited,
    concurrent_spends_and_refunds_never_pass_the_limit,
);

/// On a cluster: refund, peek and reset for every algorithm and several
/// limits, one call each (a CROSSSLOT error would fail it).
#[cfg(feature = "cluster")]
#[tokio::test]
async fn refunds_work_on_a_cluster() {
    let cluster = support::cluster::RedisCluster::start();
    for (name, quota) in algorithms(2, "10s") {
        let l = redis_ratelimit::Limiter::builder(quota)
            .store(cluster.store().await)
            .name(format!("{name}-user"))
            .limit(format!("{name}-all"), Quota::per_minute(3))
            .build()
            .unwrap();
        let d = l.check_each(&["alice", "all"], 2).await.unwrap();
        l.refund_each(&["alice", "all"], &d).await.unwrap();
        let left: Vec<_> = (l.peek_each(&["alice", "all"], 1).await.unwrap())
            .limits()
            .map(|l| l.remaining())
            .collect();
        assert_eq!(left, [2, 3], "{name}");
        let d = l.check_each(&["alice", "all"], 2).await.unwrap();
        assert!(d.is_allowed());
        assert!(
            !l.peek_each(&["alice", "all"], 1)
                .await
                .unwrap()
                .is_allowed()
        );
        l.reset_each(&["alice", "all"]).await.unwrap();
        assert!(
            l.peek_each(&["alice", "all"], 2)
                .await
                .unwrap()
                .is_allowed()
        );
        l.reset("bob").await.unwrap();
    }
}
