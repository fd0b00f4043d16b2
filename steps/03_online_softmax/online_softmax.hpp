// The online-softmax update (lecture p21–24), one copy for the CPU model and the
// kernel. For one query row, after a new block of scores s_j:
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
FA_HD float rescale(float m_old, float m_new) { return m_old == -INFINITY ? 0.0f : expf(m_old - m_new); }

/// e^(s − m_new), the unnormalised probability; 0 for a masked score.
FA_HD float prob(float s, float m_new) { return s == -INFINITY ? 0.0f : expf(s - m_new); }

/// L = m + log ℓ, what the backward needs to rebuild P = e^(S − L).
FA_HD float lse(float m, float l) { return m + logf(l); }

}  // namespace fa::online
