// Step 03 kernel: step 02's kernel with the online softmax in its block update.
#include "steps/03_online_softmax/block_update.cuh"
#include "steps/03_online_softmax/step03.hpp"

namespace fa::step03 {
namespace {

/// One thread block per (query block i, head): Q_i stays in shared memory, the
/// K/V blocks stream past it, (m, ℓ, O) stay on chip until the end.
template <int kD, bool kSoftmax>
__global__ void __launch_bounds__(kThreads)
    online_softmax_kernel(int N, int d, bool causal, float scale, const float* __restrict__ q,
                          const float* __restrict__ k, const float* __restrict__ v, float* __restrict__ o,
                          float* __restrict__ lse) {
  extern __shared__ float smem[];
  const ForwardSmem sm(smem, d);

  const int i = blockIdx.x, q0 = i * kBr;
  const std::size_t head = std::size_t(blockIdx.y) * N * d;
  load_tile(sm.Qi, q + head + std::size_t(q0) * d, kBr, valid_rows(N, i, kBr), d);
  Acc<kD> acc;
  acc.zero();
  RowStats st;
  st.init();

  for (int j = 0; j <= last_kv_block(N, causal, i); ++j) {
    const int k0 = j * kBc, kv = valid_rows(N, j, kBc);
    __syncthreads();  // the previous block's K_j, V_j and S are no longer read
    load_tile(sm.Kj, k + head + std::size_t(k0) * d, kBc, kv, d);
    load_tile(sm.Vj, v + head + std::size_t(k0) * d, kBc, kv, d);
    __syncthreads();  // Q_i, K_j and V_j are complete
    update_block<kD, kSoftmax>(acc, st, sm, q0, k0, kv, d, causal, scale);
  }

  // Epilogue: O = O / ℓ and L = m + log ℓ, the only writes to device memory.
  store_tile(acc, o + head + std::size_t(q0) * d, N - q0, d,
             [&](int kk, float x) { return kSoftmax ? x / st.l[kk] : x; });
  if (kSoftmax) store_lse(st, lse + std::size_t(blockIdx.y) * N + q0, N - q0);
}

template <bool kSoftmax>
void run(const Problem& p, const FwdArgs& a, void*, Stream s) {
  dispatch_d(p.d, [&](auto D) {
    constexpr int kD = decltype(D)::value;
    const auto kernel = online_softmax_kernel<kD, kSoftmax>;
    const std::size_t smem = ForwardSmem::bytes(p.d);
    set_smem_limit(kernel, smem);
    kernel<<<dim3(q_blocks(p.N), unsigned(p.heads())), kThreads, smem, s>>>(p.N, p.d, p.causal, p.softmax_scale(),
                                                                            a.q, a.k, a.v, a.o, a.lse);
    FA_CHECK_LAUNCH();
  });
}

}  // namespace

const GpuForward kForward{.name = "step03 forward", .max_d = kMaxD, .run = run<true>};
const GpuForward kForwardNoSoftmax{.name = "step03 forward (softmax compiled out)", .max_d = kMaxD, .run = run<false>};

}  // namespace fa::step03
