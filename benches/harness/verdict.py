"""One chaos row from wrk's records (chaos.lua): admissions over the limit,
the answers by kind, the largest latency, the recovery, and what is wrong.

Every answer is one of:

* store-decided: a 200 or 429 carrying the `RateLimit` header. The layer
  writes it on every decision the store made, and never on a fallback;
* fail-open: a 200 without it, the `OnStoreError::Allow` answer to a store
  error;
* 503: the `OnStoreError::Deny` answer to a store error;
* another 5xx (500, ...): never a policy answer, our own failure;
* anything else (e.g. a 429 without the header): counted under `other`,
  never a policy answer either.

A 503 under Allow, any `other` answer and a largest latency past
LATENCY_BOUND_MS are defects under either policy's rows, as a 5xx is.

Over the limit, per key k with limit L: `store over` = max(0, store-decided
200s - L) is never a policy: the store admitted past the limit (a counter
lost or reset, a decision counted twice). `fail-open over` = max(0, all
200s - L) - store over: the fail-open 200s past the limit. Under Allow these
are the policy during an outage; under Deny every fail-open 200 is a defect.

The recovery: from the fault's end (for a killed cluster master, from the
kill) to the answer of the first request *sent* after it that the store
decided; for the cluster, among the keys the killed master held. A request
sent before the end cannot count, even if its answer came after.

Notes, not defects for `--check`: `fallbacks after` counts fail-open 200s
and 503s to requests sent after that first store decision (a recovery that
does not hold); for the cluster, `fallbacks elsewhere` counts those on keys
whose master was never killed.
"""

import glob
import os

# A recovery slower than this, or none, fails `--check`.
RECOVERY_BOUND_S = 5.0
# The limiter's store timeout: its default, which the example servers keep
# (examples/support/mod.rs sets none). docs/reliability.md: a frozen or
# paused Redis "should show about 200 ms, not more".
STORE_TIMEOUT_MS = 200
# A largest latency past this fails `--check`: twice the timeout (a request
# that finds 4,096 held for Redis may first wait out one of theirs:
# docs/reliability.md) plus 100 ms for wrk and the scheduler on a loaded
# 2-core VM. Generous: it catches a wait the timeout does not bound, not a
# slow tail.
LATENCY_BOUND_MS = 2 * STORE_TIMEOUT_MS + 100


def read(directory):
    """Every record of a run: (answered, latency, status, store, key), times
    in seconds (time.monotonic())."""
    events = []
    for path in sorted(glob.glob(os.path.join(directory, "thread-*.events"))):
        with open(path) as f:
            for line in f:
                t, lat, status, store, key = line.split()
                events.append((float(t) / 1000, float(lat) / 1000, int(status),
                               store == "1", int(key)))
    events.sort()
    return events


def tally(events, limit, keys, policy, times, recovery_keys=None):
    """The row's numbers. `times`: monotonic seconds of "start" (fault in
    place), "end" (fault over) and "from" (where the recovery is measured
    from). `recovery_keys`: the keys the recovery is measured on (None:
    all)."""
    admitted = [0] * keys
    by_store = [0] * keys
    count = {"store_200": 0, "store_429": 0, "fail_open_200": 0, "503": 0, "5xx": 0,
             "other": 0}
    exhausted_before = set()
    pre_store = 0
    for t, lat, status, store, key in events:
        if status == 200:
            admitted[key] += 1
            if store:
                by_store[key] += 1
                count["store_200"] += 1
            else:
                count["fail_open_200"] += 1
        elif status == 429 and store:
            count["store_429"] += 1
        elif status == 503:
            count["503"] += 1
        elif status >= 500:
            count["5xx"] += 1
        else:
            count["other"] += 1
        if t < times["start"]:
            pre_store += store
            if status == 429 and store:
                exhausted_before.add(key)
    store_over = sum(max(0, n - limit) for n in by_store)
    fail_open_over = sum(max(0, n - limit) for n in admitted) - store_over

    start = times["from"]
    watched = set(range(keys)) if recovery_keys is None else set(recovery_keys)
    first = next((t for t, lat, _, store, key in events
                  if store and key in watched and t - lat >= start), None)
    recovery = None if first is None else first - start
    fallbacks_after = 0 if first is None else sum(
        1 for t, lat, status, store, _ in events
        if t - lat >= first and not store and status in (200, 503))
    # For the cluster: fallbacks on keys whose master was never killed.
    collateral = None if recovery_keys is None else sum(
        1 for _, _, status, store, key in events
        if key not in watched and not store and status in (200, 503))
    last = events[-1][0] if events else start
    row = {
        "requests": len(events),
        **count,
        "store_over": store_over,
        "fail_open_over": fail_open_over,
        "max_latency_ms": max((lat for _, lat, *_ in events), default=0.0) * 1000,
        "recovery_ms": None if recovery is None else recovery * 1000,
        "watched_after_s": last - start,
        "fallbacks_after": fallbacks_after,
        "fallbacks_elsewhere": collateral,
        "store_decided_before": pre_store,
        "exhausted_before": len(exhausted_before),
    }
    row["problems"] = problems(row, policy)
    row["notes"] = notes(row)
    row["invalid"] = invalid(row, keys, recovery_keys)
    return row


def problems(row, policy):
    """The product's defects this row shows, those `--check` fails on: an
    admission past the limit that no policy explains, a 503 under Allow (it
    is only Deny's answer), a 5xx other than 503, an answer of no kind
    (`other`), a largest latency past LATENCY_BOUND_MS, no recovery within
    RECOVERY_BOUND_S. The policy's answers are not defects."""
    out = []
    if row["store_over"]:
        out.append(f"{row['store_over']} store-decided admissions over the limit")
    if policy == "deny" and row["fail_open_200"]:
        out.append(f"{row['fail_open_200']} admissions without a decision under Deny "
                   f"({row['fail_open_over']} over the limit)")
    if policy == "allow" and row["503"]:
        out.append(f"{row['503']} 503s under Allow (only Deny answers 503)")
    if row["5xx"]:
        out.append(f"{row['5xx']} 5xx other than 503")
    if row["other"]:
        out.append(f"{row['other']} answers neither decided nor a policy's "
                   "(e.g. a 429 without RateLimit)")
    if row["max_latency_ms"] > LATENCY_BOUND_MS:
        out.append(f"max latency {row['max_latency_ms']:.0f} ms, over {LATENCY_BOUND_MS} ms "
                   f"(store timeout {STORE_TIMEOUT_MS} ms)")
    if row["recovery_ms"] is None:
        out.append(f"no recovery within {row['watched_after_s']:.1f} s")
    elif row["recovery_ms"] > RECOVERY_BOUND_S * 1000:
        out.append(f"recovery {row['recovery_ms'] / 1000:.1f} s, over {RECOVERY_BOUND_S:g} s")
    return out


def notes(row):
    """What the row shows that `--check` does not fail on, but a reader
    should see: a recovery that did not hold, and (cluster) fallbacks on
    keys whose master never failed."""
    out = []
    if row["fallbacks_after"]:
        out.append(f"{row['fallbacks_after']} fallbacks after the recovery")
    if row["fallbacks_elsewhere"]:
        out.append(f"{row['fallbacks_elsewhere']} fallbacks on keys of live masters")
    return out


def invalid(row, keys, recovery_keys):
    """Why the run cannot measure what it claims, or None: the harness's
    fault, not the product's."""
    if not row["store_decided_before"]:
        return "no store decision before the fault"
    if row["exhausted_before"] < keys:
        return (f"only {row['exhausted_before']} of {keys} keys denied before the fault: "
                "the load did not exhaust them in time")
    if recovery_keys is not None and not recovery_keys:
        return "no key found on the killed master"
    return None
