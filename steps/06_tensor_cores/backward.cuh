// Step 06's backward, the parts every dK/dV kernel shares (the production kernels in
// backward.cu, the versions of note 06 in versions_backward.cu):
//   1. preprocess: D = rowsum(dO∘O) in fp32, and L·log2(e), both padded per head to a
//      multiple of 64 rows so that a block's slice is one aligned cp.async run;
//   2. a dK/dV kernel (the caller's), which adds dQ into an fp32 accumulator;
//   3. convert: dQ = scale·accumulator, rounded to 16 bits.
// and the query tiles' copies, the dK/dV stores and the launch sequence.
#pragma once

#include <cstdint>

#include "common/cuda/mma.cuh"
#include "common/cuda_check.cuh"
#include "steps/02_fused/tile.hpp"
#include "steps/06_tensor_cores/step06.hpp"

namespace fa::step06 {

using namespace mma;  // mma.sync, ldmatrix, cp.async and the warp-level products

namespace {

constexpr int kQ = kBwdQueries;  // queries per step of the inner loop

/// Rows per head in the padded L·log2(e) and D arrays.
int padded_rows(int N) { return tiles::q_blocks(N, kQ) * kQ; }

/// A warp's row r of the dQ accumulator zeroed: zero[r·kD, (r + 1)·kD).
template <int kD>
__device__ __forceinline__ void zero_row(float* __restrict__ zero, int r, int lane) {
  for (int c = 4 * lane; c < kD; c += 128)
    *reinterpret_cast<float4*>(zero + std::size_t(r) * kD + c) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

/// D = Σ_c dO·O of row n of head bh (heads of N rows of kD) in fp32, a warp's lanes two
/// columns at a time, summed across the warp (every lane gets it); 0 where the row is not
/// real (padding).
template <class T, int kD>
__device__ __forceinline__ float row_dsum(const T* __restrict__ o, const T* __restrict__ dout, int bh, int N, int n,
                                          bool real, int lane) {
  float acc = 0.0f;
  if (real) {
    const std::size_t base = (std::size_t(bh) * N + n) * kD;
    for (int c = 2 * lane; c < kD; c += 64) {
      const float2 x = Mma<T>::load2(o + base + c), y = Mma<T>::load2(dout + base + c);
      acc += x.x * y.x + x.y * y.y;
    }
  }
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  return acc;
}

/// One warp per row (of B·H·Np): D = Σ_c dO·O in fp32; rows past N get 0. Where `zero` is
/// given (step 07), the warp also zeroes the row's kD floats of it: zero[r·kD, (r + 1)·kD),
/// a dQ accumulator of rows·kD floats, zeroed here instead of by a memset of its own; where
/// `counter` is (step 07's persistent grid), the first thread zeroes it.
template <class T, int kD>
__global__ void preprocess_kernel(int N, int Np, int rows, const T* __restrict__ o, const T* __restrict__ dout,
                                  const float* __restrict__ lse, float* __restrict__ l2, float* __restrict__ dsum,
                                  float* __restrict__ zero = nullptr, int* __restrict__ counter = nullptr) {
#if FA_MMA_ARCH_OK  // compiled out before sm_80 (common/cuda/mma.cuh)
#if __CUDA_ARCH__ >= 900
  // The dK/dV kernel after this one may be launched early (step 07: launch_early); its
  // blocks wait for this grid's writes before they read them.
  cudaTriggerProgrammaticLaunchCompletion();
#endif
  const int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (counter && r == 0 && lane == 0) *counter = 0;
  if (r >= rows) return;
  if (zero) zero_row<kD>(zero, r, lane);
  const int bh = r / Np, n = r % Np;
  const float acc = row_dsum<T, kD>(o, dout, bh, N, n, n < N, lane);
  if (lane == 0) {
    dsum[r] = acc;
    l2[r] = n < N ? lse[std::size_t(bh) * N + n] * kLog2e : 0.0f;
  }
#endif
}

/// The query side of a dK/dV kernel's shared memory: two buffers each of Q_i and
/// dO_i (kQ × kD in kQ × smem_cols(kD) tiles, swizzled), L_i·log2 e and D_i (kQ floats).
template <class T, int kD>
struct QueryTiles {
  T *Qs, *dOs;
  float *L, *D;
  /// Query block i into buffer `buf`, by cp.async (not committed); kWholeFast as copy_tile_async's.
  template <int kThreads, bool kWholeFast = false>
  __device__ __forceinline__ void load(int i, int buf, int N, std::size_t head, std::size_t stat,
                                       const T* __restrict__ q, const T* __restrict__ dout,
                                       const float* __restrict__ l2, const float* __restrict__ dsum) const {
    const int q0 = i * kQ;
    constexpr int kW = smem_cols(kD);
    copy_tile_async<kThreads, kD, kQ, kWholeFast>(Qs + buf * kQ * kW, q + head + std::size_t(q0) * kD, N - q0);
    copy_tile_async<kThreads, kD, kQ, kWholeFast>(dOs + buf * kQ * kW, dout + head + std::size_t(q0) * kD, N - q0);
    copy_floats_async<kThreads>(L + buf * kQ, l2 + stat + q0, kQ);
    copy_floats_async<kThreads>(D + buf * kQ, dsum + stat + q0, kQ);
  }
};

/// The mask on a warp's accumulator tiles: element x of tile [mt][nt] sits at row
/// row0 + 16·mt + g + 8·(x / 2) and column col0 + 8·nt + 2t + x % 2 (the C layout
/// of common/cuda/mma.cuh); where drop(row, column) says so it becomes `fill` (−∞ for a score, 0 for
/// a probability). Called behind the warp-uniform test of whether the tiles can meet
/// the mask at all, so that almost every block skips the comparisons. (The forward
/// writes the same loop out over S: through this helper ptxas orders its index
/// arithmetic differently.)
template <int kMT, int kNT, class Drop>
__device__ __forceinline__ void mask_tiles(float (&acc)[kMT][kNT][4], int row0, int col0, float fill, Drop drop) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int x = 0; x < 4; ++x)
        if (drop(row0 + 16 * mt + g + 8 * (x / 2), col0 + 8 * nt + 2 * t + x % 2)) acc[mt][nt][x] = fill;
}

/// dK = scale·acc_k and dV = acc_v in 16 bits: kMT 16-row tiles of a warp from key
/// row0 on, kNT 8-column tiles from column col0 on; keys past N are not written.
template <class T, int kD, int kMT, int kNT>
__device__ __forceinline__ void store_dkdv(T* __restrict__ dk, T* __restrict__ dv, const float (&acc_k)[kMT][kNT][4],
                                           const float (&acc_v)[kMT][kNT][4], float scale, std::size_t head,
                                           int row0, int col0, int N) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 16 * mt + g + 8 * h;
      if (row >= N) continue;
#pragma unroll
      for (int dt = 0; dt < kNT; ++dt) {
        const std::size_t at = head + std::size_t(row) * kD + col0 + 8 * dt + 2 * t;
        *reinterpret_cast<std::uint32_t*>(dk + at) =
            Mma<T>::pack(scale * acc_k[mt][dt][2 * h], scale * acc_k[mt][dt][2 * h + 1]);
        *reinterpret_cast<std::uint32_t*>(dv + at) = Mma<T>::pack(acc_v[mt][dt][2 * h], acc_v[mt][dt][2 * h + 1]);
      }
    }
}

/// A warp's dSᵀ, as A fragments sa[mt][c] (16-bit pairs), into the swizzled kK × kQ
/// tile dSs for the dQ product: register c of sa[mt] holds keys w0 + 16mt + g (+8) and
/// queries c0 + 16c + 2t (+8).
template <class T, int kMT, int kChunks>
__device__ __forceinline__ void store_ds_t(T* dSs, const std::uint32_t (&sa)[kMT][kChunks][4], int w0, int c0) {
  using LS = Swizzled<kQ>;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int r = w0 + 16 * mt + g, col = c0 + 16 * c + 2 * t;
      *reinterpret_cast<std::uint32_t*>(dSs + LS::at(r, col)) = sa[mt][c][0];
      *reinterpret_cast<std::uint32_t*>(dSs + LS::at(r + 8, col)) = sa[mt][c][1];
      *reinterpret_cast<std::uint32_t*>(dSs + LS::at(r, col + 8)) = sa[mt][c][2];
      *reinterpret_cast<std::uint32_t*>(dSs + LS::at(r + 8, col + 8)) = sa[mt][c][3];
    }
}

/// A warp's dQ tile (kMT 16-row tiles × kNT 8-column tiles) added into the fp32
/// accumulator. `dst` points at the thread's first element (row g, column 2t of the
/// tile); every atomic is reached from it by an immediate offset, so that no address
/// register is rewritten while the atomics before it may not have read it yet. Rows
/// at or past N (row0: the thread's first row) are skipped; a tile known to lie inside
/// the sequence (`whole`) takes the branch-free path.
template <int kD, int kMT, int kNT>
__device__ __forceinline__ void add_dq(float* dst, const float (&dq)[kMT][kNT][4], bool whole, int row0, int N) {
  auto add = [&](auto row_ok) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (row_ok(16 * mt + 8 * h))
#pragma unroll
          for (int dt = 0; dt < kNT; ++dt)
            atomic_add2(dst + (16 * mt + 8 * h) * kD + 8 * dt, dq[mt][dt][2 * h], dq[mt][dt][2 * h + 1]);
  };
  if (whole)
    add([](int) { return true; });
  else
    add([&](int r) { return row0 + r < N; });
}

/// dQ = scale·accumulator in 16 bits, four elements per thread (n is a multiple of 4).
template <class T>
__global__ void convert_kernel(std::size_t n, float scale, const float* __restrict__ acc, T* __restrict__ dq) {
#if FA_MMA_ARCH_OK  // compiled out before sm_80 (common/cuda/mma.cuh)
  const std::size_t e = 4 * (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x);
  if (e >= n) return;
  const float4 a = *reinterpret_cast<const float4*>(acc + e);
  const uint2 r{Mma<T>::pack(scale * a.x, scale * a.y), Mma<T>::pack(scale * a.z, scale * a.w)};
  *reinterpret_cast<uint2*>(dq + e) = r;
#endif
}

struct Workspace {
  float *dq_acc, *l2, *dsum;
};
Workspace carve(const Problem& p, void* ws) {
  float* base = static_cast<float*>(ws);
  const std::size_t stats = p.heads() * std::size_t(padded_rows(p.N));
  return {base, base + p.elems(), base + p.elems() + stats};
}

std::size_t workspace_bytes(const Problem& p) {
  return (p.elems() + 2 * p.heads() * std::size_t(padded_rows(p.N))) * sizeof(float);
}

/// The three kernels of a backward pass, on stream s: preprocess, `dkdv` (a dK/dV
/// kernel launched over `grid` with `threads` threads and `smem` bytes of shared
/// memory), convert.
template <class T, int kD, class Kernel>
void launch_backward(const Problem& p, const NativeBwdArgs& a, void* workspace, Stream s, Kernel dkdv, dim3 grid,
                     int threads, std::size_t smem) {
  const Workspace w = carve(p, workspace);
  const int N = p.N, Np = padded_rows(N);
  const T *q = static_cast<const T*>(a.q), *k = static_cast<const T*>(a.k), *v = static_cast<const T*>(a.v);
  const T *o = static_cast<const T*>(a.o), *dout = static_cast<const T*>(a.dout);
  FA_CUDA_CHECK(cudaMemsetAsync(w.dq_acc, 0, p.elems() * sizeof(float), s));
  const int rows = int(p.heads()) * Np;
  preprocess_kernel<T, kD><<<(rows + 7) / 8, 256, 0, s>>>(N, Np, rows, o, dout, a.lse, w.l2, w.dsum);
  FA_CHECK_LAUNCH();

  set_smem_limit(dkdv, smem);
  dkdv<<<grid, threads, smem, s>>>(N, Np, p.causal, p.softmax_scale(), q, k, v, dout, w.l2, w.dsum, w.dq_acc,
                                   static_cast<T*>(a.dk), static_cast<T*>(a.dv));
  FA_CHECK_LAUNCH();

  const std::size_t n4 = p.elems() / 4;
  convert_kernel<T><<<unsigned((n4 + 255) / 256), 256, 0, s>>>(p.elems(), p.softmax_scale(), w.dq_acc,
                                                               static_cast<T*>(a.dq));
  FA_CHECK_LAUNCH();
}

/// Shared memory of a dK/dV kernel with kK keys: K, V; two buffers of Q, dO, L, D;
/// dSᵀ, and Pᵀ too when `pt_shared`.
template <class T>
constexpr std::size_t dkdv_smem(int d, int kK, bool pt_shared) {
  return (std::size_t(2 * kK + 4 * kQ) * smem_cols(d) + (pt_shared ? 2 : 1) * kK * kQ) * sizeof(T) +
         4 * kQ * sizeof(float);
}

constexpr const char* kWorkspace = "the fp32 dQ accumulator and D, L·log2 e (B·H·N·(d + 2) floats)";

}  // namespace
}  // namespace fa::step06
