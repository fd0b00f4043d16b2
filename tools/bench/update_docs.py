#!/usr/bin/env python3
"""Rewrites the measured tables in README.md and notes/*.md from the bench CSVs,
so that no figure in them is typed by hand. Standard library only.

  python3 tools/bench/update_docs.py notes/results/h200

A table lives between two markers in a Markdown file:
  <!-- fa:table NAME -->  ...generated...  <!-- /fa:table -->
NAME is one of the functions in TABLES below. Files without markers are untouched.
"""
import csv
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(folder, name):
    path = os.path.join(folder, name)
    return list(csv.DictReader(open(path))) if os.path.exists(path) else []


class Data:
    def __init__(self, folder):
        self.folder = folder
        self.bench = load(folder, "bench.csv")
        self.peers = load(folder, "peers.csv")
        self.maxn = load(folder, "maxn.csv")
        self.traffic = load(folder, "traffic.csv")
        dev = open(os.path.join(folder, "device.txt")).read().splitlines()
        name, driver, _mem = [x.strip() for x in dev[0].split(",")]
        cuda = re.search(r"cuda_(\d+\.\d+)", dev[1])
        torch = dev[2] if len(dev) > 2 else ""
        self.device = (f"{name}, driver {driver}, CUDA {cuda.group(1) if cuda else '?'}"
                       f"{', ' + torch if torch.startswith('torch') else ''}")

    def find(self, rows, **kw):
        for r in rows:
            if all(str(r[k]) == str(v) for k, v in kw.items()) and r["status"] == "ok":
                return r
        return None


def fmt_ms(x):
    return f"{float(x):.3g}" if x else "—"


def fmt_bytes(b):
    b = float(b)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


def rel(path):
    return os.path.relpath(path, ROOT)


# ---- tables --------------------------------------------------------------------------
STEP_ROWS = [("01", "fwd", "naive: S, P in device memory", "notes/01_naive.md"),
             ("02", "fwd", "fused, no softmax", "notes/02_fused.md"),
             ("03", "fwd", "online softmax, Q outer", "notes/03_online_softmax.md"),
             ("04", "fwd", "K/V outer (Algorithm 1)", "notes/04_kv_outer.md"),
             ("01", "bwd", "naive backward: P, dP, dS in memory", "notes/01_naive.md"),
             ("05", "bwd", "backward by recomputation", "notes/05_backward.md")]


def table_steps(D, N=4096, d=64):
    """README: one row per step at one shape, with the fp32 peer beside it."""
    out = [f"Measured at B·H·N = 65536 (B = 1, H = {65536 // N}), N = {N}, d = {d}, not causal, fp32, on "
           f"{D.device}; median of 7 (`tools/bench/run_all.sh`).", "",
           "| step | what | direction | ms | TFLOP/s | vs step 01 | vs PyTorch efficient (fp32) | extra memory |",
           "|---|---|---|---|---|---|---|---|"]
    for step, direction, what, note in STEP_ROWS:
        r = D.find(D.bench, step=step, dir=direction, N=N, d=d, causal=0)
        base = D.find(D.bench, step="01", dir=direction, N=N, d=d, causal=0)
        peer = D.find(D.peers, impl="torch-efficient", dir=direction, dtype="fp32", N=N, d=d, causal=0)
        if not r:
            continue
        out.append(f"| [{step}]({note}) | {what} | {'forward' if direction == 'fwd' else 'backward'} | "
                   f"{fmt_ms(r['ms'])} | {float(r['tflops']):.2f} | {float(base['ms']) / float(r['ms']):.2f}× | "
                   f"{float(peer['ms']) / float(r['ms']):.2f}× | {fmt_bytes(r['scratch_bytes'])} |")
    for impl in ("torch-math", "torch-efficient"):
        for direction in ("fwd", "bwd"):
            r = D.find(D.peers, impl=impl, dir=direction, dtype="fp32", N=N, d=d, causal=0)
            if r:
                out.append(f"| PyTorch `{impl[6:]}` | `scaled_dot_product_attention`, fp32 | "
                           f"{'forward' if direction == 'fwd' else 'backward'} | {fmt_ms(r['ms'])} | "
                           f"{float(r['tflops']):.2f} | — | — | {fmt_bytes(r['scratch_bytes'])} |")
    return out


def table_step(D, step, direction):
    """A step's note: its time for every N, d, causal, against step 01 at the same shape."""
    out = [f"Measured on {D.device}; B = 1, H = 65536 / N; median of 7 (`tools/bench/run_all.sh`). "
           f"Ratio: step 01's time over this step's (above 1: faster than naive).", "",
           "| d | causal | N | ms | TFLOP/s | vs step 01 |", "|---|---|---|---|---|---|"]
    for r in D.bench:
        if r["step"] != step or r["dir"] != direction or r["status"] != "ok":
            continue
        base = D.find(D.bench, step="01", dir=direction, N=r["N"], d=r["d"], causal=r["causal"])
        ratio = f"{float(base['ms']) / float(r['ms']):.2f}×" if base else "—"
        out.append(f"| {r['d']} | {'yes' if r['causal'] == '1' else 'no'} | {r['N']} | {fmt_ms(r['ms'])} | "
                   f"{float(r['tflops']):.2f} | {ratio} |")
    return out


def table_bandwidth(D, step="01", d=64):
    """Bytes a step moves by its formula, over its measured time: is HBM its limit?"""
    out = [f"Step {step} forward, d = {d}, not causal: the bytes its formula says it moves, over its time, on "
           f"{D.device}; compare with the ~4 TB/s of a device-to-device copy on this GPU (../shared/PERF.md).", "",
           "| N | H | formula (GB) | ms | implied bandwidth (TB/s) |", "|---|---|---|---|---|"]
    if D.bench and "formula_bytes" not in D.bench[0]:
        return ["(bench.csv predates the formula_bytes column: rerun tools/bench/run_all.sh)"]
    for r in D.bench:
        if r["step"] == step and r["dir"] == "fwd" and r["d"] == str(d) and r["causal"] == "0" and r["status"] == "ok":
            b = float(r["formula_bytes"])
            out.append(f"| {r['N']} | {r['H']} | {b / 1e9:.2f} | {fmt_ms(r['ms'])} | {b / (float(r['ms']) * 1e-3) / 1e12:.2f} |")
    return out


def table_step06(D):
    """Step 06 beside PyTorch's FlashAttention-2 and cuDNN backends, same run, same shapes."""
    rows, peers = load(D.folder, "bench06.csv"), load(D.folder, "peers06.csv")
    if not rows:
        return ["(no bench06.csv yet: run tools/bench/run_all.sh)"]
    out = [f"Forward, bf16, B = 1, H = 65536 / N, measured in one run on {D.device} (median of 10). "
           f"Ratio: step 06's TFLOP/s over the backend's (1.0 = as fast).", "",
           "| d | causal | N | step 06 ms | step 06 TFLOP/s | FA-2 (flash) TFLOP/s | ratio | cuDNN TFLOP/s | ratio |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] != "ok":
            continue
        key = dict(dir="fwd", dtype="bf16", N=r["N"], d=r["d"], causal=r["causal"])
        fl, cu = D.find(peers, impl="torch-flash", **key), D.find(peers, impl="torch-cudnn", **key)
        t = float(r["tflops"])
        cell = lambda x: f"{float(x['tflops']):.1f} | {t / float(x['tflops']):.2f}" if x else "— | —"
        out.append(f"| {r['d']} | {'yes' if r['causal'] == '1' else 'no'} | {r['N']} | {fmt_ms(r['ms'])} | {t:.1f} | "
                   f"{cell(fl)} | {cell(cu)} |")
    return out


def table_step06_versions(D):
    """One row per version of step 06, each against the PyTorch backends of its own run."""
    out = [f"Forward, bf16, not causal, B·H·N = 65536, on {D.device}; each version measured in one run "
           f"beside PyTorch's backends (ratio: version's TFLOP/s over FlashAttention-2's).", "",
           "| version | change | d | N | TFLOP/s | FA-2 TFLOP/s | ratio |", "|---|---|---|---|---|---|---|"]
    versions = [("1", "mma.sync, softmax on fragments, P in registers; scalar shared loads", "_v1"),
                ("2", "ldmatrix (.trans for V); cp.async double-buffered K/V", "")]
    for ver, change, suffix in versions:
        rows, peers = load(D.folder, f"bench06{suffix}.csv"), load(D.folder, f"peers06{suffix}.csv")
        for d in ("64", "128"):
            for N in ("4096", "16384"):
                r = D.find(rows, N=N, d=d, causal=0)
                fl = D.find(peers, impl="torch-flash", dir="fwd", dtype="bf16", N=N, d=d, causal=0)
                if r and fl:
                    out.append(f"| {ver} | {change} | {d} | {N} | {float(r['tflops']):.1f} | {float(fl['tflops']):.1f} | "
                               f"{float(r['tflops']) / float(fl['tflops']):.2f} |")
    return out


def table_sass06(D):
    path = os.path.join(D.folder, "sass06.txt")
    if not os.path.exists(path):
        return ["(no sass06.txt yet)"]
    return ["```"] + open(path).read().strip().splitlines() + ["```"]


def table_maxn(D):
    out = [f"Largest N at B = H = 1, d = 64, doubling from 1024 (`fa_bench --max-n`), on {D.device}.", "",
           "| step | direction | largest N that ran | time there (ms) | extra memory there | next N |",
           "|---|---|---|---|---|---|"]
    for r in D.maxn:
        if not r["status"].startswith("largest-ok"):
            continue
        nxt = [x for x in D.maxn if x["step"] == r["step"] and x["status"] == "out-of-memory"]
        why = {"largest-ok": "—", "largest-ok:time-limit": "not tried (one launch took over 2 s)",
               "largest-ok:sweep-end": "sweep ends at 262144"}.get(r["status"], r["status"])
        if nxt:
            why = f"{nxt[0]['N']}: refused, needs {fmt_bytes(nxt[0]['scratch_bytes'])} of scratch"
        out.append(f"| {r['step']} | {'forward' if r['dir'] == 'fwd' else 'backward'} | {r['N']} | "
                   f"{fmt_ms(r['ms'])} | {fmt_bytes(r['scratch_bytes'])} | {why} |")
    return out


def table_traffic(D):
    tokens = int(D.traffic[0]["H"]) * int(D.traffic[0]["N"]) if D.traffic else 0
    out = [f"HBM traffic at d = 64, B = 1, H = {tokens} / N: the note's formula (= the CPU model's count) and the "
           f"DRAM bytes Nsight Compute measured (`tools/bench/ncu_traffic.py`), on {D.device}. "
           f"Q, K, V and O together take {4 * tokens * 64 * 4 / 2**20:.0f} MiB.", "",
           "| step | direction | N | formula (MB) | DRAM read (MB) | DRAM write (MB) | measured / formula |",
           "|---|---|---|---|---|---|---|"]
    for r in D.traffic:
        out.append(f"| {r['step']} | {'forward' if r['dir'] == 'fwd' else 'backward'} | {r['N']} | "
                   f"{int(r['formula_bytes']) / 1e6:.1f} | {float(r['dram_read_bytes']) / 1e6:.1f} | "
                   f"{float(r['dram_write_bytes']) / 1e6:.1f} | {float(r['measured_over_formula']):.3f} |")
    return out


def table_memory(D, d=64):
    """Step 05's note: device memory and time of the two backwards, N up to what step 01 holds."""
    rows = load(D.folder, "memory.csv")
    if not rows or "total_bytes" not in rows[0]:
        return ["(no memory.csv with total_bytes: rerun tools/bench/run_all.sh)"]
    out = [f"Backward at B = H = 1, d = {d}, not causal, on {D.device} (`fa_bench --steps 01,05 --dir bwd`). "
           f"Peak device memory: Q, K, V, O, L, dO, dQ, dK, dV plus the step's scratch. The last N is the "
           f"largest power of two whose step-01 scratch the GPU holds (the next needs 4x as much).", "",
           "| N | step 01: peak memory | of which scratch | step 01: ms | step 05: peak memory | of which scratch | step 05: ms |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["step"] != "01":
            continue
        s5 = next((x for x in rows if x["step"] == "05" and x["N"] == r["N"]), None)
        ok1 = r["status"] == "ok"
        cell5 = (f"{fmt_bytes(s5['total_bytes'])} | {fmt_bytes(s5['scratch_bytes'])} | {fmt_ms(s5['ms'])}"
                 if s5 and s5["status"] == "ok" else "— | — | —")
        out.append(f"| {r['N']} | {fmt_bytes(r['total_bytes'])} | {fmt_bytes(r['scratch_bytes'])} | "
                   f"{fmt_ms(r['ms']) if ok1 else 'does not fit'} | {cell5} |")
    return out


def table_peers(D, N=4096):
    out = [f"PyTorch `scaled_dot_product_attention`, one backend at a time, N = {N}, B·H·N = 65536, not causal, "
           f"on {D.device}; TFLOP/s (unsupported: the backend refused the dtype).", "",
           "| dtype | d | direction | math | efficient | flash | cuDNN |", "|---|---|---|---|---|---|---|"]
    for dtype in ("fp32", "bf16"):
        for d in ("64", "128"):
            for direction in ("fwd", "bwd"):
                cells = []
                for impl in ("math", "efficient", "flash", "cudnn"):
                    r = D.find(D.peers, impl="torch-" + impl, dir=direction, dtype=dtype, N=N, d=d, causal=0)
                    cells.append(f"{float(r['tflops']):.1f}" if r else "unsupported")
                out.append(f"| {dtype} | {d} | {'forward' if direction == 'fwd' else 'backward'} | " + " | ".join(cells) + " |")
    return out


def table_figures(D):
    return [f"![{n}]({rel(os.path.join(D.folder, n + '.png'))})" for n in ("time_vs_n", "tflops_vs_n", "hbm_vs_n", "memory_vs_n")
            if os.path.exists(os.path.join(D.folder, n + ".png"))]


TABLES = {
    "steps": table_steps, "maxn": table_maxn, "traffic": table_traffic, "memory": table_memory, "peers": table_peers,
    "step01": lambda D: table_step(D, "01", "fwd"), "step01-bwd": lambda D: table_step(D, "01", "bwd"),
    "step02": lambda D: table_step(D, "02", "fwd"), "step03": lambda D: table_step(D, "03", "fwd"),
    "step04": lambda D: table_step(D, "04", "fwd"), "step05": lambda D: table_step(D, "05", "bwd"),
    "figures": table_figures, "step06": table_step06, "sass06": table_sass06, "step06-versions": table_step06_versions, "step01-bandwidth": table_bandwidth,
}
MARK = re.compile(r"(<!-- fa:table (\S+) -->\n)(.*?)(<!-- /fa:table -->)", re.S)


def main():
    D = Data(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "notes/results/h200"))
    D.folder = os.path.abspath(D.folder)
    files = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "notes", "*.md")))
    for path in files:
        text = open(path).read()

        def fill(m):
            name = m.group(2)
            if name not in TABLES:
                sys.exit(f"{rel(path)}: unknown table '{name}'")
            body = TABLES[name](D)
            if path.startswith(os.path.join(ROOT, "notes")):  # links and images relative to notes/
                body = [re.sub(r"\]\((notes/)", "](", re.sub(r"\]\(notes/results", "](results", line)) for line in body]
            return m.group(1) + "\n".join(body) + "\n" + m.group(4)

        new = MARK.sub(fill, text)
        if new != text:
            open(path, "w").write(new)
            print("updated", rel(path))


if __name__ == "__main__":
    main()
