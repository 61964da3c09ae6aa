"""The markdown report, from the rows of `report.summarize` and the cells."""

from . import exactness, wrk
from .report import not_2xx_where_all_allowed, targets


def _num(x, fmt):
    return "–" if x is None else format(x, fmt)


def _met(met):
    return "–" if met is None else "yes" if met else "**no**"


def _exactness(cells):
    """The "Exactness under load" section, from the cells' records."""
    t = exactness.totals(cells)
    lines = ["## Exactness under load", ""]
    if t["unrecorded"] == t["cells"]:
        return lines + ["Not checked: these results predate the exactness checks.", ""]
    lines += [
        f"After each cell's runs, {t['checked']} of {t['cells']} cells checked; the "
        "others had nothing to check (no bound, no Redis):",
        "",
        f"- admitted answers (2xx) within the workload's bound: {t['bounded']} cells "
        "(the workloads that deny; the measured run, and the paced run apart);",
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


def _paced(m):
    """The paragraph on the paced runs, from the run's meta."""
    if not m.get("paced_offered_rps"):
        return ("No paced runs in these results (older, or `--paced-rate 0`): the "
                "**paced** columns show –, and the p99 target is not judged.")
    return (
        "**At the same load**: after the measured run, each cell has a paced run, "
        f"`wrk -t{m['threads']} -c{m['connections']} -d{m['paced_seconds']}s` with "
        f"every connection waiting {m['paced_delay_ms']} ms after each answer "
        f"(keys.lua's delay): every server is offered the same "
        f"{m['paced_offered_rps']:.0f} req/s, well below saturation. **paced req/s** "
        "is the rate achieved (* when a run was more than "
        f"{wrk.TOLERANCE:.0%} off the offered), **paced p99** its p99 and **paced "
        "Δp99** the median of per-round differences to the baseline's paced p99, "
        "paired as the ratios are. The p99 target is judged on it.")


def render(rows, meta, workloads, cells=()):
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
        "the VM's speed drifts. **p99** and **Δp99 at saturation** (the median of "
        "per-round p99 differences to it) are this closed-loop run's: the same "
        "connections, each server at its own top rate, so a slower one at a lower "
        "load. **429s** is the share of answers that were "
        "not 2xx (the workload's design in brackets). Redis columns are per request: "
        "script calls, commands executed (including those inside scripts and "
        "transactions), `INFO commandstats` µs of the entry commands, and Redis's "
        "whole CPU time (`INFO cpu`).",
        "",
        _paced(m),
        "",
    ]
    if m.get("loadavg_start", 0) > 0.5:
        lines += [f"**The machine was not idle**: load average {m['loadavg_start']:.2f} "
                  "at the start. Treat these figures as a smoke test.", ""]
    about = {w.name: w.about for w in workloads}
    for w in dict.fromkeys(r["workload"] for r in rows):
        lines += [f"## {w}", "", about.get(w, ""), "",
                  "| server | req/s | ratio | CPU µs/req | CPU ratio | p50 ms | p99 ms | "
                  "Δp99 ms at saturation | paced req/s | paced p99 ms | paced Δp99 ms | "
                  "429s | scripts/req | Redis cmds/req | Redis µs/req | Redis CPU µs/req |",
                  "|---|" + "---:|" * 15]
        for r in (r for r in rows if r["workload"] == w):
            red = r["redis"] or {}
            lines.append(
                f"| {r['server']} | {r['rps']:.0f} | {r['ratio']:.2f}x "
                f"| {_num(r.get('cpu_us'), '.1f')} | {_num(r.get('cpu_ratio'), '.2f')} "
                f"| {r['p50']:.2f} "
                f"| {r['p99']:.2f} | {r['p99_minus_base']:+.2f} "
                f"| {_num(r.get('paced_rps'), '.0f')}{'*' if r.get('paced_off_rate') else ''} "
                f"| {_num(r.get('paced_p99'), '.2f')} "
                f"| {_num(r.get('paced_p99_minus_base'), '+.2f')} "
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
    lines += ["", "## Issue 19 targets", "",
              "The p99 target is judged at the same load: on the paced runs' Δp99, every "
              "server offered the same req/s. The saturated Δp99 below each (each server "
              "at its own top rate, so a slower one at a lower load) is not judged.", "",
              "| target | server | workload | measured | met |", "|---|---|---|---|---|"]
    for target, s, w, measured, met in targets(rows):
        lines.append(f"| {target} | {s} | {w} | {measured} | {_met(met)} |")
    warnings = [r for r in rows if abs(r["denied"] - r["expected_denied"]) > 0.05
                or r["socket_errors"] or r.get("paced_off_rate")
                or r["paced_socket_errors"] or not_2xx_where_all_allowed(r)
                or r["store_errors_logged"]]
    if warnings:
        lines += ["", "## Cells that did not behave as designed", ""]
        for r in warnings:
            off = r.get("paced_off_rate")
            more = (f"; {off} paced run(s) more than {wrk.TOLERANCE:.0%} off the offered "
                    f"{r['paced_offered']:.0f} req/s (median achieved {r['paced_rps']:.0f})"
                    if off else "")
            if r["paced_socket_errors"]:
                more += (f"; {r['paced_socket_errors']} socket errors in the paced runs "
                         "(their p99 target not met)")
            if not_2xx_where_all_allowed(r):
                # Our servers answer a store error 503 (load.py sets
                # RATE_LIMIT_ON_ERROR=deny), where every answer should be 2xx.
                more += (f"; **{not_2xx_where_all_allowed(r)} not 2xx where every request "
                         f"is allowed** ({r['paced_non2xx']} in the paced runs): store "
                         "errors?")
            if r["store_errors_logged"]:
                more += (f"; **{r['store_errors_logged']} store error line(s) in the "
                         "server's logs** (503s, counted by wrk with any 429s)")
            lines.append(f"- {r['server']} / {r['workload']}: {r['denied']:.1%} not 2xx "
                         f"(designed {r['expected_denied']:.0%}), "
                         f"{r['socket_errors']} socket errors{more}")
    return "\n".join(lines) + "\n"
