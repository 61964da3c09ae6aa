"""From raw cells to results: medians of per-round ratios, the markdown
report, and the JSON file of raw results (from which both can be redrawn)."""

import json
import statistics
from dataclasses import asdict

from . import exactness, redisstats
from .catalog import Server, Workload


def summarize(cells, servers, workloads):
    """One row per (workload, server) that was measured."""
    by = {}
    for c in cells:
        by.setdefault((c["server"], c["workload"]), []).append(c)
    base = next(s for s in servers if s.baseline)
    rows = []
    for w in workloads:
        base_of = {_pair(c): c for c in by.get((base.name, w.name), [])}
        for s in servers:
            runs = by.get((s.name, w.name))
            if not runs:
                continue
            paired = [(c, base_of[_pair(c)]) for c in runs if _pair(c) in base_of]
            if s.baseline:
                paired = [(c, c) for c in runs]
            requests = sum(c["requests"] for c in runs)
            rows.append({
                "server": s.name,
                "workload": w.name,
                "rounds": len(runs),
                "rps": statistics.median(c["rps"] for c in runs),
                "ratio": statistics.median(c["rps"] / b["rps"] for c, b in paired),
                "p50": statistics.median(c["p50"] for c in runs),
                "p99": statistics.median(c["p99"] for c in runs),
                "p99_minus_base": statistics.median(c["p99"] - b["p99"] for c, b in paired),
                "denied": sum(c["non2xx"] for c in runs) / requests if requests else 0.0,
                "expected_denied": w.denied if s.limits else 0.0,
                "socket_errors": sum(c["socket_errors"] for c in runs),
                "redis": redisstats.per_request(runs) if s.redis else None,
                "cpu_us": _median_or_none(_cpu_per_request(c) for c in runs),
                "cpu_ratio": _median_or_none(
                    _cpu_per_request(b) / _cpu_per_request(c) for c, b in paired
                    if _cpu_per_request(c) and _cpu_per_request(b)),
            })
    return rows


def _pair(cell):
    """The baseline cell a cell's ratio is taken against: the round's (one per
    round and workload), or with `load.py --paired` the one run just before
    it. Cells recorded before pairs existed have only a round."""
    return str(cell.get("pair", cell["round"]))


def _cpu_per_request(cell):
    """CPU µs per request of the whole cell: the server, Redis (if any) and
    wrk. None for cells measured before CPU was recorded."""
    if "server_cpu_s" not in cell or not cell["requests"]:
        return None
    redis_s = (cell.get("redis") or {}).get("cpu_us", 0.0) / 1e6
    return (cell["server_cpu_s"] + redis_s + cell["wrk_cpu_s"]) * 1e6 / cell["requests"]


def _median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _ours(server_name):
    return server_name == "memory store" or server_name.startswith("redis ")


def _ratios(row):
    """The req/s ratio a target is judged on, with the CPU ratio beside it."""
    cpu = row.get("cpu_ratio")
    return f"{row['ratio']:.2f}x" + ("" if cpu is None else f" (CPU ratio {cpu:.2f})")


def targets(rows):
    """Issue 8's targets, each checked on the rows it applies to:
    (target, server, workload, measured text, met)."""
    out = []
    for r in rows:
        s, w, red = r["server"], r["workload"], r["redis"]
        if s.startswith("redis ") and w == "allowed, 100k keys":
            out.append(("allowed path with Redis, 100k keys: >= 0.80x", s, w,
                        _ratios(r), r["ratio"] >= 0.8))
        if s.startswith("redis ") and w == "denied, 1 key":
            out.append(("denied path: >= 0.90x", s, w, _ratios(r), r["ratio"] >= 0.9))
        if _ours(s):
            out.append(("p99 <= plain p99 + 1 ms", s, w,
                        f"{r['p99_minus_base']:+.2f} ms", r["p99_minus_base"] <= 1.0))
        if s == "memory store":
            out.append(("memory store: >= 0.90x on every workload", s, w,
                        _ratios(r), r["ratio"] >= 0.9))
        if s.startswith("redis ") and red is not None:
            # One script per allowed decision; none for a cached denial.
            allowed = 1.0 - r["denied"]
            cached = "deny cache on" in s
            limit = allowed if cached else 1.0
            what = ("scripts/request <= allowed share (none per cached denial)" if cached
                    else "scripts/request <= 1")
            out.append((what, s, w, f"{red['scripts']:.3f} (allowed {allowed:.0%})",
                        red["scripts"] <= limit + 0.01))
    return out


def _num(x, fmt):
    return "–" if x is None else format(x, fmt)


def _exactness(cells):
    """The "Exactness under load" section, from the cells' records."""
    t = exactness.totals(cells)
    lines = ["## Exactness under load", ""]
    if t["unrecorded"] == t["cells"]:
        return lines + ["Not checked: these results predate the exactness checks.", ""]
    lines += [
        f"After the measured run, {t['checked']} of {t['cells']} cells checked; the "
        "others had nothing to check (no bound, no Redis):",
        "",
        f"- admitted answers (2xx) within the workload's bound: {t['bounded']} cells "
        "(the workloads that deny);",
        f"- Redis keyspaces scanned for keys without a TTL: {t['scanned']}, "
        f"{t['keys']:,} keys in all;",
        f"- our largest counter against the limit: {t['counters']} cells (our Redis "
        "servers, on the workloads with a small limit).",
    ]
    if t["unrecorded"]:
        lines += ["", f"{t['unrecorded']} cells predate the checks and were not checked."]
    lines.append("")
    failed = exactness.failures(cells)
    if not failed:
        return lines + ["Every check passed.", ""]
    lines += ["**Cells that failed a check:**", "",
              "| round | server | workload | problems |", "|---:|---|---|---|"]
    for c in failed:
        lines.append(f"| {c['round']} | {c['server']} | {c['workload']} | "
                     + "; ".join(c["exactness"]["problems"]) + " |")
    return lines + [""]


def markdown(rows, meta, workloads, cells=()):
    m = meta
    lines = [
        "# Load benchmark results",
        "",
        f"{m['date']}, commit `{m['commit']}`; {m['machine']}.",
        f"`wrk -t{m['threads']} -c{m['connections']} -d{m['seconds']}s` (after a "
        f"{m['warmup']} s warm-up), {m['rounds']} round(s): in each, the workloads in a "
        "shuffled order, and a workload's servers back to back in a shuffled order"
        + (", each right after a baseline cell of its own (`--paired`). "
           if m.get("paired") else ". ") +
        "Medians over rounds; **ratio** is the median of per-round req/s ratios to "
        "`axum, no limiter` in the same round and workload"
        + (" (the cell just before, with `--paired`)" if m.get("paired") else "") +
        ". **CPU µs/req** is the CPU "
        "time the server, Redis and wrk spent per request; **CPU ratio** the median of "
        "per-round ratios of the baseline's CPU µs/req to it: the throughput ratio the "
        "same CPU would give on a saturated machine, and much steadier than req/s when "
        "the VM's speed drifts. **Δp99** is the median of "
        "per-round p99 differences to it. **429s** is the share of answers that were "
        "not 2xx (the workload's design in brackets). Redis columns are per request: "
        "script calls, commands executed (including those inside scripts and "
        "transactions), `INFO commandstats` µs of the entry commands, and Redis's "
        "whole CPU time (`INFO cpu`).",
        "",
    ]
    if m.get("loadavg_start", 0) > 0.5:
        lines += [f"**The machine was not idle**: load average {m['loadavg_start']:.2f} "
                  "at the start. Treat these figures as a smoke test.", ""]
    about = {w.name: w.about for w in workloads}
    for w in dict.fromkeys(r["workload"] for r in rows):
        lines += [f"## {w}", "", about.get(w, ""), "",
                  "| server | req/s | ratio | CPU µs/req | CPU ratio | p50 ms | p99 ms | "
                  "Δp99 ms | 429s | scripts/req | Redis cmds/req | Redis µs/req | "
                  "Redis CPU µs/req |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in (r for r in rows if r["workload"] == w):
            red = r["redis"] or {}
            lines.append(
                f"| {r['server']} | {r['rps']:.0f} | {r['ratio']:.2f}x "
                f"| {_num(r.get('cpu_us'), '.1f')} | {_num(r.get('cpu_ratio'), '.2f')} "
                f"| {r['p50']:.2f} "
                f"| {r['p99']:.2f} | {r['p99_minus_base']:+.2f} "
                f"| {r['denied']:.0%} ({r['expected_denied']:.0%}) "
                f"| {_num(red.get('scripts'), '.3f')} | {_num(red.get('cmds'), '.2f')} "
                f"| {_num(red.get('usec'), '.2f')} | {_num(red.get('cpu_us'), '.2f')} |")
        lines.append("")
    lines += _exactness(cells)
    lines += ["## Redis commands per request", "",
              "Calls per request × µs per call, from `INFO commandstats`.", "",
              "| server | workload | commands |", "|---|---|---|"]
    for r in rows:
        if r["redis"]:
            cmds = ", ".join(f"{n} {c['per_request']:.2f} × {c['usec_per_call']:.2f} µs"
                             for n, c in r["redis"]["by_command"].items())
            lines.append(f"| {r['server']} | {r['workload']} | {cmds} |")
    lines += ["", "## Issue 8 targets", "",
              "| target | server | workload | measured | met |", "|---|---|---|---|---|"]
    for target, s, w, measured, met in targets(rows):
        lines.append(f"| {target} | {s} | {w} | {measured} | {'yes' if met else '**no**'} |")
    warnings = [r for r in rows if abs(r["denied"] - r["expected_denied"]) > 0.05
                or r["socket_errors"]]
    if warnings:
        lines += ["", "## Cells that did not behave as designed", ""]
        for r in warnings:
            lines.append(f"- {r['server']} / {r['workload']}: {r['denied']:.1%} not 2xx "
                         f"(designed {r['expected_denied']:.0%}), "
                         f"{r['socket_errors']} socket errors")
    return "\n".join(lines) + "\n"


def dump(path, meta, servers, workloads, cells, rows):
    with open(path, "w") as f:
        json.dump({"meta": meta,
                   "servers": [asdict(s) for s in servers],
                   "workloads": [asdict(w) for w in workloads],
                   "cells": cells,
                   "summary": rows}, f, indent=1)


def load(path):
    """(meta, servers, workloads, cells) of a JSON file `dump` wrote."""
    with open(path) as f:
        data = json.load(f)
    servers = [Server(**s) for s in data["servers"]]
    workloads = [Workload(**{**w, "script": tuple(w["script"]) if w["script"] else None})
                 for w in data["workloads"]]
    return data["meta"], servers, workloads, data["cells"]
