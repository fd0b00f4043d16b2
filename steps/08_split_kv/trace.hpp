// Step 08's model with a watch on one query row (flashattn trace --step 08): the row's
// state after each tile of each split (its four warps' states merged for the display),
// each split's finished part (O/ℓ, L), and the merge of the parts.
#pragma once

#include "steps/03_online_softmax/trace.hpp"
#include "steps/08_split_kv/step08.hpp"

namespace fa::step08 {

/// model_forward(p, in, s), reporting row trace->row of the first head to `trace` (null: off).
ModelForward model_forward(const Problem& p, const Qkv& in, const SplitPlan& s, online::Trace* trace);

}  // namespace fa::step08
