// The online-softmax update (lecture p21–24), one copy for the CPU model and the
// kernel, and the rule that merges two partial states (below). For one query row,
// after a new block of scores s_j:
//
//   m_new = max(m, max_j s_j)
//   ℓ_new = e^(m − m_new)·ℓ + Σ_j e^(s_j − m_new)
//   O_new = e^(m − m_new)·O + Σ_j e^(s_j − m_new)·v_j
//
// and at the end O / ℓ and L = m + log ℓ. Masked scores are −∞.
#pragma once

#include <cmath>

#include "common/hd.hpp"

namespace fa::online {

/// e^(m_old − m_new): how much the old ℓ and O shrink. Before the first block
/// (m_old = −∞, ℓ = 0, O = 0) it is 0 — written out so −∞ − (−∞) never makes NaN.
/// When the block brings no new max it is exactly 1 (the lecture's degenerate case).
FA_HD float rescale(float m_old, float m_new) {
  // exercise 03-rescale: the factor e^(m_old - m_new) that moves the old sums to the new maximum, 0 before the first block (m_old = -inf), without computing -inf - (-inf)
  // stub: (void)m_old, (void)m_new;
  // stub: return 1.0f;
  return m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
  // end exercise
}

/// e^(s − m_new), the unnormalised probability; 0 for a masked score.
FA_HD float prob(float s, float m_new) { return s == -INFINITY ? 0.0f : expf(s - m_new); }

/// L = m + log ℓ, what the backward needs to rebuild P = e^(S − L).
FA_HD float lse(float m, float l) { return m + logf(l); }

// The merge rule (lecture p22–24). Two partial states of one row over disjoint key
// ranges, (m₁, ℓ₁, O₁) and (m₂, ℓ₂, O₂) — each ℓ and O taken relative to its own m —
// are one state over both ranges:
//
//   m = max(m₁, m₂),  ℓ = e^(m₁ − m)·ℓ₁ + e^(m₂ − m)·ℓ₂,  O = e^(m₁ − m)·O₁ + e^(m₂ − m)·O₂
//
// The online update above is the special case where part 2 is one block whose
// probabilities were taken against m_new already (its weight is 1). An empty part (no
// key, or all masked: m = −∞, ℓ = 0, O = 0) has weight 0, so merging it changes
// nothing, exactly. The merge is commutative bit for bit and associative up to fp32
// rounding of the weighted sums.

/// The common reference of two parts and each part's weight against it.
struct MergeWeights {
  float m, w1, w2;
};
FA_HD MergeWeights merge_weights(float m1, float m2) {
  const float m = fmaxf(m1, m2);
  return {m, rescale(m1, m), rescale(m2, m)};
}

/// Merges partial state 2 into state 1; O has d elements.
FA_HD void merge(float& m1, float& l1, float* o1, float m2, float l2, const float* o2, int d) {
  // exercise 03-merge: the merge rule — both parts' l and O weighted to the common maximum (merge_weights), then m1 = that maximum
  // stub: (void)m1, (void)l1, (void)o1, (void)m2, (void)l2, (void)o2, (void)d;
  const MergeWeights w = merge_weights(m1, m2);
  l1 = w.w1 * l1 + w.w2 * l2;
  for (int c = 0; c < d; ++c) o1[c] = w.w1 * o1[c] + w.w2 * o2[c];
  m1 = w.m;
  // end exercise
}

}  // namespace fa::online
