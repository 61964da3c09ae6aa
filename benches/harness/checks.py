"""The checks that stop the run when a design did not do what it should:
every reply of a deep run, the calls `INFO commandstats` counted, and after
each design the keyspace (keys, TTLs, the counters' sum)."""

import sys

from . import KEYS, WINDOW_MS
from .exactness import KEYSPACE_LUA
from .resp import Incomplete, parse_many


def verify(design, data, calls):
    """Every reply of `calls` calls, in `data`, checked by the design."""
    pos = 0
    for c in range(calls):
        try:
            replies, pos = parse_many(data, pos, design.replies)
        except Incomplete:
            sys.exit(f"{design.name}: {c} of {calls} calls answered, then the replies end")
        wrong = design.check(replies)
        if wrong:
            sys.exit(f"{design.name}: call {c + 1} of {calls}: {wrong}")
    if pos != len(data):
        sys.exit(f"{design.name}: {len(data) - pos} bytes after the {calls} calls' replies")


def counted(design, stats, calls, where=""):
    """INFO commandstats (since CONFIG RESETSTAT) counts the calls sent."""
    sent = stats.get(design.entry, 0)
    if sent != calls:
        sys.exit(f"{design.name}{where}: INFO commandstats counts {sent} {design.entry} "
                 f"calls, {calls} were sent")


def keyspace(control, design, expected_sum):
    """The SCAN check: every key under the prefix, all with a TTL within the
    window (unless the design has none), the counters summing to the
    decisions made."""
    keys, no_ttl, gone, stray, total, max_ttl, _ = control.call(
        "EVAL", KEYSPACE_LUA, 0, design.prefix, design.counter)
    no_ttl += gone  # PTTL -2 counted as no TTL here, as before the shared scan
    result = {"keys": keys, "keys_without_ttl": no_ttl, "stray_keys": stray,
              "counter_sum": total, "expected_sum": expected_sum if design.prefix else None,
              "max_pttl": max_ttl}
    problems = []
    if design.prefix:
        if keys != KEYS or stray:
            problems.append(f"{keys} keys ({stray} not under {design.prefix}), not {KEYS}")
        if total != expected_sum:
            problems.append(f"the counters sum to {total}, not the {expected_sum} decisions made")
    elif keys:
        problems.append(f"{keys} keys left by a design that writes none")
    if design.ttl and no_ttl:
        problems.append(f"{no_ttl} keys without a TTL")
    if design.ttl and max_ttl > WINDOW_MS:
        problems.append(f"a TTL of {max_ttl} ms, longer than the window")
    if problems:
        sys.exit(f"{design.name}: keyspace check failed: " + "; ".join(problems))
    return result
