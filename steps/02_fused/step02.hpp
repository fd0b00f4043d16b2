// Step 02 — fusion without softmax: O = (scale·Q·Kᵀ)·V in one kernel.
// Adds over step 01: fusion (lecture p10–20). A block owns B_r query rows, walks the K/V
// blocks through shared memory and adds S_ij·V_j, S_ij = scale·Q_i·K_jᵀ made on chip, into
// O in registers: S never reaches device memory. Leaves for step 03: the softmax, whose
// normaliser needs a whole row. Limits: d <= 256. Note: notes/02_fused.md.
#pragma once

#include "common/hbm.hpp"
#include "common/step_api.hpp"
#include "steps/02_fused/tile.hpp"

namespace fa::step02 {

/// CPU model: the kernel's block loops over counted HBM arrays (O in out.o), with the
/// kernel's 32 × 32 blocks or others (tiles::tiles_for an on-chip budget M).
ModelForward model_forward(const Problem& p, const Qkv& in, tiles::Tiles t = {});
/// The note's closed-form traffic (elements).
Traffic traffic_forward(const Problem& p, tiles::Tiles t = {});

extern const GpuForward kForward;  ///< O = (scale·QKᵀ)V, fused

}  // namespace fa::step02
