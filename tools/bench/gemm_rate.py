#!/usr/bin/env python3
"""The bf16 matrix-product rate of this GPU, the scale for note 07's TFLOP/s:
torch.matmul 8192 × 8192 × 8192 on random operands, L2 flushed before each of 20
timed products (after 3 warm-ups), CUDA events, the median.

  python3 tools/bench/gemm_rate.py [--spin-us 200]

--spin-us queues a spin kernel between the flush and the start event, as ab.py does
before every repeat, so that the GEMM is timed the way the one-process tables are.
"""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import l2_flush_buffer  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spin-us", type=float, default=0.0)
    a = ap.parse_args()
    x, y = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    flush = l2_flush_buffer()
    for _ in range(3):
        x @ y
    ts = []
    for _ in range(20):
        flush.zero_()
        if a.spin_us:
            torch.cuda._sleep(int(a.spin_us * 2000))  # cycles: at least spin_us at clocks up to 2 GHz
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        x @ y
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    print(f"{2 * 8192**3 / statistics.median(ts) / 1e9:.1f} TFLOP/s bf16 torch.matmul 8192^3, median of 20")


if __name__ == "__main__":
    main()
