// Step 03's block update in the CPU model, shared with step 04's model: the same
// phases as block_update.cuh, over on-chip vectors.
#pragma once

#include <vector>

#include "steps/02_fused/tile_model.hpp"
#include "steps/03_online_softmax/online_softmax.hpp"
#include "steps/03_online_softmax/step03.hpp"

namespace fa::step03 {

/// Running statistics of a query block's rows.
struct ModelStats {
  explicit ModelStats(int rows = tiles::kBr) : m(std::size_t(rows), -INFINITY), l(std::size_t(rows), 0.0f) {}
  std::vector<float> m, l;
};

inline void model_update_block(std::vector<float>& acc, ModelStats& st, const std::vector<float>& Qi,
                               const std::vector<float>& Kj, const std::vector<float>& Vj, std::vector<float>& S,
                               int q0, int k0, int kv, const Problem& p, ModelOptions opt) {
  using namespace tiles;
  const int d = p.d, br = opt.tiles.br, bc = opt.tiles.bc;
  const float kMasked = opt.softmax ? -INFINITY : 0.0f;
  float traced_alpha = 1.0f;  // the watched row's rescale factor (flashattn trace)
  scores(S, Qi, Kj, d, p.softmax_scale(), [&](int r, int c, float s) {
    const bool masked = c >= kv || (p.causal && k0 + c > q0 + r);
    return masked ? kMasked : s;
  }, opt.tiles);
  if (opt.softmax) {
    for (int r = 0; r < br; ++r) {
      float mx = -INFINITY, sum = 0.0f;
      for (int c = 0; c < bc; ++c) mx = std::fmax(mx, S[r * bc + c]);
      const float m_new = std::fmax(st.m[r], mx);
      for (int c = 0; c < bc; ++c) sum += (S[r * bc + c] = online::prob(S[r * bc + c], m_new));
      const float alpha = online::rescale(st.m[r], m_new);
      st.l[r] = (opt.forget == Forget::o_and_l ? 1.0f : alpha) * st.l[r] + sum;
      st.m[r] = m_new;
      if (opt.forget == Forget::nothing)
        for (int c = 0; c < d; ++c) acc[r * d + c] *= alpha;
      if (opt.trace && std::size_t(q0 + r) == opt.trace->row) traced_alpha = alpha;
    }
  }
  accumulate(acc, S, Vj, d, opt.tiles);
  if (opt.trace && opt.trace->row >= std::size_t(q0) && opt.trace->row < std::size_t(q0 + br)) {
    const int r = int(opt.trace->row) - q0;
    opt.trace->add("K/V block " + std::to_string(k0 / bc), k0, k0 + kv, st.m[r], opt.softmax ? st.l[r] : 1.0f, traced_alpha, &acc[r * d], d);
  }
}

}  // namespace fa::step03
