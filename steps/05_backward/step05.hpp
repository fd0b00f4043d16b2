// Step 05 — backward by recomputation: P rebuilt on chip from Q, K, V, O and L.
//
// Adds over steps 03–04: the backward pass without any N×N array (lecture: "trade
// arithmetic for memory"). For every (Q block i, K/V block j) pair the tiles
//   P_ij  = exp(scale·Q_i·K_jᵀ − L_i)         (the saved log-sum-exp gives P directly)
//   dP_ij = dO_i·V_jᵀ,   dS_ij = P_ij∘(dP_ij − D_i),  D_i = rowsum(dO_i∘O_i)
// are rebuilt in shared memory and consumed at once:
//   dV_j += P_ijᵀ·dO_i,  dK_j += scale·dS_ijᵀ·Q_i,  dQ_i += scale·dS_ij·K_j.
// Three kernels: D (step 01's row dot); dK/dV with K/V outer (a thread block owns
// K_j, V_j and their gradients, as FlashAttention-2 does); dQ with Q outer (a
// thread block owns Q_i and dQ_i). dQ gets its own pass instead of atomics: every
// element has one writer, so the result is deterministic (bit-identical from run
// to run) at the cost of recomputing P and dS once more.
// Extra device memory: D, B·H·N floats — Θ(N), against step 01's 2·B·H·N².
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
