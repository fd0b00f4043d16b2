// CPU model of step 06's backward: the three kernels of backward.cu over explicit
// HBM arrays, with the dK/dV kernel's blocks (backward_keys(d) keys × 64 queries) and its
// roundings: inputs and O in 16 bits, Pᵀ and dSᵀ rounded before their products,
// fp32 sums, gradients rounded at the end. The per-block dQ partial sums are added
// into the fp32 accumulator in block order (the kernel's atomics: any order).
#include <algorithm>
#include <cmath>

#include "steps/02_fused/tile.hpp"
#include "steps/06_tensor_cores/step06.hpp"

namespace fa::step06 {

ModelBackward model_backward(const Problem& p, const Qkv& in, const ForwardOut& fwd, const std::vector<float>& dout) {
  require_supported(p);
  return model_backward_tiled(p, in, fwd, dout, backward_keys(p.d), kBwdQueries);
}

ModelBackward model_backward_tiled(const Problem& p, const Qkv& in, const ForwardOut& fwd,
                                   const std::vector<float>& dout, int kK, int kQ) {
  ModelBackward r;
  Traffic& tr = r.traffic;
  const DType t = p.dtype;
  const int N = p.N, d = p.d;
  const float scale = p.softmax_scale();
  Hbm Q(rounded(in.q, t), tr), K(rounded(in.k, t), tr), V(rounded(in.v, t), tr);
  Hbm O(rounded(fwd.o, t), tr), dO(rounded(dout, t), tr), L(fwd.lse, tr);
  Hbm Lsaved(p.rows(), tr), D(p.rows(), tr);  // preprocess's outputs (the kernel keeps L·log2 e)
  Hbm dQacc(p.elems(), tr, 0.0f), dQ(p.elems(), tr), dK(p.kv_elems(), tr), dV(p.kv_elems(), tr);

  // Kernel 0 (a memset): the fp32 accumulator starts at zero.
  for (std::size_t e = 0; e < p.elems(); ++e) dQacc.store(e, 0.0f);
  // Kernel 1: D = rowsum(dO∘O) in fp32.
  for (std::size_t row = 0; row < p.rows(); ++row) {
    float s = 0.0f;
    for (int c = 0; c < d; ++c) s += dO.load(row * d + c) * O.load(row * d + c);
    D.store(row, s);
    Lsaved.store(row, L.load(row));
  }

  // Kernel 2: K/V outer, query blocks inner. With grouped K/V heads (step 07) a K/V head's
  // key block visits the query blocks of every query head of its group, so dK_j and dV_j
  // sum over the group on chip and are written once; a window or the mask skips the query
  // blocks that see none of its keys.
  for (std::size_t kvh = 0; kvh < p.kv_heads(); ++kvh) {
    const std::size_t kv_head = kvh * N * d;
    for (int j = 0; j < tiles::kv_blocks(N, kK); ++j) {
      const int k0 = j * kK, keys = tiles::valid_rows(N, j, kK);
      OnChip chip(std::size_t(6 * kK + 3 * kQ) * d + kK * kQ + 2 * kQ);
      auto Kj = chip.tile(std::size_t(kK) * d, "K_j"), Vj = chip.tile(std::size_t(kK) * d, "V_j");
      auto dKj = chip.tile(std::size_t(kK) * d, "dK_j"), dVj = chip.tile(std::size_t(kK) * d, "dV_j");
      auto Qi = chip.tile(std::size_t(kQ) * d, "Q_i"), dOi = chip.tile(std::size_t(kQ) * d, "dO_i");
      auto dQi = chip.tile(std::size_t(kQ) * d, "dQ_i partial"), dS = chip.tile(kK * kQ, "dS_ij (16-bit)");
      auto Li = chip.tile(kQ, "L_i"), Di = chip.tile(kQ, "D_i");
      chip.tile(std::size_t(2 * kK) * d, "registers of the warps' fragments");  // accounted, not modelled
      for (int kr = 0; kr < keys; ++kr)
        for (int c = 0; c < d; ++c) {
          Kj[kr * d + c] = K.load(kv_head + std::size_t(k0 + kr) * d + c);
          Vj[kr * d + c] = V.load(kv_head + std::size_t(k0 + kr) * d + c);
        }
      const tiles::BlockRange band = tiles::q_block_range(p, j, kQ, kK);
      // exercise 07-group: the query heads that read K/V head kvh — the group() consecutive heads from b·H + (kvh mod H_kv)·group(), b = kvh / H_kv (Problem::kv_head's inverse) — each adding to dK_j and dV_j
      // stub: const std::size_t first_head = kvh, last_head = kvh;
      const std::size_t first_head = kvh / p.kv_heads_per_batch() * p.H + kvh % p.kv_heads_per_batch() * p.group();
      const std::size_t last_head = first_head + p.group() - 1;
      // end exercise
      for (std::size_t bh = first_head; bh <= last_head; ++bh) {
        for (int i = band.first; i <= band.last; ++i) {
          const std::size_t head = bh * N * d, stat = bh * N;
          const int q0 = i * kQ, queries = tiles::valid_rows(N, i, kQ);
          for (int qr = 0; qr < queries; ++qr) {
            for (int c = 0; c < d; ++c) {
              Qi[qr * d + c] = Q.load(head + std::size_t(q0 + qr) * d + c);
              dOi[qr * d + c] = dO.load(head + std::size_t(q0 + qr) * d + c);
            }
            Li[qr] = Lsaved.load(stat + q0 + qr);
            Di[qr] = D.load(stat + q0 + qr);
          }
          for (int kr = 0; kr < keys; ++kr) {
            float dv_part[256] = {}, dk_part[256] = {};  // this block's sums, added to dK_j/dV_j once
            for (int qr = 0; qr < queries; ++qr) {
              float s = 0.0f, dp = 0.0f;
              for (int c = 0; c < d; ++c) s += Kj[kr * d + c] * Qi[qr * d + c], dp += Vj[kr * d + c] * dOi[qr * d + c];
              const bool masked = !p.sees(q0 + qr, k0 + kr);
              const float pr = masked ? 0.0f : std::exp(scale * s - Li[qr]);
              // exercise 06-ds: dS = P∘(dP − D) in fp32, then P and dS rounded to the 16-bit type where the kernel rounds them (round_to)
              // stub: const float p16 = round_to(t, pr), ds16 = round_to(t, pr * dp);
              // stub: (void)Di;
              const float ds = pr * (dp - Di[qr]);
              const float p16 = round_to(t, pr), ds16 = round_to(t, ds);
              // end exercise
              dS[kr * kQ + qr] = ds16;
              for (int c = 0; c < d; ++c) dv_part[c] += p16 * dOi[qr * d + c], dk_part[c] += ds16 * Qi[qr * d + c];
            }
            for (int c = 0; c < d; ++c) dVj[kr * d + c] += dv_part[c], dKj[kr * d + c] += dk_part[c];
          }
          // dQ_i += dS·K_j: the block's partial sum, then one read-modify-write per element.
          for (int qr = 0; qr < queries; ++qr)
            for (int c = 0; c < d; ++c) {
              float a = 0.0f;
              for (int kr = 0; kr < keys; ++kr) a += dS[kr * kQ + qr] * Kj[kr * d + c];
              const std::size_t e = head + std::size_t(q0 + qr) * d + c;
              dQacc.store(e, dQacc.load(e) + a);
            }
        }
      }
      for (int kr = 0; kr < keys; ++kr)
        for (int c = 0; c < d; ++c) {
          dK.store(kv_head + std::size_t(k0 + kr) * d + c, round_to(t, scale * dKj[kr * d + c]));
          dV.store(kv_head + std::size_t(k0 + kr) * d + c, round_to(t, dVj[kr * d + c]));
        }
    }
  }
  // Kernel 3: dQ = scale·accumulator in 16 bits.
  for (std::size_t e = 0; e < p.elems(); ++e) dQ.store(e, round_to(t, scale * dQacc.load(e)));
  r.grads = {dQ.take(), dK.take(), dV.take()};
  return r;
}

Traffic traffic_backward(const Problem& p) { return traffic_backward_tiled(p, backward_keys(p.d), kBwdQueries); }

Traffic traffic_backward_tiled(const Problem& p, int keys, int queries) {
  const std::uint64_t N = p.N, d = p.d, Nd = N * d;
  const std::uint64_t visits = tiles::q_rows_visited(p, queries, keys);  // query rows per K/V block, summed
  Traffic t;
  // Per query head. memset + preprocess: read O, dO, L; write the accumulator's zeros, D, L·log2 e.
  t.read += 2 * Nd + N;
  t.written += Nd + 2 * N;
  // dK/dV: per visit Q_i, dO_i rows, L_i, D_i and the accumulator's read-modify-write.
  t.read += visits * (3 * d + 2);
  t.written += visits * d;
  // convert: read the accumulator, write dQ.
  t.read += Nd;
  t.written += Nd;
  t.read *= p.heads();
  t.written *= p.heads();
  // Per K/V head (a group's query heads share it): K, V read once, dK, dV written once.
  t.read += p.kv_heads() * 2 * Nd;
  t.written += p.kv_heads() * 2 * Nd;
  return t;
}

Grads naive_lowp_backward(const Problem& p, const Qkv& in, const std::vector<float>& dout) {
  require_lowp(p, "naive backward", kSupportedD, Problem::kGroups | Problem::kWindow);
  const DType t = p.dtype;
  const auto q = rounded(in.q, t), k = rounded(in.k, t), v = rounded(in.v, t), dO = rounded(dout, t);
  const int N = p.N, d = p.d;
  const float scale = p.softmax_scale();
  Grads g{std::vector<float>(p.elems()), std::vector<float>(p.kv_elems()), std::vector<float>(p.kv_elems())};
  std::vector<float> P(std::size_t(N) * N), dS(std::size_t(N) * N), acc(d);
  // dK and dV of a K/V head sum over its group's query heads in fp32, rounded once at the end.
  std::vector<float> dk(p.kv_elems(), 0.0f), dv(p.kv_elems(), 0.0f);
  for (std::size_t bh = 0; bh < p.heads(); ++bh) {
    const std::size_t head = bh * N * d, kv_head = p.kv_head(bh) * N * d;
    auto dot = [&](const std::vector<float>& a, std::size_t ha, int i, const std::vector<float>& b, std::size_t hb,
                   int j) {
      float s = 0.0f;
      for (int x = 0; x < d; ++x) s += a[ha + std::size_t(i) * d + x] * b[hb + std::size_t(j) * d + x];
      return s;
    };
    for (int i = 0; i < N; ++i) {  // every intermediate materialized in 16 bits, as a framework would
      const int first = p.first_key(i), vis = p.last_key(i) + 1;
      float* Pi = &P[std::size_t(i) * N];
      float* dSi = &dS[std::size_t(i) * N];
      float m = -INFINITY, l = 0.0f, Dsum = 0.0f;
      std::fill(Pi, Pi + N, 0.0f);
      std::fill(dSi, dSi + N, 0.0f);
      for (int j = first; j < vis; ++j) Pi[j] = round_to(t, scale * dot(q, head, i, k, kv_head, j)), m = std::max(m, Pi[j]);
      for (int j = first; j < vis; ++j) l += std::exp(Pi[j] - m);
      for (int j = first; j < vis; ++j) Pi[j] = round_to(t, std::exp(Pi[j] - m) / l);
      for (int j = first; j < vis; ++j) dSi[j] = round_to(t, dot(dO, head, i, v, kv_head, j)), Dsum += Pi[j] * dSi[j];  // dP
      for (int j = first; j < vis; ++j) dSi[j] = round_to(t, Pi[j] * (dSi[j] - Dsum));
    }
    for (int i = 0; i < N; ++i) {  // dQ = scale·dS·K
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int j = 0; j < N; ++j)
        for (int x = 0; x < d; ++x) acc[x] += dS[std::size_t(i) * N + j] * k[kv_head + std::size_t(j) * d + x];
      for (int x = 0; x < d; ++x) g.dq[head + std::size_t(i) * d + x] = round_to(t, scale * acc[x]);
    }
    for (int j = 0; j < N; ++j)  // dK += dSᵀ·Q, dV += Pᵀ·dO
      for (int i = 0; i < N; ++i)
        for (int x = 0; x < d; ++x) {
          dk[kv_head + std::size_t(j) * d + x] += dS[std::size_t(i) * N + j] * q[head + std::size_t(i) * d + x];
          dv[kv_head + std::size_t(j) * d + x] += P[std::size_t(i) * N + j] * dO[head + std::size_t(i) * d + x];
        }
  }
  for (std::size_t e = 0; e < p.kv_elems(); ++e) g.dk[e] = round_to(t, scale * dk[e]), g.dv[e] = round_to(t, dv[e]);
  return g;
}

}  // namespace fa::step06
