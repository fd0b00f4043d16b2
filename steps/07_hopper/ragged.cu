// Step 07 on a ragged batch: the tables of blocks its kernels read. Sequence b's rows are
// offsets[b] … offsets[b + 1] − 1 of the packed tensors; its blocks of `rows` rows are
// ⌈length/rows⌉, and a table lists every sequence's in order, so that tile u of a head is
// one entry and no tile holds rows of two sequences. One block builds the tables on the
// device from the offsets there (no copy back to the host, nothing synchronised): a prefix
// sum of the sequences' block counts gives each sequence its first entry. The tiles' order
// (TileOrder) is worked out there too, since only then is the number of blocks known. With
// the causal mask and long sequences the table goes by the blocks' weight across the batch
// (WeightOrder), as a dense batch's tiles go heaviest first across its heads.
#include <cub/block/block_scan.cuh>

#include "common/cuda_check.cuh"
#include "common/device_buffer.cuh"
#include "common/gpu.hpp"  // sm_count, l2_bytes
#include "steps/07_hopper/ragged.cuh"

namespace fa::step07 {
namespace {

constexpr int kThreads = 1024;  // sequences a round of the prefix sums

using Scan = cub::BlockScan<int, kThreads>;

struct Max {
  __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};

/// One thread's sequence of a round: its rows and its blocks, and where the sequence order
/// puts them (first: its first entry of the blocks' table; q_first: of the query blocks').
struct Seq {
  int b, start, length, count, first, q_count, q_first;
};

/// Offsets are not checked on the device: each is clamped to [0, T] and taken as the largest
/// of those up to it, so that the sequences never overlap, their lengths add up to at most T
/// and the tables fit max_blocks. (Rows outside every sequence are then left unwritten.)
/// f(seq) for every sequence, a round of kThreads at a time (f may hold __syncthreads: every
/// thread calls it each round, b ≥ sequences with no blocks). Returns the two tables' entries.
template <class F>
__device__ int2 for_each_sequence(const Ragged& r, int T, int rows, int q_rows, Scan::TempStorage& scan, F&& f) {
  __shared__ int base, q_base, last;  // the tables' entries before this round's sequences; their last end
  __syncthreads();                    // (the last caller's reads of base and q_base)
  if (threadIdx.x == 0) base = q_base = 0, last = min(max(r.offsets[0], 0), T);
  __syncthreads();
  for (int b0 = 0; b0 < r.sequences; b0 += kThreads) {
    const int b = b0 + int(threadIdx.x);
    const int end = b < r.sequences ? min(max(r.offsets[b + 1], 0), T) : 0;
    int start, top;  // start: the largest end before b's (or the round's last); top: the round's largest
    Scan(scan).ExclusiveScan(end, start, last, Max(), top);
    const int length = b < r.sequences ? max(end, start) - start : 0;
    __syncthreads();  // the scan's storage, again
    const int count = (length + rows - 1) / rows, q_count = q_rows ? (length + q_rows - 1) / q_rows : 0;
    int first, total, q_first, q_total;
    Scan(scan).ExclusiveSum(count, first, total);
    __syncthreads();  // the scan's storage, once more
    Scan(scan).ExclusiveSum(q_count, q_first, q_total);
    f(Seq{b, start, length, count, base + first, q_count, q_base + q_first});
    __syncthreads();  // every thread has read the bases, and the scan's storage is free again
    if (threadIdx.x == 0) base += total, q_base += q_total, last = max(last, top);
    __syncthreads();
  }
  return {base, q_base};
}

/// The order by weight (step07.hpp, kSortFromBlocks) by counting, not sorting: with n_k the
/// sequences of more than k blocks and s_k = n_0 + … + n_{k−1}, the sequence of rank r (by
/// block count, most first, then in order) puts its block of distance k at s_k + r (query
/// blocks, k ascending) or at entries − s_{k+1} + r (key blocks, k descending: a sequence's
/// key block j − 1 before j, as the deterministic mode's waits need). cnt, n, s: [capacity + 1]
/// ints of the workspace, capacity the most blocks a sequence may have (⌈T/rows⌉).
struct WeightOrder {
  int *cnt, *n, *s;
  int capacity;
  int most, entries;  // the longest sequence's blocks; the table's entries
  __device__ int at(bool key_blocks, int k, int rank) const {
    return key_blocks ? entries - (s[k] + n[k]) + rank : s[k] + rank;
  }
};

/// n and s from the histogram cnt (cnt[c]: the sequences of c blocks), the largest k first in
/// rounds of kThreads; cnt is zeroed for the ranks' counters.
__device__ void weight_sums(const WeightOrder& w, Scan::TempStorage& scan) {
  __shared__ int carry_n, carry_m;  // n_k and n_k + … + n_{most−1} at the last round's smallest k
  if (threadIdx.x == 0) carry_n = carry_m = 0;
  __syncthreads();
  for (int q0 = 0; q0 < w.most; q0 += kThreads) {
    const int q = q0 + int(threadIdx.x), k = w.most - 1 - q;  // k from most − 1 down
    int n, m, n_all, m_all;
    Scan(scan).InclusiveSum(q < w.most ? w.cnt[k + 1] : 0, n, n_all);
    n += carry_n;
    __syncthreads();
    Scan(scan).InclusiveSum(q < w.most ? n : 0, m, m_all);
    m += carry_m;  // n_k + … + n_{most−1}: s_k = entries − m
    if (q < w.most) w.n[k] = n, w.s[k] = w.entries - m;
    __syncthreads();
    if (threadIdx.x == 0) carry_n += n_all, carry_m += m_all;
    __syncthreads();
  }
  if (threadIdx.x == 0) w.n[w.most] = 0;
  for (int c = int(threadIdx.x); c <= w.most; c += kThreads) w.cnt[c] = 0;
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads)
    ragged_blocks_kernel(const Ragged r, int T, int rows, int q_rows, int units, bool causal, double bytes_a_unit,
                         double l2_bytes, int sms, RaggedTables out, int* taken, WeightOrder w) {
  __shared__ typename Scan::TempStorage scan;
  __shared__ int most;
  // The forward's grid, launched early (launch_early), may take its SMs now: it waits for this
  // grid to finish before it reads the tables.
  cudaTriggerProgrammaticLaunchCompletion();
  const bool key_blocks = q_rows != 0;  // the backward's table: key blocks
  if (causal) {                         // (the histogram of the block counts, below)
    if (threadIdx.x == 0) most = 0;
    for (int c = int(threadIdx.x); c <= w.capacity; c += kThreads) w.cnt[c] = 0;
  }
  // The tables in the sequences' order; with the mask, the histogram and the longest sequence too.
  const int2 entries = for_each_sequence(r, T, rows, q_rows, scan, [&](const Seq& q) {
    if (causal && q.count > 0) atomicAdd(&w.cnt[q.count], 1), atomicMax(&most, q.count);
    for (int i = 0; i < q.count; ++i) {
      out.blocks[q.first + i] = {i, q.start, q.length};
      if (key_blocks) out.q_first[q.first + i] = q.q_first;
    }
    for (int i = 0; i < q.q_count; ++i) out.q_blocks[q.q_first + i] = {i, q.start, q.length};
  });  // (it ends at a barrier: the histogram and `most` are whole)
  if (causal && most >= kSortFromBlocks) {  // the blocks' table again, by weight
    w.most = most, w.entries = entries.x;
    weight_sums(w, scan);
    const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
    for_each_sequence(r, T, rows, q_rows, scan, [&](const Seq& q) {
      // The rank: the sequences of more blocks, then those of as many before this one.
      const unsigned same = __match_any_sync(0xffffffffu, q.count);
      const int leader = __ffs(same) - 1, before = __popc(same & ((1u << lane) - 1));
      int rank = 0;
      const int warps = min(kThreads / 32, (r.sequences - (q.b - int(threadIdx.x)) + 31) / 32);  // holding sequences
      for (int x = 0; x < warps; ++x) {  // a warp at a time: the same ranks every run
        int tie = 0;
        if (warp == x && lane == leader) tie = w.cnt[q.count], w.cnt[q.count] = tie + __popc(same);
        if (warp == x) rank = w.n[q.count] + __shfl_sync(0xffffffffu, tie, leader) + before;
        __syncthreads();
      }
      for (int i = 0; i < q.count; ++i) {
        const int e = w.at(key_blocks, key_blocks ? q.count - 1 - i : i, rank);
        out.blocks[e] = {i, q.start, q.length};
        if (key_blocks) out.q_first[e] = q.q_first;
      }
    });
  }
  if (threadIdx.x == 0) {
    *out.order = tile_order(entries.x, units, causal, bytes_a_unit, l2_bytes, sms);
    *out.tiles = out.order->tiles();
    *out.q_count = entries.y;
    *taken = 0;
  }
}

// The tables in their workspace: the order, the tiles' and the query blocks' counts, the entries.
constexpr std::size_t kTilesAt = 48, kCountAt = 52, kEntriesAt = 64;
static_assert(sizeof(TileOrder) <= kTilesAt, "the order fits before the counts");

/// Where the rest lies, in bytes from the workspace's start: the blocks' table, each block's
/// first query block (key blocks only), the query blocks' table, then WeightOrder's three
/// arrays of capacity + 1 ints.
struct Layout {
  std::size_t blocks, q_first, q_blocks, weights, end;
  int capacity;
};
Layout layout(int T, int rows, int q_rows, int sequences) {
  const std::size_t blocks = std::size_t(max_blocks(T, rows, sequences));
  const std::size_t q_blocks = q_rows ? std::size_t(max_blocks(T, q_rows, sequences)) : 0;
  const int capacity = (T + rows - 1) / rows;
  const std::size_t q_first = kEntriesAt + blocks * sizeof(SeqBlock);
  const std::size_t q_blocks_at = q_first + (q_rows ? blocks * sizeof(int) : 0);
  const std::size_t weights = q_blocks_at + q_blocks * sizeof(SeqBlock);
  return {.blocks = kEntriesAt,
          .q_first = q_first,
          .q_blocks = q_blocks_at,
          .weights = weights,
          .end = weights + 3 * (std::size_t(capacity) + 1) * sizeof(int),
          .capacity = capacity};
}

}  // namespace

std::size_t ragged_tables_bytes(int T, int rows, int q_rows, int sequences) {
  return layout(T, rows, q_rows, sequences).end;
}

RaggedTables ragged_tables(const Ragged& r, int T, int rows, int q_rows, int units, bool causal, double bytes_a_unit,
                           void* workspace, int* taken, Stream s) {
  auto* at = static_cast<unsigned char*>(workspace);
  const Layout l = layout(T, rows, q_rows, r.sequences);
  RaggedTables t{.blocks = reinterpret_cast<SeqBlock*>(at + l.blocks),
                 .order = reinterpret_cast<TileOrder*>(at),
                 .tiles = reinterpret_cast<int*>(at + kTilesAt),
                 .q_count = reinterpret_cast<int*>(at + kCountAt)};
  if (q_rows) {
    t.q_first = reinterpret_cast<int*>(at + l.q_first);
    t.q_blocks = reinterpret_cast<SeqBlock*>(at + l.q_blocks);
  }
  int* cnt = reinterpret_cast<int*>(at + l.weights);
  const int c = l.capacity;
  const WeightOrder w{.cnt = cnt, .n = cnt + c + 1, .s = cnt + 2 * (c + 1), .capacity = c, .most = 0, .entries = 0};
  ragged_blocks_kernel<<<1, kThreads, 0, s>>>(r, T, rows, q_rows, units, causal, bytes_a_unit,
                                              double(gpu::l2_bytes()), gpu::sm_count(), t, taken, w);
  FA_CHECK_LAUNCH();
  return t;
}

RaggedTable ragged_table_gpu(const std::vector<int>& offsets, int T, int rows, int q_rows, bool causal) {
  const int sequences = int(offsets.size()) - 1;
  const DeviceBuffer<int> dev_offsets(offsets);
  DeviceBuffer<unsigned char> ws(ragged_tables_bytes(T, rows, q_rows, sequences));
  DeviceBuffer<int> taken(1);
  const RaggedTables t = ragged_tables({dev_offsets.get(), sequences}, T, rows, q_rows, 1, causal, 0.0, ws.get(),
                                       taken.get(), nullptr);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  int counts[2];
  FA_CUDA_CHECK(cudaMemcpy(&counts[0], t.tiles, sizeof(int), cudaMemcpyDeviceToHost));
  FA_CUDA_CHECK(cudaMemcpy(&counts[1], t.q_count, sizeof(int), cudaMemcpyDeviceToHost));
  RaggedTable out{std::vector<SeqBlock>(std::size_t(counts[0])), std::vector<int>(q_rows ? counts[0] : 0),
                  std::vector<SeqBlock>(q_rows ? std::size_t(counts[1]) : 0)};
  auto get = [](auto& v, const void* from) {
    if (!v.empty()) FA_CUDA_CHECK(cudaMemcpy(v.data(), from, v.size() * sizeof(v[0]), cudaMemcpyDeviceToHost));
  };
  get(out.blocks, t.blocks), get(out.q_first, t.q_first), get(out.q_blocks, t.q_blocks);
  return out;
}

}  // namespace fa::step07
