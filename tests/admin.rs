//! The admin and business-code API beside `check`: `peek` spends nothing
//! and says when a request would fit, `reset` starts a client afresh (store
//! and deny caches, this replica at once and others within the deny cache's
//! max age), and `until_ready` waits until a request fits, never past its
//! bound, without two replicas together passing the quota.

mod support;

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redis::AsyncCommands;
use redis_ratelimit::{Decision, Limiter, Quota};
use support::{
    Backend, RedisServer, TEST_TIMEOUT, for_every_store,
    limits::{admitted, algorithms, limiter},
};

/// How many counters the backend holds.
async fn held(b: &Backend) -> usize {
    match b {
        Backend::Memory(m) => m.len(),
        Backend::Redis(server, _) => server.keys_with_ttl().await.len(),
    }
}

async fn a_peek_spends_nothing_and_says_when(b: Backend) {
    for (name, quota) in algorithms(3, "10s") {
        let l = limiter(&b, name, quota);
        let before = held(&b).await;
        let fresh = l.peek("new", 2).await.unwrap();
        assert!(fresh.is_allowed(), "{name}");
        assert_eq!(
            (fresh.remaining(), fresh.retry_after()),
            (3, None),
            "{name}"
        );
        assert_eq!(held(&b).await, before, "{name}: a peek stored a counter");
        assert!(l.check("k", 2).await.unwrap().is_allowed());
        for _ in 0..5 {
            let p = l.peek("k", 2).await.unwrap();
            assert!(!p.is_allowed(), "{name}");
            assert_eq!(p.remaining(), 1, "{name}");
            let wait = p.retry_after().expect("a denied peek says when");
            assert!(
                wait > Duration::ZERO && wait <= Duration::from_secs(20),
                "{name} {wait:?}"
            );
            assert!(l.peek("k", 1).await.unwrap().is_allowed(), "{name}");
        }
        // Nothing spent by the peeks: exactly one more fits.
        assert_eq!(admitted(&l, "k", 3).await, 1, "{name}");
        let denied = l.check("k", 1).await.unwrap();
        let peek = l.peek("k", 1).await.unwrap();
        assert_eq!(peek.retry_after().is_some(), denied.retry_after().is_some());
    }
    if let Some(server) = b.server() {
        server.assert_every_key_has_ttl().await;
    }
}

async fn peek_each_decides_every_limit(b: Backend) {
    let l = b
        .builder("2/10s")
        .name("user")
        .limit("all", Quota::per_minute(3))
        .build()
        .unwrap();
    assert!(l.check_each(&["a", "all"], 2).await.unwrap().is_allowed());
    let by_user = l.peek_each(&["a", "all"], 1).await.unwrap();
    assert_eq!((by_user.is_allowed(), by_user.policy()), (false, "user"));
    let other = l.peek_each(&["b", "all"], 1).await.unwrap();
    let left: Vec<_> = other.limits().map(|l| l.remaining()).collect();
    assert!(other.is_allowed());
    assert_eq!(left, [2, 1]);
    assert!(!l.peek_each(&["b", "all"], 2).await.unwrap().is_allowed());
}

async fn reset_starts_a_client_afresh(b: Backend) {
    for (name, quota) in algorithms(2, "1h") {
        let l = b
            .builder_for(quota)
            .name(format!("{name}-user"))
            .limit(format!("{name}-day"), Quota::per_day(3))
            .build()
            .unwrap();
        assert_eq!(admitted(&l, "k", 3).await, 2, "{name}");
        assert_eq!(admitted(&l, "other", 1).await, 1, "{name}");
        l.reset("k").await.unwrap();
        assert_eq!(admitted(&l, "k", 3).await, 2, "{name}: reset at once");
        // Other clients keep their counts.
        assert_eq!(admitted(&l, "other", 2).await, 1, "{name}");
        l.reset_each(&["k", "k"]).await.unwrap();
        assert_eq!(admitted(&l, "k", 3).await, 2, "{name}");
    }
    if let Some(server) = b.server() {
        server.assert_every_key_has_ttl().await;
    }
}

for_every_store!(
    a_peek_spends_nothing_and_says_when,
    peek_each_decides_every_limit,
    reset_starts_a_client_afresh,
);

/// A limiter on its own connection to `server`, as a replica would have.
async fn replica(server: &RedisServer, quota: &str, max_age: Duration) -> Limiter {
    Limiter::builder(quota.parse().unwrap())
        .name("api")
        .share_counters()
        .store(server.store().await)
        .timeout(TEST_TIMEOUT)
        .deny_cache_max_age(max_age)
        .build()
        .unwrap()
}

/// Fails on the code before `deny_cache_max_age`: a denial cached for an
/// hour outlived an operator's `DEL` of the counter by the whole window.
#[tokio::test]
async fn a_deleted_counter_is_seen_within_the_max_age() {
    let server = RedisServer::start();
    let l = server.limiter("1/1h").await;
    assert!(l.check("k", 1).await.unwrap().is_allowed());
    assert!(!l.check("k", 1).await.unwrap().is_allowed());
    let mut conn = server.conn().await;
    let _: () = conn.del(l.store_key("k")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(l.check("k", 1).await.unwrap().is_allowed());
}

#[tokio::test]
async fn a_reset_reaches_this_replica_at_once_and_others_within_the_max_age() {
    let server = RedisServer::start();
    let a = replica(&server, "1/1h", Duration::from_secs(3600)).await;
    let b = replica(&server, "1/1h", Duration::from_millis(300)).await;
    assert!(a.check("k", 1).await.unwrap().is_allowed());
    // Both cache the denial.
    assert!(!a.check("k", 1).await.unwrap().is_allowed());
    assert!(!b.check("k", 1).await.unwrap().is_allowed());
    a.reset("k").await.unwrap();
    let left = server.keys_with_ttl().await;
    assert!(
        left.iter().all(|(key, _)| key.contains("#rs:")),
        "only the reset's marker is left: {left:?}"
    );
    assert!(
        a.check("k", 1).await.unwrap().is_allowed(),
        "own deny cache cleared"
    );
    assert!(a.reset("k").await.is_ok());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        b.check("k", 1).await.unwrap().is_allowed(),
        "the other replica's cache aged out"
    );
}

/// A reset forgets every denial this limiter cached, not only its own
/// key's: with a limit all clients share, another client's denial came from
/// the shared counter the reset deleted. Fails when a reset forgets only
/// the cached denial of the keys it reset: `b` stays denied from the cache
/// for the max age (an hour here).
#[tokio::test]
async fn a_reset_of_a_shared_limit_frees_other_clients_cached_denials() {
    let server = RedisServer::start();
    let l = Limiter::builder("5/1h".parse().unwrap())
        .name("user")
        .limit("all", Quota::per_hour(2))
        .store(server.store().await)
        .timeout(TEST_TIMEOUT)
        .deny_cache_max_age(Duration::from_secs(3600))
        .build()
        .unwrap();
    assert!(l.check_each(&["a", "all"], 2).await.unwrap().is_allowed());
    server.reset_stats().await;
    for _ in 0..3 {
        let d = l.check_each(&["b", "all"], 1).await.unwrap();
        assert_eq!((d.is_allowed(), d.policy()), (false, "all"));
    }
    assert_eq!(server.script_calls().await, 1, "b's denial was cached");
    l.reset_each(&["a", "all"]).await.unwrap();
    let d = l.check_each(&["b", "all"], 1).await.unwrap();
    assert!(
        d.is_allowed(),
        "b denied from the cache after a reset, by {}",
        d.policy()
    );
}

/// Fails without the deny cache's epoch: a denial Redis made before a
/// reset, read by its caller only after the reset had cleared this
/// replica's cache, was cached then, and repeated to the client the reset
/// had freed for the cache's max age (1 s).
#[tokio::test]
async fn a_denial_read_after_a_reset_is_not_cached() {
    let server = RedisServer::start();
    let l = server.limiter("1/1h").await;
    assert!(l.check("k", 1).await.unwrap().is_allowed());
    server.reset_stats().await;
    let mut stale = Box::pin(l.check("k", 1));
    assert!(futures_util::poll!(stale.as_mut()).is_pending());
    // Redis decides it; its reply waits, unread, for its caller.
    let asked = Instant::now();
    while server.script_calls().await == 0 {
        assert!(
            asked.elapsed() < TEST_TIMEOUT,
            "the check never reached Redis"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    l.reset("k").await.unwrap();
    assert!(
        !stale.await.unwrap().is_allowed(),
        "decided before the reset"
    );
    assert!(
        l.check("k", 1).await.unwrap().is_allowed(),
        "the reset freed the client"
    );
    // A denial made after the reset is cached as ever: one script call.
    server.reset_stats().await;
    for _ in 0..3 {
        assert!(!l.check("k", 1).await.unwrap().is_allowed());
    }
    assert_eq!(server.script_calls().await, 1, "cached after the reset");
}

#[tokio::test]
async fn a_peek_neither_fills_nor_trusts_the_deny_cache() {
    let server = RedisServer::start();
    let l = server.limiter("2/1h").await;
    assert_eq!(admitted(&l, "k", 2).await, 2); // no denial cached
    assert!(!l.peek("k", 1).await.unwrap().is_allowed());
    let mut conn = server.conn().await;
    let _: () = conn.del(l.store_key("k")).await.unwrap();
    assert!(
        l.check("k", 1).await.unwrap().is_allowed(),
        "the peek's denial was cached"
    );
    // Nor trusts it: a denial cached by a check is not a peek's answer.
    assert_eq!(admitted(&l, "k", 2).await, 1); // the second denied, cached
    let _: () = conn.del(l.store_key("k")).await.unwrap();
    assert!(
        l.peek("k", 1).await.unwrap().is_allowed(),
        "the peek answered from the deny cache"
    );
}

/// Two replicas throttling calls to one partner API at 4 per 400 ms: every
/// caller gets through, and no window admits more than 4.
#[tokio::test]
async fn until_ready_throttles_across_replicas() {
    let server = RedisServer::start();
    let a = replica(&server, "4/400ms", Duration::from_secs(1)).await;
    let b = replica(&server, "4/400ms", Duration::from_secs(1)).await;
    let started = Instant::now();
    let callers = (0..16).map(|i| {
        let l = if i % 2 == 0 { a.clone() } else { b.clone() };
        async move {
            let d = l
                .until_ready("partner", 1, Duration::from_secs(20))
                .await
                .unwrap();
            // The window this admission counts in, by its end.
            (d.is_allowed(), Instant::now() + d.reset_after())
        }
    });
    let results = join_all(callers).await;
    assert!(results.iter().all(|r| r.0), "every caller got through");
    // 16 calls at 4 per window need at least 3 windows after the first.
    assert!(
        started.elapsed() >= Duration::from_millis(1100),
        "{:?}",
        started.elapsed()
    );
    let mut ends: Vec<Instant> = results.iter().map(|r| r.1).collect();
    ends.sort();
    let mut groups = vec![1];
    for pair in ends.windows(2) {
        if pair[1] - pair[0] > Duration::from_millis(150) {
            groups.push(0);
        }
        *groups.last_mut().unwrap() += 1;
    }
    assert!(
        groups.iter().all(|&n| n <= 4),
        "admissions per window: {groups:?}"
    );
}

#[tokio::test]
async fn until_ready_returns_at_once_when_the_wait_is_too_long() {
    let server = RedisServer::start();
    let l = server.limiter("1/10s").await;
    assert!(l.check("k", 1).await.unwrap().is_allowed());
    let started = Instant::now();
    let d = l.until_ready("k", 1, Duration::from_secs(3)).await.unwrap();
    assert!(!d.is_allowed());
    assert!(d.retry_after() > Some(Duration::from_secs(3)));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn until_ready_waits_for_the_window_and_no_longer_than_allowed() {
    let l = Limiter::new("2/1s".parse().unwrap());
    assert_eq!(admitted(&l, "k", 2).await, 2);
    let started = tokio::time::Instant::now();
    let d = l.until_ready("k", 1, Duration::from_secs(5)).await.unwrap();
    assert!(d.is_allowed());
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(1) && waited <= Duration::from_millis(1130),
        "{waited:?}"
    );
    // The window is full again: a 100 ms bound returns the denial, unslept.
    assert!(l.check("k", 1).await.unwrap().is_allowed());
    let started = tokio::time::Instant::now();
    let d = l
        .until_ready("k", 1, Duration::from_millis(100))
        .await
        .unwrap();
    assert!(!d.is_allowed());
    assert_eq!(started.elapsed(), Duration::ZERO);
}

/// A store written before peek, refund and reset: it still compiles, its
/// limiters still check, and the new calls are errors, never a lifted limit.
#[derive(Debug)]
struct OldStore(redis_ratelimit::MemoryStore);

impl redis_ratelimit::Store for OldStore {
    fn decide(
        &self,
        checks: Vec<redis_ratelimit::LimitCheck>,
        cost: u64,
    ) -> redis_ratelimit::store::BoxFuture<
        'static,
        Result<Vec<redis_ratelimit::LimitState>, redis_ratelimit::Error>,
    > {
        self.0.decide(checks, cost)
    }
}

#[tokio::test]
async fn a_custom_store_without_the_new_methods_reports_them_unsupported() {
    use redis_ratelimit::Error;
    let l = Limiter::builder(Quota::per_minute(1))
        .store(OldStore(redis_ratelimit::MemoryStore::new()))
        .build()
        .unwrap();
    let d = l.check("k", 1).await.unwrap();
    assert!(d.is_allowed());
    assert!(matches!(
        l.peek("k", 1).await,
        Err(Error::Unsupported("peek"))
    ));
    assert!(matches!(
        l.refund("k", &d).await,
        Err(Error::Unsupported("refund"))
    ));
    assert!(matches!(
        l.reset("k").await,
        Err(Error::Unsupported("reset"))
    ));
    assert!(!l.check("k", 1).await.unwrap().is_allowed());
    // A missing method is not a failing store: peeks do not open the
    // breaker (5 failures in a second), which would lift the limit under
    // `OnStoreError::Allow`.
    for _ in 0..10 {
        assert!(matches!(l.peek("k", 1).await, Err(Error::Unsupported(_))));
    }
    let after = l.check("k", 1).await;
    assert!(after.as_ref().is_ok_and(|d| !d.is_allowed()), "{after:?}");
}

/// A store that answers every check with no state at all.
#[derive(Debug)]
struct StatelessStore;

impl redis_ratelimit::Store for StatelessStore {
    fn decide(
        &self,
        _: Vec<redis_ratelimit::LimitCheck>,
        _: u64,
    ) -> redis_ratelimit::store::BoxFuture<
        'static,
        Result<Vec<redis_ratelimit::LimitState>, redis_ratelimit::Error>,
    > {
        Box::pin(async { Ok(Vec::new()) })
    }
}

/// A reply without one state per limit is a failing store, for the
/// breaker as for the caller: it opens after its failures (each in a
/// millisecond of its own: those of one millisecond count as one).
#[tokio::test]
async fn a_reply_of_the_wrong_shape_counts_as_a_failure() {
    use redis_ratelimit::{Breaker, Error};
    let l = Limiter::builder(Quota::per_minute(1))
        .store(StatelessStore)
        .breaker(Breaker::new().failures(2))
        .build()
        .unwrap();
    for _ in 0..2 {
        let r = l.check("k", 1).await;
        assert!(matches!(r, Err(Error::UnexpectedReply(_))), "{r:?}");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let r = l.check("k", 1).await;
    assert!(matches!(r, Err(Error::CircuitOpen)), "{r:?}");
}

/// Fails with ':' before a marker's kind: with several limits, a limiter's
/// keys end in the raw client part, so the client named `alice:rf:<id>`
/// had the counter that is alice's refund marker, and could make that
/// refund (or a reset) of alice's do nothing, or start its own counter
/// from her marker's value and 10 s TTL.
#[tokio::test]
async fn no_client_key_spells_another_clients_refund_or_reset_marker() {
    let server = RedisServer::start();
    let l = Limiter::builder(Quota::per_minute(5))
        .name("a")
        .limit("b", Quota::per_day(9))
        .store(server.store().await)
        .timeout(TEST_TIMEOUT)
        .build()
        .unwrap();
    let d = l.check("alice", 1).await.unwrap();
    l.refund("alice", &d).await.unwrap();
    l.check("alice", 1).await.unwrap();
    l.reset("alice").await.unwrap();
    let counters = l.store_keys("alice");
    let prefix = counters[0].strip_suffix("alice").unwrap();
    let markers: Vec<String> = (server.keys_with_ttl().await.into_iter())
        .map(|(key, _)| key)
        .filter(|key| !counters.contains(key))
        .collect();
    assert_eq!(markers.len(), 2, "a refund's and a reset's: {markers:?}");
    for marker in &markers {
        // The client a counter of that name would need.
        let client = marker.strip_prefix(prefix).unwrap();
        assert_ne!(&l.store_keys(client)[0], marker, "client {client:?}");
    }
}

/// reset.lua sent again (its first reply lost) finds its first run's marker
/// (`lua/once.lua`) and deletes nothing: what was charged since stays
/// charged. A call without its marker, or with another, is refused before it
/// deletes anything.
#[tokio::test]
async fn a_reset_sent_again_forgets_nothing_charged_since() {
    let server = RedisServer::start();
    let l = server.limiter("5/1h").await;
    assert_eq!(admitted(&l, "k", 5).await, 5);
    let key = l.store_key("k");
    let marker = format!("{key}#rs:ab-1");
    let script = redis::Script::new(redis_ratelimit::store::RESET_LUA);
    let mut conn = server.conn().await;
    let other = format!("{key}#rs:ab-2");
    let bad: [(&[&str], &[&str]); 4] = [
        (&[&key], &["ab-1"]),
        (&[&key, &marker], &[]),
        (&[&key, &other], &["ab-1"]),
        (&[&key, &marker], &["ab-1", "x"]),
    ];
    for (keys, argv) in bad {
        let r: redis::RedisResult<i64> = support::invocation(&script, keys, argv)
            .invoke_async(&mut conn)
            .await;
        assert!(r.is_err(), "{keys:?} {argv:?} accepted: {r:?}");
        assert!(
            conn.exists::<_, bool>(&key).await.unwrap(),
            "{keys:?} {argv:?} deleted"
        );
    }
    for (run, deletes, then) in [(1, 1, 2), (2, 0, 0)] {
        let deleted: i64 = support::invocation(&script, &[&key, &marker], &["ab-1"])
            .invoke_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(deleted, deletes, "run {run}");
        assert_eq!(admitted(&l, "k", then).await, then, "run {run}");
    }
    assert_eq!(
        l.peek("k", 1).await.unwrap().remaining(),
        3,
        "the two charged since the reset"
    );
    let ttl: i64 = conn.pttl(&marker).await.unwrap();
    assert!(
        (9_000..=10_000).contains(&ttl),
        "the marker's TTL: {ttl} ms"
    );
    server.assert_every_key_has_ttl().await;
}

/// A refund or reset to a dead Redis is an error, not a panic or a hang.
#[tokio::test]
async fn refunds_and_resets_to_a_dead_redis_are_errors() {
    let mut server = RedisServer::start();
    let l = server.limiter("5/1m").await;
    let d = l.check("k", 1).await.unwrap();
    server.kill();
    assert!(l.refund("k", &d).await.is_err());
    assert!(l.reset("k").await.is_err());
    assert!(l.peek("k", 1).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn until_ready_each_waits_for_every_limit() {
    let l = Limiter::builder("5/1s".parse().unwrap())
        .name("user")
        .limit("all", "2/10s".parse().unwrap())
        .build()
        .unwrap();
    let keys = ["a", "all"];
    for _ in 0..2 {
        let d = l
            .until_ready_each(&keys, 1, Duration::from_secs(1))
            .await
            .unwrap();
        assert!(d.is_allowed());
    }
    // "all" is full for 10 s: a 1 s bound returns its denial at once.
    let d = l
        .until_ready_each(&keys, 1, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!((d.is_allowed(), d.policy()), (false, "all"));
    let d = l
        .until_ready_each(&keys, 1, Duration::from_secs(11))
        .await
        .unwrap();
    assert!(d.is_allowed());
}

/// Two limiters on one Redis, their deny caches on and off, with `quotas`.
async fn cached_and_not(server: &RedisServer, quotas: &[(&str, Quota)]) -> (Limiter, Limiter) {
    let build = |cache| {
        let store = server.store();
        async move {
            let mut b = Limiter::builder(quotas[0].1).name(quotas[0].0);
            for (name, quota) in &quotas[1..] {
                b = b.limit(*name, *quota);
            }
            b.share_counters()
                .store(store.await)
                .timeout(TEST_TIMEOUT)
                .deny_cache(cache)
                .build()
                .unwrap()
        }
    };
    (build(1000).await, build(0).await)
}

/// Fails with every fixed-window denial answering larger costs: the
/// second's limit denied cost 1 while the day's admitted it with 2 left,
/// and a request of cost 3, which the day's limit denies for a day, was
/// told from the cache to retry within a second.
#[tokio::test]
async fn a_cached_denial_by_one_limit_does_not_answer_a_cost_another_denies() {
    let server = RedisServer::start();
    let quotas = [
        ("second", "10/1s".parse().unwrap()),
        ("day", "12/1d".parse().unwrap()),
    ];
    let (cached, store) = cached_and_not(&server, &quotas).await;
    assert!(cached.check("k", 10).await.unwrap().is_allowed());
    let first = cached.check("k", 1).await.unwrap();
    assert!(!first.is_allowed());
    assert_eq!(first.policy(), "second");
    let (told, truth) = told_and_truth(&cached, &store, 3).await;
    assert!(
        truth.retry_after().unwrap() > Duration::from_secs(3600),
        "the day's limit denies cost 3: {truth:?}"
    );
    assert_eq!(told.policy(), "day", "{told:?}");
}

/// What the cached limiter tells a request of `cost` for "k", and what the
/// uncached one does: both denials, the cached wait no shorter than the
/// store's (less a second for the time between them).
async fn told_and_truth(cached: &Limiter, store: &Limiter, cost: u64) -> (Decision, Decision) {
    let told = cached.check("k", cost).await.unwrap();
    let truth = store.check("k", cost).await.unwrap();
    assert!(!told.is_allowed() && !truth.is_allowed());
    assert!(
        told.retry_after() >= truth.retry_after().map(|w| w - Duration::from_secs(1)),
        "told {told:?}, Redis says {truth:?}"
    );
    (told, truth)
}

/// Fails with a refund dropping only its own keys' cached denial: client
/// b was denied by the global limit, a's refund freed a unit of it, and b
/// was still denied from the cache, with no store call.
#[tokio::test]
async fn a_refund_of_a_shared_limit_frees_other_clients_cached_denials() {
    let server = RedisServer::start();
    let quotas = [
        ("per-key", "100/1m".parse().unwrap()),
        ("global", "3/1m".parse().unwrap()),
    ];
    let (l, _) = cached_and_not(&server, &quotas).await;
    let mut last = None;
    for _ in 0..3 {
        let d = l.check_each(&["a", "all"], 1).await.unwrap();
        assert!(d.is_allowed());
        last = Some(d);
    }
    let denied = l.check_each(&["b", "all"], 1).await.unwrap();
    assert!(!denied.is_allowed());
    assert_eq!(denied.policy(), "global");
    l.refund_each(&["a", "all"], &last.unwrap()).await.unwrap();
    assert!(
        l.check_each(&["b", "all"], 1).await.unwrap().is_allowed(),
        "a's refund freed a unit of the global limit"
    );
}

/// Fails without the cache forgetting a denial on an admission: a GCRA
/// denial of cost 5 outlived the admission of cost 1 that lengthened its
/// wait, and the next request of cost 5 was told the shorter wait.
#[tokio::test]
async fn an_admission_of_another_cost_drops_a_gcra_denial_it_lengthened() {
    let server = RedisServer::start();
    let gcra: Quota = "10/1m".parse::<Quota>().unwrap().gcra(10).unwrap();
    let (cached, store) = cached_and_not(&server, &[("api", gcra)]).await;
    assert!(cached.check("k", 8).await.unwrap().is_allowed());
    assert!(!cached.check("k", 5).await.unwrap().is_allowed());
    assert!(cached.check("k", 1).await.unwrap().is_allowed());
    // The admission of cost 1 added 6 s to the wait for 5.
    told_and_truth(&cached, &store, 5).await;
}

/// A peek of a counter whose TTL is longer than its window (one from
/// before the window was shortened) heals it on a master, as a check
/// would, so the wait it tells is true. Fails with a peek that only said
/// what the heal would leave: told a second, and denied a second later
/// (the counter still had its two hours).
#[tokio::test]
async fn a_peeks_wait_is_kept_for_a_counter_whose_ttl_was_too_long() {
    let server = RedisServer::start();
    let l = Limiter::builder("2/1s".parse().unwrap())
        .store(server.store().await)
        .timeout(TEST_TIMEOUT)
        .deny_cache(0)
        .build()
        .unwrap();
    let mut conn = server.conn().await;
    let _: () = conn
        .set_options(
            l.store_key("k"),
            5,
            redis::SetOptions::default().with_expiration(redis::SetExpiry::PX(7_200_000)),
        )
        .await
        .unwrap();
    let peeked = l.peek("k", 1).await.unwrap();
    assert!(!peeked.is_allowed());
    let wait = peeked.retry_after().unwrap();
    assert!(wait <= Duration::from_secs(1), "{peeked:?}");
    tokio::time::sleep(wait).await;
    let d = l.check("k", 1).await.unwrap();
    assert!(d.is_allowed(), "told {wait:?}, then {d:?}");
}

/// A limiter of 1 an hour on a Redis 100 ms away each way, its deny cache
/// keeping a denial for a minute, with "k" spent and its denial cached.
async fn spent_behind_a_proxy() -> (RedisServer, support::delay::DelayProxy, Limiter, Decision) {
    let server = RedisServer::start();
    let proxy = support::delay::DelayProxy::start(server.port(), Duration::from_millis(100)).await;
    let store = redis_ratelimit::RedisStore::connect(proxy.url())
        .await
        .unwrap();
    let l = Limiter::builder(Quota::per_hour(1))
        .store(store)
        .timeout(Duration::from_secs(2))
        .deny_cache_max_age(Duration::from_secs(60))
        .build()
        .unwrap();
    let spent = l.check("k", 1).await.unwrap();
    assert!(spent.is_allowed());
    assert!(!l.check("k", 1).await.unwrap().is_allowed());
    (server, proxy, l, spent)
}

/// Waits (5 s at most) until Redis has run a reset or refund: its marker
/// key (`<key>#rs:<id>` or `<key>#rf:<id>`, written by the script with
/// its change) is there. Every key, then.
async fn ran_in_redis(server: &RedisServer, marker: &str) -> Vec<String> {
    let mut conn = server.conn().await;
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let keys: Vec<String> = conn.keys("*").await.unwrap();
        if keys.iter().any(|k| k.contains(marker)) {
            return keys;
        }
        assert!(Instant::now() < until, "Redis never ran it: {keys:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A reset whose future is dropped after its call went out (a timeout
/// around it, an admin handler whose client went away) still forgets this
/// limiter's cached denials: Redis runs the delete it was sent, and the
/// client it reset is admitted. The cache was cleared only once the reset
/// was awaited to its end, so the client stayed denied from the cache for
/// as long as its denial was cached (here a minute).
#[tokio::test]
async fn a_reset_dropped_after_its_call_went_out_still_forgets_cached_denials() {
    let (server, _proxy, l, _) = spent_behind_a_proxy().await;
    // Out on the wire (100 ms to Redis), then given up before its answer.
    let given_up = tokio::time::timeout(Duration::from_millis(150), l.reset("k")).await;
    assert!(given_up.is_err(), "{given_up:?}");
    let keys = ran_in_redis(&server, "#rs:").await;
    // Only the reset's own marker (`<key>#rs:<id>`) is left.
    assert!(
        keys.iter().all(|k| k.contains("#rs:")),
        "Redis ran the delete: {keys:?}"
    );
    let d = l.check("k", 1).await.unwrap();
    assert!(d.is_allowed(), "denied from the cache after a reset: {d:?}");
}

/// The same for a refund: given up after its call went out, it still
/// forgets the key's cached denial, so the unit Redis credits is admitted.
#[tokio::test]
async fn a_refund_dropped_after_its_call_went_out_still_forgets_cached_denials() {
    let (server, _proxy, l, spent) = spent_behind_a_proxy().await;
    let given_up = tokio::time::timeout(Duration::from_millis(150), l.refund("k", &spent)).await;
    assert!(given_up.is_err(), "{given_up:?}");
    let keys = ran_in_redis(&server, "#rf:").await;
    let mut conn = server.conn().await;
    // The counter credited back to nothing (gone, or 0); the refund's own
    // marker (`<key>#rf:<id>`) aside.
    for key in keys.iter().filter(|k| !k.contains("#rf:")) {
        let count: Option<u64> = conn.get(key).await.unwrap();
        assert_eq!(count.unwrap_or(0), 0, "Redis credited the unit: {keys:?}");
    }
    let d = l.check("k", 1).await.unwrap();
    assert!(
        d.is_allowed(),
        "denied from the cache after a refund: {d:?}"
    );
}
