// CPU model of step 07's forward: the algorithm is step 06's, so is the model
// (model_forward_tiled); only the blocks are step 07's.
#include "steps/06_tensor_cores/step06.hpp"
#include "steps/07_hopper/step07.hpp"

namespace fa::step07 {

void require_supported(const Problem& p) { step06::require_lowp(p, "step07", kSupportedD); }

ModelForward model_forward(const Problem& p, const Qkv& in) {
  require_supported(p);
  return step06::model_forward_tiled(p, in, forward_tile(p.d).rows(), forward_tile(p.d).keys);
}

Traffic traffic_forward(const Problem& p) { return step06::traffic_forward_tiled(p, forward_tile(p.d).rows(), forward_tile(p.d).keys); }

}  // namespace fa::step07
