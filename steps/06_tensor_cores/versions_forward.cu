// Step 06's forward as note 06 teaches it, one idea a row: the versions of the lesson's
// forward table. Production (forward.cu) is the table's last row.
//   v3   mma.sync, ldmatrix from XOR-swizzled shared memory, cp.async double-buffered K/V
//   v4   + exp2 with the softmax scale folded into one FFMA
//   v5   + 128 query rows per block, 32 per warp: each K/V fragment feeds two mma
//   v12  + the mask's comparisons behind a warp-uniform branch (with three smaller steps:
//        the heaviest query blocks first, ℓ summed across the quad once, 64-row blocks
//        when causal at d = 64)
//   v13  + O and ℓ rescaled only when a row's max grows by more than 2^8
// One kernel takes them all, each a configuration with named fields (FwdVersion), so
// that every bench run re-measures the table. The rows v1 and v2 and the versions not
// kept are described in notes/lab/06_versions.md.
#include <cstdint>

#include "common/cuda/mma.cuh"
#include "common/cuda_check.cuh"
#include "steps/02_fused/tile.hpp"
#include "steps/03_online_softmax/online_softmax.hpp"
#include "steps/06_tensor_cores/step06.hpp"
#include "steps/06_tensor_cores/versions.cuh"

namespace fa::step06 {
namespace {

using namespace mma;

/// One version of the forward kernel (4 warps; at d = 64 or 128), by what it adds.
struct FwdVersion {
  int m_tiles = 1;            ///< 16-row mma tiles per warp: 64·m_tiles query rows per block
  int keys = 64;              ///< keys per K/V block
  bool exp2 = false;          ///< exp2 with the scale folded into one FFMA (else expf of scaled scores)
  bool heavy_first = false;   ///< grid (heads, query blocks), the longest causal blocks first
  bool lazy_sum = false;      ///< each lane sums its own part of ℓ; the quad adds them once, at the end
  bool mask_branch = false;   ///< the mask's comparisons in a loop behind a warp-uniform branch
  bool lazy_rescale = false;  ///< O and ℓ rescaled only when a row's max grows by more than 2^8
};

/// A version: its configuration for each case (the mask or not; d = 64 or 128).
using Version = FwdVersion (*)(bool causal, int d);

template <class T, int kD, bool kCausal, Version V>
__global__ void __launch_bounds__(128)
    version_kernel(int N, bool causal, float scale, const T* __restrict__ q, const T* __restrict__ k,
                   const T* __restrict__ v, T* __restrict__ o, float* __restrict__ lse) {
#if FA_MMA_ARCH_OK  // compiled out before sm_80 (common/cuda/mma.cuh)
  constexpr FwdVersion kV = V(kCausal, kD);
  constexpr int kMT = kV.m_tiles, kBc = kV.keys, kRows = 16 * kMT * 4;  // query rows per block: 4 warps
  constexpr int kThreads = 128, kW = smem_cols(kD);  // kW: a shared tile's columns
  constexpr bool kExp2 = kV.exp2, kHeavyFirst = kV.heavy_first;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* Qs = reinterpret_cast<T*>(smem_raw);  // [kRows][kW], swizzled
  T* Ks = Qs + kRows * kW;                 // [2][kBc][kW]: two buffers
  T* Vs = Ks + 2 * kBc * kW;               // [2][kBc][kW]

  require_aligned_smem(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int i = kHeavyFirst ? gridDim.y - 1 - blockIdx.y : blockIdx.x, bh = kHeavyFirst ? blockIdx.x : blockIdx.y;
  const int q0 = i * kRows, r0 = 16 * kMT * warp;  // this warp's first row in the block
  const std::size_t head = std::size_t(bh) * N * kD;
  // Scores are multiplied by `mul` before the max; exp of (mul·s − mul·m) in base e or 2.
  const float mul = kExp2 ? scale * kLog2e : scale;

  float acc[kMT][kD / 8][4] = {};  // O: rows g, g+8 of each m-tile × columns 8·dt + 2t, +1
  float m[kMT][2], l[kMT][2];      // per m-tile, rows g and g+8 (kExp2: m is unscaled)
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
  const int last = tiles::last_kv_block(N, causal, i, kRows, kBc);

  // Prologue: Q_i and the first K/V tile, one group of copies.
  copy_tile_async<kThreads, kD, kRows>(Qs, q + head + std::size_t(q0) * kD, N - q0);
  copy_tile_async<kThreads, kD, kBc>(Ks, k + head, N);
  copy_tile_async<kThreads, kD, kBc>(Vs, v + head, N);
  cp_async_commit();

  for (int j = 0; j <= last; ++j) {
    const int k0 = j * kBc, buf = j % 2;
    version_begin_block<false>(j + 1, last + 1, [&] {  // tile j+1 into the other buffer
      const int k1 = k0 + kBc;
      copy_tile_async<kThreads, kD, kBc>(Ks + (1 - buf) * kBc * kW, k + head + std::size_t(k1) * kD, N - k1);
      copy_tile_async<kThreads, kD, kBc>(Vs + (1 - buf) * kBc * kW, v + head + std::size_t(k1) * kD, N - k1);
    });

    // S = Q_i·K_jᵀ: kMT·16 × 64 per warp.
    float s[kMT][kBc / 8][4] = {};
    gemm_abt<T, kD, kMT, kBc / 8>(s, smem_u32(Qs), r0, smem_u32(Ks + buf * kBc * kW), 0);

    // The mask, only where this warp's rows can meet it: the last K/V block (keys past
    // N) and, when causal, blocks reaching past the warp's first row.
    const bool mask = k0 + kBc > N || (causal && k0 + kBc - 1 > q0 + r0);
    if (kV.mask_branch && mask) {  // warp-uniform: a branch around the comparisons
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
          for (int x = 0; x < 4; ++x) {  // x = 2h + e: row g + 8h, column 8nt + 2t + e
            const int row = q0 + r0 + 16 * mt + g + 8 * (x / 2), col = k0 + 8 * nt + 2 * t + x % 2;
            if (tiles::masked(row, col, N, causal)) s[mt][nt][x] = -INFINITY;
          }
    }
    std::uint32_t pa[kMT][kBc / 16][4];  // P as A fragments of O += P·V
    // 1. This thread's part of each row's max over the block (for expf: of the scaled scores).
    float mx[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // h = 0: row g of the m-tile; h = 1: row g + 8
        mx[mt][h] = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s[mt][nt][2 * h + e];
            if constexpr (!kV.mask_branch) {  // the mask inside the max: predicated on every block
              const int row = q0 + r0 + 16 * mt + g + 8 * h, col = k0 + 8 * nt + 2 * t + e;
              if (mask && tiles::masked(row, col, N, causal)) x = -INFINITY;
            }
            if constexpr (!kExp2) x *= scale;
            mx[mt][h] = fmaxf(mx[mt][h], x);
          }
      }
    // 2. Rescale O and ℓ to new maxima — always, or (kLazyRescale) only when a row of
    //    this warp saw its max grow by more than 2^kRescaleBits. Otherwise the old m
    //    stays, probabilities stay ≤ 2^kRescaleBits, O and ℓ are untouched, and the
    //    row max is not even needed: a thread's own part decides (if the row's max
    //    grew that much, so did the part of the thread holding it).
    bool rescale = true;
    if constexpr (kV.lazy_rescale) {
      static_assert(kExp2, "the threshold is in log2 units");
      bool grow = false;  // NaN (a row without any score yet: −∞ − −∞) compares false
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) grow |= (mx[mt][h] - m[mt][h]) * mul > kRescaleBits;
      rescale = __any_sync(0xffffffffu, grow);  // one decision per warp: no divergence
    }
    // 3. Probabilities against m, their row sums, P as A fragments.
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float alpha = 1.0f, sum = 0.0f;
        if (rescale) {  // the row's max: the quad holding it
          mx[mt][h] = fmaxf(mx[mt][h], __shfl_xor_sync(0xffffffffu, mx[mt][h], 1));
          mx[mt][h] = fmaxf(mx[mt][h], __shfl_xor_sync(0xffffffffu, mx[mt][h], 2));
          const float m_new = fmaxf(m[mt][h], mx[mt][h]);
          if constexpr (kExp2)  // 0 on the first block (m = −∞); −∞ − (−∞) kept out
            alpha = exp2_approx(m[mt][h] * mul - (m_new == -INFINITY ? 0.0f : m_new * mul));
          else
            alpha = online::rescale(m[mt][h], m_new);
          m[mt][h] = m_new;
        }
        if constexpr (kExp2) {
          // exp(scale·(s − m)) = 2^(s·mul − m·mul): one FFMA and one MUFU.EX2 per score.
          // Before any unmasked score m = −∞; ms = 0 keeps −∞ − (−∞) out.
          const float ms = m[mt][h] == -INFINITY ? 0.0f : m[mt][h] * mul;
#pragma unroll
          for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float& x = s[mt][nt][2 * h + e];
              x = exp2_approx(fmaf(x, mul, -ms));
              sum += x;
            }
        } else {
#pragma unroll
          for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float& x = s[mt][nt][2 * h + e];
              x = online::prob(x, m[mt][h]);
              sum += x;
            }
        }
        if constexpr (!kV.lazy_sum) {
          sum += __shfl_xor_sync(0xffffffffu, sum, 1);
          sum += __shfl_xor_sync(0xffffffffu, sum, 2);
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
    gemm_pv<T, kD, kMT, kBc>(acc, pa, smem_u32(Vs + buf * kBc * kW));
    version_end_block<false>();
  }

  // Epilogue: O = acc / ℓ in 16 bits, L = m + log ℓ (m back in units of scale·s).
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if constexpr (kV.lazy_sum) {  // the quad's partial sums (every lane takes part in the shuffles)
        l[mt][h] += __shfl_xor_sync(0xffffffffu, l[mt][h], 1);
        l[mt][h] += __shfl_xor_sync(0xffffffffu, l[mt][h], 2);
      }
      const int row = q0 + r0 + 16 * mt + g + 8 * h;
      if (row >= N) continue;
      const float inv = 1.0f / l[mt][h];
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt)
        *reinterpret_cast<std::uint32_t*>(o + head + std::size_t(row) * kD + 8 * dt + 2 * t) =
            Mma<T>::pack(acc[mt][dt][2 * h] * inv, acc[mt][dt][2 * h + 1] * inv);
      if (t == 0) lse[std::size_t(bh) * N + row] = online::lse(kExp2 ? m[mt][h] * scale : m[mt][h], l[mt][h]);
    }
#endif
}

template <class T, int kD, bool kCausal, Version V>
void launch(const Problem& p, const NativeFwdArgs& a, Stream s) {
  constexpr FwdVersion kV = V(kCausal, kD);
  constexpr int kRows = 64 * kV.m_tiles;
  const std::size_t smem = std::size_t(kRows + 4 * kV.keys) * smem_cols(kD) * sizeof(T);
  set_smem_limit(version_kernel<T, kD, kCausal, V>, smem);
  const unsigned blocks = unsigned(tiles::q_blocks(p.N, kRows)), heads = unsigned(p.heads());
  const dim3 grid = kV.heavy_first ? dim3(heads, blocks) : dim3(blocks, heads);
  version_kernel<T, kD, kCausal, V><<<grid, 128, smem, s>>>(p.N, p.causal, p.softmax_scale(), static_cast<const T*>(a.q),
                                                  static_cast<const T*>(a.k), static_cast<const T*>(a.v),
                                                  static_cast<T*>(a.o), a.lse);
  FA_CHECK_LAUNCH();
}

template <Version V, int kD, bool kCausal>
void run_d(const Problem& p, const NativeFwdArgs& a, Stream s) {
  p.dtype == DType::bf16 ? launch<__nv_bfloat16, kD, kCausal, V>(p, a, s) : launch<__half, kD, kCausal, V>(p, a, s);
}
template <Version V>
void run(const Problem& p, const NativeFwdArgs& a, void*, Stream s) {
  if (p.causal)
    p.d == 64 ? run_d<V, 64, true>(p, a, s) : run_d<V, 128, true>(p, a, s);
  else
    p.d == 64 ? run_d<V, 64, false>(p, a, s) : run_d<V, 128, false>(p, a, s);
}

// The versions of the note's table, each as the one before it plus its idea.
FA_HD constexpr FwdVersion v3(bool, int) { return {.m_tiles = 1, .keys = 64}; }  // swizzled shared memory
FA_HD constexpr FwdVersion v4(bool c, int d) {  // + exp2, the scale folded into one FFMA
  FwdVersion v = v3(c, d);
  v.exp2 = true;
  return v;
}
FA_HD constexpr FwdVersion v5(bool c, int d) {  // + 128 query rows per block, 32 per warp
  FwdVersion v = v4(c, d);
  v.m_tiles = 2;
  return v;
}
FA_HD constexpr FwdVersion v12(bool c, int d) {  // + the mask behind a warp-uniform branch
  FwdVersion v = v5(c, d);
  v.heavy_first = true;          // (the lab's v7: the longest causal query blocks first)
  v.lazy_sum = true;             // (v8: the quad adds its parts of ℓ once, at the end)
  if (c && d == 64) v.m_tiles = 1;  // (v7, v10: 64-row blocks when causal at d = 64)
  v.mask_branch = true;
  return v;
}
FA_HD constexpr FwdVersion v13(bool c, int d) {  // + O and ℓ rescaled only when a max jumps by > 2^8
  FwdVersion v = v12(c, d);
  v.lazy_rescale = true;
  return v;
}
// Production (forward.cu) = v13 with 128-key blocks at d = 64 without the mask, and the
// next block's copies issued after the opening barrier (one barrier fewer per block).
static_assert(v13(true, 64).m_tiles * 64 == forward_br(true, 64) && v13(false, 64).m_tiles * 64 == forward_br(false, 64) &&
                  v13(true, 128).m_tiles * 64 == forward_br(true, 128) &&
                  v13(false, 128).m_tiles * 64 == forward_br(false, 128) && v13(true, 64).keys == forward_bc(true, 64) &&
                  v13(true, 128).keys == forward_bc(true, 128) && v13(false, 128).keys == forward_bc(false, 128),
              "production keeps v13's blocks except its 128 keys at d = 64 without the mask");

}  // namespace

const GpuForward kForwardVersions[kForwardVersionCount] = {
    {.name = "v3: swizzled shared memory",
     .max_d = 128, .run_native = run<v3>, .only_d = kVersionD, .min_sm = kMinSm},
    {.name = "v4: + exp2, scale folded",
     .max_d = 128, .run_native = run<v4>, .only_d = kVersionD, .min_sm = kMinSm},
    {.name = "v5: + 128-row blocks",
     .max_d = 128, .run_native = run<v5>, .only_d = kVersionD, .min_sm = kMinSm},
    {.name = "v12: + heaviest first, l summed once, the mask behind a branch",
     .max_d = 128, .run_native = run<v12>, .only_d = kVersionD, .min_sm = kMinSm},
    {.name = "v13: + O and l rescaled only when a max jumps by > 2^8",
     .max_d = 128, .run_native = run<v13>, .only_d = kVersionD, .min_sm = kMinSm},
};

}  // namespace fa::step06
