"""Driving Redis with a design: a deep pipeline on one connection, depth 1 on
many, and one design's runs (the counters created, `--repeats` of each, the
keyspace checked)."""

import resource
import selectors
import sys
import threading
import time
import uuid

from . import KEYS
from .checks import counted, keyspace, verify
from .procs import rusage_seconds
from .bound import medians
from .resp import Incomplete, command, commandstats, connect, parse_many, redis_cpu

# What each run reports per decision, and the medians taken over runs.
METRICS = ("redis_cpu_us_per_decision", "decisions_per_s", "redis_busy")


def calls_for(design, decisions):
    return -(-decisions // design.per_call)


def rates(decisions, wall, cpu):
    return dict(zip(METRICS, (cpu * 1e6 / decisions, decisions / wall, cpu / wall)))


def cycle(design, shas):
    """One call per step through the 100,000 keys, each call's bytes (for
    designs without keys, one call)."""
    if not design.prefix:
        return [design.encode(0, shas)]
    if KEYS % design.per_call:
        raise ValueError(f"{KEYS} keys do not split into calls of {design.per_call}")
    return [design.encode(i, shas) for i in range(0, KEYS, design.per_call)]


def deep(port, design, calls, shas, control, timed=True):
    """`calls` calls on one connection, all written at once (a writer thread,
    in big chunks) while this thread reads. Returns the measurement; checks
    every reply after the timed part."""
    units = cycle(design, shas)
    # Whole cycles of the keys, repeated to at least 4096 calls a segment, so
    # that each sendall writes a big chunk.
    per_block = len(units) * -(-4096 // len(units))
    block = b"".join(units) * (per_block // len(units))
    whole, rest = divmod(calls, per_block)
    segments = [block] * whole
    if rest:
        segments.append(b"".join(units[i % len(units)] for i in range(rest)))
    marker = f"end-{uuid.uuid4().hex}".encode()
    sentinel = b"$%d\r\n%s\r\n" % (len(marker), marker)
    segments.append(command("ECHO", marker))

    sock = connect(port)
    failure = []

    def write():
        try:
            for s in segments:
                sock.sendall(s)
        except OSError as e:  # reported by the reader's wait
            failure.append(e)

    if timed:
        control.call("CONFIG", "RESETSTAT")
    cpu0 = redis_cpu(control)
    self0 = rusage_seconds(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    chunks, last = [], b""
    while True:
        chunk = sock.recv(1 << 20)
        if not chunk:
            sys.exit(f"{design.name}: redis-server closed the connection ({failure})")
        chunks.append(chunk)
        last = (last + chunk)[-len(sentinel):]
        if last == sentinel:
            break
    wall = time.perf_counter() - t0
    cpu = redis_cpu(control) - cpu0
    client = rusage_seconds(resource.RUSAGE_SELF) - self0
    writer.join()
    sock.close()
    stats = commandstats(control) if timed else None

    data = b"".join(chunks)
    data = data[:len(data) - len(sentinel)]
    verify(design, data, calls)
    if timed:
        counted(design, stats, calls)
    decisions = calls * design.per_call
    return {"calls": calls, "decisions": decisions, "wall_s": wall, "redis_cpu_s": cpu,
            **rates(decisions, wall, cpu),
            "client_cpu_us_per_decision": client * 1e6 / decisions,
            "bytes_sent": sum(len(s) for s in segments), "bytes_received": len(data),
            "commandstats": stats}


def shallow(port, design, calls, shas, control, connections):
    """`calls` calls over `connections` connections, one call in flight on
    each (a transaction is one call, written at once). Replies are checked as
    they come."""
    units = cycle(design, shas)
    sel = selectors.DefaultSelector()
    socks = [connect(port) for _ in range(connections)]
    bufs = {s: bytearray() for s in socks}
    nxt, done = 0, 0
    control.call("CONFIG", "RESETSTAT")
    cpu0 = redis_cpu(control)
    t0 = time.perf_counter()
    for s in socks:
        if nxt < calls:
            s.sendall(units[nxt % len(units)])
            nxt += 1
            sel.register(s, selectors.EVENT_READ)
    while done < calls:
        for key, _ in sel.select():
            s = key.fileobj
            chunk = s.recv(1 << 16)
            if not chunk:
                sys.exit(f"{design.name}: redis-server closed a connection")
            buf = bufs[s]
            buf += chunk
            try:
                replies, pos = parse_many(buf, 0, design.replies)
            except Incomplete:
                continue
            if pos != len(buf):
                sys.exit(f"{design.name}: more replies than calls on a connection")
            buf.clear()
            wrong = design.check(replies)
            if wrong:
                sys.exit(f"{design.name} (depth 1): {wrong}")
            done += 1
            if nxt < calls:
                s.sendall(units[nxt % len(units)])
                nxt += 1
    wall = time.perf_counter() - t0
    cpu = redis_cpu(control) - cpu0
    stats = commandstats(control)
    for s in socks:
        s.close()
    sel.close()
    counted(design, stats, calls, " (depth 1)")
    decisions = calls * design.per_call
    return {"calls": calls, "decisions": decisions, "connections": connections,
            "wall_s": wall, "redis_cpu_s": cpu, **rates(decisions, wall, cpu),
            "commandstats": stats}


def measure(port, control, design, args):
    """One design: FLUSHALL, its scripts loaded, its counters created
    (untimed), `args.repeats` deep and depth-1 runs, the keyspace checked.
    Returns every run and the medians."""
    control.call("FLUSHALL")
    shas = {name: control.call("SCRIPT", "LOAD", src).decode()
            for name, src in design.scripts.items()}
    if design.library:
        control.call("FUNCTION", "LOAD", "REPLACE", design.library)
    made = 0
    if design.setup:  # create the counters, untimed
        deep(port, design.setup, KEYS, shas, control, timed=False)
    elif design.prefix:
        calls = KEYS // design.per_call
        deep(port, design, calls, shas, control, timed=False)
        made += calls * design.per_call
    runs = {"deep": [], "shallow": []}
    for _ in range(args.repeats):
        r = deep(port, design, calls_for(design, args.decisions), shas, control)
        runs["deep"].append(r)
        made += r["decisions"]
        if args.shallow_decisions:
            r = shallow(port, design, calls_for(design, args.shallow_decisions), shas,
                        control, args.connections)
            runs["shallow"].append(r)
            made += r["decisions"]
    check = keyspace(control, design, made)
    control.call("FLUSHALL")
    out = {"name": design.name, "per_call": design.per_call, "entry": design.entry,
           "script_sha1": shas, "keyspace": check, "runs": runs}
    for mode in runs:
        if runs[mode]:
            out[mode] = medians(runs[mode], METRICS)
    return out
