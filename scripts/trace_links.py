#!/usr/bin/env python3
"""trace_links.py - the links of a decode step's kernel chain from a CU_TRACE=1 build's dump.

A trace build (make build CU_TRACE=1 BUILD=build-trace) run with MS_CU_TRACE_OUT=FILE writes, for every
launch, when its first block started and when that block's griddepcontrol.wait returned (the kernel before
it had completed), and its shape; plus the kernels' names by shape (src/backend/cuda/trace.cu). Here the
trace's launch shapes are searched for the sequence that repeats longest (the decode step: warm-up, prefill
and the benchmark's other work differ), each step starting at a kernel whose name contains --first (k_embed),
and for each position of its last --periods steps:
  link  = the next launch's wait return - this launch's (what this kernel adds to the chain, its own work
          after its wait plus its completion; the step's last link also holds the host's turn between
          steps), median over the steps;
  lead  = this launch's wait return - its first block's start (how long it sat launched early, under PDL).
Then the same summed by kernel and grid a step. Usage: trace_links.py FILE [--first embed] [--periods 4]
"""
import argparse
import collections
import re
import shutil
import statistics
import subprocess
import sys


def demangle(names):
    if shutil.which("c++filt"):
        try:
            out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
            dem = out.split("\n")[: len(names)]
            if len(dem) == len(names):
                return [re.sub(r"\(.*\)$", "", d) for d in dem]
        except (OSError, subprocess.SubprocessError):
            pass
    res = []
    for n in names:
        m = re.match(r"_Z(\d+)(\w+)", n)
        res.append(m.group(2)[: int(m.group(1))] if m else n)
    return res


def load(path):
    recs, kern = [], {}
    with open(path) as f:
        for line in f:
            p = line.split()
            if not p or p[0].startswith("#"):
                continue
            if p[0] == "R" and len(p) == 8:
                recs.append((int(p[1]), int(p[2]), int(p[3]), tuple(int(x) for x in p[4:8])))
            elif p[0] == "K" and len(p) == 6:
                kern.setdefault(tuple(int(x) for x in p[2:6]), []).append(p[1])
    recs.sort(key=lambda r: r[2])  # chain order: each wait returns after the kernel before completed
    raw = sorted({n for v in kern.values() for n in v})
    dem = dict(zip(raw, demangle(raw)))
    names = {sig: "|".join(sorted({dem[n] for n in v})) for sig, v in kern.items()}
    return recs, names


def steps_of(recs, names, first, periods):
    """The decode step as the launch-shape sequence that repeats longest: for each candidate period p, the
    longest run of launches i with shape(i) == shape(i + p); the p with the longest run (the smallest on
    ties; a layer's period repeats only within a step, a step's across the whole timed loop). Names cannot cut steps: kernels
    of one shape may have several names (k_embed and k_copy_rows at one token). Returns the last `periods`
    whole steps of that run, each starting at its first launch named like `first` where there is one."""
    ids = {}
    a = [ids.setdefault(r[3], len(ids)) for r in recs]
    n, best = len(a), (0, 0, 0)  # (run length, -p, end of run)
    # candidate periods: distances between launches of the --first kernel's shape, 1 to 4 apart (a step
    # holds that shape at most a few times), the most common ones
    at = [i for i, r in enumerate(recs) if first in names.get(r[3], "?")]
    cand = collections.Counter(at[j + k] - at[j] for k in range(1, 5) for j in range(len(at) - k))
    for p, _ in cand.most_common(24):
        run = 0
        for i in range(n - p):
            run = run + 1 if a[i] == a[i + p] else 0
            if run > best[0] or (run == best[0] and -p > best[1]):
                best = (run, -p, i + 1)
    run, p, end = best[0], -best[1], best[2]
    if run < p:
        return []
    lo, hi = end - run, end + p  # launches lo .. hi - 1 repeat with period p
    last = hi - 1 - p  # the last step must have a next launch
    cand = [j for j in range(last - p + 1, last + 1) if first in names.get(recs[j][3], "?") and j >= lo]
    s0 = cand[0] if cand else last - p + 1
    starts = [s for s in range(s0, lo - 1, -p)][:periods]
    return [range(s, s + p) for s in reversed(starts) if s >= lo and s + p < len(recs)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--first", default="embed", help="a step starts at a kernel whose name contains this")
    ap.add_argument("--periods", type=int, default=4, help="steps (the last ones) to take the medians over")
    a = ap.parse_args()
    recs, names = load(a.file)
    if len(recs) < 2:
        sys.exit("trace_links: fewer than two launches recorded in %s" % a.file)
    steps = steps_of(recs, names, a.first, a.periods)
    if not steps:
        sys.exit("trace_links: no launch sequence from a '%s' kernel to the next repeats in %s" % (a.first, a.file))
    p = len(steps[0])
    sigs = [r[3] for r in recs]
    rows, by_name = [], {}
    for j in range(p):
        link = [(recs[s[j] + 1][2] - recs[s[j]][2]) / 1e3 for s in steps]
        lead = [(recs[s[j]][2] - recs[s[j]][1]) / 1e3 for s in steps]
        sig = sigs[steps[0][j]]
        nm = names.get(sig, "?")
        rows.append((j, nm, sig, statistics.median(link), statistics.median(lead)))
        t = by_name.setdefault("%s %dx%dx%d" % ((nm[:32],) + sig[:3]), [0, 0.0])
        t[0] += 1
        t[1] += statistics.median(link)
    total = sum(r[3] for r in rows)
    print("# %d launches a step, medians over %d steps; step %.1f us (sum of the links)" % (p, len(steps), total))
    print("%5s  %-44s %-22s %9s %9s" % ("pos", "kernel", "grid x threads", "link us", "lead us"))
    for j, nm, sig, lk, ld in rows:
        print("%5d  %-44s %-22s %9.2f %9.2f" % (j, nm[:44], "%dx%dx%d x%d" % sig, lk, ld))
    print("\n# by kernel and grid, a step")
    print("%-44s %6s %10s %8s" % ("kernel", "count", "link us", "share"))
    for nm, (c, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
        print("%-44s %6d %10.1f %7.1f%%" % (nm[:44], c, t, 100 * t / total if total else 0))


if __name__ == "__main__":
    main()
