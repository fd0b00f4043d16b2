// CPU model of step 07's forward: the algorithm is step 06's, so is the model
// (model_forward_tiled); only the blocks are step 07's.
#include "steps/06_tensor_cores/step06.hpp"
#include "steps/07_hopper/step07.hpp"

namespace fa::step07 {

void require_supported(const Problem& p) {
  step06::require_lowp(p, "step07", kSupportedD, Problem::kGroups | Problem::kWindow);
}

ModelForward model_forward(const Problem& p, const Qkv& in) {
  require_supported(p);
  const FwdShape b = forward_shape(p.d, p.N, p.causal);
  return step06::model_forward_tiled(p, in, b.rows, b.keys);
}

Traffic traffic_forward(const Problem& p) {
  const FwdShape b = forward_shape(p.d, p.N, p.causal);
  return step06::traffic_forward_tiled(p, b.rows, b.keys);
}

}  // namespace fa::step07

namespace fa::step07 {

// The backward's blocks own step 06's keys (128 at d ≤ 128, 64 at d = 256) and walk 96
// queries a step at d = 64, 80 at d = 128 and 64 at d = 256; its rounding points are step 06's:
// its model is step 06's, with those blocks. What differs is where dQ's partial sums go
// (TMA bulk reductions instead of atomics: the same fp32 additions, in another order), and
// at d = 256 which warpgroup computes which columns.
static_assert(backward_keys(64) == step06::backward_keys(64) && backward_keys(128) == step06::backward_keys(128) &&
                  backward_keys(256) == step06::backward_keys(256),
              "step 07's backward blocks own step 06's keys");

ModelBackward model_backward(const Problem& p, const Qkv& in, const ForwardOut& fwd, const std::vector<float>& dout) {
  step06::require_lowp(p, "step07 backward", kBackwardD, Problem::kGroups | Problem::kWindow);
  return step06::model_backward_tiled(p, in, fwd, dout, backward_keys(p.d), backward_queries(p.d));
}

Traffic traffic_backward(const Problem& p) {
  return step06::traffic_backward_tiled(p, backward_keys(p.d), backward_queries(p.d));
}

}  // namespace fa::step07
