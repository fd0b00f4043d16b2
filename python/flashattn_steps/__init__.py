"""flashattn_steps: the course's attention kernels from PyTorch.

    from flashattn_steps import attention
    o = attention(q, k, v, causal=True, step="07")   # q, k, v: [B, H, N, d] bf16 on a GPU

Pure Python over libfa_capi.so (ctypes): nothing is built against PyTorch. The library is
found through $FLASHATTN_STEPS_LIB or in the repository's build*/tools/bench/ folders.
"""
from ._capi import LibraryNotFound, find_library, library
from .ops import STEPS, attention

__all__ = ["attention", "library", "find_library", "LibraryNotFound", "STEPS"]
