// Step 06 forward kernel: the online-softmax forward on tensor cores.
//
// A thread block of 4 warps (8 at d = 256) owns 16·kMT query rows per warp; warp w
// owns rows 16·kMT·w .., as kMT stacked 16-row mma tiles. Per K/V block j:
//   S = Q_i·K_jᵀ           mma.sync, fragments by ldmatrix from swizzled smem
//   online softmax          on the S accumulators, in registers (a row = one quad);
//                           the mask only on blocks it can touch, O and ℓ rescaled
//                           only when a row's max jumps by more than 2^8 (v12, v13)
//   O += P·V_j              P re-used from the S accumulators as A fragments
// while K/V block j+1 arrives by cp.async into the other of two buffers.
//
// The versions of the note's table are one kernel with different Version
// arguments (listed at the end of this file), so each can be measured beside the
// others. v1 (plain 32-bit shared loads) and v2 (padded rows) are in git history.
// Shared tiles have smem_cols(d) columns (d = 32, 96: 64, 128; mma.cuh).
#include <cstdint>

#include "common/cuda_check.cuh"
#include "steps/02_fused/tile.hpp"
#include "steps/03_online_softmax/online_softmax.hpp"
#include "steps/06_tensor_cores/mma.cuh"
#include "steps/06_tensor_cores/step06.hpp"

namespace fa::step06 {
namespace {

/// One version of the kernel, as compile-time choices.
template <int kMT_, int kBc64_, int kBc128_, bool kExp2_, bool kHeavyFirst_, bool kLazySum_, int kMinBlocks64_ = 0,
          int kChains_ = 1, bool kMaskBranch_ = false, bool kLazyRescale_ = false, bool kLateLoad_ = false,
          int kWarps_ = 4>
struct Version {
  static constexpr int kWarps = kWarps_, kThreads = 32 * kWarps;  ///< warps per block (4; 8 at d = 256)
  static constexpr int kMT = kMT_;  ///< 16-row mma tiles per warp: 16·kMT·kWarps query rows per block
  /// Keys per K/V block at head dimension d (d ≤ 64, and the rest).
  __host__ __device__ static constexpr int bc(int d) { return d <= 64 ? kBc64_ : kBc128_; }
  /// exp2 with the scale folded in (else expf of scaled scores, as steps 03–05).
  static constexpr bool kExp2 = kExp2_;
  /// The grid is (heads, query blocks) and block y takes query block T_r − 1 − y: with
  /// the causal mask, the blocks with the most K/V blocks to visit start first, in
  /// every head, and the short ones fill the tail.
  static constexpr bool kHeavyFirst = kHeavyFirst_;
  /// Each lane sums only its own probabilities of a row; the quad's partial ℓ are
  /// added once, after the last block (they are rescaled by the same α, so this is
  /// the same sum): two shuffles and adds per row per block saved.
  static constexpr bool kLazySum = kLazySum_;
  /// Thread blocks per SM that ptxas must leave room for at d ≤ 64 (it caps the
  /// registers at 65536 / (128·blocks)): more warps to hide latency with.
  static constexpr int kMinBlocks64 = kMinBlocks64_;
  /// Independent partial maxima and sums per row and block: a row's max (or sum) over
  /// its 2·B_c/8 scores is kChains dependency chains instead of one, so the warp
  /// can issue the next one while one waits (fp32 results: a reordered sum).
  static constexpr int kChains = kChains_;
  /// The mask's comparisons in a loop of their own behind the (warp-uniform) test
  /// of whether this block needs them. Written inside the max loop as
  /// `if (mask && col > row) …`, the compiler evaluates them, predicated, on every
  /// block: about four instructions per score.
  static constexpr bool kMaskBranch = kMaskBranch_;
  /// O and ℓ are rescaled only when a row's max grew by more than 2^kRescaleBits
  /// (decided per warp); the stale max is exact arithmetic, since O and ℓ share it.
  static constexpr bool kLazyRescale = kLazyRescale_;
  /// The next K/V block's copies are issued after the barrier that opens an
  /// iteration instead of before it: every warp has then finished the previous
  /// iteration, so the barrier that closed each iteration goes.
  static constexpr bool kLateLoad = kLateLoad_;
};


template <class T, int kD, class V>
__global__ void __launch_bounds__(V::kThreads, kD <= 64 ? V::kMinBlocks64 : 0)
    forward_kernel(int N, bool causal, float scale, const T* __restrict__ q, const T* __restrict__ k,
                   const T* __restrict__ v, T* __restrict__ o, float* __restrict__ lse) {
#if FA_STEP06_ARCH_OK  // compiled out before sm_80 (mma.cuh)
  constexpr int kMT = V::kMT, kBc = V::bc(kD), kRows = 16 * kMT * V::kWarps;  // query rows per block
  constexpr int kThreads = V::kThreads, kW = smem_cols(kD);  // kW: a shared tile's columns
  constexpr bool kExp2 = V::kExp2, kHeavyFirst = V::kHeavyFirst;
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
    begin_block<V::kLateLoad>(j + 1, last + 1, [&] {  // tile j+1 into the other buffer
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
    if (V::kMaskBranch && mask) {  // warp-uniform: a branch around the comparisons
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
          for (int x = 0; x < 4; ++x) {  // x = 2h + e: row g + 8h, column 8nt + 2t + e
            const int row = q0 + r0 + 16 * mt + g + 8 * (x / 2), col = k0 + 8 * nt + 2 * t + x % 2;
            if (col >= N || (causal && col > row)) s[mt][nt][x] = -INFINITY;
          }
    }
    std::uint32_t pa[kMT][kBc / 16][4];  // P as A fragments of O += P·V
    // 1. This thread's part of each row's max over the block (for expf: of the scaled scores).
    float mx[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // h = 0: row g of the m-tile; h = 1: row g + 8
        constexpr int kC = V::kChains;
        float mxc[kC];
#pragma unroll
        for (int c = 0; c < kC; ++c) mxc[c] = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s[mt][nt][2 * h + e];
            if constexpr (!V::kMaskBranch) {  // the mask inside the max: predicated on every block
              const int row = q0 + r0 + 16 * mt + g + 8 * h, col = k0 + 8 * nt + 2 * t + e;
              if (mask && (col >= N || (causal && col > row))) x = -INFINITY;
            }
            if constexpr (!kExp2) x *= scale;
            mxc[(2 * nt + e) % kC] = fmaxf(mxc[(2 * nt + e) % kC], x);
          }
        mx[mt][h] = mxc[0];
#pragma unroll
        for (int c = 1; c < kC; ++c) mx[mt][h] = fmaxf(mx[mt][h], mxc[c]);
      }
    // 2. Rescale O and ℓ to new maxima — always, or (kLazyRescale) only when a row of
    //    this warp saw its max grow by more than 2^kRescaleBits. Otherwise the old m
    //    stays, probabilities stay ≤ 2^kRescaleBits, O and ℓ are untouched, and the
    //    row max is not even needed: a thread's own part decides (if the row's max
    //    grew that much, so did the part of the thread holding it).
    bool rescale = true;
    if constexpr (V::kLazyRescale) {
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
        constexpr int kC = V::kChains;
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
          float sc[kC] = {};
#pragma unroll
          for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float& x = s[mt][nt][2 * h + e];
              x = exp2_approx(fmaf(x, mul, -ms));
              sc[(2 * nt + e) % kC] += x;
            }
          sum = sc[0];
#pragma unroll
          for (int c = 1; c < kC; ++c) sum += sc[c];
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
        if constexpr (!V::kLazySum) {
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
    end_block<V::kLateLoad>();
  }

  // Epilogue: O = acc / ℓ in 16 bits, L = m + log ℓ (m back in units of scale·s).
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if constexpr (V::kLazySum) {  // the quad's partial sums (every lane takes part in the shuffles)
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

template <class T, int kD, class V>
void launch(const Problem& p, const NativeFwdArgs& a, Stream s) {
  constexpr int kRows = 16 * V::kMT * V::kWarps, kBc = V::bc(kD);
  const std::size_t smem = std::size_t(kRows + 4 * kBc) * smem_cols(kD) * sizeof(T);
  set_smem_limit(forward_kernel<T, kD, V>, smem);
  const unsigned blocks = unsigned(tiles::q_blocks(p.N, kRows)), heads = unsigned(p.heads());
  const dim3 grid = V::kHeavyFirst ? dim3(heads, blocks) : dim3(blocks, heads);
  forward_kernel<T, kD, V><<<grid, V::kThreads, smem, s>>>(p.N, p.causal, p.softmax_scale(), static_cast<const T*>(a.q),
                                                         static_cast<const T*>(a.k), static_cast<const T*>(a.v),
                                                         static_cast<T*>(a.o), a.lse);
  FA_CHECK_LAUNCH();
}

/// Version V at head dimension kD, in the problem's 16-bit type.
template <class V, int kD>
void run_d(const Problem& p, const NativeFwdArgs& a, Stream s) {
  p.dtype == DType::bf16 ? launch<__nv_bfloat16, kD, V>(p, a, s) : launch<__half, kD, V>(p, a, s);
}

/// A version of the note's table: d = 64 or 128 (kVersionD).
template <class V>
void run(const Problem& p, const NativeFwdArgs& a, void*, Stream s) {
  p.d == 64 ? run_d<V, 64>(p, a, s) : run_d<V, 128>(p, a, s);
}

// The versions of the note's table. Each changes one thing over an earlier one; v6,
// v6b, v9, v9c and v11 were measured, not kept, and stay as the table's evidence.
//                      kMT  Bc@64 Bc@128 exp2   heavy  lazy ℓ [min blocks/SM at d = 64]
using V3 = Version<     1,   64,   64,    false, false, false>;  // swizzled shared memory (v2: padded rows)
using V4 = Version<     1,   64,   64,    true,  false, false>;  // + exp2, scale folded into one FFMA
using V5 = Version<     2,   64,   64,    true,  false, false>;  // + 128 query rows per block, 32 per warp
using V6 = Version<     2,   64,   32,    true,  false, false>;  // v5 with 32-key blocks at d = 128 (no spills)
using V6b = Version<    2,   128,  32,    true,  false, false>;  // v6 with 128-key blocks at d = 64
using V7c = Version<    1,   64,   64,    true,  true,  false>;  // v7 when causal: v4's blocks, heaviest first
using V7n = V5;                                                   // v7 without the mask: v5
using V8c = Version<    1,   64,   64,    true,  true,  true>;   // + ℓ summed across the quad once, at the end
using V8n = Version<    2,   64,   64,    true,  true,  true>;
using V9n = Version<    2,   64,   64,    true,  true,  true, 3>;  // + 3 blocks per SM at d = 64 (<= 168 registers)
using V9c = Version<    2,   64,   64,    true,  true,  true>;     // v8 with 128-row blocks also when causal
using V11c = Version<   1,   64,   64,    true,  true,  true, 0, 2>;  // + max and sum as two chains each
using V11n = Version<   2,   64,   64,    true,  true,  true, 0, 2>;
//                                                                  [chains, mask branch, lazy rescale]
using V12c = Version<   1,   64,   64,    true,  true,  true, 0, 1, true>;  // + the mask behind a uniform branch
using V12n = Version<   2,   64,   64,    true,  true,  true, 0, 1, true>;
using V13c = Version<   1,   64,   64,    true,  true,  true, 0, 1, true, true>;  // + O, ℓ rescaled only on a jump > 2^8
using V13n = Version<   2,   64,   64,    true,  true,  true, 0, 1, true, true>;
using V14n = Version<   2,   128,  64,    true,  true,  true, 0, 1, true, true>;  // v13 with 128-key blocks at d = 64
using V15c = Version<   1,   64,   64,    true,  true,  true, 0, 1, true, true, true>;  // + one barrier per block
using V15n = Version<   2,   64,   64,    true,  true,  true, 0, 1, true, true, true>;
using V15n64 = Version< 2,   128,  64,    true,  true,  true, 0, 1, true, true, true>;
//                                                                  [warps]
using V15w = Version<   1,   64,   64,    true,  true,  true, 0, 1, true, true, true, 8>;  // d = 256: 8 warps × 16 rows

/// v7: with the causal mask, 64-row blocks (less work wasted on diagonal blocks, twice
/// the blocks to balance), heaviest first; without it, v5's 128-row blocks.
void run_v7(const Problem& p, const NativeFwdArgs& a, void* ws, Stream s) {
  p.causal ? run<V7c>(p, a, ws, s) : run<V7n>(p, a, ws, s);
}
/// v8: v7 with the lazy ℓ.
void run_v8(const Problem& p, const NativeFwdArgs& a, void* ws, Stream s) {
  p.causal ? run<V8c>(p, a, ws, s) : run<V8n>(p, a, ws, s);
}
/// v9, a candidate measured against v8: more blocks per SM at d = 64 (slower: spills).
void run_v9(const Problem& p, const NativeFwdArgs& a, void* ws, Stream s) {
  p.causal ? run<V8c>(p, a, ws, s) : run<V9n>(p, a, ws, s);
}

/// v10: v8, except that with the causal mask at d = 128 the 128-row blocks of v9c
/// measured faster (at d = 64, v8's 64-row blocks did).
void run_v10(const Problem& p, const NativeFwdArgs& a, void* ws, Stream s) {
  p.causal && p.d == 64 ? run<V8c>(p, a, ws, s) : run<V8n>(p, a, ws, s);
}

/// v11, a candidate: v10 with two dependency chains for each row's max and sum.
/// Measured no faster (the note's table), so it was not kept.
void run_v11(const Problem& p, const NativeFwdArgs& a, void* ws, Stream s) {
  p.causal && p.d == 64 ? run<V11c>(p, a, ws, s) : run<V11n>(p, a, ws, s);
}

/// v12: v10 with the mask's comparisons behind a warp-uniform branch.
void run_v12(const Problem& p, const NativeFwdArgs& a, void* ws, Stream s) {
  p.causal && p.d == 64 ? run<V12c>(p, a, ws, s) : run<V12n>(p, a, ws, s);
}
/// v13: v12 with O and ℓ rescaled only when a row's max jumps by more than 2^8.
void run_v13(const Problem& p, const NativeFwdArgs& a, void* ws, Stream s) {
  p.causal && p.d == 64 ? run<V13c>(p, a, ws, s) : run<V13n>(p, a, ws, s);
}
/// v14: v13 with 128-key blocks at d = 64 without the mask.
void run_v14(const Problem& p, const NativeFwdArgs& a, void* ws, Stream s) {
  p.causal && p.d == 64 ? run<V13c>(p, a, ws, s) : p.d == 64 ? run<V14n>(p, a, ws, s) : run<V13n>(p, a, ws, s);
}

/// Query rows per block and keys per K/V block of version V at head dimension d, as
/// the CPU model takes them (forward_br, forward_bc), and its lazy rescaling.
template <class V>
constexpr bool model_blocks(bool causal, int d) {
  return 16 * V::kMT * V::kWarps == forward_br(causal, d) && V::bc(d) == forward_bc(causal, d) && V::kLazyRescale;
}

/// v15, the production kernel: v14 with the next K/V block's copies issued after the
/// opening barrier (one barrier per block instead of two). d = 32 takes d = 64's
/// blocks, d = 96 d = 128's; d = 256 (128 accumulators per thread for 16 rows) has
/// one 16-row tile per warp and 8 warps.
void run_v15(const Problem& p, const NativeFwdArgs& a, void*, Stream s) {
  static_assert(model_blocks<V15c>(true, 64) && model_blocks<V15n64>(false, 64) && model_blocks<V15c>(true, 32) &&
                    model_blocks<V15n64>(false, 32) && model_blocks<V15n>(true, 128) &&
                    model_blocks<V15n>(false, 128) && model_blocks<V15n>(true, 96) && model_blocks<V15n>(false, 96) &&
                    model_blocks<V15w>(true, 256) && model_blocks<V15w>(false, 256),
                "the CPU model uses the production kernel's blocks and rescaling");
  switch (p.d) {
    case 32: return p.causal ? run_d<V15c, 32>(p, a, s) : run_d<V15n64, 32>(p, a, s);
    case 64: return p.causal ? run_d<V15c, 64>(p, a, s) : run_d<V15n64, 64>(p, a, s);
    case 96: return run_d<V15n, 96>(p, a, s);
    case 128: return run_d<V15n, 128>(p, a, s);
    default: return run_d<V15w, 256>(p, a, s);  // require_supported: d = 256
  }
}

}  // namespace

const GpuForward kForward{"step06 forward", 256, no_workspace, "", nullptr, run_v15, kSupportedD, kMinSm};
const GpuForward kForwardVersions[kForwardVersionCount] = {
    {"v3: swizzled shared memory", 128, no_workspace, "", nullptr, run<V3>, kVersionD, kMinSm},
    {"v4: + exp2, scale folded", 128, no_workspace, "", nullptr, run<V4>, kVersionD, kMinSm},
    {"v5: + 128-row blocks", 128, no_workspace, "", nullptr, run<V5>, kVersionD, kMinSm},
    {"v6: v5 with 32-key blocks at d = 128", 128, no_workspace, "", nullptr, run<V6>, kVersionD, kMinSm},
    {"v6b: v6 with 128-key blocks at d = 64", 128, no_workspace, "", nullptr, run<V6b>, kVersionD, kMinSm},
    {"v7: 64-row blocks when causal, heaviest first", 128, no_workspace, "", nullptr, run_v7, kVersionD, kMinSm},
    {"v8: + row sums reduced once, at the end", 128, no_workspace, "", nullptr, run_v8, kVersionD, kMinSm},
    {"v9: + 3 blocks per SM at d = 64", 128, no_workspace, "", nullptr, run_v9, kVersionD, kMinSm},
    {"v9c: v8 with 128-row blocks also when causal", 128, no_workspace, "", nullptr, run<V9c>, kVersionD, kMinSm},
    {"v10: v8, but 128-row blocks when causal at d = 128", 128, no_workspace, "", nullptr, run_v10, kVersionD, kMinSm},
    {"v11: + row max and sum as two independent chains", 128, no_workspace, "", nullptr, run_v11, kVersionD, kMinSm},
    {"v12: + the mask behind a warp-uniform branch", 128, no_workspace, "", nullptr, run_v12, kVersionD, kMinSm},
    {"v13: + O and l rescaled only when a max jumps by > 2^8", 128, no_workspace, "", nullptr, run_v13, kVersionD, kMinSm},
    {"v14: v13 with 128-key blocks at d = 64", 128, no_workspace, "", nullptr, run_v14, kVersionD, kMinSm},
    {"v15: v14 with one barrier fewer per K/V block", 128, no_workspace, "", nullptr, run_v15, kVersionD, kMinSm},
};

}  // namespace fa::step06
