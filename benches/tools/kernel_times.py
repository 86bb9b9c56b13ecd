#!/usr/bin/env python3
"""Device time per kernel of a profiled range, from Nsight Compute.

Input: the raw page of an ncu report as CSV, e.g.

    ncu --profile-from-start off --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum -o step ./benches/model_gpu --bench
    ncu -i step.ncu-rep --page raw --csv --metrics gpu__time_duration.sum > step.csv
    benches/tools/kernel_times.py step.csv [--json out.json] [--top 30]

(`DEEPINFER_BENCH_PROFILE=1` makes the model bench run one decode step as
the profiled range.) ncu runs the kernels one at a time, so their sum is
the device's busy time for the range without the host's launch gaps: the
floor an eager or graph-replayed step approaches. Prints the total and the
kernels by total time (count, total us, mean us, share); --json writes the
same as a record list.
"""

import argparse
import csv
import json
import sys
from collections import defaultdict

UNIT_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
           "second": 1e6, "s": 1e6}


def read(path):
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    # Lines before the header (ncu's own messages) are skipped.
    start = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    header = rows[start]
    name_col = header.index("Kernel Name")
    time_col = header.index("gpu__time_duration.sum")
    body = rows[start + 1:]
    scale = 1e-3  # ncu's default unit for durations is nanoseconds
    if body and body[0][time_col] in UNIT_US:
        scale = UNIT_US[body[0][time_col]]
        body = body[1:]
    out = []
    for r in body:
        value = r[time_col].replace(",", "")
        try:
            out.append((r[name_col], float(value) * scale))
        except ValueError:
            continue
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--json")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    launches = read(a.csv)
    if not launches:
        sys.exit("no kernel durations in " + a.csv)
    by = defaultdict(lambda: [0, 0.0])
    for name, us in launches:
        by[name][0] += 1
        by[name][1] += us
    total = sum(us for _, us in launches)
    ranked = sorted(by.items(), key=lambda kv: -kv[1][1])
    print(f"{len(launches)} launches of {len(by)} kernels, {total:.1f} us of device time")
    print(f"{'kernel':<72} {'count':>6} {'total us':>10} {'mean us':>9} {'share':>6}")
    for name, (n, us) in ranked[: a.top]:
        print(f"{name[:72]:<72} {n:>6} {us:>10.1f} {us / n:>9.2f} {100 * us / total:>5.1f}%")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"launches": len(launches), "total_us": total,
                       "kernels": [{"kernel": k, "count": n, "total_us": us, "mean_us": us / n}
                                   for k, (n, us) in ranked]}, f, indent=1)


if __name__ == "__main__":
    main()
