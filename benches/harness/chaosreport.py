"""The chaos run's markdown table and its JSON (benches/chaos.py)."""

import json

COLUMNS = ["fault", "policy", "connection", "requests", "200 store / fail-open", "429",
           "503", "5xx", "over limit: store", "over limit: fail-open", "max latency ms",
           "recovery ms", "fallbacks after", "verdict"]


def cells(row):
    """A row's cells, in COLUMNS' order."""
    if row.get("skipped"):
        return [row["fault"], row["policy"], row["connection"], *[""] * 10,
                f"not run: {row['skipped']}"]
    fail_open_over = str(row["fail_open_over"])
    if row["fail_open_over"]:
        fail_open_over += " (policy)" if row["policy"] == "allow" else " (defect)"
    if row["recovery_ms"] is None:
        recovery = f"none in {row['watched_after_s']:.1f} s"
    else:
        recovery = f"{row['recovery_ms']:.1f}"
    if row["invalid"]:
        verdict = f"**invalid**: {row['invalid']}"
    elif row["problems"]:
        verdict = "**" + "; ".join(row["problems"]) + "**"
    else:
        verdict = "ok"
    if row["notes"] and not row["invalid"]:
        verdict += "; note: " + "; ".join(row["notes"])
    return [row["fault"], row["policy"], row["connection"], str(row["requests"]),
            f"{row['store_200']} / {row['fail_open_200']}", str(row["store_429"]),
            str(row["503"]), str(row["5xx"]), str(row["store_over"]), fail_open_over,
            f"{row['max_latency_ms']:.0f}", recovery, str(row["fallbacks_after"]), verdict]


def table(rows):
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def markdown(run):
    s = run["settings"]
    head = [
        f"# Chaos run at {run['commit']}",
        "",
        f"{run['date']}; {run['machine']}; load average at the start {run['loadavg']}.",
        f"Each row: a fresh `examples/axum.rs` (release) with `RATE_LIMIT={s['quota']}`, "
        f"`RATE_LIMIT_KEY=header:{s['header']}`, `RATE_LIMIT_DENY_CACHE=off`; wrk with "
        f"{s['connections']} connections cycling over {s['keys']} fresh keys; the fault "
        f"{s['pre_s']:g} s in, held {s['hold_s']:g} s (a killed cluster master stays dead), "
        f"then {s['post_s']:g} s watched. "
        f"Command: `{run['command']}`.",
        "",
    ]
    foot = []
    if run.get("incomplete"):
        foot = ["", f"**Incomplete run**: {run['incomplete']}"]
    return "\n".join(head) + "\n" + table(run["rows"]) + "\n" + "\n".join(foot) + (
        "\n" if foot else "")


def write(run, out):
    with open(out + ".json", "w") as f:
        json.dump(run, f, indent=1)
        f.write("\n")
    text = markdown(run)
    with open(out + ".md", "w") as f:
        f.write(text)
    return text
