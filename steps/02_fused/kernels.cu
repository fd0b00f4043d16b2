// Step 02 kernel: O = (scale·Q·Kᵀ)·V fused, S only ever in shared memory.
#include "steps/02_fused/step02.hpp"
#include "steps/02_fused/tile.cuh"

namespace fa::step02 {
namespace {

using namespace tiles;

/// One thread block per (query block i, head). Shared memory: Q_i, K_j, V_j and
/// the S tile (ForwardSmem); the B_r×d output tile lives in registers (Acc).
template <int kD>
__global__ void __launch_bounds__(kThreads)
    fused_kernel(int N, int d, bool causal, float scale, const float* __restrict__ q, const float* __restrict__ k,
                 const float* __restrict__ v, float* __restrict__ o) {
  extern __shared__ float smem[];
  const ForwardSmem sm(smem, d);

  const int i = blockIdx.x, q0 = i * kBr;
  const std::size_t head = std::size_t(blockIdx.y) * N * d;
  load_tile(sm.Qi, q + head + std::size_t(q0) * d, kBr, valid_rows(N, i, kBr), d);
  Acc<kD> acc;
  acc.zero();

  for (int j = 0; j <= last_kv_block(N, causal, i); ++j) {
    const int k0 = j * kBc, kv = valid_rows(N, j, kBc);
    __syncthreads();  // the previous block's K_j, V_j and S are no longer read
    load_tile(sm.Kj, k + head + std::size_t(k0) * d, kBc, kv, d);
    load_tile(sm.Vj, v + head + std::size_t(k0) * d, kBc, kv, d);
    __syncthreads();  // Q_i, K_j and V_j are complete
    scores(sm.S, sm.Qi, sm.Kj, d, scale, [&](int r, int c, float s) {
      const bool masked = c >= kv || (causal && k0 + c > q0 + r);
      return masked ? 0.0f : s;
    });
    __syncwarp();  // a warp reads back only the S rows it wrote itself
    accumulate(acc, sm.S, sm.Vj, d);
  }

  // Epilogue: the only write to device memory.
  store_tile(acc, o + head + std::size_t(q0) * d, N - q0, d, [](int, float x) { return x; });
}

void run(const Problem& p, const FwdArgs& a, void*, Stream s) {
  dispatch_d(p.d, [&](auto D) {
    constexpr int kD = decltype(D)::value;
    const std::size_t smem = ForwardSmem::bytes(p.d);
    set_smem_limit(fused_kernel<kD>, smem);
    fused_kernel<kD><<<dim3(q_blocks(p.N), unsigned(p.heads())), kThreads, smem, s>>>(
        p.N, p.d, p.causal, p.softmax_scale(), a.q, a.k, a.v, a.o);
    FA_CHECK_LAUNCH();
  });
}

}  // namespace

const GpuForward kForward{.name = "step02 forward (no softmax)", .max_d = kMaxD, .run = run};

}  // namespace fa::step02
