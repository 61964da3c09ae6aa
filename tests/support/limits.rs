//! Small helpers for tests that run every algorithm through a [`Backend`].

use redis_ratelimit::{Breaker, Limiter, LimiterBuilder, Quota, RedisStore, Tiers};

use super::{Backend, TEST_TIMEOUT};

/// The three algorithms at `limit` per `window`.
pub fn algorithms(limit: u64, window: &str) -> [(&'static str, Quota); 3] {
    let q: Quota = format!("{limit}/{window}").parse().unwrap();
    [
        ("fw", q),
        ("sw", q.sliding_window()),
        ("gcra", q.gcra(limit).unwrap()),
    ]
}

/// A limiter named `name` with `quota`, on `b`'s store.
pub fn limiter(b: &Backend, name: &str, quota: Quota) -> Limiter {
    b.builder_for(quota).name(name).build().unwrap()
}

/// How many of `n` checks of `key`, one after another, are admitted.
pub async fn admitted(l: &Limiter, key: &str, n: u64) -> u64 {
    let mut count = 0;
    for _ in 0..n {
        count += u64::from(l.check(key, 1).await.unwrap().is_allowed());
    }
    count
}

/// A limiter of `quota` on `store` that sends every check to it: no deny
/// cache, no breaker, the tests' timeout.
pub fn every_check(quota: Quota, store: RedisStore) -> LimiterBuilder {
    Limiter::builder(quota)
        .store(store)
        .timeout(TEST_TIMEOUT)
        .deny_cache(0)
        .breaker(Breaker::disabled())
}

/// Tiers whose default has two limits and whose tier "pro" has one: no
/// extractor of two keys fits them all.
pub fn tiers_of_two_limits_and_one() -> Tiers {
    let two_limits = Limiter::builder(Quota::per_second(1))
        .limit("global", Quota::per_second(100))
        .build()
        .unwrap();
    let pro = Limiter::builder(Quota::per_second(5))
        .name("pro")
        .build()
        .unwrap();
    Tiers::new(two_limits).tier(pro)
}
