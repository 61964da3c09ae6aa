//! Business code without HTTP: a coupon claim decided against three limits
//! at once (per user per day, per user for the campaign, and the campaign's
//! total), all or nothing. In memory, or in Redis when `REDIS_URL` is set.
//!
//! ```text
//! cargo run --example coupon
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example coupon
//! ```

use std::time::Duration;

use redis_ratelimit::{ConfigError, Error, Limiter, MemoryStore, Quota, RedisStore, Store};

// ANCHOR: coupon
/// A campaign's limits.
pub struct Rules {
    pub per_user_per_day: Quota,
    pub per_user: Quota,
    pub total: Quota,
}

/// One limiter holds all three limits, so that one store call decides them.
pub fn coupons(store: impl Store, rules: &Rules) -> Result<Limiter, ConfigError> {
    Limiter::builder(rules.per_user_per_day)
        .name("coupon-user-day")
        .limit("coupon-user", rules.per_user)
        .limit("coupon-total", rules.total)
        .prefix("shop")
        .store(store)
        .build()
}

#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    Granted,
    TryAgainIn(Duration),
    UsedUp,
    SoldOut,
}

/// Claims one coupon for `user`: either every limit has room and each one
/// spends 1, or nothing is spent anywhere.
pub async fn claim(coupons: &Limiter, user: &str) -> Result<Claim, Error> {
    // One key per limit, in order: the user, the user, the whole campaign.
    let decision = coupons.check_each(&[user, user, "campaign"], 1).await?;
    let denied = |name| {
        decision
            .limits()
            .any(|l| l.name() == name && !l.is_allowed())
    };
    Ok(if decision.is_allowed() {
        Claim::Granted
    } else if denied("coupon-total") {
        Claim::SoldOut
    } else if denied("coupon-user") {
        Claim::UsedUp
    } else {
        Claim::TryAgainIn(decision.retry_after().unwrap_or_default())
    })
}
// ANCHOR_END: coupon

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1 a day, 3 per user during the 30-day campaign, 1000 in all.
    let rules = Rules {
        per_user_per_day: Quota::per_day(1),
        per_user: "3/30d".parse()?,
        total: "1000/30d".parse()?,
    };
    let limiter = match std::env::var("REDIS_URL") {
        Ok(url) => coupons(RedisStore::connect(url).await?, &rules)?,
        Err(_) => coupons(MemoryStore::new(), &rules)?,
    };
    for user in ["alice", "bob", "alice"] {
        println!("{user}: {:?}", claim(&limiter, user).await?);
    }
    Ok(())
}
