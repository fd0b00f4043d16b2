#!/usr/bin/env python3
"""PyTorch's attention backends on the same shapes as fa_bench, same CSV columns.

  python3 tools/bench/peers.py --csv peers.csv [--N 1024,...] [--d 64,128] [--causal 0,1]
                               [--dtypes fp32,bf16] [--dir fwd,bwd] [--tokens 65536] [--reps 10]

torch.nn.functional.scaled_dot_product_attention with one backend at a time
(math, efficient, flash, cudnn); a backend that refuses a shape or dtype gets a
row with status 'unsupported'. Timing as fa_bench: warm-up, L2 flushed before
each repeat, CUDA events, median. Peak extra memory: the allocator's peak during
one call minus what was allocated before it.
"""
import argparse
import ctypes
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "math": SDPBackend.MATH,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def timed(fn, reps, flush):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        flush.zero_()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def device_fields():
    """The CSV's last three columns: the GPU's name, the driver's CUDA version, torch's CUDA."""
    props = torch.cuda.get_device_properties(0)
    v = ctypes.c_int()
    ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v))
    return f"{props.name},{v.value // 1000}.{(v.value % 1000) // 10},{torch.version.cuda}"


def l2_flush_buffer():
    """A buffer to zero before each repeat: more than twice the H200's 60 MB L2."""
    return torch.empty(2 * 64 * 2**20 // 4, dtype=torch.float32, device="cuda")


def measured(backend, make_fn, reps, flush):
    """(status, median ms, peak extra bytes) of the call make_fn() returns, with only `backend` allowed
    (make_fn runs inside that choice too); a backend that refuses the shape: 'unsupported'."""
    try:
        with sdpa_kernel([BACKENDS[backend]]):
            fn = make_fn()
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            fn()
            torch.cuda.synchronize()
            scratch = torch.cuda.max_memory_allocated() - base
            return "ok", timed(fn, reps, flush), scratch
    except (RuntimeError, torch.OutOfMemoryError) as e:
        return ("out-of-memory" if "out of memory" in str(e) else "unsupported"), 0.0, 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", default="peers.csv")
    ap.add_argument("--N", default="1024,2048,4096,8192,16384")
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--dir", default="fwd,bwd")
    ap.add_argument("--backends", default="math,efficient,flash,cudnn")
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    dev = device_fields()
    flush = l2_flush_buffer()
    out = open(a.csv, "w")
    out.write("impl,step,dir,dtype,B,H,N,d,causal,ms,tflops,scratch_bytes,status,gpu,cuda_driver_api,cuda_runtime\n")
    for dt in a.dtypes.split(","):
        for d in map(int, a.d.split(",")):
            for causal in map(int, a.causal.split(",")):
                for N in map(int, a.N.split(",")):
                    B, H = 1, max(1, a.tokens // N)
                    g = torch.Generator(device="cuda").manual_seed(N + d)
                    q, k, v, do = (torch.rand(B, H, N, d, device="cuda", generator=g, dtype=DTYPES[dt]) * 2 - 1
                                   for _ in range(4))
                    flops = 4.0 * B * H * N * N * d / (2 if causal else 1)
                    for name in a.backends.split(","):
                        for direction in a.dir.split(","):
                            def make():
                                if direction == "fwd":
                                    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
                                qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
                                o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=bool(causal))
                                return lambda: torch.autograd.grad(o, (qq, kk, vv), do, retain_graph=True)
                            status, ms, scratch = measured(name, make, a.reps, flush)
                            tf = flops * (2.5 if direction == "bwd" else 1) / (ms * 1e-3) / 1e12 if ms else 0.0
                            out.write(f"torch-{name},-,{direction},{dt},{B},{H},{N},{d},{causal},{ms:.5f},{tf:.3f},"
                                      f"{scratch},{status},{dev}\n")
                            out.flush()
                            print(f"torch-{name} {direction} {dt} N={N} d={d} causal={causal}: {ms:.3f} ms "
                                  f"{tf:.1f} TFLOP/s {status}", file=sys.stderr)
                            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
