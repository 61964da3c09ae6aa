"""The benchmarks' one harness; the commands in `benches/` run its parts.

Shared by every command:

* `procs`: tools on PATH, free ports, the benchmark's own redis-server,
  building and starting the servers, warm-up requests, CPU seconds from /proc
  and getrusage, the machine and commit a report names;
* `wrk`: running wrk and reading its report (with `keys.lua` for per-request
  keys and for the paced runs' delay).

`load.py`, the load benchmark (and `ab.py`, `flood.py` and `fleet.py`, which
reuse its parts):

* `catalog`: the servers and workloads measured;
* `redisstats`: what Redis did per cell (`INFO commandstats`, `INFO cpu`);
* `exactness`: after each cell, admitted answers within the workload's bound and
  no Redis key without a TTL;
* `report`: medians of per-round ratios, the targets, and the JSON file;
* `markdown`: the markdown report;
* `chart`: the grouped bar chart (matplotlib).

`chaos.py`, the chaos run:

* `chaos.lua`: wrk's per-key requests and one record per answer;
* `faults`: the faults injected into Redis;
* `cluster`: a Redis Cluster with replicas, and its failover;
* `verdict`: a row's numbers from the records, and what they show;
* `chaosreport`: its markdown table and JSON.

`redis-limit.py`, the physical limit of the allowed path with Redis:

* `resp`: RESP encoding and parsing, the control connection, `INFO`;
* `msgpack`: decoding the packed replies of the Lua designs;
* `designs`: the designs measured: their scripts, calls and reply checks;
* `drive`: driving Redis with a design, deep pipeline and depth 1, and one
  design's runs;
* `checks`: every reply of a deep run, `INFO commandstats`, the keyspace;
* `plain`: plain axum's CPU per request under wrk (C_plain);
* `bound`: medians, the bound, the machine, its markdown and JSON.

`load.py`, `chaos.py` and `redis-limit.py` write their reports under
`benches/results/` by default; `ab.py` and `flood.py` print theirs.
"""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benches", "results")

# The decisions every redis-limit.py design makes.
KEYS = 100_000  # counters, as the load benchmark's `allowed, 100k keys`
LIMIT = 1_000_000_000  # a quota no run reaches: every decision allowed
WINDOW_MS = 3_600_000
WINDOW_S = WINDOW_MS // 1000
