#!/usr/bin/env python3
"""ncu_times.py - aggregates an Nsight Compute CSV of gpu__time_duration.sum (one row per kernel launch,
`ncu --metrics gpu__time_duration.sum --csv --log-file F`) for the GPU profiling scripts.

  ncu_times.py table CSV [BENCH_LOG]  kernels by total time (name, grid, block, count, mean us, total ms),
                                      with the unprofiled bench-model step time from BENCH_LOG if given
  ncu_times.py decode CSV             one line: per kernel, its most frequent grid (the decode launches)
                                      with the mean us and the launch count
"""
import collections
import csv
import re
import sys


def launches(path):
    """(kernel name without arguments, grid, block, microseconds) per profiled launch."""
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    out = []
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        us = v / 1000 if unit in ("nsecond", "ns") else v if unit in ("usecond", "us") else v * 1000
        name = re.sub(r"\(.*", "", r["Kernel Name"]).replace("void ", "")[:60]
        out.append((name, r.get("Grid Size", ""), r.get("Block Size", ""), us))
    return out


def aggregate(rows, key):
    agg = collections.OrderedDict()
    for row in rows:
        k = key(row)
        c, t = agg.get(k, (0, 0.0))
        agg[k] = (c + 1, t + row[3])
    return agg


def table(path, log=None):
    rows = launches(path)
    step = "?"
    if log:
        m = re.search(r"decode\s+batch\s+\d+ ctx\s+\d+:\s+([\d.]+) tok/s\s+([\d.]+) ms/step", open(log).read())
        step = m.group(2) if m else "?"
    agg = aggregate(rows, lambda r: (r[0], r[1], r[2]))
    tot = sum(t for c, t in agg.values())
    print("kernels profiled: %d, total %.1f ms; bench-model (unprofiled) step: %s ms" % (len(rows), tot / 1000, step))
    print("%-60s %-16s %-10s %6s %10s %9s" % ("kernel", "grid", "block", "count", "mean us", "total ms"))
    for (n, g, b), (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:70]:
        print("%-60s %-16s %-10s %6d %10.2f %9.2f" % (n, g, b, c, t / c, t / 1000))


def decode(path):
    best = {}
    for (n, g), (c, t) in aggregate(launches(path), lambda r: (r[0], r[1])).items():
        if n not in best or c > best[n][1]:
            best[n] = (g, c, t / c)
    print("; ".join("%s %s %.2f us (x%d)" % (n, g, m, c) for n, (g, c, m) in best.items()))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "table":
        table(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    elif len(sys.argv) == 3 and sys.argv[1] == "decode":
        decode(sys.argv[2])
    else:
        sys.exit(__doc__)
