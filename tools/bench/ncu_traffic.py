#!/usr/bin/env python3
"""Measured DRAM traffic of each step, beside its CPU model's count.

  python3 tools/bench/ncu_traffic.py --bench build/tools/bench/fa_bench --csv traffic.csv

For each step and N, runs `fa_bench --once` (one untimed launch of the step, no
L2 flush) under Nsight Compute, sums dram__bytes_read.sum + dram__bytes_write.sum
over the step's kernels, and writes them beside the note's formula (which the
CPU model's count equals). ncu runs with --clock-control none (leave clocks alone).
"""
import argparse
import csv
import io
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--csv", default="traffic.csv")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--N", default="1024,2048,4096")
    ap.add_argument("--d", default="64")
    ap.add_argument("--tokens", default="65536")
    a = ap.parse_args()
    jobs = [("01", "fwd"), ("02", "fwd"), ("03", "fwd"), ("04", "fwd"), ("01", "bwd"), ("05", "bwd")]
    out = open(a.csv, "w")
    out.write("step,dir,B,H,N,d,causal,formula_bytes,dram_read_bytes,dram_write_bytes,measured_over_formula\n")
    for step, direction in jobs:
        for N in a.N.split(","):
            cmd = [a.ncu, "--clock-control", "none", "--metrics", "dram__bytes_read.sum,dram__bytes_write.sum",
                   "--csv", "--print-units", "base", a.bench, "--once", "--steps", step, "--dir", direction,
                   "--N", N, "--d", a.d, "--causal", "0", "--tokens", a.tokens]
            r = subprocess.run(cmd, capture_output=True, text=True)
            lines = r.stdout.splitlines()
            once = [l for l in lines if l.startswith("once ")]
            table = [l for l in lines if l.startswith('"')]
            if r.returncode != 0 or not once or not table:
                print(f"step {step} {direction} N={N}: ncu failed (rc {r.returncode})\n{r.stderr[-2000:]}", file=sys.stderr)
                continue
            info = dict(kv.split("=") for kv in once[0].split()[1:])
            rd = wr = 0.0
            for row in csv.DictReader(io.StringIO("\n".join(table))):
                v = float(row["Metric Value"].replace(",", ""))
                if row["Metric Name"] == "dram__bytes_read.sum":
                    rd += v
                elif row["Metric Name"] == "dram__bytes_write.sum":
                    wr += v
            formula = int(info["formula_bytes"])
            out.write(f"{step},{direction},{info['B']},{info['H']},{N},{a.d},0,{formula},{rd:.0f},{wr:.0f},"
                      f"{(rd + wr) / formula:.3f}\n")
            out.flush()
            print(f"step {step} {direction} N={N}: formula {formula/1e6:.1f} MB, DRAM {(rd+wr)/1e6:.1f} MB", file=sys.stderr)


if __name__ == "__main__":
    main()
