//! The concurrency limiter against real Redis (a `ConnectionManager` and a
//! bb8 pool) and the in-memory store: crashed holders free their slot,
//! expired holders cannot free someone else's, long holders renew, timeouts
//! leak nothing, and every key has a TTL. See `concurrency_http.rs` for the
//! limit over HTTP.

mod support;

use std::time::{Duration, Instant};

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use redis_ratelimit::{
    Error, MemoryStore,
    concurrency::{Acquired, ConcurrencyLimiter},
    store::{LeaseState, LeaseStore},
};
use support::{
    Backend, RedisServer,
    lease::{LEASE, unrenewed},
};

async fn crashed_holder_frees_its_slot(b: Backend) {
    let limiter = b.short_lease(2);
    // A live holder, renewed all along, keeps the key itself alive.
    let live = limiter.acquire("k").await.unwrap().lease().unwrap();
    let crashed_at = Instant::now();
    std::mem::forget(unrenewed(&limiter, "k").await);
    assert!(
        !limiter.acquire("k").await.unwrap().is_acquired(),
        "both slots held"
    );
    tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
    let freed = limiter.acquire("k").await.unwrap().lease();
    let freed = freed.unwrap_or_else(|| {
        panic!(
            "not freed {:?} after the crash\n{}",
            crashed_at.elapsed(),
            b.log()
        )
    });
    assert!(
        !limiter.acquire("k").await.unwrap().is_acquired(),
        "the live holder lost its slot"
    );
    if let Some(server) = b.server() {
        server.assert_every_key_has_ttl().await;
        let pttl = server.pttl(&limiter.store_key("k")).await;
        assert!(
            (1..=1000).contains(&pttl),
            "the key outlives its leases: {pttl}"
        );
        assert_eq!(server.lease_tokens(&limiter.store_key("k")).await.len(), 2);
    }
    assert!(live.release().await.unwrap() && freed.release().await.unwrap());
}

#[tokio::test]
async fn crashed_holder_frees_its_slot_after_the_lease_with_redis() {
    crashed_holder_frees_its_slot(Backend::redis().await).await;
}

#[tokio::test]
async fn crashed_holder_frees_its_slot_after_the_lease_with_memory_store() {
    crashed_holder_frees_its_slot(Backend::memory()).await;
}

async fn expired_holder_cannot_release_the_new_holders_slot(b: Backend) {
    let limiter = b.short_lease(1);
    let slow = unrenewed(&limiter, "k").await;
    tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
    let new = limiter.acquire("k").await.unwrap().lease();
    let new = new.unwrap_or_else(|| panic!("the expired lease was not taken over\n{}", b.log()));
    // The slow holder finally finishes and releases: it held nothing any more.
    assert!(
        !slow.release().await.unwrap(),
        "released a lease it had lost"
    );
    assert!(
        !limiter.acquire("k").await.unwrap().is_acquired(),
        "the new holder's slot was freed"
    );
    if let Some(server) = b.server() {
        let tokens = server.lease_tokens(new.store_key()).await;
        assert_eq!(tokens, [new.token()]);
    }
    assert!(new.release().await.unwrap());
    assert!(limiter.acquire("k").await.unwrap().is_acquired());
}

#[tokio::test]
async fn expired_holder_cannot_release_the_new_holders_slot_with_redis() {
    expired_holder_cannot_release_the_new_holders_slot(Backend::redis().await).await;
}

#[tokio::test]
async fn expired_holder_cannot_release_the_new_holders_slot_with_memory_store() {
    expired_holder_cannot_release_the_new_holders_slot(Backend::memory()).await;
}

async fn renewal_keeps_a_long_holders_slot(b: Backend) {
    let limiter = b.short_lease(1);
    let other = b.concurrency_replica(1).await.lease(LEASE).build().unwrap();
    let long = limiter.acquire("k").await.unwrap().lease().unwrap();
    // Well past the original lease, twice: still held.
    for _ in 0..2 {
        tokio::time::sleep(LEASE + LEASE / 2).await;
        let Acquired::Busy(busy) = other.acquire("k").await.unwrap() else {
            panic!("the long holder lost its slot\n{}", b.log());
        };
        assert_eq!((busy.in_flight(), busy.limit()), (1, 1));
    }
    assert!(long.release().await.unwrap(), "the lease was still live");
    assert!(other.acquire("k").await.unwrap().is_acquired());
}

#[tokio::test]
async fn renewal_keeps_a_long_holders_slot_with_redis() {
    renewal_keeps_a_long_holders_slot(Backend::redis().await).await;
}

#[tokio::test]
async fn renewal_keeps_a_long_holders_slot_with_memory_store() {
    renewal_keeps_a_long_holders_slot(Backend::memory()).await;
}

/// Limiters of one name with different leases share slots (a rolling deploy
/// that changes `lease`; the lock recipe's callers, each with its own): an
/// acquire by the shorter one, refused, must not cut the longer holder's
/// lease to its own length, or a second holder gets in while the first
/// still runs. Each lease is cut only to its own length (the token says
/// it), as a clock that stepped back needs.
async fn a_shorter_lease_never_cuts_a_longer_holders(b: Backend) {
    let short = b.short_lease(1);
    let long = b
        .concurrency_replica(1)
        .await
        .lease(LEASE * 30)
        .build()
        .unwrap();
    // Its first renewal is 10 s away.
    let held = long.acquire("k").await.unwrap().lease().unwrap();
    assert!(!short.acquire("k").await.unwrap().is_acquired());
    tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
    assert!(
        !short.acquire("k").await.unwrap().is_acquired(),
        "the longer holder's lease was cut to the shorter one's\n{}",
        b.log()
    );
    if let Some(server) = b.server() {
        let pttl = server.pttl(&long.store_key("k")).await;
        assert!(pttl > 20_000, "the key's TTL was cut: {pttl}");
    }
    assert!(held.release().await.unwrap(), "the lease was still live");
    assert!(short.acquire("k").await.unwrap().is_acquired());
}

#[tokio::test]
async fn a_shorter_lease_never_cuts_a_longer_holders_with_redis() {
    a_shorter_lease_never_cuts_a_longer_holders(Backend::redis().await).await;
}

#[tokio::test]
async fn a_shorter_lease_never_cuts_a_longer_holders_with_memory_store() {
    a_shorter_lease_never_cuts_a_longer_holders(Backend::memory()).await;
}

/// How a caller gives up on an acquire that a frozen Redis holds.
enum GiveUp {
    /// The limiter's own timeout.
    Timeout,
    /// The caller goes away while its acquire is on its way (a client that
    /// disconnects, a `select!` that takes another branch).
    Cancel,
}

/// An acquire the caller gave up on may still be applied when Redis thaws:
/// its token is released soon after, long before the 60 s lease could
/// expire.
async fn an_acquire_given_up_does_not_leak_a_slot(b: Backend, give_up: GiveUp) {
    let server = b.server().unwrap();
    let limiter = b
        .concurrency(1)
        .lease(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut events = server.key_events(&limiter.store_key("k")).await;
    server.freeze(true);
    match give_up {
        GiveUp::Timeout => {
            let err = limiter.acquire("k").await.unwrap_err();
            assert!(matches!(err, Error::Timeout(_)), "{err}");
        }
        GiveUp::Cancel => {
            let cancelled =
                tokio::time::timeout(Duration::from_millis(50), limiter.acquire("k")).await;
            assert!(cancelled.is_err(), "the acquire finished on a frozen Redis");
        }
    }
    server.freeze(false);
    events.wait_for("zadd", Duration::from_secs(10)).await;
    events.wait_for("zrem", Duration::from_secs(10)).await;
    assert!(
        limiter.acquire("k").await.unwrap().is_acquired(),
        "the acquire given up on kept its slot\n{}",
        server.log()
    );
    server.assert_every_key_has_ttl().await;
}

#[tokio::test]
async fn timed_out_acquire_does_not_leak_a_slot_with_redis() {
    an_acquire_given_up_does_not_leak_a_slot(Backend::redis().await, GiveUp::Timeout).await;
}

#[tokio::test]
async fn timed_out_acquire_does_not_leak_a_slot_with_redis_pool() {
    an_acquire_given_up_does_not_leak_a_slot(Backend::redis_pool().await, GiveUp::Timeout).await;
}

#[tokio::test]
async fn cancelled_acquire_does_not_leak_a_slot_with_redis() {
    an_acquire_given_up_does_not_leak_a_slot(Backend::redis().await, GiveUp::Cancel).await;
}

#[tokio::test]
async fn cancelled_acquire_does_not_leak_a_slot_with_redis_pool() {
    an_acquire_given_up_does_not_leak_a_slot(Backend::redis_pool().await, GiveUp::Cancel).await;
}

#[tokio::test]
async fn keys_always_carry_a_ttl_and_tampered_keys_are_healed() {
    let b = Backend::redis().await;
    let server = b.server().unwrap();
    let limiter = b.short_lease(1);
    let mut conn = server.conn().await;
    let (wrong_type, no_ttl) = (limiter.store_key("string"), limiter.store_key("stale"));
    redis::cmd("SET")
        .arg(&wrong_type)
        .arg("x")
        .exec_async(&mut conn)
        .await
        .unwrap();
    // A lease an hour out, on a key with no TTL: it would block for an hour.
    let time: (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let hour_out = time.0 * 1000 + 3_600_000;
    // Tokens that name no lease, or one over 366 days: each cut to the
    // acquiring limiter's.
    redis::cmd("ZADD")
        .arg(&no_ttl)
        .arg(hour_out)
        .arg("stale")
        .arg(hour_out)
        .arg("forged/999999999999")
        .exec_async(&mut conn)
        .await
        .unwrap();

    let healed = limiter
        .acquire("string")
        .await
        .unwrap()
        .lease()
        .expect("a healed key");
    assert!(
        !limiter.acquire("stale").await.unwrap().is_acquired(),
        "stale counts until cut"
    );
    for key in [&wrong_type, &no_ttl] {
        let pttl = server.pttl(key).await;
        assert!((1..=1000).contains(&pttl), "{key}: {pttl}");
    }
    server.assert_every_key_has_ttl().await;
    tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
    assert!(
        limiter.acquire("stale").await.unwrap().is_acquired(),
        "cut to one lease"
    );
    assert!(healed.release().await.unwrap());
    server.assert_every_key_has_ttl().await;
}

#[tokio::test]
async fn scripts_validate_their_arguments_before_writing() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let acquire = redis::Script::new(redis_ratelimit::store::ACQUIRE_LUA);
    let renew = redis::Script::new(redis_ratelimit::store::RENEW_LUA);
    let release = redis::Script::new(redis_ratelimit::store::RELEASE_LUA);
    redis::cmd("SET")
        .arg("other")
        .arg("x")
        .exec_async(&mut conn)
        .await
        .unwrap();
    let long_token = "t".repeat(129);
    for key in ["fresh", "other"] {
        for (limit, lease, token) in [
            ("0", "1000", "t"),
            ("1.5", "1000", "t"),
            ("x", "1000", "t"),
            ("1", "0", "t"),
            ("1", "1000", ""),
            ("1", "1000", long_token.as_str()),
        ] {
            let mut call = acquire.key(key);
            call.arg(limit).arg(lease).arg(token);
            let reply: redis::RedisResult<redis::Value> = call.invoke_async(&mut conn).await;
            assert!(reply.is_err(), "{key} {limit} {lease} {token:?}: {reply:?}");
        }
        let mut call = renew.key(key);
        call.arg("-5").arg("t");
        assert!(call.invoke_async::<i64>(&mut conn).await.is_err());
        let mut call = release.key(key);
        call.arg("");
        assert!(call.invoke_async::<i64>(&mut conn).await.is_err());
    }
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys, ["other"], "an invalid call wrote");
    let kind: String = redis::cmd("TYPE")
        .arg("other")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kind, "string", "an invalid call deleted a key");
}

/// The kind of a Redis error, or what came instead.
fn kind<T: std::fmt::Debug>(reply: Result<T, Error>) -> Result<redis::ErrorKind, String> {
    match reply {
        Err(Error::Redis(e)) => Ok(e.kind()),
        other => Err(format!("{other:?}")),
    }
}

/// The memory store refuses what the scripts refuse (a limit or lease of
/// 0 or past 2^53, a token empty or over 128 bytes) with the error the
/// Redis store gives for the script's error reply, and grants nothing: it
/// once granted a lease of 0 ms (`held` 1).
#[tokio::test]
async fn the_memory_store_refuses_the_lease_calls_the_scripts_refuse() {
    let server = RedisServer::start();
    let redis = server.store().await;
    let memory = redis_ratelimit::MemoryStore::new();
    let stores: [(&str, &dyn LeaseStore); 2] = [("redis", &redis), ("memory", &memory)];
    let long_token = "t".repeat(129);
    let past = (1 << 53) + 1;
    for (name, store) in stores {
        let refused = redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError);
        for (limit, lease_ms, token) in [
            (0, 1000, "t"),
            (past, 1000, "t"),
            (1, 0, "t"),
            (1, past, "t"),
            (1, 1000, ""),
            (1, 1000, long_token.as_str()),
        ] {
            let reply = store.acquire("k", token, limit, lease_ms).await;
            let context = format!("{name}: acquire {limit} {lease_ms} {token:?}");
            assert_eq!(kind(reply), Ok(refused), "{context}");
        }
        for (lease_ms, token) in [(0, "t"), (past, "t"), (1000, ""), (1000, &long_token)] {
            let reply = store.renew("k", token, lease_ms).await;
            let context = format!("{name}: renew {lease_ms} {token:?}");
            assert_eq!(kind(reply), Ok(refused), "{context}");
        }
        for token in ["", &long_token] {
            let reply = store.release("k", token).await;
            let context = format!("{name}: release {token:?}");
            assert_eq!(kind(reply), Ok(refused), "{context}");
        }
        // Nothing was granted: the one slot is free.
        let state = store.acquire("k", "t", 1, 1000).await.unwrap();
        assert_eq!((state.acquired, state.held), (true, 1), "{name}");
    }
}

/// `holder` takes `key`'s one lease (a limit of 1) for 30 s; `other` asks
/// for a lease of `lease_ms` at once, which is refused, and again `after`
/// later: whether it got in then.
async fn gets_in_after(
    store: &dyn LeaseStore,
    key: &str,
    (holder, other): (&str, &str),
    lease_ms: u64,
    after: Duration,
) -> bool {
    let first = store.acquire(key, holder, 1, 30_000).await.unwrap();
    assert!(first.acquired, "{holder}");
    let second = store.acquire(key, other, 1, lease_ms).await.unwrap();
    assert!(!second.acquired, "{other}: a second holder on a limit of 1");
    tokio::time::sleep(after).await;
    store
        .acquire(key, other, 1, lease_ms)
        .await
        .unwrap()
        .acquired
}

/// The Redis store of a server of the test's own, and a memory store.
async fn both_lease_stores(server: &RedisServer) -> [(&'static str, Box<dyn LeaseStore>); 2] {
    [
        ("redis", Box::new(server.store().await)),
        ("memory", Box::new(redis_ratelimit::MemoryStore::new())),
    ]
}

/// A token may end in digits that are not its lease (`worker/7`, held for
/// 30 s). An acquire cuts only the leases that outlive its own, as the
/// script does, on both stores. The memory store cut every lease to its
/// token's length from now, so `worker/7` lost its lease 7 ms on, a second
/// holder came in on a limit of 1, and `worker/7`'s renewal was refused,
/// where the Redis store refused the second holder for the whole 30 s.
#[tokio::test]
async fn stores_agree_on_a_token_whose_suffix_is_not_its_lease() {
    let server = RedisServer::start();
    for (name, store) in both_lease_stores(&server).await {
        let tokens = ("worker/7", "other/30000");
        let ms50 = Duration::from_millis(50);
        assert!(
            !gets_in_after(&*store, "k", tokens, 30_000, ms50).await,
            "{name}: a second holder while the first's 30 s lease runs"
        );
        assert!(
            store.renew("k", "worker/7", 30_000).await.unwrap(),
            "{name}: the first holder's lease was cut"
        );
    }
}

/// A token whose digits are no lease the script reads (`/0`, or a leading
/// zero) names no length, on both stores: an acquire whose lease it
/// outlives cuts it to that lease, as it cuts a token without digits. The
/// memory store read `job/0` as a lease of 0 ms, so the next acquire let a
/// second holder in on a limit of 1 and the holder's renewal was refused,
/// where Redis kept it for the caller's 1 s; and it kept `job/030000` for
/// 30 s where Redis cut it to 1 s.
#[tokio::test]
async fn stores_agree_on_a_token_that_names_no_valid_lease() {
    let server = RedisServer::start();
    for (name, store) in both_lease_stores(&server).await {
        let ms50 = Duration::from_millis(50);
        assert!(
            !gets_in_after(&*store, "a", ("job/0", "other/1000"), 1_000, ms50).await,
            "{name}: job/0's lease was cut to 0 ms"
        );
        assert!(store.renew("a", "job/0", 30_000).await.unwrap(), "{name}");
        let past_the_cut = Duration::from_millis(1_100);
        assert!(
            gets_in_after(
                &*store,
                "b",
                ("job/030000", "other/1000"),
                1_000,
                past_the_cut
            )
            .await,
            "{name}: job/030000 was kept past the cut to 1 s"
        );
    }
}

#[tokio::test]
async fn script_flush_is_invisible_to_acquire_renew_and_release() {
    let b = Backend::redis().await;
    let server = b.server().unwrap();
    let limiter = b.short_lease(1);
    let mut conn = server.conn().await;
    let mut flush = redis::cmd("SCRIPT");
    flush.arg("FLUSH");
    flush.exec_async(&mut conn).await.unwrap();
    let held = limiter.acquire("k").await.unwrap().lease().unwrap();
    flush.exec_async(&mut conn).await.unwrap();
    // Renewals after the flush reload the script: the slot is still held.
    tokio::time::sleep(LEASE + LEASE / 2).await;
    assert!(
        !limiter.acquire("k").await.unwrap().is_acquired(),
        "{}",
        server.log()
    );
    flush.exec_async(&mut conn).await.unwrap();
    assert!(held.release().await.unwrap());
    assert!(limiter.acquire("k").await.unwrap().is_acquired());
}

/// Polls until `token` holds a lease on `key` again, failing after a few
/// renewal periods.
async fn until_held_again(server: &RedisServer, key: &str, token: &str, what: &str) {
    let asked = Instant::now();
    while !server.lease_tokens(key).await.iter().any(|t| t == token) {
        assert!(
            asked.elapsed() < LEASE * 3,
            "{what}: the holder's lease was not taken back\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Fails without the take-back: a lease Redis lost (a restart without
/// persistence, a failover, a flush) stopped renewing, its request ran on
/// outside the count, and a newcomer got its slot: two in flight on a limit
/// of 1, for as long as the first ran.
#[tokio::test]
async fn a_lease_redis_lost_is_taken_back_while_its_request_runs() {
    let b = Backend::redis().await;
    let server = b.server().unwrap();
    let limiter = b.short_lease(1);
    let held = limiter.acquire("k").await.unwrap().lease().unwrap();
    let key = held.store_key().to_owned();
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut server.conn().await)
        .await
        .unwrap();
    until_held_again(server, &key, held.token(), "a free slot").await;
    let Acquired::Busy(busy) = limiter.acquire("k").await.unwrap() else {
        panic!("a newcomer got the running holder's slot");
    };
    assert_eq!(busy.in_flight(), 1);

    // Lost again, and a newcomer takes the slot first: the holder is taken
    // back all the same, beyond the limit, since it runs, and the key admits
    // no one until fewer than the limit run. Fails with a take-back that
    // waited for a free slot: a second newcomer took the one the first
    // freed, and the holder ran uncounted for as long as newcomers came.
    support::lease::lose_leases_after_a_renewal(server, &key).await;
    let newcomer = limiter.acquire("k").await.unwrap().lease().unwrap();
    until_held_again(server, &key, held.token(), "a full key").await;
    let mut tokens = server.lease_tokens(&key).await;
    tokens.sort();
    let mut both = [newcomer.token(), held.token()];
    both.sort();
    assert_eq!(tokens, both);
    let Acquired::Busy(busy) = limiter.acquire("k").await.unwrap() else {
        panic!("a second newcomer got in beside two running requests");
    };
    assert_eq!(busy.in_flight(), 2);
    assert!(newcomer.release().await.unwrap());
    let Acquired::Busy(busy) = limiter.acquire("k").await.unwrap() else {
        panic!("a newcomer got in while the holder taken back still runs");
    };
    assert_eq!(busy.in_flight(), 1);
    // Lost while held: another holder had its slot meanwhile (a lock's
    // holders overlapped), which the release says, though it was taken
    // back since. It said `true`.
    assert!(!held.release().await.unwrap(), "the overlap went unsaid");
    assert!(server.lease_tokens(&key).await.is_empty());
    server.assert_every_key_has_ttl().await;
}

/// A memory store whose first release never answers (a release lost on
/// its way, or dropped before it is sent).
#[derive(Debug, Default)]
struct FirstReleaseLost {
    inner: MemoryStore,
    lost: AtomicBool,
}

impl LeaseStore for FirstReleaseLost {
    fn acquire(&self, key: &str, token: &str, limit: u64, lease_ms: u64) -> LeaseCall<LeaseState> {
        self.inner.acquire(key, token, limit, lease_ms)
    }

    fn renew(&self, key: &str, token: &str, lease_ms: u64) -> LeaseCall<bool> {
        self.inner.renew(key, token, lease_ms)
    }

    fn release(&self, key: &str, token: &str) -> LeaseCall<bool> {
        if self.lost.swap(true, Ordering::SeqCst) {
            self.inner.release(key, token)
        } else {
            Box::pin(std::future::pending())
        }
    }
}

type LeaseCall<T> = redis_ratelimit::store::BoxFuture<'static, Result<T, Error>>;

/// Fails with the lease marked released before the store answered: a
/// `release` dropped unfinished (a `select!`, a timeout around it) left the
/// slot held, unrenewed, until the lease expired.
#[tokio::test]
async fn a_release_dropped_unfinished_still_frees_the_slot() {
    let limiter = ConcurrencyLimiter::builder(1)
        .store(FirstReleaseLost::default())
        .lease(Duration::from_secs(60))
        .build()
        .unwrap();
    let held = limiter.acquire("k").await.unwrap().lease().unwrap();
    let mut release = Box::pin(held.release());
    assert!(futures_util::poll!(release.as_mut()).is_pending());
    drop(release);
    let asked = Instant::now();
    while !limiter.acquire("k").await.unwrap().is_acquired() {
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "the slot stayed held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A memory store that says every renewal found the lease lost, and whose
/// second acquire (the renewal's take-back) is applied only once the test
/// lets it, as a command already on its way to Redis would be, whether or
/// not its caller still waits.
#[derive(Debug, Default)]
struct SlowTakeBack {
    inner: MemoryStore,
    acquires: std::sync::atomic::AtomicU64,
    started: Arc<tokio::sync::Notify>,
    go: Arc<tokio::sync::Notify>,
    applied: Arc<tokio::sync::Notify>,
}

impl LeaseStore for SlowTakeBack {
    fn acquire(&self, key: &str, token: &str, limit: u64, lease_ms: u64) -> LeaseCall<LeaseState> {
        if self.acquires.fetch_add(1, Ordering::SeqCst) != 1 {
            return self.inner.acquire(key, token, limit, lease_ms);
        }
        let (inner, started, go) = (self.inner.clone(), self.started.clone(), self.go.clone());
        let applied = self.applied.clone();
        let (key, token) = (key.to_owned(), token.to_owned());
        let reply = tokio::spawn(async move {
            started.notify_one();
            go.notified().await;
            // A long lease: left behind, it would hold the slot past the test.
            let state = inner.acquire(&key, &token, limit, 60_000).await;
            applied.notify_one();
            state
        });
        Box::pin(async move { reply.await.unwrap() })
    }

    fn renew(&self, _: &str, _: &str, _: u64) -> LeaseCall<bool> {
        Box::pin(std::future::ready(Ok(false)))
    }

    fn release(&self, key: &str, token: &str) -> LeaseCall<bool> {
        self.inner.release(key, token)
    }
}

/// A lease released while its renewal's take-back is on its way: the slot
/// the take-back took after the release is released again. Fails with the
/// renewal task aborted at the release: the take-back, already sent, took
/// a slot nobody held, for its whole lease (a lock held by no one).
#[tokio::test]
async fn a_take_back_that_lands_after_the_release_is_released_too() {
    // Its token's 600 ms: the store cuts the 60 s to it.
    take_back_lands_after_the_release(Duration::from_millis(600), Duration::ZERO).await;
}

/// The same, with the lease released once the renewal's timeout has passed
/// too. Fails with a take-back dropped at the timeout: the release found
/// nothing to free, and the take-back then took a slot no one held, for
/// its whole lease.
#[tokio::test]
async fn a_take_back_that_lands_after_its_timeout_and_the_release_is_released_too() {
    take_back_lands_after_the_release(Duration::from_millis(1500), Duration::from_millis(300))
        .await;
}

/// A lease of `lease` (a timeout of 200 ms) found lost, released `after`
/// its take-back was sent, which then lands: the slot must be free again
/// well within the lease the take-back's slot would live.
async fn take_back_lands_after_the_release(lease: Duration, after: Duration) {
    let store = SlowTakeBack::default();
    let (started, go) = (store.started.clone(), store.go.clone());
    let applied = store.applied.clone();
    let limiter = ConcurrencyLimiter::builder(1)
        .store(store)
        .lease(lease)
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let held = limiter.acquire("k").await.unwrap().lease().unwrap();
    started.notified().await;
    tokio::time::sleep(after).await;
    assert!(!held.release().await.unwrap(), "it was lost");
    go.notify_one();
    applied.notified().await;
    let asked = Instant::now();
    while !limiter.acquire("k").await.unwrap().is_acquired() {
        assert!(asked.elapsed() < lease / 2, "the take-back kept the slot");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Redis out of memory under `noeviction` refuses a script's first write
/// when it may grow memory: a renewal's score update grows nothing, and
/// still lands. Fails with the update as the script's first write: every
/// renewal failed with `OOM`, the lease expired a lease time later, and its
/// take-back (a new member, which may grow memory) was refused too.
#[tokio::test]
async fn a_lease_is_renewed_while_redis_is_out_of_memory() {
    let b = Backend::redis().await;
    let server = b.server().unwrap();
    let limiter = b.short_lease(1);
    let held = limiter.acquire("k").await.unwrap().lease().unwrap();
    let key = held.store_key().to_owned();
    let mut conn = server.conn().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    // A new lease is refused: OOM, by the store-error policy.
    assert!(limiter.acquire("other").await.is_err());
    tokio::time::sleep(LEASE * 2).await;
    let tokens = server.lease_tokens(&key).await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        tokens,
        [held.token()],
        "the lease was lost\n{}",
        server.log()
    );
    assert!(held.release().await.unwrap(), "it was never lost");
    server.assert_every_key_has_ttl().await;
}

/// A set keeps the TTL of its last lease: releasing the lease that expires
/// last shortens it to the next one's. Fails with release leaving the TTL
/// as it was: the set outlived every lease in it.
#[tokio::test]
async fn releasing_the_last_lease_to_expire_shortens_the_sets_ttl() {
    let b = Backend::redis().await;
    let server = b.server().unwrap();
    // A long lease: no renewal moves a score while the test reads them.
    let limiter = b
        .concurrency(2)
        .lease(Duration::from_secs(60))
        .build()
        .unwrap();
    let first = limiter.acquire("k").await.unwrap().lease().unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await; // the second ends 250 ms later
    let second = limiter.acquire("k").await.unwrap().lease().unwrap();
    let key = first.store_key().to_owned();
    let mut conn = server.conn().await;
    let score: f64 = redis::cmd("ZSCORE")
        .arg(&key)
        .arg(first.token())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(second.release().await.unwrap());
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now_ms = (secs * 1000 + micros / 1000) as f64;
    let pttl = server.pttl(&key).await;
    assert!(
        pttl > 0 && (pttl as f64) <= score - now_ms + 5.0,
        "TTL {pttl} ms, the last lease left ends in {} ms",
        score - now_ms
    );
    assert!(first.release().await.unwrap());
}
