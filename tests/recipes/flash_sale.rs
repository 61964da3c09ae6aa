//! Recipe: a flash sale (or red-packet grab): each user at most once, `stock`
//! in total, none oversold.

use std::{collections::HashMap, time::Duration};

use redis_ratelimit::{Error, Limiter, Quota, Store};
use tokio::task::JoinSet;

use crate::support::RedisServer;

// ANCHOR: flash_sale
/// A sale of `stock` items that lasts at most `sale`: one item per user.
/// Both windows start at the first grab and outlast the sale.
pub fn flash_sale(
    store: impl Store,
    sale_id: &str,
    stock: u64,
    sale: Duration,
) -> Result<Limiter, Box<dyn std::error::Error>> {
    Ok(Limiter::builder(Quota::new(1, sale)?)
        .name(format!("{sale_id}-per-user"))
        .limit(format!("{sale_id}-stock"), Quota::new(stock, sale)?)
        .store(store)
        .build()?)
}

/// Grabs one item for `user`: `Some(n)` is the item it got, numbered from 0
/// to `stock - 1`, each given out once; `None` when the user already has one
/// or the stock is gone. A refused grab takes nothing from either limit.
pub async fn grab(sale: &Limiter, user: &str) -> Result<Option<u64>, Error> {
    let decision = sale.check_each(&[user, "stock"], 1).await?;
    if !decision.is_allowed() {
        return Ok(None);
    }
    // What is left after this grab tells which item it was.
    let stock = decision.limits().nth(1).expect("the stock limit");
    Ok(Some(stock.quota().limit() - 1 - stock.remaining()))
}
// ANCHOR_END: flash_sale

/// 300 users for 100 items, many trying several times (up to 6), all at
/// once through two replicas: exactly 100 items go out, each exactly once,
/// to 100 different users.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flash_sale_sells_its_stock_exactly_once_each() {
    let server = RedisServer::start();
    let hour = Duration::from_secs(3600);
    let replicas = [
        flash_sale(server.store().await, "sale42", 100, hour).unwrap(),
        flash_sale(server.store().await, "sale42", 100, hour).unwrap(),
    ];
    let mut tasks = JoinSet::new();
    let mut tries = 0;
    for user in 0..300 {
        for attempt in 0..=user % 6 {
            let sale = replicas[(user + attempt) % 2].clone();
            tasks.spawn(async move { (user, grab(&sale, &format!("user{user}")).await) });
            tries += 1;
        }
    }
    let mut items: HashMap<u64, usize> = HashMap::new();
    let mut refused = 0;
    while let Some(joined) = tasks.join_next().await {
        let (user, got) = joined.unwrap();
        match got.unwrap_or_else(|e| panic!("{e}\n{}", server.log())) {
            Some(item) => {
                let first = items.insert(item, user);
                assert_eq!(first, None, "item {item} sold twice");
            }
            None => refused += 1,
        }
    }
    let mut sold: Vec<u64> = items.keys().copied().collect();
    sold.sort_unstable();
    assert_eq!(sold, (0..100).collect::<Vec<_>>(), "{}", server.log());
    let mut buyers: Vec<usize> = items.values().copied().collect();
    buyers.sort_unstable();
    buyers.dedup();
    assert_eq!(buyers.len(), 100, "one item per user");
    assert_eq!(refused, tries - 100);
    // The sale is over: a newcomer and a winner are both refused.
    assert_eq!(grab(&replicas[0], "late").await.unwrap(), None);
    let winner = format!("user{}", buyers[0]);
    assert_eq!(grab(&replicas[1], &winner).await.unwrap(), None);
    server.assert_every_key_has_ttl().await;
}
