// Step 05 kernels: the backward, rebuilding P_ij and dS_ij on chip.
#include "steps/01_naive/step01.hpp"
#include "steps/02_fused/tile.cuh"
#include "steps/05_backward/recompute.hpp"
#include "steps/05_backward/step05.hpp"

namespace fa::step05 {
namespace {

using namespace tiles;

/// Shared-memory layout common to both kernels.
struct Smem {
  float *Qi, *dOi, *Kj, *Vj, *P, *dS, *Li, *Di;
  __device__ explicit Smem(float* base, int d) {
    const int ld = padded(d);
    Qi = base;
    dOi = Qi + kBr * ld;
    Kj = dOi + kBr * ld;
    Vj = Kj + kBc * ld;
    P = Vj + kBc * ld;           // [kBr][kBc + 1]
    dS = P + kBr * (kBc + 1);    // [kBr][kBc + 1]
    Li = dS + kBr * (kBc + 1);   // [kBr]
    Di = Li + kBr;               // [kBr]
  }
  static std::size_t bytes(int d) {
    return (std::size_t(2 * kBr + 2 * kBc) * padded(d) + 2 * kBr * (kBc + 1) + 2 * kBr) * sizeof(float);
  }
};

/// L_i and D_i for the block's rows (0 beyond N).
__device__ __forceinline__ void load_rows(float* dst, const float* __restrict__ src, int valid) {
  if (threadIdx.x < kBr) dst[threadIdx.x] = int(threadIdx.x) < valid ? src[threadIdx.x] : 0.0f;
}

/// P_ij and dS_ij into shared memory. Each thread rebuilds the cells (r, lane) of
/// its rows r, so the elementwise step needs no barrier.
__device__ __forceinline__ void recompute(const Smem& sm, int d, float scale, bool causal, int q0, int qv, int k0,
                                          int kv) {
  scores(sm.P, sm.Qi, sm.Kj, d, scale, [&](int r, int c, float s) {
    const bool masked = c >= kv || r >= qv || (causal && k0 + c > q0 + r);
    return masked ? -INFINITY : s;
  });
  scores(sm.dS, sm.dOi, sm.Vj, d, 1.0f, [](int, int, float s) { return s; });  // dP
#pragma unroll
  for (int kk = 0; kk < kRowsPerWarp; ++kk) {
    const int r = my_row(kk), at = r * (kBc + 1) + lane_id();
    const PdS x = rebuild(sm.P[at], sm.dS[at], sm.Li[r], sm.Di[r]);
    sm.P[at] = x.p, sm.dS[at] = x.ds;
  }
}

/// One thread block per (K/V block j, head): dK_j and dV_j in registers while
/// every query block that sees block j passes through.
template <int kD>
__global__ void __launch_bounds__(kThreads)
    dkdv_kernel(int N, int d, bool causal, float scale, const float* __restrict__ q, const float* __restrict__ k,
                const float* __restrict__ v, const float* __restrict__ lse, const float* __restrict__ D,
                const float* __restrict__ dout, float* __restrict__ dk, float* __restrict__ dv) {
  extern __shared__ float smem[];
  const Smem sm(smem, d);
  const int j = blockIdx.x, k0 = j * kBc, kv = valid_rows(N, j, kBc);
  const std::size_t head = std::size_t(blockIdx.y) * N * d, head_rows = std::size_t(blockIdx.y) * N;
  load_tile(sm.Kj, k + head + std::size_t(k0) * d, kBc, kv, d);
  load_tile(sm.Vj, v + head + std::size_t(k0) * d, kBc, kv, d);
  Acc<kD> dKj, dVj;
  dKj.zero();
  dVj.zero();

  for (int i = first_q_block(causal, j); i < q_blocks(N); ++i) {
    const int q0 = i * kBr, qv = valid_rows(N, i, kBr);
    __syncthreads();  // the previous Q_i, dO_i, P and dS are no longer read
    load_tile(sm.Qi, q + head + std::size_t(q0) * d, kBr, qv, d);
    load_tile(sm.dOi, dout + head + std::size_t(q0) * d, kBr, qv, d);
    load_rows(sm.Li, lse + head_rows + q0, qv);
    load_rows(sm.Di, D + head_rows + q0, qv);
    __syncthreads();
    recompute(sm, d, scale, causal, q0, qv, k0, kv);
    __syncthreads();  // the transposed products read columns of P and dS written by every warp
    accumulate<true>(dVj, sm.P, sm.dOi, d);   // dV_j += P_ijᵀ·dO_i
    accumulate<true>(dKj, sm.dS, sm.Qi, d);   // dK_j += dS_ijᵀ·Q_i  (scaled at the end)
  }
  store_tile(dKj, dk + head + std::size_t(k0) * d, kv, d, [&](int, float x) { return scale * x; });
  store_tile(dVj, dv + head + std::size_t(k0) * d, kv, d, [](int, float x) { return x; });
}

/// One thread block per (query block i, head): dQ_i in registers while the K/V
/// blocks that block i sees pass through.
template <int kD>
__global__ void __launch_bounds__(kThreads)
    dq_kernel(int N, int d, bool causal, float scale, const float* __restrict__ q, const float* __restrict__ k,
              const float* __restrict__ v, const float* __restrict__ lse, const float* __restrict__ D,
              const float* __restrict__ dout, float* __restrict__ dq) {
  extern __shared__ float smem[];
  const Smem sm(smem, d);
  const int i = blockIdx.x, q0 = i * kBr, qv = valid_rows(N, i, kBr);
  const std::size_t head = std::size_t(blockIdx.y) * N * d, head_rows = std::size_t(blockIdx.y) * N;
  load_tile(sm.Qi, q + head + std::size_t(q0) * d, kBr, qv, d);
  load_tile(sm.dOi, dout + head + std::size_t(q0) * d, kBr, qv, d);
  load_rows(sm.Li, lse + head_rows + q0, qv);
  load_rows(sm.Di, D + head_rows + q0, qv);
  Acc<kD> dQi;
  dQi.zero();

  for (int j = 0; j <= last_kv_block(N, causal, i); ++j) {
    const int k0 = j * kBc, kv = valid_rows(N, j, kBc);
    __syncthreads();  // the previous K_j, V_j, P and dS are no longer read
    load_tile(sm.Kj, k + head + std::size_t(k0) * d, kBc, kv, d);
    load_tile(sm.Vj, v + head + std::size_t(k0) * d, kBc, kv, d);
    __syncthreads();
    recompute(sm, d, scale, causal, q0, qv, k0, kv);
    __syncwarp();                     // dQ_i's rows read only the dS rows this warp wrote
    accumulate(dQi, sm.dS, sm.Kj, d);  // dQ_i += dS_ij·K_j  (scaled at the end)
  }
  store_tile(dQi, dq + head + std::size_t(q0) * d, qv, d, [&](int, float x) { return scale * x; });
}

void run(const Problem& p, const BwdArgs& a, void* ws, Stream s) {
  float* D = static_cast<float*>(ws);
  step01::launch_rowdot(p.rows(), p.d, a.dout, a.o, D, s);
  dispatch_d(p.d, [&](auto Dw) {
    constexpr int kD = decltype(Dw)::value;
    const std::size_t smem = Smem::bytes(p.d);
    set_smem_limit(dkdv_kernel<kD>, smem);
    set_smem_limit(dq_kernel<kD>, smem);
    const unsigned heads = unsigned(p.heads());
    dkdv_kernel<kD><<<dim3(kv_blocks(p.N), heads), kThreads, smem, s>>>(p.N, p.d, p.causal, p.softmax_scale(), a.q,
                                                                        a.k, a.v, a.lse, D, a.dout, a.dk, a.dv);
    FA_CHECK_LAUNCH();
    dq_kernel<kD><<<dim3(q_blocks(p.N), heads), kThreads, smem, s>>>(p.N, p.d, p.causal, p.softmax_scale(), a.q, a.k,
                                                                     a.v, a.lse, D, a.dout, a.dq);
    FA_CHECK_LAUNCH();
  });
}

}  // namespace

const GpuBackward kBackward{.name = "step05 backward",
                            .max_d = kMaxD,
                            .workspace_bytes = workspace_bytes,
                            .workspace_what = "D (B·H·N floats)",
                            .run = run};

}  // namespace fa::step05
