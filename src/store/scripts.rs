//! The Lua scripts, loaded once from `lua/` and run with `EVALSHA`.
//!
//! `redis::Script::invoke_async` sends `EVALSHA` and, on `NOSCRIPT` (after a
//! `SCRIPT FLUSH` or a Redis restart), loads the script and retries, so no
//! caller ever sees a missing script.

use std::sync::LazyLock;

use redis::Script;

/// `lua/fixed_window.lua`: see its header for KEYS, ARGV and the reply.
pub(crate) static FIXED_WINDOW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/fixed_window.lua")));
