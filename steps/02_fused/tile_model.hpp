// Host pieces of the fused steps' CPU models (02–05): the same three phases as
// tile.cuh, over counted HBM arrays and on-chip tiles, summing in the same order.
#pragma once

#include <vector>

#include "common/hbm.hpp"
#include "steps/02_fused/tile.hpp"

namespace fa::tiles {

/// dst (rows×d) = the `valid` rows starting at element `base` of src; zero beyond.
/// Only the valid rows are loaded from HBM (the kernel never reads past N).
inline void load_tile(std::vector<float>& dst, const Hbm& src, std::size_t base, int rows, int valid, int d) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < d; ++c) dst[r * d + c] = r < valid ? src.load(base + std::size_t(r) * d + c) : 0.0f;
}

/// S[r][c] = mask(r, c, scale·Σ_x A[r][x]·B[c][x]), S is br×bc (A: br rows, B: bc rows).
template <class Mask>
void scores(std::vector<float>& S, const std::vector<float>& A, const std::vector<float>& B, int d, float scale,
            Mask mask, Tiles t = {}) {
  for (int r = 0; r < t.br; ++r)
    for (int c = 0; c < t.bc; ++c) {
      float acc = 0.0f;
      for (int x = 0; x < d; ++x) acc += A[r * d + x] * B[c * d + x];
      S[r * t.bc + c] = mask(r, c, scale * acc);
    }
}

/// acc (br×d) += S·B with B bc×d; kTransS: acc (bc×d) += Sᵀ·B with B br×d. S is
/// br×bc; the inner sum runs in order.
template <bool kTransS = false>
void accumulate(std::vector<float>& acc, const std::vector<float>& S, const std::vector<float>& B, int d, Tiles t = {}) {
  const int rows = kTransS ? t.bc : t.br, inner = kTransS ? t.br : t.bc;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < d; ++c) {
      float a = acc[r * d + c];
      // exercise 02-accumulate: add row r of S (S[r * t.bc + j]; with kTransS, column r: S[j * t.bc + r]) times B's column c (B[j * d + c]) into a, j in order
      // stub: (void)inner, (void)S, (void)B;
      for (int j = 0; j < inner; ++j) a += (kTransS ? S[j * t.bc + r] : S[r * t.bc + j]) * B[j * d + c];
      // end exercise
      acc[r * d + c] = a;
    }
}

/// On-chip elements the fused forward kernels hold: Q_i, K_j, V_j, the S tile and
/// the B_r×d accumulator (shared memory + registers).
inline std::size_t forward_on_chip(int d, Tiles t = {}) {
  return std::size_t(t.br) * d * 2 + 2 * std::size_t(t.bc) * d + std::size_t(t.br) * t.bc;
}

}  // namespace fa::tiles
