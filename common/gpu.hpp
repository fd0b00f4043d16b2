// Host-side wrappers around a GpuForward / GpuBackward: copy in, poison the
// outputs, run, check, copy out. Compiled only with CUDA, but this header is
// plain C++ so host code (tests, the CLI) need not be compiled by nvcc.
#pragma once

#include <string>
#include <vector>

#include "common/problem.hpp"
#include "common/step_api.hpp"

namespace fa::gpu {

/// True when a CUDA device can be used. Any error (no driver, "driver version is
/// insufficient", no device) means no; `why` receives the reason.
bool available(std::string* why = nullptr);

/// "NVIDIA H200 (sm_90, 132 SMs), driver 13.0, runtime 13.0"
std::string describe_device();

/// Multiprocessors of the current device.
int sm_count();

/// Shared memory of one multiprocessor of the current device, bytes (all its blocks together).
std::size_t smem_per_sm();
/// The most shared memory one block may take on the current device (opt-in), bytes.
std::size_t smem_per_block();
/// The L2 cache of the current device, bytes (50 MiB on an H100 or H200).
std::size_t l2_bytes();

/// Compute capability of the current device ×10: 90 on an H200, 75 on a T4.
int compute_capability();

/// The architecture the device code that runs here was compiled for (__CUDA_ARCH__
/// / 10, read by a kernel): 90 for a sm_90 build on an H200; 80 when a build of
/// `80-virtual` (PTX only) is JIT-compiled by the driver — the sm_80 code path, run
/// on a newer GPU. Throws when the build holds no code this GPU can run.
int device_code_arch();

/// Empty when the current device can run kernels built for compute capability
/// min_sm (×10) and up — exactly min_sm when `exact` (architecture-specific code,
/// sm_90a) —; else why not, in one line naming the device.
std::string too_old(int min_sm, bool exact = false);

/// Throws fa::Error, in one line, unless `step` can run p on this GPU: its head
/// dimensions, its element types, self-attention or decoding shapes, the GPU's
/// architecture. What forward(), backward() and the timers check first.
void check_runnable(const GpuForward& step, const Problem& p);
void check_runnable(const GpuBackward& step, const Problem& p);

/// Runs a forward step on host tensors. Outputs are filled with the poison
/// pattern before the launch, so unwritten elements are visible to compare().
/// Throws fa::Error when d is unsupported or the device cannot hold the data.
ForwardOut forward(const GpuForward& step, const Problem& p, const Qkv& in, bool softmax);

/// The same on a ragged batch (p packed: B = 1, N the total; require_offsets), for a step
/// that takes one (GpuForward::ragged_workspace_bytes).
ForwardOut forward(const GpuForward& step, const Problem& p, const Qkv& in, const std::vector<int>& offsets);
/// forward with K and V a paged cache (in.k, in.v its pools; kv validated first), for a step
/// that takes one (GpuForward::paged).
ForwardOut forward_paged(const GpuForward& step, const Problem& p, const Qkv& in, const PagedKv& kv);
/// Runs a backward step on host tensors (fwd holds O and L).
Grads backward(const GpuBackward& step, const Problem& p, const Qkv& in, const ForwardOut& fwd,
               const std::vector<float>& dout);

/// The same on a ragged batch, as forward's.
Grads backward(const GpuBackward& step, const Problem& p, const Qkv& in, const ForwardOut& fwd,
               const std::vector<float>& dout, const std::vector<int>& offsets);
/// Bytes a call needs in device memory: the tensors plus the step's workspace.
std::size_t forward_bytes(const GpuForward& step, const Problem& p);
std::size_t backward_bytes(const GpuBackward& step, const Problem& p);

struct Timing {
  double median_ms = 0, min_ms = 0;
  int reps = 0;
};
/// Times a step on random inputs: warm-up, L2 flushed before every repeat,
/// CUDA events around the launch only, median of `reps`. reps = 0: one untimed
/// launch and nothing else (for profilers).
Timing time_forward(const GpuForward& step, const Problem& p, int reps);
Timing time_backward(const GpuBackward& step, const Problem& p, int reps);

}  // namespace fa::gpu
