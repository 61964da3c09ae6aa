"""The chart: grouped bars per workload, one bar per server. Top: req/s
ratio to axum without a limiter; bottom: p99 minus its p99, at the same load
(the paced runs) when the results have them, else at saturation. Needs
matplotlib (`pip install matplotlib`); without it the chart is skipped."""

import sys


def render(rows, path, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed (pip install matplotlib): no chart at {path}",
              file=sys.stderr)
        return False

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    # The baseline is 1.0x and +0 ms by definition: no bar.
    servers = [s for s in dict.fromkeys(r["server"] for r in rows) if s != "axum, no limiter"]
    cell = {(r["server"], r["workload"]): r for r in rows}
    width = 0.8 / max(len(servers), 1)
    paced = any(r.get("paced_p99_minus_base") is not None for r in rows)
    dp99_key = "paced_p99_minus_base" if paced else "p99_minus_base"
    colors = plt.get_cmap("tab10").colors

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(13, 8.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    for i, server in enumerate(servers):
        xs, ratios, dp99 = [], [], []
        for x, w in enumerate(workloads):
            r = cell.get((server, w))
            if r:
                xs.append(x - 0.4 + width * (i + 0.5))
                ratios.append(r["ratio"])
                # 0: no bar for a row without paced runs among rows with.
                dp99.append(r.get(dp99_key) or 0.0)
        color = colors[i % len(colors)]
        hatch = "//" if "no limiter" in server else None
        top.bar(xs, ratios, width, label=server, color=color, hatch=hatch, edgecolor="white")
        bottom.bar(xs, dp99, width, color=color, hatch=hatch, edgecolor="white")

    # Issue 19's targets: 0.95x (memory store), 0.9x (denied path, a hot
    # key with a reservation), 0.8x (allowed path with Redis), p99 at most
    # 1 ms over the baseline's.
    top.axhline(1.0, color="black", linewidth=0.8)
    for y in (0.95, 0.9, 0.8):
        top.axhline(y, color="grey", linestyle="--", linewidth=0.8)
        top.text(-0.45, y, f"{y}x", va="bottom", fontsize=8, color="grey")
    top.set_ylabel("req/s ÷ axum without limiter")
    top.set_title(title, fontsize=10)
    bottom.axhline(0.0, color="black", linewidth=0.8)
    bottom.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
    bottom.text(-0.45, 1.0, "+1 ms", va="bottom", fontsize=8, color="grey")
    bottom.set_ylabel("p99 − baseline p99 (ms)\n"
                      + ("at the same load (paced)" if paced else "at saturation"))
    bottom.set_xticks(range(len(workloads)), workloads)
    handles, labels = top.get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, ncol=3, loc="lower center",
               bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
