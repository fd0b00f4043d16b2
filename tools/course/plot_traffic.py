#!/usr/bin/python3
"""HBM traffic of steps 01-04 against N and against the on-chip budget M, from their CPU
models (flashattn traffic): no GPU needed. Writes two PNGs for notes 02-04.

  /usr/bin/python3 tools/course/plot_traffic.py [--flashattn build-cpu/tools/flashattn/flashattn]
                                                [--out notes/figures]

traffic_vs_n.png: elements read + written at d = 64, M = 37800 (blocks 104 x 104) for 02-04,
    against N: step 01 grows as N^2 (S and P), 02-04 as N^2 d^2 / M with smaller constants.
traffic_vs_m.png: the same at N = 1024 against M: step 01 is flat (its GEMM tiles are
    fixed and S, P go to memory whatever M is), 02-04 fall as 1/M.
"""
import argparse
import csv
import io
import os
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LABELS = {"01": "step 01: S and P in memory", "02": "step 02: fused, no softmax (under 03: N fewer)",
          "03": "step 03: online softmax, Q outer", "04": "step 04: K/V outer (Algorithm 1)"}


def traffic(exe, N, M):
    out = subprocess.run([exe, "traffic", "--N", N, "--M", M, "--d", "64"], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return list(csv.DictReader(io.StringIO(out)))


def total(r):
    return int(r["model_read"]) + int(r["model_written"])


def finish(fig, ax, xlabel, title, path):
    """Both plots' log y axis, labels, grid and legend; then the file."""
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("HBM elements read + written (one head)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flashattn", default=None, help="the flashattn program (default: build-cpu's, else build's)")
    ap.add_argument("--out", default=os.path.join(ROOT, "notes", "figures"))
    a = ap.parse_args()
    exe = a.flashattn
    for cand in ("build-cpu", "build"):
        path = os.path.join(ROOT, cand, "tools", "flashattn", "flashattn")
        if exe is None and os.path.exists(path):
            exe = path
    if exe is None:
        sys.exit("no flashattn found: build it first (cmake --preset cpu && cmake --build --preset cpu)")
    os.makedirs(a.out, exist_ok=True)

    by_n = traffic(exe, "128,256,512,1024,2048", "37800")
    fig, ax = plt.subplots(figsize=(7, 5))
    for step in ("01", "02", "03", "04"):
        pts = sorted((int(r["N"]), total(r)) for r in by_n if r["step"] == step)
        ax.plot(*zip(*pts), "o-", label=LABELS[step])
    pts = sorted({(int(r["N"]), float(r["n2d2_over_M"])) for r in by_n if r["step"] == "02"})
    ax.plot(*zip(*pts), "k--", label="N²d²/M")
    ax.set_xscale("log", base=2)
    finish(fig, ax, "sequence length N", "HBM traffic against N (CPU models): d = 64, M = 37800, 104 × 104 blocks",
           os.path.join(a.out, "traffic_vs_n.png"))

    by_m = traffic(exe, "1024", "1100,2200,4400,9300,18800,37800")
    fig, ax = plt.subplots(figsize=(7, 5))
    ms = sorted({int(r["M"]) for r in by_m if r["step"] != "01"})
    flat = [total(r) for r in by_m if r["step"] == "01"][0]
    ax.plot(ms, [flat] * len(ms), "o-", label=LABELS["01"] + " (no M in it)")
    for step in ("02", "03", "04"):
        pts = sorted((int(r["M"]), total(r)) for r in by_m if r["step"] == step)
        ax.plot(*zip(*pts), "o-", label=LABELS[step])
    pts = sorted({(int(r["M"]), float(r["n2d2_over_M"])) for r in by_m if r["step"] == "02"})
    ax.plot(*zip(*pts), "k--", label="N²d²/M")
    ax.set_xscale("log")
    finish(fig, ax, "on-chip budget M (elements)", "HBM traffic against M (CPU models): N = 1024, d = 64",
           os.path.join(a.out, "traffic_vs_m.png"))
    print(f"wrote {a.out}/traffic_vs_n.png and traffic_vs_m.png")


if __name__ == "__main__":
    main()
