// Step 04 — K/V outer: the paper's Algorithm 1 loop order.
//
// Adds over step 03: the loop order (lecture p25–32). A thread block loads K_j, V_j
// into shared memory once and lets each of its query blocks Q_i update (m_i, ℓ_i,
// O_i), which now live in device memory between K/V blocks. One K/V block is
// reused by G query blocks; the price is reading and writing (m, ℓ, O) once per
// K/V block.
// Race-free parallelisation: the query blocks are split into groups of G; a thread
// block owns one group for all K/V blocks, so every O_i has exactly one writer and
// its updates happen in order j = 0, 1, … — the same updates in the same order as
// step 03, hence bit-equal results. G = T_r is Algorithm 1 verbatim (one thread
// block per head); the default G keeps about two thread blocks per SM busy.
// (Parallelising over j instead would race on O_i: two blocks read-modify-write it.)
// O holds the unnormalised accumulator between blocks (as FlashAttention-2 does):
// normalising only at the last block keeps step 03's arithmetic exactly.
// Leaves for step 05: the backward. Limits: d <= 256. Note: notes/04_kv_outer.md.
#pragma once

#include "common/hbm.hpp"
#include "common/step_api.hpp"
#include "steps/02_fused/tile.hpp"
#include "steps/03_online_softmax/trace.hpp"

namespace fa::step04 {

/// Query blocks per thread block when the GPU has `sms` multiprocessors: enough
/// groups for ~2 thread blocks per SM, at most T_r per group.
int default_group(const Problem& p, int sms);

/// CPU model with groups of `group` query blocks, with the kernel's 32 × 32 blocks or
/// others (tiles::tiles_for an on-chip budget M); `trace` watches a row of the first head.
ModelForward model_forward(const Problem& p, const Qkv& in, int group, tiles::Tiles t = {},
                           online::Trace* trace = nullptr);
Traffic traffic_forward(const Problem& p, int group, tiles::Tiles t = {});

extern const GpuForward kForward;            ///< default group size
extern const GpuForward kForwardAlgorithm1;  ///< G = T_r: one thread block per head, the paper's loop
/// Workspace: m and ℓ, 2·B·H·N floats.

}  // namespace fa::step04
