// Step 03's block update on the GPU, shared with step 04: given Q_i, K_j, V_j in
// shared memory, update this thread's rows of (m, ℓ, O). The caller loads the tiles
// and syncs before; the update ends with the thread's accumulator updated.
#pragma once

#include "common/reduce.cuh"
#include "steps/02_fused/tile.cuh"
#include "steps/03_online_softmax/online_softmax.hpp"

namespace fa::step03 {

using namespace tiles;

/// Per-thread running statistics of its kRowsPerWarp rows (replicated across the
/// 32 lanes of the warp that owns the rows).
struct RowStats {
  float m[kRowsPerWarp], l[kRowsPerWarp];
  __device__ void init() {
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k) m[k] = -INFINITY, l[k] = 0.0f;
  }
};

/// One K/V block: S = scale·Q_i·K_jᵀ (masked), then — kSoftmax — the online-softmax
/// update of (m, ℓ) and the rescaling of O, then O += P·V_j. With kSoftmax false
/// this is step 02's update exactly: masked scores are 0 and S is used as is.
template <int kD, bool kSoftmax>
__device__ __forceinline__ void update_block(Acc<kD>& acc, RowStats& st, const ForwardSmem& sm, int q0, int k0,
                                             int kv, int d, bool causal, float scale) {
  constexpr float kMasked = kSoftmax ? -INFINITY : 0.0f;
  scores(sm.S, sm.Qi, sm.Kj, d, scale, [&](int r, int c, float s) {
    const bool masked = c >= kv || (causal && k0 + c > q0 + r);
    return masked ? kMasked : s;
  });
  __syncwarp();
  if constexpr (kSoftmax) {
    // Lane c holds column c of each of the warp's rows: row max and row sum are
    // warp reductions, and the warp rescales exactly the rows of O it owns.
#pragma unroll
    for (int kk = 0; kk < kRowsPerWarp; ++kk) {
      float* row = sm.S + my_row(kk) * (kBc + 1);
      const float s = row[lane_id()];
      const float m_new = fmaxf(st.m[kk], warp_reduce(s, MaxOp{}));
      const float p = online::prob(s, m_new);
      const float alpha = online::rescale(st.m[kk], m_new);
      st.l[kk] = alpha * st.l[kk] + warp_reduce(p, SumOp{});
      st.m[kk] = m_new;
      row[lane_id()] = p;
#pragma unroll
      for (int u = 0; u < kD / 32; ++u) acc.v[kk][u] *= alpha;
    }
    __syncwarp();
  }
  accumulate(acc, sm.S, sm.Vj, d);
}

/// L = m + log ℓ for this warp's rows below `valid` (lane 0 writes).
__device__ __forceinline__ void store_lse(const RowStats& st, float* __restrict__ lse, int valid) {
#pragma unroll
  for (int kk = 0; kk < kRowsPerWarp; ++kk)
    if (my_row(kk) < valid && lane_id() == 0) lse[my_row(kk)] = online::lse(st.m[kk], st.l[kk]);
}

}  // namespace fa::step03
