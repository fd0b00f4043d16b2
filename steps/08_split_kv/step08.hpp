// Step 08 — split K/V for decoding: the merge rule across thread blocks (FlashDecoding).
//
// Adds over step 06 (same tensor-core pieces, same rounding points): with 1 to 16 new
// queries a head against a long K/V cache, one thread block per query block leaves most
// of the GPU idle. Here the G = H/H_kv query heads sharing a K/V head and their N queries
// are packed into blocks of 16 rows (a unit, with its keys); the units' 64-key tiles, laid
// end to end, are cut into one wave of chunks, a thread block each; four warps take 16
// keys of every tile; each block writes its parts (O/ℓ, L) in fp32, and the parts of a row
// are merged by the course's rule (online_softmax.hpp): a merge kernel launched early,
// or on Hopper a cluster merging through distributed shared memory.
// Leaves for step 09: the same merge across GPUs. Limits: d = 64 or 128, bf16 or fp16,
// N_kv ≥ N (causal within the last N positions), H_kv dividing H; sm_80 and newer.
// A paged cache (PagedKv): the same blocks, each 16-key run of a tile read from its page.
// Note: notes/08_split_kv.md. Kernels: split_kv.cu (production), lesson.cu (rows 2–4).
#pragma once

#include <cstddef>
#include <vector>

#include "common/hd.hpp"
#include "common/hbm.hpp"
#include "common/step_api.hpp"
#include "steps/03_online_softmax/online_softmax.hpp"

namespace fa::step08 {

constexpr int kRows = 16;           ///< packed query rows a block: one mma.sync tile (M = 16)
constexpr int kKeysPerWarp = 16;    ///< keys a warp takes of each tile: one k-chunk of P·V
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileKeys = kWarps * kKeysPerWarp;  ///< keys a K/V tile (64)
constexpr int kThreadsTma = kThreads + 32;        ///< split_kernel_tma: the compute warps and a producer warp
/// Shared memory of a block: Q (16 rows) and a ring of `stages` K and V tiles, 16-bit.
FA_HD constexpr std::size_t smem_bytes(int d, int stages) {
  return (std::size_t(kRows) + 2 * std::size_t(stages) * kTileKeys) * std::size_t(d) * 2;
}
/// The TMA kernel's: the same, and two 8-byte mbarriers a slot (full, empty).
FA_HD constexpr std::size_t smem_bytes_tma(int d, int stages) { return smem_bytes(d, stages) + 2 * stages * 8; }
/// Blocks with a ring of `stages` tiles one SM holds at once: by its shared memory (1 KiB
/// reserved a block) and its 2048 threads; at least one.
FA_HD constexpr int blocks_fitting(std::size_t smem_per_sm, int d, int stages) {
  const std::size_t by_smem = smem_per_sm / (smem_bytes(d, stages) + 1024), by_threads = 2048 / kThreads;
  return by_smem < 1 ? 1 : int(by_smem < by_threads ? by_smem : by_threads);
}
inline constexpr int kSupportedD[] = {64, 128, 0};
constexpr int kMaxParts = 128;        ///< most parts a row: the merge keeps a row's L's on chip
constexpr int kCombineThreads = 256;  ///< the merge kernel's block: one row
constexpr int kMinSm = 80;            ///< step 06's pieces: mma.sync on bf16, cp.async
/// Most blocks in a merging cluster: the portable cluster size, and at most one part a
/// lane of the merge kernel's sum (256 / (d/4) ≥ 8), so both merges give the same bits.
constexpr int kMaxCluster = 8;

/// What the ring's depth and the split need to know of the GPU.
struct GpuShape {
  int sms;
  std::size_t smem_per_sm;     ///< bytes
  std::size_t smem_per_block;  ///< the most one block may take (opt-in), bytes
  std::size_t l2_bytes = 0;    ///< 0: unknown
  /// clusters[S]: clusters of S one-block-an-SM blocks the GPU runs at once (a cluster's
  /// SMs share a GPC, so not ⌊sms/S⌋); 0 before Hopper.
  int clusters[kMaxCluster + 1] = {};
  bool tma = false;  ///< TMA and mbarriers: Hopper, running sm_90 code
};
/// The course's GPU, for the CPU model and the tour: an H200, its clusters as the
/// occupancy calculator gives them for the split kernel.
constexpr GpuShape kH200{132, 228 * 1024, 227 * 1024, 60u << 20, {0, 0, 66, 39, 30, 22, 17, 15, 15}, true};
/// K/V tiles in a block's ring: 4 (three in flight while one is computed) where a block
/// may hold them, else 2 (a GPU giving a block 99 KiB, at d = 128). Note 08, "The ring".
int stages(int d, const GpuShape& gpu);
/// The deep ring at d = 128: six tiles (196 KiB), five in flight. Note 08, "The ring".
constexpr int kDeepRing = 6;
/// The shortest chunk, in tiles, worth the deep ring: shorter ones gain nothing from it.
/// Note 08, "The ring".
constexpr int kDeepRingMinTiles = 16;

/// How the work is cut (note 08, "The split count"): unit u = h·row_blocks + rb has
/// `tiles` tiles; laid end to end, block b takes [⌊b·total/blocks⌋, ⌊(b + 1)·total/blocks⌋),
/// possibly going on into the next unit (its part b − first(u) of each). blocks = S·units:
/// every unit S chunks of its own; cluster > 1: those S blocks merge in a cluster.
struct SplitPlan {
  long long units = 1;
  int tiles = 1, blocks = 1;
  int cluster = 1;
  FA_HD long long total() const { return units * tiles; }
  FA_HD bool direct() const { return blocks == units; }
  /// Partials through HBM and the merge kernel: split, and not merged in clusters.
  FA_HD bool merge_kernel() const { return !direct() && cluster == 1; }
  FA_HD long long begin(int b) const { return b * total() / blocks; }
  FA_HD long long end(int b) const { return begin(b + 1); }
  /// The block whose chunk holds tile x: the last b with begin(b) ≤ x.
  FA_HD int block_of(long long x) const { return int(((x + 1) * blocks - 1) / total()); }
  /// The first block that meets unit u, and how many do (its rows' parts).
  FA_HD int first(long long u) const { return block_of(u * tiles); }
  FA_HD int parts(long long u) const { return block_of(u * tiles + tiles - 1) - first(u) + 1; }
  struct Piece {  ///< the run of a chunk from tile x (to at most e) in one unit: its tiles [t0, t1)
    long long unit;
    int t0, t1;
  };
  FA_HD Piece piece(long long x, long long e) const {
    const long long u = x / tiles;
    const int t0 = int(x - u * tiles);
    return {u, t0, e - x < tiles - t0 ? t0 + int(e - x) : tiles};
  }
};
/// The most parts a unit of s has (the partials' first dimension).
int most_parts(const SplitPlan& s);
/// Blocks one SM holds with the ring stages(d, gpu).
int blocks_per_sm(int d, const GpuShape& gpu);
/// The split: whole units' splits (unit_plan), unless they split the units yet leave SMs
/// idle and a wave sharing the tiles (shared_plan) gives every block 384 tiles or more.
SplitPlan plan(const Problem& p, const GpuShape& gpu);
/// The ring for plan s: kDeepRing where d = 128, the GPU gives a block room for it at the
/// same blocks an SM, and every chunk has kDeepRingMinTiles tiles; else stages(d, gpu).
int ring_tiles(const Problem& p, const SplitPlan& s, const GpuShape& gpu);
/// Every unit `splits` chunks of its own (clamped to 1 … min(kMaxParts, tiles)): the tests'.
SplitPlan fixed_plan(const Problem& p, int splits);
/// Every unit ⌊wave/units⌋ chunks of its own (none under 4 tiles), or one block a unit
/// when the units fill a wave.
SplitPlan unit_plan(const Problem& p, const GpuShape& gpu);
/// The tiles shared evenly by a wave of blocks (no chunk under 4 tiles, no row over
/// kMaxParts parts).
SplitPlan shared_plan(const Problem& p, const GpuShape& gpu);

/// The longest chunk merged in a cluster, in tiles: past it, packing the clusters into
/// GPCs costs more than the merge kernel. Note 08, "The merge in a cluster".
constexpr int kMaxClusterChunk = 64;
/// s with each unit's parts merged in a cluster where every unit is S ≤ kMaxCluster chunks
/// of its own of at most kMaxClusterChunk tiles and the GPU holds all the clusters; else s.
SplitPlan with_clusters(SplitPlan s, const GpuShape& gpu);

/// K and V read evict-first up to this many L2s of them: the hint helps while the L2 could
/// hold them and costs beyond. Note 08, "Reads that leave the L2 alone".
constexpr int kEvictFirstL2s = 3;
bool reads_evict_first(const Problem& p, const GpuShape& gpu);

/// The shortest chunk, in tiles, whose ring a producer warp fills by TMA: shorter chunks
/// are faster with the warps' own cp.async. Note 08, "The ring by TMA".
constexpr int kTmaMinTiles = 128;
/// Whether a producer warp can fill plan s's ring by TMA: d = 128, TMA, no cluster's merge.
bool ring_can_take_tma(const Problem& p, const SplitPlan& s, const GpuShape& gpu);
/// Whether it does: where it can and every chunk has kTmaMinTiles tiles or more; a paged
/// cache (page: positions a page; 0, a contiguous one) only in pages of whole tiles, as its
/// producer copies a box a tile (smaller pages go to cp.async: lab 08_paged).
bool ring_by_tma(const Problem& p, const SplitPlan& s, const GpuShape& gpu, int page = 0);

/// Units a K/V head: ⌈G·N/16⌉; tiles a head: ⌈N_kv/64⌉.
int row_blocks(const Problem& p);
int kv_tiles(const Problem& p);
/// One past the last tile row block rb needs: all, or (causal) up to its latest query's
/// position, Nk − N + n for query n (N − 1 where the block spans two heads).
FA_HD int tile_end(int N, int Nk, int group, bool causal, int rb) {
  const int tiles = (Nk + kTileKeys - 1) / kTileKeys;
  if (!causal) return tiles;
  const int lo = rb * kRows, hi = (lo + kRows < group * N ? lo + kRows : group * N) - 1;
  const int latest = lo / N != hi / N ? N - 1 : hi % N;
  return (Nk - N + latest) / kTileKeys + 1;
}
/// Unit u's first row of Q, O and L: its packed row r is query r % N of head r / N of the
/// group, whose heads are consecutive heads of one batch, so its rows are consecutive.
FA_HD std::size_t first_row(int H, int G, int N, int rbs, long long u) {
  const std::size_t kvh = std::size_t(u / rbs), kv_heads = std::size_t(H / G);
  return (kvh / kv_heads * H + kvh % kv_heads * G) * N + std::size_t(u % rbs) * kRows;
}
/// Unit u's rows that exist: 16, or what its head's last row block has left of G·N.
FA_HD int unit_rows(int G, int N, int rbs, long long u) {
  const int left = G * N - int(u % rbs) * kRows;
  return left < kRows ? left : kRows;
}
/// A part's L folded into a row's (m, ℓ): the part is the state (m = L, ℓ = 1), an empty
/// one (L = −∞) has ℓ = 0.
FA_HD void merge_part_stats(float& m, float& l, float L) {
  online::merge(m, l, nullptr, L, L == -INFINITY ? 0.0f : 1.0f, nullptr, 0);
}
/// The partials: most_parts · B·H·N rows of d + 1 floats, then 8-byte tags; none when
/// direct or merged in clusters.
std::size_t workspace_bytes(const Problem& p, const SplitPlan& s);

/// Throws fa::Error unless p is bf16 or fp16 with d = 64 or 128.
void require_supported(const Problem& p);

/// CPU model: the kernels' blocks, chunks, warps and merges in their order, rounding
/// where they round (inputs, P before P·V, O at the end; partials fp32).
ModelForward model_forward(const Problem& p, const Qkv& in, const SplitPlan& s);
/// Elements moved: K and V once a row block, Q once a part, the partials written and read.
Traffic traffic_forward(const Problem& p, const SplitPlan& s);
/// The same in bytes (16-bit Q, K, V, O; fp32 L and partials).
double traffic_bytes(const Problem& p, const SplitPlan& s);

// ---- A paged K/V cache (vLLM's PagedAttention): the same blocks and merges, one
// indirection a key. Note 08, "A paged cache".

/// The paged cache (common/problem.hpp): a pool of pages [H_kv, page, d] and a table per sequence.
using fa::PagedKv;
/// Element offset of key `key` of K/V head h (of H_kv) of sequence b in K (or V), row 0.
std::size_t paged_row(const Problem& p, const PagedKv& kv, int b, int h, int key);
/// The model on a paged cache: in.k and in.v are the pools.
ModelForward model_forward_paged(const Problem& p, const Qkv& in, const PagedKv& kv, const SplitPlan& s);

/// The current GPU (CUDA builds): its shape, the plan on it, blocks an SM by the
/// occupancy calculator, and the plans of kForwardSmallBlocks and lesson rows 3–4.
GpuShape device_shape();
SplitPlan device_plan(const Problem& p);
int device_blocks_per_sm(int d);
SplitPlan device_plan_small_blocks(const Problem& p);
SplitPlan device_lesson_plan(const Problem& p);

/// The forward, planned for the GPU it runs on.
extern const GpuForward kForward;
/// Test hooks of production: the split count fixed, and this GPU seen as one that gives a
/// block 99 KiB (an RTX 30xx/40xx: a ring of two tiles at d = 128, no clusters, no TMA).
constexpr int kFixedSplitCount = 5;
inline constexpr int kFixedSplits[kFixedSplitCount] = {1, 2, 8, 32, 128};
extern const GpuForward kForwardFixed[kFixedSplitCount];
extern const GpuForward kForwardSmallBlocks;
/// Note 08's lesson rows 2–4 (lesson.cu): one split; splits merged by a fold; the merge
/// statistics first. Rows 2 and 4 give production's bits on the same plan.
extern const GpuForward kLessonOneSplit;
extern const GpuForward kLessonFold;
extern const GpuForward kLessonStatsFirst;
/// Row 4 with the split count fixed (kFixedSplits): production's bits at kForwardFixed's plans.
extern const GpuForward kLessonStatsFirstFixed[kFixedSplitCount];

}  // namespace fa::step08
