#!/usr/bin/python3
"""One query row's online softmax, drawn from `flashattn trace --csv FILE`:

  /usr/bin/python3 tools/course/plot_trace.py trace.csv [-o trace.png]

Top: the running max m after each event (K/V block, split, rank) and the rescale factor
e^(m_old - m_new) that event applied to the old l and O. Bottom: the first columns of
O / l, which settle on the row's output as the blocks arrive.
"""
import argparse
import csv
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("-o", "--out", default=None, help="the PNG (default: the CSV's name with .png)")
    a = ap.parse_args()
    rows = list(csv.DictReader(open(a.csv)))
    if not rows:
        raise SystemExit(f"{a.csv}: no events (the row sees no key)")
    x = [int(r["event"]) for r in rows]
    ocols = [k for k in rows[0] if k.startswith("o")]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.step(x, [float(r["m"]) for r in rows], where="post", label="m (running max; step 09: merged L)")
    top.set_ylabel("m")
    twin = top.twinx()
    twin.plot(x, [float(r["rescale"]) for r in rows], "rs", label="rescale e^(m_old − m_new)")
    twin.set_ylabel("rescale factor", color="r")
    twin.set_ylim(-0.05, 1.05)
    top.legend(loc="upper left")
    twin.legend(loc="lower right")
    for k in ocols:
        bottom.plot(x, [float(r[k]) for r in rows], "o-", label=f"O[{k[1:]}] / ℓ")
    bottom.set_ylabel("O / ℓ so far")
    bottom.set_xlabel("event (" + ", ".join(sorted({r['stage'].split(' ')[0] for r in rows})) + ")")
    bottom.legend(fontsize="small")
    if len(rows) <= 24:  # the stages by name, while they fit
        bottom.set_xticks(x)
        bottom.set_xticklabels([r["stage"] for r in rows], rotation=60, ha="right", fontsize="x-small")
    fig.suptitle(f"step {rows[0]['step']}: one query row's online softmax, event by event")
    fig.tight_layout()
    out = a.out or os.path.splitext(a.csv)[0] + ".png"
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
