// One rank of step 09's ring on its GPU: the device tensors of its rows and its local
// calls at one step. Shared by the ring in one process (ring.cu: R ranks on one GPU,
// device-to-device copies for the links) and the ring over NCCL (nccl.cu: one rank a
// process and a GPU). The two differ only in how a block gets from rank r − 1 to rank r;
// what a rank computes with it is written here, once.
//
// A rank's rows, per head: its early chunk, then its late chunk (c = N/(2R) rows each):
// [B·H, 2c, d]. A K/V block is K then V, [B·H, 2c, d] each. Single chunks, where a call
// takes one, are copied out per head (copy_chunk).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "common/device_buffer.cuh"
#include "common/problem.hpp"
#include "steps/09_ring/step09.hpp"

namespace fa::step09 {

/// One rank's CUDA events, one per (kind, step), created and released in one place: the
/// NCCL ring holds its own rank's, the one-GPU ring one table a rank.
class StepEvents {
 public:
  StepEvents(int kinds, int steps);
  StepEvents(StepEvents&& o) noexcept : steps_(o.steps_), e_(std::move(o.e_)) {}
  StepEvents(const StepEvents&) = delete;
  StepEvents& operator=(const StepEvents&) = delete;
  ~StepEvents();
  void record(int kind, int step, cudaStream_t on) const;
  void wait(cudaStream_t on, int kind, int step) const;  ///< on waits for the last record of (kind, step)

 private:
  int steps_;
  std::vector<cudaEvent_t> e_;
};

/// The shapes of a rank's work, and the kernels its calls run on.
struct RankShape {
  RankShape(const Problem& p, int ranks);
  Problem p;            ///< the whole problem (N rows)
  LocalKernels kernels;
  Problem whole, half;  ///< a call's shape on both chunks (2c rows) and on one (c rows)
  int ranks, c;
  std::size_t heads;
  std::size_t block;  ///< elements of a rank's K (or V, O, dQ, …): B·H · 2c · d
  /// A rank's rows of a [B·H, N, width] tensor, gathered: [B·H, 2c, width].
  std::vector<float> rows(const std::vector<float>& x, int rank, int width) const;
  /// A rank's own K/V block: its rows of K, then of V.
  std::vector<float> kv_rows(const Qkv& in, int rank) const;
};

/// What both passes hold: the rank's Q (both chunks, and each alone), the K/V block it
/// holds and the buffer for the one arriving (kv[s % 2] is held at step s), room for one
/// visiting chunk's K and V (kv1), and its own block kept for restarts.
struct RankBlocks {
  RankBlocks(const RankShape& sh, const std::vector<float>& q_rows, const std::vector<float>& kv_rows);
  DeviceBuffer<std::uint16_t> q, q1[2], kv[2], kv1, own;
  /// kv[0] its own block again, on st (a pass leaves another rank's block there).
  void restore_own_block(cudaStream_t st);
};

/// A rank's forward: RankBlocks, a call's (O, L), and the rank's (O, L) in fp32.
struct RankForward : RankBlocks {
  RankForward(const RankShape& sh, const std::vector<float>& q_rows, const std::vector<float>& kv_rows);
  DeviceBuffer<std::uint16_t> part_o;
  DeviceBuffer<float> o, lse, part_lse;
  DeviceBuffer<char> ws;  ///< the local kernel's workspace
  /// Back to the state before step 0, on st (its own block in kv[0], (O, L) empty): for
  /// timing repeats.
  void restart(cudaStream_t st);
};
/// Rank r's calls at step s on kv[s % 2] (rank kv_source(r, s)'s block), on the local
/// forward kernel, each merged into (o, lse) by merge_rows and merge_column.
void forward_step(const RankShape& sh, int rank, int step, RankForward& x, cudaStream_t st);

/// A rank's backward: RankBlocks, its rows of O, L, dO (both chunks, and each alone),
/// the visiting block's dK, dV in fp32 (dkv[s % 2] at step s,
/// dK then dV), where its own block's come home (`home`), and its dQ in fp32.
struct RankBackward : RankBlocks {
  RankBackward(const RankShape& sh, const std::vector<float>& q_rows, const std::vector<float>& kv_rows,
               const std::vector<float>& o_rows, const std::vector<float>& lse_rows, const std::vector<float>& dout_rows);
  DeviceBuffer<std::uint16_t> o, o1[2], dout, dout1[2];
  DeviceBuffer<float> lse, lse1[2];
  DeviceBuffer<float> dq, dkv[2], home;
  DeviceBuffer<std::uint16_t> gq, gk, gv;  ///< a call's gradients
  DeviceBuffer<char> ws;
  void restart(cudaStream_t st);  ///< as RankForward's: kv[0] its own block, dQ and its dK, dV zero
  /// dK then dV of the rank's own block once the pass is done: `home`, or with one rank
  /// the block that never left.
  const DeviceBuffer<float>& own_dkv(int ranks) const { return ranks > 1 ? home : dkv[0]; }
};
/// Rank r's calls at step s on kv[s % 2], on the local backward kernel with the final O, L:
/// dQ added into dq, dK and dV into dkv[s % 2].
void backward_step(const RankShape& sh, int rank, int step, RankBackward& x, cudaStream_t st);

/// The forward's results of rank r back in x's rows ([B·H, N, d] and [B·H, N]), O
/// rounded to p's type; and the backward's.
void put_forward(const RankShape& sh, int rank, const RankForward& x, ForwardOut& out);
void put_backward(const RankShape& sh, int rank, const RankBackward& x, Grads& g);

/// Throws fa::Error as require_supported does, and without a GPU step 06 runs on.
void require_gpu(const Problem& p, int ranks);

}  // namespace fa::step09
