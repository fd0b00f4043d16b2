#!/usr/bin/env python3
"""The training runs of train_gpt.py against the noise of the run itself: the band is
the spread of the SDPA runs that differ only in the data order's seed; each step's curve
(the mean training loss over each interval) and its final validation loss are held
inside it.

  python3 python/examples/curves.py RUNS.csv --plot curves.png --summary summary.csv

Prints one row per run; exits 1 if a step's curve or final validation loss leaves the band.
"""
import argparse
import collections
import csv
import sys


def load(path):
    runs = collections.OrderedDict()
    for r in csv.DictReader(open(path)):
        runs.setdefault((r["dtype"], r["run"]), []).append(r)
    return runs


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("runs")
    a.add_argument("--plot", help="PNG of the curves and the band")
    a.add_argument("--summary", help="CSV of the verdicts")
    a.add_argument("--skip", type=int, default=1, help="curve points to leave out at the start (warm-up)")
    args = a.parse_args()
    runs = load(args.runs)
    rows, ok = [], True
    for dtype in sorted({k[0] for k in runs}):
        base = {name: rs for (t, name), rs in runs.items() if t == dtype and rs[0]["attention"] == "sdpa"}
        if len(base) < 2:
            print(f"{dtype}: fewer than two SDPA runs: no band", file=sys.stderr)
            ok = False
            continue
        iters = [r["iter"] for r in next(iter(base.values()))]
        lo = {i: min(float(rs[k]["train_loss"]) for rs in base.values()) for k, i in enumerate(iters)}
        hi = {i: max(float(rs[k]["train_loss"]) for rs in base.values()) for k, i in enumerate(iters)}
        val_lo = min(float(rs[-1]["val_loss"]) for rs in base.values())
        val_hi = max(float(rs[-1]["val_loss"]) for rs in base.values())
        for (t, name), rs in runs.items():
            if t != dtype:
                continue
            pts = [(r["iter"], float(r["train_loss"])) for r in rs][args.skip:]
            inside = sum(lo[i] <= x <= hi[i] for i, x in pts if i in lo)
            out = max((max(lo[i] - x, x - hi[i], 0.0) for i, x in pts if i in lo), default=0.0)
            val = float(rs[-1]["val_loss"])
            ms = [float(r["ms_per_iter"]) for r in rs if r["ms_per_iter"]]
            step = rs[0]["attention"] != "sdpa"
            verdict = "band" if not step else (
                "inside" if inside == len(pts) and val_lo <= val <= val_hi else "OUTSIDE")
            ok &= verdict != "OUTSIDE"
            rows.append({"dtype": dtype, "run": name, "attention": rs[0]["attention"], "points_inside": inside,
                         "points": len(pts), "worst_excursion": f"{out:.4f}", "final_val_loss": f"{val:.4f}",
                         "band_final_val": f"{val_lo:.4f}-{val_hi:.4f}", "ms_per_iter": f"{ms[-1]:.2f}" if ms else "",
                         "verdict": verdict, "gpu": rs[0]["gpu"], "torch": rs[0]["torch"], "params": rs[0]["params"]})
    cols = ["dtype", "run", "attention", "points_inside", "points", "worst_excursion", "final_val_loss",
            "band_final_val", "ms_per_iter", "verdict"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    if args.summary:
        with open(args.summary, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    if args.plot:
        plot(runs, args.plot)
    return 0 if ok else 1


def plot(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dtypes = sorted({k[0] for k in runs})
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6.5 * len(dtypes), 4.2), squeeze=False)
    for ax, dtype in zip(axes[0], dtypes):
        base = [rs for (t, _), rs in runs.items() if t == dtype and rs[0]["attention"] == "sdpa"]
        if base:
            it = [int(r["iter"]) for r in base[0]][1:]
            lo = [min(float(rs[k]["train_loss"]) for rs in base) for k in range(1, len(base[0]))]
            hi = [max(float(rs[k]["train_loss"]) for rs in base) for k in range(1, len(base[0]))]
            ax.fill_between(it, lo, hi, color="0.8", label=f"SDPA, {len(base)} data orders")
        for (t, name), rs in runs.items():
            if t == dtype and rs[0]["attention"] != "sdpa":
                ax.plot([int(r["iter"]) for r in rs][1:], [float(r["train_loss"]) for r in rs][1:], lw=1.2,
                        label=f"step {rs[0]['attention']}")
        ax.set_xlabel("iteration")
        ax.set_ylabel("training loss (mean over each interval)")
        ax.set_title(f"{dtype}: {base[0][0]['params'] if base else '?'} parameters")
        ax.legend()
        ax.set_ylim(top=min(3.0, ax.get_ylim()[1]))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
