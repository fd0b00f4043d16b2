#!/usr/bin/env python3
"""Step 07's forward (or backward) beside cuDNN, FlashAttention-2 and step 06, from one device run.

  python3 tools/bench/compare07.py notes/results/h200 [--dir bwd] [--markdown]

Reads ab07.csv (ab.py: every implementation in one process, in turns; the median of
its rounds) — ab07bwd.csv for the backward — where the folder has it; else
bench07_t<tokens>.csv (fa_bench: steps 06, 07) and peers07_t<tokens>.csv
(peers.py: torch-flash, torch-cudnn) for every B·H·N = tokens measured — for the
backward bench07bwd_t<tokens>.csv and peers07bwd_t<tokens>.csv — and prints
TFLOP/s per shape and the ratios step07/cuDNN and step07/FA-2 — every one of them,
the ones below 1.0 included — with their range per (tokens, d, causal).
"""
import csv
import glob
import os
import re
import statistics
import sys


def load(path):
    with open(path) as f:
        return [r for r in csv.DictReader(f) if r.get("status") == "ok"]


WHO = {"06": "step06", "07": "step07"}


def ab_rounds(path):
    """{(tokens, d, causal, N): {who: [TFLOP/s of each round]}} from one ab.py CSV (ab07.csv, ab07bwd.csv)."""
    rows = {}
    for r in load(path):
        who = WHO.get(r["step"]) if r["impl"] == "fa" else r["impl"].replace("torch-", "")
        if who:
            key = (int(r["H"]) * int(r["N"]), int(r["d"]), int(r["causal"]), int(r["N"]))
            rows.setdefault(key, {}).setdefault(who, []).append(float(r["tflops"]))
    return rows


def table(folder, direction):
    """{(tokens, d, causal, N): {who: TFLOP/s}}: from ab07[bwd].csv (ab.py, one process: the median of its
    rounds) where the folder has one (or from `folder` itself, an ab.py CSV of another name), else from
    fa_bench's and peers.py's CSVs of one device run."""
    tag = "07" if direction == "fwd" else "07bwd"
    ab = folder if folder.endswith(".csv") else os.path.join(folder, f"ab{tag}.csv")
    if os.path.exists(ab):
        return {k: {w: statistics.median(x) for w, x in r.items()} for k, r in ab_rounds(ab).items()}
    rows = {}
    for bench in sorted(glob.glob(os.path.join(folder, f"bench{tag}_t*.csv"))):
        tokens = int(re.search(r"_t(\d+)\.csv$", bench).group(1))
        peers = bench.replace(f"bench{tag}_", f"peers{tag}_")
        for r in load(bench) + (load(peers) if os.path.exists(peers) else []):
            if r["dir"] != direction or r["dtype"] != "bf16":
                continue
            who = WHO.get(r["step"]) if r["impl"] == "fa" else r["impl"].replace("torch-", "")
            key = (tokens, int(r["d"]), int(r["causal"]), int(r["N"]))
            rows.setdefault(key, {})[who] = float(r["tflops"])
    return rows


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else "notes/results/h200"
    md = "--markdown" in sys.argv
    direction = sys.argv[sys.argv.index("--dir") + 1] if "--dir" in sys.argv else "fwd"
    rows = table(folder, direction)
    if not rows:
        sys.exit(f"compare07: no {direction} rows in the bench07*_t*.csv of {folder}")
    cols = ["step07", "cudnn", "flash", "step06"]
    if md:
        print("| B·H·N | d | causal | N | step 07 | cuDNN | FA-2 | step 06 | 07/cuDNN | 07/FA-2 |")
        print("|---|---|---|---|---|---|---|---|---|---|")
    else:
        print(f"{'B·H·N':>7} {'d':>4} {'causal':>6} {'N':>6} " + " ".join(f"{c:>7}" for c in cols) + "  07/cuDNN  07/FA-2")
    ranges = {}
    for key in sorted(rows):
        tokens, d, causal, N = key
        r = rows[key]
        if "step07" not in r:
            continue
        rc = r["step07"] / r["cudnn"] if "cudnn" in r else None
        rf = r["step07"] / r["flash"] if "flash" in r else None
        ranges.setdefault((tokens, d, causal), []).append((rc, rf))
        vals = [f"{r[c]:.0f}" if c in r else "—" for c in cols]
        ratio = [f"{x:.2f}" if x is not None else "—" for x in (rc, rf)]
        if md:
            print(f"| {tokens} | {d} | {'yes' if causal else 'no'} | {N} | " + " | ".join(vals) + " | " + " | ".join(ratio) + " |")
        else:
            print(f"{tokens:>7} {d:>4} {causal:>6} {N:>6} " + " ".join(f"{v:>7}" for v in vals) + f"  {ratio[0]:>8} {ratio[1]:>8}")
    print()
    for (tokens, d, causal), rs in sorted(ranges.items()):
        c = [x for x, _ in rs if x is not None]
        f = [y for _, y in rs if y is not None]
        line = f"B·H·N = {tokens}, d = {d}, {'causal' if causal else 'not causal'}:"
        if c:
            line += f" step07/cuDNN {min(c):.2f}–{max(c):.2f} ({sum(x >= 1 for x in c)}/{len(c)} ≥ 1)"
        if f:
            line += f", step07/FA-2 {min(f):.2f}–{max(f):.2f} ({sum(y >= 1 for y in f)}/{len(f)} ≥ 1)"
        print(("- " if md else "") + line)


if __name__ == "__main__":
    main()
