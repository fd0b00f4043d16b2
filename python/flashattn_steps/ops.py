"""The steps as a PyTorch operator: a custom op for the forward and one for the backward,
tied together by autograd, each with a fake (meta) implementation for torch.compile.

The ops take [B, H, N, d] contiguous tensors (the steps' layout); `attention` converts
the layouts users have and checks everything before a kernel sees a pointer.
"""
import math

import torch

from . import _capi

# What each step computes in, and whether it has a GPU backward (tools/flashattn/steps_table.cpp).
STEPS = {
    "01": ((torch.float32,), True),
    "05": ((torch.float32,), True),
    "06": ((torch.bfloat16, torch.float16), True),
    "07": ((torch.bfloat16, torch.float16), True),
    "08": ((torch.bfloat16, torch.float16), False),
}


def _shape(q, k, causal, scale, window_left=-1, window_right=-1):
    B, H, N, d = q.shape
    H_kv, N_kv = k.shape[1], k.shape[2]
    windowed = int(window_left >= 0 or window_right >= 0)
    return _capi.Shape(B, H, 0 if H_kv == H else H_kv, N, 0 if N_kv == N else N_kv, d, int(causal),
                       _capi.DTYPE_CODES[str(q.dtype).removeprefix("torch.")], float(scale), windowed,
                       window_left, window_right)


def _forward_id(step):
    return "04" if step == "05" else step  # step 05 is a backward; its forward is step 04's


def _backward_id(step, deterministic):
    return step + "det" if deterministic else step


def _workspace(nbytes, device):
    return torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)


@torch.library.custom_op("flashattn_steps::forward", mutates_args=())
def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, step: str,
            deterministic: bool, window_left: int, window_right: int) -> tuple[torch.Tensor, torch.Tensor]:
    """O and L = m + log ℓ (fp32, [B, H, N]) of step `step`; `deterministic` is for the backward."""
    lib = _capi.library()
    plan, nbytes = lib.plan(_forward_id(step), False, _shape(q, k, causal, scale, window_left, window_right))
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    ws = _workspace(nbytes, q.device)
    with torch.cuda.device(q.device):
        stream = torch.cuda.current_stream(q.device).cuda_stream
        lib.launch(lib.lib.fa_forward, [plan, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                        lse.data_ptr(), ws.data_ptr()], stream)
    return o, lse


@forward.register_fake
def _(q, k, v, causal, scale, step, deterministic, window_left, window_right):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("flashattn_steps::backward", mutates_args=())
def backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
             lse: torch.Tensor, causal: bool, scale: float, step: str, deterministic: bool, window_left: int,
             window_right: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of step `step` (its deterministic mode where asked)."""
    lib = _capi.library()
    plan, nbytes = lib.plan(_backward_id(step, deterministic), True,
                            _shape(q, k, causal, scale, window_left, window_right))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    ws = _workspace(nbytes, q.device)
    with torch.cuda.device(q.device):
        stream = torch.cuda.current_stream(q.device).cuda_stream
        lib.launch(lib.lib.fa_backward, [plan, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                         lse.data_ptr(), dout.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                                         dv.data_ptr(), ws.data_ptr()], stream)
    return dq, dk, dv


@backward.register_fake
def _(dout, q, k, v, o, lse, causal, scale, step, deterministic, window_left, window_right):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, step, deterministic, window_left, window_right = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.args = (causal, scale, step, deterministic, window_left, window_right)


def _autograd_backward(ctx, dout, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = backward(dout.contiguous(), q, k, v, o, lse, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None


forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def _check(q, k, v, step, layout):
    if step not in STEPS:
        raise ValueError(f"flashattn_steps: step must be one of {', '.join(STEPS)} (got {step!r})")
    if layout not in ("bhnd", "bnhd"):
        raise ValueError(f"flashattn_steps: layout must be 'bhnd' (as scaled_dot_product_attention) or 'bnhd' "
                         f"(as FlashAttention) (got {layout!r})")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flashattn_steps: {name} must be a torch.Tensor")
        if t.dim() != 4:
            raise ValueError(f"flashattn_steps: {name} must have 4 dimensions ({layout}), got shape {tuple(t.shape)}")
        if t.device.type != "cuda":
            raise ValueError(f"flashattn_steps: {name} is on {t.device}; the steps run on a CUDA device")
        if t.device != q.device:
            raise ValueError(f"flashattn_steps: q is on {q.device} but {name} on {t.device}")
        if t.dtype != q.dtype:
            raise ValueError(f"flashattn_steps: q is {q.dtype} but {name} is {t.dtype}")
    dtypes, _ = STEPS[step]
    if q.dtype not in dtypes:
        raise ValueError(f"flashattn_steps: step {step} computes in {', '.join(str(t) for t in dtypes)} "
                         f"(got {q.dtype})")
    if k.shape != v.shape:
        raise ValueError(f"flashattn_steps: k and v differ in shape: {tuple(k.shape)} and {tuple(v.shape)}")


def attention(q, k, v, causal=False, scale=None, step="07", deterministic=False, layout="bhnd", window=(-1, -1)):
    """Softmax attention by step `step`'s kernels, differentiable.

    q, k, v: [B, H, N, d] (layout="bhnd", as torch's scaled_dot_product_attention) or
    [B, N, H, d] (layout="bnhd", as FlashAttention); k and v may have fewer heads (grouped
    queries) or keys where the step takes them. Non-contiguous inputs are copied. The kernels
    run on torch's current stream. scale: 1/sqrt(d) by default. deterministic: step 07's
    backward with dQ summed in a fixed order. window: FlashAttention's window_size (left,
    right), the query at position t seeing keys t − left … t + right, -1 an open side (step 07).
    Returns O in q's layout.
    """
    try:
        left, right = (int(x) for x in window)
    except (TypeError, ValueError):
        raise ValueError(f"flashattn_steps: window must be (left, right), -1 for an open side (got {window!r})")
    if left < -1 or right < -1:
        raise ValueError(f"flashattn_steps: window sides must be -1 (open) or at least 0 (got {window!r})")
    _check(q, k, v, step, layout)
    if layout == "bnhd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    B, H, N, d = q.shape
    if k.shape[0] != B or k.shape[3] != d:
        raise ValueError(f"flashattn_steps: q {tuple(q.shape)} and k {tuple(k.shape)} disagree on B or d "
                         f"(in [B, H, N, d])")
    if deterministic and step != "07":
        raise ValueError("flashattn_steps: the deterministic backward is step 07's")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"flashattn_steps: scale must be a positive finite number (got {scale})")
    q, k, v = (t.contiguous() for t in (q, k, v))
    compiling = torch.compiler.is_compiling()  # the checks below call the library: eager mode only
    if not compiling and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        if not STEPS[step][1]:
            raise ValueError(f"flashattn_steps: step {step} has no backward; call it under torch.no_grad()")
        _capi.library().plan(_backward_id(step, deterministic), True,
                             _shape(q, k, causal, scale, left, right))  # refuse now
    o, _ = forward(q, k, v, bool(causal), scale, step, bool(deterministic), left, right)
    return o.transpose(1, 2) if layout == "bnhd" else o
