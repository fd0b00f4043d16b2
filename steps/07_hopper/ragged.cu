// Step 07 on a ragged batch: the tables of blocks its kernels read. Sequence b's rows are
// offsets[b] … offsets[b + 1] − 1 of the packed tensors; its blocks of `rows` rows are
// ⌈length/rows⌉, and a table lists every sequence's in order, so that tile u of a head is
// one entry and no tile holds rows of two sequences. One block builds the tables on the
// device from the offsets there (no copy back to the host, nothing synchronised): a prefix
// sum of the sequences' block counts gives each sequence its first entry. The tiles' order
// (TileOrder) is worked out there too, since only then is the number of blocks known.
#include <cub/block/block_scan.cuh>

#include "common/cuda_check.cuh"
#include "common/gpu.hpp"  // sm_count, l2_bytes
#include "steps/07_hopper/ragged.cuh"

namespace fa::step07 {
namespace {

constexpr int kThreads = 1024;  // sequences a round of the prefix sums

struct Max {
  __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};

/// Offsets are not checked on the device: each is clamped to [0, T] and taken as the largest
/// of those up to it, so that the sequences never overlap, their lengths add up to at most T
/// and the tables fit max_blocks. (Rows outside every sequence are then left unwritten.)
__global__ void __launch_bounds__(kThreads)
    ragged_blocks_kernel(const Ragged r, int T, int rows, int q_rows, int units, bool causal, double bytes_a_unit,
                         double l2_bytes, int sms, RaggedTables out, int* taken) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int base, q_base, last;  // the tables' entries before this round's sequences; their last end
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
    for (int i = 0; i < count; ++i) {
      out.blocks[base + first + i] = {i, start, length};
      if (q_rows) out.q_first[base + first + i] = q_base + q_first;
    }
    for (int i = 0; i < q_count; ++i) out.q_blocks[q_base + q_first + i] = {i, start, length};
    __syncthreads();  // every thread has read the bases, and the scan's storage is free again
    if (threadIdx.x == 0) base += total, q_base += q_total, last = max(last, top);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *out.order = tile_order(base, units, causal, bytes_a_unit, l2_bytes, sms);
    *out.tiles = out.order->tiles();
    *out.q_count = q_base;
    *taken = 0;
  }
}

// The tables in their workspace: the order, the tiles' and the query blocks' counts, the entries.
constexpr std::size_t kTilesAt = 48, kCountAt = 52, kEntriesAt = 64;
static_assert(sizeof(TileOrder) <= kTilesAt, "the order fits before the counts");

}  // namespace

std::size_t ragged_tables_bytes(int T, int rows, int q_rows, int sequences) {
  const std::size_t blocks = std::size_t(max_blocks(T, rows, sequences));
  const std::size_t q_blocks = q_rows ? std::size_t(max_blocks(T, q_rows, sequences)) : 0;
  return kEntriesAt + blocks * sizeof(SeqBlock) + (q_rows ? blocks * sizeof(int) : 0) + q_blocks * sizeof(SeqBlock);
}

RaggedTables ragged_tables(const Ragged& r, int T, int rows, int q_rows, int units, bool causal, double bytes_a_unit,
                           void* workspace, int* taken, Stream s) {
  auto* at = static_cast<unsigned char*>(workspace);
  const std::size_t blocks = std::size_t(max_blocks(T, rows, r.sequences));
  RaggedTables t{.blocks = reinterpret_cast<SeqBlock*>(at + kEntriesAt),
                 .order = reinterpret_cast<TileOrder*>(at),
                 .tiles = reinterpret_cast<int*>(at + kTilesAt),
                 .q_count = reinterpret_cast<int*>(at + kCountAt)};
  if (q_rows) {
    t.q_first = reinterpret_cast<int*>(t.blocks + blocks);
    t.q_blocks = reinterpret_cast<SeqBlock*>(t.q_first + blocks);
  }
  ragged_blocks_kernel<<<1, kThreads, 0, s>>>(r, T, rows, q_rows, units, causal, bytes_a_unit,
                                              double(gpu::l2_bytes()), gpu::sm_count(), t, taken);
  FA_CHECK_LAUNCH();
  return t;
}

}  // namespace fa::step07
