// Step 09's ring over NCCL (nccl.hpp). Per rank and step s, blocks double-buffered as in
// the one-process ring, with one event per (step, kind) on this rank only — NCCL orders
// the two ranks of a hop itself:
//   link stream:    hop of K/V block s + 1 (send kv[s % 2], receive into kv[(s + 1) % 2]
//                   once step s − 1's calls are done with it); backward also, once
//                   step s's calls are done, the hop of the visiting block's dK, dV
//                   (the last one home);
//   compute stream: once block s (and its dK, dV) has arrived, forward_step / backward_step.
// Every rank issues the same hops in the same order: each ncclSend must meet an ncclRecv
// of the same count and type on its peer, and a send and a receive that must progress
// together go in one group (NCCL user guide, "Point-to-point communication").
#include "steps/09_ring/nccl.hpp"

#include <cstdlib>
#include <vector>

#include "common/cuda_check.cuh"

namespace fa::step09 {
namespace {

void nccl_check(ncclResult_t r, const char* what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  std::string msg = std::string("step09: NCCL ") + what + ": " + ncclGetErrorString(r);
  if (comm) msg += std::string(" (") + ncclGetLastError(comm) + ")";
  throw Error(msg);
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v) throw Error(std::string("step09: ") + name + " is not set: start the ranks with ring09 --ranks R -- <program>");
  return std::atoi(v);
}

// x ready on the compute stream (before step 0); block s here; step s's calls done; its
// dK, dV here; the last hop done (backward: dK, dV home).
enum Event { kReady, kArrived, kDone, kGradsArrived, kLast, kEvents };

/// K/V block s + 1 over the link, once step s − 1's calls are done with its buffer.
void next_block(const NcclRing& ring, const RankShape& sh, RankBlocks& x, int s, const StepEvents& ev) {
  if (s + 1 >= sh.ranks) return;
  if (s > 0) ev.wait(ring.link(), kDone, s - 1);
  ring.hop(x.kv[s % 2].get(), x.kv[(s + 1) % 2].get(), 2 * sh.block * sizeof(std::uint16_t));
  ev.record(kArrived, s + 1, ring.link());
}

}  // namespace

NcclRing::NcclRing() : rank_(env_int(LaunchEnv::kRank)), ranks_(env_int(LaunchEnv::kRanks)) {
  const char* id = std::getenv(LaunchEnv::kId);
  if (!id) throw Error("step09: FA_NCCL_ID is not set: start the ranks with ring09");
  FA_CUDA_CHECK(cudaSetDevice(rank_));
  nccl_check(ncclCommInitRank(&comm_, ranks_, decode_id(id), rank_), "ncclCommInitRank");
  FA_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  FA_CUDA_CHECK(cudaStreamCreateWithFlags(&link_, cudaStreamNonBlocking));
}

NcclRing::~NcclRing() {
  cudaStreamSynchronize(link_);
  cudaStreamSynchronize(compute_);
  ncclCommDestroy(comm_);
  cudaStreamDestroy(link_);
  cudaStreamDestroy(compute_);
}

void NcclRing::hop(const void* send, void* recv, std::size_t bytes) const {
  const int next = (rank_ + 1) % ranks_, prev = (rank_ + ranks_ - 1) % ranks_;
  nccl_check(ncclGroupStart(), "ncclGroupStart");
  nccl_check(ncclSend(send, bytes, ncclUint8, next, comm_, link_), "ncclSend", comm_);
  nccl_check(ncclRecv(recv, bytes, ncclUint8, prev, comm_, link_), "ncclRecv", comm_);
  nccl_check(ncclGroupEnd(), "ncclGroupEnd", comm_);
}

double NcclRing::max_over_ranks(double x) const {
  DeviceBuffer<double> b(std::vector<double>{x});
  nccl_check(ncclAllReduce(b.get(), b.get(), 1, ncclFloat64, ncclMax, comm_, compute_), "ncclAllReduce", comm_);
  FA_CUDA_CHECK(cudaStreamSynchronize(compute_));
  return b.download()[0];
}

void nccl_forward(const NcclRing& ring, const RankShape& sh, RankForward& x) {
  const StepEvents ev(kEvents, sh.ranks);
  const cudaStream_t st = ring.compute();
  ev.record(kReady, 0, st);  // x is ready (restart is on st): the link may send kv[0]
  ev.wait(ring.link(), kReady, 0);
  for (int s = 0; s < sh.ranks; ++s) {
    next_block(ring, sh, x, s, ev);
    if (s > 0) ev.wait(st, kArrived, s);
    forward_step(sh, ring.rank(), s, x, st);
    ev.record(kDone, s, st);
  }
}

void nccl_backward(const NcclRing& ring, const RankShape& sh, RankBackward& x) {
  const StepEvents ev(kEvents, sh.ranks);
  const cudaStream_t st = ring.compute();
  ev.record(kReady, 0, st);
  ev.wait(ring.link(), kReady, 0);
  const std::size_t grad_bytes = 2 * sh.block * sizeof(float);
  for (int s = 0; s < sh.ranks; ++s) {
    next_block(ring, sh, x, s, ev);
    if (s > 0) {
      ev.wait(st, kArrived, s);
      ev.wait(st, kGradsArrived, s);
    }
    backward_step(sh, ring.rank(), s, x, st);
    ev.record(kDone, s, st);
    if (sh.ranks > 1) {  // the visiting block's dK, dV on to rank r + 1; after the last step, home
      ev.wait(ring.link(), kDone, s);
      ring.hop(x.dkv[s % 2].get(), s + 1 < sh.ranks ? x.dkv[(s + 1) % 2].get() : x.home.get(), grad_bytes);
      if (s + 1 < sh.ranks) ev.record(kGradsArrived, s + 1, ring.link());
    }
  }
  // The result is complete when both streams are: the compute stream waits for the last hop.
  ev.record(kLast, 0, ring.link());
  ev.wait(st, kLast, 0);
}

std::string encode_id(const ncclUniqueId& id) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (char c : id.internal) {
    const auto b = static_cast<unsigned char>(c);
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

ncclUniqueId decode_id(const std::string& hex) {
  ncclUniqueId id{};
  if (hex.size() != 2 * sizeof(id.internal)) throw Error("step09: FA_NCCL_ID has the wrong length");
  for (std::size_t i = 0; i < sizeof(id.internal); ++i)
    id.internal[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return id;
}

}  // namespace fa::step09
