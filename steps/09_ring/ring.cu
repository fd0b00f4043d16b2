// Step 09 on one GPU: the ring of R ranks in one process. Each rank is two CUDA streams
// (one computes, one moves blocks) and its own tensors in device memory (rank.cuh); the
// hops are device-to-device copies standing in for the links. The local calls are the
// model's (local_calls), each on step 06's kernel, so the ring computes what the model
// computes, up to step 06's kernels' own order of fp32 sums.
//
// Per rank r and step s (blocks double-buffered, events per (rank, step) so that no wait
// ever refers to a record not yet issued):
//   forward:  copy stream: block s + 1 pulled from rank r − 1, issued before this
//             step's products so the hop runs under them, once its buffer is free (rank
//             r done with it at s − 1, rank r + 1 done pulling it); compute stream: once
//             block s is here, forward_step.
//   backward: the same K/V hops; backward_step, then the visiting block's dK and dV
//             pulled on by rank r + 1 once this step's calls are done — and home after
//             the last step.
#include <string>

#include "common/cuda_check.cuh"
#include "steps/09_ring/rank.cuh"

namespace fa::step09 {
namespace {

/// CUDA streams and events a ring needs: two streams a rank and its StepEvents,
/// released in one place.
class Sync {
 public:
  Sync(int ranks, int events) {
    streams_.resize(2 * ranks);
    for (auto& s : streams_) FA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int r = 0; r < ranks; ++r) events_.emplace_back(events, ranks);
  }
  Sync(const Sync&) = delete;
  Sync& operator=(const Sync&) = delete;
  ~Sync() {
    events_.clear();
    for (auto s : streams_) cudaStreamDestroy(s);
  }
  cudaStream_t compute(int r) const { return streams_[2 * r]; }
  cudaStream_t copy(int r) const { return streams_[2 * r + 1]; }
  /// Event `kind` of rank r at step s.
  void record(int kind, int r, int s, cudaStream_t on) const { events_[r].record(kind, s, on); }
  void wait(cudaStream_t on, int kind, int r, int s) const { events_[r].wait(on, kind, s); }

 private:
  std::vector<cudaStream_t> streams_;
  std::vector<StepEvents> events_;
};
enum Event { kArrived, kDone, kGradsArrived, kEvents };  // block s here; step s's calls done; its dK, dV here

/// The hops of K/V block s + 1 for every rank (rank r pulls from r − 1), on the copy
/// streams, issued before step s's products so that they run under them.
template <class Rank>
void pull_blocks(std::vector<Rank>& rank, const RankShape& sh, int s, const Sync& sync) {
  for (int r = 0; r < sh.ranks && s + 1 < sh.ranks; ++r) {
    const int src = kv_source(r, 1, sh.ranks);
    if (s > 0) {
      sync.wait(sync.copy(r), kDone, r, s - 1);                  // rank r is done with the buffer
      sync.wait(sync.copy(r), kArrived, (r + 1) % sh.ranks, s);  // rank r + 1 has pulled it
      sync.wait(sync.copy(r), kArrived, src, s);                 // the block is at rank r − 1
    }
    FA_CUDA_CHECK(cudaMemcpyAsync(rank[r].kv[(s + 1) % 2].get(), rank[src].kv[s % 2].get(),
                                  2 * sh.block * sizeof(std::uint16_t), cudaMemcpyDeviceToDevice, sync.copy(r)));
    sync.record(kArrived, r, s + 1, sync.copy(r));
  }
}

}  // namespace

ForwardOut gpu_forward(const Problem& p, const Qkv& in, int ranks) {
  require_gpu(p, ranks);
  const RankShape sh(p, ranks);
  std::vector<RankForward> rank;
  for (int r = 0; r < ranks; ++r) rank.emplace_back(sh, sh.rows(in.q, r, p.d), sh.kv_rows(in, r));
  const Sync sync(ranks, kEvents);
  for (int s = 0; s < ranks; ++s) {
    pull_blocks(rank, sh, s, sync);
    for (int r = 0; r < ranks; ++r) {
      if (s > 0) sync.wait(sync.compute(r), kArrived, r, s);
      forward_step(sh, r, s, rank[r], sync.compute(r));
      sync.record(kDone, r, s, sync.compute(r));
    }
  }
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  ForwardOut out{std::vector<float>(p.elems()), std::vector<float>(p.rows())};
  for (int r = 0; r < ranks; ++r) put_forward(sh, r, rank[r], out);
  return out;
}

Grads gpu_backward(const Problem& p, const Qkv& in, const ForwardOut& fwd, const std::vector<float>& dout, int ranks) {
  require_gpu(p, ranks);
  const RankShape sh(p, ranks);
  std::vector<RankBackward> rank;
  for (int r = 0; r < ranks; ++r)
    rank.emplace_back(sh, sh.rows(in.q, r, p.d), sh.kv_rows(in, r), sh.rows(fwd.o, r, p.d), sh.rows(fwd.lse, r, 1),
                      sh.rows(dout, r, p.d));
  const Sync sync(ranks, kEvents);
  for (int s = 0; s < ranks; ++s) {
    pull_blocks(rank, sh, s, sync);
    for (int r = 0; r < ranks; ++r) {
      const cudaStream_t st = sync.compute(r);
      if (s > 0) {
        sync.wait(st, kArrived, r, s);
        sync.wait(st, kGradsArrived, r, s);
      }
      backward_step(sh, r, s, rank[r], st);
      sync.record(kDone, r, s, st);
    }
    // dK, dV of the block each rank holds, on to the next rank once its calls are done
    // (rank r pulls from rank r − 1); after the last step that is the block's owner.
    for (int r = 0; r < ranks && ranks > 1; ++r) {
      const int src = kv_source(r, 1, ranks);
      const cudaStream_t cs = sync.copy(r);
      sync.wait(cs, kDone, src, s);
      if (s > 0) sync.wait(cs, kGradsArrived, (r + 1) % ranks, s);  // rank r + 1 has pulled the buffer
      float* to = s + 1 < ranks ? rank[r].dkv[(s + 1) % 2].get() : rank[r].home.get();
      FA_CUDA_CHECK(cudaMemcpyAsync(to, rank[src].dkv[s % 2].get(), 2 * sh.block * sizeof(float),
                                    cudaMemcpyDeviceToDevice, cs));
      if (s + 1 < ranks) sync.record(kGradsArrived, r, s + 1, cs);
    }
  }
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  Grads g{std::vector<float>(p.elems()), std::vector<float>(p.elems()), std::vector<float>(p.elems())};
  for (int r = 0; r < ranks; ++r) put_backward(sh, r, rank[r], g);
  return g;
}

}  // namespace fa::step09
