#!/usr/bin/env python3
"""A small decoder-only transformer trained on characters, its attention by PyTorch's
scaled_dot_product_attention or by one of the course's steps — the same seed, the same
data, so that the loss curves can be laid over each other.

  python3 python/examples/train_gpt.py --attention 07 --out run.csv
  python3 python/examples/train_gpt.py --attention sdpa --data-seed 2 --out run.csv

The text is the Python standard library's own source (every machine with Python has it),
read as bytes: a vocabulary of 256. Validation: the last 10% of the text.
"""
import argparse
import csv
import glob
import math
import os
import sys
import sysconfig
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from flashattn_steps import attention  # noqa: E402


def corpus(megabytes):
    """The standard library's .py files in name order, concatenated up to `megabytes`."""
    root = sysconfig.get_paths()["stdlib"]
    out, total = [], 0
    for path in sorted(glob.glob(os.path.join(root, "*.py"))):
        data = open(path, "rb").read()
        out.append(data)
        total += len(data)
        if total >= megabytes * 2**20:
            break
    return torch.frombuffer(bytearray(b"".join(out)[: int(megabytes * 2**20)]), dtype=torch.uint8).long()


class Block(nn.Module):
    def __init__(self, width, heads, attend):
        super().__init__()
        self.heads, self.attend = heads, attend
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, N, 3, self.heads, C // self.heads).unbind(2)  # [B, N, H, d] each
        y = self.attend(q, k, v)  # [B, N, H, d]
        x = x + self.proj(y.reshape(B, N, C))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    def __init__(self, layers, width, heads, context, attend):
        super().__init__()
        self.tok, self.pos = nn.Embedding(256, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, attend) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, 256, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def attend_with(name):
    if name == "sdpa":  # the FlashAttention layout in, as the steps take it: transposes around SDPA's
        return lambda q, k, v: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    return lambda q, k, v: attention(q, k, v, causal=True, step=name, layout="bnhd")


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--attention", default="sdpa", help="sdpa, or a step: 01, 05, 06, 07")
    a.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help="autocast type of the matmuls")
    a.add_argument("--init-seed", type=int, default=0, help="the weights' seed (the same for every run)")
    a.add_argument("--data-seed", type=int, default=1, help="the order of the batches")
    a.add_argument("--iters", type=int, default=1500)
    a.add_argument("--layers", type=int, default=4)
    a.add_argument("--width", type=int, default=256)
    a.add_argument("--heads", type=int, default=4)
    a.add_argument("--context", type=int, default=256)
    a.add_argument("--batch", type=int, default=32)
    a.add_argument("--lr", type=float, default=1e-3)
    a.add_argument("--megabytes", type=float, default=8.0)
    a.add_argument("--eval-every", type=int, default=100)
    a.add_argument("--label", default=None, help="the run's name in the CSV (default: the attention)")
    a.add_argument("--out", required=True, help="CSV to append rows to")
    args = a.parse_args()
    if not torch.cuda.is_available():
        sys.exit("train_gpt: needs a CUDA GPU")
    dev = torch.device("cuda")
    text = corpus(args.megabytes).to(dev)
    cut = int(len(text) * 0.9)
    train, val = text[:cut], text[cut:]

    torch.manual_seed(args.init_seed)
    model = Gpt(args.layers, args.width, args.heads, args.context, attend_with(args.attention)).to(dev)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    data_rng = torch.Generator(device="cpu").manual_seed(args.data_seed)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.dtype == "bf16")

    def batch(src, rng):
        i = torch.randint(len(src) - args.context - 1, (args.batch,), generator=rng).to(dev)
        ix = i[:, None] + torch.arange(args.context + 1, device=dev)
        chunk = src[ix]
        return chunk[:, :-1], chunk[:, 1:]

    def loss_of(x, y):
        with autocast:
            logits = model(x)
        return F.cross_entropy(logits.float().view(-1, 256), y.reshape(-1))

    @torch.no_grad()
    def validate():
        model.eval()
        rng = torch.Generator(device="cpu").manual_seed(12345)  # the same validation batches for every run
        losses = [loss_of(*batch(val, rng)).item() for _ in range(8)]
        model.train()
        return sum(losses) / len(losses)

    label = args.label or args.attention
    new = not os.path.exists(args.out)
    with open(args.out, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            # train_loss: the mean over the iterations since the last row (a smoothed curve)
            w.writerow(["run", "attention", "dtype", "data_seed", "iter", "train_loss", "val_loss", "ms_per_iter",
                        "params", "gpu", "torch"])
        interval = []  # this interval's training losses: their mean is the curve's point
        start, timed_from, excluded = None, 20, 0.0  # the first iterations warm up; validation is not timed
        for it in range(args.iters + 1):
            lr = args.lr * min(1.0, (it + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * it / args.iters)))
            for g in opt.param_groups:
                g["lr"] = lr
            if it == timed_from:
                torch.cuda.synchronize()
                start = time.perf_counter()
            x, y = batch(train, data_rng)
            loss = loss_of(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            interval.append(loss.detach())
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if it % args.eval_every == 0 or it == args.iters:
                torch.cuda.synchronize()
                now = time.perf_counter()
                ms = (now - start - excluded) * 1e3 / (it + 1 - timed_from) if start and it >= timed_from else ""
                v = validate()
                mean = torch.stack(interval).mean().item()
                interval.clear()
                torch.cuda.synchronize()
                excluded += time.perf_counter() - now
                w.writerow([label, args.attention, args.dtype, args.data_seed, it, f"{mean:.5f}", f"{v:.5f}",
                            f"{ms:.3f}" if ms != "" else "", params, torch.cuda.get_device_name(),
                            torch.__version__])
                f.flush()
                print(f"{label} it {it:5d} train {mean:.4f} val {v:.4f} {ms if ms == '' else f'{ms:.2f} ms/it'}",
                      flush=True)


if __name__ == "__main__":
    main()
