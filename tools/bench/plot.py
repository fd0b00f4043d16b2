#!/usr/bin/env python3
"""Plots from the bench CSVs: every step and peer on the same axes.

  python3 tools/bench/plot.py --dir notes/results/h200

Reads bench.csv (fa_bench), peers.csv (peers.py), traffic.csv (ncu_traffic.py)
and maxn.csv (fa_bench --max-n) from --dir; writes PNGs there:
  time_vs_n.png     forward and backward time vs N (d = 64, not causal)
  tflops_vs_n.png   TFLOP/s vs N, same runs
  hbm_vs_n.png      HBM bytes vs N, log-log: the notes' formulas and ncu's DRAM bytes
  memory_vs_n.png   peak extra device memory vs N
and, from claims*.csv (tools/bench/claims.sh):
  speedup_vs_n.png  speed-up over standard attention (PyTorch math, step 01) vs N
  claims_memory.png extra device memory vs N for one head, log-log
and, from --cpu-dir's traffic_vs_m.csv (flashattn traffic, no GPU needed):
  traffic_vs_m.png  steps 02-04's counted HBM traffic vs the on-chip budget M
"""
import argparse
import csv
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def label(r):
    return f"step {r['step']}" if r["impl"] == "fa" else f"{r['impl']} {r['dtype']}"


def series(data, d, causal, direction, key):
    out = {}
    for r in data:
        if r["status"] != "ok" or int(r["d"]) != d or int(r["causal"]) != causal or r["dir"] != direction:
            continue
        out.setdefault(label(r), []).append((int(r["N"]), float(r[key])))
    return {k: sorted(v) for k, v in out.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--cpu-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "notes", "results", "cpu"),
                    help="where flashattn traffic's CSV is (traffic_vs_m.png goes there)")
    a = ap.parse_args()
    traffic_vs_m(a.cpu_dir)
    data = rows(os.path.join(a.dir, "bench.csv")) + rows(os.path.join(a.dir, "peers.csv"))
    gpu = data[0]["gpu"] if data else "GPU"
    for key, fname, ylabel in [("ms", "time_vs_n.png", "time (ms, median)"),
                               ("tflops", "tflops_vs_n.png", "TFLOP/s (4·B·H·N²·d, ×2.5 backward)"),
                               ("scratch_bytes", "memory_vs_n.png", "peak extra device memory (bytes)")]:
        fig, axes = plt.subplots(1, 2, figsize=(13, 5))
        for ax, direction in zip(axes, ["fwd", "bwd"]):
            for name, pts in series(data, a.d, 0, direction, key).items():
                xs, ys = zip(*pts)
                if key == "scratch_bytes" and max(ys) == 0:
                    continue
                ax.plot(xs, ys, "o-" if name.startswith("step") else "s--", label=name)
            log_axes(ax, "N (B·H·N = 65536 rows)", ylabel,
                     f"{'forward' if direction == 'fwd' else 'backward'}, d = {a.d}, not causal")
        save(fig, a.dir, fname, gpu)

    claims(a.dir)

    traffic = rows(os.path.join(a.dir, "traffic.csv"))
    if traffic:
        fig, ax = plt.subplots(figsize=(7, 5))
        for step_dir in sorted({(r["step"], r["dir"]) for r in traffic}):
            pts = sorted((int(r["N"]), int(r["formula_bytes"]), float(r["dram_read_bytes"]) + float(r["dram_write_bytes"]))
                         for r in traffic if (r["step"], r["dir"]) == step_dir)
            xs = [p[0] for p in pts]
            line, = ax.plot(xs, [p[1] for p in pts], "o-", label=f"step {step_dir[0]} {step_dir[1]}: formula")
            ax.plot(xs, [p[2] for p in pts], "x:", color=line.get_color(), label=f"step {step_dir[0]} {step_dir[1]}: ncu DRAM")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("N (d = 64)")
        ax.set_ylabel("HBM bytes read + written")
        ax.set_title("HBM traffic: the notes' formulas (= CPU models) vs measured DRAM bytes")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(os.path.join(a.dir, "hbm_vs_n.png"), dpi=110)
        plt.close(fig)


def log_axes(ax, xlabel, ylabel, title):
    """Both axes logarithmic (N in powers of two), labels, grid and legend."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def save(fig, folder, name, title):
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(os.path.join(folder, name), dpi=110)
    plt.close(fig)


def traffic_vs_m(cpu_dir):
    """Steps 02-04's counted traffic against the on-chip budget M (flashattn traffic)."""
    data = [r for r in rows(os.path.join(cpu_dir, "traffic_vs_m.csv")) if r["causal"] == "0"]
    if not data:
        return
    fig, ax = plt.subplots(figsize=(7, 5))
    for step in ("02", "03", "04"):
        pts = sorted((int(r["M"]), int(r["model_read"]) + int(r["model_written"])) for r in data if r["step"] == step)
        ax.plot(*zip(*pts), "o-", label=f"step {step} (CPU model, counted)")
    pts = sorted({(int(r["M"]), float(r["n2d2_over_M"])) for r in data})
    ax.plot(*zip(*pts), "k--", label="N²d²/M")
    log_axes(ax, "on-chip budget M (elements)", "HBM elements read + written",
             f"Θ(N²d²/M): N = {data[0]['N']}, d = {data[0]['d']}, not causal")
    fig.tight_layout()
    fig.savefig(os.path.join(cpu_dir, "traffic_vs_m.png"), dpi=110)
    plt.close(fig)


def claims(folder):
    """The lecture's claims (tools/bench/claims.sh): speed-up over standard attention
    against N, and extra device memory against N on log scales."""
    ours = rows(os.path.join(folder, "claims.csv")) + rows(os.path.join(folder, "claims06.csv"))
    peers = rows(os.path.join(folder, "claims_peers.csv"))
    if not ours or not peers:
        return
    gpu = ours[0]["gpu"]

    def times(data, **kw):
        return {int(r["N"]): float(r["ms"]) for r in data
                if r["status"] == "ok" and all(r[k] == v for k, v in kw.items())}
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, direction, fused in zip(axes, ("fwd", "bwd"), ("03", "05")):
        m32 = times(peers, impl="torch-math", dtype="fp32", dir=direction)
        m16 = times(peers, impl="torch-math", dtype="bf16", dir=direction)
        s01 = times(ours, step="01", dir=direction)
        for name, t, base in ((f"step {fused} (fp32) over PyTorch math fp32", times(ours, step=fused, dir=direction), m32),
                              (f"step {fused} (fp32) over step 01", times(ours, step=fused, dir=direction), s01),
                              ("step 06 (bf16) over PyTorch math bf16", times(ours, step="06", dir=direction), m16)):
            xs = sorted(n for n in t if n in base)
            ax.plot(xs, [base[n] / t[n] for n in xs], "o-", label=name)
        ax.axhspan(2, 4, color="grey", alpha=0.15, label="the lecture's 2–4×")
        ax.axhline(1, color="black", lw=0.8)
        log_axes(ax, "N (B·H·N = 65536, d = 64, not causal)", "speed-up over standard attention (×)",
                 "forward" if direction == "fwd" else "backward")
    save(fig, folder, "speedup_vs_n.png", f"{gpu}: FlashAttention's speed-up over standard attention, one run")

    mem = (rows(os.path.join(folder, "claims_memory.csv")) + rows(os.path.join(folder, "claims_memory06.csv"))
           + rows(os.path.join(folder, "claims_memory_peers.csv")))
    if not mem:
        return
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, direction in zip(axes, ("fwd", "bwd")):
        for name, pts in sorted(series(mem, 64, 0, direction, "scratch_bytes").items()):
            pts = [(n, b) for n, b in pts if b > 0]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, "o-" if name.startswith("step") else "s--", label=name)
        log_axes(ax, "N (one head: B = H = 1, d = 64)", "extra device memory (bytes)",
                 ("forward" if direction == "fwd" else "backward") + ": N² against N")
    save(fig, folder, "claims_memory.png", f"{gpu}: extra memory beside the inputs and outputs")


if __name__ == "__main__":
    main()
