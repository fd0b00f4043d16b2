// Step 06's forward for one thread block, its copies behind a policy (`Loads`): the
// kernel of forward.cu with cp.async (CpAsyncLoads), and step 07's first lesson row,
// the same kernel with TMA loads (step 07's versions_forward.cu). What the block
// computes is written here once; forward.cu's header says how.
#pragma once

#include <cstdint>

#include "common/cuda/mma.cuh"
#include "steps/02_fused/tile.hpp"
#include "steps/03_online_softmax/online_softmax.hpp"
#include "steps/06_tensor_cores/step06.hpp"

namespace fa::step06 {

using namespace mma;  // mma.sync, ldmatrix, cp.async and the warp-level products

/// A forward block's shared memory: Q_i ([B_r][smem_cols(d)], swizzled), then two
/// buffers each of K_j and V_j ([2][B_c][smem_cols(d)]), from a 1024-byte aligned base.
template <class T, int kD, bool kCausal>
struct FwdSmem {
  static constexpr FwdTile kTile = forward_tile(kCausal, kD);
  static constexpr int kW = smem_cols(kD), kRows = kTile.rows(), kBc = kTile.keys;
  static constexpr std::size_t kBytes = std::size_t(kRows + 4 * kBc) * kW * sizeof(T);
  __device__ explicit FwdSmem(unsigned char* base)
      : q(reinterpret_cast<T*>(base)), k(q + kRows * kW), v(k + 2 * kBc * kW) {}
  __device__ T* k_buf(int b) const { return k + b * kBc * kW; }
  __device__ T* v_buf(int b) const { return v + b * kBc * kW; }
  T *q, *k, *v;
};

/// The copies of forward.cu: cp.async by every thread, two buffers, one barrier an
/// iteration (begin_block's late load).
template <class T, int kD, bool kCausal>
struct CpAsyncLoads {
  using S = FwdSmem<T, kD, kCausal>;
  const T *q, *k, *v;  ///< this block's Q rows and its head's K, V
  int q_rows, Nk;      ///< Q rows left from the block's first; keys
  /// Q_i and K_0, V_0, one group of copies.
  __device__ void prologue(const S& sm) const {
    constexpr int kThreads = S::kTile.threads();
    copy_tile_async<kThreads, kD, S::kRows>(sm.q, q, q_rows);
    copy_tile_async<kThreads, kD, S::kBc>(sm.k, k, Nk);
    copy_tile_async<kThreads, kD, S::kBc>(sm.v, v, Nk);
    cp_async_commit();
  }
  /// Block next − 1 visible to every warp; block `next` into the other buffer if next < end.
  __device__ void begin(const S& sm, int next, int end) const {
    begin_block(next, end, [&] {
      constexpr int kThreads = S::kTile.threads();
      const int k1 = next * S::kBc, nb = next % 2;
      copy_tile_async<kThreads, kD, S::kBc>(sm.k_buf(nb), k + std::size_t(k1) * kD, Nk - k1);
      copy_tile_async<kThreads, kD, S::kBc>(sm.v_buf(nb), v + std::size_t(k1) * kD, Nk - k1);
    });
  }
};

/// Query block i of head bh (the grid's order is the kernel's choice), its copies by
/// `loads`. N queries against Nk keys, O and L written for the rows that exist.
template <class T, int kD, bool kCausal, class Loads>
__device__ __forceinline__ void forward_block(Loads loads, unsigned char* smem_raw, int i, int bh, int N, int Nk,
                                              bool causal, float scale, T* __restrict__ o, float* __restrict__ lse) {
  constexpr FwdTile kTile = forward_tile(kCausal, kD);  // the block shape: step06.hpp
  constexpr int kMT = kTile.m_tiles, kBc = kTile.keys, kRows = kTile.rows();
  const FwdSmem<T, kD, kCausal> sm(smem_raw);  // Q_i, and K_j, V_j in two buffers each
  require_aligned_smem(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int q0 = i * kRows, r0 = 16 * kMT * warp;  // this warp's first row in the block
  const std::size_t head = std::size_t(bh) * N * kD;
  const int off = Nk - N;  // query row r sits at position r + Nk − N
  // exp(scale·(s − m)) = 2^(s·mul − m·mul): m is kept in units of s.
  const float mul = scale * kLog2e;

  float acc[kMT][kD / 8][4] = {};  // O: [m-tile][8-column n-tile][register] (rows g, g+8 × columns 2t, 2t+1)
  float m[kMT][2], l[kMT][2];      // [m-tile][row g, g+8]: the running max (in units of s) and
                                   // this lane's part of ℓ (the quad's parts are added at the end)
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
  const int last = tiles::last_kv_block(N, causal, i, kRows, kBc, Nk);

  // Prologue: Q_i and the first K/V block.
  loads.prologue(sm);

  // Main loop over the K/V blocks.
  for (int j = 0; j <= last; ++j) {
    const int k0 = j * kBc, buf = j % 2;
    loads.begin(sm, j + 1, last + 1);  // block j here for every warp; block j+1 on its way into the other buffer

    // S = Q_i·K_jᵀ: the warp's 16·kMT rows × kBc keys.
    float s[kMT][kBc / 8][4] = {};  // [m-tile][8-key n-tile][register]
    gemm_abt<T, kD, kMT, kBc / 8>(s, smem_u32(sm.q), r0, smem_u32(sm.k_buf(buf)), 0);

    // The mask, only where this warp's rows can meet it — the last K/V block (keys past
    // N_kv) and, when causal, blocks reaching past the warp's first row — in a loop of its
    // own behind that warp-uniform test: a branch that almost every block skips.
    if (k0 + kBc > Nk || (causal && k0 + kBc - 1 > q0 + r0 + off)) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
          for (int x = 0; x < 4; ++x) {  // x = 2h + e: row g + 8h, column 8nt + 2t + e
            const int row = q0 + r0 + 16 * mt + g + 8 * (x / 2), col = k0 + 8 * nt + 2 * t + x % 2;
            if (tiles::masked(row + off, col, Nk, causal)) s[mt][nt][x] = -INFINITY;
          }
    }

    // Online softmax, 1: this thread's part of each row's max over the block.
    float mx[kMT][2];  // [m-tile][row g, g+8]
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[mt][h] = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) mx[mt][h] = fmaxf(mx[mt][h], s[mt][nt][2 * h + e]);
      }
    // 2. Rescale only when some row of this warp saw its max grow by more than
    //    2^kRescaleBits. Otherwise the old m stays the reference, probabilities stay
    //    ≤ 2^kRescaleBits, O and ℓ are untouched, and the row's max is not even needed:
    //    a thread's own part decides (if the row's max grew that much, so did the part
    //    of the thread holding it). NaN (no score yet: −∞ − −∞) compares false.
    bool grow = false;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) grow |= (mx[mt][h] - m[mt][h]) * mul > kRescaleBits;
    const bool rescale = __any_sync(0xffffffffu, grow);  // one decision per warp: no divergence
    // 3. Probabilities against m, this lane's part of their row sums, P as A fragments.
    std::uint32_t pa[kMT][kBc / 16][4];  // [m-tile][16-key k-chunk][register]: P of O += P·V
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float alpha = 1.0f;
        if (rescale) {  // the row's max: the quad holding it
          mx[mt][h] = fmaxf(mx[mt][h], __shfl_xor_sync(0xffffffffu, mx[mt][h], 1));
          mx[mt][h] = fmaxf(mx[mt][h], __shfl_xor_sync(0xffffffffu, mx[mt][h], 2));
          const float m_new = fmaxf(m[mt][h], mx[mt][h]);
          // 0 on the first block (m = −∞); −∞ − (−∞) kept out.
          alpha = exp2_approx(m[mt][h] * mul - (m_new == -INFINITY ? 0.0f : m_new * mul));
          m[mt][h] = m_new;
        }
        // One FFMA and one MUFU.EX2 per score. Before any unmasked score m = −∞, and
        // ms = 0 keeps −∞ − (−∞) out.
        const float ms = m[mt][h] == -INFINITY ? 0.0f : m[mt][h] * mul;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s[mt][nt][2 * h + e];
            x = exp2_approx(fmaf(x, mul, -ms));
            sum += x;
          }
        if (rescale) {
          l[mt][h] = alpha * l[mt][h] + sum;
#pragma unroll
          for (int dt = 0; dt < kD / 8; ++dt) acc[mt][dt][2 * h] *= alpha, acc[mt][dt][2 * h + 1] *= alpha;
        } else {
          l[mt][h] += sum;
        }
      }
#pragma unroll
      for (int c = 0; c < kBc / 16; ++c) to_a<T>(pa[mt][c], s[mt][2 * c], s[mt][2 * c + 1]);
    }

    // O += P·V_j, P rounded to 16 bits (the one rounding inside the algorithm).
    gemm_pv<T, kD, kMT, kBc>(acc, pa, smem_u32(sm.v_buf(buf)));
  }

  // Epilogue: ℓ = the quad's four parts; O = acc / ℓ in 16 bits; L = m·scale + log ℓ.
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[mt][h] += __shfl_xor_sync(0xffffffffu, l[mt][h], 1);  // (every lane takes part)
      l[mt][h] += __shfl_xor_sync(0xffffffffu, l[mt][h], 2);
      const int row = q0 + r0 + 16 * mt + g + 8 * h;
      if (row >= N) continue;
      const float inv = 1.0f / l[mt][h];
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt)
        *reinterpret_cast<std::uint32_t*>(o + head + std::size_t(row) * kD + 8 * dt + 2 * t) =
            Mma<T>::pack(acc[mt][dt][2 * h] * inv, acc[mt][dt][2 * h + 1] * inv);
      if (t == 0) lse[std::size_t(bh) * N + row] = online::lse(m[mt][h] * scale, l[mt][h]);
    }
}

}  // namespace fa::step06
