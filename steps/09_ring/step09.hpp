// Step 09 — ring attention: the merge rule across GPUs (context parallelism).
//
// Adds over step 08: step 08 merged partial states (O, L) of one row across thread
// blocks of one GPU; here across R GPUs, the ranks of a ring. When a sequence no longer
// fits one GPU, each rank keeps N/R rows of Q, K and V. The K/V blocks travel around the
// ring (rank r sends the block it holds to r + 1 and receives one from r − 1: R − 1
// hops), and at every step each rank runs its local attention kernel (step 07's on
// Hopper, step 06's before: local_kernels) on the block it holds and merges the partial
// (O, L) into its own by the course's rule (PKU "FlashAttention", the blockwise merge,
// p22–24). The backward sends dK and dV
// around with their K and V, back to the rank that owns them.
//
// Layout (zigzag, ring-flash-attention's): the sequence in 2R chunks of N/(2R) rows,
// rank r holding chunks r and 2R − 1 − r. With the causal mask a contiguous layout would
// give rank 0 a sliver of the work and rank R − 1 most of it (each step waits for the
// slowest); with an early and a late chunk on every rank every rank computes the same at
// every step: its own block at step 0 (one causal call), half a block after that — both
// its chunks against the visiting block's early chunk when that comes from a lower rank,
// its late chunk against both visiting chunks when it comes from a higher one. Without
// the mask every rank computes everything at every step, and the same layout serves.
//
// Three forms: the CPU model (model.cpp: R ranks simulated in one process, each local
// call step 06's CPU model on exactly the rows the kernel would see, the merge in fp32,
// the bytes each rank sends counted); R ranks on one GPU (ring.cu); one process a GPU
// over NCCL (nccl.hpp, started by ring09). The two GPU forms share a rank's work
// (rank.cuh). Limits: bf16 or fp16, step 06's head dimensions,
// self-attention (N_kv = N, H_kv = H), N divisible by 2R.
// Note: notes/09_ring.md.
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

/// One local call of the local kernel: rows of Q (this rank's chunks `q`, in order)
/// against the rows of the visiting K/V block (chunks `kv`), causal or not, as one
/// self-attention problem of |q|·N/(2R) rows — or, at the steps after the first with the
/// causal mask, one call per (query chunk, key chunk) pair of equal length.
struct LocalCall {
  std::vector<int> q, kv;  ///< global chunk indices, in the order they are concatenated
  bool causal;
};
/// The local calls of rank r at step s: step 0 its own block (causal: the concatenated
/// chunks' causal mask is the global one: early before late); later steps, causal: the
/// visible (query chunk, key chunk) pairs, none on the diagonal; not causal: everything.
std::vector<LocalCall> local_calls(int rank, int step, int ranks, bool causal);

/// Throws fa::Error unless p is bf16 or fp16 self-attention with a d step 06 takes, R ≥ 1
/// and N divisible by 2R.
void require_supported(const Problem& p, int ranks);

/// The merge of two finished partial results of one row over disjoint keys, (O, L) and
/// (O_new, L_new), O normalised: the merge rule with each part the state (m = its L,
/// ℓ = 1, its O), since e^L is its sum of exponentials. L = −∞ is the empty part (weight
/// 0). One copy for the CPU model and the kernel: the row's two weights and its new L,
/// then every column by merge_column.
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

/// What the model returns beyond the result: the bytes each rank sent (16-bit K, V; in
/// the backward also dK, dV in fp32), and the query-key pairs each rank computed per
/// step (load balance).
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

/// CPU model of the ring forward over R ranks: each local call step 06's model on the
/// gathered rows (inputs, P and its O rounded as the kernel rounds), each rank's (O, L)
/// kept in fp32 and merged after every call, O rounded to p.dtype at the end.
RingForward model_forward(const Problem& p, const Qkv& in, int ranks);
/// CPU model of the ring backward: each local call step 06's backward model on the
/// gathered rows with the final O and L of those rows (so P = e^(S − L) is the full
/// softmax, restricted to the visiting keys); dQ summed per rank in fp32 over its calls,
/// dK and dV summed in fp32 as they travel (the owner's first, then r + 1, …), every
/// gradient rounded to p.dtype at the end.
RingBackward model_backward(const Problem& p, const Qkv& in, const ForwardOut& fwd, const std::vector<float>& dout,
                            int ranks);

/// The rows of `chunks` (global chunk indices, c rows each) of every head of x, a
/// [B·H, N, width] tensor, concatenated per head: [B·H, |chunks|·c, width] — what a
/// rank hands a call, or uploads.
std::vector<float> gather(const std::vector<float>& x, std::size_t heads, int N, int width, const std::vector<int>& chunks,
                          int c);
/// The inverse for a rank's result: its [B·H, 2c, width] rows (early chunk, then late)
/// into x at its chunks, rounded to t (fp32: as they are).
void put_rows(std::vector<float>& x, const std::vector<float>& rank, std::size_t heads, int N, int width,
              const Chunks& mine, int c, DType t);

/// The local kernels of the rings on GPUs: step 07's where they run (an sm_90 GPU and a
/// d step 07 takes), step 06's elsewhere; chosen for the current GPU (rank.cu).
struct LocalKernels {
  const GpuForward* forward;
  const GpuBackward* backward;
};
LocalKernels local_kernels(const Problem& p);

/// The ring on one GPU (ring.cu; CUDA builds): R ranks as R pairs of CUDA streams, each
/// with its slice of the tensors in device memory, the hops device-to-device copies
/// issued under the products; the local calls those of the model, on local_kernels(p),
/// merged by merge_kernel (merge_rows, merge_column). Throws fa::Error as
/// require_supported does, and without a GPU step 06 runs on (sm_80 and newer).
ForwardOut gpu_forward(const Problem& p, const Qkv& in, int ranks);
Grads gpu_backward(const Problem& p, const Qkv& in, const ForwardOut& fwd, const std::vector<float>& dout, int ranks);

/// Bytes a rank sends in one pass: forward (R − 1) hops of its K/V block (2 · B·H · N/R ·
/// d 16-bit elements); backward the same K/V hops and R hops of dK, dV in fp32 (the last
/// one home).
std::uint64_t sent_forward(const Problem& p, int ranks);
std::uint64_t sent_backward(const Problem& p, int ranks);

}  // namespace fa::step09
