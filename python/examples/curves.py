#!/usr/bin/env python3
"""The training runs of train_gpt.py against the noise of the run itself. The band is the
spread of the SDPA runs that differ only in the data order's seed: at each curve point (the
mean training loss over an interval) its width, max − min over those runs. A step trains
on one of those orders, so it is held to the SDPA run on the same order: at every point,
and at the final validation loss, the two may differ by no more than the band is wide.
(Not "inside min..max": a step that matches its SDPA run to the fourth digit would leave it
wherever that run is the band's own edge.)

  python3 python/examples/curves.py RUNS.csv --plot curves.png --summary summary.csv

Prints one row per run; exits 1 if a step's curve or final validation loss differs from its
SDPA run by more than the band's width.
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


def band(runs, dtype):
    """The SDPA runs of `dtype`, by data order, and their band: per curve iteration (as the
    CSV writes it), the lowest and highest training loss among them."""
    base = [rs for (t, _), rs in runs.items() if t == dtype and rs[0]["attention"] == "sdpa"]
    iters = [r["iter"] for r in base[0]] if base else []
    lo = {i: min(float(rs[k]["train_loss"]) for rs in base) for k, i in enumerate(iters)}
    hi = {i: max(float(rs[k]["train_loss"]) for rs in base) for k, i in enumerate(iters)}
    return {rs[0]["data_seed"]: rs for rs in base}, iters, lo, hi


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
        by_seed, _, lo, hi = band(runs, dtype)
        if len(by_seed) < 2:
            print(f"{dtype}: fewer than two SDPA runs: no band", file=sys.stderr)
            ok = False
            continue
        val_lo = min(float(rs[-1]["val_loss"]) for rs in by_seed.values())
        val_hi = max(float(rs[-1]["val_loss"]) for rs in by_seed.values())
        for (t, name), rs in runs.items():
            if t != dtype:
                continue
            step = rs[0]["attention"] != "sdpa"
            same = by_seed.get(rs[0]["data_seed"])
            if step and same is None:
                print(f"{dtype} {name}: no SDPA run on data order {rs[0]['data_seed']}", file=sys.stderr)
                ok = False
                continue
            same = same or rs
            ref = {r["iter"]: float(r["train_loss"]) for r in same}
            pts = [(r["iter"], float(r["train_loss"])) for r in rs][args.skip:]
            gaps = [(abs(x - ref[i]), hi[i] - lo[i]) for i, x in pts if i in lo and i in ref]
            within = sum(gap <= width for gap, width in gaps)
            worst = max((gap / width if width > 0 else float("inf") if gap > 0 else 0.0 for gap, width in gaps),
                        default=0.0)
            val, val_same = float(rs[-1]["val_loss"]), float(same[-1]["val_loss"])
            ms = [float(r["ms_per_iter"]) for r in rs if r["ms_per_iter"]]
            verdict = "band" if not step else (
                "inside" if within == len(pts) and abs(val - val_same) <= val_hi - val_lo else "OUTSIDE")
            ok &= verdict != "OUTSIDE"
            rows.append({"dtype": dtype, "run": name, "attention": rs[0]["attention"], "points_within": within,
                         "points": len(pts), "worst_gap_of_width": f"{worst:.2f}", "final_val_loss": f"{val:.4f}",
                         "same_order_val": f"{val_same:.4f}", "band_final_val": f"{val_lo:.4f}-{val_hi:.4f}",
                         "ms_per_iter": f"{ms[-1]:.2f}" if ms else "", "verdict": verdict, "gpu": rs[0]["gpu"],
                         "torch": rs[0]["torch"], "params": rs[0]["params"]})
    cols = ["dtype", "run", "attention", "points_within", "points", "worst_gap_of_width", "final_val_loss",
            "same_order_val", "band_final_val", "ms_per_iter", "verdict"]
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
    """Top: the curves over the band (min..max of SDPA's orders). Bottom: each step minus the
    SDPA run on its data order, against ± the band's width (what the verdict holds it to)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dtypes = sorted({k[0] for k in runs})
    fig, axes = plt.subplots(2, len(dtypes), figsize=(6.5 * len(dtypes), 7.0), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 2]})
    for col, dtype in enumerate(dtypes):
        ax, gap_ax = axes[0][col], axes[1][col]
        by_seed, iters, lo, hi = band(runs, dtype)
        it = [int(i) for i in iters[1:]]
        if by_seed:
            ax.fill_between(it, [lo[i] for i in iters[1:]], [hi[i] for i in iters[1:]], color="0.8",
                            label=f"SDPA, {len(by_seed)} data orders")
            width = [hi[i] - lo[i] for i in iters[1:]]
            gap_ax.fill_between(it, [-w for w in width], width, color="0.8", label="± the band's width")
        for (t, name), rs in runs.items():
            if t == dtype and rs[0]["attention"] != "sdpa":
                label = f"step {rs[0]['attention']}"
                ax.plot([int(r["iter"]) for r in rs][1:], [float(r["train_loss"]) for r in rs][1:], lw=1.2, label=label)
                same = by_seed.get(rs[0]["data_seed"])
                if same:
                    gap_ax.plot(it, [float(r["train_loss"]) - float(s["train_loss"]) for r, s in zip(rs[1:], same[1:])],
                                lw=1.2, label=label)
        ax.set_ylabel("training loss (mean over each interval)")
        params = next(iter(by_seed.values()))[0]["params"] if by_seed else "?"
        ax.set_title(f"{dtype}: {params} parameters")
        ax.legend()
        ax.set_ylim(top=min(3.0, ax.get_ylim()[1]))
        gap_ax.axhline(0.0, color="0.4", lw=0.6)
        gap_ax.set_xlabel("iteration")
        gap_ax.set_ylabel("step − SDPA on the same order")
        gap_ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
