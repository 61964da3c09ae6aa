"""Running wrk and reading its report."""

import os
import re
import resource
import subprocess
import uuid

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keys.lua")

_UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}

# How far a paced run's achieved req/s may be from the offered, as a share.
TOLERANCE = 0.10


def run(url, seconds, connections, threads=1, script=None, delay=None, timeout=10):
    """One wrk run: `GET url` for `seconds` over `connections` kept-alive
    connections. `script` is keys.lua's (mode, keys), or None for a plain GET.
    `delay`, in ms: every connection waits that long after each answer
    before its next request (keys.lua's DELAY; a plain GET then goes through
    keys.lua's `plain` mode, the same request wrk sends without a script),
    so the run offers `connections * 1000 / delay` req/s at most. `timeout`,
    in seconds: how long wrk waits for an answer before it counts a timeout
    (its default, 2 s, would drop the slowest answers from the latencies and
    count them only as socket errors). Returns req/s, the request count,
    p50/p75/p90/p99 and max in ms, non-2xx answers, socket errors and wrk's
    own CPU seconds."""
    cmd = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency",
           "--timeout", f"{timeout}s"]
    if script or delay:
        mode, keys = script or ("plain", 0)
        # A nonce per run, so `mixed`'s fresh keys are fresh in every run.
        cmd += ["-s", SCRIPT, url, "--", mode, str(keys), uuid.uuid4().hex[:12]]
        cmd += [str(delay)] if delay else []
    else:
        cmd.append(url)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = parse(out)
    # wrk's own CPU time (it was the only child waited for meanwhile).
    result["wrk_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result


def spawn(url, connections, threads, seconds, script, args, timeout=30):
    """Starts wrk in the background with a script of its own (`script`, a
    path; `args` after `--`) and returns the Popen, stdout piped. `timeout`,
    in seconds: how long wrk waits for an answer before it counts a timeout
    (its default, 2 s, would drop the slowest answers from the latencies).
    Stop it with SIGINT to get its report early; `parse` reads it."""
    cmd = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency",
           "--timeout", f"{timeout}s", "-s", script, url, "--", *map(str, args)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def offered(connections, delay):
    """The req/s that `connections` offer with `delay` ms after each answer."""
    return connections * 1000 / delay


def paced(url, seconds, connections, threads, script, delay):
    """A paced run: `run` with `delay`, its record completed with the rate
    offered, the delay, and `rate_ok`: whether the achieved req/s is within
    TOLERANCE of the offered. The wait comes after each answer, so each
    connection's cycle is the delay plus the response time: the achieved
    rate falls a few percent short by design (a response time well below
    1 ms against a delay of several), and far short when the server cannot
    keep up; then the run was not at the load the other servers had."""
    result = run(url, seconds, connections, threads, script, delay)
    result.update(offered_rps=offered(connections, delay), delay_ms=delay, seconds=seconds)
    result["rate_ok"] = abs(result["rps"] / result["offered_rps"] - 1) <= TOLERANCE
    return result


def parse(out):
    def need(pattern):
        m = re.search(pattern, out)
        if not m:
            raise RuntimeError(f"wrk's report has no {pattern!r}:\n{out}")
        return m

    def ms(text, unit):
        return float(text) * _UNIT_MS[unit]

    result = {
        "rps": float(need(r"Requests/sec:\s+([\d.]+)").group(1)),
        "requests": int(need(r"(\d+) requests in ").group(1)),
    }
    m = need(r"Latency\s+[\d.]+\w+\s+[\d.]+\w+\s+([\d.]+)(us|ms|s|m)\b")
    result["max"] = ms(m.group(1), m.group(2))
    for p in (50, 75, 90, 99):
        m = need(rf"\n\s+{p}%\s+([\d.]+)(us|ms|s|m)\b")
        result[f"p{p}"] = ms(m.group(1), m.group(2))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    result["non2xx"] = int(non2xx.group(1)) if non2xx else 0
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    result["socket_errors"] = sum(map(int, errors.groups())) if errors else 0
    return result
