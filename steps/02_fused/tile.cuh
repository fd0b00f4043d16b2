// Device pieces of the fused kernels (steps 02–05): load a tile, S = scale·Q·Kᵀ
// on a tile, O += S·V. Each is one phase of a thread block of tiles::kThreads
// threads; the caller places the __syncthreads() between phases.
//
// Thread layout: thread t = 32·w + lane. In a B_r×B_c score tile, lane is the
// column (key) and warp w owns rows w + 8k (k < 4). In a B_r×d output tile the
// same thread owns rows w + 8k and columns lane + 32u (u < kMaxD/32): so the warp
// that computes a row's softmax statistics also owns that row's output.
#pragma once

#include <cuda_runtime.h>

#include "common/cuda_check.cuh"
#include "steps/02_fused/tile.hpp"

namespace fa::tiles {

/// A row accumulator: thread's share of a B_r×d (or B_c×d) tile in registers.
template <int kD>
struct Acc {
  float v[kRowsPerWarp][kD / 32];
  __device__ void zero() {
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k)
#pragma unroll
      for (int u = 0; u < kD / 32; ++u) v[k][u] = 0.0f;
  }
};

__device__ __forceinline__ int warp_id() { return threadIdx.x / 32; }
__device__ __forceinline__ int lane_id() { return threadIdx.x % 32; }
/// Tile row of this thread's k-th row (k < kRowsPerWarp).
__device__ __forceinline__ int my_row(int k) { return warp_id() + 8 * k; }

/// dst[r][c] = src[(row0 + r)·d + c] for r < rows (zero beyond `valid` rows), c < d.
/// The rows are consecutive in memory, so consecutive threads read consecutive
/// floats: every warp load is coalesced.
__device__ __forceinline__ void load_tile(float* dst, const float* __restrict__ src, int rows, int valid, int d) {
  const int ld = padded(d);
  for (int e = threadIdx.x; e < rows * d; e += kThreads) {
    const int r = e / d, c = e % d;
    dst[r * ld + c] = r < valid ? src[std::size_t(r) * d + c] : 0.0f;
  }
}

/// Scores of this thread's cells: S[r][lane] = scale·Σ_x A[r][x]·B[lane][x] for its
/// rows r. A is B_r×d, B is 32×d (both with padded stride). Summation runs over
/// x in order, exactly as the CPU model's loop.
template <class Mask>
__device__ __forceinline__ void scores(float* S, const float* A, const float* B, int d, float scale, Mask mask) {
  const int ld = padded(d), c = lane_id();
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k) {
    const int r = my_row(k);
    float acc = 0.0f;
    for (int x = 0; x < d; ++x) acc += A[r * ld + x] * B[c * ld + x];
    S[r * (kBc + 1) + c] = mask(r, c, scale * acc);
  }
}

/// acc[r][:] += Σ_j S[r][j]·B[j][:] for this thread's rows r and its columns, j in
/// order. kTransS: use Sᵀ instead, acc[r][:] += Σ_j S[j][r]·B[j][:] — the backward's
/// dV = Pᵀ·dO and dK = dSᵀ·Q, for the rows of a B_c×d accumulator.
template <bool kTransS = false, int kD>
__device__ __forceinline__ void accumulate(Acc<kD>& acc, const float* S, const float* B, int d) {
  const int ld = padded(d);
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k) {
    const int r = my_row(k);
#pragma unroll
    for (int u = 0; u < kD / 32; ++u) {
      const int c = lane_id() + 32 * u;
      if (c < d) {
        float a = acc.v[k][u];
        for (int j = 0; j < 32; ++j) a += (kTransS ? S[j * (kBc + 1) + r] : S[r * (kBc + 1) + j]) * B[j * ld + c];
        acc.v[k][u] = a;
      }
    }
  }
}

/// Writes this thread's cells of a tile to rows row0.. of dst (row-major, width d),
/// skipping rows at or beyond `valid`: dst[(row0 + r)·d + c] = value(k, acc.v[k][u]).
template <int kD, class F>
__device__ __forceinline__ void store_tile(const Acc<kD>& acc, float* __restrict__ dst, int valid, int d, F value) {
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k) {
    const int r = my_row(k);
    if (r >= valid) continue;
#pragma unroll
    for (int u = 0; u < kD / 32; ++u) {
      const int c = lane_id() + 32 * u;
      if (c < d) dst[std::size_t(r) * d + c] = value(k, acc.v[k][u]);
    }
  }
}

/// Shared memory of the forward kernels (steps 02–04): Q_i, K_j, V_j, the S tile.
struct ForwardSmem {
  float *Qi, *Kj, *Vj, *S;
  __device__ ForwardSmem(float* base, int d) {
    const int ld = padded(d);
    Qi = base;              // [kBr][ld]
    Kj = Qi + kBr * ld;     // [kBc][ld]
    Vj = Kj + kBc * ld;     // [kBc][ld]
    S = Vj + kBc * ld;      // [kBr][kBc + 1]
  }
  static std::size_t bytes(int d) { return (std::size_t(kBr + 2 * kBc) * padded(d) + kBr * (kBc + 1)) * sizeof(float); }
};

/// Calls f(std::integral_constant<int, D>) with the smallest D in {32, 64, 128, 256}
/// that holds d: the register arrays need a compile-time width.
template <class F>
void dispatch_d(int d, F&& f) {
  if (d <= 32) f(std::integral_constant<int, 32>{});
  else if (d <= 64) f(std::integral_constant<int, 64>{});
  else if (d <= 128) f(std::integral_constant<int, 128>{});
  else f(std::integral_constant<int, 256>{});
}

}  // namespace fa::tiles
