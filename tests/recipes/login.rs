//! Recipe: a login brute-force guard that counts only failures, with
//! `Limiter::refund`.

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use redis_ratelimit::{ConfigError, Error, Limiter, Store};
use tokio::task::JoinSet;

use crate::support::RedisServer;

// ANCHOR: login
/// 5 failed logins per account and IP, and 20 per IP whatever the account,
/// every 15 minutes.
pub fn login_guard(store: impl Store) -> Result<Limiter, ConfigError> {
    Limiter::builder("5/15m".parse()?)
        .name("login-account-ip")
        .limit("login-ip", "20/15m".parse()?)
        .store(store)
        .build()
}

#[derive(Debug, PartialEq, Eq)]
pub enum Login {
    Success,
    WrongPassword,
    TooManyFailures { retry_in: Duration },
}

/// One login attempt. It is counted *before* the password is checked, so
/// that a burst of concurrent guesses cannot all get through while the
/// count is still low, then given back if the password was right: only
/// failures stay counted.
pub async fn login(
    guard: &Limiter,
    account: &str,
    ip: &str,
    check_password: impl Future<Output = bool>,
) -> Result<Login, Error> {
    // An IP has no spaces: "<ip> <account>" is unambiguous.
    let keys = [format!("{ip} {account}"), ip.to_owned()];
    let decision = guard.check_each(&keys, 1).await?;
    if !decision.is_allowed() {
        let retry_in = decision.retry_after().unwrap_or_default();
        return Ok(Login::TooManyFailures { retry_in });
    }
    if !check_password.await {
        return Ok(Login::WrongPassword);
    }
    if let Err(e) = guard.refund_each(&keys, &decision).await {
        // The attempt stays counted: a failing store never lifts the limit.
        tracing::warn!(error = %e, "login refund failed");
    }
    Ok(Login::Success)
}
// ANCHOR_END: login

/// A password check that counts its calls and takes a moment, so that
/// concurrent attempts overlap.
fn password(right: bool, calls: &Arc<AtomicU64>) -> impl Future<Output = bool> + use<> {
    let calls = calls.clone();
    async move {
        calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(2)).await;
        right
    }
}

/// Logins `(account, ip, right password?)` all at once, half through each
/// replica. The answers, in no order.
async fn attempts(
    replicas: &[Limiter; 2],
    logins: &[(String, String, bool)],
    calls: &Arc<AtomicU64>,
) -> Vec<Login> {
    let mut tasks = JoinSet::new();
    for (i, (account, ip, right)) in logins.iter().cloned().enumerate() {
        let (guard, check) = (replicas[i % 2].clone(), password(right, calls));
        tasks.spawn(async move { login(&guard, &account, &ip, check).await });
    }
    let mut answers = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        answers.push(joined.unwrap().unwrap());
    }
    answers
}

/// Guesses are limited under concurrency, and only failures count. 30
/// wrong and 10 right passwords for one account and IP at once, through two
/// replicas: at most 5 wrong ones reach the password check, and exactly 5
/// once the rest are tried one by one. 60 guesses at once over 60 accounts
/// from one IP: exactly 20 reach it. 30 good logins in a row never lock an
/// account; its failures still do, after 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_guard_counts_failures_only_and_exactly() {
    let server = RedisServer::start();
    let replicas = [
        login_guard(server.store().await).unwrap(),
        login_guard(server.store().await).unwrap(),
    ];
    let (wrong, right) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let alice = |i: usize| {
        (
            "alice".to_owned(),
            "198.51.100.7".to_owned(),
            i.is_multiple_of(4),
        )
    };
    let mixed: Vec<_> = (0..40).map(alice).collect();
    let (guesses, goods): (Vec<_>, Vec<_>) = mixed.into_iter().partition(|(_, _, r)| !r);
    let (a, b) = tokio::join!(
        attempts(&replicas, &guesses, &wrong),
        attempts(&replicas, &goods, &right)
    );
    let failed = a.iter().filter(|l| **l == Login::WrongPassword).count() as u64;
    assert_eq!(failed, wrong.load(Ordering::SeqCst));
    assert!(failed <= 5, "{failed} guesses checked\n{}", server.log());
    let succeeded = b.iter().filter(|l| **l == Login::Success).count() as u64;
    assert_eq!(succeeded, right.load(Ordering::SeqCst), "{b:?}");
    // One by one, through a third replica (a fresh deny cache): exactly the
    // rest of the 5 guesses get checked.
    let third = login_guard(server.store().await).unwrap();
    loop {
        let check = password(false, &wrong);
        match login(&third, "alice", "198.51.100.7", check).await.unwrap() {
            Login::WrongPassword => {}
            Login::TooManyFailures { retry_in } => {
                assert!(retry_in > Duration::from_secs(890), "{retry_in:?}");
                break;
            }
            Login::Success => unreachable!(),
        }
    }
    assert_eq!(wrong.load(Ordering::SeqCst), 5, "{}", server.log());

    // Password spraying: one IP, many accounts.
    let sprayed = Arc::new(AtomicU64::new(0));
    let spray: Vec<_> = (0..60)
        .map(|i| (format!("user{i}"), "203.0.113.9".to_owned(), false))
        .collect();
    attempts(&replicas, &spray, &sprayed).await;
    assert_eq!(sprayed.load(Ordering::SeqCst), 20, "{}", server.log());

    // Successes do not count; failures still do.
    let calls = Arc::new(AtomicU64::new(0));
    for i in 0..30 {
        let check = password(true, &calls);
        let got = login(&replicas[i % 2], "bob", "192.0.2.1", check).await;
        assert_eq!(got.unwrap(), Login::Success, "login {i}");
    }
    for i in 0..6 {
        let check = password(false, &calls);
        let got = login(&replicas[i % 2], "bob", "192.0.2.1", check).await;
        match got.unwrap() {
            Login::WrongPassword => assert!(i < 5),
            Login::TooManyFailures { .. } => assert_eq!(i, 5),
            Login::Success => unreachable!(),
        }
    }
    server.assert_every_key_has_ttl().await;
}
