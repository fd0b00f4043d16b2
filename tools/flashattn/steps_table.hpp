// The table of steps that drives the tour, the CLI and the bench: one row per
// step, the same fields for every step. Adding a step means adding a row.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/hbm.hpp"
#include "common/problem.hpp"
#include "common/step_api.hpp"
#include "steps/03_online_softmax/trace.hpp"

namespace fa {

struct StepEntry {
  std::string id;    ///< "reference", "01", … (what --step takes)
  std::string what;  ///< one line: what it computes and how
  bool gpu;          ///< needs a CUDA device
  bool softmax;      ///< softmax attention; false: O = (scale·QKᵀ)V
  /// Forward on host tensors: the kernel (GPU steps) or the reference.
  std::function<ForwardOut(const Problem&, const Qkv&)> forward;
  /// Backward on host tensors; empty when the step has none.
  std::function<Grads(const Problem&, const Qkv&, const ForwardOut&, const std::vector<float>&)> backward;
  /// The CPU model of the step's forward (empty for the reference).
  std::function<ModelForward(const Problem&, const Qkv&)> model;
  /// The CPU model of the step's backward (empty when it has none).
  std::function<ModelBackward(const Problem&, const Qkv&, const ForwardOut&, const std::vector<float>&)> model_backward;
  /// The note's HBM traffic of the forward (and backward) in elements.
  std::function<Traffic(const Problem&)> traffic_forward, traffic_backward;
  const GpuForward* gpu_forward = nullptr;    ///< for timing
  const GpuBackward* gpu_backward = nullptr;  ///< for timing
  std::string note;                           ///< notes/…md
  DType dtype = DType::fp32;                  ///< the type it computes in (16-bit steps: the default)
  /// The versions of the step's kernels that its note's table measures ("v3: …"; the
  /// text before ':' names the row), for fa_bench --versions. Empty for most steps.
  std::vector<const GpuForward*> forward_versions = {};
  std::vector<const GpuBackward*> backward_versions = {};
  /// The CPU model with a watch on one query row (flashattn trace) and, for step 09, R
  /// simulated ranks (0: the most of 4, 2, 1 that divide N into 2R chunks). Steps 03, 04,
  /// 08 and 09; `model` is this with no trace.
  std::function<ModelForward(const Problem&, const Qkv&, online::Trace*, int ranks)> model_traced = {};
  /// How the kernel runs when it is not `forward` on one GPU (step 09: ring09, one process a GPU).
  std::string kernel_elsewhere = {};
};

namespace step08 {
struct SplitPlan;
}
/// Step 08's plan on the H200, which its model and traffic take (the kernel: its GPU's).
step08::SplitPlan h200_plan(const Problem& p);

/// Every step this build has: the reference always; the GPU steps with CUDA.
const std::vector<StepEntry>& step_table();
/// The step named `id` ("3", "03" and "step03" all name step 03); throws fa::Error.
const StepEntry& find_step(const std::string& id);
/// The versions of step s's note table as rows of their own: s's row with the version's
/// kernel as its only GPU kernel, and the id "07h1" (s's id and the version's name up to
/// ':'), as fa_bench --versions and ab.py name them.
std::vector<StepEntry> version_rows(const StepEntry& s);
/// A step ("07", as find_step) or one of its versions ("07s1"); throws fa::Error.
StepEntry find_kernels(const std::string& id);

}  // namespace fa
