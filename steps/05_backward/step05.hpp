// Step 05 — backward by recomputation: P rebuilt on chip from Q, K, V, O and L.
// Adds over steps 03–04: the backward without an N×N array ("trade arithmetic for
// memory"). Per (i, j): P_ij = exp(scale·Q_i·K_jᵀ − L_i), dS_ij = P_ij∘(dO_i·V_jᵀ − D_i),
// then dV_j += P_ijᵀ·dO_i, dK_j += scale·dS_ijᵀ·Q_i, dQ_i += scale·dS_ij·K_j. Kernels: D,
// dK/dV (K/V outer), dQ (Q outer: one writer an element, deterministic, P recomputed).
// Leaves for step 06: tensor cores. Limits: d <= 256. Note: notes/05_backward.md.
#pragma once

#include <vector>

#include "common/hbm.hpp"
#include "common/step_api.hpp"

namespace fa::step05 {

ModelBackward model_backward(const Problem& p, const Qkv& in, const ForwardOut& fwd, const std::vector<float>& dout);
Traffic traffic_backward(const Problem& p);
/// Extra device memory beside the inputs and outputs: D = rowsum(dO∘O), one float per
/// row — Θ(N) per head, where step 01's backward keeps P, dP and dS (Θ(N²)).
std::size_t workspace_bytes(const Problem& p);

extern const GpuBackward kBackward;

}  // namespace fa::step05
