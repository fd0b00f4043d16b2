// Step 06 forward kernel: the online-softmax forward on tensor cores.
//
// A thread block of 4 warps owns kMT·64 query rows; warp w owns kMT·16 of them
// (rows 16·kMT·w ..), as kMT stacked 16-row mma tiles. Per K/V block j:
//   S = Q_i·K_jᵀ           mma.sync, fragments by ldmatrix from swizzled smem
//   online softmax          on the S accumulators, in registers (a row = one quad)
//   O += P·V_j              P re-used from the S accumulators as A fragments
// while K/V block j+1 arrives by cp.async into the other of two buffers.
//
// The versions of the note's table are template arguments of one kernel, so each
// can be measured beside the others:
//   v3  swizzled shared memory instead of padded rows          (kMT = 1, kExp2 = false)
//   v4  + exp2 with the softmax scale folded in: one FFMA + one MUFU.EX2 per score
//   v5  + kMT = 2: 128 query rows per block, 32 per warp, so every K/V fragment
//       loaded from shared memory feeds two mma instead of one (the production kernel)
// (v1, plain 32-bit shared loads, and v2, padded rows, are in git history.)
#include <cstdint>

#include "common/cuda_check.cuh"
#include "steps/02_fused/tile.hpp"
#include "steps/03_online_softmax/online_softmax.hpp"
#include "steps/06_tensor_cores/mma.cuh"
#include "steps/06_tensor_cores/step06.hpp"

namespace fa::step06 {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr float kLog2e = 1.4426950408889634f;

template <class T, int kD, int kMT, int kBc, bool kExp2>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(int N, bool causal, float scale, const T* __restrict__ q, const T* __restrict__ k,
                   const T* __restrict__ v, T* __restrict__ o, float* __restrict__ lse) {
  constexpr int kRows = 16 * kMT * kWarps;  // query rows per block
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* Qs = reinterpret_cast<T*>(smem_raw);  // [kRows][kD], swizzled
  T* Ks = Qs + kRows * kD;                 // [2][kBc][kD]: two buffers
  T* Vs = Ks + 2 * kBc * kD;               // [2][kBc][kD]

  require_aligned_smem(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int q0 = blockIdx.x * kRows, r0 = 16 * kMT * warp;  // this warp's first row in the block
  const std::size_t head = std::size_t(blockIdx.y) * N * kD;
  // Scores are multiplied by `mul` before the max; exp of (mul·s − mul·m) in base e or 2.
  const float mul = kExp2 ? scale * kLog2e : scale;

  float acc[kMT][kD / 8][4] = {};  // O: rows g, g+8 of each m-tile × columns 8·dt + 2t, +1
  float m[kMT][2], l[kMT][2];      // per m-tile, rows g and g+8 (kExp2: m is unscaled)
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
  const int last = tiles::last_kv_block(N, causal, blockIdx.x, kRows, kBc);

  // Prologue: Q_i and the first K/V tile, one group of copies.
  copy_tile_async<kThreads, kD, kRows>(Qs, q + head + std::size_t(q0) * kD, N - q0);
  copy_tile_async<kThreads, kD, kBc>(Ks, k + head, N);
  copy_tile_async<kThreads, kD, kBc>(Vs, v + head, N);
  cp_async_commit();

  for (int j = 0; j <= last; ++j) {
    const int k0 = j * kBc, buf = j % 2;
    if (j < last) {  // start tile j+1 into the other buffer (free since the barrier ending iteration j-1)
      const int k1 = k0 + kBc;
      copy_tile_async<kThreads, kD, kBc>(Ks + (1 - buf) * kBc * kD, k + head + std::size_t(k1) * kD, N - k1);
      copy_tile_async<kThreads, kD, kBc>(Vs + (1 - buf) * kBc * kD, v + head + std::size_t(k1) * kD, N - k1);
      cp_async_commit();
      cp_async_wait<1>();  // tile j (and Q) landed; tile j+1 may still be in flight
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // every thread's copies of tile j are visible to all

    // S = Q_i·K_jᵀ: kMT·16 × 64 per warp.
    float s[kMT][kBc / 8][4] = {};
    gemm_abt<T, kD, kMT, kBc / 8>(s, smem_u32(Qs), r0, smem_u32(Ks + buf * kBc * kD), 0);

    // Masks only where this warp's rows can meet one: the last K/V block (keys past
    // N) and, when causal, blocks reaching past the warp's first row.
    const bool mask = k0 + kBc > N || (causal && k0 + kBc - 1 > q0 + r0);
    std::uint32_t pa[kMT][kBc / 16][4];  // P as A fragments of O += P·V
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // h = 0: row g of the m-tile; h = 1: row g + 8
        const int row = q0 + r0 + 16 * mt + g + 8 * h;
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s[mt][nt][2 * h + e];
            const int col = k0 + 8 * nt + 2 * t + e;
            if (mask && (col >= N || (causal && col > row))) x = -INFINITY;
            if constexpr (!kExp2) x *= scale;
            mx = fmaxf(mx, x);
          }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the quad holding this row
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[mt][h], mx);
        float alpha, sum = 0.0f;
        if constexpr (kExp2) {
          // exp(scale·(s − m)) = 2^(s·mul − m·mul): one FFMA and one MUFU.EX2 per score.
          // Before any unmasked score m_new = −∞; ms = 0 keeps −∞ − (−∞) out.
          const float ms = m_new == -INFINITY ? 0.0f : m_new * mul;
          alpha = exp2_approx(m[mt][h] * mul - ms);  // 0 on the first block: m = −∞
#pragma unroll
          for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float& x = s[mt][nt][2 * h + e];
              x = exp2_approx(fmaf(x, mul, -ms));
              sum += x;
            }
        } else {
          alpha = online::rescale(m[mt][h], m_new);
#pragma unroll
          for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float& x = s[mt][nt][2 * h + e];
              x = online::prob(x, m_new);
              sum += x;
            }
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        l[mt][h] = alpha * l[mt][h] + sum;
        m[mt][h] = m_new;
#pragma unroll
        for (int dt = 0; dt < kD / 8; ++dt) acc[mt][dt][2 * h] *= alpha, acc[mt][dt][2 * h + 1] *= alpha;
      }
#pragma unroll
      for (int c = 0; c < kBc / 16; ++c) to_a<T>(pa[mt][c], s[mt][2 * c], s[mt][2 * c + 1]);
    }

    // O += P·V_j, P rounded to 16 bits (the one rounding inside the algorithm).
    gemm_pv<T, kD, kMT, kBc>(acc, pa, smem_u32(Vs + buf * kBc * kD));
    __syncthreads();  // every warp is done with buffer `buf` before iteration j+1 refills it
  }

  // Epilogue: O = acc / ℓ in 16 bits, L = m + log ℓ (m back in units of scale·s).
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = q0 + r0 + 16 * mt + g + 8 * h;
      if (row >= N) continue;
      const float inv = 1.0f / l[mt][h];
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt)
        *reinterpret_cast<std::uint32_t*>(o + head + std::size_t(row) * kD + 8 * dt + 2 * t) =
            Mma<T>::pack(acc[mt][dt][2 * h] * inv, acc[mt][dt][2 * h + 1] * inv);
      if (t == 0) lse[std::size_t(blockIdx.y) * N + row] = online::lse(kExp2 ? m[mt][h] * scale : m[mt][h], l[mt][h]);
    }
}

template <class T, int kD, int kMT, int kBc, bool kExp2>
void launch(const Problem& p, const NativeFwdArgs& a, Stream s) {
  constexpr int kRows = 16 * kMT * kWarps;
  const std::size_t smem = std::size_t(kRows + 4 * kBc) * kD * sizeof(T);
  set_smem_limit(forward_kernel<T, kD, kMT, kBc, kExp2>, smem);
  const dim3 grid((p.N + kRows - 1) / kRows, unsigned(p.heads()));
  forward_kernel<T, kD, kMT, kBc, kExp2><<<grid, kThreads, smem, s>>>(
      p.N, p.causal, p.softmax_scale(), static_cast<const T*>(a.q), static_cast<const T*>(a.k),
      static_cast<const T*>(a.v), static_cast<T*>(a.o), a.lse);
  FA_CHECK_LAUNCH();
}

/// A version of the table: kMT 16-row tiles per warp, K/V blocks of kBc64 keys at
/// d = 64 and kBc128 at d = 128, exp or exp2.
template <int kMT, int kBc64, int kBc128, bool kExp2>
void run_version(const Problem& p, const NativeFwdArgs& a, void*, Stream s) {
  const bool bf16 = p.dtype == DType::bf16;
  if (p.d == 64)
    bf16 ? launch<__nv_bfloat16, 64, kMT, kBc64, kExp2>(p, a, s) : launch<__half, 64, kMT, kBc64, kExp2>(p, a, s);
  else
    bf16 ? launch<__nv_bfloat16, 128, kMT, kBc128, kExp2>(p, a, s) : launch<__half, 128, kMT, kBc128, kExp2>(p, a, s);
}

}  // namespace

static_assert(kBr == 16 * 2 * kWarps && forward_bc(64) == 64 && forward_bc(128) == 32,
              "the production kernel is v6, and the CPU model uses its blocks");
const GpuForward kForward{"step06 forward", 128, no_workspace, "", nullptr, run_version<2, 64, 32, true>,
                          kSupportedD};
const GpuForward kForwardVersions[kForwardVersionCount] = {
    {"v3: swizzled shared memory", 128, no_workspace, "", nullptr, run_version<1, 64, 64, false>, kSupportedD},
    {"v4: + exp2, scale folded", 128, no_workspace, "", nullptr, run_version<1, 64, 64, true>, kSupportedD},
    {"v5: + 128-row blocks", 128, no_workspace, "", nullptr, run_version<2, 64, 64, true>, kSupportedD},
    {"v6: + 32-key blocks at d = 128", 128, no_workspace, "", nullptr, run_version<2, 64, 32, true>, kSupportedD},
    {"v6b: 128-key blocks at d = 64", 128, no_workspace, "", nullptr, run_version<2, 128, 32, true>, kSupportedD},
};

}  // namespace fa::step06
