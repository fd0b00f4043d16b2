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
// versions it measures are versions_forward.cu. The block's work is forward.cuh's
// forward_block, with its copies by cp.async (CpAsyncLoads).
#include <cstdint>

#include "common/cuda_check.cuh"
#include "steps/06_tensor_cores/forward.cuh"

namespace fa::step06 {
namespace {

template <class T, int kD, bool kCausal>
__global__ void __launch_bounds__(forward_tile(kCausal, kD).threads())
    forward_kernel(int N, int Nk, int H, int group, bool causal, float scale, const T* __restrict__ q,
                   const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o, float* __restrict__ lse) {
#if FA_MMA_ARCH_OK  // compiled out before sm_80 (common/cuda/mma.cuh)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  constexpr int kRows = forward_tile(kCausal, kD).rows();
  // The grid is (heads, query blocks); block y takes query block T_r − 1 − y, so with the
  // causal mask the blocks with the most K/V blocks to visit start first in every head.
  const int i = gridDim.y - 1 - blockIdx.y, bh = blockIdx.x;
  // The K/V head this query head reads (grouped-query attention: H/group K/V heads a batch).
  const std::size_t head = std::size_t(bh) * N * kD, q0 = std::size_t(i) * kRows;
  const std::size_t kv_head = std::size_t(bh / H * (H / group) + bh % H / group) * Nk * kD;
  const CpAsyncLoads<T, kD, kCausal> loads{q + head + q0 * kD, k + kv_head, v + kv_head, N - int(q0), Nk};
  forward_block<T, kD, kCausal>(loads, smem_raw, i, bh, N, Nk, causal, scale, o, lse);
#endif
}

template <class T, int kD, bool kCausal>
void launch(const Problem& p, const NativeFwdArgs& a, Stream s) {
  constexpr FwdTile kTile = forward_tile(kCausal, kD);
  const std::size_t smem = FwdSmem<T, kD, kCausal>::kBytes;  // Q_i and two buffers each of K_j, V_j
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

const GpuForward kForward{.name = "step06 forward",
                          .max_d = 256,
                          .run_native = run,
                          .only_d = kSupportedD,
                          .min_sm = kMinSm,
                          .decode = true};

}  // namespace fa::step06
