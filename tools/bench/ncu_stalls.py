#!/usr/bin/env python3
"""Where a kernel's warps wait, per SASS instruction, from Nsight Compute's source page.

Reads the CSV that `ncu --import REPORT --page source --print-source sass --csv` writes (one
section per profiled launch, each opening with a "Kernel Name" line; the report taken with
`--section SourceCounters`), keeps the first launch of each kernel whose name matches one of
the patterns given, and writes one small CSV: per kernel, its sampled stall reasons over all
instructions (rows with address "total"), then every instruction that holds at least
--min-share of the kernel's samples, its SASS text, how often it ran (warp-level, "executed"; the total row:
all instructions) and its samples by reason.

  python3 tools/bench/ncu_stalls.py src.csv --kernels dkdv_kernel,flash_bprop --out stalls.csv
"""
import argparse
import csv
import io
import sys


def sections(path):
    """(kernel name, rows as dicts) of every launch in a source-page CSV."""
    name, lines = None, []
    out = []
    for line in open(path, encoding="utf-8"):
        if line.startswith('"Kernel Name"'):
            if name is not None:
                out.append((name, list(csv.DictReader(io.StringIO("".join(lines))))))
            name, lines = next(csv.reader([line]))[1], []
        else:
            lines.append(line)
    if name is not None:
        out.append((name, list(csv.DictReader(io.StringIO("".join(lines))))))
    return out


def count(v):
    return int(v.replace(",", "")) if v and v not in ("-", "") else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source_csv")
    ap.add_argument("--kernels", required=True, help="comma-separated substrings of kernel names, in output order")
    ap.add_argument("--min-share", type=float, default=0.005, help="an instruction's least share of the samples kept")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ops", help="also write here, per kernel, how often each opcode ran (with its modifiers: "
                                  "LDGSTS.E.BYPASS.128), most first")
    a = ap.parse_args()
    launches = sections(a.source_csv)
    out, ops = [], []  # ops: (kernel, opcode, times it ran), most first per kernel
    for pattern in a.kernels.split(","):
        found = [(n, rows) for n, rows in launches if pattern in n]
        if not found:
            sys.exit(f"ncu_stalls: no launch of a kernel matching {pattern!r}")
        name, rows = found[0]
        reasons = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]
        total = sum(count(r["Warp Stall Sampling (All Samples)"]) for r in rows)
        sums = {k: sum(count(r[k]) for r in rows) for k in reasons}
        executed = sum(count(r["Instructions Executed"]) for r in rows)
        out.append({"kernel": pattern, "address": "total", "sass": name, "samples": total, "executed": executed, **sums})
        for r in rows:
            n = count(r["Warp Stall Sampling (All Samples)"])
            if n >= a.min_share * total:
                out.append({"kernel": pattern, "address": r["Address"][-5:], "sass": r["Source"].strip(), "samples": n,
                            "executed": count(r["Instructions Executed"]), **{k: count(r[k]) for k in reasons}})
        by_op = {}
        for r in rows:
            words = [x for x in r["Source"].split() if not x.startswith("@")]  # the opcode, past a predicate
            if words:
                by_op[words[0]] = by_op.get(words[0], 0) + count(r["Instructions Executed"])
        ops += [(pattern, op, n) for op, n in sorted(by_op.items(), key=lambda x: -x[1])]
    if a.ops:
        with open(a.ops, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["kernel", "opcode", "executed"])
            w.writerows(ops)
    keys = list(dict.fromkeys(k for row in out for k in row))
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, restval=0)
        w.writeheader()
        w.writerows(out)
    print(f"ncu_stalls: {len(out)} rows into {a.out}")


if __name__ == "__main__":
    main()
