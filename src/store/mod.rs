//! Where counters live: the [`Store`] trait, [`RedisStore`] and [`MemoryStore`].
//!
//! Both stores give the same answers for the same sequence of checks: a fixed
//! window per key that starts at the key's first admitted request, counts
//! admitted cost only, never goes above the limit, and expires after the
//! window.

use std::{fmt, future::Future, pin::Pin};

use crate::Error;

mod lease;
mod memory;
mod redis;
pub(crate) mod scripts;

pub use self::lease::{LeaseState, LeaseStore};
pub use self::memory::MemoryStore;
pub use self::redis::RedisStore;

/// A boxed, `Send` future, as [`Store`] methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The state of one fixed-window counter after a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowState {
    /// Whether the cost was admitted (and counted).
    pub allowed: bool,
    /// Units counted in the current window, after this check.
    pub count: u64,
    /// Milliseconds until the window resets.
    pub ttl_ms: u64,
}

/// A backend that decides fixed-window checks atomically.
///
/// Implementations must admit `cost` only if `count + cost <= limit`, count
/// only admitted cost, and give every counter they create an expiry of at
/// most `window_ms`.
pub trait Store: fmt::Debug + Send + Sync + 'static {
    /// Checks and, if it fits, spends `cost` against the counter at `key`.
    fn fixed_window(
        &self,
        key: String,
        limit: u64,
        window_ms: u64,
        cost: u64,
    ) -> BoxFuture<'static, Result<WindowState, Error>>;
}
