// The one interface every GPU step implements, so that one table of steps drives
// the tour, the CLI, the tests and the bench. Device pointers in, device pointers
// out; scratch memory comes from the caller as one workspace whose size the step
// reports (CUTLASS's convention), so "extra device memory" is a number we can print.
//
// This header needs no CUDA headers: it is included by CPU-only code too.
#pragma once

#include <cstddef>

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

struct GpuForward {
  const char* name;                                      ///< "step01 forward"
  int max_d;                                             ///< largest head dimension supported
  std::size_t (*workspace_bytes)(const Problem&);        ///< scratch the step needs in device memory
  const char* workspace_what;                            ///< what the scratch holds, for error messages
  void (*run)(const Problem&, const FwdArgs&, void* workspace, Stream);
};

struct GpuBackward {
  const char* name;
  int max_d;
  std::size_t (*workspace_bytes)(const Problem&);
  const char* workspace_what;
  void (*run)(const Problem&, const BwdArgs&, void* workspace, Stream);
};

inline std::size_t no_workspace(const Problem&) { return 0; }

}  // namespace fa
