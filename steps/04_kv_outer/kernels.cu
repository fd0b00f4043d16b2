// Step 04 kernel: step 03's block update, K/V blocks outer, Q blocks inner.
#include "common/cuda_check.cuh"
#include "common/gpu.hpp"
#include "steps/03_online_softmax/block_update.cuh"
#include "steps/04_kv_outer/step04.hpp"

namespace fa::step04 {
namespace {

using namespace tiles;
using step03::RowStats;

/// One thread block per (group of G query blocks, head).
template <int kD>
__global__ void __launch_bounds__(kThreads)
    kv_outer_kernel(int N, int d, bool causal, float scale, int G, const float* __restrict__ q,
                    const float* __restrict__ k, const float* __restrict__ v, float* __restrict__ o,
                    float* __restrict__ lse, float* __restrict__ m_hbm, float* __restrict__ l_hbm) {
  extern __shared__ float smem[];
  const ForwardSmem sm(smem, d);

  const int Tr = q_blocks(N);
  const int i_begin = blockIdx.x * G, i_end = min(Tr, i_begin + G);
  const std::size_t head = std::size_t(blockIdx.y) * N * d, head_rows = std::size_t(blockIdx.y) * N;

  for (int j = 0; j <= last_kv_block(N, causal, i_end - 1); ++j) {  // outer: K/V blocks
    const int k0 = j * kBc, kv = valid_rows(N, j, kBc);
    __syncthreads();  // the last Q_i, K_j, V_j and S are no longer read
    load_tile(sm.Kj, k + head + std::size_t(k0) * d, kBc, kv, d);
    load_tile(sm.Vj, v + head + std::size_t(k0) * d, kBc, kv, d);

    for (int i = i_begin; i < i_end; ++i) {  // inner: the group's query blocks reuse K_j, V_j
      if (j > last_kv_block(N, causal, i)) continue;  // above the diagonal: skipped
      const int q0 = i * kBr;
      __syncthreads();  // the previous Q_i and S are no longer read
      load_tile(sm.Qi, q + head + std::size_t(q0) * d, kBr, valid_rows(N, i, kBr), d);

      // (m_i, ℓ_i, O_i): fresh at the first K/V block, else back from device memory.
      // Each thread reads exactly the rows and columns it will update and write.
      Acc<kD> acc;
      acc.zero();
      RowStats st;
      st.init();
      if (j > 0) {
#pragma unroll
        for (int kk = 0; kk < kRowsPerWarp; ++kk) {
          const int r = my_row(kk);
          if (q0 + r >= N) continue;
          st.m[kk] = m_hbm[head_rows + q0 + r];
          st.l[kk] = l_hbm[head_rows + q0 + r];
#pragma unroll
          for (int u = 0; u < kD / 32; ++u) {
            const int c = lane_id() + 32 * u;
            if (c < d) acc.v[kk][u] = o[head + std::size_t(q0 + r) * d + c];
          }
        }
      }
      __syncthreads();  // Q_i (and on the first pass K_j, V_j) complete
      step03::update_block<kD, true>(acc, st, sm, q0, k0, kv, d, causal, scale);

      // Back to device memory: normalised with L at the last block, raw otherwise.
      const bool last = j == last_kv_block(N, causal, i);
      store_tile(acc, o + head + std::size_t(q0) * d, N - q0, d,
                 [&](int kk, float x) { return last ? x / st.l[kk] : x; });
      if (last) {
        step03::store_lse(st, lse + head_rows + q0, N - q0);
      } else {
#pragma unroll
        for (int kk = 0; kk < kRowsPerWarp; ++kk)
          if (q0 + my_row(kk) < N && lane_id() == 0) {
            m_hbm[head_rows + q0 + my_row(kk)] = st.m[kk];
            l_hbm[head_rows + q0 + my_row(kk)] = st.l[kk];
          }
      }
    }
  }
}

void launch(const Problem& p, const FwdArgs& a, void* ws, Stream s, int G) {
  float* m_hbm = static_cast<float*>(ws);
  float* l_hbm = m_hbm + p.rows();
  dispatch_d(p.d, [&](auto D) {
    constexpr int kD = decltype(D)::value;
    const std::size_t smem = ForwardSmem::bytes(p.d);
    set_smem_limit(kv_outer_kernel<kD>, smem);
    const dim3 grid(ceil_div(q_blocks(p.N), G), unsigned(p.heads()));
    kv_outer_kernel<kD><<<grid, kThreads, smem, s>>>(p.N, p.d, p.causal, p.softmax_scale(), G, a.q, a.k, a.v, a.o,
                                                     a.lse, m_hbm, l_hbm);
    FA_CHECK_LAUNCH();
  });
}

void run_default(const Problem& p, const FwdArgs& a, void* ws, Stream s) {
  launch(p, a, ws, s, default_group(p, gpu::sm_count()));
}
void run_algorithm1(const Problem& p, const FwdArgs& a, void* ws, Stream s) { launch(p, a, ws, s, q_blocks(p.N)); }
std::size_t workspace(const Problem& p) { return 2 * p.rows() * sizeof(float); }

}  // namespace

const GpuForward kForward{.name = "step04 forward",
                          .max_d = kMaxD,
                          .workspace_bytes = workspace,
                          .workspace_what = "m and l (2·B·H·N floats)",
                          .run = run_default};
const GpuForward kForwardAlgorithm1{.name = "step04 forward (G = T_r)",
                                    .max_d = kMaxD,
                                    .workspace_bytes = workspace,
                                    .workspace_what = "m and l (2·B·H·N floats)",
                                    .run = run_algorithm1};

}  // namespace fa::step04
