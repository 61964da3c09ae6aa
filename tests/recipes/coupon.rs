//! Recipe: a coupon claim with three limits decided atomically (the code is
//! `examples/coupon.rs`).

use std::{collections::HashMap, time::Duration};

use redis_ratelimit::{Limiter, MemoryStore, Quota};
use tokio::task::JoinSet;

use crate::{
    coupon_example::{Claim, Rules, claim, coupons},
    support::RedisServer,
};

/// Every user claims `tries` times at once, half of the claims through each
/// replica; returns each user's grants and every answer.
async fn round(replicas: &[Limiter; 2], users: usize, tries: usize) -> (Vec<u64>, Vec<Claim>) {
    let mut tasks = JoinSet::new();
    for user in 0..users {
        for attempt in 0..tries {
            let limiter = replicas[(user + attempt) % 2].clone();
            tasks.spawn(async move { (user, claim(&limiter, &format!("user{user}")).await) });
        }
    }
    let mut granted = vec![0; users];
    let mut answers = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (user, answer) = joined.unwrap();
        let answer = answer.unwrap();
        if answer == Claim::Granted {
            granted[user] += 1;
        }
        answers.push(answer);
    }
    (granted, answers)
}

fn count(answers: &[Claim]) -> HashMap<String, usize> {
    let mut by_kind = HashMap::new();
    for answer in answers {
        let kind = match answer {
            Claim::TryAgainIn(_) => "try again".to_owned(),
            other => format!("{other:?}"),
        };
        *by_kind.entry(kind).or_default() += 1;
    }
    by_kind
}

/// 30 users claim 4 times each at once, three rounds, across two replicas:
/// the "day" (5 s here) admits 2 each, the campaign's per-user limit 3, the
/// total 75, and not one claim more. Claims denied by one limit spend in
/// none: after the total is raised, exactly the users who got only 2 get
/// their third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coupon_claims_never_exceed_any_of_the_three_limits() {
    let server = RedisServer::start();
    let rules = |total: &str| Rules {
        per_user_per_day: "2/5s".parse().unwrap(),
        per_user: "3/1h".parse().unwrap(),
        total: total.parse().unwrap(),
    };
    let replicas = [
        coupons(server.store().await, &rules("75/1h")).unwrap(),
        coupons(server.store().await, &rules("75/1h")).unwrap(),
    ];

    let (first, answers) = round(&replicas, 30, 4).await;
    assert_eq!(first, vec![2; 30], "2 a day each\n{}", server.log());
    for answer in &answers {
        match answer {
            Claim::Granted => {}
            Claim::TryAgainIn(wait) => assert!(*wait <= Duration::from_secs(5), "{wait:?}"),
            other => panic!("only the daily limit binds yet: {other:?}"),
        }
    }

    // Every day window began before the round ended: all have ended now.
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    let (second, answers) = round(&replicas, 30, 4).await;
    assert_eq!(second.iter().sum::<u64>(), 15, "the total: 75 = 60 + 15");
    assert!(second.iter().all(|&n| n <= 1), "3 per user: {second:?}");
    let by_kind = count(&answers);
    assert_eq!(by_kind.get("Granted"), Some(&15), "{by_kind:?}");
    // The 15 users left without one were refused by the total alone.
    assert!(
        by_kind.get("SoldOut").is_some_and(|&n| n >= 60),
        "{by_kind:?}"
    );

    // A deploy raises the total; the named limits keep their counters.
    drop(replicas);
    let raised = coupons(server.store().await, &rules("1000/1h")).unwrap();
    let (third, _) = round(&[raised.clone(), raised], 30, 4).await;
    for user in 0..30 {
        let before = first[user] + second[user];
        assert_eq!(
            before + third[user],
            3,
            "user{user}: {before} then {third:?}"
        );
    }
    server.assert_every_key_has_ttl().await;
}

/// The example's own run: alice, bob, then alice again the same day.
#[tokio::test]
async fn the_coupon_example_runs_on_redis_and_in_memory() {
    let server = RedisServer::start();
    let rules = Rules {
        per_user_per_day: Quota::per_day(1),
        per_user: "3/30d".parse().unwrap(),
        total: "1000/30d".parse().unwrap(),
    };
    for limiter in [
        coupons(server.store().await, &rules).unwrap(),
        coupons(MemoryStore::new(), &rules).unwrap(),
    ] {
        assert_eq!(claim(&limiter, "alice").await.unwrap(), Claim::Granted);
        assert_eq!(claim(&limiter, "bob").await.unwrap(), Claim::Granted);
        let Claim::TryAgainIn(wait) = claim(&limiter, "alice").await.unwrap() else {
            panic!("alice's second claim of the day");
        };
        assert!(wait > Duration::from_secs(86_000) && wait <= Duration::from_secs(86_400));
    }
}
