// Step 09 across GPUs: the ring over NCCL, one rank a process and a GPU.
//
// Adds over the one-process ring (ring.cu): the links are real. Rank r sends the block
// it holds to rank r + 1 and receives the next from rank r − 1 with NCCL's point-to-point
// ncclSend / ncclRecv (one group a hop), on a second stream, so the next block is in
// flight while the current one is computed; what a rank computes is rank.cuh's, the same
// code as the one-process ring. Processes are started by `ring09` (launch.cpp), which
// gives each its rank in the environment (FA_RANK, FA_RANKS, FA_NCCL_ID).
#pragma once

#include <nccl.h>

#include <string>

#include "steps/09_ring/rank.cuh"

namespace fa::step09 {

/// This process's place in a ring started by ring09: its rank, the number of ranks, the
/// communicator (on GPU `rank`) and the two streams (products, links). Throws fa::Error
/// outside ring09 or when NCCL fails, with NCCL's own message.
class NcclRing {
 public:
  NcclRing();
  ~NcclRing();
  NcclRing(const NcclRing&) = delete;
  NcclRing& operator=(const NcclRing&) = delete;
  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  cudaStream_t compute() const { return compute_; }
  /// One hop: `bytes` of `send` to rank + 1, as many from rank − 1 into `recv`, on the link stream.
  void hop(const void* send, void* recv, std::size_t bytes) const;
  /// The largest of every rank's x (the slowest rank's time), on the host.
  double max_over_ranks(double x) const;
  cudaStream_t link() const { return link_; }
  ncclComm_t comm() const { return comm_; }

 private:
  int rank_ = 0, ranks_ = 1;
  ncclComm_t comm_{};
  cudaStream_t compute_{}, link_{};
};

/// This rank's forward over the ring: x holds its rows and own block (fresh or
/// restarted); afterwards x.o, x.lse are the rank's final (O, L). Returns once the
/// compute stream has been given everything (not synchronised).
void nccl_forward(const NcclRing& ring, const RankShape& sh, RankForward& x);
/// This rank's backward: afterwards x.dq and x.own_dkv(R) hold its gradients in fp32.
void nccl_backward(const NcclRing& ring, const RankShape& sh, RankBackward& x);

/// The environment ring09 gives a process, written and read in one place.
struct LaunchEnv {
  static constexpr const char* kRank = "FA_RANK";
  static constexpr const char* kRanks = "FA_RANKS";
  static constexpr const char* kId = "FA_NCCL_ID";  ///< the ncclUniqueId in hexadecimal
};
std::string encode_id(const ncclUniqueId& id);
ncclUniqueId decode_id(const std::string& hex);

}  // namespace fa::step09
