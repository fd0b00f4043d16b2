// CPU model of step 04: step 03's block update with the loops swapped and
// (m_i, ℓ_i, O_i) kept in counted HBM between K/V blocks.
#include <algorithm>

#include "steps/03_online_softmax/block_update_model.hpp"
#include "steps/04_kv_outer/step04.hpp"

namespace fa::step04 {

using namespace tiles;

int default_group(const Problem& p, int sms) {
  const int Tr = q_blocks(p.N);
  const long long want = 2LL * std::max(sms, 1);  // thread blocks to keep the GPU busy
  const long long groups_per_head = std::max(1LL, (want + (long long)p.heads() - 1) / (long long)p.heads());
  return int(std::max(1LL, (Tr + groups_per_head - 1) / groups_per_head));
}

ModelForward model_forward(const Problem& p, const Qkv& in, int G, Tiles tl, online::Trace* trace) {
  p.validate_self_attention("step04 model");
  if (G < 1) throw Error("step04: the group size must be at least 1");
  ModelForward r;
  Traffic& t = r.traffic;
  Hbm Q(in.q, t), K(in.k, t), V(in.v, t), O(p.elems(), t), L(p.rows(), t);
  Hbm M(p.rows(), t), Ell(p.rows(), t);  // the workspace: m_i and ℓ_i between K/V blocks
  const int N = p.N, d = p.d, br = tl.br, bc = tl.bc, Tr = q_blocks(N, br);
  step03::ModelOptions opt;
  opt.tiles = tl;
  for (std::size_t bh = 0; bh < p.heads(); ++bh) {
    const std::size_t head = bh * N * d;
    opt.trace = bh == 0 ? trace : nullptr;  // the trace watches a row of the first head
    for (int i_begin = 0; i_begin < Tr; i_begin += G) {  // one thread block per group
      const int i_end = std::min(Tr, i_begin + G);
      OnChip chip(forward_on_chip(d, tl) + 2 * std::size_t(br));
      auto Qi = chip.tile(std::size_t(br) * d, "Q_i"), Kj = chip.tile(std::size_t(bc) * d, "K_j");
      auto Vj = chip.tile(std::size_t(bc) * d, "V_j"), S = chip.tile(std::size_t(br) * bc, "S_ij");
      auto acc = chip.tile(std::size_t(br) * d, "O_i");
      chip.tile(2 * std::size_t(br), "m_i, l_i");
      for (int j = 0; j <= last_kv_block(N, p.causal, i_end - 1, br, bc); ++j) {
        const int k0 = j * bc, kv = valid_rows(N, j, bc);
        load_tile(Kj, K, head + std::size_t(k0) * d, bc, kv, d);
        load_tile(Vj, V, head + std::size_t(k0) * d, bc, kv, d);
        for (int i = i_begin; i < i_end; ++i) {
          if (j > last_kv_block(N, p.causal, i, br, bc)) continue;  // above the diagonal: skipped
          const int q0 = i * br, rows = valid_rows(N, i, br);
          load_tile(Qi, Q, head + std::size_t(q0) * d, br, rows, d);
          step03::ModelStats st(br);
          std::fill(acc.begin(), acc.end(), 0.0f);
          // exercise 04-kv-outer: from the second K/V block on, query block i's state comes back from device memory: m_i (M), l_i (Ell) per row, and O_i (O)
          // stub: (void)M, (void)Ell;
          if (j > 0)  // (m_i, ℓ_i, O_i) come back from device memory
            for (int rr = 0; rr < rows; ++rr) {
              const std::size_t row = bh * N + q0 + rr;
              st.m[rr] = M.load(row), st.l[rr] = Ell.load(row);
              for (int c = 0; c < d; ++c) acc[rr * d + c] = O.load(head + std::size_t(q0 + rr) * d + c);
            }
          // end exercise
          step03::model_update_block(acc, st, Qi, Kj, Vj, S, q0, k0, kv, p, opt);
          const bool last = j == last_kv_block(N, p.causal, i, br, bc);
          for (int rr = 0; rr < rows; ++rr) {
            const std::size_t row = bh * N + q0 + rr;
            for (int c = 0; c < d; ++c)
              O.store(head + std::size_t(q0 + rr) * d + c, last ? acc[rr * d + c] / st.l[rr] : acc[rr * d + c]);
            if (last) {
              L.store(row, online::lse(st.m[rr], st.l[rr]));
            } else {
              M.store(row, st.m[rr]);
              Ell.store(row, st.l[rr]);
            }
          }
        }
      }
    }
  }
  r.out = {O.take(), L.take()};
  return r;
}

Traffic traffic_forward(const Problem& p, int G, Tiles t) {
  const int N = p.N, d = p.d, Tr = q_blocks(N, t.br);
  std::uint64_t rd = 0, wr = 0;
  for (int i_begin = 0; i_begin < Tr; i_begin += G) {  // K_j, V_j once per group
    const int j_end = last_kv_block(N, p.causal, std::min(Tr, i_begin + G) - 1, t.br, t.bc);
    rd += 2ull * d * std::min(N, (j_end + 1) * t.bc);
  }
  for (int i = 0; i < Tr; ++i) {
    const std::uint64_t rows = valid_rows(N, i, t.br), visits = last_kv_block(N, p.causal, i, t.br, t.bc) + 1;
    rd += rows * d * visits               // Q_i at every visit
          + rows * (d + 2) * (visits - 1);  // O_i, m_i, ℓ_i at every visit but the first
    wr += rows * (d + 2) * (visits - 1)   // O_i, m_i, ℓ_i after every visit but the last
          + rows * (d + 1);                 // O_i and L_i after the last
  }
  return {p.heads() * rd, p.heads() * wr};
}

}  // namespace fa::step04
