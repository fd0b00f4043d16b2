// Step 01 kernels: a tiled GEMM, a row softmax, and the elementwise pieces of the
// backward. Every intermediate (S, P, dP, dS) lives in device memory.
#include <cmath>

#include "common/cuda_check.cuh"
#include "common/reduce.cuh"
#include "steps/01_naive/step01.hpp"

namespace fa::step01 {
namespace {

constexpr int T = kTile;

/// Batched C = alpha·op(A)·op(B) (blockIdx.z picks the head). A 32×32 thread block
/// computes one 32×32 tile of C, one element per thread, staging 32×32 tiles of
/// A and B through shared memory (SGEMM_CUDA's kernel 3).
/// kTransA: A is stored K×M (we read Aᵀ); kTransB: B is stored Nc×K.
/// kZeroAboveDiagonal: C_mn = 0 for n > m (the no-softmax causal mask).
template <bool kTransA, bool kTransB, bool kZeroAboveDiagonal>
__global__ void gemm_kernel(int M, int Nc, int K, float alpha, const float* __restrict__ A, int lda,
                            long long strideA, const float* __restrict__ B, int ldb, long long strideB,
                            float* __restrict__ C, int ldc, long long strideC) {
  __shared__ float As[T][T + 1];  // As[m][k]; +1 column: the transposed stores hit 32 banks
  __shared__ float Bs[T][T + 1];  // Bs[k][n]
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int m0 = blockIdx.y * T, n0 = blockIdx.x * T;
  A += blockIdx.z * strideA;
  B += blockIdx.z * strideB;
  C += blockIdx.z * strideC;

  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += T) {
    // Loads: lane tx walks memory-contiguous addresses, so each warp reads 128
    // consecutive bytes whichever way the operand is stored. Outside the matrix: 0.
    if (!kTransA) {
      const int m = m0 + ty, k = k0 + tx;
      As[ty][tx] = (m < M && k < K) ? A[std::size_t(m) * lda + k] : 0.0f;
    } else {
      const int k = k0 + ty, m = m0 + tx;
      As[tx][ty] = (m < M && k < K) ? A[std::size_t(k) * lda + m] : 0.0f;
    }
    if (!kTransB) {
      const int k = k0 + ty, n = n0 + tx;
      Bs[ty][tx] = (k < K && n < Nc) ? B[std::size_t(k) * ldb + n] : 0.0f;
    } else {
      const int n = n0 + ty, k = k0 + tx;
      Bs[tx][ty] = (k < K && n < Nc) ? B[std::size_t(n) * ldb + k] : 0.0f;
    }
    __syncthreads();  // the tiles are complete before anyone reads them
#pragma unroll
    for (int k = 0; k < T; ++k) acc += As[ty][k] * Bs[k][tx];
    __syncthreads();  // everyone is done with the tiles before they are overwritten
  }
  const int m = m0 + ty, n = n0 + tx;
  if (m < M && n < Nc) C[std::size_t(m) * ldc + n] = (kZeroAboveDiagonal && n > m) ? 0.0f : alpha * acc;
}

/// One head's matrix inside a batched tensor: base pointer, leading dimension, head stride.
struct BatchedMat {
  const float* p;
  int ld;
  long long stride;
};

template <bool kTransA, bool kTransB, bool kZero = false>
void gemm(int M, int Nc, int K, float alpha, BatchedMat A, BatchedMat B, float* C, int ldc, long long strideC,
          int heads, Stream s) {
  const dim3 block(T, T), grid(ceil_div(Nc, T), ceil_div(M, T), heads);
  gemm_kernel<kTransA, kTransB, kZero>
      <<<grid, block, 0, s>>>(M, Nc, K, alpha, A.p, A.ld, A.stride, B.p, B.ld, B.stride, C, ldc, strideC);
  FA_CHECK_LAUNCH();
}

constexpr int kRowThreads = 256;

/// P = softmax(S) for one row per block (grid: N rows × B·H heads), and L = m + log ℓ.
/// Three passes over the row in device memory: max, sum of exponentials, write.
__global__ void softmax_rows_kernel(int N, bool causal, const float* __restrict__ S, float* __restrict__ P,
                                    float* __restrict__ L) {
  __shared__ float scratch[32];
  const int i = blockIdx.x;
  const std::size_t row = (std::size_t(blockIdx.y) * N + i) * N;
  const int vis = causal ? i + 1 : N;  // keys this query may see
  float m = -INFINITY;
  for (int j = threadIdx.x; j < vis; j += blockDim.x) m = fmaxf(m, S[row + j]);
  m = block_reduce(m, MaxOp{}, scratch, -INFINITY);
  float l = 0.0f;
  for (int j = threadIdx.x; j < vis; j += blockDim.x) l += expf(S[row + j] - m);
  l = block_reduce(l, SumOp{}, scratch, 0.0f);
  for (int j = threadIdx.x; j < N; j += blockDim.x) P[row + j] = j < vis ? expf(S[row + j] - m) / l : 0.0f;
  if (threadIdx.x == 0) L[std::size_t(blockIdx.y) * N + i] = m + logf(l);
}

/// Backward: P = exp(S − L) in place (S was computed into P's buffer).
__global__ void probabilities_kernel(int N, bool causal, float* __restrict__ P, const float* __restrict__ L) {
  const int i = blockIdx.x;
  const std::size_t row = (std::size_t(blockIdx.y) * N + i) * N;
  const float li = L[std::size_t(blockIdx.y) * N + i];
  const int vis = causal ? i + 1 : N;
  for (int j = threadIdx.x; j < N; j += blockDim.x) P[row + j] = j < vis ? expf(P[row + j] - li) : 0.0f;
}

/// Backward: D_i = Σ_c dO_ic·O_ic, one warp per row.
__global__ void rowdot_kernel(std::size_t rows, int d, const float* __restrict__ dO, const float* __restrict__ O,
                              float* __restrict__ D) {
  const std::size_t r = std::size_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  float s = 0.0f;
  for (int c = threadIdx.x % 32; c < d; c += 32) s += dO[r * d + c] * O[r * d + c];
  s = warp_reduce(s, SumOp{});
  if (threadIdx.x % 32 == 0) D[r] = s;
}

/// Backward: dS = P∘(dP − D), written over dP.
__global__ void dscores_kernel(int N, const float* __restrict__ P, float* __restrict__ dP, const float* __restrict__ D) {
  const int i = blockIdx.x;
  const std::size_t row = (std::size_t(blockIdx.y) * N + i) * N;
  const float di = D[std::size_t(blockIdx.y) * N + i];
  for (int j = threadIdx.x; j < N; j += blockDim.x) dP[row + j] = P[row + j] * (dP[row + j] - di);
}

std::size_t nn(const Problem& p) { return p.heads() * std::size_t(p.N) * p.N; }

void forward_run(const Problem& p, const FwdArgs& a, void* ws, Stream s) {
  const int N = p.N, d = p.d, heads = int(p.heads());
  const long long Nd = 1LL * N * d, NN = 1LL * N * N;
  float* S = static_cast<float*>(ws);
  float* P = S + nn(p);
  gemm<false, true>(N, N, d, p.softmax_scale(), {a.q, d, Nd}, {a.k, d, Nd}, S, N, NN, heads, s);
  softmax_rows_kernel<<<dim3(N, heads), kRowThreads, 0, s>>>(N, p.causal, S, P, a.lse);
  FA_CHECK_LAUNCH();
  gemm<false, false>(N, d, N, 1.0f, {P, N, NN}, {a.v, d, Nd}, a.o, d, Nd, heads, s);
}

void forward_nosoftmax_run(const Problem& p, const FwdArgs& a, void* ws, Stream s) {
  const int N = p.N, d = p.d, heads = int(p.heads());
  const long long Nd = 1LL * N * d, NN = 1LL * N * N;
  float* S = static_cast<float*>(ws);
  if (p.causal)
    gemm<false, true, true>(N, N, d, p.softmax_scale(), {a.q, d, Nd}, {a.k, d, Nd}, S, N, NN, heads, s);
  else
    gemm<false, true>(N, N, d, p.softmax_scale(), {a.q, d, Nd}, {a.k, d, Nd}, S, N, NN, heads, s);
  gemm<false, false>(N, d, N, 1.0f, {S, N, NN}, {a.v, d, Nd}, a.o, d, Nd, heads, s);
}

void backward_run(const Problem& p, const BwdArgs& a, void* ws, Stream s) {
  const int N = p.N, d = p.d, heads = int(p.heads());
  const long long Nd = 1LL * N * d, NN = 1LL * N * N;
  const float scale = p.softmax_scale();
  float* P = static_cast<float*>(ws);
  float* dP = P + nn(p);
  float* D = dP + nn(p);
  const dim3 rows_grid(N, heads);

  launch_rowdot(p.rows(), d, a.dout, a.o, D, s);
  gemm<false, true>(N, N, d, scale, {a.q, d, Nd}, {a.k, d, Nd}, P, N, NN, heads, s);  // S
  probabilities_kernel<<<rows_grid, kRowThreads, 0, s>>>(N, p.causal, P, a.lse);     // P = exp(S − L)
  FA_CHECK_LAUNCH();
  gemm<true, false>(N, d, N, 1.0f, {P, N, NN}, {a.dout, d, Nd}, a.dv, d, Nd, heads, s);  // dV = Pᵀ·dO
  gemm<false, true>(N, N, d, 1.0f, {a.dout, d, Nd}, {a.v, d, Nd}, dP, N, NN, heads, s);  // dP = dO·Vᵀ
  dscores_kernel<<<rows_grid, kRowThreads, 0, s>>>(N, P, dP, D);                        // dS over dP
  FA_CHECK_LAUNCH();
  gemm<false, false>(N, d, N, scale, {dP, N, NN}, {a.k, d, Nd}, a.dq, d, Nd, heads, s);  // dQ = scale·dS·K
  gemm<true, false>(N, d, N, scale, {dP, N, NN}, {a.q, d, Nd}, a.dk, d, Nd, heads, s);   // dK = scale·dSᵀ·Q
}

std::size_t forward_ws(const Problem& p) { return 2 * nn(p) * sizeof(float); }
std::size_t forward_nosoftmax_ws(const Problem& p) { return nn(p) * sizeof(float); }
std::size_t backward_ws(const Problem& p) { return (2 * nn(p) + p.rows()) * sizeof(float); }

}  // namespace

void launch_rowdot(std::size_t rows, int d, const float* dout, const float* o, float* D, Stream s) {
  rowdot_kernel<<<unsigned(ceil_div<std::size_t>(rows, 8)), 256, 0, s>>>(rows, d, dout, o, D);
  FA_CHECK_LAUNCH();
}

const GpuForward kForward{.name = "step01 forward",
                          .max_d = 0,
                          .workspace_bytes = forward_ws,
                          .workspace_what = "S and P (2·B·H·N² floats)",
                          .run = forward_run};
const GpuForward kForwardNoSoftmax{.name = "step01 forward (no softmax)",
                                   .max_d = 0,
                                   .workspace_bytes = forward_nosoftmax_ws,
                                   .workspace_what = "S (B·H·N² floats)",
                                   .run = forward_nosoftmax_run};
const GpuBackward kBackward{.name = "step01 backward",
                            .max_d = 0,
                            .workspace_bytes = backward_ws,
                            .workspace_what = "P and dP/dS (2·B·H·N² floats) and D",
                            .run = backward_run};

}  // namespace fa::step01
