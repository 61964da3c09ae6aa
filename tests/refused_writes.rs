//! Redis refusing writes: out of memory (`maxmemory` reached under
//! `noeviction`) or a read-only replica. A check that must write fails with
//! the store's error, which the layer answers by its `OnStoreError` policy;
//! a check Redis can answer without writing (a denial the sliding window,
//! GCRA or a full concurrency key reach by reading alone) is answered. No
//! refusal ever admits, resets or changes a counter.
//!
//! Each rate-limit test runs for the three algorithms on "3/1h" (GCRA with a
//! burst of 3) against three keys: `spent` (3 admitted, then denied), `used`
//! (1 admitted) and `fresh` (never seen).

mod support;

use std::time::Duration;

use axum::{Router, routing::get};
use redis::AsyncCommands;
use redis_ratelimit::{
    Breaker, Decision, Error, Limiter, OnStoreError, Quota, RateLimitLayer, RedisStore,
    concurrency::{Acquired, ConcurrencyLimiter, InFlightLimitLayer, Lease},
    key::Header,
};
use support::{
    RedisServer, TEST_TIMEOUT,
    http::Caller,
    lease, limits,
    servers::{app, spawn_axum},
};

const KEYS: [&str; 3] = ["spent", "used", "fresh"];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Algo {
    Fixed,
    Sliding,
    Gcra,
}

impl Algo {
    fn quota(self) -> Quota {
        let q: Quota = "3/1h".parse().unwrap();
        match self {
            Algo::Fixed => q,
            Algo::Sliding => q.sliding_window(),
            Algo::Gcra => q.gcra(3).unwrap(),
        }
    }

    /// Whether a denial of `spent` needs a write. The fixed window spends
    /// first and takes the spend back (INCRBY, then DECRBY), so Redis refuses
    /// it; the sliding window and GCRA deny by reading alone, which Redis
    /// answers: a correct denial, not an error.
    fn denial_writes(self) -> bool {
        self == Algo::Fixed
    }
}

/// A limiter that sends every check to `store`: no deny cache, no breaker.
fn limiter(algo: Algo, store: RedisStore) -> Limiter {
    limits::every_check(algo.quota(), store)
        .name("l")
        // The servers of one test are one service's replicas on purpose.
        .share_counters()
        .build()
        .unwrap()
}

/// `spent` used up (and denied once), `used` 1 of 3.
async fn spend(limiter: &Limiter, log: &str) {
    for remaining in [2, 1, 0] {
        let d = limiter.check("spent", 1).await.unwrap();
        assert!(d.is_allowed() && d.remaining() == remaining, "{d:?}\n{log}");
    }
    let d = limiter.check("spent", 1).await.unwrap();
    assert!(!d.is_allowed(), "{d:?}\n{log}");
    let d = limiter.check("used", 1).await.unwrap();
    assert!(d.is_allowed() && d.remaining() == 2, "{d:?}\n{log}");
}

/// The raw value of every key.
async fn dumps(server: &RedisServer, limiter: &Limiter) -> Vec<Option<Vec<u8>>> {
    let mut out = Vec::new();
    for key in KEYS {
        out.push(server.dump(&limiter.store_key(key)).await);
    }
    out
}

/// After the refusal: `spent` still denied, `used` at 1 of 3 (so 1 left
/// after this check), `fresh` untouched (2 left after its first check).
async fn counters_untouched(limiter: &Limiter, log: &str) {
    let d = limiter.check("spent", 1).await.unwrap();
    assert!(!d.is_allowed(), "spent was reset: {d:?}\n{log}");
    let d = limiter.check("used", 1).await.unwrap();
    assert!(
        d.is_allowed() && d.remaining() == 1,
        "used changed: {d:?}\n{log}"
    );
    let d = limiter.check("fresh", 1).await.unwrap();
    assert!(
        d.is_allowed() && d.remaining() == 2,
        "fresh changed: {d:?}\n{log}"
    );
}

/// Every check of `limiter` while Redis refuses writes: an error naming
/// `refusal` (`OOM`, `read only replica`), or, for a denial that needs no write, the
/// denial. Never an admission.
async fn checks_refused(algo: Algo, limiter: &Limiter, refusal: &str, log: &str) {
    for key in KEYS {
        for _ in 0..3 {
            let result = limiter.check(key, 1).await;
            match result {
                Ok(d) if key == "spent" && !algo.denial_writes() => {
                    assert!(!d.is_allowed(), "{algo:?} {key}: admitted {d:?}\n{log}");
                }
                Err(Error::Redis(e)) if e.to_string().contains(refusal) => {}
                other => panic!("{algo:?} {key}: expected a {refusal} error, got {other:?}\n{log}"),
            }
        }
    }
}

async fn oom_is_a_store_error(algo: Algo) {
    let server = RedisServer::start();
    let limiter = limiter(algo, server.store().await);
    spend(&limiter, &server.log()).await;
    let before = dumps(&server, &limiter).await;

    server.refuse_writes(true).await;
    checks_refused(algo, &limiter, "OOM", &server.log()).await;
    server.refuse_writes(false).await;

    assert_eq!(dumps(&server, &limiter).await, before, "{algo:?}");
    counters_untouched(&limiter, &server.log()).await;
    server.assert_every_key_has_ttl().await;
}

#[tokio::test]
async fn oom_fixed_window_is_a_store_error_and_keeps_the_counter() {
    oom_is_a_store_error(Algo::Fixed).await;
}

#[tokio::test]
async fn oom_sliding_window_is_a_store_error_and_keeps_the_counter() {
    oom_is_a_store_error(Algo::Sliding).await;
}

#[tokio::test]
async fn oom_gcra_is_a_store_error_and_keeps_the_counter() {
    oom_is_a_store_error(Algo::Gcra).await;
}

/// A GCRA key booked beyond a lowered burst (a wider quota's replica) is
/// denied by reading alone: out of memory it is still the denial, not an
/// error (which the `Allow` policy would admit), and the booking and its
/// TTL are left as they were.
#[tokio::test]
async fn oom_gcra_beyond_a_lowered_burst_is_still_a_denial() {
    let server = RedisServer::start();
    let wide = limits::every_check(
        "3/1h".parse::<Quota>().unwrap().gcra(3).unwrap(),
        server.store().await,
    )
    .name("l")
    .share_counters()
    .build()
    .unwrap();
    for _ in 0..3 {
        assert!(wide.check("spent", 1).await.unwrap().is_allowed());
    }
    let narrow = limits::every_check(
        "3/1h".parse::<Quota>().unwrap().gcra(1).unwrap(),
        server.store().await,
    )
    .name("l")
    .share_counters()
    .build()
    .unwrap();
    let key = narrow.store_key("spent");
    let before = server.dump(&key).await;
    server.refuse_writes(true).await;
    for _ in 0..3 {
        let d = narrow.check("spent", 1).await;
        assert!(
            matches!(&d, Ok(d) if !d.is_allowed()),
            "{d:?}\n{}",
            server.log()
        );
    }
    server.refuse_writes(false).await;
    assert_eq!(server.dump(&key).await, before);
    // The wide booking is 3,600,000 ms; a full narrow bucket 1,200,000.
    let ttls = server.keys_with_ttl().await;
    let ttl = ttls.iter().find(|(k, _)| *k == key).map(|(_, t)| *t);
    assert!(
        matches!(ttl, Some(3_500_000..=3_600_001)),
        "{key}: {ttls:?}"
    );
}

/// A reset is how an operator lets a client back in, and may be wanted
/// most while Redis is out of memory. It only deletes, which Redis allows
/// then (it frees memory): the reset is made, and so is its marker, written
/// after the DEL (`lua/once.lua`), so a resend would delete nothing more.
/// Another client's counter is kept.
#[tokio::test]
async fn oom_a_reset_still_forgets_the_counters() {
    let server = RedisServer::start();
    let limiter = limiter(Algo::Fixed, server.store().await);
    spend(&limiter, &server.log()).await;

    server.refuse_writes(true).await;
    limiter
        .reset("spent")
        .await
        .unwrap_or_else(|e| panic!("reset refused: {e}\n{}", server.log()));
    let keys = server.keys_with_ttl().await;
    server.refuse_writes(false).await;

    let spent = limiter.store_key("spent");
    let mut names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
    names.sort();
    assert!(
        names.len() == 2
            && names[0].starts_with(&format!("{spent}#rs:"))
            && names[1] == limiter.store_key("used"),
        "spent's counter gone, its reset's marker there, used kept: {keys:?}"
    );
    let d = limiter.check("spent", 1).await.unwrap();
    assert!(d.is_allowed() && d.remaining() == 2, "spent: {d:?}");
    let d = limiter.check("used", 1).await.unwrap();
    assert!(d.is_allowed() && d.remaining() == 1, "used: {d:?}");
    server.assert_every_key_has_ttl().await;
}

/// A peek spends nothing, so it needs no write, and Redis answers it out of
/// memory and on a read-only replica, for every algorithm: `spent` denied,
/// `used` and `fresh` allowed with what they have left. (A fixed window's
/// peek spent and took the spend back, and so failed on both.)
#[tokio::test]
async fn peeks_are_answered_when_redis_refuses_writes() {
    for algo in [Algo::Fixed, Algo::Sliding, Algo::Gcra] {
        let primary = RedisServer::start();
        let on_primary = limiter(algo, primary.store().await);
        spend(&on_primary, &primary.log()).await;
        let replica = primary.start_replica().await;
        let on_replica = limiter(algo, replica.lazy_store());
        primary.refuse_writes(true).await;
        for (limiter, server) in [(&on_primary, &primary), (&on_replica, &replica)] {
            for (key, allowed, remaining) in
                [("spent", false, 0), ("used", true, 2), ("fresh", true, 3)]
            {
                let d = limiter
                    .peek(key, 1)
                    .await
                    .unwrap_or_else(|e| panic!("{algo:?} {key}: {e}\n{}", server.log()));
                assert_eq!(
                    (d.is_allowed(), d.remaining()),
                    (allowed, remaining),
                    "{algo:?} {key}: {d:?}"
                );
            }
        }
        primary.refuse_writes(false).await;
        counters_untouched(&on_primary, &primary.log()).await;
    }
}

/// A sliding-window key whose TTL is a little longer than its expiry by
/// Redis's clock (a millisecond boundary between the script's start, from
/// which PTTL counts, and TIME; more across hosts, a replica's clock behind
/// its master's) is sane: a peek on a replica answers it. It was "healed",
/// a write, so such a peek failed with READONLY now and then (the flaky
/// peeks_are_answered_when_redis_refuses_writes, one run in three). Fails
/// without the slack of lua/sliding_window.lua's heal.
#[tokio::test]
async fn a_sliding_ttl_a_little_long_needs_no_write_to_peek() {
    let primary = RedisServer::start();
    let on_primary = limiter(Algo::Sliding, primary.store().await);
    spend(&on_primary, &primary.log()).await;
    let key = on_primary.store_key("used");
    let mut conn = primary.conn().await;
    let ttl: i64 = conn.pttl(&key).await.unwrap();
    let _: () = conn.pexpire(&key, ttl + 500).await.unwrap();
    let replica = primary.start_replica().await;
    let on_replica = limiter(Algo::Sliding, replica.lazy_store());
    let d = on_replica
        .peek("used", 1)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", replica.log()));
    assert_eq!((d.is_allowed(), d.remaining()), (true, 2), "{d:?}");
}

/// A key whose TTL is longer than a new one's (a fixed window's counter
/// set by a version before it, or before its window was shortened; any
/// key on a replica whose clock is behind its master's), or that has none,
/// is answered by a peek on a replica, as the heal would leave it. Fails
/// with the peek's heal a write that must succeed: READONLY.
#[tokio::test]
async fn a_peek_on_a_replica_heals_no_ttl_it_reads() {
    for algo in [Algo::Fixed, Algo::Sliding, Algo::Gcra] {
        let primary = RedisServer::start();
        let on_primary = limiter(algo, primary.store().await);
        spend(&on_primary, &primary.log()).await;
        let key = on_primary.store_key("used");
        let mut conn = primary.conn().await;
        let ttl: i64 = conn.pttl(&key).await.unwrap();
        let _: () = conn.pexpire(&key, ttl + 7_200_000).await.unwrap();
        let replica = primary.start_replica().await;
        for what in ["a long TTL", "no TTL"] {
            if what == "no TTL" {
                let _: () = conn.persist(&key).await.unwrap();
                let persisted = async {
                    while replica.conn().await.pttl::<_, i64>(&key).await.unwrap() != -1 {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                };
                tokio::time::timeout(Duration::from_secs(5), persisted)
                    .await
                    .expect("the replica never saw the PERSIST");
            }
            let d = peek_used(algo, &replica, what).await;
            assert_eq!(
                (d.is_allowed(), d.remaining()),
                (true, 2),
                "{algo:?}, {what}: {d:?}"
            );
            // A sliding window drains over two windows at most.
            let most = Duration::from_secs(7200);
            assert!(d.reset_after() <= most, "{algo:?}, {what}: {d:?}");
        }
    }
}

/// A peek of `used` at cost 1 by a limiter of `algo` on `replica`, which
/// must answer it (`what` names the case in the panic).
async fn peek_used(algo: Algo, replica: &RedisServer, what: &str) -> Decision {
    let on_replica = limiter(algo, replica.lazy_store());
    on_replica
        .peek("used", 1)
        .await
        .unwrap_or_else(|e| panic!("{algo:?}, {what}: {e}\n{}", replica.log()))
}

/// A fixed-window count that is not what we write, peeked on a replica,
/// which refuses its reset: the peek answers as the reset would leave the
/// key (a count of 0, a whole window), as on the master. Fails with the
/// peek reading the corrupt key's own TTL after its refused DEL (a reset
/// of 300 s, where the master says an hour).
#[tokio::test]
async fn a_peek_on_a_replica_reads_a_corrupt_count_as_a_fresh_window() {
    let primary = RedisServer::start();
    let key = limiter(Algo::Fixed, primary.store().await).store_key("used");
    let expiry = redis::SetOptions::default().with_expiration(redis::SetExpiry::PX(300_000));
    let mut conn = primary.conn().await;
    let _: () = conn.set_options(&key, "abc", expiry).await.unwrap();
    let replica = primary.start_replica().await;
    let d = peek_used(Algo::Fixed, &replica, "a corrupt count").await;
    assert_eq!((d.is_allowed(), d.remaining()), (true, 3), "{d:?}");
    assert!(d.reset_after() >= Duration::from_secs(3599), "{d:?}");
}

async fn read_only_replica_is_a_store_error(algo: Algo) {
    let primary = RedisServer::start();
    let on_primary = limiter(algo, primary.store().await);
    spend(&on_primary, &primary.log()).await;
    let replica = primary.start_replica().await;
    let before = dumps(&primary, &on_primary).await;
    assert_eq!(
        dumps(&replica, &on_primary).await,
        before,
        "replica out of sync"
    );

    // connect would refuse a replica at startup (tests/startup.rs); this
    // is a store that finds itself on one later.
    let on_replica = limiter(algo, replica.lazy_store());
    checks_refused(algo, &on_replica, "read only replica", &replica.log()).await;

    assert_eq!(dumps(&replica, &on_primary).await, before, "{algo:?}");
    assert_eq!(dumps(&primary, &on_primary).await, before, "{algo:?}");
    counters_untouched(&on_primary, &primary.log()).await;
}

#[tokio::test]
async fn read_only_replica_fixed_window_is_a_store_error() {
    read_only_replica_is_a_store_error(Algo::Fixed).await;
}

#[tokio::test]
async fn read_only_replica_sliding_window_is_a_store_error() {
    read_only_replica_is_a_store_error(Algo::Sliding).await;
}

#[tokio::test]
async fn read_only_replica_gcra_is_a_store_error() {
    read_only_replica_is_a_store_error(Algo::Gcra).await;
}

/// Over HTTP: one limiter's counters behind an `OnStoreError::Allow` and an
/// `OnStoreError::Deny` layer. While Redis is out of memory, a check that
/// must write answers 200 without rate-limit headers (Allow) or 503 (Deny);
/// afterwards every key is where it was.
async fn oom_over_http(algo: Algo) {
    let server = RedisServer::start();
    let store = server.store().await;
    let serve = |policy| {
        let layer = RateLimitLayer::new(limiter(algo, store.clone()), Header::new("x-api-key"));
        spawn_axum(app().layer(layer.on_store_error(policy)), true)
    };
    let allow = serve(OnStoreError::Allow).await;
    let deny = serve(OnStoreError::Deny).await;
    let (spent, used, fresh) = (
        Caller::with_key(Some("spent")),
        Caller::with_key(Some("used")),
        Caller::with_key(Some("fresh")),
    );
    let log = server.log();
    assert_eq!(
        spent.statuses(&deny, 4).await,
        [200, 200, 200, 429],
        "{log}"
    );
    used.get(&deny).await.expect(200, &log);

    server.refuse_writes(true).await;
    let spent_refused = if algo.denial_writes() { 503 } else { 429 };
    for (url, refused) in [(&allow, 200), (&deny, 503)] {
        for (caller, status) in [
            (&spent, if spent_refused == 503 { refused } else { 429 }),
            (&used, refused),
            (&fresh, refused),
        ] {
            for _ in 0..3 {
                let res = caller.get(url).await.expect(status, &server.log());
                if status == 200 {
                    assert!(!res.has_ratelimit_headers(), "{algo:?}: {res:?}");
                }
            }
        }
    }
    server.refuse_writes(false).await;

    let log = server.log();
    for url in [&allow, &deny] {
        spent.get(url).await.expect(429, &log);
    }
    let res = used.get(&deny).await.expect(200, &log);
    assert_eq!(res.ratelimit("r"), 1, "{algo:?}: {res:?}");
    let res = fresh.get(&deny).await.expect(200, &log);
    assert_eq!(res.ratelimit("r"), 2, "{algo:?}: {res:?}");
}

#[tokio::test]
async fn oom_fixed_window_over_http_follows_the_policy() {
    oom_over_http(Algo::Fixed).await;
}

#[tokio::test]
async fn oom_sliding_window_over_http_follows_the_policy() {
    oom_over_http(Algo::Sliding).await;
}

#[tokio::test]
async fn oom_gcra_over_http_follows_the_policy() {
    oom_over_http(Algo::Gcra).await;
}

/// A concurrency limit of 2 on `store`, with leases long enough to outlive
/// the test unrenewed.
/// A limiter that sends every acquire to `store`: no breaker.
/// Several of these run on one store in a test, on purpose: the same slots
/// seen before and after Redis fills, so they share counters.
fn concurrency(store: RedisStore) -> ConcurrencyLimiter {
    ConcurrencyLimiter::builder(2)
        .store(store)
        .share_counters()
        .timeout(TEST_TIMEOUT)
        .lease(Duration::from_secs(60))
        .breaker(Breaker::disabled())
        .build()
        .unwrap()
}

/// `full` holding both slots, `used` one.
async fn hold(limiter: &ConcurrencyLimiter) -> Vec<Lease> {
    let mut leases = Vec::new();
    for key in ["full", "full", "used"] {
        leases.push(limiter.acquire(key).await.unwrap().lease().unwrap());
    }
    leases
}

async fn lease_dumps(server: &RedisServer, limiter: &ConcurrencyLimiter) -> Vec<Option<Vec<u8>>> {
    let mut out = Vec::new();
    for key in ["full", "used", "fresh"] {
        out.push(server.dump(&limiter.store_key(key)).await);
    }
    out
}

/// While Redis refuses writes: `used` and `fresh` fail with `refusal`;
/// `full` is busy (read alone) or fails too (`full_fails`). Never a lease.
async fn acquires_refused(
    limiter: &ConcurrencyLimiter,
    refusal: &str,
    full_fails: bool,
    log: &str,
) {
    for key in ["full", "used", "fresh"] {
        for _ in 0..3 {
            match limiter.acquire(key).await {
                Ok(Acquired::Busy(busy)) if key == "full" && !full_fails => {
                    assert_eq!(busy.in_flight(), 2, "{log}");
                }
                Err(Error::Redis(e)) if e.to_string().contains(refusal) => {}
                other => panic!("{key}: expected a {refusal} error, got {other:?}\n{log}"),
            }
        }
    }
}

/// After the refusal: exactly the leases held before.
async fn leases_untouched(limiter: &ConcurrencyLimiter, log: &str) {
    let busy = limiter.acquire("full").await.unwrap();
    assert!(!busy.is_acquired(), "{busy:?}\n{log}");
    let lease = limiter.acquire("used").await.unwrap().lease().unwrap();
    assert_eq!(lease.in_flight(), 2, "{log}");
    let lease = limiter.acquire("fresh").await.unwrap().lease().unwrap();
    assert_eq!(lease.in_flight(), 1, "{log}");
}

#[tokio::test]
async fn oom_concurrency_acquire_is_a_store_error_and_keeps_the_leases() {
    let server = RedisServer::start();
    let limiter = concurrency(server.store().await);
    let _held = hold(&limiter).await;
    let before = lease_dumps(&server, &limiter).await;

    server.refuse_writes(true).await;
    acquires_refused(&limiter, "OOM", false, &server.log()).await;
    server.refuse_writes(false).await;

    assert_eq!(lease_dumps(&server, &limiter).await, before);
    leases_untouched(&limiter, &server.log()).await;
}

#[tokio::test]
async fn read_only_replica_concurrency_acquire_is_a_store_error() {
    let primary = RedisServer::start();
    let limiter = concurrency(primary.store().await);
    let _held = hold(&limiter).await;
    let replica = primary.start_replica().await;
    let before = lease_dumps(&primary, &limiter).await;

    let on_replica = concurrency(replica.lazy_store());
    // Acquiring always writes (expired leases are dropped), so even the full
    // key fails on a replica.
    acquires_refused(&on_replica, "read only replica", true, &replica.log()).await;

    assert_eq!(lease_dumps(&replica, &limiter).await, before);
    assert_eq!(lease_dumps(&primary, &limiter).await, before);
    leases_untouched(&limiter, &primary.log()).await;
}

#[tokio::test]
async fn oom_concurrency_over_http_follows_the_policy() {
    let server = RedisServer::start();
    let store = server.store().await;
    let serve = |policy| {
        let layer = InFlightLimitLayer::new(concurrency(store.clone()), Header::new("x-api-key"));
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer.on_store_error(policy));
        lease::spawn_axum(app)
    };
    let allow = serve(OnStoreError::Allow).await;
    let deny = serve(OnStoreError::Deny).await;
    let client = lease::client();

    server.refuse_writes(true).await;
    for (url, status) in [(&allow, 200), (&deny, 503)] {
        for _ in 0..3 {
            lease::get(&client, url, "fresh")
                .await
                .expect(status, &server.log());
        }
    }
    server.refuse_writes(false).await;

    let key = concurrency(store.clone()).store_key("fresh");
    assert_eq!(server.dump(&key).await, None, "a lease was written");
    lease::get(&client, &deny, "fresh")
        .await
        .expect(200, &server.log());
}

/// The one error a script expects, a corrupt value (the wrong type, not an
/// integer, out of an integer's range), is still reset rather than raised:
/// raising it would wedge the key.
#[tokio::test]
async fn corrupt_values_are_still_reset_for_every_algorithm() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    for algo in [Algo::Fixed, Algo::Sliding, Algo::Gcra] {
        let limiter = limiter(algo, server.store().await);
        let key = limiter.store_key("k");
        for cost in [0, 1] {
            // A TAT far ahead is GCRA's to clamp (a full bucket), not corrupt.
            let overflow = if algo == Algo::Gcra {
                "list"
            } else {
                "9223372036854775807"
            };
            for value in ["list", "garbage", overflow] {
                let _: () = redis::cmd("DEL")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let mut set = redis::cmd(if value == "list" { "RPUSH" } else { "SET" });
                let _: () = set
                    .arg(&key)
                    .arg(value)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let d = limiter.check("k", cost).await;
                let d = d.unwrap_or_else(|e| panic!("{algo:?} {value} cost {cost}: {e}"));
                if cost == 1 {
                    assert!(
                        d.is_allowed() && d.remaining() == 2,
                        "{algo:?} {value}: {d:?}"
                    );
                }
            }
        }
    }
    server.assert_every_key_has_ttl().await;
}
