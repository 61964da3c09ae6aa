"""redis-limit.py's figures and output: medians, the bound, the machine, the
markdown report, the progress lines and the JSON file."""

import json
import os
import re
import statistics
import sys

from . import KEYS, ROOT
from .procs import commit, cpu_model, output


def medians(runs, metrics):
    """{metric: its median over the runs}."""
    return {m: statistics.median(r[m] for r in runs) for m in metrics}


def bound(c_plain, c_redis):
    """The best possible ratio to plain axum: C_plain / (C_plain + C_redis)."""
    return c_plain / (c_plain + c_redis)


def bounds(c_plain, result):
    """A design's bound, deep and at depth 1 (None without depth-1 runs)."""
    return {mode: bound(c_plain, result[mode]["redis_cpu_us_per_decision"])
            if result.get(mode) else None for mode in ("deep", "shallow")}


def machine():
    def first_line(cmd):
        return (output(cmd, ROOT).splitlines() or ["unknown"])[0]

    return {"cpu": cpu_model(), "nproc": os.cpu_count(), "kernel": os.uname().release,
            "redis": first_line(["redis-server", "--version"]),
            "wrk": " ".join(first_line(["wrk", "-v"]).split()[:2]),
            "commit": commit(ROOT), "python": sys.version.split()[0]}


def progress(result, load):
    """The line printed to stderr after each design."""
    d, s = result["deep"], result.get("shallow")
    return (f"  deep: {d['redis_cpu_us_per_decision']:.2f} µs/decision, "
            f"{d['decisions_per_s']:,.0f}/s, busy {d['redis_busy']:.0%}"
            + (f"; depth 1: {s['redis_cpu_us_per_decision']:.2f} µs/decision" if s else "")
            + f"; load {load}")


def markdown(meta, plain, results):
    c = plain["c_plain_us"]
    m, o = meta["machine"], meta["options"]
    redis = re.search(r"v=(\S+)", m["redis"])
    if plain.get("given"):
        measured = "given with --plain-us, not measured)."
    else:
        measured = (
            f"plain axum {plain['server_us']:.1f} + wrk {plain['wrk_us']:.1f}; "
            f"{plain['rps']:,.0f} req/s; the machine's /proc/stat busy time per request "
            f"{plain['machine_busy_us']:.1f} µs), median of {len(plain['runs'])} runs of "
            f"`wrk -t1 -c{o['wrk_connections']} -d{o['seconds']}s` over {KEYS:,} keys.")
    lines = [
        f"Machine: {m['cpu']}, {m['nproc']} cores, Linux {m['kernel']}, "
        f"Redis {redis.group(1) if redis else m['redis']}, {m['wrk']}, commit {m['commit']}, "
        f"{meta['date']}.",
        f"Load average (1, 5, 15 min): {meta['load_start']} at the start, "
        f"{meta['load_end']} at the end.",
        "",
        f"C_plain = **{c:.1f} µs** of CPU per request, the whole machine ({measured}",
        f"0.8x would leave Redis at most **{c * 0.25:.1f} µs** per decision, with a "
        f"server adding nothing.",
        "",
        f"Redis CPU per decision: deep pipeline, one connection, "
        f"{o['decisions']:,} decisions; depth 1: {o['connections']} connections, one call "
        f"in flight on each, {o['shallow_decisions']:,} decisions. Medians of "
        f"{o['repeats']} runs. Best possible ratio = C_plain / (C_plain + "
        f"Redis CPU per decision).",
        "",
        "| design | decisions per call | deep: Redis CPU µs/decision | deep: decisions/s "
        "| deep: Redis busy | deep: best possible ratio | depth 1: Redis CPU µs/decision "
        "| depth 1: best possible ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        d, s, b = r["deep"], r.get("shallow"), bounds(c, r)
        sh = f"{s['redis_cpu_us_per_decision']:.2f} | {b['shallow']:.2f}x" if s else "– | –"
        lines.append(
            f"| {r['name']} | {r['per_call']} | {d['redis_cpu_us_per_decision']:.2f} | "
            f"{d['decisions_per_s']:,.0f} | {d['redis_busy']:.0%} | {b['deep']:.2f}x | {sh} |")
    lines += [
        "",
        "Every reply was checked (count, no error, an allowed decision's content), "
        "INFO commandstats counted the calls sent, and after each design the keyspace "
        "held exactly the design's keys, each with a TTL within the window (but the "
        "lone INCR's), their counters summing to the decisions made.",
    ]
    return "\n".join(lines)


def write_json(path, meta, plain, results):
    with open(path, "w") as f:
        json.dump({"meta": meta, "plain": plain, "designs": results,
                   "bounds": {r["name"]: bounds(plain["c_plain_us"], r) for r in results}},
                  f, indent=2)
