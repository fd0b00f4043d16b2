// Step 09's model with a watch on one query row (flashattn trace --step 09): the row's
// (O, L) on the rank that holds it after each local call of each ring step, as the
// blocks of the other ranks arrive and are merged in.
#pragma once

#include "steps/03_online_softmax/trace.hpp"
#include "steps/09_ring/step09.hpp"

namespace fa::step09 {

/// model_forward(p, in, ranks), reporting row trace->row of the first head to `trace`
/// (null: off). A merge's row: m = the merged L, ℓ = 1 (O is normalised), rescale = the
/// old part's weight.
RingForward model_forward(const Problem& p, const Qkv& in, int ranks, online::Trace* trace);

}  // namespace fa::step09
