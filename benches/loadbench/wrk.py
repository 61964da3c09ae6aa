"""Running wrk and reading its report."""

import os
import re
import resource
import subprocess
import uuid

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keys.lua")

_UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def run(url, seconds, connections, threads=1, script=None):
    """One wrk run: `GET url` for `seconds` over `connections` kept-alive
    connections. `script` is keys.lua's (mode, keys), or None for a plain GET.
    Returns req/s, the request count, p50/p75/p90/p99 in ms, non-2xx
    answers, socket errors and wrk's own CPU seconds."""
    cmd = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency"]
    if script:
        mode, keys = script
        # A nonce per run, so `mixed`'s fresh keys are fresh in every run.
        cmd += ["-s", SCRIPT, url, "--", mode, str(keys), uuid.uuid4().hex[:12]]
    else:
        cmd.append(url)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = parse(out)
    # wrk's own CPU time (it was the only child waited for meanwhile).
    result["wrk_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
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
    for p in (50, 75, 90, 99):
        m = need(rf"\n\s+{p}%\s+([\d.]+)(us|ms|s|m)\b")
        result[f"p{p}"] = ms(m.group(1), m.group(2))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    result["non2xx"] = int(non2xx.group(1)) if non2xx else 0
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    result["socket_errors"] = sum(map(int, errors.groups())) if errors else 0
    return result
