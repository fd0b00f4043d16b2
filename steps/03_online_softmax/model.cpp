// CPU model of step 03: step 02's model plus the online softmax.
#include "steps/03_online_softmax/block_update_model.hpp"
#include "steps/03_online_softmax/step03.hpp"

namespace fa::step03 {

using namespace tiles;

ModelForward model_forward(const Problem& p, const Qkv& in, ModelOptions opt) {
  p.validate_self_attention("step03 model");
  ModelForward r;
  Hbm Q(in.q, r.traffic), K(in.k, r.traffic), V(in.v, r.traffic), O(p.elems(), r.traffic);
  Hbm L(opt.softmax ? p.rows() : 0, r.traffic);
  const int N = p.N, d = p.d, br = opt.tiles.br, bc = opt.tiles.bc;
  for (std::size_t bh = 0; bh < p.heads(); ++bh) {
    const std::size_t head = bh * N * d;
    ModelOptions here = opt;
    if (bh != 0) here.trace = nullptr;  // the trace watches a row of the first head
    for (int i = 0; i < q_blocks(N, br); ++i) {
      OnChip chip(forward_on_chip(d, opt.tiles) + 2 * std::size_t(br));
      auto Qi = chip.tile(std::size_t(br) * d, "Q_i"), Kj = chip.tile(std::size_t(bc) * d, "K_j");
      auto Vj = chip.tile(std::size_t(bc) * d, "V_j"), S = chip.tile(std::size_t(br) * bc, "S_ij");
      auto acc = chip.tile(std::size_t(br) * d, "O_i");
      chip.tile(2 * std::size_t(br), "m_i, l_i");
      ModelStats st(br);
      const int q0 = i * br, rows = valid_rows(N, i, br);
      load_tile(Qi, Q, head + std::size_t(q0) * d, br, rows, d);
      for (int j = 0; j <= last_kv_block(N, p.causal, i, br, bc); ++j) {
        const int k0 = j * bc, kv = valid_rows(N, j, bc);
        load_tile(Kj, K, head + std::size_t(k0) * d, bc, kv, d);
        load_tile(Vj, V, head + std::size_t(k0) * d, bc, kv, d);
        model_update_block(acc, st, Qi, Kj, Vj, S, q0, k0, kv, p, here);
      }
      for (int rr = 0; rr < rows; ++rr) {
        for (int c = 0; c < d; ++c)
          O.store(head + std::size_t(q0 + rr) * d + c, opt.softmax ? acc[rr * d + c] / st.l[rr] : acc[rr * d + c]);
        if (opt.softmax) L.store(bh * N + q0 + rr, online::lse(st.m[rr], st.l[rr]));
      }
    }
  }
  r.out.o = O.take();
  if (opt.softmax) r.out.lse = L.take();
  return r;
}

Traffic traffic_forward(const Problem& p, Tiles t) {
  // Step 02's traffic plus L: N more writes per head.
  const std::uint64_t Nd = std::uint64_t(p.N) * p.d;
  return {p.heads() * (Nd + 2 * kv_rows_visited(p, t.br, t.bc) * p.d), p.heads() * (Nd + p.N)};
}

std::uint64_t memory_forward(const Problem& p) {
  const std::uint64_t N = p.N, d = p.d;
  // exercise 03-memory: the elements the forward holds in device memory, all heads (lecture p33–34): its inputs Q, K, V, its outputs O and L — and nothing N×N, since S and P stay on chip
  // stub: (void)N, (void)d;
  // stub: return 0;
  return p.heads() * (4 * N * d + N);
  // end exercise
}

}  // namespace fa::step03
