#!/usr/bin/env python3
"""What held the controller's reconcile slots while upgrades ran, from its debug log.

Reads a plain-format log written with `--log-level
warn,rayshift::pass=debug,rayshift::pacing=debug,kube_runtime::controller=info` (the scale test writes one with
RAYSHIFT_SCALE_LOG set so and RAYSHIFT_TEST_CONTROLLER_LOG_FILE naming the file) and prints, over the upgrade
phase (3 s before the first traffic step to the last one):
- passes, their total length (slot-seconds) and how busy the `--concurrency` slots were on average;
- the same per trigger, the passes that wrote a traffic step apart;
- how late requeued passes started after the instant they asked for (waiting for a slot);
- each step written over 100 ms after its due instant (the previous step + INTERVAL), with the pass that wrote
  it and the wake-up the RayService's pass before it asked for: a wake asked for the due instant itself had no
  lead; one asked for before the lead whose pass started later waited for a slot.

Usage: benchmarks/passes.py LOG [CONCURRENCY] [INTERVAL_SECONDS]
"""

import collections
import re
import sys
from datetime import datetime

PASS = re.compile(
    r"object\.ref=RayService\.v1\.ray\.io/(\S+) object\.reason=([^}]*)\}.*pass ended "
    r"started=(\S+) ms=(\d+)(?: queued_ms=\d+)? next=(.*)"
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
    interval = float(sys.argv[3]) if len(sys.argv) > 3 else 2.0
    late_steps(steps, by_name, interval)


def late_steps(steps, by_name, interval):
    """Each step written over 100 ms after it was due, and why its pass came when it did."""
    by_rs = collections.defaultdict(list)
    for name, t in steps:
        by_rs[name].append(t)
    causes = collections.Counter()
    rows = []
    for name, times in by_rs.items():
        runs = by_name.get(name, [])
        times.sort()
        for t0, t1 in zip(times, times[1:]):
            due = t0 + interval
            if t1 - due <= 0.1:
                continue
            writer = next((p for p in runs if p[2] <= t1 <= p[3] + 0.001), None)
            before = [p for p in runs if writer and p[3] <= writer[2] + 0.001 and p is not writer]
            asked = before[-1][3] + before[-1][4] if before and before[-1][4] is not None else None
            if writer is None:
                cause = "no pass found"
            elif asked is not None and abs(asked - due) < 0.03:
                cause = "woken at the due instant (no lead)"
            elif asked is not None and asked < due and writer[2] - asked > 0.05:
                cause = "waited for a slot"
            else:
                cause = "slow pass"
            causes[cause] += 1
            rows.append((t1 - due, name, cause, writer, due, asked))
    print(f"steps over 100 ms late: {len(rows)}", dict(causes))
    for late, name, cause, writer, due, asked in sorted(rows, reverse=True)[:20]:
        start = f"{1000 * (writer[2] - due):+.0f}" if writer else "?"
        length = f"{1000 * (writer[3] - writer[2]):.0f}" if writer else "?"
        wake = f"{1000 * (asked - due):+.0f}" if asked is not None else "?"
        trigger = writer[1] if writer else "?"
        print(f"  {name:40} {1000 * late:5.0f} ms late: {cause}; pass started {start} ms from due, "
              f"{length} ms long, woken by {trigger}; the pass before asked for {wake} ms")


if __name__ == "__main__":
    main()
