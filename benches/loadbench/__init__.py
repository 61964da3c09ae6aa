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
"""
