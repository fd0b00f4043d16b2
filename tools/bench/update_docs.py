#!/usr/bin/env python3
"""Rewrites the measured tables in README.md and notes/*.md from the bench CSVs,
so that no figure in them is typed by hand. Standard library only.

  python3 tools/bench/update_docs.py notes/results/h200

A table lives between two markers in a Markdown file:
  <!-- fa:table NAME -->  ...generated...  <!-- /fa:table -->
NAME is one of the functions in TABLES below. Files without markers are untouched.
"""
import collections
import csv
import glob
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare07  # noqa: E402  (step 07's rows: compare07.table, ab_rounds)
import order_model  # noqa: E402  (production's causal tiles and its choice of order: tile_rows, by_wave)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(folder, name):
    path = os.path.join(folder, name)
    return list(csv.DictReader(open(path))) if os.path.exists(path) else []


def device_words(path):
    """A run's device.txt (nvidia-smi's line, nvcc's, then PyTorch's) in words: "GPU, driver …, CUDA …", then torch's
    and cuDNN's versions where the third line gives both ("torch X cudnn N"), or that line as it is where it names
    torch alone."""
    dev = open(path).read().splitlines()
    name, driver = [x.strip() for x in dev[0].split(",")][:2]  # (then memory, and in some runs the SM's top clock)
    cuda = re.search(r"cuda_(\d+\.\d+)", dev[1]) if len(dev) > 1 else None
    words = f"{name}, driver {driver}, CUDA {cuda.group(1) if cuda else '?'}"
    third = dev[2] if len(dev) > 2 else ""
    torch = re.search(r"torch (\S+) cudnn (\d+)", third)
    if torch:
        v = int(torch.group(2))
        return words + f", torch {torch.group(1)}, cuDNN {v // 10000}.{v // 100 % 100}.{v % 100}"
    return words + (", " + third if third.startswith("torch") else "")


class Data:
    def __init__(self, folder):
        self.folder = folder
        self.bench = load(folder, "bench.csv")
        self.peers = load(folder, "peers.csv")
        self.maxn = load(folder, "maxn.csv")
        self.traffic = load(folder, "traffic.csv")
        self.device = device_words(os.path.join(folder, "device.txt"))

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
           f"{D.device}; compare with the ~4 TB/s that a large device-to-device copy reached on this GPU.", "",
           "| N | H | formula (GB) | ms | implied bandwidth (TB/s) |", "|---|---|---|---|---|"]
    if D.bench and "formula_bytes" not in D.bench[0]:
        return ["(bench.csv predates the formula_bytes column: rerun tools/bench/run_all.sh)"]
    for r in D.bench:
        if r["step"] == step and r["dir"] == "fwd" and r["d"] == str(d) and r["causal"] == "0" and r["status"] == "ok":
            b = float(r["formula_bytes"])
            out.append(f"| {r['N']} | {r['H']} | {b / 1e9:.2f} | {fmt_ms(r['ms'])} | {b / (float(r['ms']) * 1e-3) / 1e12:.2f} |")
    return out


STEP06_FWD = [  # (version, bench file suffix, step id in it, what changed)
    ("v1", "_v1", "06", "mma.sync m16n8k16, softmax on the fragments, P in registers; 32-bit shared loads"),
    ("v2", "_v2", "06", "ldmatrix (.trans for V); cp.async double-buffered K/V; rows padded by 16 bytes"),
    ("v3", "", "06v3", "XOR-swizzled shared memory instead of padded rows"),
    ("v4", "", "06v4", "exp2 with the scale folded in: one FFMA + one MUFU.EX2 per score"),
    ("v5", "", "06v5", "128 query rows per block, 32 per warp: each K/V fragment feeds two mma"),
    ("v6", "_retired", "06v6", "v5 with 32-key blocks at d = 128 (no spills; not kept)"),
    ("v6b", "_retired", "06v6b", "v6 with 128-key blocks at d = 64 (not kept)"),
    ("v7", "", "06v7", "causal: v4's 64-row blocks, heaviest query blocks launched first"),
    ("v8", "", "06v8", "row sums ℓ added across the quad once, after the last block"),
    ("v9", "_retired", "06v9", "v8 with ≥ 3 blocks per SM at d = 64 (registers capped at 168; not kept)"),
    ("v9c", "_retired", "06v9c", "v8 with 128-row blocks also when causal (not kept)"),
    ("v10", "", "06v10", "v8, but 128-row blocks when causal at d = 128 (as v9c)"),
    ("v11", "_retired", "06v11", "v10 with each row's max and sum as two dependency chains (not kept)"),
    ("v12", "", "06v12", "the mask's comparisons behind a warp-uniform branch instead of predicated on every block"),
    ("v13", "", "06v13", "O and ℓ rescaled only when a row's max grows by more than 2^8; shuffles only then"),
    ("v14", "", "06v14", "v13 with 128-key blocks at d = 64 without the mask"),
    ("v15", "", "06v15", "**production**: v14 with the next K/V block's copies issued after the opening barrier: one barrier fewer per block"),
]
STEP06_BWD = [
    ("b1", "", "06b1", "dK/dV outer, 64 keys per block (4 warps × 16), dQ by fp32 float2 atomics"),
    ("b2", "", "06b2", "128 keys per block, 8 warps: Q_i, dO_i loaded and dQ atomics issued once per 128 keys"),
    ("b3", "", "06b3", "key blocks with the most query blocks launched first (grid: heads × blocks)"),
    ("b4", "", "06b4", "b3 with b1's 64-key blocks at d = 64"),
    ("b5", "_retired", "06b5", "b4 with the query blocks staggered per key block (not kept)"),
    ("b6", "", "06b6", "b4 with the mask behind a warp-uniform branch (as v12)"),
    ("b7", "", "06b7", "b6 with 32 keys per warp at d = 64 (4 warps, 128 keys; queries in two halves of 32)"),
    ("b8", "", "06b8", "b7, and at d = 128 FlashAttention-2's warp layouts with Pᵀ, dSᵀ in shared memory"),
    ("b9", "", "06b9", "b8 with the next query block's copies after the opening barrier: one barrier fewer"),
    ("b10", "", "06b10", "b9 with one barrier fewer also at d = 64"),
    ("b11", "", "06b11", "b10 with the d = 128 loop's addresses computed once (XORs and immediate offsets; "
     "whole tiles copied and dQ added from one pointer)"),
    ("b12", "_retired", "06b12", "b11 with dQ and its atomics between dV and dK, FlashAttention-2's order (not kept)"),
    ("b13", "", "06b13", "**production**: b11 with Sᵀ and dPᵀ computed back to back, before the exponentials and the mask's "
     "branch (one basic block: ptxas interleaves the two products)"),
]


def ncu_facts(D, step, direction, d="128", causal="0", suffix=""):
    """A profiler cell: instructions, the two largest stall reasons, bank conflicts, local loads."""
    rows = [r for r in load(D.folder, f"ncu06{suffix}.csv")
            if r["version"] == step and r["dir"] == direction and r["d"] == d and r["causal"] == causal]
    if not rows:
        return "—"
    v = {r["metric"]: float(r["value"]) for r in rows}
    stalls = sorted(((v[k], k[6:].replace("_", " ")) for k in v if k.startswith("stall_")), reverse=True)[:2]
    out = [f"{v.get('instructions', 0) / 1e6:.0f} M instr."]
    out += [f"{name} {x:.2f}" for x, name in stalls]
    if "smem_wavefronts" in v and v["smem_wavefronts"]:
        out.append(f"bank confl. {100 * (v.get('smem_ld_bank_conflicts', 0) + v.get('smem_st_bank_conflicts', 0)) / v['smem_wavefronts']:.1f} %")
    if v.get("local_ld_requests"):
        out.append(f"{v['local_ld_requests'] / 1e6:.2f} M local loads")
    return ", ".join(out)


def speed_cell(D, rows, peers, step, direction, d, causal, N):
    """'TFLOP/s (× FA-2)' for one version at one shape, FA-2 from the same run's peers."""
    r = D.find(rows, step=step, dir=direction, d=d, causal=causal, N=N)
    f = D.find(peers, impl="torch-flash", dir=direction, dtype="bf16", d=d, causal=causal, N=N)
    if not r:
        return "—"
    t = float(r["tflops"])
    return f"{t:.0f} ({t / float(f['tflops']):.2f})" if f else f"{t:.0f}"


def table_step06_versions(D):
    """One row per forward version, at N = 4096, against FlashAttention-2 of the same run."""
    out = [f"bf16, B·H·N = 65536, N = 4096 unless noted, on {D.device}. Each cell: TFLOP/s (× PyTorch "
           f"FlashAttention-2 of the same run). v1 and v2 were measured in earlier sessions (each with its own "
           f"FA-2 column), v3–v15 side by side in one run. Profiler: Nsight Compute on one launch at d = 128, "
           f"not causal — warp instructions, the two largest stall reasons (cycles per issued instruction), "
           f"shared-memory bank conflicts per wavefront, local-memory (spill) loads. " + retired_note(D), "",
           "| version | change | d = 64 | d = 128 | d = 128, N = 16384 | d = 128, causal | profiler (d = 128) |",
           "|---|---|---|---|---|---|---|"]
    for ver, suffix, step, change in STEP06_FWD:
        rows, peers = load(D.folder, f"bench06{suffix}.csv"), load(D.folder, f"peers06{suffix}.csv")

        def cell(d, causal, N):
            return speed_cell(D, rows, peers, step, "fwd", d, causal, N)
        out.append(f"| {ver} | {change} | {cell(64, 0, 4096)} | {cell(128, 0, 4096)} | {cell(128, 0, 16384)} | "
                   f"{cell(128, 1, 4096)} | {ncu_facts(D, step, 'fwd', suffix=suffix)} |")
    return out


def retired_note(D):
    """Where the versions measured and not kept live: the commit named beside their data."""
    path = os.path.join(D.folder, "bench06_retired.commit")
    commit = open(path).read().strip() if os.path.exists(path) else "?"
    return (f"Versions marked “not kept” left the code; their cells are from the last run that had them "
            f"(`bench06_retired.csv`, code in commit {commit}), each against FlashAttention-2 of that run.")


def table_step06_bwd_versions(D):
    out = [f"bf16, B·H·N = 65536, on {D.device}, one run. Each cell: TFLOP/s (× PyTorch FlashAttention-2's "
           f"backward of the same run; FLOPs counted as 2.5 × the forward's). Profiler: the dK/dV kernel, "
           f"d = 128, N = 4096, not causal. " + retired_note(D), "",
           "| version | change | d = 64, N = 4096 | d = 128, N = 4096 | d = 128, N = 16384 | d = 64, causal, N = 4096 "
           "| d = 128, causal, N = 16384 | profiler (dK/dV kernel) |",
           "|---|---|---|---|---|---|---|---|"]
    for ver, suffix, step, change in STEP06_BWD:
        rows, peers = load(D.folder, f"bench06{suffix}.csv"), load(D.folder, f"peers06{suffix}.csv")

        def cell(d, causal, N):
            return speed_cell(D, rows, peers, step, "bwd", d, causal, N)
        out.append(f"| {ver} | {change} | {cell(64, 0, 4096)} | {cell(128, 0, 4096)} | {cell(128, 0, 16384)} | "
                   f"{cell(64, 1, 4096)} | {cell(128, 1, 16384)} | {ncu_facts(D, step, 'bwd', suffix=suffix)} |")
    return out


def profiler_short(D, step, direction, suffix):
    """Instructions and the largest stall: the lesson's one-line profiler reading."""
    cell = ncu_facts(D, step, direction, suffix=suffix)
    return ", ".join(cell.split(", ")[:2]) if cell != "—" else cell


def table_step06_lesson(D, direction):
    """The lesson: one row per idea that was kept, in the order found (note 06)."""
    kept = [(v, s, st, c.replace("**production**: ", "")) for v, s, st, c in (STEP06_FWD if direction == "fwd" else STEP06_BWD)
            if s != "_retired"]
    if direction == "fwd":
        cols = [("d = 64", 64, 0, 4096), ("d = 128", 128, 0, 4096), ("d = 128, causal", 128, 1, 4096)]
    else:
        cols = [("d = 64", 64, 0, 4096), ("d = 128", 128, 0, 4096), ("d = 128, N = 16384", 128, 0, 16384)]
    what = "forward" if direction == "fwd" else "backward (FLOPs: 2.5 × the forward's)"
    out = [f"bf16, B·H·N = 65536, N = 4096 unless noted, on {D.device}: TFLOP/s of the {what} "
           f"(× PyTorch FlashAttention-2 of the same run), and what Nsight Compute counted at d = 128, N = 4096 "
           f"(warp instructions; the largest stall, in cycles per instruction). The last row is the production "
           f"kernel; v1 and v2 were measured in earlier sessions, each beside FlashAttention-2 of its own run "
           f"(their code is in git history). Every version, with the ones not kept: "
           f"[the appendix](06_appendix.md).", "",
           "| step | the idea | " + " | ".join(c[0] for c in cols) + " | profiler |",
           "|---|---|" + "---|" * len(cols) + "---|"]
    for ver, suffix, step, change in kept:
        rows, peers = load(D.folder, f"bench06{suffix}.csv"), load(D.folder, f"peers06{suffix}.csv")
        cells = [speed_cell(D, rows, peers, step, direction, d, causal, N) for _, d, causal, N in cols]
        out.append(f"| {ver} | {change} | " + " | ".join(cells) + f" | {profiler_short(D, step, direction, suffix)} |")
    return out


def table_step06(D, dtype="bf16", suffix=None):
    """Step 06 (production kernels) beside PyTorch's backends, every shape, one run.
    The files are bench06<suffix>.csv and peers06<suffix>.csv (suffix: "_fp16", "_dims")."""
    suffix = ("" if dtype == "bf16" else "_" + dtype) if suffix is None else suffix
    rows, peers = load(D.folder, f"bench06{suffix}.csv"), load(D.folder, f"peers06{suffix}.csv")
    if not rows:
        return [f"(no bench06{suffix}.csv yet: run tools/bench/step06_bench.sh)"]
    backends = [("flash", "FA-2")] + ([("cudnn", "cuDNN")] if any(p["impl"] == "torch-cudnn" for p in peers) else [])
    # A results folder may say that its pair of files measured other kernels than the shipped
    # ones (bench06<suffix>.kernels, one line); step06_bench.sh removes it when it writes a new pair.
    kernels = os.path.join(D.folder, f"bench06{suffix}.kernels")
    measured = open(kernels).read().strip() if os.path.exists(kernels) else "as shipped: forward v15, backward b13"
    out = [f"{dtype}, B = 1, H = 65536 / N, on {D.device}: step 06 ({measured}) and "
           f"PyTorch's `scaled_dot_product_attention` with one backend at a time, measured in one run (median of "
           f"10, L2 flushed). Ratio: step 06's TFLOP/s over the backend's (≥ 1.0: step 06 is as fast or faster).",
           "", "| direction | d | causal | N | step 06 ms | step 06 TFLOP/s | "
           + " | ".join(f"{n} TFLOP/s | ratio" for _, n in backends) + " |",
           "|---|---|---|---|---|---|" + "---|---|" * len(backends)]
    for r in rows:
        if r["step"] != "06" or r["status"] != "ok":
            continue
        t = float(r["tflops"])
        cells = []
        for impl, _ in backends:
            f = D.find(peers, impl="torch-" + impl, dir=r["dir"], dtype=dtype, N=r["N"], d=r["d"], causal=r["causal"])
            cells.append(f"{float(f['tflops']):.1f} | {t / float(f['tflops']):.2f}" if f else "— | —")
        out.append(f"| {'forward' if r['dir'] == 'fwd' else 'backward'} | {r['d']} | {'yes' if r['causal'] == '1' else 'no'} "
                   f"| {r['N']} | {fmt_ms(r['ms'])} | {t:.1f} | " + " | ".join(cells) + " |")
    if suffix == "":  # how much the reference itself moves between sessions
        old = load(D.folder, "peers06_v2.csv")
        diffs = []
        for r in old:
            f = D.find(peers, impl=r["impl"], dir=r["dir"], dtype=r["dtype"], N=r["N"], d=r["d"], causal=r["causal"])
            if r["impl"] == "torch-flash" and r["status"] == "ok" and f:
                diffs.append(float(r["tflops"]) / float(f["tflops"]))
        if diffs:
            out += ["", f"FlashAttention-2 itself varies between runs: its forward on the same {len(diffs)} shapes, "
                    f"measured in an earlier session (peers06_v2.csv), was between {min(diffs):.2f}× and "
                    f"{max(diffs):.2f}× of this run's. Ratios near 1.0 are within that noise."]
    record = fa2_record(D, rows, peers, dtype)
    if record:
        out += ["", record[0].upper() + record[1:] + "."]
    return out


def fa2_record(D, rows, peers, dtype="bf16"):
    """'at least FlashAttention-2's speed in W of T shapes; the lowest ratio is …' for step 06's rows."""
    wins = total = 0
    worst = None
    for r in rows:
        f = D.find(peers, impl="torch-flash", dir=r["dir"], dtype=dtype, N=r["N"], d=r["d"], causal=r["causal"])
        if r["step"] != "06" or r["status"] != "ok" or not f:
            continue
        ratio = float(r["tflops"]) / float(f["tflops"])
        total += 1
        wins += ratio >= 1.0
        if worst is None or ratio < worst[0]:
            worst = (ratio, r)
    if not worst:
        return ""
    w = worst[1]
    return (f"at least FlashAttention-2's speed in {wins} of {total} shapes; the lowest ratio is {worst[0]:.3f} "
            f"({'forward' if w['dir'] == 'fwd' else 'backward'}, d = {w['d']}, "
            f"{'causal' if w['causal'] == '1' else 'not causal'}, N = {w['N']})")


def table_step06_summary(D):
    """README: step 06 (bf16) beside FlashAttention-2 at two N, every direction, d and mask."""
    rows, peers = load(D.folder, "bench06.csv"), load(D.folder, "peers06.csv")
    if not rows:
        return ["(no bench06.csv yet)"]
    out = [f"Step 06, bf16, B·H·N = 65536, on {D.device}; TFLOP/s (× PyTorch FlashAttention-2, same run). "
           f"Every shape: [notes/06_tensor_cores.md](notes/06_tensor_cores.md).", "",
           "| direction | d | causal | N = 4096 | N = 16384 |", "|---|---|---|---|---|"]
    for direction in ("fwd", "bwd"):
        for d in ("64", "128"):
            for c in ("0", "1"):
                cells = [speed_cell(D, rows, peers, "06", direction, d, c, N) for N in ("4096", "16384")]
                out.append(f"| {'forward' if direction == 'fwd' else 'backward'} | {d} | {'yes' if c == '1' else 'no'} | "
                           + " | ".join(cells) + " |")
    main = fa2_record(D, rows, peers)
    dims = fa2_record(D, load(D.folder, "bench06_dims.csv"), load(D.folder, "peers06_dims.csv"))
    if main:
        out += ["", f"Every shape at d = 64 and 128 (N = 1k–16k, bf16): {main}."
                + (f" At d = 32, 96 and 256 (bf16; not the step's speed target): {dims}." if dims else "")]
    return out


def table_sass06(D):
    path = os.path.join(D.folder, "sass06.txt")
    if not os.path.exists(path):
        return ["(no sass06.txt yet)"]
    text = open(path).read().replace("fa::step06::(anonymous namespace)::", "").replace("void ", "")
    return ["```"] + text.strip().splitlines() + ["```"]


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


def table_claims(D, N=(1024, 2048, 4096, 8192, 16384)):
    """The lecture's speed claim: fused steps over standard attention (PyTorch math, step 01), one run."""
    ours = load(D.folder, "claims.csv") + load(D.folder, "claims06.csv")
    peers = load(D.folder, "claims_peers.csv")
    if not ours or not peers:
        return ["(not measured yet: `tools/bench/claims.sh`)"]

    def ms(rows, direction, n, dtype="fp32", **kw):
        r = D.find(rows, dir=direction, N=n, d=64, causal=0, dtype=dtype, **kw)
        return float(r["ms"]) if r else None

    out = [f"d = 64, not causal, B·H·N = 65536, on {D.device}, one run (`tools/bench/claims.sh`; median, L2 "
           f"flushed). Each cell: ms, and the speed-up over PyTorch's `math` backend in the same type "
           f"(standard attention: S and P in device memory, cuBLAS GEMMs), then over step 01.", "",
           "| direction | N | `math` fp32 | step 01 | fused fp32 | `math` bf16 | step 06 (bf16) |",
           "|---|---|---|---|---|---|---|"]
    spans = {"fp32_math": [], "fp32_01": [], "bf16_math": []}
    for direction, fused in (("fwd", "03"), ("bwd", "05")):
        for n in N:
            m32, m16 = ms(peers, direction, n, impl="torch-math"), ms(peers, direction, n, "bf16", impl="torch-math")
            s01, sf, s06 = ms(ours, direction, n, step="01"), ms(ours, direction, n, step=fused), ms(ours, direction, n, "bf16", step="06")
            if None in (m32, m16, s01, sf, s06):
                continue
            spans["fp32_math"].append(m32 / sf)
            spans["fp32_01"].append(s01 / sf)
            spans["bf16_math"].append(m16 / s06)
            out.append(f"| {'forward' if direction == 'fwd' else 'backward'} | {n} | {fmt_ms(m32)} | {fmt_ms(s01)} | "
                       f"step {fused}: {fmt_ms(sf)} ({m32 / sf:.2f}×, {s01 / sf:.2f}×) | {fmt_ms(m16)} | "
                       f"{fmt_ms(s06)} ({m16 / s06:.1f}×) |")
    if spans["fp32_math"]:
        def span(x):
            return f"{min(x):.2f}–{max(x):.2f}×" if max(x) < 10 else f"{min(x):.0f}–{max(x):.0f}×"

        def against(x):  # how a range of speed-ups sits against the lecture's 2–4×
            return ("more than the lecture's 2–4×" if min(x) > 4 else "less than the lecture's 2–4×" if max(x) < 2
                    else "in or near the lecture's 2–4×")
        out += ["", f"In 16 bits, step 06 runs at {span(spans['bf16_math'])} the speed of standard attention: "
                f"{against(spans['bf16_math'])} (PyTorch's `math` backend writes and reads S and P and runs a softmax "
                f"kernel between its GEMMs, all in device memory). The fp32 steps run at {span(spans['fp32_01'])} the "
                f"speed of step 01 and {span(spans['fp32_math'])} that of PyTorch's `math` in fp32: "
                f"{against(spans['fp32_01'] + spans['fp32_math'])}. On CUDA cores their inner loops are one FMA per "
                f"one or two shared-memory loads — bound by shared-memory bandwidth, like step 01's own GEMMs "
                f"([02](notes/02_fused.md)), while cuBLAS's fp32 GEMMs are not. Fusion removes the HBM traffic "
                f"the lecture counts; it turns into speed once the arithmetic is fast enough for that traffic to be "
                f"the limit."]
    return out


def table_traffic_m(D):
    """Steps 02-04's counted traffic against the on-chip budget M (`flashattn traffic`, CPU models)."""
    path = os.path.join(ROOT, "notes", "results", "cpu", "traffic_vs_m.csv")
    data = [r for r in load(os.path.dirname(path), os.path.basename(path)) if r["causal"] == "0"]
    if not data:
        return ["(not generated yet: `flashattn traffic > notes/results/cpu/traffic_vs_m.csv`)"]
    r0 = data[0]
    out = [f"N = {r0['N']}, d = {r0['d']}, not causal, one head: the CPU models' counted HBM traffic (elements read "
           f"+ written; each equals its formula) with b × b blocks chosen from an on-chip budget of M elements "
           f"(`tiles::tiles_for`), and that traffic over N²d²/M — a constant while b ≪ d "
           f"(`flashattn traffic`; the file `notes/results/cpu/traffic_vs_m.csv`, causal rows too).", "",
           "| M (elements) | b | step 02 | × N²d²/M | step 03 | × N²d²/M | step 04 (G = T_r) | × N²d²/M |",
           "|---|---|---|---|---|---|---|---|"]
    for M in sorted({int(r["M"]) for r in data}):
        cells = {r["step"]: r for r in data if int(r["M"]) == M}
        if set(cells) != {"02", "03", "04"}:
            continue
        bound = float(cells["02"]["n2d2_over_M"])

        def cell(step):
            total = int(cells[step]["model_read"]) + int(cells[step]["model_written"])
            return f"{total / 1e6:.2f} M | {total / bound:.2f}"
        out.append(f"| {M} | {cells['02']['br']} | {cell('02')} | {cell('03')} | {cell('04')} |")
    return out


def table_figures(D):
    return [f"![{n}]({rel(os.path.join(D.folder, n + '.png'))})"
            for n in ("speedup_vs_n", "claims_memory", "time_vs_n", "tflops_vs_n", "hbm_vs_n", "memory_vs_n")
            if os.path.exists(os.path.join(D.folder, n + ".png"))]


# ---- step 07 ---------------------------------------------------------------------------
def device07(D, name="device07.txt", folder=None):
    """The GPU, driver, CUDA, torch and cuDNN of a step's run (device07.txt; step 08: device08.txt)."""
    path = os.path.join(folder or D.folder, name)
    return device_words(path) if os.path.exists(path) else D.device


def step07_rows(D, direction="fwd", folder=None):
    """{(tokens, d, causal, N): {who: TFLOP/s}} from bench07[bwd]_t*.csv and peers07[bwd]_t*.csv (compare07.py)."""
    return compare07.table(folder or D.folder, direction)


WORD = {"fwd": "forward", "bwd": "backward"}


def bold(x):
    """A ratio to two places, in bold where it rounds below 1.0 (the tables' rule)."""
    return f"**{x:.2f}**" if round(x, 2) < 1 else f"{x:.2f}"


AB = "ab"  # notes/results/h200/ab: ab.py's runs (tools/device/ab.sh)


def bold3(x):
    """A ratio to three places, in bold below 1.000 (where two places would round 0.995 up to 1.00)."""
    if x >= 1:
        return f"{x:.3f}"
    return f"**{x:.4f}**" if round(x, 3) >= 1 else f"**{x:.3f}**"  # (0.9997: not "1.000" in bold)


def ab_folder(D):
    return os.path.join(D.folder, AB)


def main_run07(D, direction):
    """The rows of step 07's main tables, and how they were measured: ab.py's run where there is one."""
    f = ab_folder(D)
    tag = "07" if direction == "fwd" else "07bwd"
    if os.path.exists(os.path.join(f, f"ab{tag}.csv")):
        rounds = {r["round"] for r in load(f, f"ab{tag}.csv")}
        how = (f"measured in one process (`tools/bench/ab.py`, `{rel(os.path.join(f, 'ab' + tag + '.csv'))}`): at each "
               f"shape every implementation on the same tensors, taking turns, {len(rounds)} rounds of 10 repeats; the "
               f"median of the rounds")
        return step07_rows(D, direction, f), device07(D, "device.txt", f), how
    return step07_rows(D, direction), device07(D), "one run"


def table_step07_peers(D, direction="fwd"):
    """Step 07's forward (or backward) against cuDNN at every shape: TFLOP/s (× cuDNN), per B·H·N."""
    rows, dev, how = main_run07(D, direction)
    Ns = sorted({k[3] for k in rows})
    out = [f"bf16 {WORD[direction]}, on {dev}, {how}: TFLOP/s of step 07 (× PyTorch SDPA's cuDNN backend on "
           f"the same shapes; B = 1, H = B·H·N / N). Every ratio, the ones below 1.0 included.", "",
           "| B·H·N | d | causal | " + " | ".join(f"N = {n}" for n in Ns) + " |", "|---|---|---|" + "---|" * len(Ns)]
    for tokens, d, causal in sorted({k[:3] for k in rows}):
        cells = []
        for n in Ns:
            r = rows.get((tokens, d, causal, n), {})
            if "step07" in r and "cudnn" in r:
                cells.append(f"{r['step07']:.0f} ({bold(r['step07'] / r['cudnn'])})")
            else:
                cells.append("—")
        out.append(f"| {tokens} | {d} | {'yes' if causal else 'no'} | " + " | ".join(cells) + " |")
    return out


def table_step07_short(D, sub):
    """Short problems at d = 64: lesson rows h1 and h7, the production forward and cuDNN, one run
    (fa_bench --versions and peers.py into D.folder/sub/v64_t*.csv and p64_t*.csv)."""
    folder = os.path.join(D.folder, sub)
    rows = {}
    for path in sorted(glob.glob(os.path.join(folder, "v64_t*.csv")) + glob.glob(os.path.join(folder, "p64_t*.csv"))):
        for r in csv.DictReader(open(path)):
            if r["status"] != "ok":
                continue
            who = {"07": "prod", "07h1": "h1", "07h7": "h7"}.get(r["step"]) if r["impl"] == "fa" else \
                ("cudnn" if r["impl"] == "torch-cudnn" else None)
            if who:
                key = (int(r["H"]) * int(r["N"]), int(r["N"]), r["causal"] == "1")
                rows.setdefault(key, {})[who] = float(r["tflops"])
    out = [f"bf16 forward, d = 64, on {device07(D, folder=folder)}, one run: TFLOP/s of lesson rows h1 (two blocks "
           "an SM) and h7 (warp-specialised, one block an SM), of the production forward, and of cuDNN "
           "(`" + rel(folder) + "`).", "",
           "| B·H·N | N | causal | h1 | h7 | production | cuDNN | production ÷ cuDNN |",
           "|---|---|---|---|---|---|---|---|"]
    for (tokens, N, causal), r in sorted(rows.items()):
        if not all(k in r for k in ("h1", "h7", "prod", "cudnn")):
            continue
        out.append(f"| {tokens} | {N} | {'yes' if causal else 'no'} | {r['h1']:.0f} | {r['h7']:.0f} | "
                   f"{r['prod']:.0f} | {r['cudnn']:.0f} | {bold(r['prod'] / r['cudnn'])} |")
    return out


def table_step07_short128(D, sub="short07_d128"):
    """Short problems at d = 128: lesson rows h1, h5 and s1, the warp-specialised production forward of then, and
    cuDNN, in one process (ab.py: D.folder/sub/ab07_short.csv), the median of the rounds."""
    folder = os.path.join(D.folder, sub)
    runs, cells = load(folder, "ab07_short.csv"), {}
    for r in runs:
        if r["status"] != "ok":
            continue
        who = r["step"] if r["impl"] == "fa" else r["impl"].replace("torch-", "")
        key = (int(r["H"]) * int(r["N"]), int(r["N"]), r["causal"] == "1")
        cells.setdefault(key, {}).setdefault(who, []).append(float(r["tflops"]))
    rounds = {r["round"] for r in runs}
    out = [f"bf16 forward, d = 128, on {device07(D, 'device.txt', folder)}, measured in one process "
           f"(`tools/bench/ab.py`, `{rel(os.path.join(folder, 'ab07_short.csv'))}`, {len(rounds)} rounds of 10 repeats, "
           "the median): TFLOP/s of lesson rows h1, h5 and s1, of the warp-specialised forward (production at every N "
           "then), and of cuDNN; bold: below 1.0.", "",
           "| B·H·N | N | causal | h1 | h5 | s1 | warp-specialised | cuDNN | s1 ÷ cuDNN | warp-specialised ÷ cuDNN |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for (tokens, N, causal), c in sorted(cells.items()):
        m = {w: statistics.median(v) for w, v in c.items()}
        if not all(k in m for k in ("07h1", "07h5", "07s1", "07", "cudnn")):
            continue
        out.append(f"| {tokens} | {N} | {'yes' if causal else 'no'} | {m['07h1']:.0f} | {m['07h5']:.0f} | "
                   f"{m['07s1']:.0f} | {m['07']:.0f} | {m['cudnn']:.0f} | {bold(m['07s1'] / m['cudnn'])} | "
                   f"{bold(m['07'] / m['cudnn'])} |")
    return out


def table_step07_repeats(D):
    """The forward's table run three times in one session: step 07 ÷ cuDNN per B·H·N and d, each run."""
    runs = [("run 1 (`bench07_t*.csv`)", D.folder)] + [
        (f"run {i}", os.path.join(D.folder, "fwd07_repeats", f"run{i}")) for i in (2, 3)]
    def ratios(folder):
        out = {}
        for (tokens, d, _causal, _n), r in step07_rows(D, "fwd", folder).items():
            if "step07" in r and "cudnn" in r:
                out.setdefault((tokens, d), []).append(r["step07"] / r["cudnn"])
        return out
    R = [(name, ratios(f)) for name, f in runs]
    out = [f"bf16 forward, step 07 ÷ cuDNN (TFLOP/s), N = 1024–32768, causal and not, the same code three times "
           f"in one session on {device07(D)} (runs 2 and 3 back to back on one machine, `notes/results/h200/fwd07_repeats/`): "
           "lowest–highest ratio, and shapes below 1.0.", "",
           "| B·H·N | d | " + " | ".join(n for n, _ in R) + " |", "|---|---|" + "---|" * len(R)]
    for key in sorted(R[0][1]):
        cells = []
        for _, r in R:
            x = r.get(key, [])
            cells.append(f"{min(x):.2f}–{max(x):.2f} ({sum(round(v, 2) < 1 for v in x)} below)" if x else "—")
        out.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    return out


def table_step07_harness(D):
    """One binary's TFLOP/s under two harnesses (harness07/): the old table's fa_bench against today's,
    and today's with inputs drawn on the device (A) or on the host (B)."""
    f = os.path.join(D.folder, "harness07")
    def load_runs(prefix):
        out = {}
        for path in sorted(glob.glob(os.path.join(f, prefix + "*.csv"))):
            for r in csv.DictReader(open(path)):
                if r["status"] == "ok":
                    out.setdefault((int(r["d"]), int(r["N"]), r["causal"] == "1"), []).append(float(r["tflops"]))
        return out
    old, new = load_runs("old_"), load_runs("new_")
    dev, host = load_runs("dev_vs_host_A"), load_runs("dev_vs_host_B")
    def cell(x):
        return "—" if not x else " / ".join(f"{v:.0f}" for v in x)
    out = [f"bf16 forward, step 07's kernels, B·H·N = 131072, on {device07(D)}; TFLOP/s of each run, "
           "interleaved in one call (`notes/results/h200/harness07/`). Calls 1 and 2 on two machines of one session.", "",
           "| d | N | causal | call 1: fa_bench of 320df6d | call 1: today's fa_bench | "
           "call 2: inputs drawn on the device (today's) | call 2: inputs drawn on the host |",
           "|---|---|---|---|---|---|---|"]
    for k in sorted(set(old) | set(dev)):
        out.append(f"| {k[0]} | {k[1]} | {'yes' if k[2] else 'no'} | {cell(old.get(k))} | {cell(new.get(k))} | "
                   f"{cell(dev.get(k))} | {cell(host.get(k))} |")
    return out


def table_step07_rounds(D):
    """How much the rounds of ab.py's runs differ, and the GPU's state through them (NVML)."""
    f = ab_folder(D)
    out = [f"step 07 ÷ cuDNN round by round in ab.py's runs on {device07(D, 'device.txt', f)} (each round's median "
           "of 10 repeats, the two taking turns): the ratio of the medians, the lowest and highest round's ratio, and "
           "what NVML read after every repeat of both: the lowest SM clock, and in how many of the blocks of repeats "
           "the power cap had held the clock back.", "",
           "| direction | B·H·N | d | ratio of medians | rounds' ratios | shapes with every round within 5% of the median's "
           "| lowest SM clock, MHz | blocks under the power cap |",
           "|---|---|---|---|---|---|---|---|"]
    total = {}
    for direction, tag in (("forward", "07"), ("backward", "07bwd")):
        path = os.path.join(f, f"ab{tag}.csv")
        if not os.path.exists(path):
            continue
        R = compare07.ab_rounds(path)
        state = {}
        for r in load(f, f"ab{tag}.csv"):
            if r["status"] == "ok" and (r["step"] == "07" or r["impl"] == "torch-cudnn"):
                st = state.setdefault((int(r["H"]) * int(r["N"]), int(r["d"])), [9999, 0, 0])
                st[0] = min(st[0], int(r["sm_mhz_min"]))
                st[1] += "power-cap" in r["reasons"]
                st[2] += 1
        for tokens, d in sorted({k[:2] for k in R}):
            med, rounds, steady = [], [], 0
            for k, r in R.items():
                if k[:2] == (tokens, d) and "step07" in r and "cudnn" in r:
                    m = statistics.median(r["step07"]) / statistics.median(r["cudnn"])
                    these = [a / b for a, b in zip(r["step07"], r["cudnn"])]
                    med.append(m)
                    rounds += these
                    steady += all(abs(x / m - 1) <= 0.05 for x in these)
            st = state[(tokens, d)]
            out.append(f"| {direction} | {tokens} | {d} | {min(med):.2f}–{max(med):.2f} | {min(rounds):.2f}–{max(rounds):.2f} | "
                       f"{steady} of {len(med)} | {st[0]} | {st[1]} of {st[2]} |")
            total.setdefault(direction, [0, 0, 9999])
            total[direction][0] += steady
            total[direction][1] += len(med)
            total[direction][2] = min(total[direction][2], st[0])
    out += ["", "Every round within 5% of the median's: " + "; ".join(
        f"{d} in {a} of {n} shapes (lowest SM clock {mhz} MHz)" for d, (a, n, mhz) in total.items()) +
        f" (`{rel(f)}/ab07.csv` and `ab07bwd.csv`, each its own run)."]
    return out


def table_step07_pause(D):
    """ab.py at d = 128 and 256 without a pause and with 500 ms of rest before every block of repeats."""
    f = ab_folder(D)
    def run(name):
        out = {}
        for r in load(f, name):
            if r["status"] == "ok":
                who = "07" if r["impl"] == "fa" else "cudnn"
                c = out.setdefault((int(r["d"]), int(r["N"]), r["causal"] == "1"), {}).setdefault(who, [[], 9999, 0])
                c[0].append(float(r["tflops"]))
                c[1] = min(c[1], int(r["sm_mhz_min"]))
                c[2] += "power-cap" in r["reasons"]
        return out
    A, B = run("ab07_pause0.csv"), run("ab07_pause500.csv")
    med = statistics.median
    out = [f"bf16 forward, B·H·N = 131072, on {device07(D, 'device.txt', f)}, `ab.py` twice in one call: with no pause, "
           "and with 500 ms of rest (the GPU idle) before every block of 10 repeats (`ab07_pause0.csv`, "
           "`ab07_pause500.csv`). TFLOP/s, the median of 3 rounds; in brackets the lowest SM clock (MHz) NVML read "
           "after a repeat, and * where the power cap held the clock back in some block.", "",
           "| d | N | causal | step 07, no pause | step 07, rested | cuDNN, no pause | cuDNN, rested | "
           "step 07 ÷ cuDNN, no pause | rested |", "|---|---|---|---|---|---|---|---|---|"]
    def cell(c):
        return f"{med(c[0]):.0f} ({c[1]}{'*' if c[2] else ''})"
    for k in sorted(A):
        if k not in B or not all(w in A[k] and w in B[k] for w in ("07", "cudnn")):
            continue
        a, b = A[k], B[k]
        out.append(f"| {k[0]} | {k[1]} | {'yes' if k[2] else 'no'} | {cell(a['07'])} | {cell(b['07'])} | "
                   f"{cell(a['cudnn'])} | {cell(b['cudnn'])} | {med(a['07'][0]) / med(a['cudnn'][0]):.2f} | "
                   f"{med(b['07'][0]) / med(b['cudnn'][0]):.2f} |")
    return out


def table_step07_summary(D, direction="fwd"):
    """Ranges of step 07's ratios to cuDNN, FA-2 and step 06, per B·H·N and d (causal and not together)."""
    rows, dev, how = main_run07(D, direction)
    out = [f"bf16 {WORD[direction]}, N = 1024–32768, causal and not, on {dev}, {how}; ratios of TFLOP/s "
           f"(bold: below 1.0).", "",
           "| B·H·N | d | step 07, TFLOP/s | × cuDNN | × FlashAttention-2 | × step 06 | cells ≥ cuDNN |",
           "|---|---|---|---|---|---|---|"]
    for tokens, d in sorted({k[:2] for k in rows}):
        sel = [r for k, r in rows.items() if k[:2] == (tokens, d) and "step07" in r]
        def span(who):
            x = [r["step07"] / r[who] for r in sel if who in r]
            return f"{bold(min(x))}–{max(x):.2f}"
        t = [r["step07"] for r in sel]
        ok = sum(r["step07"] >= r["cudnn"] for r in sel if "cudnn" in r)
        out.append(f"| {tokens} | {d} | {min(t):.0f}–{max(t):.0f} | {span('cudnn')} | {span('flash')} | "
                   f"{span('step06')} | {ok} of {len(sel)} |")
    both = [(k, r) for k, r in rows.items() if "step07" in r and "cudnn" in r]
    below = [(k, r["step07"] / r["cudnn"]) for k, r in both if r["step07"] < r["cudnn"]]  # as "cells ≥ cuDNN" counts
    long_ = [r["step07"] / r["cudnn"] for k, r in both if k[3] >= 8192]
    flash = [r["step07"] / r["flash"] for k, r in both if "flash" in r]
    def where(k):  # (tokens, d, causal, N)
        return f"d = {k[1]}{', causal' if k[2] else ''}, N = {k[3]}, B·H·N = {k[0]}"
    if len(below) == 1:
        (k, x), = below
        said = f"Below cuDNN in 1 of {len(both)} shapes: {where(k)} ({x:.3f}×)."
    elif below:
        said = (f"Below cuDNN in {len(below)} of {len(both)} shapes, at N = {min(k[3] for k, _ in below)}–"
                f"{max(k[3] for k, _ in below)} ({min(x for _, x in below):.3f}–{max(x for _, x in below):.3f}×; at "
                f"d = 64 in {sum(k[1] == 64 for k, _ in below)} of them).")
    if not below:
        k, x = min(((k, r["step07"] / r["cudnn"]) for k, r in both), key=lambda kx: kx[1])
        said = f"At least cuDNN's speed in all {len(both)} shapes, the lowest {where(k)} ({x:.3f}×)."
    out += ["", f"{said} At N ≥ 8192: {min(long_):.2f}–{max(long_):.2f}× cuDNN. Against FlashAttention-2: "
                f"{min(flash):.2f}–{max(flash):.2f}× in all {len(flash)}."]
    return out


STEP07_FWD = [("h0", "TMA alone: step 06's kernel (mma.sync from ldmatrix), its K/V blocks as TMA boxes on an "
                     "mbarrier instead of every thread's cp.async (d = 64 only: step 06's swizzle is TMA's there)"),
              ("h1", "TMA + wgmma: two warpgroups compute, one of their threads issues the copies"),
              ("h2", "+ a producer warpgroup that only copies and gives its registers away (setmaxnreg)"),
              ("h3", "+ ping-pong: the consumers take turns on the tensor cores"),
              ("h4", "+ softmax of block j under P·V of block j−1, in each warpgroup"),
              ("h5", "block shape: h4 with 64 keys a block"),
              ("h6", "block shape: h4 with 176 keys a block (not at d = 256)"),
              ("h7", "**production** then (at d = 256 still; h9, below, at d = 64 and 128): h4 with three consumers "
                     "(192 query rows) at d = 64")]


NcuLaunch = collections.namedtuple("NcuLaunch", "name grid metrics")  # grid: "(x, y, z)"; metrics: {name: value}


def ncu_launches(path):
    """{launch ID: NcuLaunch} of an Nsight Compute `--csv` file, in launch order, the metrics' values without their
    thousands' commas; {} where there is no file. Rows may stop after the value (newer ncu leaves the rule columns
    off)."""
    hdr, out = None, {}
    for r in csv.reader(open(path)) if os.path.exists(path) else []:
        if r and r[0] == "ID":
            hdr = r
        elif hdr and len(r) > hdr.index("Metric Value"):
            x = dict(zip(hdr, r))
            k = out.setdefault(int(x["ID"]), NcuLaunch(x["Kernel Name"], x["Grid Size"], {}))
            k.metrics[x["Metric Name"]] = x["Metric Value"].replace(",", "")
    return out


def ncu07(D, name="ncu07.csv"):
    """{(version id, d): {metric: value}} from ncu07.csv (one launch per version, d = 64, 128)."""
    out = {}
    for k in ncu_launches(os.path.join(D.folder, name)).values():
        name = k.name
        if not re.search(r"forward_kernel|version_kernel|tma_alone_kernel", name):  # the bench's own (random inputs)
            continue
        v = re.search(r"::(h\d)>", name)
        if "tma_alone_kernel" in name:  # h0: d = 64 only, not in its template arguments
            out.setdefault(("h0", "64"), {}).update(k.metrics)
            continue
        d = re.search(r"<[^,]+, (\d+),", name).group(1)
        # The production kernel (no version in its name) is h7: fa_bench --once launches it
        # twice, as the step's row and as the h7 row; the later launch's figures stand.
        out.setdefault((v.group(1) if v else "h7", d), {}).update(k.metrics)
    return out


def table_step07_lesson(D):
    # h0 came later than the others: its row is from its own run (versions07_h0.csv, ncu07_h0.csv).
    rows = [r for r in load(D.folder, "versions07.csv") if r["step"] != "07h0"]
    rows += [r for r in load(D.folder, "versions07_h0.csv") if r["step"] == "07h0"]
    prof = ncu07(D)
    prof.update({k: v for k, v in ncu07(D, "ncu07_h0.csv").items() if k[0] == "h0"})
    cols = [("d = 64", 64, 0, 16384), ("d = 128", 128, 0, 16384), ("d = 128, N = 4096", 128, 0, 4096),
            ("d = 128, causal", 128, 1, 16384), ("d = 256", 256, 0, 16384)]
    out = [f"bf16 forward, B·H·N = 131072, N = 16384 unless noted, on {device07(D)}, one run: TFLOP/s. "
           f"Profiler (Nsight Compute, one launch, N = 8192, not causal, d = 64 / d = 128): tensor-pipe active "
           f"(% of peak sustained) and warps stalled on a barrier (named barriers, mbarrier waits: % of "
           f"active warps). Row h0 is from a later run of its own (bench and profile).", "",
           "| step | the idea | " + " | ".join(c[0] for c in cols) + " | tensor pipe | barrier stall |",
           "|---|---|" + "---|" * len(cols) + "---|---|"]
    for ver, change in STEP07_FWD:
        cells = []
        for _, d, causal, N in cols:
            r = D.find(rows, step=f"07{ver}", dir="fwd", d=d, causal=causal, N=N)
            cells.append(f"{float(r['tflops']):.0f}" if r else "—")
        p64, p128 = prof.get((ver, "64"), {}), prof.get((ver, "128"), {})
        def two(metric):
            a, b = p64.get(metric), p128.get(metric)
            cell = lambda x: f"{float(x):.0f}%" if x and x != "n/a" else "—"
            return "—" if cell(a) == cell(b) == "—" else f"{cell(a)} / {cell(b)}"
        out.append(f"| {ver} | {change} | " + " | ".join(cells) + f" | "
                   f"{two('sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active')} | "
                   f"{two('smsp__warp_issue_stalled_barrier_per_warp_active.pct')} |")
    return out


def table_step07_gemm(D):
    """Step 07's best TFLOP/s per d against the bf16 GEMM rate of the same session (gemm07.txt)."""
    path = os.path.join(ab_folder(D), "gemm.txt")  # measured beside ab.py's run, where there is one
    if not os.path.exists(path):
        path = os.path.join(D.folder, "gemm07.txt")
    if not os.path.exists(path):
        return ["(no gemm07.txt: run tools/device/step07_check.sh)"]
    gemm = float(open(path).read().split()[0])
    rows, _, _ = main_run07(D, "fwd")
    out = [f"bf16 GEMM 8192³: {gemm:.0f} TFLOP/s (`{rel(path)}`). Step 07's forward, largest TFLOP/s over the shapes "
           "above:", "",
           "| d | step 07, best | of the GEMM rate |", "|---|---|---|"]
    for d in sorted({k[1] for k in rows}):
        best = max(r["step07"] for k, r in rows.items() if k[1] == d and "step07" in r)
        out.append(f"| {d} | {best:.0f} | {best / gemm:.2f}× |")
    return out


def table_ctest07(D):
    path = os.path.join(D.folder, "ctest07.txt")
    if not os.path.exists(path):
        return ["(no ctest07.txt: run PHASE=final tools/device/step07_check.sh)"]
    return ["```"] + open(path).read().strip().splitlines() + ["```"]


def table_test07(D):
    path = os.path.join(D.folder, "test07.txt")
    return ["```"] + open(path).read().strip().splitlines() + ["```"]


def table_step07_persistent(D):
    """The persistent grid that was measured and not kept, against the kernel that was (two runs)."""
    commit = open(os.path.join(D.folder, "persistent07", "commit")).read().strip()
    out = [f"Step 07 on a persistent grid (code in commit {commit}, figures in `persistent07/`), as a ratio of "
           f"the kept kernel's TFLOP/s, same shapes, two runs of one session:", "",
           "| B·H·N | causal | persistent ÷ kept, range over d = 64, 128, 256 and N = 1k–32k |", "|---|---|---|"]
    def step07(path):  # {(H, N, d, causal): TFLOP/s} of step 07's rows in one fa_bench CSV
        return {(r["H"], r["N"], r["d"], r["causal"]): float(r["tflops"]) for r in csv.DictReader(open(path))
                if r["step"] == "07" and r["status"] == "ok"}
    for path in sorted(glob.glob(os.path.join(D.folder, "bench07_t*.csv"))):
        tokens = re.search(r"_t(\d+)\.csv$", path).group(1)
        kept, pers = step07(path), step07(os.path.join(D.folder, "persistent07", os.path.basename(path)))
        for c in ("0", "1"):
            x = [pers[k] / kept[k] for k in kept if k[3] == c and k in pers]
            out.append(f"| {tokens} | {'yes' if c == '1' else 'no'} | {min(x):.2f}–{max(x):.2f} |")
    return out


def table_sass07(D):
    path = os.path.join(D.folder, "sass07.txt")
    lines = open(path).read().splitlines()[1:] if os.path.exists(path) else []
    out = ["Per kernel (bf16; fp16 compiles to the same counts), from `cuobjdump --dump-sass` of the sm_90a build "
           f"(`{rel(path)}`):", ""]
    def name(x):  # "void dkdv_kernel<bf16, 64, &fa::step07::(anonymous namespace)::b5>::BwdParams)" → its short name
        k = x.split(": ", 1)[0].replace("void ", "")
        return re.sub(r"&fa::step07::\(anonymous namespace\)::(\w+)>.*", r"\1>", k).split(":")[0]
    out += [f"- `{name(x)}`: {x.split(': ', 1)[1]}" for x in lines
            if "bf16" in x and x.startswith(("void forward_kernel", "void persistent_kernel", "void dkdv_kernel",
                                             "void dkdv_wide_kernel"))]
    out += ["", "The versions' kernels (h1–h6) likewise: no local memory in any of them."]
    return out


BWD07_B8 = os.path.join(AB, "bwd_b8")  # the call's timeline (ab.sh's call phase), and b8 beside b7 in that run


# The backward's rows: each a device run of its own (its folder), with cuDNN measured in it.
STEP07_BWD = [("b1", "bwd07_first", "TMA + wgmma + a producer warpgroup; dQ by TMA bulk reductions, at d = 64 "
               "each consumer's partial over its 64 keys (two reductions a query block)"),
              ("b2", "bwd07_b2", "+ dQ's 64-column pieces dealt to the consumers in turn (d = 64: one reduction a "
               "query block, every other block each), query blocks last to first"),
              ("b3", "bwd07_b3", "+ a query block's stage released before dQ's piece"),
              ("b4", ".", "+ d = 256 in a second kernel, 64 keys a block, the consumers splitting dK's "
               "and dV's columns (b3's kernel unchanged at d ≤ 128)"),
              ("b5", os.path.join(AB, "bwd_b5"), "+ at d = 64, K_c and V_c held in registers, so that Sᵀ's and "
               "dPᵀ's products read only Q_i and dO_i from shared memory (b4's kernel unchanged at d = 128, 256)"),
              ("b6", os.path.join(AB, "bwd_b6"), "+ at d = 128, 80 queries a step (dQ's pieces computed transposed, "
               "dQᵢᵀ = K_jᵀ·dSᵀ), so that the products reading both operands from shared memory read 4.5 KiB for 80K "
               "multiply-adds, not 4 KiB for 64K (b5's kernel unchanged at d = 64, 256)"),
              ("b7", os.path.join(AB, "bwd_b7"), "+ at d = 64, 96 queries a step (b6's transposed dQ), so that a "
               "step's fixed costs — its barriers, its waits, its exponentials' latency — are paid for 96 queries, not "
               "64 (b6's kernel unchanged at d = 128, 256)"),
              ("b8", os.path.join(AB, "bwd_b8", "full"), "+ the call's own fixed costs cut: the dQ accumulator zeroed "
               "by the preprocess instead of a memset, the dK/dV and convert kernels launched early (programmatic "
               "dependent launch); b7's kernels at every d"),
              ("b9", os.path.join(AB, "bwd_b9", "full"), "+ a persistent grid: a block an SM, its producer taking "
               "tile after tile from a counter, the next tile's first query blocks loading under the last tile's "
               "epilogue"),
              ("b10", os.path.join(AB, "bwd_b10"), "+ the proxy fences after a consumer's own stores moved behind the "
               "next products' issue: dSᵀ stored before dV's and dK's products, a staged dQ piece announced in the "
               "next step (d ≤ 128 in its run, b9's kernel at d = 256 there; at d = 256 since b12's run)"),
              ("b11", os.path.join(AB, "bwd_b11", "full"), "+ at d = 128, a step's dQ pieces computed in the next step, "
               "so that a consumer waits for the other's dSᵀ a step after it was stored (b10's kernel at d = 64, 256)"),
              ("b12", AB, "+ at d = 128, a writer of dQ's pieces per consumer, each one's bulk "
               "reduction in flight beside the other's (b11's kernel at d = 64, 256; b10's fence move at d = 256 "
               "first measured in this run; b14 and b15, the order of the tiles, have their own section)"),
              ("b16", os.path.join(AB, "bwd_b16", "ab07bwd_b16.csv"), "**production**: + at d = 256, a step's "
               "second dQ piece staged in the next step, under its dPᵀ, so that the consumer does not wait at the "
               "step's end for the writer to empty the slot (d = 256 only in its run; b12's kernel at d = 64, 128)")]


def table_step07_bwd_lesson(D):
    cols = [(64, 0), (64, 1), (128, 0), (128, 1), (256, 0), (256, 1)]
    out = [f"bf16 backward, B·H·N = 131072, N = 16384, on {device07(D)}; each row its own run (machine), so "
           f"TFLOP/s with the ratio to cuDNN of that run in brackets.", "",
           "| step | the idea | " + " | ".join(f"d = {d}{', causal' if c else ''}" for d, c in cols) + " |",
           "|---|---|" + "---|" * len(cols)]
    for ver, folder, idea in STEP07_BWD:
        # b4's run: fa_bench's CSVs in the results folder; b5's to b9's: ab.py's ab07bwd.csv
        rows = step07_rows(D, "bwd", os.path.join(D.folder, folder))
        cells = []
        for d, c in cols:
            r = rows.get((131072, d, c, 16384), {})
            cells.append(f"{r['step07']:.0f} ({r['step07'] / r['cudnn']:.2f})" if "step07" in r and "cudnn" in r else "—")
        out.append(f"| {ver} | {idea} | " + " | ".join(cells) + " |")
    return out


def ab07bwd_rounds(folder, name="ab07bwd.csv", column="tflops"):
    """{(tokens, d, causal, N, who): [`column` of each round]} of one ab.py backward run (folder's `name`);
    who: a step's id (07, 07b5, …) or PyTorch's backend (cudnn, flash)."""
    got = {}
    for r in load(folder, name):
        if r["status"] == "ok":
            who = r["step"] if r["impl"] == "fa" else r["impl"].replace("torch-", "")
            key = (int(r["H"]) * int(r["N"]), int(r["d"]), r["causal"] == "1", int(r["N"]), who)
            got.setdefault(key, []).append(float(r[column]))
    return got


def ab07bwd_medians(folder, name="ab07bwd.csv"):
    """{(tokens, d, causal, N, who): the median of the rounds' TFLOP/s} of one ab.py backward run (ab07bwd_rounds)."""
    return {k: statistics.median(v) for k, v in ab07bwd_rounds(folder, name).items()}


def table_step07_pair(D, ds, old, old_name, new_name, new="07", folder=AB):
    """A lesson row of the backward against the one before it at the head dimensions ds (an int: one, and no d
    column), and cuDNN, in one process (`folder`/ab07bwd.csv: the row `new`, production's 07 or a lesson row's id,
    and the row before it `old`)."""
    one = isinstance(ds, int)
    ds = (ds,) if one else tuple(ds)
    folder = os.path.join(D.folder, folder)
    path = os.path.join(folder, "ab07bwd.csv")
    cells = {}
    for (tokens, dd, causal, N, who), x in ab07bwd_rounds(folder).items():
        if dd in ds and who in (new, old, "cudnn"):
            cells.setdefault((tokens, dd, causal, N), {})["new" if who == new else who] = x
    Ns = sorted({k[3] for k in cells})
    dims = f"d = {ds[0]}" if one else "d = " + ", ".join(map(str, ds))
    out = [f"bf16 backward, {dims}, on {device07(D, 'device.txt', folder)}, measured in one process "
           f"(`tools/bench/ab.py`, `{rel(path)}`, the median of the rounds): {new_name} ÷ {old_name} (TFLOP/s), "
           f"and in brackets {old_name} and {new_name} × cuDNN; bold: below 1.0.", "",
           "| B·H·N | " + ("" if one else "d | ") + "causal | " + " | ".join(f"N = {n}" for n in Ns) + " |",
           "|---|---|" + ("" if one else "---|") + "---|" * len(Ns)]
    ratios = []
    for tokens, dd, causal in sorted({k[:3] for k in cells}):
        row = []
        for n in Ns:
            m = {w: statistics.median(v) for w, v in cells.get((tokens, dd, causal, n), {}).items()}
            if all(w in m for w in ("new", old, "cudnn")):
                ratios.append(m["new"] / m[old])
                row.append(f"{bold(m['new'] / m[old])} ({bold(m[old] / m['cudnn'])}, {bold(m['new'] / m['cudnn'])})")
            else:
                row.append("—")
        out.append(f"| {tokens} | " + ("" if one else f"{dd} | ") + f"{'yes' if causal else 'no'} | " +
                   " | ".join(row) + " |")
    out += ["", f"{new_name} ÷ {old_name}: {min(ratios):.2f}–{max(ratios):.2f} over the {len(ratios)} shapes."]
    return out


def table_step07_b5(D):
    """Lesson rows b4 and b5 of the backward at d = 64, in the run that introduced b5 (ab/bwd_b5/: production was
    b5)."""
    return table_step07_pair(D, 64, "07b4", "b4", "b5", folder=os.path.join(AB, "bwd_b5"))


def table_step07_b6(D):
    """Lesson rows b5 and b6 of the backward at d = 128, in the run that introduced b6 (ab/bwd_b6/)."""
    return table_step07_pair(D, 128, "07b5", "b5", "b6", folder=os.path.join(AB, "bwd_b6"))


def table_step07_b7(D):
    """Lesson rows b6 and b7 of the backward at d = 64, in the run that introduced b7 (ab/bwd_b7/)."""
    return table_step07_pair(D, 64, "07b6", "b6", "b7", folder=os.path.join(AB, "bwd_b7"))


BWD07_B8_FULL = os.path.join(AB, "bwd_b8", "full")  # the full one-process run that introduced b8 (production then)


def table_step07_b8(D):
    """Lesson rows b7 and b8 of the backward at every d, in the run that introduced b8: the same kernels, the call
    around them."""
    return table_step07_pair(D, (64, 128, 256), "07b7", "b7", "b8", folder=BWD07_B8_FULL)


BWD07_B9_FULL = os.path.join(AB, "bwd_b9", "full")  # the full one-process run that introduced b9 (production then)


def table_step07_b9(D):
    """Lesson rows b8 and b9 of the backward at every d, in the run that introduced b9: the same kernels' tile loop
    on a grid of a block a tile (07b8) and on a persistent grid."""
    return table_step07_pair(D, (64, 128, 256), "07b8", "b8", "b9", folder=BWD07_B9_FULL)


def table_step07_b9_run(D, run, what):
    """b9 ÷ b8 in another run (ab/bwd_b9/`run`/ab07bwd.csv: 07, 07b8 and cuDNN), in one line: the range, the shapes
    below 1.0, and the shapes of each below cuDNN; `what` says which run it is."""
    folder = os.path.join(AB, "bwd_b9", run)
    t = table_step07_pair(D, (64, 128, 256), "07b8", "b8", "b9", folder=folder)
    below = sum(cell.startswith("**") for line in t if line.startswith("| ") and line[2].isdigit()
                for cell in (c.strip() for c in line.split("|")[4:-1]))
    m = ab07bwd_medians(os.path.join(D.folder, folder))
    under = {who: sum(round(m[k[:4] + (who,)] / x, 2) < 1 for k, x in m.items() if k[4] == "cudnn")
             for who in ("07", "07b8")}
    return [f"{t[-1][:-1]} in {what} (`{rel(os.path.join(D.folder, folder))}/ab07bwd.csv`, "
            f"{device07(D, 'device.txt', os.path.join(D.folder, folder))}), below 1.0 in {below} of them; below "
            f"cuDNN there: b8 in {under['07b8']} shapes, b9 in {under['07']}."]


def table_step07_bwd_call(D, run=BWD07_B8, before="07b7", rows=("b7", "b8")):
    """Where one backward call's time goes (`run`/timeline07bwd.csv, tools/bench/timeline.py): for a lesson row
    (`before`: rows[0]), production (07: rows[1]) and cuDNN, the time before the main kernel starts, the main kernel,
    and the time after it ends, µs (medians of 5 calls). By default b7 and b8 (ab/bwd_b8/)."""
    folder = os.path.join(D.folder, run)
    path = os.path.join(folder, "timeline07bwd.csv")
    acts, span = {}, {}
    for r in load(folder, "timeline07bwd.csv"):
        key = (r["impl"], int(r["d"]), r["causal"] == "1", int(r["N"]))
        if r["part"].startswith("kernel"):
            acts.setdefault(key, []).append((float(r["at_us"]), float(r["us"]), r["name"]))
        elif r["part"] == "span":
            span[key] = float(r["us"])
    old, now = rows
    names = {before: old, "07": now, "torch-cudnn": "cuDNN"}
    out = [f"bf16 backward, B·H·N = 131072, on {device07(D, 'device.txt', folder)}: one call's kernels and "
           f"memsets as the GPU ran them (`tools/bench/timeline.py`, a CUPTI trace; `{rel(path)}`), µs, the median "
           "of 5 calls: from the call's first activity to the start of its main kernel (the dK/dV kernel; cuDNN's "
           f"`…flash_bprop…`), the main kernel, and from its end to the call's last activity's end. {now}'s main "
           "kernel starts, and its convert kernel waits, early (launch_early): its main kernel's time counts from "
           "its start.", "",
           "| d | causal | N | " + " | ".join(f"{n}: before, main, after" for n in names.values()) +
           f" | {now} ÷ {old}, the call | {now} ÷ cuDNN, the call |", "|---|---|---|" + "---|" * (len(names) + 2)]
    for d, causal, N in sorted({k[1:] for k in span}):
        cells, calls = [], {}
        for impl in names:
            a = acts.get((impl, d, causal, N))
            if not a:
                cells.append("—")
                continue
            at, us, _ = max(a, key=lambda x: x[1])  # the main kernel: the longest activity
            total = span[(impl, d, causal, N)]
            calls[impl] = total
            cells.append(f"{at:.0f}, {us:.0f}, {total - at - us:.0f}")
        ratio = lambda a, b: bold(calls[b] / calls[a]) if a in calls and b in calls else "—"  # noqa: E731
        out.append(f"| {d} | {'yes' if causal else 'no'} | {N} | " + " | ".join(cells) +
                   f" | {ratio('07', before)} | {ratio('07', 'torch-cudnn')} |")
    out += ["", f"The ratios are of speed (the call's time inverted): below 1.0, {now}'s call takes longer."]
    return out


def table_step07_bwd_vs_cudnn_ncu(D):
    """Step 07's dK/dV kernel beside cuDNN's backward kernel under Nsight Compute (ab/bwd_b8/ncu_l2.csv: ab.py's
    launches profiled, d = 128 and 256, N = 4096, B·H·N = 131072, not causal): the medians of each kernel's
    launches."""
    folder = os.path.join(D.folder, BWD07_B8)
    path = os.path.join(folder, "ncu_l2.csv")
    groups = {}
    for k in ncu_launches(path).values():
        d = 256 if ("wide" in k.name or "x256_" in k.name) else 128
        who = "cuDNN" if k.name.startswith("cudnn") else "step 07"
        groups.setdefault((d, who), []).append(k)
    out = [f"Nsight Compute, bf16 backward, N = 4096, B·H·N = 131072, not causal, on "
           f"{device07(D, 'device.txt', folder)}: "
           f"the main kernel of each, the median of its {min((len(v) for v in groups.values()), default=0)}–"
           f"{max((len(v) for v in groups.values()), default=0)} launches (`{rel(path)}`).", "",
           "| d | kernel | grid | shared memory a block | time | tensor pipe active | L2 throughput | L2 sectors read | "
           "L2 sectors of reductions |", "|---|---|---|---|---|---|---|---|---|"]
    for (d, who), ks in sorted(groups.items()):
        med = lambda m: statistics.median(float(k.metrics[m]) for k in ks)  # noqa: E731
        dims = [int(x) for x in ks[0].grid.strip("()").split(",")]
        blocks = dims[0] * dims[1] * dims[2]
        grid = f"{blocks} (the SM count)" if blocks == 132 else f"{dims[0]} × {dims[1]} = {blocks}"
        out.append(f"| {d} | {who} | {grid} | "
                   f"{med('Dynamic Shared Memory Per Block') / 1024:.0f} KiB | {med('Duration') / 1e6:.2f} ms | "
                   f"{med('sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active'):.0f}% | "
                   f"{med('lts__throughput.avg.pct_of_peak_sustained_elapsed'):.0f}% | "
                   f"{med('lts__t_sectors_op_read.sum') / 1e6:.0f} million | "
                   f"{med('lts__t_sectors_op_red.sum') / 1e6:.0f} million |")
    return out


def table_step07_bwd_b9_issue(D):
    """b9's dK/dV kernel beside cuDNN's backward kernel under Nsight Compute, how each issues its instructions
    (ab/bwd_b9/ncu_issue.csv: ab.py's launches at d = 128, N = 4096, B·H·N = 131072, not causal; the sections
    SpeedOfLight, ComputeWorkloadAnalysis, WarpStateStats): the medians of each kernel's launches."""
    folder = os.path.join(D.folder, AB, "bwd_b9")
    path = os.path.join(folder, "ncu_issue.csv")
    groups = {}
    for k in ncu_launches(path).values():
        groups.setdefault("cuDNN" if k.name.startswith("cudnn") else "step 07 (b9)", []).append(k)
    out = [f"Nsight Compute, bf16 backward, d = 128, N = 4096, B·H·N = 131072, not causal, on "
           f"{device07(D, 'device.txt', folder)}: the main kernel of each, the median of its "
           f"{min((len(v) for v in groups.values()), default=0)} launches (`{rel(path)}`); both grids 132 blocks "
           "of 384 threads.", "",
           "| kernel | time | SM active cycles | instructions issued a cycle (active) | issue slots busy | "
           "warp cycles per issued instruction | L2 throughput |", "|---|---|---|---|---|---|---|"]
    for who, ks in sorted(groups.items()):
        med = lambda m: statistics.median(float(k.metrics[m]) for k in ks)  # noqa: E731
        out.append(f"| {who} | {med('Duration') / 1e6:.2f} ms | {med('SM Active Cycles') / 1e6:.2f} million | "
                   f"{med('Issued Ipc Active'):.2f} | {med('Issue Slots Busy'):.0f}% | "
                   f"{med('Warp Cycles Per Issued Instruction'):.2f} | {med('L2 Cache Throughput'):.0f}% |")
    return out


BWD07_B10 = os.path.join(AB, "bwd_b10")  # the run that introduced b10, and the profiles that led to it
BWD07_B11 = os.path.join(AB, "bwd_b11")  # the run that introduced b11


def table_step07_b10(D):
    """Lesson rows b9 and b10 of the backward at d = 64 and 128 (b10 changed the d ≤ 128 kernel only), in the run
    that introduced b10 (ab/bwd_b10/)."""
    return table_step07_pair(D, (64, 128), "07b9", "b9", "b10", folder=BWD07_B10)


def table_step07_b11(D):
    """Lesson rows b10 and b11 (production then) of the backward at every d, in the full run at b11
    (ab/bwd_b11/full/): b11 differs from b10 at d = 128 only, so the other rows measure the run's own scatter."""
    return table_step07_pair(D, (64, 128, 256), "07b10", "b10", "b11", folder=os.path.join(BWD07_B11, "full"))


BWD07_B12 = os.path.join(AB, "bwd_b12")  # b12's first and second runs, the deterministic mode's, the d = 256 profile


def table_step07_b12(D):
    """Lesson rows b11 and b12 of the backward at every d, in b12's full run (ab/bwd_b12/full/ab07bwd.csv): b12
    differs from b11 at d = 128 only."""
    return table_step07_pair(D, (64, 128, 256), "07b11", "b11", "b12", folder=os.path.join(BWD07_B12, "full"))


def table_step07_b13(D):
    """Lesson row b13 (d = 256's key blocks in clusters of two, measured and removed) beside production then (b12),
    in its one run (ab/bwd_b13/)."""
    return table_step07_pair(D, 256, "07", "production (b12)", "b13", new="07b13", folder=os.path.join(AB, "bwd_b13"))


BWD07_B16 = os.path.join(AB, "bwd_b16")  # b16's run (ab07bwd_b16.csv; production was b16 then, 07)


def b16_before(causal, N):
    """The row that runs b16's tiles in b16's order with the kernel before it (b12's) at d = 256: without the mask
    b12 (head after head, as production), with it b15 or b14, as production's Heaviest::by_wave picks."""
    if not causal:
        return "07b12"
    return "07b15" if last07_taken("bwd", 256, N) else "07b14"


def table_step07_b16(D):
    """b16 (production) ÷ the kernel before it in the same order of tiles (b16_before), d = 256, every shape, with
    both × cuDNN and the deterministic mode's × cuDNN, in b16's run (ab/bwd_b16/ab07bwd_b16.csv)."""
    folder = os.path.join(D.folder, BWD07_B16)
    path = os.path.join(folder, "ab07bwd_b16.csv")
    m = ab07bwd_medians(folder, "ab07bwd_b16.csv")
    Ns = sorted({k[3] for k in m})
    out = [f"bf16 backward, d = 256, on {device07(D, 'device.txt', folder)}, measured in one process "
           f"(`tools/bench/ab.py`, `{rel(path)}`, 3 rounds, the median): b16 ÷ the kernel before it with the same "
           "order of tiles (b12 without the mask; with it b15 at N = 1024 and b14 from 2048, production's orders), and "
           "in brackets that kernel and b16 × cuDNN; bold: below 1.0.", "",
           "| B·H·N | causal | " + " | ".join(f"N = {n}" for n in Ns) + " |", "|---|---|" + "---|" * len(Ns)]
    ratios = []
    for tokens, causal in sorted({(k[0], k[2]) for k in m}):
        row = []
        for n in Ns:
            key = (tokens, 256, causal, n)
            old, new, cu = m.get(key + (b16_before(causal, n),)), m.get(key + ("07",)), m.get(key + ("cudnn",))
            if None in (old, new, cu):
                row.append("—")
                continue
            ratios.append(new / old)
            row.append(f"{bold(new / old)} ({bold(old / cu)}, {bold(new / cu)})")
        out.append(f"| {tokens} | {'yes' if causal else 'no'} | " + " | ".join(row) + " |")
    det = [x / m[k[:4] + ("cudnn",)] for k, x in m.items() if k[4] == "07det"]
    now = [x / m[k[:4] + ("cudnn",)] for k, x in m.items() if k[4] == "07"]
    out += ["", f"b16 ÷ the kernel before it: {min(ratios):.2f}–{max(ratios):.2f} over the {len(ratios)} shapes; "
            f"b16 {min(now):.2f}–{max(now):.2f}× cuDNN; the deterministic mode (b16's kernel, a block a tile) "
            f"{min(det):.2f}–{max(det):.2f}× cuDNN."]
    return out


def table_step07_b16_line(D):
    """README's line for b16: its table's last line (table_step07_b16), with the run's folder."""
    return [table_step07_b16(D)[-1][:-1] + f" (`{rel(os.path.join(D.folder, BWD07_B16))}/ab07bwd_b16.csv`, "
            f"d = 256, N = 1024–32768, causal and not, both B·H·N)."]


FWD07_H9 = os.path.join(AB, "fwd_h9")  # the persistent forward's three runs: first/, second/, and the last (here)


def table_step07_h9(D):
    """Lesson row h9 (the persistent grid) against h7 (a block a tile), in its three runs: the first two timed h9
    beside production then (07: h7 but for the short problems, where h1 ran at d = 64 — N ≤ 1024, or 2048 with the
    mask — and s1 at d = 128, N ≤ 1024), the third beside h7 itself (07h7). The short problems of then apart."""
    runs = [("first", "07", "run 1 (763c6b3: a block takes its next tile as it starts one)"),
            ("second", "07", "run 2 (0db0f79: once it has issued a tile's loads)"),
            ("", "07h7", "run 3 (f2a460f: the same h9)")]
    meds = [(ab07bwd_medians(os.path.join(D.folder, FWD07_H9, sub), "ab07_h9.csv"), old, what)
            for sub, old, what in runs]

    def short_then(d, causal, N):  # where production ran two blocks an SM before h9
        return N <= (2048 if d == 64 and causal else 1024)

    def span(x):
        return f"{bold(min(x))}–{max(x):.2f}" if len(x) > 1 else bold(x[0])

    out = [f"bf16 forward, d = 64 and 128, on {device07(D, 'device.txt', os.path.join(D.folder, FWD07_H9))}, "
           f"three runs of `tools/bench/ab.py` (`{rel(os.path.join(D.folder, FWD07_H9))}/`, each the median of 3 "
           f"rounds): h9 ÷ h7, lowest–highest over the shapes where production ran h7 before h9; over the short "
           f"problems of then (d = 64: N = 1024, and 2048 with the mask; d = 128: N = 1024), h9 ÷ the kernel that ran "
           f"there (runs 1–2: h1 at d = 64, s1 at d = 128; run 3: h7); and h9 × cuDNN in run 3 over every N, "
           f"1024–32768. Bold: below 1.0.", "",
           "| B·H·N | d | causal | " + " | ".join(w for _, _, w in meds) + " | short problems, runs 1 / 2 / 3 | "
           "h9 × cuDNN, run 3 |", "|---|---|---|" + "---|" * (len(meds) + 2)]
    last = meds[-1][0]
    for tokens, d, causal in sorted({k[:3] for k in last if k[4] == "07h9"}):
        cells, short = [], []
        for m, old, _ in meds:
            pairs = [(k[3], x / m[k[:4] + (old,)]) for k, x in m.items() if k[4] == "07h9" and
                     k[:3] == (tokens, d, causal) and k[:4] + (old,) in m]
            cells.append(span([r for N, r in pairs if not short_then(d, causal, N)]))
            short.append(span([r for N, r in pairs if short_then(d, causal, N)]))
        c = [x / last[k[:4] + ("cudnn",)] for k, x in last.items() if k[4] == "07h9" and k[:3] == (tokens, d, causal)]
        out.append(f"| {tokens} | {d} | {'yes' if causal else 'no'} | " + " | ".join(cells) +
                   f" | {' / '.join(short)} | {span(c)} |")
    d256 = os.path.join(D.folder, FWD07_H9, "d256")  # a fourth run, d = 256 only: O staged in the Q tile there
    m = ab07bwd_medians(d256, "ab07_h9.csv")
    lo, hi = ratio_range(m, 256, "07h9", "07h7")
    cu = ratio_range(m, 256, "07h9", "cudnn")
    out += ["", f"At d = 256 (O staged in the Q tile), in a fourth run (`{rel(d256)}/`, "
                f"{open(os.path.join(d256, 'device.txt')).read().split()[-1]}), N = 1024–32768, causal and not, both "
                f"B·H·N: h9 ÷ h7 {lo:.2f}–{hi:.2f}, h9 × cuDNN {cu[0]:.2f}–{cu[1]:.2f}."]
    return out


ORDER07 = os.path.join(AB, "order")  # production's tile order (h10, b14) beside the same kernels head after head


def order07_old(direction, d, N):
    """The lesson row that is production's kernel at a causal shape with its tiles head after head: forward h1
    (d = 64's short problems), h9 (d = 64, 128) or h7 (d = 256); backward b12."""
    if direction == "bwd":
        return "07b12"
    return "07h1" if d == 64 and N <= 2048 else "07h9" if d in (64, 128) else "07h7"


def table_step07_order(D):
    """Production's causal tiles heaviest first across a section of heads (h10, b14) against the same kernels head
    after head, and cuDNN, in one ab.py run (ab/order/: ab07_order.csv, ab07bwd_order.csv)."""
    folder = os.path.join(D.folder, ORDER07)
    runs = {"fwd": ab07bwd_medians(folder, "ab07_order.csv"), "bwd": ab07bwd_medians(folder, "ab07bwd_order.csv")}
    Ns = sorted({k[3] for m in runs.values() for k in m})
    out = [f"bf16, causal, on {device07(D, 'device.txt', folder)}, measured in one process (`tools/bench/ab.py`, "
           f"`{rel(folder)}/`: at each shape every implementation on the same tensors, taking turns, 3 rounds; the "
           "median): the production of that run — h10 and b14, every section heaviest first — ÷ the same kernel with "
           "its tiles head after head (forward: h1 at d = 64 and N ≤ 2048, h9 at d = 64 and 128, h7 at d = 256; "
           "backward: b12), and in brackets the two × cuDNN. Bold: below 1.0.", "",
           "| | B·H·N | d | " + " | ".join(f"N = {n}" for n in Ns) + " |", "|---|---|---|" + "---|" * len(Ns)]
    gain, below = {}, {}
    for direction, m in runs.items():
        for tokens, d in sorted({k[:2] for k in m}):
            cells = []
            for N in Ns:
                k = (tokens, d, 1, N)
                old = order07_old(direction, d, N)
                if k + ("07",) not in m or k + (old,) not in m:
                    cells.append("—")
                    continue
                new, was, cu = m[k + ("07",)], m[k + (old,)], m[k + ("cudnn",)]
                gain.setdefault((direction, d), []).append(new / was)
                below.setdefault(direction, [0, 0, 0])
                below[direction][0] += was < cu
                below[direction][1] += new < cu
                below[direction][2] += 1
                cells.append(f"{new / was:.2f} ({bold(was / cu)} → {bold(new / cu)})")
            out.append(f"| {'forward' if direction == 'fwd' else 'backward'} | {tokens} | {d} | " + " | ".join(cells)
                       + " |")
    out.append("")
    for direction in runs:
        if direction not in below:
            continue
        parts = [f"d = {d}: {min(g):.2f}–{max(g):.2f}" for (dd, d), g in sorted(gain.items()) if dd == direction]
        was, now, n = below[direction]
        out.append(f"{'Forward' if direction == 'fwd' else 'Backward'}, every section heaviest first ÷ head after "
                   f"head: {'; '.join(parts)}. Below cuDNN: {was} of {n} shapes head after head, {now} of {n} with "
                   "the order.")
    det = [x / runs["bwd"][k[:4] + ("07",)] for k, x in runs["bwd"].items() if k[4] == "07det"]
    if det:
        out.append(f"The deterministic mode, in the same order, at {min(det):.2f}–{max(det):.2f}× production's "
                   "speed there.")
    return out


LAST07 = os.path.join(AB, "last")  # the last section's order (h11, b15) beside every section's (h10, b14)


def last07_taken(direction, d, N):
    """Whether production takes the last section's order at a causal shape on the H200 (order_model.by_wave)."""
    return order_model.by_wave(-(-N // order_model.tile_rows(WORD[direction], d, N)))


def table_step07_last(D):
    """The last section's order (h11, b15) and production (Heaviest::by_wave) against every section's (h10, b14), and
    cuDNN, in one ab.py run a direction (ab/last/: ab07_last.csv, ab07bwd_last.csv); the first run (ab/last/first_run/,
    production then every section's) in a line."""
    folder = os.path.join(D.folder, LAST07)
    first = os.path.join(folder, "first_run")
    ids = {"fwd": ("07h11", "07h10"), "bwd": ("07b15", "07b14")}
    runs = {"fwd": ab07bwd_medians(folder, "ab07_last.csv"), "bwd": ab07bwd_medians(folder, "ab07bwd_last.csv")}
    Ns = sorted({k[3] for m in runs.values() for k in m})
    out = [f"bf16, causal, on {device07(D, 'device.txt', folder)}, measured in one process a direction "
           f"(`tools/bench/ab.py`, `{rel(folder)}/`, 3 rounds, the median): the last section's order (h11, b15) ÷ "
           "every section's (h10, b14), and in brackets production × cuDNN; a star where production takes the "
           "last section's order (a head of at most 132 / 8 tiles). Bold: below 1.0.", "",
           "| | B·H·N | d | " + " | ".join(f"N = {n}" for n in Ns) + " |", "|---|---|---|" + "---|" * len(Ns)]
    for direction, m in runs.items():
        last, every = ids[direction]
        for tokens, d in sorted({k[:2] for k in m}):
            cells = []
            for N in Ns:
                k = (tokens, d, True, N)
                star = "*" if last07_taken(direction, d, N) else ""
                cells.append(f"{m[k + (last,)] / m[k + (every,)]:.2f}{star} ({bold(m[k + ('07',)] / m[k + ('cudnn',)])})")
            out.append(f"| {'forward' if direction == 'fwd' else 'backward'} | {tokens} | {d} | " + " | ".join(cells)
                       + " |")
    out.append("")
    old = {"fwd": ab07bwd_medians(first, "ab07_last.csv"), "bwd": ab07bwd_medians(first, "ab07bwd_last.csv")}
    for direction, m in runs.items():
        last, every = ids[direction]
        name = "Forward" if direction == "fwd" else "Backward"
        def span(m, new, base, taken):
            r = [x / m[k[:4] + (base,)] for k, x in m.items()
                 if k[4] == new and last07_taken(direction, k[1], k[3]) == taken and k[:4] + (base,) in m]
            return f"{min(r):.2f}–{max(r):.2f}"
        # In the first run production (07) was every section's order.
        first_last = span(old[direction], last, "07", True), span(old[direction], last, "07", False)
        prod = [x / m[k[:4] + ("cudnn",)] for k, x in m.items() if k[4] == "07"]
        out.append(f"{name}, {last[2:]} ÷ {every[2:]}: {span(m, last, every, True)} where production takes the last "
                   f"section's order, {span(m, last, every, False)} elsewhere (the first run: {first_last[0]} and "
                   f"{first_last[1]}). Production ÷ {every[2:]}: {span(m, '07', every, True)} and "
                   f"{span(m, '07', every, False)}; × cuDNN {min(prod):.2f}–{max(prod):.2f}, below 1.0 in "
                   f"{sum(x < 1 for x in prod)} of {len(prod)} shapes.")
    return out


def ratio_range(m, d, new, old, causal=None, Ns=None):
    """min–max of new ÷ old over one run's medians m at head dimension d (and causal, N if given)."""
    r = [x / m[k[:4] + (old,)] for k, x in m.items() if k[4] == new and k[1] == d and (causal is None or
         k[2] == causal) and (Ns is None or k[3] in Ns) and k[:4] + (old,) in m]
    return min(r), max(r)


def table_step07_b12_runs(D):
    """b12's other two runs, a line each: its first (ab/bwd_b12/first/: a writer per consumer at every d, b10's
    fence move at d = 256 in both rows), and a second run of the kept code (ab/bwd_b12/); and b10 ÷ b9 at d = 256 in
    the full run (ab/ab07bwd.csv), where b10's fence move reached d = 256."""
    out = []
    for folder, what in ((os.path.join(D.folder, BWD07_B12, "first"), "in b12's first run, a writer per consumer at "
                          "every d"), (os.path.join(D.folder, BWD07_B12), "in a second run of the kept code")):
        m = ab07bwd_medians(folder, "ab07bwd_b12.csv")
        parts = [f"{a:.2f}–{b:.2f} at d = {d}" for d in (64, 128, 256) for a, b in [ratio_range(m, d, "07", "07b11")]]
        below = [k for k, x in m.items() if k[4] == "07" and x < m[k[:4] + ("cudnn",)]]
        low = min(x / m[k[:4] + ("cudnn",)] for k, x in m.items() if k[4] == "07")
        out.append(f"- b12 ÷ b11 {what} (`{rel(folder)}/ab07bwd_b12.csv`, {device07(D, 'device.txt', folder)}): "
                   + ", ".join(parts) + f"; step 07 below cuDNN there in {len(below)} of {len({k[:4] for k in m})} "
                   f"shapes (lowest {low:.3f}).")
    full = os.path.join(D.folder, BWD07_B12, "full")
    m = ab07bwd_medians(full)
    a, b = ratio_range(m, 256, "07b10", "07b9")
    out.append(f"- b10 ÷ b9 at d = 256 in b12's full run (`{rel(full)}/ab07bwd.csv`), the fence "
               f"move there: {a:.2f}–{b:.2f} over the 24 shapes.")
    return out


def table_step07_bwd_stalls_d256(D):
    """The d = 256 kernel's warp-state samples beside cuDNN's, with and without the mask, at b11 (the wide kernel
    b9's; ab/bwd_b12/ncu_d256/, one launch each), and the instruction that held the most: the wait for the
    staging slot of a consumer's second dQ piece."""
    folder = os.path.join(D.folder, BWD07_B12, "ncu_d256")
    out = [f"Nsight Compute's warp-state samples, bf16 backward, d = 256, N = 4096, B·H·N = 131072, on "
           f"{device07(D, 'device.txt', os.path.join(D.folder, BWD07_B12, 'first'))}, at commit efb213f (the d = 256 "
           f"kernel b9's): one launch of each kernel (`{rel(folder)}/stalls_*.csv`), the share of its samples by what "
           "the warp was doing.", ""]
    pairs = []
    for causal, name in ((False, "stalls_noncausal.csv"), (True, "stalls_causal.csv")):
        rows = stall_totals(load(folder, name))
        tag = ", causal" if causal else ""
        pairs += [(f"step 07{tag}", rows["dkdv_wide"]), (f"cuDNN{tag}", rows["bprop"])]
    return out + stall_shares(pairs)


def table_step07_det_now(D):
    """The deterministic mode's cost (07det ÷ 07) per d and mask: on the persistent grid (ab/bwd_b12/, every N)
    and on a grid of a block a tile (ab/bwd_b12/det/, N = 1k–8k; ab/bwd_b12/det_long/, N = 16k–32k at B·H·N =
    131072, a run cut short by the device's time: a shape it did not reach is a dash), each in its own run beside
    the default."""
    pers = ab07bwd_medians(os.path.join(D.folder, BWD07_B12), "ab07bwd_b12.csv")
    tile_folder = os.path.join(D.folder, BWD07_B12, "det")
    tile = ab07bwd_medians(tile_folder, "ab07bwd_det.csv")
    long_folder = os.path.join(D.folder, BWD07_B12, "det_long")
    tile_long = ab07bwd_medians(long_folder, "ab07bwd_det.csv")
    after_folder = os.path.join(D.folder, BWD07_B12, "det_long2")  # after b14: N = 16k–32k, both B·H·N
    after_long = ab07bwd_medians(after_folder, "ab07bwd_det.csv")
    order = ab07bwd_medians(os.path.join(D.folder, ORDER07), "ab07bwd_order.csv")  # after b14: causal, every N
    short, long_ = (1024, 2048, 4096, 8192), (16384, 32768)
    out = [f"bf16 backward, B·H·N = 131072 and 524288, on {device07(D, 'device.txt', tile_folder)}: the deterministic "
           f"mode's TFLOP/s ÷ the default's, lowest–highest over both B·H·N, each measured in one process beside the "
           f"default (`{rel(os.path.join(D.folder, BWD07_B12))}/ab07bwd_b12.csv`, persistent grid, at b12's "
           f"kernels; `{rel(tile_folder)}/ab07bwd_det.csv`, a block a tile, the same kernels; "
           f"`{rel(long_folder)}/ab07bwd_det.csv`, a block a tile at N = 16k–32k, B·H·N = 131072 only: that run "
           f"ran out of device time, — where it had not got to). The last two columns after b14, whose causal tiles "
           f"go heaviest first across a section of heads in both modes: `{rel(after_folder)}/ab07bwd_det.csv` "
           f"(N = 16k–32k, both B·H·N) and the causal rows of `{rel(os.path.join(D.folder, ORDER07))}/"
           f"ab07bwd_order.csv` (N = 1k–8k; without the mask b14 changes nothing).", "",
           "| d | causal | persistent grid, N = 1k–8k | a block a tile (kept), N = 1k–8k | persistent grid, N = 16k–32k "
           "| a block a tile (kept), N = 16k–32k | after b14, N = 1k–8k | after b14, N = 16k–32k |",
           "|---|---|---|---|---|---|---|---|"]
    for d in (64, 128, 256):
        for c in (False, True):
            cells = [ratio_range(pers, d, "07det", "07", c, short), ratio_range(tile, d, "07det", "07", c, short),
                     ratio_range(pers, d, "07det", "07", c, long_)]
            for m, Ns in ((tile_long, long_), (order, short), (after_long, long_)):
                try:
                    cells.append(ratio_range(m, d, "07det", "07", c, Ns))
                except ValueError:  # no such shape in that run (cut short, or causal only)
                    cells.append(None)
            out.append(f"| {d} | {'yes' if c else 'no'} | " +
                       " | ".join(f"{x[0]:.2f}–{x[1]:.2f}" if x else "—" for x in cells) + " |")
    return out


def table_step07_b11_first(D):
    """b11's first run (ab/bwd_b11/first/: its dQ pieces a step late at d = 64 too), in one line per d: b11 ÷ b10."""
    folder = os.path.join(D.folder, BWD07_B11, "first")
    m = ab07bwd_medians(folder)
    parts = [f"{a:.2f}–{b:.2f} at d = {d}" for d in (64, 128) for a, b in [ratio_range(m, d, "07", "07b10")]]
    return [f"b11 ÷ b10 in b11's first run, with its dQ pieces a step late at d = 64 as well (`{rel(folder)}/"
            f"ab07bwd.csv`, {device07(D, 'device.txt', folder)}, 24 shapes each): " + ", ".join(parts) + "."]


def table_step07_bwd_stalls_b11(D):
    """b10's and b11's warp-state samples by reason at d = 128, N = 4096 (ab/bwd_b11/stalls_b11.csv, one launch
    each under Nsight Compute's SourceCounters, tools/bench/ncu_stalls.py)."""
    folder = os.path.join(D.folder, BWD07_B11)
    path = os.path.join(folder, "stalls_b11.csv")
    rows = stall_totals(load(folder, "stalls_b11.csv"))
    out = [f"Nsight Compute's warp-state samples, bf16 backward, d = 128, N = 4096, B·H·N = 131072, not causal, on "
           f"{device07(D, 'device.txt', os.path.join(folder, 'first'))}: one launch of each kernel (`{rel(path)}`), "
           "the share of its samples by what the warp was doing.", ""]
    return out + stall_shares([("b10", rows["::b10>"]), ("b11", rows["::b11>"])])


STALL_NAMES = {"stall_long_sb": "long scoreboard", "stall_wait": "fixed wait", "stall_barrier": "barrier",
               "stall_mio": "MIO throttle", "stall_short_sb": "short scoreboard", "stall_math": "math pipe throttle",
               "stall_dispatch": "dispatch", "stall_selected": "issuing", "stall_not_selected": "not selected"}


def stall_totals(rows):
    """{kernel: its "total" row} of an ncu_stalls.py CSV's rows."""
    return {r["kernel"]: r for r in rows if r["address"] == "total"}


def stall_shares(totals):
    """The header and one row a kernel of a table of warp-state samples by reason: `totals` is [(label, the
    kernel's "total" row of an ncu_stalls.py CSV)]."""
    out = ["| kernel | samples | " + " | ".join(STALL_NAMES.values()) + " |", "|---|---|" + "---|" * len(STALL_NAMES)]
    for who, r in totals:
        n = int(r["samples"])
        out.append(f"| {who} | {n} | " + " | ".join(f"{100 * int(r[c]) / n:.1f}%" for c in STALL_NAMES) + " |")
    return out


def table_step07_bwd_stalls(D, top=8):
    """Where b9's and cuDNN's warps wait, from Nsight Compute's stall samples per SASS instruction
    (ab/bwd_b10/stalls_b9.csv, tools/bench/ncu_stalls.py over the source page of one launch each, d = 128, N = 4096,
    B·H·N = 131072, not causal): each kernel's samples by reason, then b9's `top` instructions by samples."""
    folder = os.path.join(D.folder, BWD07_B10)
    path = os.path.join(folder, "stalls_b9.csv")
    rows = load(folder, "stalls_b9.csv")
    totals = stall_totals(rows)
    who = {"dkdv_kernel": "step 07 (b9)", "flash_bprop": "cuDNN"}
    out = [f"Nsight Compute's warp-state samples, bf16 backward, d = 128, N = 4096, B·H·N = 131072, not causal, on "
           f"{device07(D, 'device.txt', folder)}: one launch of each main kernel (`{rel(path)}`, "
           "`tools/bench/ncu_stalls.py`), the share of its samples by what the warp was doing — every warp of the "
           "block, the producer's and dQ's writer's included.", ""]
    out += stall_shares([(who.get(k, k), r) for k, r in totals.items()])
    n = int(totals["dkdv_kernel"]["samples"])
    worst = sorted((r for r in rows if r["kernel"] == "dkdv_kernel" and r["address"] != "total"),
                   key=lambda r: -int(r["samples"]))[:top]
    out += ["", f"b9's {top} instructions with the most samples:", "",
            "| address | SASS | share of the samples | mostly |", "|---|---|---|---|"]
    for r in worst:
        main = max(STALL_NAMES, key=lambda c: int(r[c]))
        out.append(f"| {r['address']} | `{r['sass'].split(',')[0]}` | {100 * int(r['samples']) / n:.1f}% | "
                   f"{STALL_NAMES[main]} |")
    return out


BWD07_PREVIOUS = os.path.join(AB, "bwd_b7")  # the backward's one-process run before b8


def table_step07_bwd_runs(D):
    """The backward's one-process runs before b8 (ab/bwd_b7/) and with it (ab/bwd_b8/full/), shape by shape: how
    far each implementation's TFLOP/s moved between them, per head dimension and mask — step 07's in the same call
    around the same kernels (lesson row b7, 07b7, in the new run: the old run's production)."""
    after = os.path.join(D.folder, BWD07_B8_FULL)
    new, old = ab07bwd_medians(after), ab07bwd_medians(os.path.join(D.folder, BWD07_PREVIOUS))
    out = [f"bf16 backward, B·H·N = 131072 and 524288, N = 1024–32768, on {device07(D, 'device.txt', after)}: "
           f"TFLOP/s in `{rel(after)}/ab07bwd.csv` ÷ TFLOP/s in `{rel(os.path.join(D.folder, BWD07_PREVIOUS))}"
           "/ab07bwd.csv`, two one-process runs on two machines, over the 12 shapes of each row (min–max). Step 07 on "
           "the same dK/dV kernels in the same call in both: lesson row b7 (`07b7`) of the new run against production "
           "of the old (b8 changed production's call; the convert kernel, one for both layouts now, differs).", "",
           "| d | causal | step 07 (same kernels) | cuDNN | FlashAttention-2 |", "|---|---|---|---|---|"]
    for d in (64, 128, 256):
        for c in (False, True):
            cells = []
            for who in ("07", "cudnn", "flash"):
                now = "07b7" if who == "07" else who
                x = [v / old[k[:4] + (who,)] for k, v in new.items()
                     if k[1] == d and k[2] == c and k[4] == now and k[:4] + (who,) in old]
                cells.append(f"{min(x):.2f}–{max(x):.2f}" if x else "—")
            out.append(f"| {d} | {'yes' if c else 'no'} | " + " | ".join(cells) + " |")
    return out


def table_step07_bwd_spin(D):
    """The backward timed behind a 200 µs and a 2000 µs spin, one after the other in one call (ab.sh's host phase:
    ab07bwd_spin200.csv, ab07bwd_spin2000.csv): how far each side moved, and the ratio under each."""
    f = ab_folder(D)
    a, b = (ab07bwd_medians(f, f"ab07bwd_spin{us}.csv") for us in (200, 2000))
    host = ab07bwd_rounds(f, "ab07bwd_spin200.csv", "host_us_max")
    out = [f"bf16 backward, B·H·N = 131072 and 524288, N = 1024–32768, on {device07(D, 'device.txt', f)}, `ab.py` "
           f"twice in one call (`{rel(f)}/ab07bwd_spin200.csv`, `ab07bwd_spin2000.csv`, 3 rounds each): step 07 and "
           "cuDNN behind a spin of 200 µs, then of 2000 µs, before every repeat. Over the 12 shapes of each row "
           "(min–max): each side's TFLOP/s behind 2000 µs ÷ behind 200, the ratio step 07 ÷ cuDNN under each (shapes "
           "below 1.0 in brackets), and the median over a block's repeats of the longest time PyTorch took to "
           "enqueue cuDNN's backward behind the 200 µs spin.", "",
           "| d | causal | step 07, 2000 ÷ 200 | cuDNN, 2000 ÷ 200 | × cuDNN, 200 µs | × cuDNN, 2000 µs | "
           "cuDNN's enqueue, µs |", "|---|---|---|---|---|---|---|"]
    rng = lambda x: f"{min(x):.2f}–{max(x):.2f}"  # noqa: E731
    below = lambda x: sum(round(v, 2) < 1 for v in x)  # noqa: E731
    for d in (64, 128, 256):
        for c in (False, True):
            ks = sorted(k[:4] for k in a if k[1] == d and k[2] == c and k[4] == "07")
            g7 = [b[k + ("07",)] / a[k + ("07",)] for k in ks]
            gc = [b[k + ("cudnn",)] / a[k + ("cudnn",)] for k in ks]
            ra = [a[k + ("07",)] / a[k + ("cudnn",)] for k in ks]
            rb = [b[k + ("07",)] / b[k + ("cudnn",)] for k in ks]
            hs = [statistics.median(host[k + ("cudnn",)]) for k in ks]
            out.append(f"| {d} | {'yes' if c else 'no'} | {rng(g7)} | {rng(gc)} | {rng(ra)} ({below(ra)}) | "
                       f"{rng(rb)} ({below(rb)}) | {min(hs):.0f}–{max(hs):.0f} |")
    return out


def table_step07_det(D):
    rows = load(D.folder, "versions07bwd.csv")
    out = [f"bf16 backward, B·H·N = 131072, on {device07(D)}, one run: TFLOP/s of the default (dQ's pieces added "
           f"as they come) and the deterministic mode (in key-block order), and what the order costs.", "",
           "| d | causal | N | default | deterministic | deterministic ÷ default |", "|---|---|---|---|---|---|"]
    for d in (64, 128, 256):
        for c in (0, 1):
            for N in (2048, 8192):
                a = D.find(rows, step="07", dir="bwd", d=d, causal=c, N=N)
                b = D.find(rows, step="07det", dir="bwd", d=d, causal=c, N=N)
                if a and b:
                    x, y = float(a["tflops"]), float(b["tflops"])
                    out.append(f"| {d} | {'yes' if c else 'no'} | {N} | {x:.0f} | {y:.0f} | {y / x:.2f} |")
    return out


def table_step07_bwd_memory(D):
    rows = load(D.folder, "memory07bwd.csv")
    out = [f"bf16 backward at N = 131072, B·H = 16 (B = 1, H = 16), on {device07(D)}, one timed run each: the "
           f"extra device memory (the workspace each step allocates beside its inputs and outputs) and the time.", "",
           "| d | causal | step 06: workspace | step 06: ms | step 07: workspace | step 07: ms | inputs and outputs |",
           "|---|---|---|---|---|---|---|"]
    for d in (64, 128, 256):
        for c in (0, 1):
            a = D.find(rows, step="06", dir="bwd", d=d, causal=c, N=131072)
            b = D.find(rows, step="07", dir="bwd", d=d, causal=c, N=131072)
            if a and b:
                io = int(a["B"]) * int(a["H"]) * int(a["N"]) * d * 2 * 8  # Q, K, V, O, dO, dQ, dK, dV in 16 bits
                out.append(f"| {d} | {'yes' if c else 'no'} | {fmt_bytes(int(a['scratch_bytes']))} | "
                           f"{float(a['ms']):.0f} | {fmt_bytes(int(b['scratch_bytes']))} | {float(b['ms']):.0f} | "
                           f"{fmt_bytes(io)} |")
    return out


def table_step07_bwd_ncu(D):
    k = {i: x.metrics for i, x in ncu_launches(os.path.join(D.folder, "ncu07bwd.csv")).items()
         if "dkdv_kernel" in x.name or "dkdv_wide_kernel" in x.name}
    # fa_bench --once --versions launches 07 (d = 64, 128, 256), then 07det (the same d), then
    # the lesson rows it has: 07b4 (d = 64 only), 07b5 (d = 128 only), 07b6 (d = 64 only).
    ds = (64, 128, 256) if len(k) >= 6 else (64, 128)
    names = [f"{mode}, d = {d}" for mode in ("default", "deterministic") for d in ds]
    names += ["lesson row b4 (K, V from shared memory), d = 64", "lesson row b5 (64 queries a step), d = 128",
              "lesson row b6 (64 queries a step), d = 64"]
    names = names[:len(k)]
    out = [f"Nsight Compute, one launch each of the dK/dV kernel, bf16, N = 8192, B·H·N = 131072, not causal, "
           f"on {device07(D)}:", "",
           "| kernel | time | tensor pipe active | warps stalled on a barrier | on long scoreboard | "
           "L2 sectors of reductions |", "|---|---|---|---|---|---|"]
    for name, (_, m) in zip(names, sorted(k.items())):
        out.append(f"| {name} | {float(m['gpu__time_duration.sum']) / 1e6:.2f} ms | "
                   f"{float(m['sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active']):.0f}% | "
                   f"{float(m['smsp__warp_issue_stalled_barrier_per_warp_active.pct']):.0f}% | "
                   f"{float(m['smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct']):.0f}% | "
                   f"{float(m['lts__t_sectors_op_red.sum']) / 1e6:.0f} million |")
    return out


# ---- step 08 ---------------------------------------------------------------------------
def device08(D, folder=None):
    return device07(D, "device08.txt", folder)


def shape_who08(r):
    """A decoding CSV row's shape (H, H_kv, N, N_kv, causal) and who it measures ('08', '06', …, 'cudnn', …)."""
    return (tuple(int(r[k]) for k in ("H", "H_kv", "N", "N_kv", "causal")),
            r["step"] if r["impl"] == "fa" else r["impl"].replace("torch-", ""))


def decode08(folder):
    """{shape: {who: row}} and the copy bandwidth of one step 08 run (bench08*.csv, peers08*.csv).
    shape = (H, H_kv, N, N_kv, causal) as ints; who = '08', '06', '08s1', …, 'flash', 'cudnn', …"""
    rows, copy = {}, []
    for name in ("bench08.csv", "bench08_gqa.csv", "peers08.csv", "peers08_gqa.csv"):
        for r in load(folder, name):
            if r["impl"] == "copy":
                copy.append(float(r["gbps"]))
                continue
            if r["status"] != "ok":
                continue
            key, who = shape_who08(r)
            rows.setdefault(key, {})[who] = r
    return rows, (sum(copy) / len(copy) if copy else 0.0)


def decode08_ab(D, folder=None):
    """decode08's {shape: {who: row}} from ab.py's decoding runs (ab/ab08*.csv, or folder's): each row's ms and GB/s
    the median of its rounds."""
    rows = {}
    for path in sorted(glob.glob(os.path.join(folder or ab_folder(D), "ab08*.csv"))):
        for r in csv.DictReader(open(path)):
            if r["status"] != "ok":
                continue
            key, who = shape_who08(r)
            c = rows.setdefault(key, {}).setdefault(who, {"ms": [], "gbps": []})
            c["ms"].append(float(r["ms"]))
            c["gbps"].append(float(r["gbps"]))
    med = statistics.median
    return {k: {w: {"ms": med(c["ms"]), "gbps": med(c["gbps"])} for w, c in r.items()} for k, r in rows.items()}


PEERS08 = ("flash", "cudnn", "efficient", "math")


def best_peer(cells):
    """PyTorch's fastest backend at a shape: (name, ms)."""
    got = [(float(cells[p]["ms"]), p) for p in PEERS08 if p in cells]
    return min(got)[1], min(got)[0]


def order08(key):
    """The decoding tables' order: one K/V head per query head first, then by causal, B·H, N_q, N_kv."""
    H, Hkv, N, Nk, c = key
    return H != Hkv, c, H, N, Nk


def shape08(key):
    H, Hkv, N, Nk, c = key
    return f"{H} | {Hkv if Hkv != H else '—'} | {N} | {Nk // 1024}k | {'yes' if c else 'no'}"


REPEATS08 = ("decode08_rep", "decode08_run3")  # the decode bench rerun in later sessions
# The shipped kernels' decoding runs (ab.sh PHASE=decode's shapes and implementations), each in a GPU call of its own
# on the H200 that call was lent: (folder, commit). The first gives the main tables' absolute figures.
DECODE08_RUNS = [("ab/decode08_03ee74b", "03ee74b"), ("ab/decode08_03ee74b_again", "03ee74b")]


def decode08_runs(D):
    """(name, rows) of the shipped kernels' runs (DECODE08_RUNS: "call 1", …) as decode08_ab gives them, then of
    e092dbc's one-process run (ab/)."""
    calls = [(f"call {i + 1}", os.path.join(D.folder, f)) for i, (f, _) in enumerate(DECODE08_RUNS)]
    return [(name, decode08_ab(D, folder)) for name, folder in calls] + [("e092dbc", decode08_ab(D))]


def vs_peers08(cells, who="08"):
    """who × PyTorch's best at a shape's cells: its fastest backend's time ÷ who's."""
    return best_peer(cells)[1] / float(cells[who]["ms"])


def peers_ratio08(rows, key):
    """PyTorch's best ÷ step 08 at a shape of a run, or None where the run did not time it."""
    c = rows.get(key)
    return vs_peers08(c) if c and "08" in c else None


def decode08_sources(D):
    """Where the decoding tables' runs are, in words."""
    calls = ", ".join(f"`{rel(os.path.join(D.folder, f))}/`" for f, _ in DECODE08_RUNS)
    return (f"the shipped kernels (commit {DECODE08_RUNS[0][1]}) measured in one process (`tools/bench/ab.py`: step "
            f"08, step 06 and PyTorch's backends on the same tensors, taking turns, 3 rounds; the median) in "
            f"{len(DECODE08_RUNS)} GPU calls, each on the H200 that call was lent ({calls}); then the one-process run "
            f"of commit e092dbc, before the ring by TMA (`{rel(ab_folder(D))}/ab08*.csv`), and three earlier runs in "
            f"three sessions that timed step 08 (fa_bench) and PyTorch (peers_decode.py) in two processes "
            f"(`bench08.csv`, `decode08_rep/`, `decode08_run3/`)")


def table_step08_decode(D):
    """Every decoding shape: step 08 against PyTorch's best backend and step 06, and its bandwidth, in the shipped
    kernels' first run; beside it the ratios of their second run, of e092dbc's run and of three two-process runs."""
    first = os.path.join(D.folder, DECODE08_RUNS[0][0])
    (_, rows), *others = decode08_runs(D)
    run1, copy = decode08(D.folder)
    reps = [run1] + [decode08(os.path.join(D.folder, f))[0] for f in REPEATS08]
    out = [f"bf16, d = 128, B = 1, on {device07(D, 'device.txt', first)}: {decode08_sources(D)}. Milliseconds, "
           f"bandwidth and step 06 from the first call. GB/s: the fewest bytes (Q, K, V read once, O and L written) "
           f"over the time, beside this GPU's device-to-device copy, {copy:.0f} GB/s read + written. PyTorch: "
           f"`scaled_dot_product_attention`'s fastest backend at the shape (flash = FlashAttention-2, cudnn, "
           f"efficient). Bold: below 1.0.", "",
           "| B·H | H_kv | N_q | N_kv | causal | step 08 ms | GB/s (× copy) | PyTorch best ms | step 08 × PyTorch | "
           "second call | e092dbc | two processes: runs 1, 2, 3 | step 06 ms | × step 06 |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(rows, key=order08):
        c = rows[key]
        if "08" not in c:
            continue
        ms = c["08"]["ms"]
        who, best = best_peer(c)
        beside = [peers_ratio08(r, key) for _, r in others]
        later = ", ".join(bold(x) if x else "—" for x in (peers_ratio08(r, key) for r in reps))
        s06 = c["06"]["ms"] if "06" in c else 0
        out.append(f"| {shape08(key)} | {ms:.4f} | {c['08']['gbps']:.0f} ({c['08']['gbps'] / copy:.2f}) | "
                   f"{best:.4f} ({who}) | {bold3(best / ms)} | " +
                   " | ".join(bold3(x) if x else "—" for x in beside) + f" | {later} | {s06:.4f} | {s06 / ms:.1f} |")
    return out


GROUPS08 = [("B·H = 128, one query", lambda k: k[0] == k[1] == 128 and k[2] == 1),
            ("B·H = 32, one query", lambda k: k[0] == k[1] == 32 and k[2] == 1),
            ("4 K/V heads", lambda k: k[1] == 4), ("16 K/V heads", lambda k: k[1] == 16),
            ("16 queries", lambda k: k[2] == 16)]


def table_step08_behind(D):
    """Where the summary's one-process runs have step 08 below PyTorch's best: per run and group of shapes, how many,
    the ratios and the µs behind."""
    under = lambda v: f"{v:.3f}" if round(v, 3) < 1 else f"{v:.4f}"  # noqa: E731 (below 1, never "1.000")
    span = lambda lo, hi, f: f(lo) if f(lo) == f(hi) else f"{f(lo)}–{f(hi)}"  # noqa: E731
    out = []
    for name, rows in decode08_runs(D):
        cells = []
        for group, inside in GROUPS08:
            x = [(vs_peers08(c), (c["08"]["ms"] - best_peer(c)[1]) * 1e3, k[3] // 1024)
                 for k, c in rows.items() if inside(k) and "08" in c and best_peer(c)[1] < c["08"]["ms"]]
            if x:
                r, us, nk = zip(*x)
                cells.append(f"{group}, {len(x)} ({', '.join(f'{n}k' for n in sorted(set(nk)))} keys; "
                             f"{span(min(r), max(r), under)}, {span(min(us), max(us), lambda v: f'{v:.1f}')} µs)")
        n = sum(1 for c in rows.values() if "08" in c and best_peer(c)[1] < c["08"]["ms"])
        out.append(f"- {name}: {n} of {sum(1 for c in rows.values() if '08' in c)} shapes: " +
                   ("; ".join(cells) if cells else "none") + ".")
    return out


def table_step08_summary(D):
    """Ranges of step 08's ratios per group of shapes: the shipped kernels' runs, e092dbc's, the two-process runs."""
    first = os.path.join(D.folder, DECODE08_RUNS[0][0])
    ours = decode08_runs(D)
    names, ab = [n for n, _ in ours], ours[0][1]
    run1, copy = decode08(D.folder)
    two = [run1] + [decode08(os.path.join(D.folder, f))[0] for f in REPEATS08]
    out = [f"bf16, d = 128, N_kv = 8k–128k, on {device07(D, 'device.txt', first)}; ratios of time (bold: below 1.0): "
           f"{decode08_sources(D)}; the last three columns from the first call.", "",
           "| B·H | H_kv | N_q | " + " | ".join(f"step 08 × PyTorch's best, {n}" for n in names) +
           " | two processes, runs 1–3 | step 08 × step 06 | step 08 GB/s ÷ copy | step 06 GB/s ÷ copy |",
           "|---|---|---|" + "---|" * len(names) + "---|---|---|---|"]
    def rng(xs, mark=True, places=2):  # (a low end under 1 that rounds to 1 gets a place more: bold3's rule)
        lo, hi = min(xs), max(xs)
        if not (mark and lo < 1):
            return f"{lo:.{places}f}–{hi:.{places}f}"
        low = f"{lo:.{places}f}" if round(lo, places) < 1 else f"{lo:.{places + 1}f}"
        return f"**{low}**–{hi:.{places}f}"
    groups = sorted({(k[0], k[1], k[2]) for k in ab}, key=lambda g: (g[0] != g[1], g[0], g[2]))
    ratios = lambda rows, g: [vs_peers08(c) for k, c in rows.items()  # noqa: E731
                              if (g is None or k[:3] == g) and "08" in c]
    for g in groups:
        cells = [rng(ratios(rows, g), places=3) for _, rows in ours]
        cells.append(rng([x for rows in two for x in ratios(rows, g)]))
        ks = [k for k in ab if k[:3] == g and "08" in ab[k]]
        v06 = [ab[k]["06"]["ms"] / ab[k]["08"]["ms"] for k in ks]
        bw = [ab[k]["08"]["gbps"] / copy for k in ks]
        bw06 = [ab[k]["06"]["gbps"] / copy for k in ks]
        out.append(f"| {g[0]} | {g[1] if g[1] != g[0] else '—'} | {g[2]} | {' | '.join(cells)} | {rng(v06, False)} | "
                   f"{rng(bw, False)} | {rng(bw06, False)} |")
    def below(rows):
        x = ratios(rows, None)
        return (f"{sum(1 for r in x if r < 1)} of {len(x)} shapes ({sum(1 for r in x if r < 0.995)} by more than "
                f"0.5%, {sum(1 for r in x if r < 0.975)} by more than 2.5%; the lowest ratio {min(x):.3f})")
    out += ["", "Step 08 below PyTorch's best (a ratio under 1.000): " +
            "; ".join(f"{n}: {below(rows)}" for n, rows in ours) + "; the two-process runs: " +
            ", ".join(f"{sum(1 for r in ratios(rows, None) if r < 1)}" for rows in two) + " of 40."]
    return out


SPLITS08 = [("08s1", "1"), ("08s2", "2"), ("08s8", "8"), ("08s32", "32"), ("08s128", "128"), ("08", "the plan's"),
            ("08r2", "two-tile ring (RTX 30xx/40xx)")]


def table_step08_splits(D):
    """Time against the split count at the final run's shapes (N_q = 1, not causal)."""
    rows, _ = decode08(D.folder)
    keys = [k for k in sorted(rows, key=lambda k: (k[0], k[3])) if k[0] == k[1] and k[2] == 1 and not k[4]]
    out = [f"Step 08's time in µs by split count (N_q = 1, one K/V head per query head, bf16, d = 128), on "
           f"{device08(D)}, the run of the table above. The plan's own count is read back from its workspace "
           "(splits · B·H·N_q · (d + 1) floats). Last row: the ring of two tiles and the plan for three blocks an SM, "
           "what an RTX 30xx/40xx runs, timed here.", "",
           "| splits | " + " | ".join(f"B·H {k[0]}, {k[3] // 1024}k" for k in keys) + " |", "|---|" + "---|" * len(keys)]
    for who, label in SPLITS08:
        cells = [f"{float(rows[k][who]['ms']) * 1e3:.1f}" if who in rows[k] else "—" for k in keys]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    counts = [max(1, int(rows[k]["08"]["scratch_bytes"]) // (k[0] * k[2] * (128 + 1) * 4)) for k in keys]
    out.append("| (the plan's count) | " + " | ".join(str(n) for n in counts) + " |")
    return out


LESSON08 = [("one thread block per query block: step 06", ".", "06"),
            ("16 packed rows, four warps split each tile, one split", ".", "08s1"),
            ("+ splits, merged by a fold (one thread per 4 columns)", "decode08_fold", "08"),
            ("+ the merge: statistics first, every split weighted", "decode08_merge", "08"),
            ("+ a ring of four tiles (one block an SM, its plan): step 08", ".", "08")]
LESSON08_SHAPES = [(32, 32, 1, 32768, 0), (32, 32, 16, 32768, 0), (128, 128, 1, 32768, 0), (32, 4, 1, 32768, 0),
                   (128, 16, 1, 8192, 0)]


def table_step08_lesson(D):
    """One measured row per idea: µs at a few shapes, and the ratio to PyTorch's best measured in the same run."""
    out = [f"µs (× PyTorch's best backend in the same run), bf16, d = 128, on {device08(D)}; each row is a device run "
           "of its own (its folder), PyTorch measured in it.", "",
           "| what | " + " | ".join(f"B·H {k[0]}{', H_kv ' + str(k[1]) if k[1] != k[0] else ''}, N_q {k[2]}, {k[3] // 1024}k"
                                    for k in LESSON08_SHAPES) + " |", "|---|" + "---|" * len(LESSON08_SHAPES)]
    for what, folder, who in LESSON08:
        rows, _ = decode08(os.path.join(D.folder, folder))
        cells = []
        for k in LESSON08_SHAPES:
            c = rows.get(k, {})
            if who in c:
                cells.append(f"{float(c[who]['ms']) * 1e3:.1f} ({vs_peers08(c, who):.2f})")
            else:
                cells.append("—")
        out.append(f"| {what} | " + " | ".join(cells) + " |")
    return out


MERGE08 = ("ab/two_kernels", "tries/step08_last_block_merge")  # ab.py's runs: the merge kernel; the last block merging


def table_step08_merge(D):
    """Tried and not kept: the splits merged by the last block of each row block, against the merge kernel it
    replaced; two runs of ab.py on two machines, each with PyTorch's best of its own run."""
    old, new = (decode08_ab(D, os.path.join(D.folder, f)) for f in MERGE08)
    keys = [k for k in sorted(new, key=order08)
            if "08" in new[k] and k in old and "08" in old[k]]
    out = [f"µs of step 08 (× PyTorch's best backend in the same run), bf16, d = 128, B = 1, on "
           f"{device07(D, 'device.txt', os.path.join(D.folder, MERGE08[0]))}; two runs of `tools/bench/ab.py` on two "
           f"machines in two sessions (`{rel(os.path.join(D.folder, MERGE08[0]))}/`, "
           f"`{rel(os.path.join(D.folder, MERGE08[1]))}/`), each 3 rounds, the median; the shapes where the last "
           "block's merge moved the time by more than 1%.", "",
           "| B·H | H_kv | N_q | N_kv | causal | merge kernel: µs (× PyTorch) | last block merges: µs (× PyTorch) | "
           "time, last block ÷ merge kernel |", "|---|---|---|---|---|---|---|---|"]
    ratios = []
    for k in keys:
        a, b = old[k]["08"]["ms"], new[k]["08"]["ms"]
        ratios.append((k, b / a))
        if abs(b / a - 1) > 0.01:
            out.append(f"| {shape08(k)} | {a * 1e3:.1f} ({vs_peers08(old[k]):.2f}) | {b * 1e3:.1f} "
                       f"({vs_peers08(new[k]):.2f}) | {b / a:.2f} |")
    g = [r for k, r in ratios if k[0] != k[1]]
    f = [r for k, r in ratios if k[0] == k[1]]
    out += ["", f"Over all {len(ratios)} shapes the last block's merge took {min(f):.2f}–{max(f):.2f}× the merge "
                f"kernel's time with one K/V head per query head and {min(g):.2f}–{max(g):.2f}× with grouped heads."]
    return out


def rounds08(folder):
    """How many rounds an ab.py run in `folder` timed (its ab08*.csv)."""
    return 1 + max(int(r["round"]) for path in glob.glob(os.path.join(folder, "ab08*.csv")) for r in csv.DictReader(open(path)))


def faster_slower08(r, pct=1):
    """How many of the time ratios r (a version ÷ the one it is set beside) are faster and slower by more than pct%,
    as the last lines of note 08's tables say it."""
    return (f"faster by more than {pct:g}% in {sum(1 for x in r if x < 1 - pct / 100)}, slower by more than {pct:g}% "
            f"in {sum(1 for x in r if x > 1 + pct / 100)}")


def step08_versions(D, folder, a, versions, both, head_a, rows=None):
    """Versions of step 08 in one ab.py run (`folder`) beside version a, at every decoding shape all were timed at: the
    table's caption and rows (µs, × PyTorch's best backend, and for each (b, head_b, ratio_head) of `versions` time
    b ÷ a), and those ratios by version and shape. rows: the run's decode08_ab, where the caller has read it."""
    rows = rows or decode08_ab(D, folder)
    bs = [b for b, _, _ in versions]
    keys = [k for k in sorted(rows, key=order08) if all(w in rows[k] for w in [a] + bs)]
    heads = " | ".join(f"{head_b} | {ratio_head}" for _, head_b, ratio_head in versions)
    out = [f"µs of step 08 (× PyTorch's best backend), bf16, d = 128, B = 1, on "
           f"{device07(D, 'device.txt', folder)}, measured in one process (`tools/bench/ab.py`, "
           f"`{rel(folder)}/ab08*.csv`: {both} and PyTorch on the same tensors, taking turns, {rounds08(folder)} rounds; "
           "the median).",
           "", f"| B·H | H_kv | N_q | N_kv | causal | {head_a} | {heads} |",
           "|---|---|---|---|---|---|" + "---|---|" * len(versions)]
    ratio = {b: {k: rows[k][b]["ms"] / rows[k][a]["ms"] for k in keys} for b in bs}
    for k in keys:
        ta, best = rows[k][a]["ms"], best_peer(rows[k])[1]
        cells = [f"{ta * 1e3:.1f} ({best / ta:.2f})"]
        cells += [f"{rows[k][b]['ms'] * 1e3:.1f} ({best / rows[k][b]['ms']:.2f}) | {ratio[b][k]:.3f}" for b in bs]
        out.append(f"| {shape08(k)} | {' | '.join(cells)} |")
    return out, ratio


def step08_pair(D, folder, a, b, both, head_a, head_b, ratio_head):
    """step08_versions with one version b beside a: the table, and time b ÷ a by shape."""
    out, ratio = step08_versions(D, folder, a, [(b, head_b, ratio_head)], both, head_a)
    return out, ratio[b]


def table_step08_early(D):
    """The merge kernel launched early (programmatic dependent launch; 08g1, waiting for the whole split kernel)
    against launched after the splits (08m1): both in one ab.py run, at every decoding shape."""
    out, ratio = step08_pair(D, ab_folder(D), "08m1", "08g1", "both launches", "merge launched after the splits (m1)",
                             "launched early (g1)", "time, early ÷ after")
    r = list(ratio.values())
    g = [x for k, x in ratio.items() if k[0] != k[1]]
    out += ["", f"Early ÷ after: {min(r):.3f}–{max(r):.3f} over the {len(r)} shapes; {min(g):.3f}–{max(g):.3f} with "
                f"grouped heads; {sum(1 for x in r if x < 0.99)} shapes gain more than 1%."]
    return out


CLUSTER08_FIT = "tries/step08_cluster_every_fit"  # ab.py's run at a1e2fc6: "08" merged in clusters wherever they fit
CLUSTER08 = "ab/cluster"  # ab.py's run at 726680d: production (clusters for chunks of at most 64 tiles) beside m2


def table_step08_cluster(D):
    """The merge in a cluster beside the merge kernel (08m2) at the shapes where the H200's clusters fit: run 1 merged
    in clusters wherever they fit (a1e2fc6), run 2 is production, which merges in clusters only where a chunk is at
    most 64 tiles (726680d); each an ab.py run of its own."""
    runs = [decode08_ab(D, os.path.join(D.folder, f)) for f in (CLUSTER08_FIT, CLUSTER08)]
    keys = sorted(set(runs[0]) & set(runs[1]), key=order08)
    out = [f"µs of step 08 (× PyTorch's best backend in the same run), bf16, d = 128, B = 1, on "
           f"{device07(D, 'device.txt', os.path.join(D.folder, CLUSTER08))}; two runs of `tools/bench/ab.py` "
           f"(`{rel(os.path.join(D.folder, CLUSTER08_FIT))}/`, `{rel(os.path.join(D.folder, CLUSTER08))}/`), each with "
           f"both merges and PyTorch on the same tensors, taking turns, 3 rounds; the median. Run 1: the units' parts "
           f"merged in clusters wherever all the clusters fit; run 2: production, in clusters only where a chunk is "
           f"at most 64 tiles (the same kernel as m2 elsewhere).", "",
           "| B·H | H_kv | N_q | N_kv | causal | run 1: merge kernel (m2) | clusters wherever they fit | ÷ m2 "
           "| run 2: merge kernel (m2) | production | ÷ m2 |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios = [[], []]
    for k in keys:
        cells = []
        for i, run in enumerate(runs):
            m2, prod, best = run[k]["08m2"]["ms"], run[k]["08"]["ms"], best_peer(run[k])[1]
            ratios[i].append(prod / m2)
            cells.append(f"{m2 * 1e3:.1f} ({best / m2:.2f}) | {prod * 1e3:.1f} ({best / prod:.2f}) | {prod / m2:.3f}")
        out.append(f"| {shape08(k)} | {' | '.join(cells)} |")
    out.append("")
    for name, r in zip(("Clusters wherever they fit", "Production"), ratios):
        out.append(f"{name} ÷ m2: {min(r):.3f}–{max(r):.3f} over the {len(r)} shapes; {faster_slower08(r)}.")
    return out


SHARED08 = "tries/step08_shared_every_shape"  # ab.py's run at dd6fe6f: "08" shared the tiles at every shape (k1)
STREAM08 = "ab/stream"  # ab.py's run at 5587fd5: production beside w1


def step08_vs_w1(D, folder, head, ratio_head, summary):
    """A cut of step 08 ("08" in an ab.py run in `folder`) beside whole units' splits (08w1), every decoding shape;
    `summary` turns the ratios, time ÷ w1's, into the table's last line."""
    out, ratio = step08_pair(D, os.path.join(D.folder, folder), "08w1", "08", "both cuts", "whole units' splits (w1)",
                             head, ratio_head)
    return out + ["", summary(list(ratio.values()))]


def table_step08_shared(D):
    """The tiles shared by a wave of blocks at every shape (k1: production at dd6fe6f, "08" in that run) beside w1."""
    return step08_vs_w1(D, SHARED08, "shared at every shape (k1)", "time, k1 ÷ w1", lambda r: (
        f"k1 ÷ w1: {min(r):.3f}–{max(r):.3f} over the {len(r)} shapes; {faster_slower08(r)}."))


def table_step08_stream(D):
    """Production (the tiles shared only where whole units' splits cut the units already and leave SMs idle) beside
    w1."""
    return step08_vs_w1(D, STREAM08, "production", "time, production ÷ w1", lambda r: (
        f"Production ÷ w1: {min(r):.3f}–{max(r):.3f} over the {len(r)} shapes (the two are the same cut wherever "
        f"production does not share)."))


RING08 = "tries/step08_ring6"  # ab.py's run of lesson row r6 (a ring of six tiles) beside production


def table_step08_ring(D):
    """Lesson row r6, a ring of six K/V tiles at d = 128, beside production's four: one ab.py run, every decoding
    shape without the mask."""
    out, ratio = step08_pair(D, os.path.join(D.folder, RING08), "08", "08r6", "both rings", "four tiles (production)",
                             "six tiles (r6)", "time, six ÷ four")
    r = list(ratio.values())
    g = [x for k, x in ratio.items() if k[0] != k[1]]
    out += ["", f"Six ÷ four: {min(r):.3f}–{max(r):.3f} over the {len(r)} shapes ({min(g):.3f}–{max(g):.3f} with "
                f"grouped heads); {faster_slower08(r)}."]
    return out


HINT08 = "tries/step08_l2_evict_first"  # ab.py's run at 84ab163: "08" = the K/V reads without a hint, 08l1 = evict-first
HINT08_BOUND_MIB = 3 * 60  # the rule's bound on the H200: kEvictFirstL2s (3) times its L2 (62914560 bytes, 60 MiB)


def kv_mib08(key, d=128):
    """K and V of a decoding shape (B = 1, 16-bit), in MiB."""
    H, Hkv, N, Nk, c = key
    return 2 * Hkv * Nk * d * 2 / 2**20


def table_step08_hint(D):
    """The K/V reads evict-first in the L2: run 1 (84ab163) times them at every shape (08l1) beside the reads without a
    hint (then production, "08"); run 2 (ab/, the final kernels) times production, which hints where K and V are at
    most 3 L2s, beside the reads without a hint at every shape (08l0)."""
    f1, f2 = os.path.join(D.folder, HINT08), ab_folder(D)
    r1, r2 = decode08_ab(D, f1), decode08_ab(D, f2)
    keys = [k for k in sorted(r1, key=order08) if k in r2 and "08l0" in r2[k]]
    out = [f"µs of step 08 (× PyTorch's best backend in the same run), bf16, d = 128, B = 1, on "
           f"{device07(D, 'device.txt', f1)}; two runs of `tools/bench/ab.py`: run 1 "
           f"(`{rel(f1)}/`, {rounds08(f1)} rounds) the K/V reads as any load beside evict-first at every shape (l1); "
           f"run 2 (`{rel(f2)}/ab08*.csv`, {rounds08(f2)} rounds) production, evict-first where K and V are at most "
           f"three L2s ({HINT08_BOUND_MIB} MiB), beside no hint at every shape (l0); the median.", "",
           "| B·H | H_kv | N_q | N_kv | causal | K and V, MiB | production hints | run 1: as any load | evict-first (l1) "
           "| l1 ÷ any load | run 2: no hint (l0) | production | production ÷ l0 |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    small, large, prod_small, prod_large = [], [], [], []
    for k in keys:
        a, b, best1 = r1[k]["08"]["ms"], r1[k]["08l1"]["ms"], best_peer(r1[k])[1]
        c, p, best2 = r2[k]["08l0"]["ms"], r2[k]["08"]["ms"], best_peer(r2[k])[1]
        hinted = kv_mib08(k) <= HINT08_BOUND_MIB
        (small if hinted else large).append(b / a)
        (prod_small if hinted else prod_large).append(p / c)
        out.append(f"| {shape08(k)} | {kv_mib08(k):.0f} | {'yes' if hinted else 'no'} | {a * 1e3:.1f} ({best1 / a:.2f}) "
                   f"| {b * 1e3:.1f} ({best1 / b:.2f}) | {b / a:.3f} | {c * 1e3:.1f} ({best2 / c:.2f}) | {p * 1e3:.1f} "
                   f"({best2 / p:.2f}) | {p / c:.3f} |")
    out += ["", f"Evict-first ÷ as any load (run 1): {min(small):.3f}–{max(small):.3f} at the {len(small)} shapes with "
                f"K and V of at most {HINT08_BOUND_MIB} MiB, {min(large):.3f}–{max(large):.3f} at the {len(large)} "
                f"larger ones. Production ÷ l0 (run 2): {min(prod_small):.3f}–{max(prod_small):.3f} where it hints, "
                f"{min(prod_large):.3f}–{max(prod_large):.3f} where it does not (the same kernel: the run's noise)."]
    return out


# fa_bench --decode --versions runs step 08's rows in steps_table's order; for each row and shape, two untimed calls
# and one timed call, the L2 flushed (dirty) before the timed one.
HINT08_NCU_ROWS = ("08", "08s1", "08s2", "08s8", "08s32", "08s128", "08r2", "08m1", "08m2", "08r6", "08w1", "08k1",
                   "08l0", "08l1")
HINT08_NCU_SHAPES = ((128, 128, 1, 8192, 0), (128, 16, 1, 8192, 0))


def ncu_rows08(path):
    """{launch ID: {metric: (value, unit)}, 'kernel': name, …} of an ncu --csv file (metrics or a details page)."""
    got = {}
    for r in csv.DictReader(x for x in open(path) if x.startswith('"')):
        if r["ID"] == "ID":
            continue
        c = got.setdefault((r["Process Name"], int(r["ID"])), {"kernel": r["Kernel Name"]})
        c[r["Metric Name"]] = float(r["Metric Value"].replace(",", "")) if r["Metric Value"][:1].isdigit() else 0.0
    return got


def table_step08_hint_ncu(D):
    """What the split kernel moves to and from DRAM with and without the hint: Nsight Compute (cache control none, so
    that the L2 holds the timer's flush as it does in the timed runs) on fa_bench's timed call of l0 and l1."""
    path = os.path.join(D.folder, HINT08, "ncu_hint.csv")
    got = {launch: m for (_, launch), m in ncu_rows08(path).items()}  # one process: its launches by ID
    per_row = 3 * len(HINT08_NCU_SHAPES)
    assert len(got) == per_row * len(HINT08_NCU_ROWS), "one split kernel launch per call"
    out = [f"The split kernel's timed call (Nsight Compute, `--cache-control none`, `{rel(path)}`), bf16, d = 128, "
           f"N_q = 1, 8k keys, on {device07(D, 'device.txt', os.path.join(D.folder, HINT08))}.", "",
           "| B·H | H_kv | K and V, MiB | reads | µs | DRAM read, MB | DRAM written, MB |", "|---|---|---|---|---|---|---|"]
    for j, k in enumerate(HINT08_NCU_SHAPES):
        for who, what in (("08l0", "as any load (l0)"), ("08l1", "evict-first (l1)")):
            m = got[HINT08_NCU_ROWS.index(who) * per_row + 3 * j + 2]
            out.append(f"| {k[0]} | {k[1] if k[1] != k[0] else '—'} | {kv_mib08(k):.0f} | {what} | "
                       f"{m['gpu__time_duration.sum'] / 1e3:.1f} | {m['dram__bytes_read.sum'] / 1e6:.1f} | "
                       f"{m['dram__bytes_write.sum'] / 1e6:.1f} |")
    return out


NCU08 = "tries/step08_ncu_long"  # Nsight Compute at the long streams: launches, and the split kernel before/after
DIET08_BEFORE = "tries/step08_pairs"  # ab.py's run at dd02286 ("08": the split kernel before its tile was trimmed)
DIET08_AFTER = "ab/trim"  # ab.py's decode run at d115a3a, the tile trimmed (ab/ before the two chains)
NCU08_TILES = 32768 // 64  # the profiled shape's 64-key tiles a head (B·H = 128, N_q = 1, 32k keys)
NCU08_WARPS = 128 * 4  # its warps: 128 blocks of four, step 08's and cuDNN's alike (the launches table)


def kernel08(name):
    """A short name for a kernel of the decoding profiles."""
    for part, short in (("flash_fwd_splitkv_combine", "FlashAttention-2 splitkv_combine"),
                        ("flash_fwd_splitkv_kernel", "FlashAttention-2 splitkv_kernel"),
                        ("split_kernel", "step 08 split_kernel"), ("combine_kernel", "step 08 combine_kernel"),
                        ("sdpa_sm80_flash_fprop_wmma", "cuDNN sdpa_sm80_flash_fprop_wmma (16×128×128 tiles)"),
                        ("lean_reduction", "cuDNN lean_reduction_kernel")):
        if part in name:
            return short
    return name[:40]


def table_step08_ncu_launch(D):
    """How step 08, cuDNN and FlashAttention-2 cut the long decoding streams: Nsight Compute on each attention kernel
    launch (tools/device/ncu_decode.sh, cache control none: the L2 as the timed runs leave it)."""
    folder = os.path.join(D.folder, NCU08, "launches")
    out = [f"Every attention kernel launch of `tools/device/ncu_decode.sh` (Nsight Compute, `--cache-control none`; "
           f"`{rel(folder)}/`), bf16, d = 128, N_q = 1, B = 1, on {device07(D, 'device.txt', os.path.join(D.folder, NCU08))}"
           f": each kernel's launch and, over its launches, the time and the DRAM bandwidth as a share of the peak "
           f"(least–most). Step 08 as it was before its tile was trimmed (a138fc6: 128 registers).", "",
           "| B·H, N_kv | kernel | launches | grid × block | registers | shared memory, KiB | µs | DRAM, % of peak |",
           "|---|---|---|---|---|---|---|---|"]
    for path in sorted(glob.glob(os.path.join(folder, "ncu_decode_*.csv")), key=lambda p: [int(x) for x in
                                                                                              re.findall(r"\d+", p)]):
        bh, _g, _nq, nk = (int(x) for x in re.findall(r"_(\d+)", os.path.basename(path)))
        kernels = {}
        for m in ncu_rows08(path).values():
            kernels.setdefault(kernel08(m["kernel"]), []).append(m)
        for name, ms in kernels.items():
            m = ms[0]
            t = [x["gpu__time_duration.sum"] / 1e3 for x in ms]
            pct = [x["dram__throughput.avg.pct_of_peak_sustained_elapsed"] for x in ms]
            smem = (m["launch__shared_mem_per_block_dynamic"] + m["launch__shared_mem_per_block_static"]) / 1024
            out.append(f"| {bh}, {nk // 1024}k | {name} | {len(ms)} | {m['launch__grid_size']:.0f} × "
                       f"{m['launch__block_size']:.0f} | {m['launch__registers_per_thread']:.0f} | {smem:.1f} | "
                       f"{min(t):.1f}–{max(t):.1f} | {min(pct):.1f}–{max(pct):.1f} |")
    return out


def stalls08(path):
    """The total row of tools/bench/ncu_stalls.py's CSV: samples, instructions executed and samples by reason."""
    row = next(r for r in csv.DictReader(open(path)) if r["address"] == "total")
    return {k: float(v) for k, v in row.items() if k not in ("kernel", "address", "sass")}


def details08(path):
    """{metric name: value} of an ncu details page (one launch)."""
    (launch,) = ncu_rows08(path).values()
    return launch


def table_step08_ncu_tile(D):
    """The split kernel's tile before and after it was trimmed, beside cuDNN's kernel, at one long stream: Nsight
    Compute's details page (time, DRAM throughput) and its source counters (instructions, where the warps wait)."""
    f = os.path.join(D.folder, NCU08)
    rows = [("step 08 before (dd02286)", "details_before.csv", "stalls_before.csv"),
            ("cuDNN, the same call", "details_cudnn_run1.csv", "stalls_cudnn_run1.csv"),
            ("step 08 after (d115a3a)", "details_after.csv", "stalls_after.csv"),
            ("cuDNN, the same call", "details_cudnn_run2.csv", "stalls_cudnn_run2.csv")]
    out = [f"Nsight Compute (`tools/device/ncu_decode.sh` with DETAIL=1: the second launch, its own cache control; "
           f"`{rel(f)}/`), B·H = 128, N_q = 1, 32k keys (2 GiB of K and V), bf16, d = 128, on "
           f"{device07(D, 'device.txt', os.path.join(D.folder, NCU08))}; two calls of the script, each profiling step 08 "
           f"and then cuDNN. Instructions: executed by a warp per 64 keys ({NCU08_WARPS} warps, {NCU08_TILES} tiles of "
           f"64 keys a head: one each); the stalls: the share of the warps' samples (`tools/bench/ncu_stalls.py`) "
           f"waiting on a long scoreboard (the tiles' copies), at the barrier (for the other warps), on a fixed "
           f"latency (one instruction's result) and issuing.", "",
           "| kernel | µs | DRAM, % of peak | instructions a warp per 64 keys | long scoreboard | barrier | "
           "fixed latency | issuing |", "|---|---|---|---|---|---|---|---|"]
    for name, det, st in rows:
        d, s = details08(os.path.join(f, det)), stalls08(os.path.join(f, st))
        share = lambda k: f"{100 * s[k] / s['samples']:.0f}%"
        out.append(f"| {name} | {d['Duration']:.1f} | {d['DRAM Throughput']:.1f} | "
                   f"{s['executed'] / NCU08_WARPS / NCU08_TILES:.0f} | {share('stall_long_sb')} | "
                   f"{share('stall_barrier')} | {share('stall_wait')} | {share('stall_selected')} |")
    return out


def table_step08_diet(D):
    """Production before the tile was trimmed (dd02286, "08" of the pairs run) and after (the decode run), each
    against PyTorch's best backend in its own run: two runs on two machines of one session."""
    f0, f1 = os.path.join(D.folder, DIET08_BEFORE), os.path.join(D.folder, DIET08_AFTER)
    r0, r1 = decode08_ab(D, f0), decode08_ab(D, f1)
    keys = [k for k in sorted(r0, key=order08) if k in r1]
    out = [f"µs of step 08 (× PyTorch's best backend in the same run), bf16, d = 128, B = 1, on "
           f"{device07(D, 'device.txt', f0)}; two runs of `tools/bench/ab.py` in one session, on two machines: "
           f"before (`{rel(f0)}/`, {rounds08(f0)} rounds) and after (`{rel(f1)}/ab08*.csv`, "
           f"{rounds08(f1)} rounds) the tile was trimmed; the median. The machines differ, so compare the "
           f"ratios in brackets, each against PyTorch in its own run.", "",
           "| B·H | H_kv | N_q | N_kv | causal | before | after |", "|---|---|---|---|---|---|---|"]
    before, after = [], []
    for k in keys:
        a, b = r0[k]["08"]["ms"], r1[k]["08"]["ms"]
        x, y = vs_peers08(r0[k]), vs_peers08(r1[k])
        before.append(x), after.append(y)
        out.append(f"| {shape08(k)} | {a * 1e3:.1f} ({x:.3f}) | {b * 1e3:.1f} ({y:.3f}) |")
    out += ["", f"Step 08 ÷ PyTorch's best (speed): before {min(before):.3f}–{max(before):.3f}, below 1.000 at "
                f"{sum(1 for x in before if x < 1)} of {len(keys)} shapes; after {min(after):.3f}–{max(after):.3f}, "
                f"below at {sum(1 for x in after if x < 1)}. The ratio's change, after − before, by group:"]
    groups = (("B·H = 128, one K/V head a query head", lambda k: k[0] == 128 and k[1] == 128),
              ("B·H = 32, 16 queries", lambda k: k[0] == 32 and k[1] == 32 and k[2] == 16),
              ("B·H = 32, one query", lambda k: k[0] == 32 and k[1] == 32 and k[2] == 1),
              ("grouped heads", lambda k: k[0] != k[1]))
    for name, inside in groups:
        dx = [y - x for k, x, y in zip(keys, before, after) if inside(k)]
        out.append(f"- {name}: {min(dx):+.3f} to {max(dx):+.3f} ({len(dx)} shapes)")
    return out


def table_step08_pairs(D):
    """Lesson rows p4 and p6 (the ring's tiles copied two at a time: four tiles, six) beside production: one ab.py run
    (dd02286, production's tile before it was trimmed), every decoding shape."""
    out, ratios = step08_versions(D, os.path.join(D.folder, DIET08_BEFORE), "08",
                                  [("08p4", "two, four tiles (p4)", "p4 ÷ production"),
                                   ("08p6", "two, six tiles (p6)", "p6 ÷ production")],
                                  "the three", "one tile a copy (production)")
    out.append("")
    for w, by_shape in ratios.items():
        r = list(by_shape.values())
        out.append(f"{w[2:]} ÷ production: {min(r):.3f}–{max(r):.3f} over the {len(r)} shapes; {faster_slower08(r)}.")
    return out


CHAINS08 = "ab/chains"  # ab.py's run at 5890d01: "08" (S in two accumulator chains) beside 192cc2e ("08@base", --alt)


def table_step08_chains(D):
    """S's k steps in two accumulator chains (5890d01, "08") beside one chain (192cc2e, "08@base": ab.py --alt, the
    other build in the same process), every decoding shape."""
    out, ratio = step08_pair(D, os.path.join(D.folder, CHAINS08), "08@base", "08", "both builds",
                             "one chain (192cc2e)", "two chains (5890d01)", "time, two ÷ one")
    r = list(ratio.values())
    out += ["", f"Two chains ÷ one: {min(r):.3f}–{max(r):.3f} over the {len(r)} shapes, geometric mean "
                f"{statistics.geometric_mean(r):.4f}; {faster_slower08(r, 0.5)}."]
    return out


LOADS08 = "tries/step08_merge_loads_first/same_process"  # ab.py: 192cc2e beside it with the merge's O loads first


def table_step08_loads_first(D):
    """The merge kernel's O loads issued before the statistics (two a lane; "08@pf") beside 192cc2e ("08@base"), one
    process: one line, the time ratio at the shapes the merge kernel runs and at the others."""
    folder = os.path.join(D.folder, LOADS08)
    rows = decode08_ab(D, folder)
    r = {k: c["08@pf"]["ms"] / c["08@base"]["ms"] for k, c in rows.items() if "08@pf" in c and "08@base" in c}
    merged = [x for k, x in r.items() if k[0] == 32 or k[0] != k[1]]  # B·H = 32 and grouped heads: a merge kernel
    alone = [x for k, x in r.items() if not (k[0] == 32 or k[0] != k[1])]
    return [f"The O loads first ÷ 192cc2e, in one process (`{rel(folder)}/`, {rounds08(folder)} rounds, on "
            f"{device07(D, 'device.txt', folder)}): {min(merged):.3f}–{max(merged):.3f} at the {len(merged)} shapes "
            f"the merge kernel runs (geometric mean {statistics.geometric_mean(merged):.3f}), "
            f"{min(alone):.3f}–{max(alone):.3f} at the {len(alone)} where it does not (the same kernels: the run's "
            f"noise)."]


RING3_08 = "tries/step08_ring3_two_blocks"  # ab.py: 5890d01 beside it with a ring of three tiles, two blocks an SM


def table_step08_ring3(D):
    """A ring of three tiles at d = 128, two blocks an SM and the plan for that occupancy ("08@x"), beside production
    (5890d01, "08"): one process, the shapes without the mask."""
    out, ratio = step08_pair(D, os.path.join(D.folder, RING3_08), "08", "08@x", "both builds",
                             "four tiles, one block an SM (production)", "three tiles, two blocks an SM",
                             "time, ÷ production")
    r = list(ratio.values())
    out += ["", f"Three tiles, two blocks ÷ production: {min(r):.3f}–{max(r):.3f} over the {len(r)} shapes; "
                f"{faster_slower08(r, 0.5)}."]
    return out


FLOOR08 = "ab/floor"  # ab.sh PHASE=decode,floor in one call: step 08 and PyTorch (ab08*.csv), the floor (floor.csv)


def floor08(folder, work_ns=0):
    """{(B·H_kv, N_kv): {(cut, ring, blocks, chunk_tiles, cluster, lead_pct): row}} of fa_read_floor's CSV in `folder`
    (cluster 1 and lead_pct 0 where the CSV has no such column: runs before the clustered and the tail cuts): the rows
    read with `work_ns` of stand-in math a tile (--work-ns; 0 where the CSV has no such column: runs before it)."""
    out = {}
    for r in load(folder, "floor.csv"):
        if int(r.get("work_ns", 0)) != work_ns:
            continue
        cut = (r["cut"], int(r["ring"]), int(r["blocks"]), int(r["chunk_tiles"]), int(r.get("cluster", 1)),
               int(r.get("lead_pct", 0)))
        out.setdefault((int(r["bh_kv"]), int(r["n_kv"])), {})[cut] = r
    return out


def floor_sms(folder):
    """The SMs of the GPU of a floor run (its counter cut runs one block an SM)."""
    return next(int(r["blocks"]) for r in load(folder, "floor.csv") if r["cut"] == "flow")


FLOOR_CUT08 = ("static", 4, 128, 0, 1, 0)  # step 08's copy, ring and cut at its decoding shapes: the floor of the table


def over_floor08(D):
    """The floor run's decoding shapes in the tables' order: (shape, floor's row, floor ms, step 08 ms, PyTorch's
    best backend, its ms), where both step 08 and the floor were timed."""
    folder = os.path.join(D.folder, FLOOR08)
    rows = decode08_ab(D, folder)
    floor = floor08(folder)
    out = []
    for key in sorted(rows, key=order08):
        f = floor.get((key[1], key[3]), {}).get(FLOOR_CUT08)
        if "08" in rows[key] and f is not None:
            out.append((key, f, float(f["ms"]), rows[key]["08"]["ms"]) + best_peer(rows[key]))
    return out


def table_step08_floor(D):
    """Step 08 and PyTorch's best backend against the floor (K and V read once by step 08's copy, nothing computed,
    static cut of 128 blocks), every decoding shape, all three from one device call."""
    folder = os.path.join(D.folder, FLOOR08)
    out = [f"µs, bf16, d = 128, B = 1, on {device07(D, 'device.txt', folder)}, in one device call (`{rel(folder)}/`): "
           f"step 08 and PyTorch's backends timed by `tools/bench/ab.py` in one process ({rounds08(folder)} rounds, the "
           f"median), then the floor, `fa_read_floor` (K and V read once by step 08's copy, a ring of four tiles, "
           f"128 blocks each streaming one contiguous run, nothing computed; the L2 flushed, a spin and events as ab.py "
           f"does it; the median of 15). Bold: below 1.000.", "",
           "| B·H | H_kv | N_q | N_kv | causal | K + V MiB | floor µs (GB/s) | step 08 µs (÷ floor) | "
           "PyTorch best µs (÷ floor) | step 08 × PyTorch |", "|---|---|---|---|---|---|---|---|---|---|"]
    over08, over_best, ratios = [], [], []
    for key, f, fl, ms, who, best in over_floor08(D):
        over08.append(ms / fl), over_best.append(best / fl), ratios.append(best / ms)
        out.append(f"| {shape08(key)} | {kv_mib08(key):.0f} | {fl * 1e3:.1f} ({float(f['gbps']):.0f}) | "
                   f"{ms * 1e3:.1f} ({ms / fl:.3f}) | {best * 1e3:.1f} ({who}, {best / fl:.3f}) | {bold3(best / ms)} |")
    out += ["", f"Step 08 ÷ floor: {min(over08):.3f}–{max(over08):.3f}; PyTorch's best ÷ floor: "
                f"{min(over_best):.3f}–{max(over_best):.3f}; step 08 below PyTorch's best at "
                f"{sum(1 for r in ratios if r < 1)} of {len(ratios)} shapes in this run (step 08 × PyTorch: {min(ratios):.3f}–"
                f"{max(ratios):.3f})."]
    return out


def table_step08_floor_summary(D):
    """table_step08_floor by group of shapes (the README's): time over the floor, step 08 and PyTorch's best."""
    folder = os.path.join(D.folder, FLOOR08)
    shapes = over_floor08(D)
    out = [f"bf16, d = 128, N_kv = 8k–128k, on {device07(D, 'device.txt', folder)}; time ÷ the floor (K and V read "
           f"once, nothing computed: `fa_read_floor`), all three in one device call (note 08, \"The floor, measured\").",
           "", "| B·H | H_kv | N_q | step 08 ÷ floor | PyTorch's best ÷ floor | step 08 × PyTorch's best |",
           "|---|---|---|---|---|---|"]
    groups = sorted({k[:3] for k, *_ in shapes}, key=lambda g: (g[0] != g[1], g[0], g[2]))
    for g in groups:
        a, b, r = [], [], []
        for k, _, fl, ms, _, best in shapes:
            if k[:3] == g:
                a.append(ms / fl), b.append(best / fl), r.append(best / ms)
        out.append(f"| {g[0]} | {g[1] if g[1] != g[0] else '—'} | {g[2]} | {min(a):.3f}–{max(a):.3f} | "
                   f"{min(b):.3f}–{max(b):.3f} | {bold3(min(r))}–{max(r):.3f} |")
    return out


def table_step08_floor_cuts(D):
    """The floor's cuts: static runs (128 blocks, one an SM, a ring of six) beside chunks from a counter, with the
    spread of the blocks' ends."""
    folder = os.path.join(D.folder, FLOOR08)
    floor = floor08(folder)
    sms = floor_sms(folder)
    cuts = [(FLOOR_CUT08, "static, 128 blocks"), (("static", 4, sms, 0, 1, 0), "static, one an SM"),
            (("static", 6, 128, 0, 1, 0), "static, ring of six"), (("flow", 4, sms, 4, 1, 0), "counter, 4-tile chunks"),
            (("flow", 4, sms, 16, 1, 0), "counter, 16-tile chunks")]
    out = [f"µs of `fa_read_floor` (`{rel(folder)}/floor.csv`, {device07(D, 'device.txt', folder)}; the median of 15), "
           f"and in brackets the first and the last block's end in the last repeat, µs after the first block's start "
           f"(`%globaltimer`). K and V of B·H_kv heads of N_kv keys, d = 128, bf16; a ring of four tiles unless named; "
           f"\"one an SM\": {sms} blocks; the counter's runs take {sms} blocks.", "",
           "| B·H_kv | N_kv | K + V MiB | " + " | ".join(h for _, h in cuts) + " |", "|---|---|---|" + "---|" * len(cuts)]
    best = {h: [] for _, h in cuts}
    for (h, nk), rs in sorted(floor.items()):
        base = float(rs[FLOOR_CUT08]["ms"])
        cells = []
        for c, head in cuts:
            r = rs[c]
            cells.append(f"{float(r['ms']) * 1e3:.1f} ({float(r['first_end_us']):.0f}–{float(r['last_end_us']):.0f})")
            best[head].append(float(r["ms"]) / base)
        out.append(f"| {h} | {nk // 1024}k | {2 * h * nk * 128 * 2 / 2**20:.0f} | " + " | ".join(cells) + " |")
    out += [""] + ["Time ÷ static, 128 blocks: " + "; ".join(f"{head} {min(best[head]):.3f}–{max(best[head]):.3f}"
                                                             for _, head in cuts[1:]) + "."]
    return out


def table_step08_floor_more(D):
    """The floor read otherwise: by bulk copies (TMA), by fewer blocks with deeper rings, two an SM, and in thread
    block clusters; each ÷ the static cut of 128 blocks (step 08's), at every K/V size of the floor run."""
    folder = os.path.join(D.folder, FLOOR08)
    floor = floor08(folder)
    sms = floor_sms(folder)
    cuts = [(("bulk", 4, 128, 0, 1, 0), "bulk copies (TMA), 128 blocks"),
            (("bulk", 6, 128, 0, 1, 0), "bulk, ring of six"),
            (("static", 3, 2 * sms, 0, 1, 0), f"two an SM ({2 * sms}), ring of three"),
            (("static", 4, 64, 0, 1, 0), "64 blocks"), (("static", 6, 64, 0, 1, 0), "64, ring of six"),
            (("static", 6, 64, 0, 2, 0), "64 in clusters of 2"), (("static", 6, 64, 0, 4, 0), "64 in clusters of 4"),
            (("static", 6, 96, 0, 1, 0), "96, ring of six"), (("static", 6, 96, 0, 6, 0), "96 in clusters of 6"),
            (("static", 4, 128, 0, 4, 0), "128 in clusters of 4"),
            (("static", 4, 128, 0, 16, 0), "128 in clusters of 16"),
            (("static", 3, 256, 0, 8, 0), "256 in clusters of 8, ring of three")]
    held = {}
    for line in open(os.path.join(folder, "clusters.txt")):
        m = re.match(r"fa_read_floor: (\d+) blocks in clusters of (\d+) \(ring (\d+)\): (\d+) clusters at once", line)
        if m:
            held[(int(m.group(3)), int(m.group(1)), int(m.group(2)))] = int(m.group(4))
    out = [f"Time of `fa_read_floor` ÷ its static cut of 128 blocks (a ring of four tiles, step 08's copy: the floor of "
           f"note 08's table in \"The floor, measured\"), the same run (`{rel(folder)}/floor.csv`, "
           f"{device07(D, 'device.txt', folder)}; the median "
           f"of 15 each). K and V of B·H_kv heads of N_kv keys, d = 128, bf16; a ring of four tiles and one block a "
           f"static run unless named. Bulk: each tile of K and of V one `cp.async.bulk` (the TMA's one-dimensional "
           f"copy) on an mbarrier, issued by one thread. Clusters: the same kernel launched with a cluster dimension; "
           f"the GPU held at once " + ", ".join(f"{n} clusters of {c} ({b} blocks, ring {r})"
                                                for (r, b, c), n in sorted(held.items(), key=lambda x: (x[0][2], x[0][1])))
           + ".", "",
           "| B·H_kv | N_kv | K + V MiB | floor µs | " + " | ".join(h for _, h in cuts) + " |",
           "|---|---|---|---|" + "---|" * len(cuts)]
    ratios = {h: [] for _, h in cuts}
    for (h, nk), rs in sorted(floor.items()):
        base = float(rs[FLOOR_CUT08]["ms"])
        cells = []
        for c, head in cuts:
            x = float(rs[c]["ms"]) / base
            ratios[head].append(x)
            cells.append(f"{x:.3f}")
        out.append(f"| {h} | {nk // 1024}k | {2 * h * nk * 128 * 2 / 2**20:.0f} | {base * 1e3:.1f} | " + " | ".join(cells) + " |")
    out += ["", "Over the sizes: " + "; ".join(f"{head} {min(r):.3f}–{max(r):.3f}" for head, r in ratios.items()) + "."]
    return out


def table_step08_ring_long(D):
    """Production's ring (six tiles where every chunk streams at least 16, else four) beside lesson row r4 (four at
    every shape), in the run of the main tables."""
    out, ratio = step08_pair(D, ab_folder(D), "08r4", "08", "both", "four tiles at every shape (r4)",
                             "production: six where chunks are long", "time, production ÷ r4")
    r = list(ratio.values())
    out += ["", f"Production ÷ r4: {min(r):.3f}–{max(r):.3f} over the {len(r)} shapes; {faster_slower08(r, 0.5)}."]
    return out


def table_step08_tags(D):
    """The merge kernel's rows waiting for their own parts' tags (m2) beside waiting for the whole split kernel (g1),
    both launched early, the merge kernel wherever the plan splits; the run of the main tables."""
    out, ratio = step08_pair(D, ab_folder(D), "08g1", "08m2", "both", "the whole split kernel awaited (g1)",
                             "each row's parts awaited (m2)", "time, m2 ÷ g1")
    merged = {k: x for k, x in ratio.items() if not (k[0] == 128 and k[1] == 128)}  # (B·H = 128: no merge at all)
    r = list(merged.values())
    out += ["", f"m2 ÷ g1 at the {len(r)} shapes that merge: {min(r):.3f}–{max(r):.3f}; {faster_slower08(r, 0.5)}; "
                f"geometric mean {statistics.geometric_mean(r):.4f}."]
    return out


WIDE08 = "tries/step08_wide_clusters"  # ab.py: wide clusters (c4, c6) beside production, d00ec07's step 08 + patch


def step08_tries(D, folder, tries):
    """Two tried versions beside production in one ab.py run (`folder`): step08_versions' table, then for each
    (version, its column, its ratio's column, its name) a line of its time ÷ production's range."""
    out, ratio = step08_versions(D, os.path.join(D.folder, folder), "08", [t[:3] for t in tries],
                                 {2: "the two", 3: "the three", 4: "the four"}[len(tries) + 1], "production")
    for b, _, _, name in tries:
        r = list(ratio[b].values())
        out += ["", f"{name} ÷ production: {min(r):.3f}–{max(r):.3f} over the {len(r)} shapes; {faster_slower08(r, 0.5)}."]
    return out


def table_step08_wide(D):
    """Tried and not kept: every unit in 2 or 4 chunks, 64 blocks in clusters of 4 that merge them (c4: a ring of
    four, c6: six), beside production."""
    return step08_tries(D, WIDE08, [("08c4", "wide clusters, ring of four (c4)", "c4 ÷ production", "c4"),
                                    ("08c6", "ring of six (c6)", "c6 ÷ production", "c6")])


EIGHT08 = "tries/step08_eight_warps"  # ab.py: 6f030c0 with lesson row w8 (eight warps) and p6 beside production


def table_step08_eight(D):
    """Eight warps a block (w8: two groups of four computing a ring slot's two tiles at once, six tiles) beside p6
    (the same ring, four warps) and production, in one ab.py run."""
    return step08_tries(D, EIGHT08, [("08w8", "eight warps (w8)", "w8 ÷ production", "Eight warps"),
                                     ("08p6", "four warps, the same ring (p6)", "p6 ÷ production", "p6")])


RELEASE08 = "tries/step08_release_first"  # ab.py --alt: the slot released before the wait, beside 6f030c0


def table_step08_release_first(D):
    """The ring's slot released before the wait (a barrier, the copy into the freed slot, then the wait for this
    tile): one line from ab.py's logs of the run (each line the median of 3 rounds, both builds in one process)."""
    folder = os.path.join(D.folder, RELEASE08)
    r = []
    for path in sorted(glob.glob(os.path.join(folder, "ab08*.log"))):
        for line in open(path):
            m = re.match(r"B=1 H=\d+ H_kv=\d+ N=\d+ N_kv=\d+ d=128 causal=\d: (.*)", line.strip())
            if m:
                t = dict((k, float(v)) for k, v in re.findall(r"(\S+) ([\d.]+) ms", m.group(1)))
                r.append(t["08"] / t["08@base"])
    mean = statistics.geometric_mean(r)
    return [f"The slot released first ÷ 6f030c0, in one process (`{rel(folder)}/`, ab.py's lines: the median of 3 "
            f"rounds, on {device07(D, 'device.txt', folder)}): {min(r):.3f}–{max(r):.3f} over "
            f"the {len(r)} decoding shapes, geometric mean {mean:.4f}; {faster_slower08(r, 0.5)}."]


FLOOR_WORK08 = "ab/floor_work"  # one call at 8c57ade: fa_read_floor --work-ns, and step 08 and cuDNN at those K, V


def floor_work_table(folder, cuts, sizes=None):
    """fa_read_floor --work-ns W's rows in `folder` (the CSV's every W) as a table: for each K/V size (`sizes`, or all
    of the run's) and each of `cuts` ((floor08's key, its name)) the run has, the time at each W, in brackets ÷ the
    same cut's at W = 0, and at the largest W the first, median and last block's end."""
    works = sorted({int(r["work_ns"]) for r in load(folder, "floor.csv")})
    floor = {w: floor08(folder, w) for w in works}  # by W, then as floor08 keys it
    out = ["| B·H_kv | N_kv | cut | " + " | ".join(f"W = {w} ns" for w in works) + " |",
           "|---|---|---|" + "---|" * len(works)]
    for size in sorted(floor[0]) if sizes is None else sizes:
        for c, head in cuts:
            if c not in floor[0][size]:
                continue
            base = float(floor[0][size][c]["ms"])
            cells = []
            for w in works:
                r = floor[w][size][c]
                x = f"{float(r['ms']) * 1e3:.1f}" + ("" if w == 0 else f" ({float(r['ms']) / base:.3f})")
                if w == works[-1]:
                    x += f" [{float(r['first_end_us']):.0f}/{float(r['median_end_us']):.0f}/{float(r['last_end_us']):.0f}]"
                cells.append(x)
            out.append(f"| {size[0]} | {size[1] // 1024}k | {head} | " + " | ".join(cells) + " |")
    return out


def table_step08_floor_work(D):
    """The floor with a stand-in for the math (--work-ns W: every thread spins W ns after each tile's barrier), by
    cut, at the K/V sizes of the decoding shapes that cut every head, beside step 08 and cuDNN in the same call."""
    folder = os.path.join(D.folder, FLOOR_WORK08)
    sms = floor_sms(folder)
    cuts = [(("static", 4, 128, 0, 1, 0), "static, 128 blocks (step 08's)"),
            (("static", 6, 128, 0, 1, 0), "ring of six"), (("static", 4, sms, 0, 1, 0), f"{sms} blocks"),
            (("static", 3, 2 * sms, 0, 1, 0), f"two an SM ({2 * sms}, ring 3)"),
            (("bulk", 4, 128, 0, 1, 0), "bulk (TMA)"), (("flow", 4, sms, 4, 1, 0), "counter, 4-tile chunks"),
            (("flow", 4, sms, 16, 1, 0), "counter, 16-tile chunks")]
    dec = decode08_ab(D, folder)
    out = [f"µs of `fa_read_floor --work-ns W` (`{rel(folder)}/floor.csv`, {device07(D, 'device.txt', folder)}; the "
           "median of 15): after each tile's barrier every thread of a block spins W ns, a stand-in for step 08's "
           "math, so that a block consumes at most a tile every W ns; in brackets, the time ÷ the same cut's at W = 0, "
           "and at the largest W the first, median and last block's end (µs after the first block's start). K and V "
           "of B·H_kv heads of N_kv keys, d = 128, bf16; a ring of four tiles unless named.", ""]
    out += floor_work_table(folder, cuts)
    out += ["", "The same call's step 08 and cuDNN (`tools/bench/ab.py`, one process, 3 rounds, the median) at the "
                "decoding shapes that read those K and V: "
            + "; ".join(f"{shape08(k).replace(' | ', ', ')}: step 08 {c['08']['ms'] * 1e3:.1f} µs, cuDNN "
                        f"{c['cudnn']['ms'] * 1e3:.1f} µs" for k, c in sorted(dec.items(), key=lambda kc: order08(kc[0]))
                        if "08" in c and "cudnn" in c) + "."]
    return out


FLOOR_FLOW08 = "ab/floor_flow"  # one call at be86710: fa_read_floor --work-ns 0,600,750, the counter without divisions


def table_step08_floor_flow(D):
    """The counter's cut again, its loop without divisions, and the tail cuts (a static lead, the rest from the
    counter), beside the static cuts and two blocks an SM, under the stand-in math."""
    folder = os.path.join(D.folder, FLOOR_FLOW08)
    sms = floor_sms(folder)
    cuts = [(("static", 4, 128, 0, 1, 0), "static, 128 blocks (step 08's)"),
            (("static", 4, sms, 0, 1, 0), f"{sms} blocks"),
            (("static", 3, 2 * sms, 0, 1, 0), f"two an SM ({2 * sms}, ring 3)"),
            (("flow", 4, sms, 4, 1, 0), "counter, 4-tile chunks"),
            (("flow", 4, sms, 16, 1, 0), "counter, 16-tile chunks"),
            (("tail", 4, sms, 16, 1, 75), "75% static, then 16-tile chunks"),
            (("tail", 4, sms, 16, 1, 90), "90% static, then 16-tile chunks"),
            (("tail", 4, sms, 4, 1, 95), "95% static, then 4-tile chunks")]
    return [f"µs of `fa_read_floor --work-ns W` (`{rel(folder)}/floor.csv`, {device07(D, 'device.txt', folder)}; the "
            "median of 15), as above; the counter's loop now finds a tile's place without a division, and a tail cut "
            "streams the given share of an even cut first, as the static cut does, then takes chunks from the "
            "counter. The run has every cut at 4–128 K/V heads and 8k–128k keys; here the sizes of the table above.",
            ""] + floor_work_table(folder, cuts, [(16, 32768), (16, 131072), (32, 32768), (32, 131072)])


def ratios08(rows, b, a="08"):
    """decode08_ab's rows: b's time ÷ a's at every shape that timed both."""
    return [c[b]["ms"] / c[a]["ms"] for c in rows.values() if b in c and a in c]


def behind_peers08(rows, who, keys):
    """decode08_ab's rows: who × PyTorch's best (its fastest backend's time ÷ who's) at the shapes `keys`, where it is
    below 1.0 — the shapes where `who` is behind."""
    return [x for x in (vs_peers08(rows[k], who) for k in keys) if x < 1]


TWO08 = "tries/step08_two_an_sm"  # ab.py: cf9f920 + two_an_sm.patch (lesson rows n2, u2) beside production and k1


def table_step08_two(D):
    """Tried and not kept: two blocks an SM (a ring of three tiles), the tiles shared by that wave (n2) or whole units'
    chunks (u2), beside production and k1 (the tiles shared by one block an SM), in one ab.py run."""
    out = step08_tries(D, TWO08, [("08n2", "two an SM, shared (n2)", "n2 ÷ production", "n2"),
                                  ("08u2", "two an SM, whole units (u2)", "u2 ÷ production", "u2"),
                                  ("08k1", "one an SM, shared (k1)", "k1 ÷ production", "k1")])
    folder = os.path.join(D.folder, TWO08, "o2")  # a second run: o2 (u2 with twice the blocks) beside u2, production
    rows = decode08_ab(D, folder)
    r = {b: ratios08(rows, b) for b in ("08o2", "08u2")}
    out += ["", f"A second run (`{rel(folder)}/`, {rounds08(folder)} rounds, on {device07(D, 'device.txt', folder)}), "
                f"B·H = 32 with one query and the grouped shapes: o2 (u2 with twice the blocks, so that an SM starts "
                f"its next block as one of its two ends) ÷ production {min(r['08o2']):.3f}–{max(r['08o2']):.3f} over "
                f"the {len(r['08o2'])} shapes, {faster_slower08(r['08o2'], 0.5)}; u2 ÷ production "
                f"{min(r['08u2']):.3f}–{max(r['08u2']):.3f}."]
    return out


LAZY08 = "tries/step08_lazy_rescale"  # ab.py --alt: cf9f920 + lazy.patch ("08@lazy") beside cf9f920 ("08")


def alt_line08(D, folder, alt, base="08"):
    """An ab.py run in `folder` with version `alt` beside `base` (by default this build's `08`, alt another build's
    as ab.py --alt names it): where (the folder, its rounds and GPU) and alt's time ÷ base's over the shapes (range,
    geometric mean, how many faster and slower), as one line's words."""
    rows = decode08_ab(D, folder)
    r = ratios08(rows, alt, base)
    return (f"(`{rel(folder)}/`, {rounds08(folder)} rounds, on {device07(D, 'device.txt', folder)}): "
            f"{min(r):.3f}–{max(r):.3f} over {len(r)} decoding shapes, geometric mean "
            f"{statistics.geometric_mean(r):.4f}; {faster_slower08(r, 0.5)}.")


def table_step08_lazy(D):
    """The running max kept unless a tile's passes it by more than a factor 2^8 (lazy.patch): one line, its time ÷
    the build without it, in one process."""
    return ["The max kept within 2^8 ÷ cf9f920, in one process "
            + alt_line08(D, os.path.join(D.folder, LAZY08), "08@lazy")]


WARP08 = "tries/step08_warp_rings"  # ab.py --alt: be86710 + warp_rings.patch ("08@warp") beside be86710 ("08")


def table_step08_warp_rings(D):
    """Each warp copying its own 16 rows of every tile and waiting only for them (no block barrier in the loop), in two
    versions (each copy instruction a scattered 64 bytes of 8 rows, or two whole rows): a line each, time ÷ the build
    without it, in one process."""
    return [f"- {what}, ÷ be86710 " + alt_line08(D, os.path.join(D.folder, WARP08, sub), "08@warp")
            for sub, what in (("scattered", "a copy instruction takes 64 bytes of each of 8 rows"),
                              ("rows", "a copy instruction takes two whole rows, 512 contiguous bytes, as the "
                                       "block's copy"))]


WGMMA08 = "tries/step08_wgmma"  # ab.py --alt: 7afa4af + wgmma.patch built for sm_90a ("08@wg") beside 7afa4af ("08")


def table_step08_wgmma(D):
    """Tried and not kept: the split kernel's tile by wgmma (Sᵀ = K·Qᵀ, one max a row across the warps, P through
    shared memory, Oᵀ += Vᵀ·Pᵀ), beside production in one ab.py run."""
    return step08_tries(D, WGMMA08, [("08@wg", "wgmma (wg)", "wg ÷ production", "wg")])


K3208 = "tries/step08_k32"  # ab.py --alt: 25ed9de + k32.patch (128-key tiles, 32 keys a warp: "08@k32") beside it


def table_step08_k32(D):
    """Tried and not kept: cuDNN's tile, 16 rows × 128 keys, each warp 32 keys of it (one softmax step per 128 keys,
    four n-tiles a warp), beside production in one ab.py run."""
    return step08_tries(D, K3208, [("08@k32", "128-key tiles (k32)", "k32 ÷ production", "k32")])


TMA08 = "ab/tma08"  # ab.py at b0acd58: production, t1 (TMA wherever it can), c1 (cp.async) and d059ac8 (--alt base)
TMA08_PROMOTION = "tries/step08_tma_promotion"  # ab.py at d059ac8 + tma.patch: its t1 (256-byte promotion), t2 (none)


def table_step08_tma(D):
    """The ring filled by TMA from a producer warp: production (TMA where every chunk has 128 tiles or more, else the
    warps' cp.async), t1 (TMA wherever it can run) and c1 (cp.async at every shape) beside the build before it
    (d059ac8, ab.py --alt), in one process; and t1 ÷ c1, the two fills in one build."""
    folder = os.path.join(D.folder, TMA08)
    rows = decode08_ab(D, folder)
    out, ratio = step08_versions(D, folder, "08@base", [("08", "production", "÷ before"),
                                                        ("08t1", "t1: TMA wherever it can", "÷ before"),
                                                        ("08c1", "c1: cp.async everywhere", "÷ before")],
                                 "the build before (d059ac8, loaded beside this one) and this one's three rows",
                                 "before (d059ac8)", rows)
    fill = {k: ratio["08t1"][k] / ratio["08c1"][k] for k in ratio["08"]}
    out[2] += " t1 ÷ c1 |"
    out[3] += "---|"
    for i, k in enumerate(fill):
        out[4 + i] += f" {fill[k]:.3f} |"
    prod, base = list(ratio["08"].values()), list(ratio["08"])
    below = {w: behind_peers08(rows, w, base) for w in ("08", "08@base")}
    t = list(fill.values())
    out += ["", f"Production ÷ before: {min(prod):.3f}–{max(prod):.3f} over the {len(prod)} shapes, geometric mean "
                f"{statistics.geometric_mean(prod):.4f}; {faster_slower08(prod, 0.5)}. t1 ÷ c1 (TMA ÷ cp.async, one "
                f"build): {min(t):.3f}–{max(t):.3f}. Below PyTorch's best: production at {len(below['08'])} shapes "
                f"(the lowest {min(below['08'], default=1):.3f}), the build before at {len(below['08@base'])} "
                f"({min(below['08@base'], default=1):.3f})."]
    return out


TMA08_AGAIN = "ab/tma08_again"  # ab.py at f94258a: production, t1 and c1 (no build before), in the final GPU call
TMA08_THIRD = "ab/verify08_3aa8c61"  # the same at 3aa8c61 (a piece's place computed once), in its final GPU call


def tma_again08(D, folder, commit, by_chunk=False):
    """The ring by TMA timed again, on the machine of a final GPU call (ab.py in `folder` at `commit`: production, t1
    and c1): t1 ÷ c1 by chunk length, and production against PyTorch's best, as one line; by_chunk: then t1 ÷ c1 at
    the eight shapes whose blocks stream 128 tiles or more of a shared head, at B·H = 128, and at the rest."""
    folder = os.path.join(D.folder, folder)
    rows = decode08_ab(D, folder)
    keys = [k for k in sorted(rows, key=order08) if all(w in rows[k] for w in ("08", "08t1", "08c1"))]
    fill = {k: rows[k]["08t1"]["ms"] / rows[k]["08c1"]["ms"] for k in keys}
    prod = {k: rows[k]["08"]["ms"] / rows[k]["08c1"]["ms"] for k in keys}
    below = behind_peers08(rows, "08", keys)
    t = sorted(fill.values())
    out = [f"Again, at {commit} on {device07(D, 'device.txt', folder)} (`{rel(folder)}/`, {rounds08(folder)} rounds, "
           f"production, t1 and c1 in one process): t1 ÷ c1 {t[0]:.3f}–{t[-1]:.3f} over the {len(t)} shapes "
           f"({', '.join(f'{x:.3f}' for x in t[:8])} the eight lowest), production ÷ c1 "
           f"{min(prod.values()):.3f}–{max(prod.values()):.3f}; production below PyTorch's best at {len(below)} "
           f"shapes (the lowest {min(below, default=1):.3f})."]
    if by_chunk:
        long = [k for k in keys if (k[0] == k[1] == 32 and k[3] >= 32768) or (k[1] == 16 and k[3] >= 65536)]
        wide = [k for k in keys if k[0] == k[1] == 128]
        rest = [k for k in keys if k not in long and k not in wide]
        span = lambda ks: f"{min(fill[k] for k in ks):.3f}–{max(fill[k] for k in ks):.3f}"
        out[0] += (f" t1 ÷ c1 at the {len(long)} shapes whose blocks stream 128 tiles or more of a shared head (B·H = 32 "
                   f"from 32k keys, 16 K/V heads from 64k): {span(long)}; at B·H = 128: {span(wide)}; at the "
                   f"{len(rest)} others: {span(rest)}.")
    return out


def table_step08_tma_again(D):
    """The ring by TMA timed again at f94258a (tma_again08)."""
    return tma_again08(D, TMA08_AGAIN, "f94258a")


def table_step08_tma_third(D):
    """The ring by TMA timed a third time, at 3aa8c61 (tma_again08)."""
    return tma_again08(D, TMA08_THIRD, "3aa8c61", by_chunk=True)


TWO_GROUPS08 = "tries/step08_tma_two_groups"  # ab.py at 3aa8c61 + two_groups.patch: t2 beside t1 and production
STAGGER08 = "tries/step08_tma_stagger"  # ab.py at 3aa8c61 + two_groups.patch + stagger.patch: t3 beside t1, production


def table_step08_tma_two_groups(D):
    """Tried and not kept: the TMA ring consumed by two groups of four compute warps taking its tiles in turn (t2),
    beside t1 (the same ring, one group) and production, in one ab.py run; then the staggered starts (t3) beside t1 in
    a run of their own, as one line."""
    folder = os.path.join(D.folder, TWO_GROUPS08)
    rows = decode08_ab(D, folder)
    out, ratio = step08_versions(D, folder, "08t1", [("08t2", "t2: two groups", "÷ t1"), ("08", "production", "÷ t1")],
                                 "t1, t2, production", "t1: TMA, one group of four warps", rows)
    r, keys = list(ratio["08t2"].values()), list(ratio["08t2"])
    below = {w: behind_peers08(rows, w, keys) for w in ("08", "08t2")}
    out += ["", f"t2 ÷ t1: {min(r):.3f}–{max(r):.3f} over the {len(r)} shapes, geometric mean "
                f"{statistics.geometric_mean(r):.4f}; {faster_slower08(r, 0.5)}. Below PyTorch's best: production at "
                f"{len(below['08'])} shapes (the lowest {min(below['08'], default=1):.3f}), t2 at {len(below['08t2'])} "
                f"({min(below['08t2'], default=1):.3f})."]
    out += ["", "The starts staggered (t3) ÷ t1, in one process " + alt_line08(D, os.path.join(D.folder, STAGGER08),
                                                                                   "08t3", "08t1")]
    return out


TWO_AN_SM08 = "tries/step08_tma_two_an_sm"  # ab.py at 3074c1d + two_an_sm.patch: u3 beside t1 and production


def table_step08_tma_two_an_sm(D):
    """Tried and not kept: two blocks an SM (whole units' chunks for a wave of 264, cuDNN's cut) with a TMA ring of
    three tiles each (u3), beside t1 and production in one ab.py run: one line."""
    folder = os.path.join(D.folder, TWO_AN_SM08)
    rows = decode08_ab(D, folder)
    q = ratios08(rows, "08u3")
    keys = [k for k in rows if "08u3" in rows[k]]
    below = {w: behind_peers08(rows, w, keys) for w in ("08", "08u3")}
    return ["Two blocks an SM by TMA (u3) ÷ t1, in one process " + alt_line08(D, folder, "08u3", "08t1")
            + f" u3 ÷ production: {min(q):.3f}–{max(q):.3f}. Below PyTorch's best there: production at "
            f"{len(below['08'])} shapes (the lowest "
            f"{min(below['08'], default=1):.3f}), u3 at {len(below['08u3'])} ({min(below['08u3'], default=1):.3f})."]


FRACTION08 = "tries/step08_l2_fraction"  # ab.py at 4b48d8b + fraction.patch: e5, e2 beside production, l0 and l1
EVICT_FIRST_BYTES08 = 3 * 60 * 2**20  # kEvictFirstL2s of the H200's L2: where production asks for evict-first


def table_step08_machines_line(D):
    """README's line on the runs since the ring by TMA (table_step08_machines): how many shapes were below PyTorch's
    best in each run that timed all 30, and B·H = 128 with one query's range in each run."""
    below, b128 = [], []
    for folder, _, who in MACHINES08:
        rows = decode08_ab(D, os.path.join(D.folder, folder))
        x = {k: vs_peers08(c, who) for k, c in rows.items() if who in c and not k[4]}
        if len(x) == 30:
            below.append(sum(1 for r in x.values() if r < 1))
        b128.append([r for k, r in x.items() if k[0] == k[1] == 128 and k[2] == 1])
    behind, ahead = [v for v in b128 if max(v) < 1], [v for v in b128 if min(v) >= 1]
    return [f"The same kernels timed again in {len(MACHINES08)} later GPU calls, each on the H200 it was lent (note 08, "
            f"\"The ring by TMA\"): below PyTorch's best at {min(below)}–{max(below)} of the 30 shapes without the mask "
            f"in the {len(below)} runs that timed them all; at B·H = 128 with one query behind PyTorch's best at "
            f"every length in {len(behind)} of the {len(b128)} runs ({min(map(min, behind)):.3f}–"
            f"{max(map(max, behind)):.3f}), level or ahead at every length in {len(ahead)}."]


def table_step08_l2_fraction(D):
    """Tried and not kept: a half (e5) or a quarter (e2) of the K/V lines evict-first, beside no hint (l0), every line
    (l1) and production, in one ab.py run: each one's time ÷ l0's where K and V are at most three L2s and above."""
    folder = os.path.join(D.folder, FRACTION08)
    rows = decode08_ab(D, folder)
    small = {k for k in rows if 2 * 2 * k[1] * k[3] * 128 <= EVICT_FIRST_BYTES08}  # K and V, bf16, d = 128
    out = [f"Time ÷ no hint (l0), in one process (`{rel(folder)}/`, {rounds08(folder)} rounds, on "
           f"{device07(D, 'device.txt', folder)}), the 20 decoding shapes with one query:", ""]
    for who, what in (("08l1", "every line evict-first (l1)"), ("08e5", "half of them (e5)"),
                      ("08e2", "a quarter (e2)")):
        lo = [rows[k][who]["ms"] / rows[k]["08l0"]["ms"] for k in rows if k in small]
        hi = [rows[k][who]["ms"] / rows[k]["08l0"]["ms"] for k in rows if k not in small]
        out.append(f"- {what}: {min(lo):.3f}–{max(lo):.3f} at the {len(lo)} shapes with K and V of at most 180 MiB, "
                   f"{min(hi):.3f}–{max(hi):.3f} at the {len(hi)} larger ones.")
    rule = {w: ratios08(rows, w) for w in ("08e5", "08e2")}
    out += ["", "Against production (the rule: every line evict-first up to 180 MiB, none above): half "
                f"{min(rule['08e5']):.3f}–{max(rule['08e5']):.3f}, a quarter {min(rule['08e2']):.3f}–"
                f"{max(rule['08e2']):.3f} of its time."]
    return out


SAHEAD08 = "tries/step08_tma_s_ahead"  # ab.py --alt: c889df3 with S one tile ahead in the TMA loop, beside c889df3
# The runs since the ring by TMA: (folder, commit, production's name in its ab08*.csv)
K1_AGAIN08 = "tries/step08_k1_again"  # ab.py at 03ee74b: production beside k1, w1 and c1 (B·H = 128 and 32, grouped)
MACHINES08 = [(TMA08, "b0acd58", "08"), (TMA08_AGAIN, "f94258a", "08"), (SAHEAD08, "c889df3", "08@base"),
              (TWO_GROUPS08, "3aa8c61", "08"), (STAGGER08, "3aa8c61", "08"), (TMA08_THIRD, "3aa8c61", "08")] + \
    [(DECODE08_RUNS[0][0], "03ee74b", "08"), (K1_AGAIN08, "03ee74b", "08"), (DECODE08_RUNS[1][0], "03ee74b", "08")]


def table_step08_machines(D):
    """Production against PyTorch's best in every run since the ring by TMA, each on the H200 its GPU call was lent:
    by group of decoding shapes, the lowest and highest ratio, and how many shapes were below 1.0."""
    groups = GROUPS08
    out = ["Step 08's production × PyTorch's best backend (its time ÷ step 08's), bf16, d = 128, B = 1, without the "
           "mask, in each run of `tools/bench/ab.py` (one process, the median of its rounds) since the ring by TMA, "
           "each in a GPU call of its own on the H200 that call was lent (NVIDIA H200, driver 580.159.04, CUDA 13.0, "
           "torch 2.11.0+cu130, cuDNN 9.19.0): the lowest–highest ratio at each group of shapes (5 key counts each, "
           "8k–128k), and in brackets the shapes below 1.000. Production's kernels are the same code in every run "
           "(b0acd58's; since then comments, at 3aa8c61 a refactor whose PTX has the same instructions in the same "
           "counts, and at 03ee74b the ring's mbarriers found by one helper, a few address instructions fewer).", "",
           "| run (folder) | commit | " + " | ".join(g for g, _ in groups) + " | below 1.000, of all |",
           "|---|---|" + "---|" * len(groups) + "---|"]
    for folder, commit, who in MACHINES08:
        rows = decode08_ab(D, os.path.join(D.folder, folder))
        x = {k: vs_peers08(c, who) for k, c in rows.items() if who in c and not k[4]}
        cells = []
        for _, inside in groups:
            v = [r for k, r in x.items() if inside(k)]
            cells.append(f"{min(v):.3f}–{max(v):.3f} ({sum(1 for r in v if r < 1)})" if v else "—")
        out.append(f"| `{folder}` | {commit} | " + " | ".join(cells) + f" | {sum(1 for r in x.values() if r < 1)} of "
                   f"{len(x)} |")
    return out


def table_step08_classes(D):
    """The longest pure stream (B·H = 128, one query, 128k keys) in every run since the ring by TMA: step 08's µs,
    cuDNN's and FlashAttention-2's where the run timed it, by step 08's time."""
    key = (128, 128, 1, 131072, 0)
    rows = []
    for folder, commit, who in MACHINES08:
        c = decode08_ab(D, os.path.join(D.folder, folder)).get(key, {})
        if who in c:
            rows.append((c[who]["ms"] * 1e3, folder, commit, c))
    out = [f"µs at B·H = 128, one query, 128k keys (8 GiB of K and V), bf16, d = 128, in each run of the table above "
           f"(NVIDIA H200, driver 580.159.04, CUDA 13.0, torch 2.11.0+cu130, cuDNN 9.19.0; the median of the run's "
           f"rounds), in the order of step 08's time; FlashAttention-2 only where the run timed it.", "",
           "| run (folder) | commit | step 08 | cuDNN | FlashAttention-2 | step 08 × PyTorch's best |",
           "|---|---|---|---|---|---|"]
    for us, folder, commit, c in sorted(rows):
        peer = lambda p: f"{c[p]['ms'] * 1e3:.1f}" if p in c else "—"  # noqa: E731
        out.append(f"| `{folder}` | {commit} | {us:.1f} | {peer('cudnn')} | {peer('flash')} | "
                   f"{bold3(best_peer(c)[1] * 1e3 / us)} |")
    return out


def table_step08_k1_again(D):
    """Production beside the tiles shared by a wave at every shape (k1), whole units' splits (w1) and the cp.async ring
    (c1), on a machine of the middle class, by group of shapes; then that machine's read floor at B·H = 128."""
    folder = os.path.join(D.folder, K1_AGAIN08)
    rows = decode08_ab(D, folder)
    out = [f"bf16, d = 128, B = 1, without the mask, on {device07(D, 'device.txt', folder)}, at 03ee74b in one process "
           f"(`{rel(folder)}/`, {rounds08(folder)} rounds, the median): production × PyTorch's best backend, and each "
           f"lesson row's time ÷ production's, lowest–highest over each group's 5 key counts (8k–128k).", "",
           "| shapes | production × PyTorch's best | k1 ÷ production | w1 ÷ production | c1 ÷ production |",
           "|---|---|---|---|---|"]
    for group, inside in GROUPS08:
        ks = [k for k in rows if inside(k) and "08" in rows[k]]
        if not ks:
            continue
        x = [vs_peers08(rows[k]) for k in ks]
        cells = [f"{min(x):.3f}–{max(x):.3f}"]
        for who in ("08k1", "08w1", "08c1"):
            r = [rows[k][who]["ms"] / rows[k]["08"]["ms"] for k in ks if who in rows[k]]
            cells.append(f"{min(r):.3f}–{max(r):.3f}")
        out.append(f"| {group} | " + " | ".join(cells) + " |")
    fl = floor08(folder)
    line = []
    for nk in (8192, 131072):
        f = float(fl[(128, nk)][("static", 4, 128, 0, 1, 0)]["ms"])
        c = rows[(128, 128, 1, nk, 0)]
        line.append(f"at {nk // 1024}k keys the floor (static, 128 blocks) {f * 1e3:.1f} µs, step 08 ÷ floor "
                    f"{c['08']['ms'] / f:.3f}, cuDNN ÷ floor {c['cudnn']['ms'] / f:.3f}")
    out += ["", f"The read floor on the same machine (`fa_read_floor`, `{rel(folder)}/floor.csv`), B·H = 128 with one "
                f"query: " + "; ".join(line) + "."]
    return out


NCU_GROUPED08 = "tries/step08_ncu_grouped"  # ncu at 03ee74b: the TMA split kernel at B·H = 32 (64k) and 16 K/V heads
# Offsets in that binary's SASS (sass.csv): the compute warps' branch back to the try-wait on a tile's `full`
# mbarrier, and the first of O's 64 rescale multiplies (taken where a row of the warp has a new max).
NCU_WAIT08, NCU_RESCALE08 = "0x2540", "0x3070"


def table_step08_ncu_grouped(D):
    """The split kernel under Nsight Compute at two shapes that read the same bytes with the same blocks and chunks:
    B·H = 32, one query, 64k keys, against 16 K/V heads of 8 query heads, 128k keys."""
    folder = os.path.join(D.folder, NCU_GROUPED08)
    def metric(name, what):
        for r in load(folder, name):
            if r["Metric Name"] == what:
                return float(r["Metric Value"].replace(",", ""))
    sass = {r["offset"]: r for r in load(folder, "sass.csv")}
    out = [f"Nsight Compute on the TMA split kernel (`{rel(folder)}/`, {device07(D, 'device.txt', folder)}, its second "
           f"launch of `fa_bench --decode`, clocks not locked; SpeedOfLight, WarpStateStats, SourceCounters), at two "
           f"shapes whose 128 blocks each stream 256 tiles (16k keys) of one head's K and V, 1 GiB in all:", "",
           "| shape | µs | DRAM throughput | instructions executed | tiles that rescale O | warp samples waiting "
           "for a tile |", "|---|---|---|---|---|---|"]
    for name, shape, suffix in (("details_bh32_64k.csv", "B·H = 32, one query, 64k keys (1 row a unit)", "bh32_64k"),
                                ("details_gqa16_128k.csv", "16 K/V heads × 8, one query, 128k keys (8 rows a unit)",
                                 "gqa16_128k")):
        tiles = int(sass[NCU_WAIT08][f"executed_{suffix}"])
        rescale = int(sass[NCU_RESCALE08][f"executed_{suffix}"])
        samples = sum(int(r[f"samples_{suffix}"]) for r in sass.values())
        wait = int(sass[NCU_WAIT08][f"samples_{suffix}"])
        out.append(f"| {shape} | {metric(name, 'Duration'):.1f} | {metric(name, 'DRAM Throughput'):.1f}% | "
                   f"{metric(name, 'Executed Instructions') / 1e6:.2f} M | {100 * rescale / tiles:.1f}% | "
                   f"{100 * wait / samples:.0f}% |")
    return out


FLOOR_BY_MACHINE08 = "tries/step08_floor_by_machine"  # GPU calls: the floor and step 08 at B·H = 128 on each H200


def table_step08_floor_by_machine(D):
    """The 8 GiB read (B·H = 128, 128k keys) on each H200 of the calls in FLOOR_BY_MACHINE08 and of two earlier floor
    runs: step 08, cuDNN, FlashAttention-2, and the floor by a static cut of 128 and 132 blocks and by chunks from a
    counter, with the static cut's first, median and last block's end; then u3 against production at B·H = 128 where
    a call timed it."""
    calls = os.path.join(D.folder, FLOOR_BY_MACHINE08)
    runs = [(os.path.join(FLOOR_BY_MACHINE08, c), f"`{c}/`", "08") for c in sorted(os.listdir(calls))
            if c.startswith("call")]
    runs += [(FLOOR08, "e092dbc's floor run", "08"), (K1_AGAIN08, "k1's run at 03ee74b", "08"),
             (COUNTER08, "`counter.patch`'s run", "08n1")]
    first = os.path.join(D.folder, runs[0][0])
    out = ["µs at B·H = 128 (one query for the kernels), 128k keys, bf16, d = 128: K and V 8 GiB, on "
           f"{device07(D, 'device.txt', first)}, each row one GPU call on the H200 it was lent (`{rel(calls)}/call*`: "
           "the lines of `nvidia-smi -q` that name the board in `board.txt`; and two earlier calls). The "
           "floor (`fa_read_floor`, the median of 15): K and V read by step 08's copy, a ring of four tiles, cut "
           "statically among 128 or 132 blocks (in brackets the first, median and last block's end, µs after the "
           "first block's start), or handed out by a counter in chunks of 4 tiles to 132 blocks. Step 08, cuDNN and "
           "FlashAttention-2 by `ab.py` in the same call (3 rounds, the median; the library of calls 1–4 was 03ee74b "
           "with `two_an_sm.patch`, which adds lesson row u3, and of call 5 ec446f1, the final code; in `counter.patch`'s "
           "run, its row n1, production before the counter).", "",
           "| call | board | step 08 | cuDNN | FA-2 | floor: static, 128 blocks | static, 132 | counter, 4 tiles | "
           "counter ÷ static 128 | u3 ÷ production, B·H = 128 |", "|---|---|---|---|---|---|---|---|---|---|"]
    def board(path):  # the board's part number, where the call kept nvidia-smi's lines
        f = os.path.join(path, "board.txt")
        part = [ln.split(":")[1].strip() for ln in open(f) if ln.startswith("Board Part Number")] \
            if os.path.exists(f) else []
        return part[0] if part else "—"
    for folder, name, who in runs:
        path = os.path.join(D.folder, folder)
        rows = decode08_ab(D, path)
        c = rows.get((128, 128, 1, 131072, 0), {})
        us = lambda w: f"{c[w]['ms'] * 1e3:.1f}" if w in c else "—"  # noqa: E731
        fl = floor08(path)[(128, 131072)]
        st, st132, flow = (fl[(k, 4, n, ch, 1, 0)] for k, n, ch in (("static", 128, 0), ("static", 132, 0),
                                                                  ("flow", 132, 4)))
        u3 = [r["08u3"]["ms"] / r[who]["ms"] for k, r in rows.items() if k[:3] == (128, 128, 1) and "08u3" in r]
        ends = ", ".join(f"{float(st[e]):.0f}" for e in ("first_end_us", "median_end_us", "last_end_us"))
        out.append(f"| {name} | {board(path)} | {us(who)} | {us('cudnn')} | {us('flash')} | "
                   f"{float(st['ms']) * 1e3:.1f} ({ends}) | {float(st132['ms']) * 1e3:.1f} | "
                   f"{float(flow['ms']) * 1e3:.1f} | {float(flow['ms']) / float(st['ms']):.3f} | " +
                   (f"{min(u3):.3f}–{max(u3):.3f}" if u3 else "—") + " |")
    return out


FLOW08 = "tries/step08_flow"  # ab.py at bbbda07 + flow.patch: f0 (chunks of 32 tiles, a block each), f1 (a counter)
COUNTER08 = "tries/step08_flow/counter"  # ab.py at 4b42e2f + counter.patch: the counter in production, n1, f1–f3
COUNTER08_SM_TILES = 384  # counter.patch's kCounterMinTilesPerSm: the plan takes the counter where every SM's share
#                           of the 64-key tiles is at least this (and the static plan at most one wave)


def table_step08_flow(D):
    """Tried, not kept: whole units' chunks of 32 tiles, a block each (f0) and taken from a counter by a persistent
    grid (f1), beside production in one ab.py run on a machine of the slowest class; then f1 ÷ production by group."""
    out, ratio = step08_versions(D, os.path.join(D.folder, FLOW08), "08",
                                 [("08f0", "a block a chunk (f0)", "÷ production"),
                                  ("08f1", "chunks from a counter (f1)", "÷ production")], "the three", "production")
    cells = []
    for group, inside in GROUPS08:
        r = {k[3] // 1024: x for k, x in ratio["08f1"].items() if inside(k)}
        if r:
            cells.append(f"{group}: " + ", ".join(f"{nk}k {x:.3f}" for nk, x in sorted(r.items())))
    return out + ["", "f1 ÷ production, by group and keys: " + "; ".join(cells) + "."]


def table_step08_counter(D):
    """counter.patch timed: chunks from a counter of 16, 32 and 64 tiles (f2, f1, f3) beside production before the
    counter (n1), one ab.py run; then production with the counter (row 08: f1 where the plan takes the counter, n1
    elsewhere) ÷ n1 where the plan takes it, and each chunk size ÷ n1 by group."""
    folder = os.path.join(D.folder, COUNTER08)
    rows = decode08_ab(D, folder)
    out, ratio = step08_versions(D, folder, "08n1", [("08f2", "16-tile chunks (f2)", "÷ n1"),
                                                     ("08f1", "32-tile chunks (f1)", "÷ n1"),
                                                     ("08f3", "64-tile chunks (f3)", "÷ n1")],
                                 "the five", "production before the counter (n1)", rows)
    sms = floor_sms(folder)
    taken = [k for k in ratio["08f1"] if k[1] * k[3] // 64 >= COUNTER08_SM_TILES * sms]
    prod = [rows[k]["08"]["ms"] / rows[k]["08n1"]["ms"] for k in taken]
    first = {}  # (B·H, H_kv): the fewest keys at which the plan takes the counter
    for k in taken:
        first[k[:2]] = min(first.get(k[:2], k[3]), k[3])
    where = ", ".join(f"B·H = {h}" + ("" if h == hk else f" with {hk} K/V heads") + f" from {n // 1024}k keys"
                      for (h, hk), n in sorted(first.items(), reverse=True))
    out += ["", f"Production with the counter ÷ n1 at the {len(taken)} shapes where the plan takes the counter (every "
                f"SM's share at least {COUNTER08_SM_TILES} tiles on {sms} SMs: {where}): {min(prod):.3f}–{max(prod):.3f}; "
                f"elsewhere production is n1's kernel.", ""]
    for b, name in (("08f2", "16 tiles"), ("08f1", "32 tiles"), ("08f3", "64 tiles")):
        cells = []
        for group, inside in GROUPS08:
            r = [x for k, x in ratio[b].items() if inside(k)]
            if r:
                cells.append(f"{group} {min(r):.3f}–{max(r):.3f}")
        out.append(f"- {name} ÷ n1, by group: " + "; ".join(cells) + ".")
    return out


def table_step08_s_ahead(D):
    """Tried and not kept: the TMA kernel's S one tile ahead ("08", and its t1) beside c889df3 ("08@base"), one
    process: one line, and how many shapes either build is behind PyTorch's best there."""
    folder = os.path.join(D.folder, SAHEAD08)
    rows = decode08_ab(D, folder)
    keys = [k for k in rows if "08" in rows[k] and "08@base" in rows[k]]
    r = [rows[k]["08"]["ms"] / rows[k]["08@base"]["ms"] for k in keys]
    below = {w: behind_peers08(rows, w, keys) for w in ("08", "08@base")}
    return [f"S one tile ahead ÷ c889df3, in one process (`{rel(folder)}/`, {rounds08(folder)} rounds, on "
            f"{device07(D, 'device.txt', folder)}): {min(r):.3f}–{max(r):.3f} over the {len(r)} shapes, geometric "
            f"mean {statistics.geometric_mean(r):.4f}; {faster_slower08(r, 0.5)}. On that machine both builds were "
            f"behind PyTorch's best at {len(below['08'])} and {len(below['08@base'])} shapes (the lowest "
            f"{min(below['08'], default=1):.3f} and {min(below['08@base'], default=1):.3f})."]


def table_step08_tma_promotion(D):
    """The first TMA ring, tried beside production (the warps' cp.async, d059ac8) with the tensor map's 256-byte L2
    promotion (the try's t1) and without it (its t2), in one ab.py run."""
    return step08_tries(D, TMA08_PROMOTION, [("08t1", "TMA, 256-byte L2 promotion", "÷ production", "With the promotion"),
                                             ("08t2", "TMA, no promotion", "÷ production", "Without it")])


TIMELINE08 = "ab/timeline08"  # tools/bench/timeline.py --decode at 5890d01: step 08 and cuDNN


def table_step08_timeline(D):
    """One decoding call's kernels as the GPU ran them (timeline.py --decode, a CUPTI trace, medians of 7 calls):
    for step 08 and cuDNN, the split kernel, what the call takes after it ends (the merge), and the whole call."""
    folder = os.path.join(D.folder, TIMELINE08)
    calls = {}
    for name in ("timeline08.csv", "timeline08_gqa.csv"):
        for r in load(folder, name):
            key = tuple(int(r[k]) for k in ("H", "H_kv", "N", "N_kv", "causal"))
            c = calls.setdefault(key, {}).setdefault(r["impl"], {})
            if r["part"] == "kernel0":
                c["split"] = float(r["us"])
            elif r["part"] == "span":
                c["span"] = float(r["us"])
    out = [f"bf16, d = 128, B = 1, on {device07(D, 'device.txt', folder)}: one call's kernels as the GPU ran them "
           f"(`tools/bench/timeline.py --decode`, a CUPTI trace; `{rel(folder)}/`), µs, the median of 7 calls, each "
           "after the L2 flush as ab.py times it. \"After it\": from the split kernel's end to the call's last "
           "kernel's end (the merge; step 08's merge kernel is launched early and waits, so it starts with the "
           "split kernel).", "",
           "| B·H | H_kv | N_q | N_kv | causal | step 08: split kernel | after it | call | cuDNN: split kernel | "
           "after it | call | split kernel, step 08 ÷ cuDNN |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for k in sorted(calls, key=order08):
        a, b = calls[k]["08"], calls[k]["torch-cudnn"]
        out.append(f"| {shape08(k)} | {a['split']:.1f} | {a['span'] - a['split']:.1f} | {a['span']:.1f} | "
                   f"{b['split']:.1f} | {b['span'] - b['split']:.1f} | {b['span']:.1f} | {a['split'] / b['split']:.3f} |")
    return out


TREE08 = "tries/step08_merge_tree"  # ab.py's runs of the merge's latency: run1 (statistics), run2 (weights)


def table_step08_tree(D):
    """The merges' own latency: two ab.py runs, each production beside the version it replaced. run1: the merge
    kernel's statistics folded in order by every thread (08x1) against in a tree by warp 0 (08); run2: the split
    kernel's four warps merged element by element (08x1) and the merge kernel's weights taken by every thread
    (08x2) against production (08)."""
    f1, f2 = (os.path.join(D.folder, TREE08, r) for r in ("run1", "run2"))
    r1, r2 = decode08_ab(D, f1), decode08_ab(D, f2)
    keys = [k for k in sorted(r1, key=order08) if k in r2 and k[2] == 1]
    out = [f"µs of step 08 (× PyTorch's best backend in the same run), bf16, d = 128, N_q = 1, B = 1, on "
           f"{device07(D, 'device.txt', f2)}; two runs of `tools/bench/ab.py` in one session "
           f"(`{rel(f1)}/`, `{rel(f2)}/`), 3 rounds each, the median. Run 1: the merge kernel's statistics folded "
           "in order by every thread, against a tree in warp 0 (with the split kernel's warps still merged element "
           "by element). Run 2: production, against the split kernel's four warps merged element by element and "
           "against the merge kernel's weights taken by every thread.", "",
           "| B·H | H_kv | N_q | N_kv | causal | run 1: folded | tree | tree ÷ folded | run 2: warps merged per element | "
           "production | production ÷ per element | weights per thread | production ÷ per thread |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    cell = lambda c, w: f"{c[w]['ms'] * 1e3:.1f} ({bold(vs_peers08(c, w))})"
    tree, row, once = [], [], []
    for k in keys:
        a, b = r1[k], r2[k]
        tree.append((k, a["08"]["ms"] / a["08x1"]["ms"]))
        row.append((k, b["08"]["ms"] / b["08x1"]["ms"]))
        once.append((k, b["08"]["ms"] / b["08x2"]["ms"]))
        out.append(f"| {shape08(k)} | {cell(a, '08x1')} | {cell(a, '08')} | {tree[-1][1]:.3f} | {cell(b, '08x1')} | "
                   f"{cell(b, '08')} | {row[-1][1]:.3f} | {cell(b, '08x2')} | {once[-1][1]:.3f} |")
    span = lambda xs, grouped: "–".join(f"{f(x for k, x in xs if (k[0] != k[1]) == grouped):.3f}" for f in (min, max))
    every = [(k, b["08"]["ms"] / b["08x1"]["ms"]) for k, b in r2.items() if "08x1" in b]
    out += ["", f"Time ÷ the version replaced, with grouped heads and without: the tree {span(tree, True)} and "
                f"{span(tree, False)}; the warps merged per row {span(row, True)} and {span(row, False)} "
                f"(over run 2's {len(every)} shapes, N_q = 16 too: {span(every, True)} and {span(every, False)}); "
                f"the weights taken once {span(once, True)} and {span(once, False)}."]
    s64 = [(k, a[w]["ms"] / a["08"]["ms"]) for k, a in r1.items() for w in ("08x2",) if w in a]
    s64r4 = [(k, a["08x3"]["ms"] / a["08"]["ms"]) for k, a in r1.items() if "08x3" in a]
    out += [f"In run 1, 64 splits (chunks of two tiles, 256 blocks at 4 K/V heads) took {span(s64, True)}× the "
            f"plan's time with grouped heads with a ring of two tiles (three blocks an SM) and {span(s64r4, True)}× "
            "with the ring of four (one block an SM)."]
    return out


def table_test08(D):
    return ["```"] + open(os.path.join(D.folder, "test08.txt")).read().strip().splitlines() + ["```"]


def table_ctest08(D):
    lines = open(os.path.join(D.folder, "ctest08.txt")).read().strip().splitlines()
    return ["```"] + lines + ["```"]


def table_sm80_08(D):
    lines = [x for x in open(os.path.join(D.folder, "sm80_08.txt")).read().splitlines()
             if "device code" in x or "All tests" in x or "tests passed" in x]
    return ["```"] + lines + ["```"]


def table_sass08(D):
    path = os.path.join(D.folder, "sass08.txt")
    lines = open(path).read().splitlines()[1:]
    out = [f"Per kernel (bf16; fp16 compiles to the same counts), from `cuobjdump --dump-sass` of the sm_90 build "
           f"(`{rel(path)}`):", ""]
    out += [f"- `{x.split('(')[0].replace('void ', '')}`: {x.split(': ')[-1]}" for x in lines if "bf16" in x]
    return out


# ---- step 09 ---------------------------------------------------------------------------
def table_test09(D):
    lines = open(os.path.join(D.folder, "test09.txt")).read().strip().splitlines()
    lines += open(os.path.join(D.folder, "nccl09.txt")).read().strip().splitlines()
    return ["```"] + lines + ["```"]


def table_step09_bench(D):
    """The ring over NCCL (step09_bench through ring09) against its local kernel on one GPU, every R that ran."""
    rows = []
    for path in sorted(glob.glob(os.path.join(D.folder, "bench09_r*.csv"))):
        rows += load(D.folder, os.path.basename(path))
    dev = open(os.path.join(D.folder, "device09.txt")).read().splitlines()
    nccl = next((x.split(":")[0] for x in dev if x.startswith("NCCL")), "NCCL")
    ranks = sorted({int(r["ranks"]) for r in rows})
    kernels = sorted({r.get("local_kernel") or "step06" for r in rows})
    out = [f"bf16, d = 128, B·H = 8, on {device07(D, 'device09.txt')}, {nccl}; "
           f"R = {', '.join(map(str, ranks))} ({len(ranks)} of the 1, 2, 4 asked for: the GPUs this machine has). "
           f"Local kernels: {', '.join('`' + k + '`' for k in kernels)}. "
           "Median of 10, the slowest rank's time; TFLOP/s per GPU = the whole problem's FLOPs / R / time "
           "(backward 2.5× the forward's); the local kernel alone on one GPU at the same N (strong scaling) "
           "and at N / R (weak).", "",
           "| R | N | causal | pass | ring: ms | ring: TFLOP/s per GPU | one GPU, N: TFLOP/s | "
           "one GPU, N / R: TFLOP/s | strong efficiency | weak efficiency |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (int(r["ranks"]), int(r["causal"]), int(r["N"]), r["dir"] == "bwd")):
        out.append(f"| {r['ranks']} | {r['N']} | {'yes' if r['causal'] == '1' else 'no'} | {r['dir']} | "
                   f"{float(r['ring_ms']):.2f} | {float(r['ring_tflops_per_gpu']):.0f} | {float(r['one_gpu_tflops']):.0f} | "
                   f"{float(r['one_gpu_NoverR_tflops']):.0f} | {float(r['strong_efficiency']):.2f} | "
                   f"{float(r['weak_efficiency']):.2f} |")
    out.append("")
    for R in ranks:
        for N in sorted({int(r["N"]) for r in rows if int(r["ranks"]) == R}):
            e = [float(r["strong_efficiency"]) for r in rows if int(r["ranks"]) == R and int(r["N"]) == N]
            out.append(f"- R = {R}, N = {N}: strong efficiency {min(e):.2f}–{max(e):.2f}.")
    return out


TABLES = {
    "steps": table_steps, "maxn": table_maxn, "traffic": table_traffic, "memory": table_memory, "peers": table_peers,
    "step01": lambda D: table_step(D, "01", "fwd"), "step01-bwd": lambda D: table_step(D, "01", "bwd"),
    "step02": lambda D: table_step(D, "02", "fwd"), "step03": lambda D: table_step(D, "03", "fwd"),
    "step04": lambda D: table_step(D, "04", "fwd"), "step05": lambda D: table_step(D, "05", "bwd"),
    "figures": table_figures, "step06": table_step06, "step06-fp16": lambda D: table_step06(D, "fp16"),
    "step06-dims": lambda D: table_step06(D, "bf16", "_dims"),
    "step06-lesson-fwd": lambda D: table_step06_lesson(D, "fwd"),
    "step06-lesson-bwd": lambda D: table_step06_lesson(D, "bwd"),
    "sass06": table_sass06, "step06-summary": table_step06_summary, "step06-versions": table_step06_versions, "step06-bwd-versions": table_step06_bwd_versions,
    "step01-bandwidth": table_bandwidth, "claims": table_claims, "traffic-m": table_traffic_m,
    "step07-peers": table_step07_peers, "step07-summary": table_step07_summary, "step07-lesson": table_step07_lesson,
    "sass07": table_sass07, "step07-gemm": table_step07_gemm, "ctest07": table_ctest07,
    "step07-persistent": table_step07_persistent, "step07-h9": table_step07_h9, "step07-b13": table_step07_b13,
    "step07-order": table_step07_order, "step07-last": table_step07_last,
    "step07-short-before": lambda D: table_step07_short(D, "short07_before"),
    "step07-short": lambda D: table_step07_short(D, "short07"), "step07-short128": table_step07_short128,
    "step07-repeats": table_step07_repeats, "step07-harness": table_step07_harness,
    "step07-rounds": table_step07_rounds, "step07-pause": table_step07_pause,
    "step07-bwd-peers": lambda D: table_step07_peers(D, "bwd"),
    "step07-bwd-summary": lambda D: table_step07_summary(D, "bwd"),
    "step07-bwd-lesson": table_step07_bwd_lesson, "step07-bwd-b5": table_step07_b5, "step07-bwd-b6": table_step07_b6,
    "step07-bwd-b7": table_step07_b7, "step07-bwd-b8": table_step07_b8, "step07-bwd-b9": table_step07_b9,
    "step07-bwd-b9-first": lambda D: table_step07_b9_run(D, "first", "the first run of b9 (commit c3a267c, where a "
                                                         "later tile's K_j, V_j and first query blocks all waited "
                                                         "for the last tile's epilogue)"),
    "step07-bwd-b9-second": lambda D: table_step07_b9_run(D, "second", "a second run, on another machine "
                                                          "(commit 041d6b0, the kernels of d65f9c8)"),
    "step07-bwd-b9-issue": table_step07_bwd_b9_issue,
    "step07-bwd-b10": table_step07_b10, "step07-bwd-b10-stalls": table_step07_bwd_stalls,
    "step07-bwd-b11": table_step07_b11, "step07-bwd-b11-first": table_step07_b11_first,
    "step07-bwd-b12": table_step07_b12, "step07-bwd-b12-runs": table_step07_b12_runs,
    "step07-bwd-b16": table_step07_b16,
    "step07-bwd-b16-line": table_step07_b16_line,
    "step07-det-now": table_step07_det_now, "step07-bwd-d256-stalls": table_step07_bwd_stalls_d256,
    "step07-bwd-b11-stalls": table_step07_bwd_stalls_b11,
    "step07-bwd-b9-call": lambda D: table_step07_bwd_call(D, os.path.join(AB, "bwd_b9"), "07b8", ("b8", "b9")),
    "step07-bwd-call": table_step07_bwd_call,
    "step07-bwd-vs-cudnn-ncu": table_step07_bwd_vs_cudnn_ncu,
    "step07-bwd-runs": table_step07_bwd_runs, "step07-bwd-spin": table_step07_bwd_spin,
    "step07-det": table_step07_det,
    "step07-bwd-memory": table_step07_bwd_memory, "step07-bwd-ncu": table_step07_bwd_ncu, "test07": table_test07,
    "step08-decode": table_step08_decode, "step08-summary": table_step08_summary, "step08-splits": table_step08_splits,
    "step08-shared": table_step08_shared, "step08-stream": table_step08_stream,
    "step08-lesson": table_step08_lesson, "step08-merge": table_step08_merge,
    "step08-early": table_step08_early, "step08-cluster": table_step08_cluster, "step08-tree": table_step08_tree, "test08": table_test08,
    "step08-ring": table_step08_ring, "step08-hint": table_step08_hint, "step08-hint-ncu": table_step08_hint_ncu,
    "step08-ncu-launch": table_step08_ncu_launch, "step08-ncu-tile": table_step08_ncu_tile,
    "step08-diet": table_step08_diet, "step08-pairs": table_step08_pairs,
    "step08-chains": table_step08_chains, "step08-loads-first": table_step08_loads_first,
    "step08-ring3": table_step08_ring3, "step08-timeline": table_step08_timeline,
    "step08-floor-work": table_step08_floor_work, "step08-floor-flow": table_step08_floor_flow,
    "step08-two": table_step08_two, "step08-lazy": table_step08_lazy,
    "step08-warp-rings": table_step08_warp_rings, "step08-wgmma": table_step08_wgmma, "step08-k32": table_step08_k32,
    "step08-tma": table_step08_tma, "step08-tma-promotion": table_step08_tma_promotion,
    "step08-tma-again": table_step08_tma_again, "step08-s-ahead": table_step08_s_ahead,
    "step08-tma-third": table_step08_tma_third, "step08-tma-two-groups": table_step08_tma_two_groups,
    "step08-machines": table_step08_machines, "step08-classes": table_step08_classes,
    "step08-behind": table_step08_behind, "step08-k1-again": table_step08_k1_again,
    "step08-ncu-grouped": table_step08_ncu_grouped, "step08-floor-by-machine": table_step08_floor_by_machine,
    "step08-machines-line": table_step08_machines_line, "step08-flow": table_step08_flow, "step08-counter": table_step08_counter, "step08-l2-fraction": table_step08_l2_fraction, "step08-tma-two-an-sm": table_step08_tma_two_an_sm,
    "step08-floor": table_step08_floor, "step08-floor-summary": table_step08_floor_summary, "step08-floor-cuts": table_step08_floor_cuts, "step08-floor-more": table_step08_floor_more,
    "step08-ring-long": table_step08_ring_long, "step08-tags": table_step08_tags, "step08-wide": table_step08_wide, "step08-eight": table_step08_eight, "step08-release-first": table_step08_release_first,
    "ctest08": table_ctest08, "sm80-08": table_sm80_08,
    "sass08": table_sass08, "test09": table_test09, "step09-bench": table_step09_bench,
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
