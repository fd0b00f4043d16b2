// Step 09 — ring attention: the merge rule across GPUs (context parallelism).
//
// Adds over step 08, which merged partial states (O, L) of a row across thread blocks:
// here across R GPUs, the ranks of a ring. Each rank keeps N/R rows of Q, K and V; the
// K/V blocks travel around the ring (R − 1 hops), and at every step each rank runs its
// local kernel (local_kernels) on the block it holds and merges the partial (O, L) into
// its own (PKU "FlashAttention", the blockwise merge, p22–24). The backward sends dK, dV
// along with their K, V, back to their owner. Layout: zigzag (rank r holds chunks r and
// 2R − 1 − r of 2R), so that every rank has the same causal work at every step.
// Forms: the CPU model (model.cpp), R ranks on one GPU (ring.cu), one process a GPU over
// NCCL (nccl.hpp); a rank's work is written once (rank.cuh). Limits: bf16 or fp16, step
// 06's head dimensions, self-attention, N divisible by 2R. Note: notes/09_ring.md.
#pragma once

#include <cstdint>
#include <vector>

#include "common/hbm.hpp"
#include "common/hd.hpp"
#include "common/problem.hpp"
#include "common/step_api.hpp"
#include "steps/03_online_softmax/online_softmax.hpp"

namespace fa::step09 {

/// The global chunks rank r holds: r and 2R − 1 − r, each N/(2R) rows.
struct Chunks {
  int early, late;
};
Chunks chunks_of(int rank, int ranks);
/// The rank whose K/V block rank r holds at step s: r − s (mod R).
int kv_source(int rank, int step, int ranks);

/// One call of the local kernel: this rank's query chunks `q` against the visiting
/// block's chunks `kv`, as one self-attention problem of |q|·N/(2R) rows.
struct LocalCall {
  std::vector<int> q, kv;  ///< global chunk indices, in the order they are concatenated
  bool causal;
};
/// Rank r's calls at step s: step 0 its own block (early before late: the global causal
/// mask); later, causal, the visible (query chunk, key chunk) pairs; else everything.
std::vector<LocalCall> local_calls(int rank, int step, int ranks, bool causal);

/// Throws fa::Error unless p fits the limits above and R ≥ 1.
void require_supported(const Problem& p, int ranks);

/// The merge of two finished parts of a row over disjoint keys, (O, L) and (O_new, L_new),
/// O normalised: each part is the state (m = L, ℓ = 1, O); L = −∞ is the empty part. One
/// copy for the model and the kernel: the weights and new L, then merge_column a column.
struct RowMerge {
  float w_old, w_new, L;  ///< O = w_old·O + w_new·O_new, both weights already divided by ℓ
};
FA_HD RowMerge merge_rows(float L, float L_new) {
  // exercise 09-merge: the weights of the two finished parts against their common maximum (online::merge_weights), divided by the merged ℓ, and the merged L; both parts empty (ℓ = 0): nothing changes
  // stub: (void)L_new;
  // stub: return {1.0f, 0.0f, L};
  const online::MergeWeights w = online::merge_weights(L, L_new);
  const float l = w.w1 + w.w2;
  if (l == 0.0f) return {1.0f, 0.0f, L};
  return {w.w1 / l, w.w2 / l, online::lse(w.m, l)};
  // end exercise
}
FA_HD float merge_column(const RowMerge& w, float o, float o_new) { return fmaf(w.w_old, o, w.w_new * o_new); }
/// The two above for a row of d columns on the CPU.
void merge_normalised(float& L, float* o, float L_new, const float* o_new, int d);

/// Beyond the result: the bytes each rank sent, and the query-key pairs it computed per
/// step (the load balance).
struct RingStats {
  std::vector<std::uint64_t> sent;                ///< [rank]: bytes
  std::vector<std::vector<std::uint64_t>> pairs;  ///< [step][rank]: query-key pairs of its calls
};
struct RingForward {
  ForwardOut out;
  RingStats stats;
};
struct RingBackward {
  Grads grads;
  RingStats stats;
};

/// CPU model of the ring forward: each call step 06's model on the gathered rows, each
/// rank's (O, L) kept in fp32 and merged after every call, O rounded at the end.
RingForward model_forward(const Problem& p, const Qkv& in, int ranks);
/// CPU model of the ring backward: each call step 06's backward model with the final O, L
/// (P = e^(S − L): the whole softmax); dQ, dK, dV summed in fp32 (dK, dV as they
/// travel, the owner's first), rounded at the end.
RingBackward model_backward(const Problem& p, const Qkv& in, const ForwardOut& fwd, const std::vector<float>& dout,
                            int ranks);

/// The rows of `chunks` (c rows each) of every head of x [B·H, N, width], concatenated
/// per head: [B·H, |chunks|·c, width].
std::vector<float> gather(const std::vector<float>& x, std::size_t heads, int N, int width, const std::vector<int>& chunks,
                          int c);
/// The inverse for a rank's [B·H, 2c, width] result, rounded to t.
void put_rows(std::vector<float>& x, const std::vector<float>& rank, std::size_t heads, int N, int width,
              const Chunks& mine, int c, DType t);

/// The local kernels on this GPU: step 07's where they run (sm_90), else step 06's.
struct LocalKernels {
  const GpuForward* forward;
  const GpuBackward* backward;
};
LocalKernels local_kernels(const Problem& p);

/// The ring on one GPU (ring.cu): R ranks as R pairs of streams, the hops
/// device-to-device copies under the products, the model's calls on local_kernels(p).
ForwardOut gpu_forward(const Problem& p, const Qkv& in, int ranks);
Grads gpu_backward(const Problem& p, const Qkv& in, const ForwardOut& fwd, const std::vector<float>& dout, int ranks);

/// Bytes a rank sends in a pass: R − 1 hops of its 16-bit K/V block; backward also R hops
/// of dK, dV in fp32 (the last one home).
std::uint64_t sent_forward(const Problem& p, int ranks);
std::uint64_t sent_backward(const Problem& p, int ranks);

}  // namespace fa::step09
