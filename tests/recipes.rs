//! The recipes of `docs/recipes.md`, each run under concurrency against a
//! real `redis-server`, through two limiters on separate connections acting
//! as two replicas, counting every success: none may be over-admitted.
//!
//! The doc quotes the code between `// ANCHOR: name` and `// ANCHOR_END:
//! name` in these files (and in `examples/coupon.rs`) verbatim;
//! `doc::the_recipes_quote_the_tested_code` checks that it does.

mod support;

#[path = "../examples/coupon.rs"]
#[allow(dead_code)]
mod coupon_example;

#[path = "recipes/coupon.rs"]
mod coupon;
#[path = "recipes/doc.rs"]
mod doc;
#[path = "recipes/flash_sale.rs"]
mod flash_sale;
#[path = "recipes/lock.rs"]
mod lock;
#[path = "recipes/login.rs"]
mod login;
#[path = "recipes/ocr_quota.rs"]
mod ocr_quota;
