#!/usr/bin/env python3
"""The `profile` step of scripts/gpu_check.sh: nsys's summaries of 20 bf16 GPT-2 small steps as
lines for the check's summary. The first line is the result (PASS or FAIL ...).

    gpu_profile_summary.py <logs>

<logs> holds profile.out (the run's stdout: "step k/N ... tok/s X" lines, the mean since the
start) and the CSVs that `nsys stats --format csv --output <logs>/profile` wrote for the reports
cuda_gpu_kern_sum, cuda_api_sum and cuda_gpu_mem_time_sum."""
import csv
import glob
import os
import re
import sys


def table(logs, report):
    files = sorted(glob.glob(os.path.join(logs, f"profile*{report}*.csv")))
    if not files:
        return []
    with open(files[0], newline="") as f:
        return list(csv.DictReader(f))


def ns(row):
    return float(row.get("Total Time (ns)") or 0)


def main(logs):
    kern, api, mem = (table(logs, r) for r in ("cuda_gpu_kern_sum", "cuda_api_sum", "cuda_gpu_mem_time_sum"))
    if not kern:
        print("FAIL nsys stats wrote no kernel summary (profile.stats.log)")
        return
    busy = (sum(map(ns, kern)) + sum(map(ns, mem))) / 1e6
    wall, tokens = None, 16 * 1024
    with open(os.path.join(logs, "profile.out")) as f:
        for line in f:
            m = re.match(r"step (\d+)/\d+ .* tok/s (\d+)", line)
            if m and int(m.group(2)) > 0:
                wall = int(m.group(1)) * tokens / int(m.group(2)) * 1e3
    launches = sum(int(r.get("Instances") or 0) for r in kern)
    share = f" ({busy / wall:.0%} of the {wall:.0f} ms the 20 steps took)" if wall else ""
    print(f"PASS 20 bf16 steps, warm-up included: kernels and copies busy {busy:.0f} ms{share}; "
          f"{launches} kernel launches ({launches / 20:.0f} a step)")
    print("  top kernels (share of kernel time, total ms, launches, name):")
    for r in kern[:20]:
        print(f"    {float(r['Time (%)']):5.1f}% {ns(r) / 1e6:9.1f} {int(r['Instances']):7d}  {r['Name'][:110]}")
    print("  CUDA API calls (share, total ms, calls, name):")
    for r in api[:10]:
        print(f"    {float(r['Time (%)']):5.1f}% {ns(r) / 1e6:9.1f} {int(r['Num Calls']):7d}  {r['Name']}")
    print("  copies and sets (share, total ms, count, operation):")
    for r in mem[:6]:
        print(f"    {float(r['Time (%)']):5.1f}% {ns(r) / 1e6:9.1f} {int(r['Count']):7d}  {r['Operation']}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: gpu_profile_summary.py <logs>")
    try:
        main(sys.argv[1])
    except Exception as e:  # one FAIL line, never a traceback alone
        print(f"FAIL python: {type(e).__name__}: {e}")
