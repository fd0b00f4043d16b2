#!/usr/bin/env python3
"""What Nsight Compute sees in each version of step 06 (the note's "profiler" column).

  python3 tools/bench/ncu_step06.py --bench build/tools/bench/fa_bench --csv ncu06.csv

Runs `fa_bench --once --versions` (one untimed launch of step 06 and of each of its
versions, bf16, N = 4096, B·H·N = 65536) under ncu, profiling the forward kernel or
the backward's dK/dV kernel of each, and writes one row per (version, metric).
Metrics this ncu does not know are left out (asked with --query-metrics first), so a
renamed metric costs a column, not the run. ncu runs with --clock-control none.
"""
import argparse
import csv
import io
import subprocess
import sys

METRICS = {
    "tensor_pipe_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "warps_active_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "instructions": "smsp__inst_executed.sum",
    "smem_ld_bank_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "smem_st_bank_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "smem_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "stall_barrier": "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
    "stall_long_scoreboard": "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
    "stall_short_scoreboard": "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
    "stall_mio_throttle": "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
    "stall_math_pipe_throttle": "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
    "stall_wait": "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
    "stall_lg_throttle": "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio",
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "local_ld_requests": "l1tex__t_requests_pipe_lsu_mem_local_op_ld.sum",
}


def known_metrics(ncu):
    r = subprocess.run([ncu, "--query-metrics", "--chip", "gh100"], capture_output=True, text=True)
    names = {line.split()[0] for line in r.stdout.splitlines() if line.strip() and "__" in line.split()[0]}
    keep = {k: m for k, m in METRICS.items() if m.rsplit(".", 1)[0] in names}
    for k, m in METRICS.items():
        if k not in keep:
            print(f"ncu_step06: this ncu does not list {m}; column left out", file=sys.stderr)
    return keep


def ncu_cmd(a, metrics, kernel):
    """The ncu command line up to the program: the given metrics of kernels matching `kernel`, as CSV."""
    return [a.ncu, "--clock-control", "none", "--kernel-name", f"regex:{kernel}", "--metrics", ",".join(metrics.values()),
            "--csv", "--print-units", "base"]


def write_rows(out, rows, metrics, version, case):
    """One CSV row per asked-for metric of ncu's `rows`; version(row) names the kernel, case is 'dir,N,d,causal'."""
    by_name = {m: k for k, m in metrics.items()}
    for row in rows:
        name = row["Metric Name"]
        if name in by_name:
            out.write(f"{version(row)},{case},{by_name[name]},{name},{row['Metric Value'].replace(',', '')}\n")
    out.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--csv", default="ncu06.csv")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--N", default="4096")
    ap.add_argument("--cases", default="fwd:64:0,fwd:128:0,fwd:128:1,bwd:128:0",
                    help="direction:d:causal, comma-separated")
    ap.add_argument("--peer", action="store_true",
                    help="also profile PyTorch's FlashAttention-2 kernel (row version torch-flash) on each case")
    a = ap.parse_args()
    metrics = known_metrics(a.ncu)
    if not metrics:
        sys.exit("ncu_step06: no metric left to ask for")
    out = open(a.csv, "w")
    out.write("version,dir,N,d,causal,metric,ncu_metric,value\n")
    for direction, d, causal in (c.split(":") for c in a.cases.split(",")):
        # the production kernels and the versions' (versions_forward.cu, versions_backward.cu)
        kernel = "forward_kernel|version_kernel" if direction == "fwd" else "dkdv_|version_(dkdv|shared)_kernel"
        cmd = ncu_cmd(a, metrics, kernel) + [a.bench, "--dtype", "bf16", "--once", "--versions", "--steps", "06",
                                             "--dir", direction, "--N", a.N, "--d", d, "--causal", causal]
        r = subprocess.run(cmd, capture_output=True, text=True)
        lines = r.stdout.splitlines()
        once = [dict(kv.split("=") for kv in l.split()[1:]) for l in lines if l.startswith("once ")]
        table = [l for l in lines if l.startswith('"')]
        if r.returncode != 0 or not once or not table:
            print(f"ncu_step06 {direction} d={d}: ncu failed (rc {r.returncode})\n{r.stderr[-2000:]}", file=sys.stderr)
            continue
        ids = []  # profiled kernels in launch order: the i-th is the i-th `once` line's step
        rows = list(csv.DictReader(io.StringIO("\n".join(table))))
        for row in rows:
            if row["ID"] not in ids:
                ids.append(row["ID"])
        if len(ids) != len(once):
            print(f"ncu_step06 {direction} d={d}: {len(ids)} kernels profiled for {len(once)} launches", file=sys.stderr)
            continue
        write_rows(out, rows, metrics, lambda row: once[ids.index(row["ID"])]["step"], f"{direction},{a.N},{d},{causal}")
        print(f"ncu_step06 {direction} d={d} causal={causal}: {len(ids)} kernels profiled", file=sys.stderr)
        if a.peer:
            peer(a, metrics, out, direction, d, causal)


PEER = """
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
N, d, causal, bwd = {N}, {d}, {causal}, {bwd}
x = [torch.randn(1, 65536 // N, N, d, device="cuda", dtype=torch.bfloat16, requires_grad=bwd) for _ in range(3)]
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    o = F.scaled_dot_product_attention(*x, is_causal=causal)
    if bwd:
        o.backward(torch.randn_like(o))
torch.cuda.synchronize()
"""


def peer(a, metrics, out, direction, d, causal):
    """The same metrics on PyTorch's FlashAttention-2 kernel (flash_fwd / flash_bwd_dq_dk_dv), same shape."""
    kernel = "flash_fwd_kernel" if direction == "fwd" else "flash_bwd_dq_dk_dv"
    script = PEER.format(N=a.N, d=d, causal=causal == "1", bwd=direction == "bwd")
    cmd = ncu_cmd(a, metrics, kernel) + ["--launch-count", "1", sys.executable, "-c", script]
    r = subprocess.run(cmd, capture_output=True, text=True)
    table = [l for l in r.stdout.splitlines() if l.startswith('"')]
    if r.returncode != 0 or not table:
        print(f"ncu_step06 torch-flash {direction} d={d}: ncu failed (rc {r.returncode})\n{r.stderr[-2000:]}",
              file=sys.stderr)
        return
    write_rows(out, csv.DictReader(io.StringIO("\n".join(table))), metrics, lambda row: "torch-flash",
               f"{direction},{a.N},{d},{causal}")
    print(f"ncu_step06 torch-flash {direction} d={d} causal={causal}: profiled", file=sys.stderr)


if __name__ == "__main__":
    main()
