#!/usr/bin/env python3
"""PyTorch's attention on decoding shapes, the columns of `fa_bench --decode`.

  python3 tools/bench/peers_decode.py --csv peers_decode.csv [--Nq 1,16] [--Nkv 8192,...]
                                      [--bh 32,128] [--group 1,8] [--d 128] [--causal 0,1]

torch.nn.functional.scaled_dot_product_attention, one backend at a time (math,
efficient, flash, cudnn), on q [1, bh, Nq, d] against k, v [1, bh/group, Nkv, d]
(enable_gqa when group > 1). Causal is PyTorch's lower-right mask (causal_lower_right:
the queries are the last Nq positions, as in fa_bench), which is not is_causal's
upper-left one. A backend that refuses a shape gets status 'unsupported'. Timing as
fa_bench and peers.py (whose timing it imports): warm-up, L2 flushed before each repeat, CUDA
events, median of --reps.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import device_fields, l2_flush_buffer, measured  # noqa: E402  (the same timing as peers.py)


def ints(s):
    return [int(x) for x in s.split(",")]


def decode_shapes(a):
    """(H, H_kv, N_q, N_kv, d, causal) of a decoding sweep (B = 1), from the flags both this
    script and ab.py take: --d, --causal, --bh, --group, --Nq, --Nkv."""
    for d in ints(a.d):
        for causal in ints(a.causal):
            for bh in ints(a.bh):
                for group in ints(a.group):
                    for nq in ints(a.Nq):
                        for nkv in ints(a.Nkv):
                            if not (causal and nq == 1):  # one query sees every key
                                yield bh, bh // group, nq, nkv, d, causal


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", default="peers_decode.csv")
    ap.add_argument("--Nq", default="1,16")
    ap.add_argument("--Nkv", default="8192,32768,131072")
    ap.add_argument("--bh", default="32,128")
    ap.add_argument("--group", default="1")
    ap.add_argument("--d", default="128")
    ap.add_argument("--causal", default="0")
    ap.add_argument("--backends", default="math,efficient,flash,cudnn")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    dev = device_fields()
    flush = l2_flush_buffer()
    out = open(a.csv, "w")
    out.write("impl,step,dtype,B,H,H_kv,N,N_kv,d,causal,ms,gbps,floor_bytes,scratch_bytes,status,gpu,"
              "cuda_driver_api,cuda_runtime\n")
    for bh, hkv, nq, nkv, d, causal in decode_shapes(a):
        g = torch.Generator(device="cuda").manual_seed(nq + nkv + d)
        q = torch.rand(1, bh, nq, d, device="cuda", generator=g, dtype=torch.bfloat16) * 2 - 1
        k, v_ = (torch.rand(1, hkv, nkv, d, device="cuda", generator=g, dtype=torch.bfloat16) * 2 - 1 for _ in range(2))
        floor = 2 * (2 * q.numel() + 2 * k.numel()) + 4 * bh * nq
        mask = causal_lower_right(nq, nkv) if causal else None
        for name in a.backends.split(","):
            status, ms, scratch = measured(
                name, lambda: lambda: F.scaled_dot_product_attention(q, k, v_, attn_mask=mask, enable_gqa=hkv != bh),
                a.reps, flush)
            gbps = floor / (ms * 1e-3) / 1e9 if ms else 0.0
            out.write(f"torch-{name},-,bf16,1,{bh},{hkv},{nq},{nkv},{d},{causal},{ms:.5f},"
                      f"{gbps:.1f},{floor},{scratch},{status},{dev}\n")
            out.flush()
            print(f"torch-{name} H={bh} H_kv={hkv} Nq={nq} Nkv={nkv} d={d} causal={causal}: "
                  f"{ms:.4f} ms {gbps:.0f} GB/s {status}", file=sys.stderr)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
