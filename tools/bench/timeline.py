#!/usr/bin/env python3
"""Where one call's time goes: every kernel (and memset) a call puts on the GPU, as the GPU
ran them, for the steps and PyTorch's attention side by side.

  python3 tools/bench/timeline.py --lib BUILD/tools/bench/libfa_capi.so [--impls 07,torch-cudnn]
      [--dir bwd] [--d 128] [--N 1024,8192] [--causal 0,1] [--tokens 131072] [--reps 5]
      [--csv timeline.csv]
  python3 tools/bench/timeline.py --decode --lib … [--impls 08,torch-cudnn] [--Nq 1] [--Nkv 8192,…]
      [--bh 32,128] [--group 1,8]   (ab.py's decoding shapes, the forward)

ab.py times a call between two events; this says what lies between them. Each repeat is
prepared as ab.py prepares it (the L2 flushed, then a spin kernel that hides the host's
work), and the repeats run under torch.profiler, which records from CUPTI every kernel
and memset of the process — the steps' (launched from libfa_capi.so) as well as
PyTorch's — with its start and end on the GPU. A repeat's activities are those after its
spin kernel and before the next repeat's flush. For each implementation and shape the
table gives, per activity in the order they ran, the median duration over the repeats;
then the median span (first start to last end), the median sum of the durations, and
what is left of the span: the GPU between two of the call's activities, with none of
them running (launch latency, a dependent kernel's wait for the one before).

A profiled run is slower than an unprofiled one by a little per activity (CUPTI's
records); ab.py's figures stay the measure of speed, this the measure of the parts.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ab import Case, Steps, shapes  # noqa: E402
from peers import l2_flush_buffer  # noqa: E402

KINDS = {"kernel", "gpu_memset", "gpu_memcpy"}


def short(name):
    """A kernel's name without its namespaces' anonymous parts, template arguments or parameters."""
    name = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    for cut in ("(", "<"):
        if cut in name and not name.startswith(cut):
            name = name[:name.index(cut)]
    return name.removeprefix("void ")[:70]


def activities(trace_path):
    """[(start µs, duration µs, name)] of every kernel, memset and copy in a Chrome trace, by start."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    acts = [(e["ts"], e.get("dur", 0.0), e["name"]) for e in events if e.get("cat") in KINDS]
    return sorted(acts)


def calls(acts, reps):
    """The activities of each repeat: after its spin kernel, up to (not with) the next repeat's flush."""
    spins = [n for n, a in enumerate(acts) if "spin" in a[2].lower() or "sleep" in a[2].lower()]
    if len(spins) != reps:
        raise RuntimeError(f"found {len(spins)} spin kernels in the trace for {reps} repeats")
    out = []
    for r, s in enumerate(spins):
        end = spins[r + 1] - 1 if r + 1 < len(spins) else len(acts)  # the flush before the next spin
        out.append(acts[s + 1:end])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="libfa_capi.so of a CUDA build")
    ap.add_argument("--csv", default="timeline.csv")
    ap.add_argument("--impls", default="07,torch-cudnn")
    ap.add_argument("--dir", default="bwd", choices=["fwd", "bwd"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--d", default="128")
    ap.add_argument("--N", default="1024,8192")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--tokens", default="131072")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--hide-host-us", type=float, default=200.0)
    ap.add_argument("--decode", action="store_true", help="ab.py's decoding shapes (the forward) instead of N = N_kv")
    ap.add_argument("--Nq", default="1,16")
    ap.add_argument("--Nkv", default="8192,16384,32768,65536,131072")
    ap.add_argument("--bh", default="32,128")
    ap.add_argument("--group", default="1")
    a = ap.parse_args()
    a.ragged, a.windows, a.seqs = 0, "-1:-1", 1  # the rest of ab.py's sweep: dense, no window, one sequence
    if a.decode:
        a.dir = "fwd"  # (decoding shapes have no backward here)
    a.impls = a.impls.split(",")
    steps, flush = Steps(a.lib), l2_flush_buffer()
    spin = int(a.hide_host_us * 2000)
    out = open(a.csv, "w")
    out.write("impl,dir,d,N,causal,B,H,H_kv,N_kv,part,name,at_us,us\n")
    for n_case, (B, H, H_kv, N, N_kv, d, causal, window) in enumerate(shapes(a)):
        case = Case(a, {"": steps}, B, H, H_kv, N, N_kv, d, causal, seed=N + d + n_case, window=window)
        print(f"{a.dir} B={B} H={H} H_kv={H_kv} N={N} N_kv={N_kv} d={d} causal={causal}:")
        for impl in a.impls:
            fn = case.torch_fn(impl[6:]) if impl.startswith("torch-") else case.step_fn(impl)[0]
            fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(a.reps):
                    flush.zero_()
                    torch.cuda._sleep(spin)
                    fn()
                torch.cuda.synchronize()
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
                path = f.name
            prof.export_chrome_trace(path)
            reps = calls(activities(path), a.reps)
            os.unlink(path)
            counts = {len(r) for r in reps}
            if len(counts) != 1:
                print(f"  {impl}: the repeats ran {sorted(counts)} activities; not summarised")
                continue
            row = f"{impl},{a.dir},{d},{N},{causal},{B},{H},{H_kv},{N_kv}"
            print(f"  {impl}:")
            parts = []  # (name, start, duration) of each activity, medians over the repeats
            for k in range(len(reps[0])):
                parts.append((short(reps[0][k][2]), statistics.median(r[k][0] - r[0][0] for r in reps),
                              statistics.median(r[k][1] for r in reps)))
                name, at, us = parts[-1]
                print(f"    {at:9.1f} +{us:9.1f} us  {name}")
                out.write(f"{row},kernel{k},{name},{at:.2f},{us:.2f}\n")
            span = statistics.median(r[-1][0] + r[-1][1] - r[0][0] for r in reps)
            busy = statistics.median(sum(x[1] for x in r) for r in reps)
            print(f"    span {span:.1f} us, activities {busy:.1f} us, between them {span - busy:.1f} us")
            summary = " + ".join(f"{us:.1f} {name[:28]}" for name, _, us in parts)
            print(f"  = {impl} d={d} N={N} causal={causal}: {span:.1f} us = {summary} + {span - busy:.1f} idle")
            for part, us in (("span", span), ("busy", busy), ("idle", span - busy)):
                out.write(f"{row},{part},,0,{us:.2f}\n")
            out.flush()
        case.free()
        del case
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
