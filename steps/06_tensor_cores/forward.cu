// Step 06 forward kernel: step 03's online softmax on tensor cores.
//
// A thread block owns B_r = 16·m_tiles·warps query rows (forward_tile in step06.hpp);
// warp w owns rows 16·m_tiles·w .. as m_tiles stacked 16-row mma tiles, so no warp
// ever needs another warp's rows and the softmax needs no shared memory. Per K/V block j:
//   S = Q_i·K_jᵀ            mma.sync, fragments by ldmatrix from swizzled shared memory
//   the mask                 only on the blocks it can touch, behind a warp-uniform branch
//   online softmax           on the S accumulators in registers (a row = the 4 lanes of a
//                            quad); O and ℓ rescaled only when a row's max jumps by > 2^8
//   O += P·V_j               P re-used from the S accumulators as A fragments
// while K/V block j+1 arrives by cp.async into the other of two buffers. With the
// causal mask the query blocks with the most K/V blocks start first.
// Decoding shapes run too: N queries against N_kv keys (the queries the last N
// positions) and grouped-query attention (H/H_kv query heads reading one K/V head) —
// with one thread block per query block, which is what step 08 is about.
//
// How each of these was found, one measured step at a time, is note 06's lesson; the
// versions it measures are versions_forward.cu.
#include <cstdint>

#include "common/cuda_check.cuh"
#include "steps/02_fused/tile.hpp"
#include "steps/03_online_softmax/online_softmax.hpp"
#include "steps/06_tensor_cores/mma.cuh"
#include "steps/06_tensor_cores/step06.hpp"

namespace fa::step06 {
namespace {

template <class T, int kD, bool kCausal>
__global__ void __launch_bounds__(forward_tile(kCausal, kD).threads())
    forward_kernel(int N, int Nk, int H, int group, bool causal, float scale, const T* __restrict__ q,
                   const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o, float* __restrict__ lse) {
#if FA_STEP06_ARCH_OK  // compiled out before sm_80 (mma.cuh)
  constexpr FwdTile kTile = forward_tile(kCausal, kD);  // the block shape: step06.hpp
  constexpr int kMT = kTile.m_tiles, kBc = kTile.keys, kRows = kTile.rows(), kThreads = kTile.threads();
  constexpr int kW = smem_cols(kD);  // a shared tile's columns
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* Qs = reinterpret_cast<T*>(smem_raw);  // [kRows][kW], swizzled
  T* Ks = Qs + kRows * kW;                 // [2][kBc][kW]: two buffers
  T* Vs = Ks + 2 * kBc * kW;               // [2][kBc][kW]

  require_aligned_smem(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // The grid is (heads, query blocks); block y takes query block T_r − 1 − y, so with the
  // causal mask the blocks with the most K/V blocks to visit start first in every head.
  const int i = gridDim.y - 1 - blockIdx.y, bh = blockIdx.x;
  const int q0 = i * kRows, r0 = 16 * kMT * warp;  // this warp's first row in the block
  const std::size_t head = std::size_t(bh) * N * kD;
  // The K/V head this query head reads (grouped-query attention: H/group K/V heads a
  // batch), and the position offset: query row r sits at position r + Nk − N.
  const std::size_t kv_head = std::size_t(bh / H * (H / group) + bh % H / group) * Nk * kD;
  const int off = Nk - N;
  // exp(scale·(s − m)) = 2^(s·mul − m·mul): m is kept in units of s.
  const float mul = scale * kLog2e;

  float acc[kMT][kD / 8][4] = {};  // O: [m-tile][8-column n-tile][register] (rows g, g+8 × columns 2t, 2t+1)
  float m[kMT][2], l[kMT][2];      // [m-tile][row g, g+8]: the running max (in units of s) and
                                   // this lane's part of ℓ (the quad's parts are added at the end)
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
  const int last = tiles::last_kv_block(N, causal, i, kRows, kBc, Nk);

  // Prologue: Q_i and the first K/V block, one group of copies.
  copy_tile_async<kThreads, kD, kRows>(Qs, q + head + std::size_t(q0) * kD, N - q0);
  copy_tile_async<kThreads, kD, kBc>(Ks, k + kv_head, Nk);
  copy_tile_async<kThreads, kD, kBc>(Vs, v + kv_head, Nk);
  cp_async_commit();

  // Main loop over the K/V blocks.
  for (int j = 0; j <= last; ++j) {
    const int k0 = j * kBc, buf = j % 2;
    begin_block(j + 1, last + 1, [&] {  // block j+1 into the other buffer
      const int k1 = k0 + kBc;
      copy_tile_async<kThreads, kD, kBc>(Ks + (1 - buf) * kBc * kW, k + kv_head + std::size_t(k1) * kD, Nk - k1);
      copy_tile_async<kThreads, kD, kBc>(Vs + (1 - buf) * kBc * kW, v + kv_head + std::size_t(k1) * kD, Nk - k1);
    });

    // S = Q_i·K_jᵀ: the warp's 16·kMT rows × kBc keys.
    float s[kMT][kBc / 8][4] = {};  // [m-tile][8-key n-tile][register]
    gemm_abt<T, kD, kMT, kBc / 8>(s, smem_u32(Qs), r0, smem_u32(Ks + buf * kBc * kW), 0);

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
    gemm_pv<T, kD, kMT, kBc>(acc, pa, smem_u32(Vs + buf * kBc * kW));
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
#endif
}

template <class T, int kD, bool kCausal>
void launch(const Problem& p, const NativeFwdArgs& a, Stream s) {
  constexpr FwdTile kTile = forward_tile(kCausal, kD);
  // Shared memory: Q_i and two buffers each of K_j, V_j.
  const std::size_t smem = std::size_t(kTile.rows() + 4 * kTile.keys) * smem_cols(kD) * sizeof(T);
  set_smem_limit(forward_kernel<T, kD, kCausal>, smem);
  const dim3 grid(unsigned(p.heads()), unsigned(tiles::q_blocks(p.N, kTile.rows())));
  forward_kernel<T, kD, kCausal><<<grid, kTile.threads(), smem, s>>>(
      p.N, p.keys(), p.H, p.group(), p.causal, p.softmax_scale(), static_cast<const T*>(a.q), static_cast<const T*>(a.k),
      static_cast<const T*>(a.v), static_cast<T*>(a.o), a.lse);
  FA_CHECK_LAUNCH();
}

template <int kD, bool kCausal>
void run_d(const Problem& p, const NativeFwdArgs& a, Stream s) {
  p.dtype == DType::bf16 ? launch<__nv_bfloat16, kD, kCausal>(p, a, s) : launch<__half, kD, kCausal>(p, a, s);
}

template <int kD>
void run_d(const Problem& p, const NativeFwdArgs& a, Stream s) {
  p.causal ? run_d<kD, true>(p, a, s) : run_d<kD, false>(p, a, s);
}

void run(const Problem& p, const NativeFwdArgs& a, void*, Stream s) {
  switch (p.d) {
    case 32: return run_d<32>(p, a, s);
    case 64: return run_d<64>(p, a, s);
    case 96: return run_d<96>(p, a, s);
    case 128: return run_d<128>(p, a, s);
    default: return run_d<256>(p, a, s);  // require_supported: d = 256
  }
}

}  // namespace

const GpuForward kForward{"step06 forward", 256, no_workspace, "", nullptr, run, kSupportedD, kMinSm, false, true};

}  // namespace fa::step06
