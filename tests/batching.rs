//! Concurrent decisions on one `ConnectionManager` share script calls, and
//! each is still decided on its own, exactly.

mod support;

use std::time::Duration;

use futures_util::future::join_all;
use redis_ratelimit::{Limiter, RedisStore};
use support::{RedisServer, delay::DelayProxy};
use tokio::time::Instant;

/// A limiter on `server` with `quota`, warmed up (the script loaded, the
/// connection up), and the script calls made so far.
async fn warmed(server: &RedisServer, quota: &str) -> (Limiter, u64) {
    let limiter = server.limiter(quota).await;
    assert!(limiter.check("warm", 1).await.unwrap().is_allowed());
    (limiter, server.script_calls().await)
}

#[tokio::test]
async fn concurrent_decisions_share_script_calls_and_stay_exact() {
    let server = RedisServer::start();
    let (limiter, before) = warmed(&server, "30/1m").await;

    let keys = ["a", "b", "c", "d"];
    let checks = (0..400).map(|i| limiter.check(keys[i % 4], 1));
    let decisions = join_all(checks).await;
    let calls = server.script_calls().await - before;

    for (k, key) in keys.iter().enumerate() {
        let mine = decisions.iter().skip(k).step_by(4);
        let allowed = mine.filter(|d| d.as_ref().unwrap().is_allowed()).count();
        assert_eq!(allowed, 30, "{key}: each request is decided on its own");
    }
    // Denials of a key over its limit come from the deny cache once known,
    // and the rest share calls: far fewer calls than decisions.
    assert!(calls >= 1, "no script call at all?");
    assert!(
        calls < 100,
        "{calls} script calls for 400 concurrent decisions"
    );
    server.assert_every_key_has_ttl().await;
}

/// Fails when such requests join the batch: a request the scripts refuse
/// (no checks, or a cost Lua's doubles cannot count), sent through the
/// public `Store::decide` while other requests queue, had the whole call
/// refused, so every request batched with it got the store error, and
/// was let through or denied by its limiter's store-error policy.
#[tokio::test]
async fn a_request_the_scripts_refuse_fails_alone_not_its_batch() {
    use redis_ratelimit::{LimitCheck, Quota, Store};
    let server = RedisServer::start();
    let store = server.store().await;
    let check = |key: String| LimitCheck {
        key,
        quota: Quota::per_minute(1_000),
        shadow: false,
    };
    let spent = store.decide(vec![check("huge".into())], 1).await.unwrap();
    assert!(spent[0].allowed);
    let calls = (0..60).map(|i| {
        let (checks, cost) = match i {
            15 => (vec![], 1),
            30 => (vec![check("huge".into())], 1 << 53),
            45 => (vec![check("huge".into())], u64::MAX),
            _ => (vec![check(format!("k{}", i % 4))], 1),
        };
        store.decide(checks, cost)
    });
    let replies = join_all(calls.collect::<Vec<_>>()).await;
    for (i, reply) in replies.iter().enumerate() {
        match i {
            15 | 30 | 45 => assert!(reply.is_err(), "{i}: {reply:?}"),
            _ => assert!(reply.as_ref().is_ok_and(|s| s[0].allowed), "{i}: {reply:?}"),
        }
    }
    // The count the huge costs were refused on is still there: a cost of
    // 2^53 on a count of 1 once read as a spend that made the counter, and
    // its denial deleted it.
    let look = store.decide(vec![check("huge".into())], 0).await.unwrap();
    assert_eq!(look[0].remaining, 999, "{look:?}");
    server.assert_every_key_has_ttl().await;
}

/// A batch mixes requests unlike each other (costs, limiters, one limit or
/// two): the fast path sends alike neighbours as one run and the rest as
/// runs of their own, and every request is still decided exactly.
#[tokio::test]
async fn batches_of_unlike_requests_stay_exact() {
    let server = RedisServer::start();
    let store = server.store().await;
    let build = |quota: &str, name: &str| {
        redis_ratelimit::Limiter::builder(quota.parse().unwrap())
            .name(name)
            .store(store.clone())
            .deny_cache(0)
    };
    let a = build("30/1m", "a").build().unwrap();
    let b = build("10/1m", "b").build().unwrap();
    let both = build("12/1m", "both")
        .limit("wide", "1000/1m".parse().unwrap())
        .build()
        .unwrap();
    assert!(a.check("warm", 1).await.unwrap().is_allowed());
    let before = server.script_calls().await;

    // Interleaved: cost 1 on a, cost 3 on a, cost 1 on b, a peek on a, two
    // limits: no two neighbours alike.
    let mut checks = Vec::new();
    for _ in 0..60 {
        checks.push(Box::pin(a.check("one", 1)) as futures_util::future::BoxFuture<'_, _>);
        checks.push(Box::pin(a.check("three", 3)));
        checks.push(Box::pin(b.check("b", 1)));
        checks.push(Box::pin(a.check("one", 0)));
        checks.push(Box::pin(both.check("two", 1)));
    }
    let decisions: Vec<_> = join_all(checks)
        .await
        .into_iter()
        .map(|d| d.unwrap().is_allowed())
        .collect();
    let calls = server.script_calls().await - before;
    let allowed = |k: usize| decisions.iter().skip(k).step_by(5).filter(|d| **d).count();
    assert_eq!(allowed(0), 30, "a, cost 1");
    assert_eq!(allowed(1), 10, "a, cost 3");
    assert_eq!(allowed(2), 10, "b");
    assert_eq!(
        allowed(3),
        60,
        "peeks look at a used-up counter: cost 0 fits"
    );
    assert_eq!(allowed(4), 12, "two limits");
    let mut conn = server.conn().await;
    for (key, count) in [
        (a.store_key("one"), 30),
        (a.store_key("three"), 30),
        (b.store_key("b"), 10),
    ] {
        let got: i64 = redis::AsyncCommands::get(&mut conn, &key).await.unwrap();
        assert_eq!(got, count, "{key}");
    }
    for (key, count) in both.store_keys("two").into_iter().zip([12, 12]) {
        let got: i64 = redis::AsyncCommands::get(&mut conn, &key).await.unwrap();
        assert_eq!(got, count, "{key}");
    }
    assert!(
        calls < 150,
        "{calls} script calls for 300 concurrent decisions"
    );
    server.assert_every_key_has_ttl().await;
}

/// Requests queued faster than calls go out are sent in calls of at most
/// 64 each (`MAX_BATCH`): all 600 here are queued before the first call
/// leaves (one task polls them all first), so the calls are exactly
/// 600 / 64 rounded up, whatever the timing.
#[tokio::test]
async fn a_queue_goes_out_in_calls_of_at_most_64_requests() {
    let server = RedisServer::start();
    let (limiter, before) = warmed(&server, "100/1m").await;

    let keys: Vec<String> = (0..10).map(|k| format!("k{k}")).collect();
    let checks = (0..600).map(|i| limiter.check(&keys[i % 10], 1));
    let decisions = join_all(checks).await;
    let calls = server.script_calls().await - before;

    assert_eq!(calls, 10, "600 queued requests in calls of 64");
    for (k, key) in keys.iter().enumerate() {
        let mine = decisions.iter().skip(k).step_by(10);
        let allowed = mine.filter(|d| d.as_ref().unwrap().is_allowed()).count();
        assert_eq!(allowed, 60, "{key}: each request is decided on its own");
    }
    server.assert_every_key_has_ttl().await;
}

/// Redis behind a proxy 150 ms away each way (a round trip of 300 ms),
/// and a limiter on it, warmed up.
async fn behind_a_round_trip() -> (RedisServer, DelayProxy, Limiter) {
    let server = RedisServer::start();
    let proxy = DelayProxy::start(server.port(), ONE_TRIP / 2).await;
    let store = RedisStore::connect(proxy.url()).await.unwrap();
    let limiter = Limiter::builder("1000/1m".parse().unwrap())
        .store(store)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    assert!(limiter.check("warm", 1).await.unwrap().is_allowed());
    (server, proxy, limiter)
}

/// The proxied round trip.
const ONE_TRIP: Duration = Duration::from_millis(300);
/// How long before the requests under test the two calls in flight left.
const HEAD_START: Duration = Duration::from_millis(40);

/// Sends two lone requests 20 ms apart, so that both calls the batching
/// task may have in flight are out, and returns when the second left:
/// the first's answer is due in `ONE_TRIP - HEAD_START`.
async fn both_calls_out(limiter: &Limiter, tag: &str) -> Vec<tokio::task::JoinHandle<()>> {
    let mut out = Vec::new();
    for call in ["first", "second"] {
        let (limiter, key) = (limiter.clone(), format!("{call}-{tag}"));
        out.push(tokio::spawn(async move {
            assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
        }));
        tokio::time::sleep(HEAD_START / 2).await;
    }
    out
}

/// Waits for `calls` (each asserts its own answer).
async fn all_answered(calls: Vec<tokio::task::JoinHandle<()>>) {
    for call in calls {
        call.await.unwrap();
    }
}

/// Whether requests answered `took` after they came went in a call of
/// their own (one round trip, 300 ms) rather than waiting for the first
/// call's answer (two, less the head start: 560 ms); halfway tells.
fn went_at_once(took: Duration) -> bool {
    took < (ONE_TRIP + (ONE_TRIP * 2 - HEAD_START)) / 2
}

/// Each of `decisions`, all of one key of quota 1000, allowed and decided
/// on its own.
fn assert_exact(decisions: &[Result<redis_ratelimit::Decision, redis_ratelimit::Error>]) {
    let mut left: Vec<u64> = decisions
        .iter()
        .map(|d| {
            let d = d.as_ref().unwrap();
            assert!(d.is_allowed());
            d.remaining()
        })
        .collect();
    left.sort_unstable();
    let expected: Vec<u64> = (1000 - decisions.len() as u64..1000).collect();
    assert_eq!(left, expected, "each decided on its own");
}

/// Sends `n` checks of `key` at once, asserts each decided exactly, and
/// returns how long they took to be answered.
async fn answered_in(limiter: &Limiter, key: &str, n: usize) -> Duration {
    let start = Instant::now();
    let decisions = join_all((0..n).map(|_| limiter.check(key, 1))).await;
    let took = start.elapsed();
    assert_exact(&decisions);
    took
}

/// `n` checks of `key` sent at once on a task of their own, each asserted
/// decided exactly once answered.
fn spawn_checks(limiter: &Limiter, key: &'static str, n: usize) -> tokio::task::JoinHandle<()> {
    let limiter = limiter.clone();
    tokio::spawn(async move {
        answered_in(&limiter, key, n).await;
    })
}

/// Behind a round trip, a call beyond the two in flight goes out once it
/// would carry 16 requests (a quarter of a full call), and not before:
/// with both calls out, 15 requests that come at once wait for the first
/// call's answer and go in the next; 16 go at once, and so do 80 (a call
/// of 64, and one of the 16 left). Each request is still decided exactly.
#[tokio::test]
async fn a_third_call_goes_out_only_when_full_enough() {
    let (server, _proxy, limiter) = behind_a_round_trip().await;
    for (round, requests, at_once) in [(0, 15, false), (1, 16, true), (2, 80, true)] {
        let calls = both_calls_out(&limiter, &round.to_string()).await;
        let took = answered_in(&limiter, &format!("queued{round}"), requests).await;
        assert_eq!(
            went_at_once(took),
            at_once,
            "{requests} requests answered in {took:?}, a round trip of {ONE_TRIP:?}, \
             both calls out"
        );
        all_answered(calls).await;
    }
    server.assert_every_key_has_ttl().await;
}

/// Requests the batching task took out of the queue (its first wait for a
/// call sweeps the queue, for deadlines) still count toward a third call:
/// 10 requests, swept, then 6 more make 16, and the 6 go at once.
#[tokio::test]
async fn requests_held_out_of_the_queue_count_toward_a_third_call() {
    let (server, _proxy, limiter) = behind_a_round_trip().await;
    let calls = both_calls_out(&limiter, "held").await;
    let held = spawn_checks(&limiter, "held", 10);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let took = answered_in(&limiter, "more", 6).await;
    held.await.unwrap();
    assert!(
        went_at_once(took),
        "6 requests after 10 held answered in {took:?}, a round trip of {ONE_TRIP:?}"
    );
    all_answered(calls).await;
    server.assert_every_key_has_ttl().await;
}

/// A call beyond two that is answered lets waiting requests go at once,
/// though both of the first two calls are out: six extra calls (384
/// requests at once, six of 64) are out, the first two calls are answered
/// and replaced by two lone requests' calls, and 16 requests come. They go
/// when the extra calls are answered, not when a lone call is.
#[tokio::test]
async fn an_answered_extra_call_lets_waiting_requests_go() {
    let (server, _proxy, limiter) = behind_a_round_trip().await;
    let mut first_two = both_calls_out(&limiter, "extra").await;
    tokio::time::sleep(Duration::from_millis(40)).await;
    let extras_sent = Instant::now();
    let extras = spawn_checks(&limiter, "extras", 384);
    let mut lone = Vec::new();
    for (i, call) in first_two.drain(..).enumerate() {
        call.await.unwrap();
        let (limiter, key) = (limiter.clone(), format!("lone{i}"));
        lone.push((
            Instant::now(),
            tokio::spawn(async move { limiter.check(&key, 1).await }),
        ));
    }
    tokio::time::sleep(Duration::from_millis(10)).await;

    let start = Instant::now();
    assert!(
        start < extras_sent + ONE_TRIP,
        "the test's timing slipped: the extra calls were answered before the requests came"
    );
    let took = answered_in(&limiter, "waiting", 16).await;
    // Going when the extra calls are answered, or when the first lone call
    // is: halfway between tells.
    let with_extras = extras_sent + ONE_TRIP - start + ONE_TRIP;
    let with_lone = lone[0].0 + ONE_TRIP - start + ONE_TRIP;
    assert!(
        took < (with_extras + with_lone) / 2,
        "16 requests answered in {took:?}: in {with_extras:?} if they went as the extra \
         calls were answered, {with_lone:?} if as a lone call was"
    );
    extras.await.unwrap();
    for (_, call) in lone {
        assert!(call.await.unwrap().unwrap().is_allowed());
    }
    server.assert_every_key_has_ttl().await;
}

/// A current-thread runtime, as each of actix-web's workers runs.
fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A limiter of 1,000 a minute with `timeout`, on a store connected on
/// `io`, a multi-thread runtime whose threads keep its connection's I/O
/// going (as actix-web's system runtime, which runs no handler, does for a
/// store connected at startup).
fn limiter_on(server: &RedisServer, io: &tokio::runtime::Runtime, timeout: Duration) -> Limiter {
    Limiter::builder("1000/1m".parse().unwrap())
        .store(io.block_on(server.store()))
        .timeout(timeout)
        .build()
        .unwrap()
}

/// How long a handler blocks the batching task's runtime (A), and the
/// limiter's timeout, in the two tests below.
const BLOCKED: Duration = Duration::from_secs(2);
const TIMEOUT: Duration = Duration::from_millis(200);

/// Starts the batching task on a current-thread runtime (A) of a thread of
/// its own, with one check there, then blocks that thread for [`BLOCKED`]
/// (a handler that blocks its worker's thread), and returns once it is
/// blocked: the thread, to join.
fn block_the_batching_tasks_runtime(limiter: &Limiter) -> std::thread::JoinHandle<()> {
    let (blocking, blocked) = std::sync::mpsc::channel();
    let a = std::thread::spawn({
        let limiter = limiter.clone();
        move || {
            current_thread().block_on(async {
                assert!(limiter.check("a", 1).await.unwrap().is_allowed());
                blocking.send(()).unwrap();
                std::thread::sleep(BLOCKED);
            });
        }
    });
    blocked.recv().unwrap();
    a
}

/// Two current-thread runtimes on threads of their own share a limiter,
/// as actix-web's workers do, and the batching task lives on the runtime
/// of the store's first check (A). While a handler blocks A's thread, a
/// check on the other (B) still ends by its timeout. Before, the batching
/// task was the only timer of a queued request, and B's check waited for
/// A to unblock (2 s).
#[test]
fn a_check_ends_by_its_timeout_while_the_batching_tasks_runtime_is_blocked() {
    let server = RedisServer::start();
    let io = tokio::runtime::Runtime::new().unwrap();
    let limiter = limiter_on(&server, &io, TIMEOUT);
    let b = current_thread();
    let a = block_the_batching_tasks_runtime(&limiter);
    let (result, took) = b.block_on(async {
        let start = Instant::now();
        (limiter.check("b", 1).await, start.elapsed())
    });
    a.join().unwrap();
    assert!(
        took < Duration::from_millis(500),
        "a check with a timeout of {TIMEOUT:?} ended in {took:?}: {result:?}"
    );
    assert!(
        matches!(result, Err(redis_ratelimit::Error::Timeout(t)) if t == TIMEOUT),
        "{result:?}"
    );
}

/// As above, with the tower service called on a thread without a runtime
/// (its future polled on B later), which is how the decision is queued:
/// the request is queued for A's task in `call`. That alone does not bound
/// it, as B may poll it while A is blocked, so it keeps a timer of its own
/// from its first poll. Before, a request queued where no runtime was took
/// the task's deadline as its only bound, and waited for A to unblock.
#[test]
fn a_call_made_outside_a_runtime_ends_by_its_timeout_while_the_batching_tasks_runtime_is_blocked() {
    use http::{Request, Response, StatusCode};
    use redis_ratelimit::{OnStoreError, RateLimitLayer, key::Global};
    use tower::{Layer, Service, service_fn};

    let server = RedisServer::start();
    let io = tokio::runtime::Runtime::new().unwrap();
    let limiter = limiter_on(&server, &io, TIMEOUT);
    let b = current_thread();
    let a = block_the_batching_tasks_runtime(&limiter);
    let mut svc = RateLimitLayer::new(limiter, Global)
        .on_store_error(OnStoreError::Deny)
        .layer(service_fn(|_req: Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::new("ok"))
        }));
    // Called here, on a thread without a runtime; polled on B.
    let response = svc.call(Request::new(()));
    let (status, took) = b.block_on(async {
        let start = Instant::now();
        (response.await.unwrap().status(), start.elapsed())
    });
    a.join().unwrap();
    assert!(
        took < Duration::from_millis(500),
        "a call with a timeout of {TIMEOUT:?} ended in {took:?} ({status})"
    );
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

/// The batching task goes with its runtime: once the runtime of the
/// store's first check (A) is dropped, concurrent checks on another (B)
/// share script calls again, through a task started on B. Before, the
/// store kept the dead task's queue, and every check went in a call of its
/// own for as long as the store lived.
#[test]
fn checks_are_batched_again_once_the_batching_tasks_runtime_is_gone() {
    let server = RedisServer::start();
    let io = tokio::runtime::Runtime::new().unwrap();
    let limiter = limiter_on(&server, &io, support::TEST_TIMEOUT);
    let b = current_thread();
    std::thread::spawn({
        let limiter = limiter.clone();
        move || {
            current_thread().block_on(async {
                assert!(limiter.check("a", 1).await.unwrap().is_allowed());
            });
        }
    })
    .join()
    .unwrap();
    b.block_on(async {
        assert!(limiter.check("warm", 1).await.unwrap().is_allowed());
        let before = server.script_calls().await;
        let keys = ["a", "b", "c", "d"];
        let decisions = join_all((0..400).map(|i| limiter.check(keys[i % 4], 1))).await;
        let calls = server.script_calls().await - before;
        assert!(decisions.iter().all(|d| d.as_ref().unwrap().is_allowed()));
        assert!(
            calls < 100,
            "{calls} script calls for 400 concurrent decisions"
        );
        server.assert_every_key_has_ttl().await;
    });
}
