// Step 04 — K/V outer: the paper's Algorithm 1 loop order.
// Adds over step 03: the loop order (lecture p25–32). A block loads K_j, V_j once and lets
// each of its G query blocks update (m_i, ℓ_i, O_i), which live in device memory between
// K/V blocks. A block owns its group for every j, so each O_i has one writer and step 03's
// updates in step 03's order: bit-equal to it (a grid over j would race on O_i). G = T_r is
// Algorithm 1 verbatim. Leaves for step 05: the backward. Limits: d <= 256.
// Note: notes/04_kv_outer.md.
#pragma once

#include "common/hbm.hpp"
#include "common/step_api.hpp"
#include "steps/02_fused/tile.hpp"
#include "steps/03_online_softmax/trace.hpp"

namespace fa::step04 {

/// Query blocks a thread block: about two blocks an SM of `sms`, at most T_r.
int default_group(const Problem& p, int sms);

/// CPU model with groups of `group` query blocks, with the kernel's 32 × 32 blocks or
/// others (tiles::tiles_for an on-chip budget M); `trace` watches a row of the first head.
ModelForward model_forward(const Problem& p, const Qkv& in, int group, tiles::Tiles t = {},
                           online::Trace* trace = nullptr);
Traffic traffic_forward(const Problem& p, int group, tiles::Tiles t = {});

extern const GpuForward kForward;            ///< default group size
extern const GpuForward kForwardAlgorithm1;  ///< G = T_r: one thread block per head, the paper's loop

}  // namespace fa::step04
