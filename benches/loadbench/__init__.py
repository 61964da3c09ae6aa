"""The load benchmark's parts; `benches/load.py` is the command that runs them.

* `catalog`: the servers and workloads measured;
* `procs`: redis-server, building and starting the servers, warm-up requests;
* `wrk`: running wrk and reading its report (with `keys.lua` for per-request keys
  and for the paced runs' delay);
* `redisstats`: what Redis did per cell (`INFO commandstats`, `INFO cpu`);
* `exactness`: after each cell, admitted answers within the workload's bound and
  no Redis key without a TTL;
* `report`: medians of per-round ratios, the targets, and the JSON file;
* `markdown`: the markdown report;
* `chart`: the grouped bar chart (matplotlib).

`benches/chaos.py`, the chaos run, uses `procs` and `wrk` too, and its own parts:

* `chaos.lua`: wrk's per-key requests and one record per answer;
* `faults`: the faults injected into Redis;
* `cluster`: a Redis Cluster with replicas, and its failover;
* `verdict`: a row's numbers from the records, and what they show;
* `chaosreport`: its markdown table and JSON.
"""
