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

/// Runs a forward step on host tensors. Outputs are filled with the poison
/// pattern before the launch, so unwritten elements are visible to compare().
/// Throws fa::Error when d is unsupported or the device cannot hold the data.
ForwardOut forward(const GpuForward& step, const Problem& p, const Qkv& in, bool softmax);

/// Runs a backward step on host tensors (fwd holds O and L).
Grads backward(const GpuBackward& step, const Problem& p, const Qkv& in, const ForwardOut& fwd,
               const std::vector<float>& dout);

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
