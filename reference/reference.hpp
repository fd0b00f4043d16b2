// The CPU reference every step is checked against: exact attention with Eigen,
// accumulating in double. Slow, obvious, and correct.
//
//   S = scale·Q·Kᵀ            (causal: S_ij = −∞ for j > i; with N_kv keys for N queries,
//                              the queries are the last N positions: j > i + N_kv − N;
//                              a window (left, right): also j < t − left or j > t + right,
//                              t = i + N_kv − N the query's position)
//   P = softmax(S) row-wise,  L_i = m_i + log ℓ_i = log Σ_j exp(S_ij)
//   O = P·V
// Backward, with dO given and D_i = Σ_c dO_ic·O_ic:
//   dV = Pᵀ·dO,  dP = dO·Vᵀ,  dS = P∘(dP − D),  dQ = scale·dS·K,  dK = scale·dSᵀ·Q
// With grouped-query attention (H_kv < H) query head h reads K/V head h / (H/H_kv), and a
// K/V head's dK, dV are the sums over the query heads of its group.
// See notes/00_reference.md for the derivation.
#pragma once

#include <vector>

#include "common/problem.hpp"

namespace fa::reference {

/// Forward: O [B,H,N,d] and L [B,H,N], rounded to float at the end. Q is [B,H,N,d], K and V
/// [B,H_kv,N_kv,d] (p.kv_heads_per_batch() heads of p.keys() rows).
ForwardOut forward(const Problem& p, const Qkv& in);

/// The simplified attention without softmax that step 02 computes: O = (scale·QKᵀ)V
/// (causal masks S_ij = 0 for j > i).
std::vector<float> forward_nosoftmax(const Problem& p, const Qkv& in);

/// Backward from Q, K, V and dO (O and P recomputed in double).
Grads backward(const Problem& p, const Qkv& in, const std::vector<float>& dout);

/// The same in double throughout, for finite-difference checks.
struct QkvD {
  std::vector<double> q, k, v;
};
struct ForwardD {
  std::vector<double> o, lse;
};
struct GradsD {
  std::vector<double> dq, dk, dv;
};
ForwardD forward_d(const Problem& p, const QkvD& in);
GradsD backward_d(const Problem& p, const QkvD& in, const std::vector<double>& dout);

}  // namespace fa::reference
