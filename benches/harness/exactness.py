"""Exactness under load: after a cell's measured run, did the limiter admit
no more than the workload allows, and did it leave no Redis key without a TTL?

Two checks, outside the timed part:

* HTTP side, every server with a limiter: the measured run's admitted
  answers (`requests - non2xx`) against the workload's design. Where every
  request is to be denied the bound is 0; for `mixed, 90% denied` it is the
  number of fresh-key requests (each may be admitted once), `ceil(requests *
  (1 - denied))`, plus one per wrk thread for rounding. A workload that
  denies nothing has no bound a run could reach: not applicable. The paced
  run (load.py `--paced-rate`) is a wrk run of its own with its own nonce:
  its admitted answers are held to the same bound computed from its own
  requests, recorded apart (`paced_admitted`, `paced_bound`).
* Redis side, every Redis-backed server, after the measured and paced runs:
  one read-only script SCANs the whole keyspace and counts the keys and
  those without a TTL (there must be none).
  For our servers, on a workload with a small limit, it also finds the
  largest fixed-window counter (`rl:fw:...`, a string), which must not pass
  the limit. The peer actix-extensible-rate-limit counts denied requests
  too, so its counters pass the limit by design and are not compared.

Each cell records the result under "exactness"; `failures` lists the cells
that failed. Cells of older runs have no such field: not checked.
"""

import math
import os
import re
import subprocess

from . import redisstats

# Our fixed-window counters: "{prefix}:fw:{policy}:{key}" with prefix "rl".
COUNTER_PREFIX = "rl:fw:"
# Limits at least this large cannot be reached by a run: not compared.
SMALL_LIMIT = 1_000_000

# The keyspace scan, shared with redis-limit.py's checks (keyspace.lua).
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "keyspace.lua")) as _f:
    KEYSPACE_LUA = _f.read()

_INTEGER = re.compile(r"(-?\d+)\s*$")


def ours(server):
    """Our Redis-backed servers, whose counters count admitted requests only."""
    return server.name.startswith("redis ")


def limit_of(quota):
    """The count of a quota "N/window", or None."""
    try:
        return int(quota.split("/", 1)[0])
    except ValueError:
        return None


def bound(workload, requests, threads):
    """The most admitted answers a run of `requests` may give, or None when
    the workload denies nothing (no run reaches its limit)."""
    if workload.denied <= 0:
        return None
    # Rounded first, so that 1 - 0.9 = 0.0999... does not round a bound down.
    return math.ceil(round(requests * (1 - workload.denied), 6)) + (
        threads if workload.denied < 1 else 0)


def scan(redis):
    """(keys, keys without a TTL, largest counter or None) of the keyspace:
    of one server, or of every master of a cluster (a list)."""
    keys, no_ttl, max_count = 0, 0, -1
    for node in redisstats.nodes(redis):
        out = node.cli("EVAL", KEYSPACE_LUA, "0", COUNTER_PREFIX, "string")
        # Not a tty: one raw value per line; a tty would show "1) (integer) 5".
        values = [int(m.group(1)) for m in map(_INTEGER.search, out.splitlines()) if m]
        if len(values) != 7:
            raise ValueError(f"unexpected reply {out.strip()!r}")
        k, n, _gone, _stray, _sum, _max_ttl, m = values
        keys, no_ttl, max_count = keys + k, no_ttl + n, max(max_count, m)
    return keys, no_ttl, (None if max_count < 0 else max_count)


def check(redis, server, workload, result, threads):
    """The exactness record of one cell, or None when there is nothing to
    check (no limiter and no Redis)."""
    if not server.limits and not server.redis:
        return None
    rec = {"admitted": None, "bound": None, "keys": None, "without_ttl": None,
           "max_count": None, "limit": None, "problems": []}
    problems = rec["problems"]
    if server.limits:
        rec["admitted"], rec["bound"] = _admitted(workload, result, threads, problems, "")
        if result.get("paced"):
            rec["paced_admitted"], rec["paced_bound"] = _admitted(
                workload, result["paced"], threads, problems, "paced run: ")
    if server.redis:
        try:
            rec["keys"], rec["without_ttl"], rec["max_count"] = scan(redis)
        except (subprocess.CalledProcessError, ValueError) as e:
            detail = getattr(e, "stderr", None) or getattr(e, "stdout", None) or e
            problems.append(f"the keyspace scan failed: {str(detail).strip()}")
        else:
            if rec["without_ttl"]:
                problems.append(f"{rec['without_ttl']} of {rec['keys']} keys without a TTL")
            limit = limit_of(workload.quota)
            if ours(server) and server.limits and limit is not None and limit < SMALL_LIMIT:
                rec["limit"] = limit
                if rec["max_count"] is None:
                    # The spent keys must be there: the key layout changed?
                    problems.append(f"no counter found under {COUNTER_PREFIX!r}")
                elif rec["max_count"] > limit:
                    problems.append(f"a counter at {rec['max_count']}, over the limit {limit}")
    rec["ok"] = not problems
    return rec


def _admitted(workload, run, threads, problems, what):
    """(admitted, bound) of one wrk run; a problem if over the bound."""
    admitted = run["requests"] - run["non2xx"]
    most = bound(workload, run["requests"], threads)
    if most is not None and admitted > most:
        problems.append(f"{what}admitted {admitted} of {run['requests']} requests, "
                        f"more than the bound {most}")
    return admitted, most


def failures(cells):
    """The cells whose exactness check failed."""
    return [c for c in cells if c.get("exactness") and not c["exactness"]["ok"]]


def totals(cells):
    """What was checked over `cells`: a dict of counts."""
    recs = [c["exactness"] for c in cells if c.get("exactness")]
    return {
        "cells": len(cells),
        # Cells where a check applied (a bound, or a keyspace scanned).
        "checked": sum(1 for r in recs if r["bound"] is not None or r["keys"] is not None
                       or r["problems"]),
        "unrecorded": sum(1 for c in cells if "exactness" not in c),
        "bounded": sum(1 for r in recs if r["bound"] is not None),
        "scanned": sum(1 for r in recs if r["keys"] is not None),
        "keys": sum(r["keys"] for r in recs if r["keys"] is not None),
        "counters": sum(1 for r in recs if r["limit"] is not None),
        "failed": sum(1 for r in recs if not r["ok"]),
    }
