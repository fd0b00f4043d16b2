// Step 03 — online-softmax tiling: exact softmax attention, nothing N×N in memory.
//
// Adds over step 02: the softmax (lecture p21–24). Each thread block still owns
// B_r query rows and walks the K/V blocks, but now keeps, per row, the running
// max m and sum ℓ beside the unnormalised output O, and rescales O by e^(m − m_new)
// whenever a block raises the max. Only O / ℓ and L = m + log ℓ are written.
// Causal blocks wholly above the diagonal are skipped, not masked.
// Leaves for step 04: the loop order (here Q outer, K/V inner).
// Limits: d <= 256. Note: notes/03_online_softmax.md.
#pragma once

#include "common/hbm.hpp"
#include "common/step_api.hpp"
#include "steps/02_fused/tile.hpp"
#include "steps/03_online_softmax/trace.hpp"

namespace fa::step03 {

/// The forgotten-rescale bug, for the tests: which of the running sums are left
/// unscaled when a block raises the max.
enum class Forget {
  nothing,   ///< the correct update
  o,         ///< the lecture's bug: O keeps its old scale, ℓ is rescaled
  o_and_l,   ///< both keep it: each block's weights relative to the max of its time
};

struct ModelOptions {
  bool softmax = true;              ///< false: step 02's arithmetic (the compile-time switch of the kernel)
  Forget forget = Forget::nothing;  ///< the classic bug, in either form
  tiles::Tiles tiles = {};          ///< the kernel's 32 × 32 blocks, or tiles::tiles_for an on-chip budget
  online::Trace* trace = nullptr;   ///< flashattn trace: a row of the first head, watched block by block
};

ModelForward model_forward(const Problem& p, const Qkv& in, ModelOptions opt = {});
Traffic traffic_forward(const Problem& p, tiles::Tiles t = {});
/// Device memory the forward holds at once, in elements (lecture p33–34): Θ(Nd), nothing N×N.
std::uint64_t memory_forward(const Problem& p);

extern const GpuForward kForward;           ///< softmax attention: O and L
extern const GpuForward kForwardNoSoftmax;  ///< the same kernel with the softmax compiled out

}  // namespace fa::step03
