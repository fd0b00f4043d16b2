#!/usr/bin/env python3
"""Speed of one step's kernels in two bench runs (fa_bench CSVs), shape by shape:
new/old TFLOP/s, summarised per direction and head dimension. For "did this change
keep the speed": both runs' peers moved too, so the claim against FlashAttention-2
stays the same-run ratio in the note's tables; this is the kernel against itself.

  python3 tools/bench/compare_runs.py OLD.csv NEW.csv [--step 06]
"""
import argparse
import csv
import statistics


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--step", default="06")
    a = ap.parse_args()

    def rows(path):
        return {(r["dir"], r["d"], r["causal"], r["N"]): float(r["tflops"])
                for r in csv.DictReader(open(path)) if r["step"] == a.step and r["status"] == "ok"}

    old, new = rows(a.old), rows(a.new)
    print("| direction | d | shapes | new/old: min | median | max |")
    print("|---|---|---|---|---|---|")
    for direction in ("fwd", "bwd"):
        for d in sorted({k[1] for k in new if k[0] == direction}, key=int):
            r = [new[k] / old[k] for k in new if k[0] == direction and k[1] == d and k in old]
            if r:
                print(f"| {direction} | {d} | {len(r)} | {min(r):.3f} | {statistics.median(r):.3f} | {max(r):.3f} |")


if __name__ == "__main__":
    main()
