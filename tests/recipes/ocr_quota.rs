//! Recipe: a daily per-user quota for a paid API (OCR pages), with what is
//! left and when it resets shown to the user.

use std::time::Duration;

use redis_ratelimit::{ConfigError, Error, Limiter, Quota, Store};
use tokio::task::JoinSet;

use crate::support::RedisServer;

// ANCHOR: ocr_quota
/// `pages` OCR pages per user per day; the day starts at the user's first
/// call of it.
pub fn ocr_quota(store: impl Store, pages: u64) -> Result<Limiter, ConfigError> {
    Limiter::builder(Quota::per_day(pages))
        .name("ocr-pages")
        .store(store)
        .build()
}

/// What the API answers about the quota, whether the call was charged or not.
#[derive(Debug)]
pub struct Usage {
    pub charged: bool,
    /// Pages left today, after this call's.
    pub remaining: u64,
    /// When the day's quota starts afresh.
    pub resets_in: Duration,
}

/// Charges `pages` pages to `user` before running the OCR, or refuses the
/// call. A document longer than the whole quota is an error
/// ([`Error::CostExceedsLimit`]), not a refusal: no wait would admit it.
pub async fn charge(quota: &Limiter, user: &str, pages: u64) -> Result<Usage, Error> {
    let decision = quota.check(user, pages).await?;
    Ok(Usage {
        charged: decision.is_allowed(),
        remaining: decision.remaining(),
        resets_in: decision.reset_after(),
    })
}

impl Usage {
    /// The line shown to the user.
    pub fn message(&self, pages: u64) -> String {
        let hours = self.resets_in.as_secs().div_ceil(3600);
        match self.charged {
            true => format!("{} pages left today", self.remaining),
            false => format!(
                "{pages} pages is over today's remaining {}; try again in {hours} h",
                self.remaining
            ),
        }
    }
}
// ANCHOR_END: ocr_quota

/// 12 users with 50 pages a day each call 60 times at once through two
/// replicas, with documents of 1 to 3 pages. Every user's charges add up to
/// at most 50 pages, and the answers form one serial history: sorted by
/// what they left, each charged call left exactly its pages less than the
/// one before it; each refused call had fewer pages left than it asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daily_quota_charges_no_page_over_it() {
    let server = RedisServer::start();
    let replicas = [
        ocr_quota(server.store().await, 50).unwrap(),
        ocr_quota(server.store().await, 50).unwrap(),
    ];
    let mut tasks = JoinSet::new();
    for user in 0..12 {
        for call in 0..60u64 {
            let quota = replicas[call as usize % 2].clone();
            // User 0 sends only single pages; the others mix 1 to 3.
            let pages = if user == 0 { 1 } else { 1 + call % 3 };
            let name = format!("user{user}");
            tasks.spawn(async move { (user, pages, charge(&quota, &name, pages).await) });
        }
    }
    let mut charged = vec![Vec::new(); 12];
    while let Some(joined) = tasks.join_next().await {
        let (user, pages, usage) = joined.unwrap();
        let usage = usage.unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
        let day = Duration::from_secs(86_400);
        assert!(usage.resets_in > Duration::ZERO && usage.resets_in <= day);
        if usage.charged {
            charged[user].push((usage.remaining, pages));
        } else {
            assert!(usage.remaining < pages, "refused with room: {usage:?}");
            assert!(usage.message(pages).contains("try again in 24 h"));
        }
    }
    for (user, mut history) in charged.into_iter().enumerate() {
        history.sort_unstable_by(|a, b| b.cmp(a));
        let mut left: u64 = 50;
        for (remaining, pages) in &history {
            let expected = left.checked_sub(*pages);
            assert_eq!(expected, Some(*remaining), "user{user}: {history:?}");
            left = *remaining;
        }
        // Without charging (cost 0), the store agrees on what is left.
        let now = replicas[0].check(&format!("user{user}"), 0).await.unwrap();
        assert_eq!(now.remaining(), left, "user{user}");
        if user == 0 {
            assert_eq!(left, 0, "single pages use the quota up exactly");
        }
    }
    let usage = charge(&replicas[1], "newcomer", 3).await.unwrap();
    assert_eq!(usage.message(3), "47 pages left today");
    let too_long = charge(&replicas[1], "newcomer", 51).await.unwrap_err();
    assert!(
        matches!(too_long, Error::CostExceedsLimit { .. }),
        "{too_long}"
    );
    server.assert_every_key_has_ttl().await;
}
