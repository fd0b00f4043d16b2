// CPU model of step 07's forward: the algorithm is step 06's, so is the model
// (model_forward_tiled); only the blocks are step 07's.
#include "steps/06_tensor_cores/step06.hpp"
#include "steps/07_hopper/step07.hpp"

namespace fa::step07 {

void require_supported(const Problem& p) {
  p.validate();
  if (p.dtype == DType::fp32) throw Error("step07 computes in bf16 or fp16: set the problem's dtype");
  if (!takes_d(0, kSupportedD, p.d))
    throw Error("step07 supports d = " + d_list(kSupportedD) + " (got d = " + std::to_string(p.d) + ")");
}

ModelForward model_forward(const Problem& p, const Qkv& in) {
  require_supported(p);
  return step06::model_forward_tiled(p, in, forward_tile(p.d).rows(), forward_tile(p.d).keys);
}

Traffic traffic_forward(const Problem& p) { return step06::traffic_forward_tiled(p, forward_tile(p.d).rows(), forward_tile(p.d).keys); }

}  // namespace fa::step07
