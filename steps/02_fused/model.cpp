// CPU model of step 02: kernels.cu's loops over counted HBM arrays.
#include "steps/02_fused/step02.hpp"
#include "steps/02_fused/tile_model.hpp"

namespace fa::step02 {

using namespace tiles;

ModelForward model_forward(const Problem& p, const Qkv& in, Tiles t) {
  p.validate_self_attention("step02 model");
  ModelForward r;
  Hbm Q(in.q, r.traffic), K(in.k, r.traffic), V(in.v, r.traffic), O(p.elems(), r.traffic);
  const int N = p.N, d = p.d, br = t.br, bc = t.bc;
  for (std::size_t bh = 0; bh < p.heads(); ++bh) {
    const std::size_t head = bh * N * d;
    for (int i = 0; i < q_blocks(N, br); ++i) {  // one thread block per (i, head)
      OnChip chip(forward_on_chip(d, t));
      auto Qi = chip.tile(std::size_t(br) * d, "Q_i"), Kj = chip.tile(std::size_t(bc) * d, "K_j");
      auto Vj = chip.tile(std::size_t(bc) * d, "V_j"), S = chip.tile(std::size_t(br) * bc, "S_ij");
      auto acc = chip.tile(std::size_t(br) * d, "O_i");
      const int q0 = i * br;
      load_tile(Qi, Q, head + std::size_t(q0) * d, br, valid_rows(N, i, br), d);
      for (int j = 0; j <= last_kv_block(N, p.causal, i, br, bc); ++j) {
        const int k0 = j * bc, kv = valid_rows(N, j, bc);
        load_tile(Kj, K, head + std::size_t(k0) * d, bc, kv, d);
        load_tile(Vj, V, head + std::size_t(k0) * d, bc, kv, d);
        scores(S, Qi, Kj, d, p.softmax_scale(), [&](int rr, int c, float s) {
          const bool masked = c >= kv || (p.causal && k0 + c > q0 + rr);
          return masked ? 0.0f : s;
        }, t);
        accumulate(acc, S, Vj, d, t);
      }
      for (int rr = 0; rr < valid_rows(N, i, br); ++rr)
        for (int c = 0; c < d; ++c) O.store(head + std::size_t(q0 + rr) * d + c, acc[rr * d + c]);
    }
  }
  r.out.o = O.take();
  return r;
}

Traffic traffic_forward(const Problem& p, Tiles t) {
  // Per head: Q read once (N·d), K and V once per query block that needs them,
  // O written once.
  const std::uint64_t Nd = std::uint64_t(p.N) * p.d;
  // exercise 02-hbm: the fused forward's traffic, all heads (lecture p12–20): Q read once, K and V once for each query block that visits them (kv_rows_visited rows, d wide), O written once — no N×N term
  // stub: (void)Nd, (void)t;
  // stub: return {};
  return {p.heads() * (Nd + 2 * kv_rows_visited(p, t.br, t.bc) * p.d), p.heads() * Nd};
  // end exercise
}

}  // namespace fa::step02
