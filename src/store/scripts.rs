//! The Lua scripts, loaded once from `lua/` and run with `EVALSHA`.
//!
//! A call sends `EVALSHA` and, on `NOSCRIPT` (after a `SCRIPT FLUSH` or a
//! Redis restart), the same call as `EVAL` of the source, which loads it
//! ([`Call::invoke`](super::call::Call::invoke)), so no caller ever sees a
//! missing script.

use std::sync::LazyLock;

use redis::Script;

/// The decide script: `lua/lib.lua`, the algorithm modules
/// (`fixed_window.lua`, `sliding_window.lua`, `gcra.lua`) and `lua/decide.lua`,
/// joined. `decide.lua`'s header documents KEYS, ARGV and the reply.
pub(crate) static DECIDE: LazyLock<Script> = LazyLock::new(|| Script::new(DECIDE_LUA));

/// decide.lua's fast path for calls whose every limit is a fixed window:
/// `lua/lib.lua`, `lua/fixed_window.lua` and `lua/decide_fixed.lua`, joined.
pub(crate) static DECIDE_FIXED: LazyLock<Script> = LazyLock::new(|| Script::new(DECIDE_FIXED_LUA));

/// decide.lua keeping no spend: see [`PEEK_LUA`].
pub(crate) static PEEK: LazyLock<Script> = LazyLock::new(|| Script::new(PEEK_LUA));
/// `lua/refund.lua` after the modules it uses.
pub(crate) static REFUND: LazyLock<Script> = LazyLock::new(|| Script::new(REFUND_LUA));
/// `lua/once.lua` and `lua/reset.lua`.
pub(crate) static RESET: LazyLock<Script> = LazyLock::new(|| Script::new(RESET_LUA));

/// `lua/reserve.lua` after the modules it uses: see [`RESERVE_LUA`].
pub(crate) static RESERVE: LazyLock<Script> = LazyLock::new(|| Script::new(RESERVE_LUA));

/// `lua/concurrency_acquire.lua`, run by the lease store.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
/// `lua/concurrency_renew.lua`.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_LUA));
/// `lua/concurrency_release.lua`.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));

/// `lua/probe_writes.lua`, run once by the startup check.
pub(crate) static PROBE_WRITES: LazyLock<Script> = LazyLock::new(|| Script::new(PROBE_WRITES_LUA));

/// Every script the Redis store runs, with its source, for loading them all.
pub(crate) fn all() -> [(&'static Script, &'static str); 10] {
    [
        (&RESERVE, RESERVE_LUA),
        (&DECIDE, DECIDE_LUA),
        (&DECIDE_FIXED, DECIDE_FIXED_LUA),
        (&PEEK, PEEK_LUA),
        (&REFUND, REFUND_LUA),
        (&RESET, RESET_LUA),
        (&ACQUIRE, ACQUIRE_LUA),
        (&RENEW, RENEW_LUA),
        (&RELEASE, RELEASE_LUA),
        (&PROBE_WRITES, PROBE_WRITES_LUA),
    ]
}

/// The source of `script`, one of [`all`]'s: for `EVAL` after `NOSCRIPT`.
pub(crate) fn source_of(script: &Script) -> Option<&'static str> {
    all()
        .into_iter()
        .find(|(known, _)| known.get_hash() == script.get_hash())
        .map(|(_, source)| source)
}

/// `lua/lib.lua` and the algorithm modules, joined, then `$tail`: the
/// scripts that decide, peek or refund with them.
macro_rules! after_the_algorithms {
    ($($tail:expr),+ $(,)?) => {
        concat!(
            include_str!("../../lua/lib.lua"),
            // The value helpers, which these scripts use throughout.
            "\nlocal corruption, read_string, int, stored = value_helpers()\n",
            include_str!("../../lua/fixed_window.lua"),
            "\n",
            include_str!("../../lua/sliding_window.lua"),
            "\n",
            include_str!("../../lua/gcra.lua"),
            $($tail),+
        )
    };
}

/// The source of the general script [`RedisStore`](super::RedisStore) runs, for
/// inspection and tooling: `lua/lib.lua`, `fixed_window.lua`,
/// `sliding_window.lua`, `gcra.lua` and `decide.lua`, joined.
pub const DECIDE_LUA: &str = after_the_algorithms!(
    "\nlocal peek = false\n",
    include_str!("../../lua/decide.lua"),
);

/// The source of the script that answers [`Limiter::peek`](crate::Limiter::peek):
/// [`DECIDE_LUA`] with `local peek = true`, so it decides and replies as
/// ever but keeps no spend (see `decide.lua`'s header).
pub const PEEK_LUA: &str = after_the_algorithms!(
    "\nlocal peek = true\n",
    include_str!("../../lua/decide.lua"),
);

/// The source of the refund script: `lua/lib.lua`, the algorithm modules,
/// `lua/once.lua` and `lua/refund.lua` (whose header documents KEYS, ARGV and
/// the reply).
pub const REFUND_LUA: &str = after_the_algorithms!(
    "\n",
    include_str!("../../lua/once.lua"),
    "\n",
    include_str!("../../lua/refund.lua"),
);

/// The source of the local reservation script
/// ([`LimiterBuilder::local_reservation`](crate::LimiterBuilder::local_reservation)):
/// `lua/lib.lua`, `lua/fixed_window.lua` and `lua/reserve.lua` (whose header
/// documents KEYS, ARGV and the reply), joined.
pub const RESERVE_LUA: &str = concat!(
    include_str!("../../lua/lib.lua"),
    "\n",
    include_str!("../../lua/fixed_window.lua"),
    "\n",
    include_str!("../../lua/reserve.lua"),
);

/// `lua/once.lua` and `lua/reset.lua`: deletes a client's counters in one
/// call, which runs once however often it is sent.
pub const RESET_LUA: &str = concat!(
    include_str!("../../lua/once.lua"),
    "\n",
    include_str!("../../lua/reset.lua"),
);

/// The source of the script [`RedisStore`](super::RedisStore) runs when every
/// limit of a call is a fixed window: `lua/lib.lua`, `lua/fixed_window.lua`
/// and `lua/decide_fixed.lua`, joined, which decides
/// as [`DECIDE_LUA`] does and gives its reply, with the batch's policies sent
/// once and two Redis calls per allowed decision instead of three or four.
pub const DECIDE_FIXED_LUA: &str = concat!(
    include_str!("../../lua/lib.lua"),
    "\n",
    include_str!("../../lua/fixed_window.lua"),
    "\n",
    include_str!("../../lua/decide_fixed.lua"),
);

/// `lua/concurrency_acquire.lua` after `lua/lib.lua`'s helpers: see its
/// header for KEYS, ARGV and the reply.
pub const ACQUIRE_LUA: &str = concat!(
    include_str!("../../lua/lib.lua"),
    "\n",
    include_str!("../../lua/concurrency_acquire.lua"),
);

/// `lua/concurrency_renew.lua` after `lua/lib.lua`'s helpers.
pub const RENEW_LUA: &str = concat!(
    include_str!("../../lua/lib.lua"),
    "\n",
    include_str!("../../lua/concurrency_renew.lua"),
);

/// `lua/concurrency_release.lua`.
pub const RELEASE_LUA: &str = include_str!("../../lua/concurrency_release.lua");

/// `lua/probe_writes.lua`: see its header.
const PROBE_WRITES_LUA: &str = include_str!("../../lua/probe_writes.lua");
