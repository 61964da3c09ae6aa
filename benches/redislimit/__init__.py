"""The parts of `benches/redis-limit.py`, the command that runs them.

* `resp`: RESP encoding and parsing, the control connection, `INFO`;
* `msgpack`: decoding the packed replies of the Lua designs;
* `designs`: the designs measured: their scripts, calls and reply checks;
* `drive`: driving Redis with a design, deep pipeline and depth 1, and one
  design's runs;
* `checks`: every reply of a deep run, `INFO commandstats`, the keyspace;
* `procs`: redis-server, ports, CPU times from /proc and getrusage;
* `plain`: plain axum's CPU per request under wrk (C_plain);
* `report`: medians, the bound, the machine, the markdown and the JSON.

The constants below are the decisions every design makes.
"""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KEYS = 100_000  # counters, as the load benchmark's `allowed, 100k keys`
LIMIT = 1_000_000_000  # a quota no run reaches: every decision allowed
WINDOW_MS = 3_600_000
WINDOW_S = WINDOW_MS // 1000
