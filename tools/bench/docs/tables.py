"""The generated tables: one function a table, each taking the results folder (data.Data) and returning the lines
that go between its markers. TABLES names them; README.md and notes/*.md call them by those names.

Only the tables a lesson or the README shows are here; what the lab keeps is frozen text in notes/lab/."""
import csv
import glob
import os
import re
import statistics

from .data import (AB07, PEERS08, ROOT, WORD, ab_medians, best_peer, bold, bold3, compare07, decode08,
                   decode08_ab, device_words, fmt_bytes, fmt_ms, load, order08, production07, rel, rounds, span,
                   text, vs_peers08, yes)

# ---- steps 01-05, the claims, PyTorch's backends (README, notes 01-05, bench.md) ---------------------
STEP_ROWS = [("01", "fwd", "naive: S, P in device memory", "notes/01_naive.md"),
             ("02", "fwd", "fused, no softmax", "notes/02_fused.md"),
             ("03", "fwd", "online softmax, Q outer", "notes/03_online_softmax.md"),
             ("04", "fwd", "K/V outer (Algorithm 1)", "notes/04_kv_outer.md"),
             ("01", "bwd", "naive backward: P, dP, dS in memory", "notes/01_naive.md"),
             ("05", "bwd", "backward by recomputation", "notes/05_backward.md")]


def steps(D, N=4096, d=64):
    """README: one row per step at one shape, with the fp32 peer beside it."""
    out = [f"Measured at B·H·N = 65536 (B = 1, H = {65536 // N}), N = {N}, d = {d}, not causal, fp32, on "
           f"{D.device}; median of 7 (`tools/bench/run_all.sh`).", "",
           "| step | what | direction | ms | TFLOP/s | vs step 01 | vs PyTorch efficient (fp32) | extra memory |",
           "|---|---|---|---|---|---|---|---|"]
    for step, direction, what, note in STEP_ROWS:
        r = D.find(D.bench, step=step, dir=direction, N=N, d=d, causal=0)
        base = D.find(D.bench, step="01", dir=direction, N=N, d=d, causal=0)
        peer = D.find(D.peers, impl="torch-efficient", dir=direction, dtype="fp32", N=N, d=d, causal=0)
        if r:
            out.append(f"| [{step}]({note}) | {what} | {WORD[direction]} | {fmt_ms(r['ms'])} | "
                       f"{float(r['tflops']):.2f} | {float(base['ms']) / float(r['ms']):.2f}× | "
                       f"{float(peer['ms']) / float(r['ms']):.2f}× | {fmt_bytes(r['scratch_bytes'])} |")
    for impl in ("torch-math", "torch-efficient"):
        for direction in ("fwd", "bwd"):
            r = D.find(D.peers, impl=impl, dir=direction, dtype="fp32", N=N, d=d, causal=0)
            if r:
                out.append(f"| PyTorch `{impl[6:]}` | `scaled_dot_product_attention`, fp32 | {WORD[direction]} | "
                           f"{fmt_ms(r['ms'])} | {float(r['tflops']):.2f} | — | — | {fmt_bytes(r['scratch_bytes'])} |")
    return out


def step(D, which, direction):
    """A step's note: its time for every N, d, causal, against step 01 at the same shape."""
    out = [f"Measured on {D.device}; B = 1, H = 65536 / N; median of 7 (`tools/bench/run_all.sh`). "
           f"Ratio: step 01's time over this step's (above 1: faster than naive).", "",
           "| d | causal | N | ms | TFLOP/s | vs step 01 |", "|---|---|---|---|---|---|"]
    for r in D.bench:
        if r["step"] == which and r["dir"] == direction and r["status"] == "ok":
            base = D.find(D.bench, step="01", dir=direction, N=r["N"], d=r["d"], causal=r["causal"])
            ratio = f"{float(base['ms']) / float(r['ms']):.2f}×" if base else "—"
            out.append(f"| {r['d']} | {yes(r['causal'])} | {r['N']} | {fmt_ms(r['ms'])} | {float(r['tflops']):.2f} "
                       f"| {ratio} |")
    return out


def bandwidth(D, which="01", d=64):
    """Bytes a step moves by its formula, over its measured time: is HBM its limit?"""
    out = [f"Step {which} forward, d = {d}, not causal: the bytes its formula says it moves, over its time, on "
           f"{D.device}; compare with the ~4 TB/s that a large device-to-device copy reached on this GPU.", "",
           "| N | H | formula (GB) | ms | implied bandwidth (TB/s) |", "|---|---|---|---|---|"]
    for r in D.bench:
        if r["step"] == which and r["dir"] == "fwd" and r["d"] == str(d) and r["causal"] == "0" and r["status"] == "ok":
            b = float(r["formula_bytes"])
            out.append(f"| {r['N']} | {r['H']} | {b / 1e9:.2f} | {fmt_ms(r['ms'])} | "
                       f"{b / (float(r['ms']) * 1e-3) / 1e12:.2f} |")
    return out


def maxn(D):
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
        out.append(f"| {r['step']} | {WORD[r['dir']]} | {r['N']} | {fmt_ms(r['ms'])} | "
                   f"{fmt_bytes(r['scratch_bytes'])} | {why} |")
    return out


def traffic(D):
    tokens = int(D.traffic[0]["H"]) * int(D.traffic[0]["N"]) if D.traffic else 0
    out = [f"HBM traffic at d = 64, B = 1, H = {tokens} / N: the note's formula (= the CPU model's count) and the "
           f"DRAM bytes Nsight Compute measured (`tools/bench/ncu_traffic.py`), on {D.device}. "
           f"Q, K, V and O together take {4 * tokens * 64 * 4 / 2**20:.0f} MiB.", "",
           "| step | direction | N | formula (MB) | DRAM read (MB) | DRAM write (MB) | measured / formula |",
           "|---|---|---|---|---|---|---|"]
    for r in D.traffic:
        out.append(f"| {r['step']} | {WORD[r['dir']]} | {r['N']} | {int(r['formula_bytes']) / 1e6:.1f} | "
                   f"{float(r['dram_read_bytes']) / 1e6:.1f} | {float(r['dram_write_bytes']) / 1e6:.1f} | "
                   f"{float(r['measured_over_formula']):.3f} |")
    return out


def memory(D, d=64):
    """Step 05's note: device memory and time of the two backwards, N up to what step 01 holds."""
    rows = load(D.folder, "memory.csv")
    out = [f"Backward at B = H = 1, d = {d}, not causal, on {D.device} (`fa_bench --steps 01,05 --dir bwd`). "
           f"Peak device memory: Q, K, V, O, L, dO, dQ, dK, dV plus the step's scratch. The last N is the "
           f"largest power of two whose step-01 scratch the GPU holds (the next needs 4x as much).", "",
           "| N | step 01: peak memory | of which scratch | step 01: ms | step 05: peak memory | of which scratch "
           "| step 05: ms |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["step"] != "01":
            continue
        s5 = next((x for x in rows if x["step"] == "05" and x["N"] == r["N"]), None)
        cell5 = (f"{fmt_bytes(s5['total_bytes'])} | {fmt_bytes(s5['scratch_bytes'])} | {fmt_ms(s5['ms'])}"
                 if s5 and s5["status"] == "ok" else "— | — | —")
        out.append(f"| {r['N']} | {fmt_bytes(r['total_bytes'])} | {fmt_bytes(r['scratch_bytes'])} | "
                   f"{fmt_ms(r['ms']) if r['status'] == 'ok' else 'does not fit'} | {cell5} |")
    return out


def peers(D, N=4096):
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
                out.append(f"| {dtype} | {d} | {WORD[direction]} | " + " | ".join(cells) + " |")
    return out


def claims(D, Ns=(1024, 2048, 4096, 8192, 16384)):
    """The lecture's speed claim: fused steps over standard attention (PyTorch math, step 01), one run."""
    ours = load(D.folder, "claims.csv") + load(D.folder, "claims06.csv")
    theirs = load(D.folder, "claims_peers.csv")

    def ms(rows, direction, n, dtype="fp32", **kw):
        r = D.find(rows, dir=direction, N=n, d=64, causal=0, dtype=dtype, **kw)
        return float(r["ms"]) if r else None

    out = [f"d = 64, not causal, B·H·N = 65536, on {D.device}, one run (`tools/bench/claims.sh`; median, L2 "
           f"flushed). Each cell: ms, and the speed-up over PyTorch's `math` backend in the same type "
           f"(standard attention: S and P in device memory, cuBLAS GEMMs), then over step 01.", "",
           "| direction | N | `math` fp32 | step 01 | fused fp32 | `math` bf16 | step 06 (bf16) |",
           "|---|---|---|---|---|---|---|"]
    f32_math, f32_01, b16_math = [], [], []
    for direction, fused in (("fwd", "03"), ("bwd", "05")):
        for n in Ns:
            m32, m16 = ms(theirs, direction, n, impl="torch-math"), ms(theirs, direction, n, "bf16", impl="torch-math")
            s01, sf = ms(ours, direction, n, step="01"), ms(ours, direction, n, step=fused)
            s06 = ms(ours, direction, n, "bf16", step="06")
            if None in (m32, m16, s01, sf, s06):
                continue
            f32_math.append(m32 / sf)
            f32_01.append(s01 / sf)
            b16_math.append(m16 / s06)
            out.append(f"| {WORD[direction]} | {n} | {fmt_ms(m32)} | {fmt_ms(s01)} | step {fused}: {fmt_ms(sf)} "
                       f"({m32 / sf:.2f}×, {s01 / sf:.2f}×) | {fmt_ms(m16)} | {fmt_ms(s06)} ({m16 / s06:.1f}×) |")

    def times(x):
        return f"{min(x):.2f}–{max(x):.2f}×" if max(x) < 10 else f"{min(x):.0f}–{max(x):.0f}×"

    def against(x):  # how a range of speed-ups sits against the lecture's 2–4×
        return ("more than the lecture's 2–4×" if min(x) > 4 else "less than the lecture's 2–4×" if max(x) < 2
                else "in or near the lecture's 2–4×")
    if f32_math:
        out += ["", f"In 16 bits, step 06 runs at {times(b16_math)} the speed of standard attention: "
                f"{against(b16_math)} (PyTorch's `math` backend writes and reads S and P and runs a softmax "
                f"kernel between its GEMMs, all in device memory). The fp32 steps run at {times(f32_01)} the "
                f"speed of step 01 and {times(f32_math)} that of PyTorch's `math` in fp32: "
                f"{against(f32_01 + f32_math)}. On CUDA cores their inner loops are one FMA per "
                f"one or two shared-memory loads — bound by shared-memory bandwidth, like step 01's own GEMMs "
                f"([02](notes/02_fused.md)), while cuBLAS's fp32 GEMMs are not. Fusion removes the HBM traffic "
                f"the lecture counts; it turns into speed once the arithmetic is fast enough for that traffic to be "
                f"the limit."]
    return out


def traffic_m(D):
    """Steps 02-04's counted traffic against the on-chip budget M (`flashattn traffic`, CPU models)."""
    data = [r for r in load(os.path.join(ROOT, "notes", "results", "cpu"), "traffic_vs_m.csv") if r["causal"] == "0"]
    if not data:
        return ["(not generated yet: `flashattn traffic > notes/results/cpu/traffic_vs_m.csv`)"]
    out = [f"N = {data[0]['N']}, d = {data[0]['d']}, not causal, one head: the CPU models' counted HBM traffic "
           f"(elements read + written; each equals its formula) with b × b blocks chosen from an on-chip budget of M "
           f"elements (`tiles::tiles_for`), and that traffic over N²d²/M — a constant while b ≪ d "
           f"(`flashattn traffic`; the file `notes/results/cpu/traffic_vs_m.csv`, causal rows too).", "",
           "| M (elements) | b | step 02 | × N²d²/M | step 03 | × N²d²/M | step 04 (G = T_r) | × N²d²/M |",
           "|---|---|---|---|---|---|---|---|"]
    for M in sorted({int(r["M"]) for r in data}):
        cells = {r["step"]: r for r in data if int(r["M"]) == M}
        if set(cells) != {"02", "03", "04"}:
            continue
        bound = float(cells["02"]["n2d2_over_M"])
        total = {s: int(c["model_read"]) + int(c["model_written"]) for s, c in cells.items()}
        out.append(f"| {M} | {cells['02']['br']} | " +
                   " | ".join(f"{total[s] / 1e6:.2f} M | {total[s] / bound:.2f}" for s in ("02", "03", "04")) + " |")
    return out


def figures(D):
    return [f"![{n}]({rel(D.path(n + '.png'))})"
            for n in ("speedup_vs_n", "claims_memory", "time_vs_n", "tflops_vs_n", "hbm_vs_n", "memory_vs_n")
            if os.path.exists(D.path(n + ".png"))]


def transcript(*names):
    """A device run's summary file(s) as they are, in a code block, less the commit a run names."""
    def table(D):
        lines = [x for n in names for x in text(D.folder, n).strip().splitlines()]
        return ["```"] + [re.sub(r"commit [0-9a-f]{7,40}(: |, | )?", "", x) for x in lines] + ["```"]
    return table


# ---- steps 06, 07, 08 against their peers, in one table (README) --------------------------------
DECODE08 = "ab/decode08_03ee74b"  # ab.py's decoding run of step 08's production kernels


def k_(n):
    return f"{n // 1024}k"


def shapes_words(which, keys):
    """The shapes a row of the speed table covers, in words, from its keys."""
    if which == "08":  # (H, H_kv, N_q, N_kv, causal)
        heads = sorted({(x[0], x[1]) for x in keys})
        return ("B·H = " + ", ".join(str(h) if h == kv else f"{h} (H_kv = {kv})" for h, kv in heads) +
                "; N_q = " + ", ".join(str(n) for n in sorted({x[2] for x in keys})) +
                f"; N_kv = {k_(min(x[3] for x in keys))}–{k_(max(x[3] for x in keys))}" +
                ("; causal and not" if len({x[4] for x in keys}) > 1 else ""))
    words = f"N = {k_(min(x[0] for x in keys))}–{k_(max(x[0] for x in keys))}, causal and not"
    return words + (", B·H·N = " + ", ".join(k_(t) for t in sorted({x[1] for x in keys})) if which == "07" else "")


def speed(D):
    """Steps 06, 07 and 08 against PyTorch's backends: per step, pass and d, the range over the shapes of the step's
    speed over each peer's, each ratio from one run (06: fa_bench beside peers.py; 07, 08: ab.py, one process)."""
    groups = []  # (step, pass, d, speed in words, [(shape key, step's speed, {peer: speed})]); keys: 06 (N, causal),
    # 07 (N, B·H·N), 08 (H, H_kv, N_q, N_kv, causal)

    def tflops(cells):
        return f"{min(c[1] for c in cells):.0f}–{max(c[1] for c in cells):.0f} TFLOP/s"
    b06, p06 = load(D.folder, "bench06.csv"), load(D.folder, "peers06.csv")
    for direction in ("fwd", "bwd"):
        for d in ("64", "128"):
            cells = [((int(r["N"]), int(r["causal"])), float(r["tflops"]),
                      {x["impl"][6:]: float(x["tflops"]) for x in p06 if x["status"] == "ok" and x["dtype"] == "bf16"
                       and all(x[k] == r[k] for k in ("dir", "d", "causal", "N"))})
                     for r in b06 if r["step"] == "06" and r["status"] == "ok" and r["dir"] == direction and r["d"] == d]
            groups.append(("06", WORD[direction], d, tflops(cells), cells))
    for direction in ("fwd", "bwd"):
        rows = production07(D, direction)
        for d in (64, 128, 256):
            cells = [((k[3], k[0]), r["step07"], {p: r[p] for p in ("flash", "cudnn") if p in r})
                     for k, r in sorted(rows.items()) if k[1] == d and "step07" in r]
            groups.append(("07", WORD[direction], d, tflops(cells), cells))
    dec = decode08_ab(D.path(DECODE08))
    for grouped in (False, True):
        got = {k: c for k, c in dec.items() if "08" in c and (k[0] != k[1]) == grouped}
        cells = [(k, 1 / c["08"]["ms"], {p: 1 / c[p]["ms"] for p in ("flash", "cudnn", "efficient") if p in c})
                 for k, c in sorted(got.items())]
        gbps = [c["08"]["gbps"] / 1e3 for c in got.values()]
        groups.append(("08", "decoding" + (", grouped K/V heads" if grouped else ""), 128,
                       f"{min(gbps):.2f}–{max(gbps):.2f} TB/s" if gbps else "—", cells))

    notes = {"06": "notes/06_tensor_cores.md", "07": "notes/07_hopper.md", "08": "notes/08_split_kv.md"}
    devs = [D.device_of("device.txt"), D.device_of("ab", "device.txt"), D.device_of(DECODE08, "device.txt")]
    dev = max(devs, key=len)
    if not all(dev.startswith(x) for x in devs):
        dev = "; ".join(f"step {s}: {x}" for s, x in zip(("06", "07", "08"), devs))
    out = [f"bf16, B = 1, on {dev}. Each ratio: the step's speed over the peer's at the same shape in the same run, "
           "lowest–highest over the shapes (bold: below 1.0); PyTorch's fastest: its fastest backend at each shape. "
           "Step 06: one run of `fa_bench` and `peers.py` (`bench06.csv`, `peers06.csv`; median of 10, L2 flushed); "
           f"steps 07 and 08: one process each (`tools/bench/ab.py`: the step and PyTorch's backends on the same "
           f"tensors, taking turns, {rounds(D.path(AB07['fwd']))} rounds of 10 repeats for step 07, "
           f"{rounds(D.path(DECODE08, 'ab08.csv'))} for step 08; the median). Step 08's speed: the fewest bytes "
           "(Q, K, V read once, O and L written) over the time.", "",
           "| step | pass | d | shapes | speed | × FlashAttention-2 | × cuDNN | at least PyTorch's fastest |",
           "|---|---|---|---|---|---|---|---|"]
    for which, what, d, fast, cells in groups:
        if cells:
            ratio = {p: [s / c[p] for _, s, c in cells if p in c] for p in ("flash", "cudnn")}
            ahead = sum(s >= max(c.values()) for _, s, c in cells if c)
            out.append(f"| [{which}]({notes[which]}) | {what} | {d} | {shapes_words(which, [c[0] for c in cells])} | "
                       f"{fast} | {span(ratio['flash'])} | {span(ratio['cudnn'])} | {ahead} of {len(cells)} |")
    return out


# ---- step 06 -------------------------------------------------------------------------------------
# (row, bench file suffix, step id in it, what it adds over the row before)
LESSON06 = {
    "fwd": [("v1", "_v1", "06", "mma.sync m16n8k16, softmax on the fragments, P in registers; 32-bit shared loads"),
            ("v2", "_v2", "06", "ldmatrix (.trans for V); cp.async double-buffered K/V; rows padded by 16 bytes"),
            ("v3", "", "06v3", "XOR-swizzled shared memory instead of padded rows"),
            ("v4", "", "06v4", "exp2 with the scale folded in: one FFMA + one MUFU.EX2 per score"),
            ("v5", "", "06v5", "128 query rows per block, 32 per warp: each K/V fragment feeds two mma"),
            ("v12", "", "06v12", "the mask's comparisons behind a warp-uniform branch instead of predicated on every "
             "block; before it, the causal query blocks launched heaviest first (64 rows a block at d = 64) and ℓ "
             "summed across the quad once, at the end"),
            ("v13", "", "06v13", "O and ℓ rescaled only when a row's max grows by more than 2^8; shuffles only then"),
            ("v15", "", "06v15", "128-key blocks at d = 64 without the mask, and the next K/V block's copies issued "
             "after the opening barrier: one barrier fewer per block")],
    "bwd": [("b1", "", "06b1", "dK/dV outer, 64 keys per block (4 warps × 16), dQ by fp32 float2 atomics"),
            ("b2", "", "06b2", "128 keys per block, 8 warps: Q_i, dO_i loaded and dQ atomics issued once per 128 keys"),
            ("b6", "", "06b6", "the mask behind a warp-uniform branch (as v12); with it, the key blocks with the most "
             "query blocks launched first, and 64-key blocks again at d = 64"),
            ("b7", "", "06b7", "32 keys per warp at d = 64 (4 warps, 128 keys; queries in two halves of 32)"),
            ("b8", "", "06b8", "at d = 128, FlashAttention-2's warp layouts with Pᵀ, dSᵀ in shared memory"),
            ("b11", "", "06b11", "one barrier fewer per query block (the next block's copies issued after the opening "
             "barrier), and the d = 128 loop's addresses computed once (XORs and immediate offsets)"),
            ("b13", "", "06b13", "Sᵀ and dPᵀ computed back to back, before the exponentials and the mask's branch (one "
             "basic block: ptxas interleaves the two products)")]}


def speed_cell(D, rows, peers_, which, direction, d, causal, N):
    """'TFLOP/s (× FA-2)' for one version at one shape, FA-2 from the same run's peers."""
    r = D.find(rows, step=which, dir=direction, d=d, causal=causal, N=N)
    f = D.find(peers_, impl="torch-flash", dir=direction, dtype="bf16", d=d, causal=causal, N=N)
    if not r:
        return "—"
    t = float(r["tflops"])
    return f"{t:.0f} ({t / float(f['tflops']):.2f})" if f else f"{t:.0f}"


def profiler06(D, which, direction, suffix, d="128", causal="0"):
    """Nsight Compute's warp instructions and largest stall (cycles per issued instruction) for one version."""
    v = {r["metric"]: float(r["value"]) for r in load(D.folder, f"ncu06{suffix}.csv")
         if r["version"] == which and r["dir"] == direction and r["d"] == d and r["causal"] == causal}
    if not v:
        return "—"
    x, name = max((v[k], k[6:].replace("_", " ")) for k in v if k.startswith("stall_"))
    return f"{v.get('instructions', 0) / 1e6:.0f} M instr., {name} {x:.2f}"


def lesson06(direction):
    def table(D):
        if direction == "fwd":
            cols = [("d = 64", 64, 0, 4096), ("d = 128", 128, 0, 4096), ("d = 128, causal", 128, 1, 4096)]
        else:
            cols = [("d = 64", 64, 0, 4096), ("d = 128", 128, 0, 4096), ("d = 128, N = 16384", 128, 0, 16384)]
        what = "forward" if direction == "fwd" else "backward (FLOPs: 2.5 × the forward's)"
        out = [f"bf16, B·H·N = 65536, N = 4096 unless noted, on {D.device}: TFLOP/s of the {what} "
               f"(× PyTorch FlashAttention-2 of the same run), and what Nsight Compute counted at d = 128, N = 4096 "
               f"(warp instructions; the largest stall, in cycles per instruction). Each row adds what it says to the "
               f"row above; the last row is the production kernel. "
               + ("v1 and v2 were measured in runs of their own, each beside FlashAttention-2 of that run; the other "
                  "rows in one run. " if direction == "fwd" else "One run. ")
               + "Every version, with the ones not kept: [the lab notebook](notes/lab/README.md).", "",
               "| step | the idea | " + " | ".join(c[0] for c in cols) + " | profiler |",
               "|---|---|" + "---|" * len(cols) + "---|"]
        for ver, suffix, which, idea in LESSON06[direction]:
            rows, p = load(D.folder, f"bench06{suffix}.csv"), load(D.folder, f"peers06{suffix}.csv")
            cells = [speed_cell(D, rows, p, which, direction, d, c, N) for _, d, c, N in cols]
            out.append(f"| {ver} | {idea} | " + " | ".join(cells) + f" | {profiler06(D, which, direction, suffix)} |")
        return out
    return table


def fa2_record(D, rows, peers_, dtype="bf16"):
    """'at least FlashAttention-2's speed in W of T shapes; the lowest ratio is …' for step 06's rows."""
    got = []
    for r in rows:
        f = D.find(peers_, impl="torch-flash", dir=r["dir"], dtype=dtype, N=r["N"], d=r["d"], causal=r["causal"])
        if r["step"] == "06" and r["status"] == "ok" and f:
            got.append((float(r["tflops"]) / float(f["tflops"]), r))
    if not got:
        return ""
    x, w = min(got, key=lambda g: g[0])
    return (f"at least FlashAttention-2's speed in {sum(g >= 1.0 for g, _ in got)} of {len(got)} shapes; the lowest "
            f"ratio is {x:.3f} ({WORD[w['dir']]}, d = {w['d']}, {'causal' if w['causal'] == '1' else 'not causal'}, "
            f"N = {w['N']})")


def step06(D, dtype="bf16"):
    """Step 06 (production kernels) beside PyTorch's backends, every shape, one run."""
    rows, p = load(D.folder, "bench06.csv"), load(D.folder, "peers06.csv")
    backends = [("flash", "FA-2")] + ([("cudnn", "cuDNN")] if any(x["impl"] == "torch-cudnn" for x in p) else [])
    out = [f"{dtype}, B = 1, H = 65536 / N, on {D.device}: step 06 (production: forward v15, backward b13) and "
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
            f = D.find(p, impl="torch-" + impl, dir=r["dir"], dtype=dtype, N=r["N"], d=r["d"], causal=r["causal"])
            cells.append(f"{float(f['tflops']):.1f} | {t / float(f['tflops']):.2f}" if f else "— | —")
        out.append(f"| {WORD[r['dir']]} | {r['d']} | {yes(r['causal'])} | {r['N']} | {fmt_ms(r['ms'])} | {t:.1f} | "
                   + " | ".join(cells) + " |")
    diffs = []  # how much the reference itself moves between runs
    for r in load(D.folder, "peers06_v2.csv"):
        f = D.find(p, impl=r["impl"], dir=r["dir"], dtype=r["dtype"], N=r["N"], d=r["d"], causal=r["causal"])
        if r["impl"] == "torch-flash" and r["status"] == "ok" and f:
            diffs.append(float(r["tflops"]) / float(f["tflops"]))
    if diffs:
        out += ["", f"FlashAttention-2 itself varies between runs: its forward on the same {len(diffs)} shapes, "
                f"measured in an earlier run (peers06_v2.csv), was between {min(diffs):.2f}× and "
                f"{max(diffs):.2f}× of this run's. Ratios near 1.0 are within that noise."]
    record = fa2_record(D, rows, p, dtype)
    return out + (["", record[0].upper() + record[1:] + "."] if record else [])


# ---- step 07 -------------------------------------------------------------------------------------
LESSON07_FWD = [("h1", "TMA + wgmma: two warpgroups compute, one of their threads issues the copies"),
                ("h2", "+ a producer warpgroup that only copies and gives its registers away (setmaxnreg)"),
                ("h3", "+ ping-pong: the consumers take turns on the tensor cores"),
                ("h4", "+ softmax of block j under P·V of block j−1, in each warpgroup"),
                ("h7", "+ three consumers (192 query rows) at d = 64; the production kernel at d = 256")]
H9 = ("h9", "**production** at d = 64 and 128: + a persistent grid, a block an SM taking tile after tile from a "
      "counter, the next tile's Q loading under the epilogue (its own run: TFLOP/s, × h7 in that run)")
H9_RUN = "ab/fwd_h9/ab07_h9.csv"


def ncu07(D):
    """{(version, d): {metric: value}} from ncu07.csv (Nsight Compute --csv, one launch per version, d = 64, 128).
    The production kernel (no version in its name) is h7's: fa_bench --once launches it as both, the later stands."""
    out, hdr = {}, None
    for r in csv.reader(open(D.path("ncu07.csv"))) if os.path.exists(D.path("ncu07.csv")) else []:
        if r and r[0] == "ID":
            hdr = r
        elif hdr and len(r) > hdr.index("Metric Value"):
            x = dict(zip(hdr, r))
            name = x["Kernel Name"]
            if not re.search(r"forward_kernel|version_kernel", name):  # (the bench's own kernels: random inputs)
                continue
            v, d = re.search(r"::(h\d)>", name), re.search(r"<[^,]+, (\d+),", name).group(1)
            out.setdefault((v.group(1) if v else "h7", d), {})[x["Metric Name"]] = x["Metric Value"].replace(",", "")
    return out


def lesson07(D):
    """Step 07's forward, one row per Hopper idea (fa_bench --versions, one run), and the production row (its run)."""
    rows, prof = load(D.folder, "versions07.csv"), ncu07(D)
    cols = [("d = 64", 64, 0, 16384), ("d = 128", 128, 0, 16384), ("d = 128, N = 4096", 128, 0, 4096),
            ("d = 128, causal", 128, 1, 16384), ("d = 256", 256, 0, 16384)]
    out = [f"bf16 forward, B·H·N = 131072, N = 16384 unless noted, on {D.device_of('device07.txt')}: TFLOP/s, rows "
           f"h1–h7 in one run (`fa_bench`). Profiler (Nsight Compute, one launch, N = 8192, not causal, d = 64 / "
           f"d = 128): tensor-pipe active (% of peak sustained) and warps stalled on a barrier (named barriers, "
           f"mbarrier waits: % of active warps). Row h9, the production kernel at d = 64 and 128, is from a run of "
           f"its own (`tools/bench/ab.py`, the median of 3 rounds), h7 timed beside it.", "",
           "| step | the idea | " + " | ".join(c[0] for c in cols) + " | tensor pipe | barrier stall |",
           "|---|---|" + "---|" * len(cols) + "---|---|"]

    def two(ver, metric):
        a, b = prof.get((ver, "64"), {}).get(metric), prof.get((ver, "128"), {}).get(metric)
        cell = [f"{float(x):.0f}%" if x and x != "n/a" else "—" for x in (a, b)]
        return "—" if cell == ["—", "—"] else " / ".join(cell)
    for ver, idea in LESSON07_FWD:
        cells = []
        for _, d, causal, N in cols:
            r = D.find(rows, step=f"07{ver}", dir="fwd", d=d, causal=causal, N=N)
            cells.append(f"{float(r['tflops']):.0f}" if r else "—")
        out.append(f"| {ver} | {idea} | " + " | ".join(cells) + f" | "
                   f"{two(ver, 'sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active')} | "
                   f"{two(ver, 'smsp__warp_issue_stalled_barrier_per_warp_active.pct')} |")
    m = ab_medians(D.path(H9_RUN))
    cells = []
    for _, d, causal, N in cols:
        new, old = m.get((131072, d, bool(causal), N, "07h9")), m.get((131072, d, bool(causal), N, "07h7"))
        cells.append(f"{new:.0f} ({new / old:.2f})" if new and old else "—")
    return out + [f"| {H9[0]} | {H9[1]} | " + " | ".join(cells) + " | — | — |"]


# The backward's rows: each a device run of its own (its folder or ab.py CSV), with cuDNN measured in it.
LESSON07_BWD = [
    ("b1", "bwd07_first", "TMA + wgmma + a producer warpgroup; dQ by TMA bulk reductions, at d = 64 each consumer's "
     "partial over its 64 keys (two reductions a query block)"),
    ("b5", "ab/bwd_b5", "+ at d = 64, K_c and V_c held in registers, so that Sᵀ's and dPᵀ's products read only Q_i and "
     "dO_i from shared memory; d = 256 in a second kernel, 64 keys a block, the consumers splitting dK's and dV's "
     "columns; dQ's pieces dealt to the consumers in turn"),
    ("b7", "ab/bwd_b7", "+ more queries a step, 96 at d = 64 and 80 at d = 128 (dQ's pieces computed transposed, "
     "dQᵢᵀ = K_jᵀ·dSᵀ), so that a step's fixed costs — its barriers, its waits, its exponentials' latency — are paid "
     "for more queries"),
    ("b9", "ab/bwd_b9/full", "+ a persistent grid: a block an SM, its producer taking tile after tile from a counter; "
     "and the call's fixed costs cut (dQ's accumulator zeroed by the preprocess, the kernels launched early by "
     "programmatic dependent launch)"),
    ("b11", "ab/bwd_b11/full", "+ the proxy fences after a consumer's own stores moved behind the next products' "
     "issue (d ≤ 128), and at d = 128 a step's dQ pieces computed in the next step, so that a consumer waits for the "
     "other's dSᵀ a step after it was stored"),
    ("b16", None, "**production**: + at d = 128, a writer of dQ's pieces per consumer; at d = 256, a step's second dQ "
     "piece staged in the next step, under its dPᵀ, so that the consumer does not wait at the step's end for the "
     "writer to empty the slot")]


def lesson07_bwd(D):
    cols = [(64, 0), (64, 1), (128, 0), (128, 1), (256, 0), (256, 1)]
    out = [f"bf16 backward, B·H·N = 131072, N = 16384, on {D.device_of('device07.txt')}; each row from a run of its "
           f"own, so TFLOP/s with the ratio to cuDNN of that run in brackets (the production row: the run of every shape "
           f"below).", "",
           "| step | the idea | " + " | ".join(f"d = {d}{', causal' if c else ''}" for d, c in cols) + " |",
           "|---|---|" + "---|" * len(cols)]
    for ver, folder, idea in LESSON07_BWD:
        rows = production07(D, "bwd") if folder is None else compare07.table(D.path(folder), "bwd")
        cells = []
        for d, c in cols:
            r = rows.get((131072, d, c, 16384), {})
            cells.append(f"{r['step07']:.0f} ({r['step07'] / r['cudnn']:.2f})" if "step07" in r and "cudnn" in r
                         else "—")
        out.append(f"| {ver} | {idea} | " + " | ".join(cells) + " |")
    return out


def peers07(D):
    """Step 07's production kernels, forward and backward, against cuDNN and FlashAttention-2 at every shape."""
    rows = {direction: production07(D, direction) for direction in ("fwd", "bwd")}
    Ns = sorted({k[3] for r in rows.values() for k in r})
    paths = ", ".join(f"`{rel(D.path(p))}`" for p in (AB07["fwd"], AB07["bwd"]))
    out = [f"bf16, B = 1, H = B·H·N / N, on {D.device_of('ab', 'device.txt')}, measured in one process "
           f"(`tools/bench/ab.py`: at each shape every implementation on the same tensors, taking turns, "
           f"{rounds(D.path(AB07['fwd']))} rounds of 10 repeats; the median of the rounds; {paths}). Each cell: step "
           f"07's TFLOP/s (× cuDNN, × FlashAttention-2); bold: below 1.0.", "",
           "| pass | B·H·N | d | causal | " + " | ".join(f"N = {n}" for n in Ns) + " |",
           "|---|---|---|---|" + "---|" * len(Ns)]
    cudnn, flash = [], []
    for direction, r in rows.items():
        for tokens, d, causal in sorted({k[:3] for k in r}):
            cells = []
            for n in Ns:
                c = r.get((tokens, d, causal, n), {})
                if "step07" not in c or "cudnn" not in c:
                    cells.append("—")
                    continue
                cudnn.append((c["step07"] / c["cudnn"], direction, d, causal, n, tokens))
                x = [bold(c["step07"] / c["cudnn"])]
                if "flash" in c:
                    flash.append(c["step07"] / c["flash"])
                    x.append(bold(c["step07"] / c["flash"]))
                cells.append(f"{c['step07']:.0f} ({', '.join(x)})")
            out.append(f"| {WORD[direction]} | {tokens} | {d} | {yes(causal)} | " + " | ".join(cells) + " |")
    x, direction, d, causal, n, tokens = min(cudnn)
    return out + ["", f"At least cuDNN's speed in {sum(c[0] >= 1 for c in cudnn)} of {len(cudnn)} shapes, the lowest "
                  f"{x:.3f}× ({WORD[direction]}, d = {d}{', causal' if causal else ''}, N = {n}, B·H·N = {tokens}); "
                  f"{min(flash):.2f}–{max(flash):.2f}× FlashAttention-2 in the {len(flash)} shapes that timed it."]


# ---- step 07 with grouped K/V heads and a window (an H100's run) ----------------------------------
GQA07 = "../h100/gqa07"  # beside the folder the other tables read
RAGGED07 = "../h100/ragged07"  # step 07 on a ragged batch, forward and backward


def ab_ms(path):
    """{(pass, G, d, causal, N, window, who): the median of the rounds' ms} of one ab.py CSV with groups or windows."""
    return ab_medians(path, lambda r: (r["dir"], int(r["H"]) // int(r["H_kv"]), int(r["d"]), r["causal"] == "1",
                                       int(r["N"]), (int(r["window_left"]), int(r["window_right"]))), "ms")


def gqa07(D):
    """Step 07 with G query heads a K/V head against the best of cuDNN and FlashAttention-2 (geometric mean and lowest
    over d, N and the mask), then its time with a sliding window."""
    folder = os.path.normpath(D.path(GQA07))
    out = [f"bf16, B·H·N = 131072, d = 64 and 128, N = 1k–16k, causal and not, on "
           f"{device_words(os.path.join(folder, 'device.txt'))}, in one process (`tools/bench/ab.py`, "
           f"`{rel(folder)}`). The peers called as a user would: `enable_gqa=True`, or K and V repeated where a "
           f"backend refuses it. × the best of the two: its time over step 07's; bold: below 1.0.", "",
           "| pass | query heads a K/V head | shapes | × the best of cuDNN and FlashAttention-2: geometric mean "
           "| lowest |", "|---|---|---|---|---|"]
    for direction in ("fwd", "bwd"):
        t = ab_ms(os.path.join(folder, f"ab07_gqa_{direction}.csv"))
        for G in sorted({k[1] for k in t}):
            ratios = []
            for k in sorted(k for k in t if k[1] == G and k[-1] == "07"):
                best = min(t[k[:-1] + (who,)] for who in ("cudnn", "flash") if k[:-1] + (who,) in t)
                ratios.append((best / t[k], k[2], k[3], k[4]))
            gm = statistics.geometric_mean(x[0] for x in ratios)
            x, d, causal, n = min(ratios)
            out.append(f"| {WORD[direction]} | {G} | {len(ratios)} | {bold(gm)} | {bold(x)} (d = {d}, N = {n}"
                       f"{', causal' if causal else ''}) |")
    windows = [(True, (-1, -1), "none"), (True, (4096, 0), "4096 keys back"), (True, (1024, 0), "1024 back"),
               (True, (256, 0), "256 back"), (False, (-1, -1), "none"), (False, (512, 512), "512 each side")]
    out += ["", "Its time with a window, N = 16384, d = 128, 8 heads (ms; the tiles outside the band skipped):", "",
            "| pass | " + " | ".join(f"{w} ({'causal' if c else 'no mask'})" for c, _, w in windows) + " |",
            "|---|" + "---|" * len(windows)]
    for direction in ("fwd", "bwd"):
        t = {**ab_ms(os.path.join(folder, f"ab07_window_{direction}.csv")),
             **ab_ms(os.path.join(folder, f"ab07_window2_{direction}.csv"))}
        out.append(f"| {WORD[direction]} | " + " | ".join(
            fmt_ms(t[(direction, 1, 128, c, 16384, w, "07")]) for c, w, _ in windows) + " |")
    # A ragged batch (its own run, `RAGGED07`): its TFLOP/s over the same kernel's on the dense batch [8, H, N, d]
    # (07r: those sequences packed, the same work; 07m: the same rows cut into N/2 and 3N/2, its own FLOPs). The
    # same kernel: the forward's persistent grid (07h9) where the run has it, as a ragged batch never takes the
    # short problems' kernel; then also against step 07's own choice (07) on the dense batch.
    folder = os.path.normpath(D.path(RAGGED07))
    t = {}
    for direction in ("fwd", "bwd"):
        name = "ab07_ragged.csv" if direction == "fwd" else "ab07_ragged_bwd.csv"
        t.update(ab_medians(os.path.join(folder, name), lambda r: (r["dir"], int(r["d"]), r["causal"] == "1",
                                                                    int(r["N"]))))
    ds = sorted({k[1] for k in t})
    out += ["", f"On a ragged batch of 8 sequences (the batch's own, packed; or its rows cut into N/2 and 3N/2 in "
            f"turn), B·H·N = 131072, N = 1k–8k, on {device_words(os.path.join(folder, 'device.txt'))} "
            f"(`{rel(folder)}`): TFLOP/s over the same kernel's on the dense batch [8, H, N, d], geometric mean "
            "(lowest):", "",
            "| pass | mask | " + " | ".join(f"{w}, d = {d}" for w in ("packed", "N/2, 3N/2") for d in ds) + " |",
            "|---|---|" + "---|" * 2 * len(ds)]
    def dense(k):  # the same kernel on the dense batch (at d = 256 both take step 07's block a tile, not 07h9's grid)
        return k[:-1] + ("07h9",) if k[:-1] + ("07h9",) in t and k[1] != 256 else k[:-1] + ("07",)
    own = []  # (ratio to step 07's own choice, d, N) of the packed forward with the mask
    for direction in ("fwd", "bwd"):
        for causal in (False, True):
            cells = []
            for who in ("07r", "07m"):
                for d in ds:
                    keys = [k for k in t if k[-1] == who and k[0] == direction and k[1] == d and k[2] == causal]
                    r = [t[k] / t[dense(k)] for k in keys]
                    cells.append(f"{bold(statistics.geometric_mean(r))} ({bold(min(r))})")
                    if who == "07r" and direction == "fwd" and causal:
                        own += [(t[k] / t[k[:-1] + ("07",)], d, k[3]) for k in keys]
            out.append(f"| {WORD[direction]} | {yes(causal)} | " + " | ".join(cells) + " |")
    x, d, n = min(own)
    return out + ["", f"Against step 07's own choice on the dense batch (its short problems' kernel at d = 64, N ≤ 2k "
                  f"with the mask), the packed forward with the mask is at {x:.2f} at d = {d}, N = {n}."]


# ---- step 08 -------------------------------------------------------------------------------------
LESSON08 = [("one thread block per query block: step 06", ".", "06"),
            ("16 packed rows, four warps split each tile, one split", ".", "08s1"),
            ("+ splits, merged by a fold (one thread per 4 columns)", "decode08_fold", "08"),
            ("+ the merge: statistics first, every split weighted", "decode08_merge", "08"),
            ("+ a ring of four tiles (one block an SM, its plan): step 08", ".", "08")]
LESSON08_SHAPES = [(32, 32, 1, 32768, 0), (32, 32, 16, 32768, 0), (128, 128, 1, 32768, 0), (32, 4, 1, 32768, 0),
                   (128, 16, 1, 8192, 0)]


def lesson08(D):
    """One measured row per idea: µs at a few shapes, and the ratio to PyTorch's best measured in the same run."""
    out = [f"µs (× PyTorch's best backend in the same run), bf16, d = 128, on {D.device_of('device08.txt')}; each row "
           "is a device run of its own (its folder), PyTorch measured in it.", "",
           "| what | " + " | ".join(f"B·H {k[0]}{', H_kv ' + str(k[1]) if k[1] != k[0] else ''}, N_q {k[2]}, "
                                    f"{k[3] // 1024}k" for k in LESSON08_SHAPES) + " |",
           "|---|" + "---|" * len(LESSON08_SHAPES)]
    for what, folder, who in LESSON08:
        rows, _ = decode08(D.path(folder))
        cells = [f"{float(rows[k][who]['ms']) * 1e3:.1f} ({vs_peers08(rows[k], who):.2f})"
                 if who in rows.get(k, {}) else "—" for k in LESSON08_SHAPES]
        out.append(f"| {what} | " + " | ".join(cells) + " |")
    return out


def decode(D):
    """Every decoding shape: step 08 (production) against PyTorch's best backend and step 06, and its bandwidth, in
    one ab.py run."""
    rows, (_, copy) = decode08_ab(D.path(DECODE08)), decode08(D.folder)
    out = [f"bf16, d = 128, B = 1, on {D.device_of(DECODE08, 'device.txt')}: the production kernels measured in one "
           f"process (`tools/bench/ab.py`: step 08, step 06 and PyTorch's backends on the same tensors, taking turns, "
           f"3 rounds; the median). GB/s: the fewest bytes (Q, K, V read once, O and L written) over the time, beside "
           f"this GPU's device-to-device copy, {copy:.0f} GB/s read + written (`fa_bench`, `bench08.csv`). PyTorch: "
           f"`scaled_dot_product_attention`'s fastest backend at the shape (flash = FlashAttention-2, cudnn, "
           f"efficient). Bold: below 1.0.", "",
           "| B·H | H_kv | N_q | N_kv | causal | step 08 ms | GB/s (× copy) | PyTorch best ms | step 08 × PyTorch | "
           "step 06 ms | × step 06 |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios = []
    for key in sorted(rows, key=order08):
        c = rows[key]
        if "08" not in c:
            continue
        (H, Hkv, N, Nk, causal), ms = key, c["08"]["ms"]
        who, best = best_peer(c)
        ratios.append(best / ms)
        s06 = c["06"]["ms"] if "06" in c else 0
        out.append(f"| {H} | {Hkv if Hkv != H else '—'} | {N} | {Nk // 1024}k | {yes(causal)} | {ms:.4f} | "
                   f"{c['08']['gbps']:.0f} ({c['08']['gbps'] / copy:.2f}) | {best:.4f} ({who}) | {bold3(best / ms)} | "
                   f"{s06:.4f} | {s06 / ms:.1f} |")
    below = [x for x in ratios if x < 1]
    return out + ["", f"Step 08 below PyTorch's best in {len(below)} of {len(ratios)} shapes "
                  f"({sum(x < 0.995 for x in below)} by more than 0.5%, {sum(x < 0.975 for x in below)} by more than "
                  f"2.5%; the lowest ratio {min(ratios):.3f})."]


PAGED08 = "../h100/paged08_tiles"  # ab.py's run of the paged and contiguous caches


def paged08(D):
    """Step 08 on a cache in shuffled pages of P positions (08pP) against itself on the same cache laid out
    contiguously (08) and against PyTorch's best on the contiguous cache: geometric mean and lowest over the shapes."""
    folder = os.path.normpath(D.path(PAGED08))
    t = {}
    for path in sorted(glob.glob(os.path.join(folder, "ab08_paged*.csv"))):
        t.update(ab_medians(path, lambda r: tuple(int(r[k]) for k in ("d", "H", "H_kv", "N", "N_kv", "causal")), "ms"))
    shapes = sorted({k[:-1] for k in t if k[:-1] + ("08",) in t})
    out = [f"bf16, B = 1, d = 64 and 128, one query (and 16 with the mask), 8k–128k keys, one K/V head a query head "
           f"and 8 query heads a K/V head, on {device_words(os.path.join(folder, 'device.txt'))}, in one process "
           f"(`tools/bench/ab.py`, `{rel(folder)}`): the same cache, contiguous and in shuffled pages. × contiguous: "
           f"step 08's time on it over the paged call's; × PyTorch: the fastest backend's time on the contiguous cache "
           f"(PyTorch takes no block table) over the call's. Bold: below 1.0.", "",
           "| cache | shapes | × contiguous: geometric mean | lowest | × PyTorch's best: geometric mean | lowest |",
           "|---|---|---|---|---|---|"]

    def at(k):
        d, H, Hkv, N, Nk, causal = k
        return (f"d = {d}, B·H {H}{f', H_kv {Hkv}' if Hkv != H else ''}, N_q {N}, {Nk // 1024}k"
                f"{', causal' if causal else ''}")

    for who, what in [("08", "contiguous")] + [(f"08p{P}", f"pages of {P}") for P in (16, 64, 256)]:
        got = [k for k in shapes if k + (who,) in t]
        if not got:
            continue
        own = [(t[k + ("08",)] / t[k + (who,)], k) for k in got]
        peer = [(min(t[k + (p,)] for p in PEERS08 if k + (p,) in t) / t[k + (who,)], k) for k in got
                if any(k + (p,) in t for p in PEERS08)]
        low, low_peer = min(own), min(peer)
        own_cells = ("— | —" if who == "08" else
                     f"{bold(statistics.geometric_mean(x for x, _ in own))} | {bold(low[0])} ({at(low[1])})")
        out.append(f"| {what} | {len(got)} | {own_cells} | {bold(statistics.geometric_mean(x for x, _ in peer))} | "
                   f"{bold(low_peer[0])} ({at(low_peer[1])}) |")
    return out


# ---- step 09 -------------------------------------------------------------------------------------
def bench09(D):
    """The ring over NCCL (step09_bench through ring09) against its local kernel on one GPU, every R that ran."""
    rows = [r for path in sorted(glob.glob(D.path("bench09_r*.csv"))) for r in load(D.folder, os.path.basename(path))]
    dev = text(D.folder, "device09.txt").splitlines()
    nccl = next((x.split(":")[0] for x in dev if x.startswith("NCCL")), "NCCL")
    ranks = sorted({int(r["ranks"]) for r in rows})
    kernels = sorted({r.get("local_kernel") or "step06" for r in rows})
    out = [f"bf16, d = 128, B·H = 8, on {D.device_of('device09.txt')}, {nccl}; "
           f"R = {', '.join(map(str, ranks))} ({len(ranks)} of the 1, 2, 4 asked for: the GPUs this machine has). "
           f"Local kernels: {', '.join('`' + k + '`' for k in kernels)}. "
           "Median of 10, the slowest rank's time; TFLOP/s per GPU = the whole problem's FLOPs / R / time "
           "(backward 2.5× the forward's); the local kernel alone on one GPU at the same N (strong scaling) "
           "and at N / R (weak).", "",
           "| R | N | causal | pass | ring: ms | ring: TFLOP/s per GPU | one GPU, N: TFLOP/s | "
           "one GPU, N / R: TFLOP/s | strong efficiency | weak efficiency |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (int(r["ranks"]), int(r["causal"]), int(r["N"]), r["dir"] == "bwd")):
        out.append(f"| {r['ranks']} | {r['N']} | {yes(r['causal'])} | {r['dir']} | {float(r['ring_ms']):.2f} | "
                   f"{float(r['ring_tflops_per_gpu']):.0f} | {float(r['one_gpu_tflops']):.0f} | "
                   f"{float(r['one_gpu_NoverR_tflops']):.0f} | {float(r['strong_efficiency']):.2f} | "
                   f"{float(r['weak_efficiency']):.2f} |")
    out.append("")
    for R in ranks:
        for N in sorted({int(r["N"]) for r in rows if int(r["ranks"]) == R}):
            e = [float(r["strong_efficiency"]) for r in rows if int(r["ranks"]) == R and int(r["N"]) == N]
            out.append(f"- R = {R}, N = {N}: strong efficiency {min(e):.2f}–{max(e):.2f}.")
    return out


def train(D):
    """The small GPT trained with SDPA and with the steps (python/examples/train_all.sh): each step against the SDPA run
    on the same order of the data, held to the band's width (the spread of SDPA under other orders), and the time an
    iteration. Its folder is notes/results/train, beside the GPUs' folders: its device.txt names the GPU it ran on."""
    folder = os.path.join(os.path.dirname(D.folder), "train")
    rows = load(folder, "train_summary.csv")
    if not rows:
        raise ValueError(f"no {rel(folder)}/train_summary.csv")
    sdpa_ms = {}
    for r in rows:
        if r["attention"] == "sdpa" and r["ms_per_iter"]:
            sdpa_ms.setdefault(r["dtype"], []).append(float(r["ms_per_iter"]))
    out = [f"A decoder-only transformer on characters (the Python standard library's source), one seed for the weights, "
           f"on {device_words(os.path.join(folder, 'device.txt'))}. The band: SDPA under "
           f"{len(sdpa_ms.get('bf16', []))} orders of the data; each step trains on the first and is held to SDPA's run "
           "on it, by no more than the band is wide. Curve: the mean training loss over each 100 iterations "
           "(`python/examples/train_all.sh`, `curves.py`).", "",
           "| type | parameters | attention | curve points within the band's width | largest gap (of the width) | "
           "final validation loss | SDPA's, same order | the band's | ms an iteration | × SDPA's (median) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["attention"] == "sdpa":
            continue
        base = statistics.median(sdpa_ms[r["dtype"]])
        ms = float(r["ms_per_iter"])
        out.append(f"| {r['dtype']} | {int(r['params']) / 1e6:.2f} M | step {r['attention']} | {r['points_within']} of "
                   f"{r['points']} | {r['worst_gap_of_width']} | {r['final_val_loss']} | {r['same_order_val']} | "
                   f"{r['band_final_val'].replace('-', '–')} | {ms:.2f} | {base / ms:.2f} |")
    out += ["", f"![train_curves]({rel(os.path.join(folder, 'train_curves.png'))})"]
    return out


TABLES = {
    # README
    "steps": steps, "claims": claims, "figures": figures, "speed": speed,
    # notes 01-05, bench.md
    "step01": lambda D: step(D, "01", "fwd"), "step01-bwd": lambda D: step(D, "01", "bwd"),
    "step02": lambda D: step(D, "02", "fwd"), "step03": lambda D: step(D, "03", "fwd"),
    "step04": lambda D: step(D, "04", "fwd"), "step05": lambda D: step(D, "05", "bwd"),
    "step01-bandwidth": bandwidth, "traffic-m": traffic_m, "memory": memory,
    "peers": peers, "maxn": maxn, "traffic": traffic,
    # note 06
    "step06-lesson-fwd": lesson06("fwd"), "step06-lesson-bwd": lesson06("bwd"), "step06": step06,
    # note 07
    "step07-lesson": lesson07, "step07-bwd-lesson": lesson07_bwd, "step07-peers": peers07,
    "step07-gqa": gqa07, "test07": transcript("../h100/test07.txt"),
    # note 08
    "step08-lesson": lesson08, "step08-decode": decode, "step08-paged": paged08, "ctest08": transcript("ctest08.txt"),
    # note 09
    "train": train,
    "step09-bench": bench09, "test09": transcript("test09.txt", "nccl09.txt"),
}
