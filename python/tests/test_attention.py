"""flashattn_steps against PyTorch's own attention (pytest).

Each test needs PyTorch; those that launch a kernel need a CUDA GPU and libfa_capi.so, and
are skipped with the reason where either is missing — never passed.
"""
import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import flashattn_steps  # noqa: E402
from flashattn_steps import attention  # noqa: E402

try:
    flashattn_steps.find_library()
    _no_lib = ""
except flashattn_steps.LibraryNotFound as e:
    _no_lib = str(e)
gpu = pytest.mark.skipif(not torch.cuda.is_available() or bool(_no_lib),
                         reason=_no_lib or "no CUDA GPU")
hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                            reason="step 07 runs on sm_90 (H100, H200) only")


def math_sdpa(q, k, v, causal, scale=None, window=(-1, -1)):
    """PyTorch's math backend in fp32 (the bottom-right causal mask of the steps when N_kv > N), with
    a window's band written out as a mask."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (t.float() for t in (q, k, v))
    mask = None
    N, Nk = q.shape[-2], k.shape[-2]
    if causal:
        mask = torch.ones(N, Nk, dtype=torch.bool, device=q.device).tril(Nk - N)
    if window != (-1, -1):
        left, right = window
        band = torch.ones(N, Nk, dtype=torch.bool, device=q.device)
        if left >= 0:
            band = band.triu(Nk - N - left)
        if right >= 0:
            band = band.tril(Nk - N + right)
        mask = band if mask is None else mask & band
    if k.shape[1] != q.shape[1]:
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    with sdpa_kernel(SDPBackend.MATH):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def inputs(B, H, N, d, dtype, layout, seed=0, H_kv=None, N_kv=None):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = lambda h, n: (B, h, n, d) if layout == "bhnd" else (B, n, h, d)  # noqa: E731
    q = torch.randn(shape(H, N), generator=g, device="cuda", dtype=torch.float32).to(dtype)
    k = torch.randn(shape(H_kv or H, N_kv or N), generator=g, device="cuda").to(dtype)
    v = torch.randn(shape(H_kv or H, N_kv or N), generator=g, device="cuda").to(dtype)
    return [t.requires_grad_() for t in (q, k, v)]


def to_bhnd(t, layout):
    return t if layout == "bhnd" else t.transpose(1, 2)


def rel(got, want, scale=None):
    """max |got − want| over max |want| (or over `scale`, where want may vanish: dQ at N = 1 is 0)."""
    den = want.float().abs().max() if scale is None else torch.tensor(float(scale))
    return ((got.float() - want.float()).abs().max() / den.clamp_min(1e-30)).item()


# fp32 steps against fp32 math: reordered sums only. 16-bit steps: inputs rounded the same, P and O
# rounded to 16 bits inside (FlashAttention's budget: about 2x a naive 16-bit computation).
CASES = [("01", torch.float32, 1e-4), ("05", torch.float32, 1e-4),
         ("06", torch.bfloat16, 2e-2), ("06", torch.float16, 4e-3)]


@gpu
@pytest.mark.parametrize("step,dtype,tol", CASES)
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("N", [1, 17, 113])
def test_forward_and_gradients_match_math_sdpa(step, dtype, tol, layout, causal, N):
    q, k, v = inputs(2, 3, N, 64, dtype, layout, seed=N)
    o = attention(q, k, v, causal=causal, step=step, layout=layout)
    assert o.shape == q.shape and o.dtype == dtype
    qm, km, vm = (to_bhnd(t.detach().float(), layout).requires_grad_() for t in (q, k, v))
    om = math_sdpa(qm, km, vm, causal)
    assert rel(to_bhnd(o, layout), om) < tol
    do = torch.randn_like(o)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    dqm, dkm, dvm = torch.autograd.grad(om, (qm, km, vm), to_bhnd(do.float(), layout))
    # With one key dS = P∘(dP − D) = 0, so dQ and dK vanish: their errors over a floor of
    # 1e-3 of dP's scale, |dO|·|V|, where they are that small.
    floor = 1e-3 * do.float().abs().max().item() * vm.abs().max().item()
    for name, got, want in (("dQ", dq, dqm), ("dK", dk, dkm), ("dV", dv, dvm)):
        sc = max(want.abs().max().item(), floor)
        assert rel(to_bhnd(got, layout), want, sc) < 3 * tol, name


@gpu
@hopper
@pytest.mark.parametrize("d", [64, 128])
def test_step07_and_its_deterministic_mode(d):
    q, k, v = inputs(1, 2, 1000, d, torch.bfloat16, "bhnd", seed=d)
    o = attention(q, k, v, causal=True, step="07")
    assert rel(o, math_sdpa(q.detach(), k.detach(), v.detach(), True)) < 2e-2
    do = torch.randn_like(o)
    first = torch.autograd.grad(attention(q, k, v, causal=True, step="07", deterministic=True), (q, k, v), do)
    again = torch.autograd.grad(attention(q, k, v, causal=True, step="07", deterministic=True), (q, k, v), do)
    for a, b in zip(first, again):
        assert torch.equal(a, b)  # the same bits, run after run


@gpu
@hopper
@pytest.mark.parametrize("window", [(64, 0), (16, 16), (-1, 5)])
@pytest.mark.parametrize("H_kv", [4, 1])
def test_step07_windows_and_grouped_heads_forward_and_backward(window, H_kv):
    q, k, v = inputs(1, 4, 300, 64, torch.bfloat16, "bhnd", seed=7, H_kv=H_kv)
    causal = window[1] == 0
    o = attention(q, k, v, causal=causal, step="07", window=window)
    qm, km, vm = (t.detach().float().requires_grad_() for t in (q, k, v))
    om = math_sdpa(qm, km, vm, causal, window=window)
    assert rel(o, om) < 2e-2
    do = torch.randn_like(o)
    got = torch.autograd.grad(o, (q, k, v), do)
    want = torch.autograd.grad(om, (qm, km, vm), do.float())
    for name, g, w in zip(("dQ", "dK", "dV"), got, want):
        assert g.shape == w.shape, name
        assert rel(g, w) < 6e-2, name


def test_a_window_is_two_sides():
    q = torch.zeros(1, 1, 4, 64)
    with pytest.raises(ValueError, match="window must be"):
        attention(q, q, q, window=5)
    with pytest.raises(ValueError, match="window sides"):
        attention(q, q, q, window=(-2, 0))


@gpu
def test_scale_and_grouped_heads_reach_the_kernel():
    q, k, v = inputs(1, 4, 17, 64, torch.bfloat16, "bhnd", H_kv=2)
    with torch.no_grad():
        o = attention(q, k, v, scale=0.3, step="06")
    assert rel(o, math_sdpa(q, k, v, False, scale=0.3)) < 2e-2


@gpu
def test_step08_decodes_and_refuses_a_backward():
    q, k, v = inputs(1, 4, 1, 128, torch.bfloat16, "bhnd", H_kv=2, N_kv=1000)
    with torch.no_grad():
        o = attention(q, k, v, causal=True, step="08")
    assert rel(o, math_sdpa(q, k, v, True)) < 2e-2
    with pytest.raises(ValueError, match="step 08 has no backward"):
        attention(q, k, v, step="08")


@gpu
def test_torch_compile_traces_a_module_that_uses_it():
    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(64, 64, device="cuda", dtype=torch.bfloat16)

        def forward(self, q, k, v):
            return self.proj(attention(q, k, v, causal=True, step="06"))

    torch.manual_seed(0)
    m = Attn()
    q, k, v = inputs(2, 2, 33, 64, torch.bfloat16, "bhnd")
    eager = m(q, k, v)
    compiled = torch.compile(m, fullgraph=True)(q, k, v)
    torch.testing.assert_close(compiled, eager)  # the same kernels; inductor may fuse the bias otherwise
    g_eager = torch.autograd.grad(eager.sum(), (q, k, v))
    g_comp = torch.autograd.grad(compiled.sum(), (q, k, v))
    for a, b in zip(g_eager, g_comp):
        torch.testing.assert_close(a, b)


def test_errors_are_one_clear_line():
    q = torch.zeros(1, 1, 4, 64)
    with pytest.raises(ValueError, match="on cpu; the steps run on a CUDA device"):
        attention(q, q, q, step="06")
    with pytest.raises(ValueError, match="step must be one of"):
        attention(q, q, q, step="42")
    with pytest.raises(ValueError, match="layout must be"):
        attention(q, q, q, layout="nhd")
    with pytest.raises(ValueError, match="must have 4 dimensions"):
        attention(q[0], q[0], q[0])


@gpu
def test_wrong_dtype_and_unsupported_d_are_refused():
    q, k, v = inputs(1, 1, 8, 64, torch.float32, "bhnd")
    with pytest.raises(ValueError, match="step 07 computes in"):
        attention(q, k, v, step="07")
    q, k, v = inputs(1, 1, 8, 100, torch.bfloat16, "bhnd")
    with pytest.raises(ValueError, match="d = 100"):
        attention(q, k, v, step="06")


def test_a_missing_library_is_named(monkeypatch):
    monkeypatch.setenv("FLASHATTN_STEPS_LIB", "/nonexistent/libfa_capi.so")
    with pytest.raises(flashattn_steps.LibraryNotFound, match="no such file"):
        flashattn_steps.find_library()
