// CPU model of step 01: the same kernels, in the same tile order, over counted
// HBM arrays. Read it beside kernels.cu.
#include <cmath>

#include "steps/01_naive/step01.hpp"

namespace fa::step01 {
namespace {

constexpr int T = kTile;

/// A matrix inside an HBM array: element (r, c) of op(X) is X[off + r*ld + c], or
/// X[off + c*ld + r] when transposed.
struct Mat {
  Hbm* x;
  std::size_t off;
  int ld;
  bool trans;
  std::size_t at(int r, int c) const { return off + (trans ? std::size_t(c) * ld + r : std::size_t(r) * ld + c); }
};

enum class Mask { None, ZeroAboveDiagonal };

/// C[M×Nc] = alpha·A[M×K]·B[K×Nc], as the kernel does it: one T×T tile of C at a
/// time, the inner dimension walked T at a time through on-chip tiles. Elements
/// outside the matrices are never loaded (the kernel pads with zeros).
void gemm(int M, int Nc, int K, float alpha, Mat A, Mat B, Mat C, Mask mask) {
  for (int m0 = 0; m0 < M; m0 += T)
    for (int n0 = 0; n0 < Nc; n0 += T) {
      OnChip chip(3 * T * T);
      auto As = chip.tile(T * T, "A tile"), Bs = chip.tile(T * T, "B tile"), acc = chip.tile(T * T, "C tile");
      for (int k0 = 0; k0 < K; k0 += T) {
        for (int r = 0; r < T; ++r)
          for (int c = 0; c < T; ++c) {
            As[r * T + c] = (m0 + r < M && k0 + c < K) ? A.x->load(A.at(m0 + r, k0 + c)) : 0.0f;
            Bs[r * T + c] = (k0 + r < K && n0 + c < Nc) ? B.x->load(B.at(k0 + r, n0 + c)) : 0.0f;
          }
        for (int r = 0; r < T; ++r)
          for (int c = 0; c < T; ++c)
            for (int k = 0; k < T; ++k) acc[r * T + c] += As[r * T + k] * Bs[k * T + c];
      }
      for (int r = 0; r < T && m0 + r < M; ++r)
        for (int c = 0; c < T && n0 + c < Nc; ++c) {
          const bool zero = mask == Mask::ZeroAboveDiagonal && n0 + c > m0 + r;
          C.x->store(C.at(m0 + r, n0 + c), zero ? 0.0f : alpha * acc[r * T + c]);
        }
    }
}

/// Number of keys query row i may see.
int visible(const Problem& p, int i) { return p.causal ? i + 1 : p.N; }

}  // namespace

ModelForward model_forward(const Problem& p, const Qkv& in, bool softmax) {
  p.validate_self_attention("step01 model");
  ModelForward r;
  Hbm Q(in.q, r.traffic), K(in.k, r.traffic), V(in.v, r.traffic);
  Hbm O(p.elems(), r.traffic), L(softmax ? p.rows() : 0, r.traffic);
  const std::size_t NN = std::size_t(p.N) * p.N, Nd = std::size_t(p.N) * p.d;
  Hbm S(p.heads() * NN, r.traffic), P(softmax ? p.heads() * NN : 0, r.traffic);
  for (std::size_t bh = 0; bh < p.heads(); ++bh) {
    // Kernel 1: S = scale·Q·Kᵀ (no-softmax + causal: masked entries are 0).
    gemm(p.N, p.N, p.d, p.softmax_scale(), {&Q, bh * Nd, p.d, false}, {&K, bh * Nd, p.d, true},
         {&S, bh * NN, p.N, false}, (!softmax && p.causal) ? Mask::ZeroAboveDiagonal : Mask::None);
    if (!softmax) {
      // Kernel 3 only: O = S·V.
      gemm(p.N, p.d, p.N, 1.0f, {&S, bh * NN, p.N, false}, {&V, bh * Nd, p.d, false}, {&O, bh * Nd, p.d, false},
           Mask::None);
      continue;
    }
    // Kernel 2: one row at a time, three passes over the visible part of S.
    for (int i = 0; i < p.N; ++i) {
      const std::size_t row = bh * NN + std::size_t(i) * p.N;
      const int vis = visible(p, i);
      // exercise 01-softmax: the row's softmax in three passes over its visible scores S(row + j), j < vis: the max m, the sum l of e^(s - m), then P = e^(s - m) / l (0 for j >= vis)
      // stub: (void)vis;
      // stub: float m = 0.0f, l = 1.0f;
      // stub: for (int j = 0; j < p.N; ++j) P.store(row + j, 0.0f);
      float m = -INFINITY;
      for (int j = 0; j < vis; ++j) m = std::fmax(m, S.load(row + j));
      float l = 0;
      for (int j = 0; j < vis; ++j) l += std::exp(S.load(row + j) - m);
      for (int j = 0; j < p.N; ++j) P.store(row + j, j < vis ? std::exp(S.load(row + j) - m) / l : 0.0f);
      // end exercise
      L.store(bh * p.N + i, m + std::log(l));
    }
    // Kernel 3: O = P·V.
    gemm(p.N, p.d, p.N, 1.0f, {&P, bh * NN, p.N, false}, {&V, bh * Nd, p.d, false}, {&O, bh * Nd, p.d, false},
         Mask::None);
  }
  r.out.o = O.take();
  if (softmax) r.out.lse = L.take();
  return r;
}

ModelBackward model_backward(const Problem& p, const Qkv& in, const ForwardOut& fwd, const std::vector<float>& dout) {
  p.validate_self_attention("step01 model");
  ModelBackward r;
  Traffic& t = r.traffic;
  Hbm Q(in.q, t), K(in.k, t), V(in.v, t), O(fwd.o, t), L(fwd.lse, t), dO(dout, t);
  Hbm dQ(p.elems(), t), dK(p.elems(), t), dV(p.elems(), t), D(p.rows(), t);
  const std::size_t NN = std::size_t(p.N) * p.N, Nd = std::size_t(p.N) * p.d;
  Hbm P(p.heads() * NN, t), dP(p.heads() * NN, t);
  const float scale = p.softmax_scale();
  for (std::size_t bh = 0; bh < p.heads(); ++bh) {
    // D_i = Σ_c dO_ic·O_ic (one warp per row).
    for (int i = 0; i < p.N; ++i) {
      float s = 0;
      for (int c = 0; c < p.d; ++c) s += dO.load(bh * Nd + std::size_t(i) * p.d + c) * O.load(bh * Nd + std::size_t(i) * p.d + c);
      D.store(bh * p.N + i, s);
    }
    // P = exp(scale·Q·Kᵀ − L): S into P's buffer, then rewritten in place.
    gemm(p.N, p.N, p.d, scale, {&Q, bh * Nd, p.d, false}, {&K, bh * Nd, p.d, true}, {&P, bh * NN, p.N, false},
         Mask::None);
    for (int i = 0; i < p.N; ++i) {
      const std::size_t row = bh * NN + std::size_t(i) * p.N;
      const float li = L.load(bh * p.N + i);
      const int vis = visible(p, i);
      for (int j = 0; j < p.N; ++j) P.store(row + j, j < vis ? std::exp(P.load(row + j) - li) : 0.0f);
    }
    // dV = Pᵀ·dO;  dP = dO·Vᵀ.
    gemm(p.N, p.d, p.N, 1.0f, {&P, bh * NN, p.N, true}, {&dO, bh * Nd, p.d, false}, {&dV, bh * Nd, p.d, false},
         Mask::None);
    gemm(p.N, p.N, p.d, 1.0f, {&dO, bh * Nd, p.d, false}, {&V, bh * Nd, p.d, true}, {&dP, bh * NN, p.N, false},
         Mask::None);
    // dS = P∘(dP − D), written over dP.
    for (int i = 0; i < p.N; ++i) {
      const std::size_t row = bh * NN + std::size_t(i) * p.N;
      const float di = D.load(bh * p.N + i);
      for (int j = 0; j < p.N; ++j) dP.store(row + j, P.load(row + j) * (dP.load(row + j) - di));
    }
    // dQ = scale·dS·K;  dK = scale·dSᵀ·Q.
    gemm(p.N, p.d, p.N, scale, {&dP, bh * NN, p.N, false}, {&K, bh * Nd, p.d, false}, {&dQ, bh * Nd, p.d, false},
         Mask::None);
    gemm(p.N, p.d, p.N, scale, {&dP, bh * NN, p.N, true}, {&Q, bh * Nd, p.d, false}, {&dK, bh * Nd, p.d, false},
         Mask::None);
  }
  r.grads = {dQ.take(), dK.take(), dV.take()};
  return r;
}

// ---- The note's formulas -------------------------------------------------------
namespace {
std::uint64_t tiles(std::uint64_t x) { return (x + T - 1) / T; }
/// Σ_i visible(i): N² without a mask, N(N+1)/2 with it.
std::uint64_t visible_count(const Problem& p) {
  const std::uint64_t N = p.N;
  return p.causal ? N * (N + 1) / 2 : N * N;
}
/// Reads of a GEMM C[M×Nc] = A[M×K]·B[K×Nc]: A once per column tile of C, B once per row tile.
std::uint64_t gemm_reads(std::uint64_t M, std::uint64_t Nc, std::uint64_t K) {
  return M * K * tiles(Nc) + K * Nc * tiles(M);
}
}  // namespace

Traffic traffic_forward(const Problem& p, bool softmax) {
  const std::uint64_t N = p.N, d = p.d, NN = N * N, h = p.heads();
  Traffic t;
  // exercise 01-hbm: one head's traffic (lecture p8–9, Θ(Nd + N²)): the reads of the two GEMMs (gemm_reads: S = QKᵀ is N×N×d, O = PV is N×d×N), S and O written; with softmax also three reads of each row's visible scores (visible_count) and P and L written
  // stub: (void)N, (void)d, (void)NN, (void)softmax;
  t.read = gemm_reads(N, N, d) + gemm_reads(N, d, N);  // S = QKᵀ, O = (S or P)·V
  t.written = NN + N * d;                               // S, O
  if (softmax) {
    t.read += 3 * visible_count(p);  // three passes: max, sum, write
    t.written += NN + N;             // P, L
  }
  // end exercise
  t.read *= h;
  t.written *= h;
  return t;
}

std::uint64_t flops_forward(const Problem& p) {
  const std::uint64_t N = p.N, d = p.d;
  // exercise 01-flops: the FLOPs of S = QKᵀ and O = PV over all heads (lecture p6): each product is N·N·d multiply-adds, 2 FLOPs each; step 01 computes masked scores too
  // stub: (void)N, (void)d;
  // stub: return 0;
  return p.heads() * 2 * (2 * N * N * d);
  // end exercise
}

std::uint64_t memory_forward(const Problem& p) {
  const std::uint64_t N = p.N, d = p.d;
  return p.heads() * (4 * N * d + N + 2 * N * N);  // Q, K, V, O; L; S, P
}

Traffic traffic_backward(const Problem& p) {
  const std::uint64_t N = p.N, d = p.d, NN = N * N, h = p.heads();
  Traffic t;
  t.read = 2 * N * d                      // D = rowsum(dO∘O)
           + gemm_reads(N, N, d)          // S = QKᵀ
           + visible_count(p) + N         // P = exp(S − L)
           + gemm_reads(N, d, N)          // dV = Pᵀ·dO
           + gemm_reads(N, N, d)          // dP = dO·Vᵀ
           + 2 * NN + N                   // dS = P∘(dP − D)
           + 2 * gemm_reads(N, d, N);     // dQ = dS·K, dK = dSᵀ·Q
  t.written = N + NN + NN + N * d + NN + NN + 2 * N * d;
  t.read *= h;
  t.written *= h;
  return t;
}

}  // namespace fa::step01
