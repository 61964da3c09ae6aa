"""What Redis did during one cell.

Before the cell: `CONFIG RESETSTAT` and a reading of `INFO cpu`. After it:
`INFO commandstats` (calls and usec per command since the reset) and
`INFO cpu` again. Both are divided by the requests wrk counted.

Two things about `INFO commandstats` shape what is reported:

* a command a script runs (`redis.call`) or a transaction runs at `EXEC` is
  counted under its own name too, and its time is also inside the
  script's or `EXEC`'s usec. So `cmds` counts every command executed, while
  `usec` adds up only the entry points: scripts, `MULTI`/`EXEC`, and plain
  commands sent on their own;
* telling a plain command from one run inside a script is not possible from
  these counters; a cell in which scripts or transactions ran is taken to
  send no data command on its own (true of every server measured here).

`cpu_us` (used_cpu_user + used_cpu_sys) is the whole Redis process: parsing,
networking and scripts. It is the fairest single figure across designs that
send one script or a five-command transaction per decision.
"""

SCRIPTS = {"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"}
TRANSACTION = {"multi", "exec"}
# The benchmark's own commands, not the server's.
OURS = ("info", "config", "command", "flushall")


def nodes(redis):
    """The servers behind `redis`: a `procs.Redis`, or a list of them (a
    cluster's masters), whose figures add up."""
    return redis if isinstance(redis, list) else [redis]


def reset(redis):
    for node in nodes(redis):
        node.cli("CONFIG", "RESETSTAT")
    return sum(cpu_seconds(node.cli("INFO", "cpu")) for node in nodes(redis))


def collect(redis, cpu_before):
    stats = {}
    for node in nodes(redis):
        for name, f in commandstats(node.cli("INFO", "commandstats")).items():
            total = stats.setdefault(name, {"calls": 0, "usec": 0})
            total["calls"] += f["calls"]
            total["usec"] += f["usec"]
    cpu = sum(cpu_seconds(node.cli("INFO", "cpu")) for node in nodes(redis)) - cpu_before
    return {"commands": stats, "cpu_us": cpu * 1e6}


def cpu_seconds(info):
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    return float(fields["used_cpu_user"]) + float(fields["used_cpu_sys"])


def commandstats(info):
    """{command: {"calls": n, "usec": n}}, without the benchmark's own."""
    out = {}
    for line in info.splitlines():
        if not line.startswith("cmdstat_"):
            continue
        name, fields = line[len("cmdstat_"):].split(":", 1)
        if name.split("|")[0] in OURS:
            continue
        f = dict(kv.split("=", 1) for kv in fields.split(","))
        out[name] = {"calls": int(f["calls"]), "usec": int(f["usec"])}
    return out


def per_request(cells):
    """Redis work per request over `cells` (the rounds of one server and
    workload), or None when Redis did nothing for them."""
    requests = sum(c["requests"] for c in cells)
    commands = {}
    for c in cells:
        for name, s in c["redis"]["commands"].items():
            total = commands.setdefault(name, {"calls": 0, "usec": 0})
            total["calls"] += s["calls"]
            total["usec"] += s["usec"]
    if not commands or not requests:
        return None
    nested = bool(SCRIPTS.union(TRANSACTION).intersection(commands))
    entry = {n: s for n, s in commands.items()
             if not nested or n in SCRIPTS or n in TRANSACTION or n == "ping"}
    cpu = sum(c["redis"]["cpu_us"] for c in cells)
    return {
        "scripts": sum(s["calls"] for n, s in commands.items() if n in SCRIPTS) / requests,
        "cmds": sum(s["calls"] for s in commands.values()) / requests,
        "usec": sum(s["usec"] for s in entry.values()) / requests,
        "cpu_us": cpu / requests,
        "by_command": {
            n: {"per_request": s["calls"] / requests,
                "usec_per_call": s["usec"] / s["calls"] if s["calls"] else 0.0}
            # Entry points first, then by calls.
            for n, s in sorted(commands.items(), key=lambda kv: (
                kv[0] not in SCRIPTS | TRANSACTION, -kv[1]["calls"], kv[0]))
        },
    }
