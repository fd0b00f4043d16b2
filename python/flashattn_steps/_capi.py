"""libfa_capi.so through ctypes: find it, plan a problem, launch on torch's current stream.

The library is the steps' GPU kernels behind a C interface (tools/bench/fa_capi.h). It
exists only in a build with CUDA: `cmake --build build --target fa_capi`.
"""
import ctypes
import glob
import os
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = "FLASHATTN_STEPS_LIB"
DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}  # fa_shape.dtype


class Shape(ctypes.Structure):
    """struct fa_shape: H_kv, N_kv = 0 mean H, N; scale = 0 means 1/sqrt(d); windowed = 0: no window."""
    _fields_ = [(n, ctypes.c_int) for n in ("B", "H", "H_kv", "N", "N_kv", "d", "causal", "dtype")] + [
        ("scale", ctypes.c_float)] + [(n, ctypes.c_int) for n in ("windowed", "window_left", "window_right",
                                                                  "sequences")]


class LibraryNotFound(RuntimeError):
    pass


def find_library():
    """$FLASHATTN_STEPS_LIB, else the newest build*/tools/bench/libfa_capi.so under the repository."""
    path = os.environ.get(ENV)
    if path:
        if not os.path.isfile(path):
            raise LibraryNotFound(f"{ENV}={path}: no such file")
        return path
    found = glob.glob(os.path.join(ROOT, "build*", "tools", "bench", "libfa_capi.so"))
    if not found:
        raise LibraryNotFound(
            "libfa_capi.so not found: it is built only with CUDA (nvcc) — "
            "`cmake -S . -B build -G Ninja && cmake --build build --target fa_capi` — "
            f"or set {ENV} to its path")
    return max(found, key=os.path.getmtime)


class Library:
    def __init__(self, path):
        self.path = path
        lib = ctypes.CDLL(path)
        lib.fa_plan.restype = ctypes.c_void_p
        lib.fa_plan.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(Shape),
                                ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_char_p, ctypes.c_int]
        lib.fa_free_plan.argtypes = [ctypes.c_void_p]
        lib.fa_forward.argtypes = [ctypes.c_void_p] * 8 + [ctypes.c_char_p, ctypes.c_int]
        lib.fa_backward.argtypes = [ctypes.c_void_p] * 12 + [ctypes.c_char_p, ctypes.c_int]
        self.lib = lib
        self.plans = {}  # (step, backward, shape fields) -> (plan, workspace bytes); a plan is a few ints
        self.lock = threading.Lock()

    def plan(self, step, backward, shape):
        """(plan, workspace bytes), or ValueError in the step's own words (an unsupported d, dtype, GPU…)."""
        key = (step, backward, tuple(getattr(shape, f) for f, _ in Shape._fields_))
        with self.lock:
            if key not in self.plans:
                err = ctypes.create_string_buffer(1024)
                ws = ctypes.c_ulonglong(0)
                plan = self.lib.fa_plan(step.encode(), int(backward), ctypes.byref(shape), ctypes.byref(ws), err,
                                        len(err))
                if not plan:
                    raise ValueError(f"flashattn_steps: step {step}: {err.value.decode()}")
                self.plans[key] = (plan, ws.value)
            return self.plans[key]

    def launch(self, fn, ptrs, stream):
        err = ctypes.create_string_buffer(1024)
        if fn(*[ctypes.c_void_p(p) for p in ptrs], ctypes.c_void_p(stream), err, len(err)):
            raise RuntimeError(f"flashattn_steps: {err.value.decode()}")


_library = None


def library():
    """The loaded library (found once)."""
    global _library
    if _library is None:
        _library = Library(find_library())
    return _library
