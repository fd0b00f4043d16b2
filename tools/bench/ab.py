#!/usr/bin/env python3
"""Steps and PyTorch's attention timed in one process, on the same tensors, in alternation.

  python3 tools/bench/ab.py --lib BUILD/tools/bench/libfa_capi.so --csv ab.csv
      [--impls 07,06,torch-cudnn,torch-flash] [--dir fwd|bwd] [--dtype bf16]
      [--d 64,128,256] [--N 1024,...,32768] [--causal 0,1] [--tokens 131072,524288]
      [--group 1,4,8] [--windows -1:-1,1024:0] [--rounds 5] [--reps 10] [--pause-ms 0] [--hide-host-us 200] [--check-peers]
  python3 tools/bench/ab.py --lib ... --ragged 8 --impls 07,07r,07m [--dir bwd]: B = 8 sequences a shape, step 07
      on the dense batch [B, H, N, d] (07), on the same sequences packed as a ragged batch
      [1, H, B·N, d] with their offsets (07r: the same work), and on those B·N rows cut into
      sequences of N/2 and 3N/2 in turn (07m: mixed lengths, its own FLOPs)
  python3 tools/bench/ab.py --decode --lib ... [--impls 08,06,torch-cudnn,torch-flash,torch-efficient]
      [--Nq 1,16] [--Nkv 8192,...] [--bh 32,128] [--group 1,8] [--seqs 1] [--d 128] [--causal 0,1]
      08p16, 08p256, …: step 08 on the same cache in shuffled pages of 16, 256, … positions
      through a block table (fa_forward_paged), beside it on the contiguous cache (08)
  … --alt base=OTHER/libfa_capi.so --impls 08,08@base,…: a step of another build (another
      commit) beside this one's, in the same process: a change timed against what it changes
      with no second machine or second session between them.

Why a third harness. fa_bench (a step) and peers.py (PyTorch) time the two sides in two
processes, one after the other, each with its own inputs: a ratio of their figures also
compares two states of the GPU (one run rested after uploading its inputs, the other hot
from the shapes before). Here both sides run on one set of tensors in one process, and
each shape is timed in rounds: in every round each implementation times --reps repeats,
in an order rotated round by round, so that they take turns at every position.

Each repeat as in fa_bench and peers.py: the L2 flushed (a 128 MiB buffer zeroed), CUDA
events around the call alone. One thing more: a spin kernel of --hide-host-us is queued
between the flush and the start event, so that the host's work of either side (PyTorch's
dispatch and autograd, the tensor maps a step encodes) is done while the GPU still spins,
and the events time the GPU's work alone — as long as that host work takes less than the
spin (host work beyond it is timed: raise --hide-host-us until the figures stop moving;
--hide-host-us 0 times it all). --pause-ms sleeps (the GPU idle) before every block of
repeats: the experiment of a rested GPU.

After every repeat NVML is read: the SM clock, the power, the temperature and the
clock-event reasons (power cap, thermal slowdown, …; idle left out). The CSV has one row
per implementation, shape and round: the median of the round's repeats, the lowest clock,
the highest power and temperature, every reason seen, and the longest host time a repeat
took to enqueue its call (host_us_max; where it passes --hide-host-us the GPU may have
waited for the host inside the timed interval, and ab.py says so at the end). Before any timing, every step's
outputs (poisoned first) are compared with a reference: the forward computed in fp32 from
the same 16-bit inputs where a head's scores fit in 1 GiB, else (and for the backward)
PyTorch's output by its default backend. A mismatch is reported and the step is not
timed at that shape (status "differs"). After every timed round they are poisoned and
checked again, after one more call like the timed ones: a round whose call skipped work
is written as "differs", not timed. --check-peers holds PyTorch's backends to the
same check, and prints every backend's error.
"""
import argparse
import ctypes
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# torch and the peers' helpers (which import it): bound by import_torch, once there is something to time.
torch = F = sdpa_kernel = causal_lower_right = BACKENDS = DTYPES = device_fields = l2_flush_buffer = None
decode_shapes = ints = None


def import_torch():
    """Binds the names above; --help needs none of them."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right
    from peers import BACKENDS, DTYPES, device_fields, l2_flush_buffer
    from peers_decode import decode_shapes, ints
    globals().update(torch=torch, F=F, sdpa_kernel=sdpa_kernel, causal_lower_right=causal_lower_right,
                     BACKENDS=BACKENDS, DTYPES=DTYPES, device_fields=device_fields, l2_flush_buffer=l2_flush_buffer,
                     decode_shapes=decode_shapes, ints=ints)


CODE = {"fp32": 0, "bf16": 1, "fp16": 2}  # fa_shape.dtype


class Shape(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int) for n in ("B", "H", "H_kv", "N", "N_kv", "d", "causal", "dtype")] + [
        ("scale", ctypes.c_float)] + [  # 0: 1/sqrt(d)
        (n, ctypes.c_int) for n in ("windowed", "window_left", "window_right", "sequences")]  # 0: none


RAGGED = ("07r", "07m")  # step 07 on the batch packed as a ragged one (--ragged): its own lengths, or mixed


def paged(impl):
    """(step, page) of a paged implementation (08p64: step 08, pages of 64 positions), or None."""
    step, p, page = impl.partition("@")[0].partition("p")
    return (step, int(page)) if p and step.isdigit() and page.isdigit() else None


class Steps:
    """libfa_capi.so: plan, forward, backward on torch tensors and torch's current stream."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.fa_plan.restype = ctypes.c_void_p
        self.lib.fa_plan.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(Shape),
                                     ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_char_p, ctypes.c_int]
        self.lib.fa_free_plan.argtypes = [ctypes.c_void_p]
        self.lib.fa_forward.argtypes = [ctypes.c_void_p] * 8 + [ctypes.c_char_p, ctypes.c_int]
        self.lib.fa_backward.argtypes = [ctypes.c_void_p] * 12 + [ctypes.c_char_p, ctypes.c_int]
        if hasattr(self.lib, "fa_forward_ragged"):  # a build before ragged batches (--alt) has none
            self.lib.fa_forward_ragged.argtypes = [ctypes.c_void_p] * 9 + [ctypes.c_char_p, ctypes.c_int]
            self.lib.fa_backward_ragged.argtypes = [ctypes.c_void_p] * 13 + [ctypes.c_char_p, ctypes.c_int]
        if hasattr(self.lib, "fa_forward_paged"):  # nor one before paged caches
            self.lib.fa_forward_paged.argtypes = ([ctypes.c_void_p] * 8 + [ctypes.c_int] * 2 + [ctypes.c_void_p] * 2 +
                                                  [ctypes.c_char_p, ctypes.c_int])
        self.err = ctypes.create_string_buffer(1024)

    def plan(self, step, backward, shape):
        """(plan, workspace tensor), or raises RuntimeError with the step's own message."""
        ws = ctypes.c_ulonglong(0)
        plan = self.lib.fa_plan(step.encode(), int(backward), ctypes.byref(shape), ctypes.byref(ws), self.err, 1024)
        if not plan:
            raise RuntimeError(self.err.value.decode())
        return plan, torch.empty(max(ws.value, 1), dtype=torch.uint8, device="cuda")

    def call(self, fn, *ptrs):
        stream = torch.cuda.current_stream().cuda_stream
        if fn(*[ctypes.c_void_p(p) for p in ptrs], ctypes.c_void_p(stream), self.err, 1024):
            raise RuntimeError(self.err.value.decode())


class Nvml:
    """SM clock (MHz), power (W), temperature (°C) and clock-event reasons of GPU 0."""
    NAMES = {0x2: "app-clocks", 0x4: "power-cap", 0x8: "hw-slowdown", 0x10: "sync-boost", 0x20: "sw-thermal",
             0x40: "hw-thermal", 0x80: "power-brake", 0x100: "display"}

    def __init__(self):
        self.lib, self.handle = None, ctypes.c_void_p()
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() == 0 and lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.handle)) == 0:
                self.lib = lib
                self.reasons = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                    lib.nvmlDeviceGetCurrentClocksThrottleReasons
        except OSError:
            pass

    def sample(self):
        if not self.lib:
            return 0, 0.0, 0, 0
        mhz, mw, temp, why = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        self.lib.nvmlDeviceGetClockInfo(self.handle, 1, ctypes.byref(mhz))  # NVML_CLOCK_SM
        self.lib.nvmlDeviceGetPowerUsage(self.handle, ctypes.byref(mw))
        self.lib.nvmlDeviceGetTemperature(self.handle, 0, ctypes.byref(temp))  # NVML_TEMPERATURE_GPU
        self.reasons(self.handle, ctypes.byref(why))
        return mhz.value, mw.value / 1000.0, temp.value, why.value & ~0x1  # not "idle"

    def names(self, mask):
        return "+".join(n for bit, n in self.NAMES.items() if mask & bit) or "none"


def relative_error(got, want):
    """max |got − want| / max |want|, NaN when got holds a NaN (an unwritten, poisoned element)."""
    got, want = got.float(), want.float()
    if torch.isnan(got).any():
        return float("nan")
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def worst(errs):
    """The index of the largest error, a NaN before any number (max() alone keeps a NaN only in first place)."""
    return max(range(len(errs)), key=lambda i: float("inf") if errs[i] != errs[i] else errs[i])


def max_error(got, want):
    """The largest relative_error of outputs against their references, pair by pair (NaN if any is)."""
    errs = [relative_error(g, w) for g, w in zip(got, want)]
    return errs[worst(errs)]


class Case:
    """One shape: its tensors, and a callable per implementation (or the reason it has none)."""

    def __init__(self, a, libs, B, H, H_kv, N, N_kv, d, causal, seed, window=(-1, -1)):
        self.B, self.H, self.H_kv, self.N, self.N_kv, self.d, self.causal = B, H, H_kv, N, N_kv, d, causal
        self.window = window  # FlashAttention's window_size: (left, right), -1 an open side
        self.decode = N_kv != N or H_kv != H
        dt = DTYPES[a.dtype]
        g = torch.Generator(device="cuda").manual_seed(seed)
        rand = lambda *s: torch.rand(*s, device="cuda", generator=g, dtype=dt) * 2 - 1  # noqa: E731
        self.q, self.k, self.v = rand(B, H, N, d), rand(B, H_kv, N_kv, d), rand(B, H_kv, N_kv, d)
        self.do = rand(B, H, N, d) if a.dir == "bwd" else None
        self.shape = Shape(B, H, H_kv if H_kv != H else 0, N, N_kv if N_kv != N else 0, d, causal, CODE[a.dtype])
        if window != (-1, -1):
            self.shape.windowed, self.shape.window_left, self.shape.window_right = 1, window[0], window[1]
        self.libs, self.dir, self.plans = libs, a.dir, []  # libs: {"": --lib, name: --alt name=…}

    def band(self):
        """The window's mask, True where a score counts (the queries the last N positions), or None."""
        if self.window == (-1, -1):
            return None
        left, right = self.window
        pos = torch.arange(self.N, device="cuda")[:, None] + (self.N_kv - self.N)
        key = torch.arange(self.N_kv, device="cuda")[None, :]
        keep = torch.ones(self.N, self.N_kv, dtype=torch.bool, device="cuda")
        if left >= 0:
            keep &= key >= pos - left
        if right >= 0 or self.causal:
            keep &= key <= pos + (0 if self.causal else right)
        return keep

    def torch_kwargs(self):
        kw = {}
        if self.band() is not None:  # PyTorch has no window: the band as a mask (no backend skips its tiles)
            kw = {"attn_mask": self.band()}
        elif self.causal:
            kw = {"attn_mask": causal_lower_right(self.N, self.N_kv)} if self.decode else {"is_causal": True}
        if self.H_kv != self.H:
            kw["enable_gqa"] = True
        return kw

    def torch_ref(self):
        """PyTorch's output (forward) or gradients (backward), by its default choice of backend; the forward in fp32
        (exact_ref) where a head's scores fit in 1 GiB, so that PyTorch's own backends can be checked too."""
        kw = self.torch_kwargs()
        if self.dir == "fwd":
            if self.N * self.N_kv * 4 <= 1 << 30:
                return [self.exact_ref()]
            return [F.scaled_dot_product_attention(self.q, self.k, self.v, **kw)]
        qq, kk, vv = (t.detach().requires_grad_() for t in (self.q, self.k, self.v))
        return list(torch.autograd.grad(F.scaled_dot_product_attention(qq, kk, vv, **kw), (qq, kk, vv), self.do))

    def exact_ref(self):
        """The forward in fp32 from the 16-bit inputs, a query head at a time: softmax(scale·QKᵀ)V written out, the
        causal mask lower right (the queries the last N positions), query head h on K/V head h // (H / H_kv)."""
        G = self.H // self.H_kv
        out = torch.empty(self.q.shape, device="cuda", dtype=torch.float32)
        keep = self.band()
        if self.causal and keep is None:
            i = torch.arange(self.N, device="cuda")[:, None] + (self.N_kv - self.N)
            keep = torch.arange(self.N_kv, device="cuda")[None, :] <= i
        for b in range(self.B):
            for h in range(self.H):
                q, k, v = self.q[b, h].float(), self.k[b, h // G].float(), self.v[b, h // G].float()
                s = (q @ k.T) * self.d ** -0.5
                if keep is not None:
                    s = s.masked_fill(~keep, float("-inf"))
                out[b, h] = torch.softmax(s, dim=-1) @ v
        return out

    def torch_fn(self, backend):
        try:
            return self._torch_fn(backend, self.torch_kwargs(), 1)
        except RuntimeError:
            if self.H_kv == self.H or self.N_kv != self.N:
                raise
        # A backend that does not take enable_gqa: K and V repeated for every query head, as a user would repeat
        # them — the forward's copies made once, outside the timing (the backend's best case); the backward's
        # gradients summed back over the group, by the repeat's own backward.
        kw = {k: v for k, v in self.torch_kwargs().items() if k != "enable_gqa"}
        return self._torch_fn(backend, kw, self.H // self.H_kv)

    def _torch_fn(self, backend, kw, repeat):
        rep = (lambda t: t.repeat_interleave(repeat, dim=1)) if repeat > 1 else (lambda t: t)  # noqa: E731
        with sdpa_kernel([BACKENDS[backend]]):
            if self.dir == "fwd":
                k, v = rep(self.k), rep(self.v)
                fn = lambda: F.scaled_dot_product_attention(self.q, k, v, **kw)  # noqa: E731
            else:
                qq, kk, vv = (t.detach().requires_grad_() for t in (self.q, self.k, self.v))
                o = F.scaled_dot_product_attention(qq, rep(kk), rep(vv), **kw)
                fn = lambda: torch.autograd.grad(o, (qq, kk, vv), self.do, retain_graph=True)  # noqa: E731
            fn()  # refuses here, inside the backend choice, if it does not take the shape
            torch.cuda.synchronize()
        return lambda: self._under(backend, fn)

    @staticmethod
    def _under(backend, fn):
        with sdpa_kernel([BACKENDS[backend]]):
            return fn()

    def lengths(self, impl):
        """The sequences a ragged implementation (--ragged) cuts the batch's B·N rows into, or None: 07r the batch's
        own B sequences of N, 07m N/2 and 3N/2 in turn (B even: as many rows)."""
        step = impl.partition("@")[0]
        if step in RAGGED and step[-1] == "r":
            return [self.N] * self.B
        if step in RAGGED:
            return [self.N // 2 if b % 2 == 0 else self.N * 3 // 2 for b in range(self.B)]
        return None

    def pairs(self, impl):
        """The (query, key) pairs a ragged implementation computes over its sequences, as the CSV counts them."""
        return sum(n * n - (n * n / 2 if self.causal else 0) for n in self.lengths(impl))

    def ragged_fn(self, impl):
        """A ragged implementation's call on the batch packed [1, H, B·N, d], its outputs unpacked as the dense
        batch's (07r), and, for 07m (another problem), their error against PyTorch's in fp32 sequence by sequence."""
        step, _, name = impl.partition("@")
        S, lengths = self.libs[name], self.lengths(impl)
        if not hasattr(S.lib, "fa_forward_ragged"):
            raise RuntimeError(f"{impl}: this build's library takes no ragged batch")
        pack = lambda t: t.transpose(0, 1).reshape(1, t.shape[1], -1, self.d).contiguous()  # noqa: E731
        q, k, v = pack(self.q), pack(self.k), pack(self.v)
        T = self.B * self.N
        shape = Shape(1, self.H, self.shape.H_kv, T, 0, self.d, self.causal, self.shape.dtype)
        shape.windowed, shape.window_left, shape.window_right = (self.shape.windowed, self.shape.window_left,
                                                                 self.shape.window_right)
        shape.sequences = len(lengths)
        plan, ws = S.plan(step[:-1], False, shape)
        self.plans.append((S, plan))
        offsets = torch.tensor([0] + [sum(lengths[:b + 1]) for b in range(len(lengths))], dtype=torch.int32,
                               device="cuda")
        o = torch.full_like(q, float("nan"))
        lse = torch.full((1, self.H, T), float("nan"), device="cuda")
        fwd = lambda: S.call(S.lib.fa_forward_ragged, plan, q.data_ptr(), k.data_ptr(), v.data_ptr(),  # noqa: E731
                             o.data_ptr(), lse.data_ptr(), offsets.data_ptr(), ws.data_ptr())
        fwd()
        torch.cuda.synchronize()
        unpack = lambda t: t.reshape(t.shape[1], self.B, self.N, self.d).transpose(0, 1)  # noqa: E731
        if self.dir == "fwd":
            if lengths == [self.N] * self.B:
                return fwd, [unpack(o)], None
            return fwd, [o], self.sequences_error(lengths, [q, k, v], [o], None)
        # The backward on the forward's O and L: dQ, dK, dV of the packed batch.
        bplan, bws = S.plan(step[:-1], True, shape)
        self.plans.append((S, bplan))
        do = pack(self.do)
        dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
        bwd = lambda: S.call(S.lib.fa_backward_ragged, bplan, q.data_ptr(), k.data_ptr(), v.data_ptr(),  # noqa: E731
                             o.data_ptr(), lse.data_ptr(), do.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                             offsets.data_ptr(), bws.data_ptr())
        bwd()
        torch.cuda.synchronize()
        if lengths == [self.N] * self.B:
            return bwd, [unpack(dq), unpack(dk), unpack(dv)], None
        return bwd, [dq, dk, dv], self.sequences_error(lengths, [q, k, v], [dq, dk, dv], do)

    def sequences_error(self, lengths, qkv, got, do):
        """For a ragged batch of other lengths (07m): a function giving the largest error of its outputs `got`, each
        sequence against PyTorch's math in fp32 (its O, or with do its dQ, dK, dV), computed here once, and where."""
        G, at, parts = self.H // self.H_kv, 0, []
        for n in lengths:
            s = slice(at, at + n)
            q, k, v = (t[:, :, s].float().requires_grad_() for t in qkv)
            o = F.scaled_dot_product_attention(q, k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1),
                                               is_causal=bool(self.causal))
            want = [o] if do is None else torch.autograd.grad(o, (q, k, v), do[:, :, s].float())
            parts.append((s, [w.detach() for w in want]))
            at += n
        def error():  # the largest, and the sequence it is in
            errs = [max_error([g[:, :, s] for g in got], want) for s, want in parts]
            b = worst(errs)
            return errs[b], f" (sequence {b}, {lengths[b]} rows)"
        return error

    def paged_fn(self, impl):
        """A paged implementation's call on the same cache in shuffled pages, through a block table, and its O."""
        (step, page), name = paged(impl), impl.partition("@")[2]
        if self.dir != "fwd":
            raise RuntimeError(f"{impl}: a paged cache is read by the forward only")
        S = self.libs[name]
        if not hasattr(S.lib, "fa_forward_paged"):
            raise RuntimeError(f"{impl}: this build's library takes no paged cache")
        B, H_kv, d = self.B, self.H_kv, self.d
        W = -(-self.N_kv // page)  # pages a sequence
        perm = torch.randperm(B * W, generator=torch.Generator().manual_seed(B * W + page)).cuda()
        table = perm.to(torch.int32).reshape(B, W).contiguous()  # block x of sequence b in page perm[b·W + x]

        def pool(t):  # [B, H_kv, N_kv, d] as pages [B·W, H_kv, page, d], block i in page perm[i]
            blocks = F.pad(t, (0, 0, 0, W * page - self.N_kv)).reshape(B, H_kv, W, page, d)
            blocks = blocks.permute(0, 2, 1, 3, 4).reshape(B * W, H_kv, page, d)
            out = blocks.new_empty(blocks.shape)  # contiguous (empty_like would keep the permuted strides of a view)
            out[perm] = blocks
            return out
        kp, vp = pool(self.k), pool(self.v)
        plan, ws = S.plan(step, False, self.shape)
        self.plans.append((S, plan))
        o = torch.full_like(self.q, float("nan"))
        lse = torch.full((B, self.H, self.N), float("nan"), device="cuda")

        def fwd():  # (the pointers taken at each call, so that the closure keeps every tensor it writes alive)
            ptr = ctypes.c_void_p
            if S.lib.fa_forward_paged(ptr(plan), *(ptr(t.data_ptr()) for t in (self.q, kp, vp, o, lse, table)), None,
                                      page, B * W, ptr(ws.data_ptr()), ptr(torch.cuda.current_stream().cuda_stream),
                                      S.err, 1024):
                raise RuntimeError(S.err.value.decode())
        fwd()
        torch.cuda.synchronize()
        return fwd, [o], None

    def step_fn(self, impl):
        """The step's call (impl: a step of --lib, or STEP@NAME of --alt NAME=…), its outputs after one poisoned
        call, and where it is not against the case's reference (07m) the function giving their error and where it
        lies, else None."""
        if self.lengths(impl):
            return self.ragged_fn(impl)
        if paged(impl):
            return self.paged_fn(impl)
        step, _, name = impl.partition("@")
        S = self.libs[name]
        lib = S.lib
        # A backward version (07det) has no forward of its own: its O and L are the step's.
        fplan, fws = S.plan(step if self.dir == "fwd" else step[:2], False, self.shape)
        self.plans.append((S, fplan))
        o = torch.full_like(self.q, float("nan"))
        lse = torch.full((self.B, self.H, self.N), float("nan"), device="cuda")
        fwd = lambda: S.call(lib.fa_forward, fplan, self.q.data_ptr(), self.k.data_ptr(), self.v.data_ptr(),  # noqa: E731
                             o.data_ptr(), lse.data_ptr(), fws.data_ptr())
        fwd()
        if self.dir == "fwd":
            torch.cuda.synchronize()
            return fwd, [o], None
        bplan, bws = S.plan(step, True, self.shape)
        self.plans.append((S, bplan))
        dq, dk, dv = (torch.full_like(t, float("nan")) for t in (self.q, self.k, self.v))
        bwd = lambda: S.call(lib.fa_backward, bplan, self.q.data_ptr(), self.k.data_ptr(), self.v.data_ptr(),  # noqa: E731
                             o.data_ptr(), lse.data_ptr(), self.do.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                             dv.data_ptr(), bws.data_ptr())
        bwd()
        torch.cuda.synchronize()
        return bwd, [dq, dk, dv], None

    def free(self):
        for S, p in self.plans:
            S.lib.fa_free_plan(p)


def time_block(fn, reps, flush, spin_cycles, nvml):
    """Median ms of `reps` repeats; the NVML readings: lowest clock, highest power and temperature, reasons; and
    the longest host time of a repeat's enqueue (the start event, the call, the stop event), in µs: where it
    passes the spin, the GPU may have waited for the host inside the timed interval."""
    fn()  # one untimed call: every block starts as fa_bench's repeats do, after a warm-up
    torch.cuda.synchronize()
    times, samples, host = [], [], []
    for _ in range(reps):
        flush.zero_()
        if spin_cycles:
            torch.cuda._sleep(spin_cycles)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        start.record()
        fn()
        stop.record()
        host.append((time.perf_counter() - t) * 1e6)
        stop.synchronize()
        times.append(start.elapsed_time(stop))
        samples.append(nvml.sample())
    mhz = min(s[0] for s in samples)
    watts, temp = max(s[1] for s in samples), max(s[2] for s in samples)
    why = 0
    for s in samples:
        why |= s[3]
    return statistics.median(times), mhz, watts, temp, why, max(host)


def windows(a):
    """--windows as (left, right) pairs."""
    out = []
    for w in a.windows.split(","):
        left, sep, right = w.partition(":")
        try:
            out.append((int(left), int(right)))
        except ValueError:
            sys.exit(f"ab.py: --windows {a.windows}: expected LEFT:RIGHT,... (-1: an open side)")
        if not sep or min(out[-1]) < -1:
            sys.exit(f"ab.py: --windows {a.windows}: expected LEFT:RIGHT,... (-1: an open side)")
    return out


def shapes(a):
    """(B, H, H_kv, N, N_kv, d, causal, window) of the sweep."""
    if a.decode:  # B·H as --seqs sequences of H heads each (a paged cache: each its own row of the table)
        for bh, bh_kv, *rest in decode_shapes(a):
            yield (a.seqs, bh // a.seqs, bh_kv // a.seqs, *rest, (-1, -1))
        return
    B = a.ragged or 1
    for tokens in ints(a.tokens):
        for d in ints(a.d):
            for causal in ints(a.causal):
                for N in ints(a.N):
                    H = max(1, tokens // (B * N))
                    for G in ints(a.group):  # grouped K/V heads: G query heads a K/V head, where G divides H
                        if H % G == 0:
                            for w in windows(a):
                                yield B, H, H // G, N, N, d, causal, w


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="libfa_capi.so of a CUDA build")
    ap.add_argument("--alt", action="append", default=[], metavar="NAME=PATH",
                    help="libfa_capi.so of another build, whose steps are STEP@NAME in --impls")
    ap.add_argument("--csv", default="ab.csv")
    ap.add_argument("--impls", default=None,
                    help="steps (07), versions of a step's note table (07h4) and torch-<backend>, comma-separated")
    ap.add_argument("--dir", default="fwd", choices=["fwd", "bwd"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--decode", action="store_true")
    ap.add_argument("--d", default=None)
    ap.add_argument("--N", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--causal", default=None)
    ap.add_argument("--tokens", default="131072,524288")
    ap.add_argument("--Nq", default="1,16")
    ap.add_argument("--Nkv", default="8192,16384,32768,65536,131072")
    ap.add_argument("--bh", default="32,128")
    ap.add_argument("--group", default="1")
    ap.add_argument("--seqs", type=int, default=1, help="decoding: B·H as this many sequences (B) of B·H/B heads")
    ap.add_argument("--windows", default="-1:-1", help="LEFT:RIGHT,... (training shapes): -1:-1 is none")
    ap.add_argument("--ragged", type=int, default=0, metavar="B",
                    help="B sequences a shape (even), for 07r and 07m: the batch as a ragged one, and mixed lengths")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--pause-ms", type=float, default=0.0)
    ap.add_argument("--hide-host-us", type=float, default=200.0)
    ap.add_argument("--check-peers", action="store_true",
                    help="check PyTorch's backends' forward too, against the same reference as the steps (fp32 where "
                         "it fits), print every error, and leave a backend that differs untimed")
    a = ap.parse_args()
    import_torch()
    if a.decode and a.dir == "bwd":
        sys.exit("ab.py: decoding shapes have no backward here")
    if a.ragged and (a.ragged % 2 or a.decode or a.windows != "-1:-1"):
        sys.exit("ab.py: --ragged takes an even number of sequences, training shapes with no window")
    a.impls = (a.impls or ("08,06,torch-cudnn,torch-flash,torch-efficient" if a.decode else "07,06,torch-cudnn,torch-flash")).split(",")
    a.d = a.d or ("128" if a.decode else "64,128,256")
    a.causal = a.causal or "0"
    if a.seqs != 1 and not (a.decode and a.seqs > 0 and all(kv % a.seqs == 0 for _, kv, *_ in decode_shapes(a))):
        sys.exit(f"ab.py: --seqs {a.seqs}: decoding shapes only, and a divisor of every shape's K/V heads")
    for impl in a.impls:
        if impl.startswith("torch-") and impl[6:] not in BACKENDS:
            sys.exit(f"ab.py: unknown implementation {impl} (torch-" + ", torch-".join(BACKENDS) + ", or a step)")
    libs = {"": Steps(a.lib)}
    for alt in a.alt:
        name, _, path = alt.partition("=")
        if not name or not path or "@" in name:
            sys.exit(f"ab.py: --alt {alt}: expected NAME=PATH")
        libs[name] = Steps(path)
    for impl in a.impls:
        if not impl.startswith("torch-") and impl.partition("@")[2] not in libs:
            sys.exit(f"ab.py: {impl}: no --alt {impl.partition('@')[2]}=…")
    nvml, flush, dev = Nvml(), l2_flush_buffer(), device_fields()
    spin = int(a.hide_host_us * 2000)  # cycles: at least --hide-host-us at clocks up to 2 GHz
    if not nvml.lib:
        print("ab.py: NVML not found: clocks, power and reasons are written as 0", file=sys.stderr)
    else:
        t = time.perf_counter()
        for _ in range(20):
            nvml.sample()
        print(f"ab.py: NVML answers in {(time.perf_counter() - t) / 20 * 1e3:.2f} ms a sample", file=sys.stderr)
    out = open(a.csv, "w")
    out.write("impl,step,dir,dtype,B,H,H_kv,N,N_kv,d,causal,round,ms,tflops,gbps,sm_mhz_min,power_w_max,temp_c_max,"
              "host_us_max,reasons,status,gpu,cuda_driver_api,cuda_runtime,window_left,window_right\n")
    late = {}  # implementation: its longest enqueue that passed the spin, µs
    tol = 2e-2 if a.dir == "fwd" else 5e-2  # a step's outputs against the reference: max relative error
    for n_case, (B, H, H_kv, N, N_kv, d, causal, window) in enumerate(shapes(a)):
        case = Case(a, libs, B, H, H_kv, N, N_kv, d, causal, seed=N + N_kv + d + n_case, window=window)
        band = case.band()
        pairs = float(band.sum()) if band is not None else N * N_kv - (N * N / 2 if causal else 0)
        del band
        flops = 4.0 * B * H * pairs * d * (2.5 if a.dir == "bwd" else 1.0)
        flops_of = {impl: 4.0 * H * case.pairs(impl) * d * (2.5 if a.dir == "bwd" else 1.0)  # ragged ones
                    for impl in a.impls if case.lengths(impl)}
        floor = 2.0 * (2 * case.q.numel() + 2 * case.k.numel()) + 4.0 * B * H * N
        shape_txt = f"B={B} H={H} H_kv={H_kv} N={N} N_kv={N_kv} d={d} causal={causal}" + (
            f" window={window[0]},{window[1]}" if window != (-1, -1) else "")
        ref = case.torch_ref()
        fns, status, outs = {}, {}, {}  # outs: a step's output tensors, checked again after every timed round
        for impl in a.impls:
            try:
                if impl.startswith("torch-"):
                    fns[impl] = case.torch_fn(impl[6:])
                    if a.check_peers and a.dir == "fwd":  # PyTorch's backends against the same reference
                        err = relative_error(fns[impl](), ref[0])
                        torch.cuda.synchronize()
                        print(f"  {impl} {shape_txt}: max relative error {err:.3g}", file=sys.stderr)
                        if not err <= 2e-2:
                            del fns[impl]
                            raise RuntimeError(f"outputs differ from the fp32 reference: max relative error {err:.3g}")
                else:
                    fn, got, error = case.step_fn(impl)
                    error = error or (lambda got=got: (max_error(got, ref), ""))
                    err, where = error()
                    if not err <= tol:  # NaN too
                        raise RuntimeError(f"outputs differ from PyTorch's: max relative error {err:.3g}{where}")
                    fns[impl], outs[impl] = fn, (got, error)
            except (RuntimeError, torch.OutOfMemoryError) as e:
                status[impl] = ("out-of-memory" if "out of memory" in str(e) else "differs" if "differ" in str(e)
                                else "unsupported")
                if not impl.startswith("torch-") or status[impl] == "differs":
                    print(f"  {impl} {a.dir} {shape_txt}: {e}", file=sys.stderr)
        meds = {}
        for r in range(a.rounds):
            order = a.impls[r % len(a.impls):] + a.impls[:r % len(a.impls)]
            for impl in order:
                who = f"{impl},-" if impl.startswith("torch-") else f"fa,{impl}"  # the CSVs' impl, step
                row = f"{who},{a.dir},{a.dtype},{B},{H},{H_kv},{N},{N_kv},{d},{causal},{r},"
                if impl not in fns:
                    out.write(row + f"0,0,0,0,0,0,0,none,{status[impl]},{dev},{window[0]},{window[1]}\n")
                    continue
                if a.pause_ms:
                    torch.cuda.synchronize()
                    time.sleep(a.pause_ms / 1000)
                ms, mhz, watts, temp, why, host_us = time_block(fns[impl], a.reps, flush, spin, nvml)
                if impl in outs:  # a call like the timed ones, poisoned first: a time is the work's, all of it
                    got, error = outs[impl]
                    for g in got:
                        g.fill_(float("nan"))
                    fns[impl]()
                    err, where = error()
                    if not err <= tol:
                        print(f"  {impl} {a.dir} {shape_txt}, round {r}: after timing, outputs differ from PyTorch's: "
                              f"max relative error {err:.3g}{where}", file=sys.stderr)
                        out.write(row + f"0,0,0,0,0,0,0,none,differs,{dev},{window[0]},{window[1]}\n")
                        continue
                meds.setdefault(impl, []).append(ms)
                if host_us > a.hide_host_us:
                    late[impl] = max(late.get(impl, 0.0), host_us)
                out.write(row + f"{ms:.5f},{flops_of.get(impl, flops) / (ms * 1e-3) / 1e12:.3f},"
                                f"{floor / (ms * 1e-3) / 1e9:.1f},"
                                f"{mhz},{watts:.1f},{temp},{host_us:.0f},{nvml.names(why)},ok,{dev},{window[0]},"
                                f"{window[1]}\n")
            out.flush()
        print(shape_txt + ": " + ", ".join(f"{i} {statistics.median(m):.4f} ms" for i, m in meds.items()), file=sys.stderr)
        case.free()
        case = fns = outs = ref = fn = got = error = None  # the last step's outputs too, before empty_cache
        torch.cuda.empty_cache()
    for impl, us in late.items():
        print(f"ab.py: {impl}'s host work took up to {us:.0f} µs, past the {a.hide_host_us} µs spin: its times there "
              "may include host time (host_us_max in the CSV; raise --hide-host-us)", file=sys.stderr)


if __name__ == "__main__":
    main()
