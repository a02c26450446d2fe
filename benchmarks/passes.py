#!/usr/bin/env python3
"""What held the controller's reconcile slots while upgrades ran, from its debug log.

Reads a plain-format log written with `--log-level
warn,rayshift::pass=debug,rayshift::pacing=debug,kube_runtime::controller=info` (the scale test writes one with
RAYSHIFT_SCALE_LOG set so and RAYSHIFT_TEST_CONTROLLER_LOG_FILE naming the file) and prints, over the upgrade
phase (3 s before the first traffic step to the last one):
- passes, their total length (slot-seconds) and how busy the `--concurrency` slots were on average;
- the same per trigger, the passes that wrote a traffic step apart;
- how late requeued passes started after the instant they asked for (waiting for a slot).

Usage: benchmarks/passes.py LOG [CONCURRENCY]
"""

import collections
import re
import sys
from datetime import datetime

PASS = re.compile(
    r"object\.ref=RayService\.v1\.ray\.io/(\S+) object\.reason=([^}]*)\}.*pass ended "
    r"started=(\S+) ms=(\d+) next=(.*)"
)
STEP = re.compile(r"reconcile\{rayservice=(\S+) namespace=\S+\}.*traffic step written")
REQUEUE = re.compile(r"requeue_after: Some\(([\d.]+)(ns|µs|ms|s)\)")
UNIT = {"ns": 1e-9, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


def instant(text):
    """Seconds since the epoch of an RFC 3339 UTC timestamp (microseconds kept)."""
    text = text.rstrip("Z")
    if "." in text:
        whole, fraction = text.split(".")
        text = f"{whole}.{fraction[:6]}"
    return datetime.fromisoformat(text).timestamp()


def read(path):
    passes, steps = [], []
    for line in open(path, encoding="utf-8"):
        m = PASS.search(line)
        if m:
            name, reason, started, ms, after = m.groups()
            trigger = reason.split(":")[0]
            if trigger.startswith("related object updated"):
                trigger += " (" + reason.split(": ")[1].split(".")[0] + ")"
            requeue = REQUEUE.search(after)
            wake = float(requeue.group(1)) * UNIT[requeue.group(2)] if requeue else None
            start = instant(started)
            passes.append((name.rsplit(".", 1)[0], trigger, start, start + int(ms) / 1000, wake))
            continue
        m = STEP.search(line)
        if m:
            # The line's own time: the step's route was just written.
            steps.append((m.group(1), instant(line.split()[0])))
    return passes, steps


def main():
    passes, steps = read(sys.argv[1])
    slots = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    if not steps:
        sys.exit("no traffic step in the log (is rayshift::pacing=debug on?)")
    begin, end = min(t for _, t in steps) - 3, max(t for _, t in steps)
    phase = [p for p in passes if begin <= p[2] <= end]
    busy = sum(p[3] - p[2] for p in phase)
    print(f"upgrade phase {end - begin:.1f} s: {len(phase)} passes, {busy:.1f} slot-seconds, "
          f"slots {100 * busy / (slots * (end - begin)):.0f}% busy on average")
    stepped = {(name, t) for name, t in steps}
    by_trigger = collections.defaultdict(lambda: [0, 0.0])
    for name, trigger, start, stop, _ in phase:
        if any(n == name and start <= t <= stop for n, t in stepped):
            trigger += " [wrote a traffic step]"
        by_trigger[trigger][0] += 1
        by_trigger[trigger][1] += stop - start
    for trigger, (n, seconds) in sorted(by_trigger.items(), key=lambda kv: -kv[1][1]):
        print(f"  {trigger:55} {n:4} passes {seconds:6.1f} slot-s, mean {1000 * seconds / n:4.0f} ms")
    delays = []
    by_name = collections.defaultdict(list)
    for p in phase:
        by_name[p[0]].append(p)
    for runs in by_name.values():
        runs.sort(key=lambda p: p[2])
        for before, after in zip(runs, runs[1:]):
            if before[4] and before[4] > 0.2 and after[1] == "reconciler requested retry":
                delays.append(after[2] - (before[3] + before[4]))
    if delays:
        delays.sort()
        pick = lambda q: delays[min(len(delays) - 1, int(q * len(delays)))]
        print(f"requeued passes started late by: p50 {1000 * pick(0.5):.0f} ms, p90 {1000 * pick(0.9):.0f} ms, "
              f"max {1000 * delays[-1]:.0f} ms ({len(delays)} requeues of 200 ms or more)")


if __name__ == "__main__":
    main()
