// Step 09 on one GPU: the ring of R ranks in one process. Each rank is two CUDA streams
// (one computes, one moves blocks) and its own slice of the tensors in device memory;
// the hops are device-to-device copies standing in for the links. The local calls are
// the model's (local_calls), each step 06's kernel, so the ring computes what the model
// computes, up to step 06's kernels' own order of fp32 sums.
//
// A rank's rows, per head: its early chunk, then its late chunk (c = N/(2R) rows each),
// [B·H, 2c, d]; single chunks, where a call takes one, are copied out per head
// (cudaMemcpy2DAsync). Per rank r and step s (blocks double-buffered, events per
// (rank, step) so that no wait ever refers to a record not yet issued):
//   forward:  copy stream: block s + 1 pulled from rank r − 1, issued before this
//             step's products so the hop runs under them, once its buffer is free (rank
//             r done with it at s − 1, rank r + 1 done pulling it); compute stream: once
//             block s is here, every call on step 06's forward and its (O, L) merged into
//             the rank's fp32 state (merge_kernel: merge_rows, merge_column).
//   backward: the same K/V hops; the calls on step 06's backward with the final O, L and
//             dO of the rank's rows; dQ added into the rank's fp32 accumulator, dK and dV
//             into the visiting block's (accumulate_kernel), which are pulled on by rank
//             r + 1 once this step's calls are done — and home after the last step.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "common/cuda_check.cuh"
#include "common/device_buffer.cuh"
#include "common/gpu.hpp"
#include "common/gpu16.cuh"
#include "steps/06_tensor_cores/step06.hpp"
#include "steps/09_ring/step09.hpp"

namespace fa::step09 {
namespace {

using u16 = std::uint16_t;

template <class T>
__device__ float to_float(u16 x);
template <>
__device__ float to_float<__nv_bfloat16>(u16 x) {
  return __bfloat162float(__ushort_as_bfloat16(x));
}
template <>
__device__ float to_float<__half>(u16 x) {
  return __half2float(__ushort_as_half(x));
}

/// Where a call's rows go in a rank's [B·H, 2c, d] tensors: `rows` rows a head
/// (2c, or c for one chunk) starting at row `first` of each head's 2c (0, or c for the
/// late chunk).
struct RowMap {
  int rows, first, two_c;
  __device__ std::size_t at(std::size_t row) const {  // row of the call → row of the rank
    return row / rows * two_c + first + row % rows;
  }
};

/// One block a row of the call: the row's weights (merge_rows) by every thread, its
/// columns by the threads in turn (merge_column); thread 0 writes the new L.
template <class T>
__global__ void merge_kernel(float* __restrict__ o, float* __restrict__ lse, const u16* __restrict__ part_o,
                             const float* __restrict__ part_lse, RowMap map, int d) {
  const std::size_t row = blockIdx.x, at = map.at(row);
  const RowMerge w = merge_rows(lse[at], part_lse[row]);
  for (int c = threadIdx.x; c < d; c += blockDim.x)
    o[at * d + c] = merge_column(w, o[at * d + c], to_float<T>(part_o[row * d + c]));
  __syncthreads();  // every thread has read lse[at]
  if (threadIdx.x == 0) lse[at] = w.L;
}

/// acc[map(row)] += part[row], a row a block: a call's 16-bit gradient rows into an fp32 accumulator.
template <class T>
__global__ void accumulate_kernel(float* __restrict__ acc, const u16* __restrict__ part, RowMap map, int d) {
  const std::size_t row = blockIdx.x, at = map.at(row);
  for (int c = threadIdx.x; c < d; c += blockDim.x) acc[at * d + c] += to_float<T>(part[row * d + c]);
}

/// CUDA streams and events a ring needs, released in one place.
class Sync {
 public:
  Sync(int ranks, int events) : ranks_(ranks) {
    streams_.resize(2 * ranks);
    for (auto& s : streams_) FA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    events_.resize(std::size_t(events) * ranks * ranks);
    for (auto& e : events_) FA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  Sync(const Sync&) = delete;
  Sync& operator=(const Sync&) = delete;
  ~Sync() {
    for (auto e : events_) cudaEventDestroy(e);
    for (auto s : streams_) cudaStreamDestroy(s);
  }
  cudaStream_t compute(int r) const { return streams_[2 * r]; }
  cudaStream_t copy(int r) const { return streams_[2 * r + 1]; }
  /// Event `kind` of rank r at step s.
  cudaEvent_t event(int kind, int r, int s) const { return events_[(std::size_t(kind) * ranks_ + r) * ranks_ + s]; }
  void record(int kind, int r, int s, cudaStream_t on) const { FA_CUDA_CHECK(cudaEventRecord(event(kind, r, s), on)); }
  void wait(cudaStream_t on, int kind, int r, int s) const { FA_CUDA_CHECK(cudaStreamWaitEvent(on, event(kind, r, s), 0)); }

 private:
  int ranks_;
  std::vector<cudaStream_t> streams_;
  std::vector<cudaEvent_t> events_;
};
enum Event { kArrived, kDone, kGradsArrived, kEvents };  // block s here; step s's calls done; its dK, dV here

/// One chunk (0: early, 1: late) of every head of a rank's [B·H, 2c, d] tensor, copied
/// into a [B·H, c, d] one.
void copy_chunk(void* dst, const void* src, int chunk, std::size_t heads, int c, std::size_t row_bytes, cudaStream_t s) {
  const std::size_t chunk_bytes = std::size_t(c) * row_bytes;
  FA_CUDA_CHECK(cudaMemcpy2DAsync(dst, chunk_bytes, static_cast<const char*>(src) + chunk * chunk_bytes,
                                  2 * chunk_bytes, chunk_bytes, heads, cudaMemcpyDeviceToDevice, s));
}

/// What a rank's side of a call is: its two chunks (2c rows a head) or one (its slot).
struct Side {
  bool both;
  int slot;  ///< 0 early, 1 late (one chunk)
};
Side side_of(const std::vector<int>& chunks, Chunks whose) {
  return chunks.size() == 2 ? Side{true, 0} : Side{false, chunks[0] == whose.early ? 0 : 1};
}

void require_gpu(const Problem& p, int ranks) {
  require_supported(p, ranks);
  std::string why;
  if (!gpu::available(&why)) throw Error("step09 needs a GPU: " + why);
  why = gpu::too_old(step06::kMinSm);
  if (!why.empty()) throw Error("step09 " + why);
}

/// The per-rank device tensors both passes use: the rank's rows of Q, its first K/V
/// block, the ring's two block buffers, room for one visiting chunk, and step 06's
/// workspace.
struct RankData {
  DeviceBuffer<u16> q, q1[2];  // [B·H, 2c, d]; its chunks alone
  DeviceBuffer<u16> kv[2];     // the block it holds, K then V ([B·H, 2c, d] each), double-buffered
  DeviceBuffer<u16> kv1;       // K then V of one chunk of the visiting block
  DeviceBuffer<char> ws;
};

}  // namespace

ForwardOut gpu_forward(const Problem& p, const Qkv& in, int ranks) {
  require_gpu(p, ranks);
  const int c = p.N / (2 * ranks), d = p.d;
  const std::size_t heads = p.heads(), row_bytes = std::size_t(d) * 2, block = heads * 2 * c * d;
  const bool bf16 = p.dtype == DType::bf16;
  std::vector<RankData> rank(ranks);
  std::vector<DeviceBuffer<float>> o, lse;
  Problem whole = p, half = p;  // the shapes of the calls: 2c rows, or one chunk
  whole.N = 2 * c;
  half.N = c;
  for (int r = 0; r < ranks; ++r) {
    const Chunks mine = chunks_of(r, ranks);
    RankData& x = rank[r];
    x.q = gpu::upload16(p.dtype, gather(in.q, heads, p.N, d, {mine.early, mine.late}, c));
    for (int i = 0; i < 2; ++i)
      x.q1[i] = gpu::upload16(p.dtype, gather(in.q, heads, p.N, d, {i == 0 ? mine.early : mine.late}, c));
    std::vector<float> kv = gather(in.k, heads, p.N, d, {mine.early, mine.late}, c);
    const std::vector<float> v = gather(in.v, heads, p.N, d, {mine.early, mine.late}, c);
    kv.insert(kv.end(), v.begin(), v.end());
    x.kv[0] = gpu::upload16(p.dtype, kv);
    x.kv[1] = DeviceBuffer<u16>(2 * block);
    x.kv1 = DeviceBuffer<u16>(block);
    x.ws = DeviceBuffer<char>(std::max(step06::kForward.workspace_bytes(whole), step06::kForward.workspace_bytes(half)));
    o.emplace_back(std::vector<float>(block, 0.0f));
    lse.emplace_back(std::vector<float>(heads * 2 * c, -INFINITY));
  }
  std::vector<DeviceBuffer<u16>> outs;  // a call's (O, L), each rank its own
  std::vector<DeviceBuffer<float>> out_lse;
  for (int r = 0; r < ranks; ++r) {
    outs.emplace_back(block);
    out_lse.emplace_back(heads * 2 * c);
  }
  Sync sync(ranks, kEvents);
  for (int s = 0; s < ranks; ++s) {
    // The hops of block s + 1, issued first so that they run under this step's products.
    for (int r = 0; r < ranks && s + 1 < ranks; ++r) {
      const int src = kv_source(r, 1, ranks), next = (s + 1) % 2;
      if (s > 0) {
        sync.wait(sync.copy(r), kDone, r, s - 1);                   // rank r is done with the buffer
        sync.wait(sync.copy(r), kArrived, (r + 1) % ranks, s);      // rank r + 1 has pulled it
        sync.wait(sync.copy(r), kArrived, src, s);                  // the block is at rank r − 1
      }
      FA_CUDA_CHECK(cudaMemcpyAsync(rank[r].kv[next].get(), rank[src].kv[s % 2].get(), 2 * block * sizeof(u16),
                                    cudaMemcpyDeviceToDevice, sync.copy(r)));
      sync.record(kArrived, r, s + 1, sync.copy(r));
    }
    // This step's calls, rank by rank.
    for (int r = 0; r < ranks; ++r) {
      const cudaStream_t st = sync.compute(r);
      if (s > 0) sync.wait(st, kArrived, r, s);
      RankData& x = rank[r];
      const Chunks mine = chunks_of(r, ranks), theirs = chunks_of(kv_source(r, s, ranks), ranks);
      const u16* held = x.kv[s % 2].get();
      for (const LocalCall& call : local_calls(r, s, ranks, p.causal)) {
        const Side qs = side_of(call.q, mine), ks = side_of(call.kv, theirs);
        Problem sub = qs.both ? whole : half;
        sub.causal = call.causal;
        sub.scale = p.softmax_scale();
        const u16 *k = held, *v = held + block;
        if (!ks.both) {  // one chunk of the visiting block: copied out, K then V
          copy_chunk(x.kv1.get(), held, ks.slot, heads, c, row_bytes, st);
          copy_chunk(x.kv1.get() + block / 2, held + block, ks.slot, heads, c, row_bytes, st);
          k = x.kv1.get();
          v = x.kv1.get() + block / 2;
        }
        const NativeFwdArgs args{qs.both ? x.q.get() : x.q1[qs.slot].get(), k, v, outs[r].get(), out_lse[r].get()};
        step06::kForward.run_native(sub, args, x.ws.get(), st);
        const RowMap map{sub.N, qs.both ? 0 : qs.slot * c, 2 * c};
        const unsigned rows = unsigned(heads * sub.N);
        if (bf16)
          merge_kernel<__nv_bfloat16><<<rows, 128, 0, st>>>(o[r].get(), lse[r].get(), outs[r].get(), out_lse[r].get(), map, d);
        else
          merge_kernel<__half><<<rows, 128, 0, st>>>(o[r].get(), lse[r].get(), outs[r].get(), out_lse[r].get(), map, d);
        FA_CHECK_LAUNCH();
      }
      sync.record(kDone, r, s, st);
    }
  }
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  ForwardOut out{std::vector<float>(p.elems()), std::vector<float>(p.rows())};
  for (int r = 0; r < ranks; ++r) {
    put_rows(out.o, o[r].download(), heads, p.N, d, chunks_of(r, ranks), c, p.dtype);
    put_rows(out.lse, lse[r].download(), heads, p.N, 1, chunks_of(r, ranks), c, DType::fp32);
  }
  return out;
}

Grads gpu_backward(const Problem& p, const Qkv& in, const ForwardOut& fwd, const std::vector<float>& dout, int ranks) {
  require_gpu(p, ranks);
  const int c = p.N / (2 * ranks), d = p.d;
  const std::size_t heads = p.heads(), row_bytes = std::size_t(d) * 2, block = heads * 2 * c * d;
  const bool bf16 = p.dtype == DType::bf16;
  Problem whole = p, half = p;
  whole.N = 2 * c;
  half.N = c;
  // Per rank: its rows of Q, O, L, dO (both chunks, and each alone), its blocks and their
  // travelling dK, dV accumulators (fp32, [B·H, 2c, d] each, dK then dV), its dQ.
  struct Rows {
    DeviceBuffer<u16> o, dout, o1[2], dout1[2];
    DeviceBuffer<float> lse, lse1[2];
  };
  std::vector<RankData> rank(ranks);
  std::vector<Rows> rows(ranks);
  std::vector<DeviceBuffer<float>> dq, dkv[2], home;
  std::vector<DeviceBuffer<u16>> gq, gk, gv;  // a call's gradients, 16 bits
  for (int r = 0; r < ranks; ++r) {
    const Chunks mine = chunks_of(r, ranks);
    const std::vector<int> both{mine.early, mine.late};
    RankData& x = rank[r];
    Rows& y = rows[r];
    x.q = gpu::upload16(p.dtype, gather(in.q, heads, p.N, d, both, c));
    y.o = gpu::upload16(p.dtype, gather(fwd.o, heads, p.N, d, both, c));
    y.dout = gpu::upload16(p.dtype, gather(dout, heads, p.N, d, both, c));
    y.lse = DeviceBuffer<float>(gather(fwd.lse, heads, p.N, 1, both, c));
    for (int i = 0; i < 2; ++i) {
      const std::vector<int> one{i == 0 ? mine.early : mine.late};
      x.q1[i] = gpu::upload16(p.dtype, gather(in.q, heads, p.N, d, one, c));
      y.o1[i] = gpu::upload16(p.dtype, gather(fwd.o, heads, p.N, d, one, c));
      y.dout1[i] = gpu::upload16(p.dtype, gather(dout, heads, p.N, d, one, c));
      y.lse1[i] = DeviceBuffer<float>(gather(fwd.lse, heads, p.N, 1, one, c));
    }
    std::vector<float> kv = gather(in.k, heads, p.N, d, both, c);
    const std::vector<float> v = gather(in.v, heads, p.N, d, both, c);
    kv.insert(kv.end(), v.begin(), v.end());
    x.kv[0] = gpu::upload16(p.dtype, kv);
    x.kv[1] = DeviceBuffer<u16>(2 * block);
    x.kv1 = DeviceBuffer<u16>(block);
    x.ws = DeviceBuffer<char>(std::max(step06::kBackward.workspace_bytes(whole), step06::kBackward.workspace_bytes(half)));
    dq.emplace_back(std::vector<float>(block, 0.0f));
    dkv[0].emplace_back(std::vector<float>(2 * block, 0.0f));  // its own block's, from zero
    dkv[1].emplace_back(2 * block);
    home.emplace_back(2 * block);
    gq.emplace_back(block);
    gk.emplace_back(block);
    gv.emplace_back(block);
  }
  Sync sync(ranks, kEvents);
  const auto accumulate = [&](float* acc, const u16* part, RowMap map, cudaStream_t st) {
    const unsigned n = unsigned(heads * map.rows);
    if (bf16)
      accumulate_kernel<__nv_bfloat16><<<n, 128, 0, st>>>(acc, part, map, d);
    else
      accumulate_kernel<__half><<<n, 128, 0, st>>>(acc, part, map, d);
    FA_CHECK_LAUNCH();
  };
  for (int s = 0; s < ranks; ++s) {
    // K, V of block s + 1: as in the forward.
    for (int r = 0; r < ranks && s + 1 < ranks; ++r) {
      const int src = kv_source(r, 1, ranks), next = (s + 1) % 2;
      if (s > 0) {
        sync.wait(sync.copy(r), kDone, r, s - 1);
        sync.wait(sync.copy(r), kArrived, (r + 1) % ranks, s);
        sync.wait(sync.copy(r), kArrived, src, s);
      }
      FA_CUDA_CHECK(cudaMemcpyAsync(rank[r].kv[next].get(), rank[src].kv[s % 2].get(), 2 * block * sizeof(u16),
                                    cudaMemcpyDeviceToDevice, sync.copy(r)));
      sync.record(kArrived, r, s + 1, sync.copy(r));
    }
    for (int r = 0; r < ranks; ++r) {
      const cudaStream_t st = sync.compute(r);
      if (s > 0) {
        sync.wait(st, kArrived, r, s);
        sync.wait(st, kGradsArrived, r, s);
      }
      RankData& x = rank[r];
      const Rows& y = rows[r];
      const Chunks mine = chunks_of(r, ranks), theirs = chunks_of(kv_source(r, s, ranks), ranks);
      const u16* held = x.kv[s % 2].get();
      float* grads = dkv[s % 2][r].get();  // the visiting block's dK, then dV
      for (const LocalCall& call : local_calls(r, s, ranks, p.causal)) {
        const Side qs = side_of(call.q, mine), ks = side_of(call.kv, theirs);
        Problem sub = qs.both ? whole : half;
        sub.causal = call.causal;
        sub.scale = p.softmax_scale();
        const u16 *k = held, *v = held + block;
        if (!ks.both) {
          copy_chunk(x.kv1.get(), held, ks.slot, heads, c, row_bytes, st);
          copy_chunk(x.kv1.get() + block / 2, held + block, ks.slot, heads, c, row_bytes, st);
          k = x.kv1.get();
          v = x.kv1.get() + block / 2;
        }
        const NativeBwdArgs args{qs.both ? x.q.get() : x.q1[qs.slot].get(),
                                 k,
                                 v,
                                 qs.both ? y.o.get() : y.o1[qs.slot].get(),
                                 qs.both ? y.lse.get() : y.lse1[qs.slot].get(),
                                 qs.both ? y.dout.get() : y.dout1[qs.slot].get(),
                                 gq[r].get(),
                                 gk[r].get(),
                                 gv[r].get()};
        step06::kBackward.run_native(sub, args, x.ws.get(), st);
        accumulate(dq[r].get(), gq[r].get(), RowMap{sub.N, qs.both ? 0 : qs.slot * c, 2 * c}, st);
        const RowMap kmap{sub.N, ks.both ? 0 : ks.slot * c, 2 * c};
        accumulate(grads, gk[r].get(), kmap, st);
        accumulate(grads + block, gv[r].get(), kmap, st);
      }
      sync.record(kDone, r, s, st);
    }
    // dK, dV of the block each rank holds, on to the next rank once its calls are done
    // (rank r pulls from rank r − 1); after the last step that is the block's owner.
    for (int r = 0; r < ranks && ranks > 1; ++r) {
      const int src = kv_source(r, 1, ranks), next = (s + 1) % 2;
      const cudaStream_t cs = sync.copy(r);
      sync.wait(cs, kDone, src, s);
      if (s > 0) sync.wait(cs, kGradsArrived, (r + 1) % ranks, s);  // rank r + 1 has pulled the buffer
      float* to = s + 1 < ranks ? dkv[next][r].get() : home[r].get();
      FA_CUDA_CHECK(cudaMemcpyAsync(to, dkv[s % 2][src].get(), 2 * block * sizeof(float), cudaMemcpyDeviceToDevice, cs));
      if (s + 1 < ranks) sync.record(kGradsArrived, r, s + 1, cs);
    }
  }
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  Grads g{std::vector<float>(p.elems()), std::vector<float>(p.elems()), std::vector<float>(p.elems())};
  for (int r = 0; r < ranks; ++r) {
    const Chunks mine = chunks_of(r, ranks);
    put_rows(g.dq, dq[r].download(), heads, p.N, d, mine, c, p.dtype);
    const std::vector<float> kv = ranks > 1 ? home[r].download() : dkv[0][r].download();
    put_rows(g.dk, std::vector<float>(kv.begin(), kv.begin() + std::ptrdiff_t(block)), heads, p.N, d, mine, c, p.dtype);
    put_rows(g.dv, std::vector<float>(kv.begin() + std::ptrdiff_t(block), kv.end()), heads, p.N, d, mine, c, p.dtype);
  }
  return g;
}

}  // namespace fa::step09
