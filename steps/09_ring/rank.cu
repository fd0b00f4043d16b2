// One rank's device tensors and local calls (rank.cuh), shared by both rings.
#include "steps/09_ring/rank.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "common/cuda_check.cuh"
#include "common/gpu.hpp"
#include "common/gpu16.cuh"
#include "steps/06_tensor_cores/step06.hpp"
#include "steps/07_hopper/step07.hpp"

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

__global__ void fill_kernel(float* __restrict__ x, std::size_t n, float value) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    x[i] = value;
}

/// One chunk (0: early, 1: late) of every head of a rank's [B·H, 2c, width] tensor,
/// copied into a [B·H, c, width] one.
void copy_chunk(void* dst, const void* src, int chunk, std::size_t heads, int c, std::size_t row_bytes, cudaStream_t s) {
  const std::size_t chunk_bytes = std::size_t(c) * row_bytes;
  FA_CUDA_CHECK(cudaMemcpy2DAsync(dst, chunk_bytes, static_cast<const char*>(src) + chunk * chunk_bytes,
                                  2 * chunk_bytes, chunk_bytes, heads, cudaMemcpyDeviceToDevice, s));
}

/// Both chunks of a rank's tensor alone, [B·H, c, width] each.
template <class T>
void split_chunks(DeviceBuffer<T> (&out)[2], const DeviceBuffer<T>& x, const RankShape& sh, int width) {
  for (int i = 0; i < 2; ++i) {
    out[i] = DeviceBuffer<T>(x.size() / 2);
    copy_chunk(out[i].get(), x.get(), i, sh.heads, sh.c, std::size_t(width) * sizeof(T), nullptr);
  }
}

/// What a rank's side of a call is: its two chunks (2c rows a head) or one (its slot).
struct Side {
  bool both;
  int slot;  ///< 0 early, 1 late (one chunk)
};
Side side_of(const std::vector<int>& chunks, Chunks whose) {
  return chunks.size() == 2 ? Side{true, 0} : Side{false, chunks[0] == whose.early ? 0 : 1};
}

/// A call's shape and where its K, V are: the held block, or one of its chunks copied
/// out into kv1 (K then V).
struct CallSetup {
  Side qs, ks;
  Problem sub;
  const u16 *k, *v;
};
CallSetup set_up(const RankShape& sh, const LocalCall& call, Chunks mine, Chunks theirs, const u16* held, u16* kv1,
                 cudaStream_t st) {
  CallSetup x{side_of(call.q, mine), side_of(call.kv, theirs), {}, held, held + sh.block};
  x.sub = x.qs.both ? sh.whole : sh.half;
  x.sub.causal = call.causal;
  x.sub.scale = sh.p.softmax_scale();
  if (!x.ks.both) {
    const std::size_t row_bytes = std::size_t(sh.p.d) * sizeof(u16);
    copy_chunk(kv1, held, x.ks.slot, sh.heads, sh.c, row_bytes, st);
    copy_chunk(kv1 + sh.block / 2, held + sh.block, x.ks.slot, sh.heads, sh.c, row_bytes, st);
    x.k = kv1;
    x.v = kv1 + sh.block / 2;
  }
  return x;
}

}  // namespace

LocalKernels local_kernels(const Problem& p) {
  if (gpu::too_old(step07::kSm, true).empty() && takes_d(step07::kForward.max_d, step07::kForward.only_d, p.d))
    return {&step07::kForward, &step07::kBackward};
  return {&step06::kForward, &step06::kBackward};
}

StepEvents::StepEvents(int kinds, int steps) : steps_(steps), e_(std::size_t(kinds) * steps) {
  for (auto& e : e_) FA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}
StepEvents::~StepEvents() {
  for (auto e : e_) cudaEventDestroy(e);
}
void StepEvents::record(int kind, int step, cudaStream_t on) const {
  FA_CUDA_CHECK(cudaEventRecord(e_[std::size_t(kind) * steps_ + step], on));
}
void StepEvents::wait(cudaStream_t on, int kind, int step) const {
  FA_CUDA_CHECK(cudaStreamWaitEvent(on, e_[std::size_t(kind) * steps_ + step], 0));
}

RankShape::RankShape(const Problem& problem, int n_ranks)
    : p(problem), kernels(local_kernels(problem)), whole(problem), half(problem), ranks(n_ranks), c(problem.N / (2 * n_ranks)),
      heads(problem.heads()), block(problem.heads() * 2 * std::size_t(c) * problem.d) {
  whole.N = 2 * c;
  half.N = c;
}

std::vector<float> RankShape::rows(const std::vector<float>& x, int rank, int width) const {
  const Chunks mine = chunks_of(rank, ranks);
  return gather(x, heads, p.N, width, {mine.early, mine.late}, c);
}

std::vector<float> RankShape::kv_rows(const Qkv& in, int rank) const {
  std::vector<float> kv = rows(in.k, rank, p.d);
  const std::vector<float> v = rows(in.v, rank, p.d);
  kv.insert(kv.end(), v.begin(), v.end());
  return kv;
}

void require_gpu(const Problem& p, int ranks) {
  require_supported(p, ranks);
  std::string why;
  if (!gpu::available(&why)) throw Error("step09 needs a GPU: " + why);
  why = gpu::too_old(step06::kMinSm);
  if (!why.empty()) throw Error("step09 " + why);
}

RankBlocks::RankBlocks(const RankShape& sh, const std::vector<float>& q_rows, const std::vector<float>& kv_rows)
    : q(gpu::upload16(sh.p.dtype, q_rows)),
      kv{gpu::upload16(sh.p.dtype, kv_rows), DeviceBuffer<u16>(2 * sh.block)},
      kv1(sh.block),
      own(2 * sh.block) {
  split_chunks(q1, q, sh, sh.p.d);
  FA_CUDA_CHECK(cudaMemcpy(own.get(), kv[0].get(), own.size() * sizeof(u16), cudaMemcpyDeviceToDevice));
}

void RankBlocks::restore_own_block(cudaStream_t st) {
  FA_CUDA_CHECK(cudaMemcpyAsync(kv[0].get(), own.get(), own.size() * sizeof(u16), cudaMemcpyDeviceToDevice, st));
}

RankForward::RankForward(const RankShape& sh, const std::vector<float>& q_rows, const std::vector<float>& kv_rows)
    : RankBlocks(sh, q_rows, kv_rows),
      part_o(sh.block),
      o(std::vector<float>(sh.block, 0.0f)),
      lse(std::vector<float>(sh.heads * 2 * sh.c, -INFINITY)),
      part_lse(sh.heads * 2 * sh.c),
      ws(std::max(sh.kernels.forward->workspace_bytes(sh.whole), sh.kernels.forward->workspace_bytes(sh.half))) {
  FA_CUDA_CHECK(cudaDeviceSynchronize());  // the ring's streams do not wait for the default one
}

void RankForward::restart(cudaStream_t st) {
  restore_own_block(st);
  FA_CUDA_CHECK(cudaMemsetAsync(o.get(), 0, o.size() * sizeof(float), st));
  fill_kernel<<<256, 256, 0, st>>>(lse.get(), lse.size(), -INFINITY);
  FA_CHECK_LAUNCH();
}

void forward_step(const RankShape& sh, int rank, int step, RankForward& x, cudaStream_t st) {
  const Chunks mine = chunks_of(rank, sh.ranks), theirs = chunks_of(kv_source(rank, step, sh.ranks), sh.ranks);
  for (const LocalCall& call : local_calls(rank, step, sh.ranks, sh.p.causal)) {
    const CallSetup cs = set_up(sh, call, mine, theirs, x.kv[step % 2].get(), x.kv1.get(), st);
    const NativeFwdArgs args{cs.qs.both ? x.q.get() : x.q1[cs.qs.slot].get(), cs.k, cs.v, x.part_o.get(),
                             x.part_lse.get()};
    sh.kernels.forward->run_native(cs.sub, args, x.ws.get(), st);
    const RowMap map{cs.sub.N, cs.qs.both ? 0 : cs.qs.slot * sh.c, 2 * sh.c};
    const unsigned rows = unsigned(sh.heads * cs.sub.N);
    if (sh.p.dtype == DType::bf16)
      merge_kernel<__nv_bfloat16><<<rows, 128, 0, st>>>(x.o.get(), x.lse.get(), x.part_o.get(), x.part_lse.get(), map, sh.p.d);
    else
      merge_kernel<__half><<<rows, 128, 0, st>>>(x.o.get(), x.lse.get(), x.part_o.get(), x.part_lse.get(), map, sh.p.d);
    FA_CHECK_LAUNCH();
  }
}

RankBackward::RankBackward(const RankShape& sh, const std::vector<float>& q_rows, const std::vector<float>& kv_rows,
                           const std::vector<float>& o_rows, const std::vector<float>& lse_rows,
                           const std::vector<float>& dout_rows)
    : RankBlocks(sh, q_rows, kv_rows),
      o(gpu::upload16(sh.p.dtype, o_rows)),
      dout(gpu::upload16(sh.p.dtype, dout_rows)),
      lse(lse_rows),
      dq(std::vector<float>(sh.block, 0.0f)),
      dkv{DeviceBuffer<float>(std::vector<float>(2 * sh.block, 0.0f)), DeviceBuffer<float>(2 * sh.block)},
      home(2 * sh.block),
      gq(sh.block),
      gk(sh.block),
      gv(sh.block),
      ws(std::max(sh.kernels.backward->workspace_bytes(sh.whole), sh.kernels.backward->workspace_bytes(sh.half))) {
  split_chunks(o1, o, sh, sh.p.d);
  split_chunks(dout1, dout, sh, sh.p.d);
  split_chunks(lse1, lse, sh, 1);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
}

void RankBackward::restart(cudaStream_t st) {
  restore_own_block(st);
  FA_CUDA_CHECK(cudaMemsetAsync(dq.get(), 0, dq.size() * sizeof(float), st));
  FA_CUDA_CHECK(cudaMemsetAsync(dkv[0].get(), 0, dkv[0].size() * sizeof(float), st));
}

void backward_step(const RankShape& sh, int rank, int step, RankBackward& x, cudaStream_t st) {
  const auto accumulate = [&](float* acc, const u16* part, RowMap map) {
    const unsigned n = unsigned(sh.heads * map.rows);
    if (sh.p.dtype == DType::bf16)
      accumulate_kernel<__nv_bfloat16><<<n, 128, 0, st>>>(acc, part, map, sh.p.d);
    else
      accumulate_kernel<__half><<<n, 128, 0, st>>>(acc, part, map, sh.p.d);
    FA_CHECK_LAUNCH();
  };
  const Chunks mine = chunks_of(rank, sh.ranks), theirs = chunks_of(kv_source(rank, step, sh.ranks), sh.ranks);
  float* grads = x.dkv[step % 2].get();  // the visiting block's dK, then dV
  for (const LocalCall& call : local_calls(rank, step, sh.ranks, sh.p.causal)) {
    const CallSetup cs = set_up(sh, call, mine, theirs, x.kv[step % 2].get(), x.kv1.get(), st);
    const bool both = cs.qs.both;
    const int slot = cs.qs.slot;
    const NativeBwdArgs args{both ? x.q.get() : x.q1[slot].get(),       cs.k, cs.v,
                             both ? x.o.get() : x.o1[slot].get(),       both ? x.lse.get() : x.lse1[slot].get(),
                             both ? x.dout.get() : x.dout1[slot].get(), x.gq.get(), x.gk.get(), x.gv.get()};
    sh.kernels.backward->run_native(cs.sub, args, x.ws.get(), st);
    accumulate(x.dq.get(), x.gq.get(), RowMap{cs.sub.N, both ? 0 : slot * sh.c, 2 * sh.c});
    const RowMap kmap{cs.sub.N, cs.ks.both ? 0 : cs.ks.slot * sh.c, 2 * sh.c};
    accumulate(grads, x.gk.get(), kmap);
    accumulate(grads + sh.block, x.gv.get(), kmap);
  }
}

void put_forward(const RankShape& sh, int rank, const RankForward& x, ForwardOut& out) {
  const Chunks mine = chunks_of(rank, sh.ranks);
  put_rows(out.o, x.o.download(), sh.heads, sh.p.N, sh.p.d, mine, sh.c, sh.p.dtype);
  put_rows(out.lse, x.lse.download(), sh.heads, sh.p.N, 1, mine, sh.c, DType::fp32);
}

void put_backward(const RankShape& sh, int rank, const RankBackward& x, Grads& g) {
  const Chunks mine = chunks_of(rank, sh.ranks);
  const auto n = std::ptrdiff_t(sh.block);
  put_rows(g.dq, x.dq.download(), sh.heads, sh.p.N, sh.p.d, mine, sh.c, sh.p.dtype);
  const std::vector<float> kv = x.own_dkv(sh.ranks).download();
  put_rows(g.dk, std::vector<float>(kv.begin(), kv.begin() + n), sh.heads, sh.p.N, sh.p.d, mine, sh.c, sh.p.dtype);
  put_rows(g.dv, std::vector<float>(kv.begin() + n, kv.end()), sh.heads, sh.p.N, sh.p.d, mine, sh.c, sh.p.dtype);
}

}  // namespace fa::step09
