"""The designs of an atomic rate-limit decision: their scripts, how one call
is encoded, and what an allowed decision's reply must say. The entry point's
docstring describes each."""

import os
from dataclasses import dataclass, field

from . import LIMIT, ROOT, WINDOW_MS, WINDOW_S
from .msgpack import unpack
from .resp import command

LUA = os.path.join(ROOT, "lua")

# The bare per-key script, shared with script-cost.sh.
with open(os.path.join(ROOT, "benches", "bare.lua")) as f:
    BARE_LUA = f.read()


@dataclass
class Design:
    name: str
    per_call: int  # decisions per call (script) or per transaction
    encode: object  # (first key index, shas) -> bytes of one call
    replies: int  # top-level replies per call
    check: object  # (list of replies) -> None, or what is wrong
    entry: str  # the command INFO commandstats counts once per call
    prefix: str = ""  # counters' key prefix; "" for no keys
    counter: str = "string"
    ttl: bool = True  # every key must have a TTL
    scripts: dict = field(default_factory=dict)  # name -> source
    # A function library (FUNCTION LOAD REPLACE) the design's calls run.
    library: str = ""
    # Creates the counters, untimed, in its stead (and counts no decision);
    # None: the design's own calls create them.
    setup: object = None


def lua_join(*names):
    """The files joined as script-cost.sh's join() does: each, then a newline."""
    parts = []
    for name in names:
        with open(os.path.join(LUA, name)) as f:
            parts.append(f.read() + "\n")
    return "".join(parts)


def as_function(source):
    """decide_fixed.lua as a Redis 7 function library, as script-cost.sh's
    as_function() builds its "kept" variant: lib.lua and fixed_window.lua at
    the library's top level (run once, at load, so lib.lua's `parsed` is
    kept from call to call), decide_fixed.lua's body the function's."""
    return ("#!lua name=redis_limit\n" + lua_join("lib.lua", "fixed_window.lua")
            + "redis.register_function('decide_fixed', function(KEYS, ARGV)\n"
            + source + "\nend)\n")


def k(i):
    return f"k:{i}"


def keys(i, n):
    return [k(i + j) for j in range(n)]


def multi(*commands):
    """A transaction, in one write: MULTI, the commands, EXEC."""
    return b"".join(command(*c) for c in [("MULTI",), *commands, ("EXEC",)])


# --- Reply checks: each takes the call's replies, returns what is wrong or None.


def equals(expected, what):
    return lambda r: None if r == [expected] else f"{what}: {r!r}"


def check_incr(r):
    return None if type(r[0]) is int and r[0] >= 1 else f"not a count >= 1: {r!r}"


def is_count(x):
    return type(x) is int and 1 <= x <= LIMIT


def is_ttl(x, window):
    return type(x) is int and 0 < x <= window


def packed(n, ok, wrong, width=2):
    """A script's packed reply: `width` numbers per key or request, each
    group passing ok(*group); `wrong` says which does not, formatted with j
    (from 1) and v."""
    def check(r):
        if not isinstance(r[0], bytes):
            return f"not a packed reply: {r[0]!r}"
        v = unpack(r[0])
        if not isinstance(v, list) or len(v) != width * n:
            return f"not {width * n} numbers: {v!r}"
        for i in range(0, width * n, width):
            if not ok(*v[i:i + width]):
                return wrong.format(j=i // width + 1, v=v[i:i + width])
        return None
    return check


def check_ours(n):
    """decide_fixed.lua's reply for n requests of one limit each, all allowed:
    per request what remains (>= 0: allowed) and reset_ms."""
    def ok(remaining, reset):
        return 0 <= remaining < LIMIT and 0 < reset <= WINDOW_MS
    return packed(n, ok, "request {j} not allowed as expected: {v}")


def check_bare(n):
    def ok(count, ttl):
        return is_count(count) and is_ttl(ttl, WINDOW_MS)
    return packed(n, ok, "key {j}: {v}")


def transaction(ok, n=1):
    """MULTI, three queued commands for each of n decisions, EXEC whose
    replies pass ok(*replies) three by three."""
    def check(r):
        if r[:1 + 3 * n] != ["OK", *["QUEUED"] * (3 * n)]:
            return f"MULTI/queued replies: {r[:1 + 3 * n]!r}"
        ex = r[1 + 3 * n]
        if not (isinstance(ex, list) and len(ex) == 3 * n
                and all(ok(*ex[i:i + 3]) for i in range(0, 3 * n, 3))):
            return f"EXEC: {ex!r}"
        return None
    return check


def native_ok(set_, count, pttl):
    return set_ in (None, "OK") and is_count(count) and is_ttl(pttl, WINDOW_MS)


def actix_ok(bitfield, expired, ttl):
    return (isinstance(bitfield, list) and len(bitfield) == 2 and bitfield[0] == bitfield[1]
            and is_count(bitfield[0]) and expired in (0, 1) and is_ttl(ttl, WINDOW_S))


# --- The designs -------------------------------------------------------------


def designs():
    fast = lua_join("lib.lua", "fixed_window.lua", "decide_fixed.lua")

    def ours(n):
        # decide_fixed.lua's compact form: 0, the limit, the window and the
        # cost (one limiter's batch, as RedisStore sends it).
        tail = [0, LIMIT, WINDOW_MS, 1]
        return lambda i, sha: command("EVALSHA", sha["ours"], n, *keys(i, n), *tail)

    def function(n):
        tail = [0, LIMIT, WINDOW_MS, 1]
        return lambda i, sha: command("FCALL", "decide_fixed", n, *keys(i, n), *tail)

    def bare(n):
        return lambda i, sha: command("EVALSHA", sha["bare"], n, *keys(i, n), 1)

    def native(i, _):
        key = k(i)
        return multi(("SET", key, 0, "PX", WINDOW_MS, "NX"), ("INCRBY", key, 1), ("PTTL", key))

    def natives(n):
        def encode(i, _):
            return multi(*[c for key in keys(i, n) for c in (
                ("SET", key, 0, "PX", WINDOW_MS, "NX"), ("INCRBY", key, 1), ("PTTL", key))])
        return encode

    def actix(i, _):
        key = k(i)
        return multi(("BITFIELD", key, "OVERFLOW", "SAT", "INCRBY", "u63", 0, 1, "GET", "u63", 0),
                     ("EXPIRE", key, WINDOW_S, "NX"), ("TTL", key))

    ping = command("PING")
    return [
        Design("PING (per-command floor, not a decision)", 1, lambda i, sha: ping, 1,
               equals("PONG", "not PONG"), "ping", prefix=""),
        Design("EVALSHA `return 1` (per-call floor of a script)", 1,
               lambda i, sha: command("EVALSHA", sha["return1"], 0), 1,
               equals(1, "not the integer 1"), "evalsha", scripts={"return1": "return 1"}),
        *[Design(f"ours: decide_fixed.lua, {n} per call", n, ours(n), 1, check_ours(n),
                 "evalsha", prefix="k:", scripts={"ours": fast}) for n in (8, 32, 50, 1)],
        # Not what RedisStore sends (docs/performance-notes.md says why).
        *[Design(f"ours as a Redis function (FCALL, not shipped), {n} per call", n, function(n),
                 1, check_ours(n), "fcall", prefix="k:",
                 library=as_function(lua_join("decide_fixed.lua"))) for n in (8, 1)],
        # bare.lua sets no TTL: its counters are created with one (SET PX),
        # which INCRBY keeps.
        Design("bare Lua INCRBY + PTTL, 8 per call", 8, bare(8), 1, check_bare(8), "evalsha",
               prefix="k:", scripts={"bare": BARE_LUA},
               setup=Design("SET k 0 PX <window>", 1,
                            lambda i, sha: command("SET", k(i), 0, "PX", WINDOW_MS), 1,
                            equals("OK", "not OK"), "set", prefix="k:")),
        Design("native tx: MULTI SET NX PX, INCRBY, PTTL, EXEC", 1, native, 5,
               transaction(native_ok), "exec", prefix="k:"),
        # The same, 8 decisions a transaction: a batched design without Lua
        # (it counts denied requests too, as the actix design does).
        Design("native tx x8: MULTI, 8 x (SET NX PX, INCRBY, PTTL), EXEC", 8, natives(8), 26,
               transaction(native_ok, 8), "exec", prefix="k:"),
        Design("actix-extensible-rate-limit tx: MULTI BITFIELD, EXPIRE NX, TTL, EXEC", 1,
               actix, 5, transaction(actix_ok), "exec", prefix="k:", counter="bitfield"),
        Design("lone INCR (no TTL: unsafe; cheapest write, a lower bound)", 1,
               lambda i, sha: command("INCR", f"incr:{i}"), 1, check_incr, "incr",
               prefix="incr:", ttl=False),
    ]
