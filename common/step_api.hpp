// The one interface every GPU step implements, so that one table of steps drives
// the tour, the CLI, the tests and the bench. Device pointers in, device pointers
// out; scratch memory comes from the caller as one workspace whose size the step
// reports (CUTLASS's convention), so "extra device memory" is a number we can print.
//
// This header needs no CUDA headers: it is included by CPU-only code too.
#pragma once

#include <cstddef>
#include <string>

#include "common/problem.hpp"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace fa {

using Stream = CUstream_st*;

/// Device pointers for a forward pass. `lse` may be null for steps without softmax.
struct FwdArgs {
  const float *q, *k, *v;
  float *o, *lse;
};

/// Device pointers for a backward pass.
struct BwdArgs {
  const float *q, *k, *v, *o, *lse, *dout;
  float *dq, *dk, *dv;
};

/// A ragged batch: `sequences` sequences of different lengths packed one after another in
/// the problem's N rows (B = 1), sequence b being rows offsets[b] … offsets[b + 1] − 1 of
/// every head (FlashAttention's cu_seqlens: int32 on the device, sequences + 1 of them).
struct Ragged {
  const int* offsets = nullptr;
  int sequences = 0;  ///< 0: not ragged
};

/// A paged K/V cache (vLLM's PagedAttention): K and V are pools of `pool` pages [H_kv, page, d];
/// sequence b's key positions page·x … page·x + page − 1 are in page table[b·width + x]
/// (width = ⌈N_kv/page⌉), and it holds lengths[b] keys (null: N_kv each). int32 on the device.
struct Paged {
  const int* table = nullptr;
  const int* lengths = nullptr;
  int page = 0;  ///< 0: not paged
  int pool = 0;
};

/// Device pointers in the problem's own element type (bf16 or fp16: 2 bytes each).
struct NativeFwdArgs {
  const void *q, *k, *v;
  void* o;
  float* lse;
  Ragged ragged{};  ///< a ragged batch, for the steps that take one (GpuForward::ragged_workspace_bytes)
  Paged paged{};    ///< K and V as a paged cache, for the steps that take one (GpuForward::paged)
};

/// The same for a backward pass (L and the gradients' accumulators stay fp32).
struct NativeBwdArgs {
  const void *q, *k, *v, *o;
  const float* lse;
  const void* dout;
  void *dq, *dk, *dv;
  Ragged ragged{};  ///< a ragged batch, for the steps that take one (GpuBackward::ragged_workspace_bytes)
};

/// The workspace_bytes of a step that needs no scratch memory.
inline std::size_t no_workspace(const Problem&) { return 0; }

/// A forward step, written with designated initialisers: `.name` and `.max_d` always,
/// the other fields where they differ from their defaults.
struct GpuForward {
  const char* name;                                                   ///< "step01 forward"
  int max_d;                                                          ///< largest head dimension supported (0: any)
  std::size_t (*workspace_bytes)(const Problem&) = no_workspace;      ///< scratch the step needs in device memory
  const char* workspace_what = "";                                    ///< what the scratch holds, for error messages
  void (*run)(const Problem&, const FwdArgs&, void* workspace, Stream) = nullptr;  ///< fp32 steps
  /// 16-bit steps: run on tensors of p.dtype (null for fp32-only steps).
  void (*run_native)(const Problem&, const NativeFwdArgs&, void* workspace, Stream) = nullptr;
  /// Head dimensions the step takes, when it takes only some (0-terminated); empty: 1..max_d.
  const int* only_d = nullptr;
  /// The oldest GPU the kernels run on, as compute capability ×10 (80: sm_80); 0: any.
  /// Older architectures get the kernels compiled out, and a clear error at run time.
  int min_sm = 0;
  /// The kernels are architecture-specific code (sm_90a): they run on min_sm only.
  bool exact_sm = false;
  /// Takes decoding shapes: N_kv ≠ N keys (the queries the last N positions) and
  /// grouped-query attention (H_kv ≠ H). Otherwise self-attention only.
  bool decode = false;
  /// Takes grouped K/V heads (H_kv ≠ H) on self-attention's N_kv = N.
  bool groups = false;
  /// Takes a window (Problem::window_left, window_right).
  bool window = false;
  /// Takes a ragged batch (NativeFwdArgs::ragged), with this workspace for p packed and its
  /// number of sequences; null where the step does not.
  std::size_t (*ragged_workspace_bytes)(const Problem&, int sequences) = nullptr;
  /// Takes K and V as a paged cache (NativeFwdArgs::paged).
  bool paged = false;
};

/// A backward step, written as GpuForward.
struct GpuBackward {
  const char* name;
  int max_d;
  std::size_t (*workspace_bytes)(const Problem&) = no_workspace;
  const char* workspace_what = "";
  void (*run)(const Problem&, const BwdArgs&, void* workspace, Stream) = nullptr;  ///< fp32 steps
  void (*run_native)(const Problem&, const NativeBwdArgs&, void* workspace, Stream) = nullptr;  ///< 16-bit steps
  const int* only_d = nullptr;  ///< as GpuForward::only_d
  int min_sm = 0;               ///< as GpuForward::min_sm
  bool exact_sm = false;        ///< as GpuForward::exact_sm
  bool groups = false;          ///< as GpuForward::groups: dK, dV of a K/V head sum over its group
  bool window = false;          ///< as GpuForward::window
  /// As GpuForward::ragged_workspace_bytes.
  std::size_t (*ragged_workspace_bytes)(const Problem&, int sequences) = nullptr;
};

/// Whether kernels that take head dimensions up to max_d (0: any), and only those in
/// the 0-terminated list only_d where it is not null, run at head dimension d.
inline bool takes_d(int max_d, const int* only_d, int d) {
  if (max_d > 0 && d > max_d) return false;
  if (!only_d) return true;
  for (const int* x = only_d; *x; ++x)
    if (*x == d) return true;
  return false;
}

/// The head dimensions of a 0-terminated list, for error messages: "32, 64, 96".
inline std::string d_list(const int* only_d) {
  std::string list;
  for (const int* x = only_d; *x; ++x) list += (list.empty() ? "" : ", ") + std::to_string(*x);
  return list;
}

}  // namespace fa
