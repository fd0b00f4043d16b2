// CPU model of step 05: the three kernels' loops over counted HBM arrays.
#include "steps/02_fused/tile_model.hpp"
#include "steps/05_backward/recompute.hpp"
#include "steps/05_backward/step05.hpp"

namespace fa::step05 {

using namespace tiles;

namespace {
/// P and dS tiles of the pair (i, j) from on-chip Q_i, dO_i, K_j, V_j, L_i, D_i.
void model_recompute(std::vector<float>& P, std::vector<float>& dS, const std::vector<float>& Qi,
                     const std::vector<float>& dOi, const std::vector<float>& Kj, const std::vector<float>& Vj,
                     const std::vector<float>& Li, const std::vector<float>& Di, int q0, int qv, int k0, int kv,
                     const Problem& p) {
  scores(P, Qi, Kj, p.d, p.softmax_scale(), [&](int r, int c, float s) {
    const bool masked = c >= kv || r >= qv || (p.causal && k0 + c > q0 + r);
    return masked ? -INFINITY : s;
  });
  scores(dS, dOi, Vj, p.d, 1.0f, [](int, int, float s) { return s; });  // dP
  for (int r = 0; r < kBr; ++r)
    for (int c = 0; c < kBc; ++c) {
      const PdS x = rebuild(P[r * kBc + c], dS[r * kBc + c], Li[r], Di[r]);
      P[r * kBc + c] = x.p, dS[r * kBc + c] = x.ds;
    }
}
void load_rows(std::vector<float>& dst, const Hbm& src, std::size_t base, int valid) {
  for (int r = 0; r < kBr; ++r) dst[r] = r < valid ? src.load(base + r) : 0.0f;
}
}  // namespace

ModelBackward model_backward(const Problem& p, const Qkv& in, const ForwardOut& fwd, const std::vector<float>& dout) {
  p.validate_self_attention("step05 model");
  ModelBackward res;
  Traffic& t = res.traffic;
  Hbm Q(in.q, t), K(in.k, t), V(in.v, t), O(fwd.o, t), L(fwd.lse, t), dO(dout, t);
  Hbm dQ(p.elems(), t), dK(p.elems(), t), dV(p.elems(), t);
  Hbm D(workspace_bytes(p) / sizeof(float), t);  // the one array beyond inputs and outputs: the workspace
  const int N = p.N, d = p.d;
  const float scale = p.softmax_scale();
  const std::size_t on_chip = 4 * std::size_t(kBr) * d + 2 * kBr * kBc + 2 * kBr + 2 * std::size_t(kBc) * d;

  // Kernel 1: D_i = Σ_c dO_ic·O_ic.
  for (std::size_t row = 0; row < p.rows(); ++row) {
    float s = 0;
    for (int c = 0; c < d; ++c) s += dO.load(row * d + c) * O.load(row * d + c);
    D.store(row, s);
  }
  for (std::size_t bh = 0; bh < p.heads(); ++bh) {
    const std::size_t head = bh * N * d, head_rows = bh * N;
    // Kernel 2: dK_j, dV_j; K/V block outer, query blocks inner.
    for (int j = 0; j < kv_blocks(N); ++j) {
      OnChip chip(on_chip);
      auto Kj = chip.tile(kBc * d, "K_j"), Vj = chip.tile(kBc * d, "V_j"), Qi = chip.tile(kBr * d, "Q_i"),
           dOi = chip.tile(kBr * d, "dO_i"), P = chip.tile(kBr * kBc, "P_ij"), dS = chip.tile(kBr * kBc, "dS_ij"),
           Li = chip.tile(kBr, "L_i"), Di = chip.tile(kBr, "D_i"), dKj = chip.tile(kBc * d, "dK_j"),
           dVj = chip.tile(kBc * d, "dV_j");
      const int k0 = j * kBc, kv = valid_rows(N, j, kBc);
      load_tile(Kj, K, head + std::size_t(k0) * d, kBc, kv, d);
      load_tile(Vj, V, head + std::size_t(k0) * d, kBc, kv, d);
      for (int i = first_q_block(p.causal, j); i < q_blocks(N); ++i) {
        const int q0 = i * kBr, qv = valid_rows(N, i, kBr);
        load_tile(Qi, Q, head + std::size_t(q0) * d, kBr, qv, d);
        load_tile(dOi, dO, head + std::size_t(q0) * d, kBr, qv, d);
        load_rows(Li, L, head_rows + q0, qv);
        load_rows(Di, D, head_rows + q0, qv);
        model_recompute(P, dS, Qi, dOi, Kj, Vj, Li, Di, q0, qv, k0, kv, p);
        accumulate<true>(dVj, P, dOi, d);
        accumulate<true>(dKj, dS, Qi, d);
      }
      for (int r = 0; r < kv; ++r)
        for (int c = 0; c < d; ++c) {
          dK.store(head + std::size_t(k0 + r) * d + c, scale * dKj[r * d + c]);
          dV.store(head + std::size_t(k0 + r) * d + c, dVj[r * d + c]);
        }
    }
    // Kernel 3: dQ_i; query block outer, K/V blocks inner.
    for (int i = 0; i < q_blocks(N); ++i) {
      OnChip chip(on_chip);
      auto Qi = chip.tile(kBr * d, "Q_i"), dOi = chip.tile(kBr * d, "dO_i"), Kj = chip.tile(kBc * d, "K_j"),
           Vj = chip.tile(kBc * d, "V_j"), P = chip.tile(kBr * kBc, "P_ij"), dS = chip.tile(kBr * kBc, "dS_ij"),
           Li = chip.tile(kBr, "L_i"), Di = chip.tile(kBr, "D_i"), dQi = chip.tile(kBr * d, "dQ_i");
      const int q0 = i * kBr, qv = valid_rows(N, i, kBr);
      load_tile(Qi, Q, head + std::size_t(q0) * d, kBr, qv, d);
      load_tile(dOi, dO, head + std::size_t(q0) * d, kBr, qv, d);
      load_rows(Li, L, head_rows + q0, qv);
      load_rows(Di, D, head_rows + q0, qv);
      for (int j = 0; j <= last_kv_block(N, p.causal, i); ++j) {
        const int k0 = j * kBc, kv = valid_rows(N, j, kBc);
        load_tile(Kj, K, head + std::size_t(k0) * d, kBc, kv, d);
        load_tile(Vj, V, head + std::size_t(k0) * d, kBc, kv, d);
        model_recompute(P, dS, Qi, dOi, Kj, Vj, Li, Di, q0, qv, k0, kv, p);
        accumulate(dQi, dS, Kj, d);
      }
      for (int r = 0; r < qv; ++r)
        for (int c = 0; c < d; ++c) dQ.store(head + std::size_t(q0 + r) * d + c, scale * dQi[r * d + c]);
    }
  }
  res.grads = {dQ.take(), dK.take(), dV.take()};
  return res;
}

Traffic traffic_backward(const Problem& p) {
  const std::uint64_t N = p.N, d = p.d;
  Traffic t;
  // D: read dO and O, write D.
  t.read = 2 * N * d;
  t.written = N;
  // dK/dV: K_j, V_j once; Q_i, dO_i, L_i, D_i at every visit; dK, dV written once.
  t.read += 2 * N * d + q_rows_visited(p) * (2 * d + 2);
  t.written += 2 * N * d;
  // dQ: Q_i, dO_i, L_i, D_i once; K_j, V_j at every visit; dQ written once.
  t.read += 2 * N * d + 2 * N + kv_rows_visited(p) * 2 * d;
  t.written += N * d;
  return {t.read * p.heads(), t.written * p.heads()};
}

std::size_t workspace_bytes(const Problem& p) { return p.rows() * sizeof(float); }

}  // namespace fa::step05
