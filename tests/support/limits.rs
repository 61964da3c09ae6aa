//! Small helpers for tests that run every algorithm through a [`Backend`].

use redis_ratelimit::{Limiter, Quota};

use super::Backend;

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
