// Step 08 — split K/V for decoding: the merge rule across thread blocks (FlashDecoding).
//
// Adds over step 06 (same tensor-core pieces, same rounding points): when there are
// few queries per head — decoding, 1 to 16 new tokens against a long K/V cache — one
// thread block per query block leaves most of the GPU idle. Here
//   packing    the H/H_kv query heads that share a K/V head (grouped-query attention)
//              and their N queries are one block of G·N rows: they are consecutive rows
//              of Q, so the pack is a reshape; 16 rows a thread block (one mma tile);
//              a *unit* is one such block of rows of one K/V head, with its keys;
//   split      each unit's 64-key tiles are cut into chunks, one thread block each, so
//              that the blocks fill the GPU (one wave); where whole units' chunks leave
//              SMs idle and the blocks stream long, a wave of blocks shares the units'
//              tiles evenly instead, laid end to end, a chunk free to end inside one unit
//              and go on in the next;
//   warps      the four warps of a block take 16 keys each of every tile: four partial
//              states per row, merged through shared memory at the end of a unit;
//   merge      each block writes its rows' (O/ℓ, L) in fp32, for every unit it meets,
//              then a tag (released) that says so; a second kernel, launched while the
//              first runs, merges each row as soon as its parts' tags are there
//              (acquired), by the course's merge rule (online_softmax.hpp) taken for all
//              of them at once: the common max first, then every part's weight;
//   cluster    on Hopper, where every unit is S ≤ 8 chunks of its own of at most 64
//              tiles and all the units' clusters fit at once, the S blocks of a unit
//              run as one thread block cluster: each keeps its part in shared memory,
//              and the cluster merges them through distributed shared memory and
//              writes O and L (no partials in HBM, no second kernel).
//   L2 hint    where K and V are at most three L2s, their reads ask the L2 to evict
//              them first (read once), leaving the lines it holds — dirty ones, which
//              would have to be written back first — alone.
//   ring       a block streams its chunk through a ring of K/V tiles, four (three in flight
//              while one is computed), six where every chunk streams long and the GPU gives
//              a block room for them (an H100/H200 at d = 128);
//   the tile   a memory-bound loop must still issue fast enough: Q's fragments are
//              loaded once a piece and kept in registers, S's k steps go to two
//              accumulator chains (half as long a wait on the mma before), and O's
//              rescale is skipped where no row of the warp has a new max (× 1: the same
//              bits).
// When every block is exactly one unit the first kernel writes O and L itself (no
// partials, no second kernel).
// Limits: d = 64 or 128, bf16 or fp16, N_kv ≥ 1 keys for N ≥ 1 queries (the queries the
// last N positions; causal within them); H_kv dividing H. GPUs: sm_80 and newer.
// Note: notes/08_split_kv.md.
#pragma once

#include <cstddef>

#include "common/hd.hpp"
#include "common/hbm.hpp"
#include "common/step_api.hpp"
#include "steps/03_online_softmax/online_softmax.hpp"

namespace fa::step08 {

constexpr int kRows = 16;           ///< packed query rows per thread block: one mma.sync tile (M = 16)
constexpr int kKeysPerWarp = 16;    ///< keys a warp takes of each tile: one k-chunk of P·V
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileKeys = kWarps * kKeysPerWarp;  ///< keys per K/V tile (64)
/// Shared memory of a thread block: Q (16 rows) and a ring of `stages` K and V tiles, 16-bit.
FA_HD constexpr std::size_t smem_bytes(int d, int stages) {
  return (std::size_t(kRows) + 2 * std::size_t(stages) * kTileKeys) * std::size_t(d) * 2;
}
/// The TMA kernel's block (split_kernel_tma, Hopper): the four compute warps and a producer warp.
constexpr int kThreadsTma = kThreads + 32;
/// Its shared memory: smem_bytes and the ring's mbarriers, two a slot (full, empty: 8 bytes each).
FA_HD constexpr std::size_t smem_bytes_tma(int d, int stages) { return smem_bytes(d, stages) + 2 * stages * 8; }
/// Thread blocks with a ring of `stages` tiles that one multiprocessor of smem_per_sm bytes
/// of shared memory holds at once: its shared memory (1 KiB of it reserved per block) and
/// its 2048 threads; at least one.
FA_HD constexpr int blocks_fitting(std::size_t smem_per_sm, int d, int stages) {
  const std::size_t by_smem = smem_per_sm / (smem_bytes(d, stages) + 1024), by_threads = 2048 / kThreads;
  return by_smem < 1 ? 1 : int(by_smem < by_threads ? by_smem : by_threads);
}
inline constexpr int kSupportedD[] = {64, 128, 0};
constexpr int kMaxParts = 128;       ///< the most parts a row may have (the merge keeps a row's L's on chip)
constexpr int kCombineThreads = 256; ///< the merge kernel's block: one row
constexpr int kMinSm = 80;  ///< step 06's pieces: mma.sync on bf16, cp.async
/// The most blocks in a cluster that merges a unit's parts: the portable limit of a
/// thread block cluster (CUDA C++ Programming Guide, "Thread Block Clusters"), and at
/// most one part a lane in the merge kernel's sum (kCombineThreads / (d/4) ≥ 8), so that
/// both merges add the same products in the same order.
constexpr int kMaxCluster = 8;

/// What the ring's depth and the split choice need to know of the GPU.
struct GpuShape {
  int sms;                     ///< multiprocessors
  std::size_t smem_per_sm;     ///< shared memory per multiprocessor, bytes
  std::size_t smem_per_block;  ///< the most one block may take (opt-in), bytes
  std::size_t l2_bytes = 0;    ///< the L2's size (cudaDevAttrL2CacheSize), bytes; 0: unknown
  /// clusters[S]: clusters of S blocks (one block an SM) the GPU runs at once — all of
  /// them, not one wave of them, must fit for a plan to merge in clusters; 0 where it has
  /// no clusters (before Hopper) or S is not a cluster size here. A cluster's SMs are in
  /// one GPC, so this is not ⌊sms/S⌋ (cudaOccupancyMaxActiveClusters).
  int clusters[kMaxCluster + 1] = {};
  /// TMA tensor copies and mbarriers (Hopper, where the code that runs was compiled for
  /// sm_90 or later): what a producer warp fills the ring with (ring_by_tma).
  bool tma = false;
};
/// The course's GPU, for the CPU model and the tour: an H200's 60 MiB of L2, and its
/// clusters as cudaOccupancyMaxActiveClusters gave them for the split kernel (note 08, "The
/// merge in a cluster"): clusters of 4 or 8 cover 120 of its 132 SMs, of 2 all of them.
constexpr GpuShape kH200{132, 228 * 1024, 227 * 1024, 60u << 20, {0, 0, 66, 39, 30, 22, 17, 15, 15}, true};
/// K/V tiles in a block's ring: 4 (64 KiB at d = 64, 128 KiB at d = 128: three tiles in
/// flight while one is computed) where one block may hold them — every GPU at d = 64, an
/// A100 or H100/H200 at d = 128 —, else 2 (an RTX 30xx/40xx gives a block 99 KiB).
int stages(int d, const GpuShape& gpu);
/// The deep ring: six K/V tiles at d = 128 (196 KiB a block: five tiles in flight while one
/// is computed, against three).
constexpr int kDeepRing = 6;
/// The shortest chunk, in tiles, that streams through the deep ring: measured on the H200
/// (note 08, "The ring"), six tiles took 0.990–1.003 of four's time where every chunk had
/// 16 tiles or more (less at 21 of 27 shapes, and at all five of B·H = 128 with one
/// query), and 1.008 at 4-tile chunks.
constexpr int kDeepRingMinTiles = 16;

/// How the work is cut among thread blocks (note 08, "The split"). The units — row block
/// rb of K/V head h is unit u = h·row_blocks + rb — each count `tiles` 64-key tiles (all
/// the keys: the causal mask only makes a unit's last tiles empty, see tile_end). Laid end
/// to end, tile t of unit u at u·tiles + t, the units' tiles are shared out among `blocks`
/// thread blocks as evenly as whole tiles allow: block b takes [⌊b·total/blocks⌋,
/// ⌊(b + 1)·total/blocks⌋). A chunk may end inside a unit and go on in the next, so a
/// unit's rows may have a part in several blocks; block b's part of unit u is part
/// b − first(u) of u's rows. With blocks = S·units every unit is S chunks of its own
/// (S = 1: each block exactly one unit, writing O and L itself).
///
/// `cluster` > 1: every unit is `cluster` chunks of its own, run as one thread block
/// cluster that merges them through distributed shared memory (with_clusters).
struct SplitPlan {
  long long units = 1;
  int tiles = 1, blocks = 1;
  int cluster = 1;  ///< blocks a cluster: 1, or S where each unit's S parts merge in their cluster
  FA_HD long long total() const { return units * tiles; }
  FA_HD bool direct() const { return blocks == units; }
  /// Partials through HBM and the merge kernel: split, and not merged in clusters.
  FA_HD bool merge_kernel() const { return !direct() && cluster == 1; }
  /// Block b's chunk: tiles [begin(b), end(b)) of all the units' tiles end to end.
  FA_HD long long begin(int b) const { return b * total() / blocks; }
  FA_HD long long end(int b) const { return begin(b + 1); }
  /// The block whose chunk holds tile x: the last b with begin(b) ≤ x.
  FA_HD int block_of(long long x) const { return int(((x + 1) * blocks - 1) / total()); }
  /// The first block that meets unit u, and how many do (its rows' parts).
  FA_HD int first(long long u) const { return block_of(u * tiles); }
  FA_HD int parts(long long u) const { return block_of(u * tiles + tiles - 1) - first(u) + 1; }
  /// The piece of a chunk that starts at tile x and stays in one unit, up to the
  /// chunk's end e: its unit and its tiles [t0, t1) of that unit.
  struct Piece {
    long long unit;
    int t0, t1;
  };
  FA_HD Piece piece(long long x, long long e) const {
    const long long u = x / tiles;
    const int t0 = int(x - u * tiles);
    return {u, t0, e - x < tiles - t0 ? t0 + int(e - x) : tiles};
  }
};
/// The most parts a unit of s has (the partials' first dimension): S when blocks = S·units,
/// else what the shortest chunk allows.
int most_parts(const SplitPlan& s);
/// Thread blocks that fit on one of gpu's multiprocessors at once, with the ring
/// stages(d, gpu) (blocks_fitting).
int blocks_per_sm(int d, const GpuShape& gpu);
/// The split (note 08): units = B·H_kv·⌈G·N/16⌉. Whole units' splits (unit_plan: one block
/// a unit when the units fill a wave, sms · blocks_per_sm, else ⌊wave/units⌋ chunks a
/// unit), unless those split the units (so a merge runs either way) but leave SMs idle,
/// and one wave of blocks sharing all the tiles evenly (no chunk under 4 tiles, none so
/// short that a row has more than kMaxParts parts) gives every block at least 384 tiles
/// (24k keys): the idle SMs' share of the time must pay for a block's second piece.
SplitPlan plan(const Problem& p, const GpuShape& gpu);
/// K/V tiles in the ring of plan s's blocks: kDeepRing where d = 128, the GPU gives a block
/// the deep ring at as many blocks an SM as stages() (an H100/H200; an A100's 163 KiB a
/// block do not hold it) and every chunk of s has at least kDeepRingMinTiles tiles; else
/// stages(d, gpu).
int ring_tiles(const Problem& p, const SplitPlan& s, const GpuShape& gpu);
/// Every unit cut into `splits` chunks of its own (splits clamped to 1 … min(kMaxParts, tiles)).
SplitPlan fixed_plan(const Problem& p, int splits);
/// Every unit cut into ⌊wave/units⌋ chunks of its own (no chunk under 4 tiles), or one
/// block a unit when they fill the wave: 128 units on 132 SMs make 128 blocks. What plan()
/// was before it shared the tiles; lesson row w1 at every shape.
SplitPlan unit_plan(const Problem& p, const GpuShape& gpu);
/// The tiles shared evenly by a wave of blocks (or fewer: no chunk under 4 tiles, none so
/// short that a row has more than kMaxParts parts): what plan() takes where it shares, and
/// lesson row k1 at every shape.
SplitPlan shared_plan(const Problem& p, const GpuShape& gpu);

/// The longest chunk merged in a cluster, in tiles (4k keys): measured on the H200, the
/// cluster's merge saves up to 5% where chunks are this short, and costs up to 2.4% where
/// they stream longer, its clusters packed into fewer GPCs than the plain grid spreads
/// over (note 08, "The merge in a cluster").
constexpr int kMaxClusterChunk = 64;
/// The plan s with each unit's parts merged in a cluster of their blocks where it pays and
/// can be: every unit S ≤ kMaxCluster chunks of its own (blocks = S·units, S > 1) of at
/// most kMaxClusterChunk tiles, and the GPU holding all of the units' clusters at once.
/// Else s as it is (the merge kernel).
SplitPlan with_clusters(SplitPlan s, const GpuShape& gpu);

/// The most K and V bytes, in L2 sizes, that the split kernel reads evict-first (note 08,
/// "Reads that leave the L2 alone"): timed on the H200 (60 MiB of L2) at the decoding
/// shapes, the hint saved 0.9–7.3% of the time where K and V were 16–128 MiB, and cost
/// 1.6–6.6% from 256 MiB up; 3 L2s (180 MiB) is the middle of that bracket (√2 · 128 MiB).
constexpr int kEvictFirstL2s = 3;
/// Whether the split kernel's K/V reads ask the L2 to evict their lines first: where K and
/// V together are at most kEvictFirstL2s times the GPU's L2 (never where its size is unknown).
bool reads_evict_first(const Problem& p, const GpuShape& gpu);

/// The shortest chunk, in tiles, whose ring a producer warp fills by TMA (note 08, "The
/// ring by TMA"): timed on the H200 beside the compute warps' cp.async in two runs, TMA took
/// 0.985–1.001 of its time at every decoding shape whose chunks had 128 tiles or more, and
/// up to 3.3% longer where they were shorter.
constexpr int kTmaMinTiles = 128;
/// Whether a producer warp can fill plan s's ring by TMA (split_kernel_tma) at all: d = 128,
/// a GPU with TMA, and no cluster's merge (lesson row t1 takes it wherever it can).
bool ring_can_take_tma(const Problem& p, const SplitPlan& s, const GpuShape& gpu);
/// Whether production fills plan s's ring by TMA: where it can (ring_can_take_tma) and
/// every chunk has at least kTmaMinTiles tiles.
bool ring_by_tma(const Problem& p, const SplitPlan& s, const GpuShape& gpu);

/// Thread blocks along the packed rows of one K/V head: ⌈G·N/16⌉.
int row_blocks(const Problem& p);
/// K/V tiles of a head: ⌈N_kv/64⌉.
int kv_tiles(const Problem& p);
/// One past the last tile that row block rb (of `group` heads × N queries, against Nk
/// keys) needs: all tiles, or (causal) up to the key at its latest query's position —
/// Nk − N + n for query n, the latest being N − 1 when the block spans two heads.
FA_HD int tile_end(int N, int Nk, int group, bool causal, int rb) {
  const int tiles = (Nk + kTileKeys - 1) / kTileKeys;
  if (!causal) return tiles;
  const int lo = rb * kRows, hi = (lo + kRows < group * N ? lo + kRows : group * N) - 1;
  const int latest = lo / N != hi / N ? N - 1 : hi % N;
  return (Nk - N + latest) / kTileKeys + 1;
}
/// Unit u's first row of Q, O and L (the unit being row block u % rbs of K/V head
/// u / rbs, with H query heads a batch, G a K/V head, N queries each): its packed row r
/// is query r % N of query head r / N of the group, and the group's heads are
/// consecutive heads of one batch, so its rows are consecutive rows of Q.
FA_HD std::size_t first_row(int H, int G, int N, int rbs, long long u) {
  const std::size_t kvh = std::size_t(u / rbs), kv_heads = std::size_t(H / G);
  return (kvh / kv_heads * H + kvh % kv_heads * G) * N + std::size_t(u % rbs) * kRows;
}
/// Unit u's rows that exist: 16, or in a K/V head's last row block what is left of its
/// G·N packed rows (rbs row blocks a head).
FA_HD int unit_rows(int G, int N, int rbs, long long u) {
  const int left = G * N - int(u % rbs) * kRows;
  return left < kRows ? left : kRows;
}
/// A part's L folded into a row's statistics (m, ℓ): a part's (O/ℓ, L) is the state
/// (m = L, ℓ = 1, O/ℓ) — e^L·1 = e^m·ℓ —, and an empty part's (0, −∞) has ℓ = 0.
FA_HD void merge_part_stats(float& m, float& l, float L) {
  online::merge(m, l, nullptr, L, L == -INFINITY ? 0.0f : 1.0f, nullptr, 0);
}
/// The partials' scratch: most_parts · B·H·N rows of d + 1 floats (O/ℓ and L), then (8-byte
/// aligned) as many 8-byte tags (a row's part written); none when direct or merged in clusters.
std::size_t workspace_bytes(const Problem& p, const SplitPlan& s);

/// Throws fa::Error unless p is bf16 or fp16 with d = 64 or 128.
void require_supported(const Problem& p);

/// CPU model: the kernels' blocks, chunks, warps and merges in their order, rounding
/// where they round (inputs, P before P·V, O at the end; partials stay fp32).
ModelForward model_forward(const Problem& p, const Qkv& in, const SplitPlan& s);
/// Elements moved: K and V once per row block, Q once per part, the partials written
/// and read back (fp32: 4 bytes each, beside 2 for the 16-bit tensors; see bytes()).
Traffic traffic_forward(const Problem& p, const SplitPlan& s);
/// The same traffic in bytes (16-bit Q, K, V, O; fp32 L and partials).
double traffic_bytes(const Problem& p, const SplitPlan& s);

/// The current GPU's shape (its clusters by the occupancy calculator), the plan on it
/// (with_clusters), and thread blocks per multiprocessor by the occupancy calculator
/// (CUDA builds only: split_kv.cu).
GpuShape device_shape();
SplitPlan device_plan(const Problem& p);
int device_blocks_per_sm(int d);
/// The plan kForwardSmallBlocks makes on the current GPU.
SplitPlan device_plan_small_blocks(const Problem& p);

/// The forward with the plan() for the GPU it runs on.
extern const GpuForward kForward;
constexpr int kFixedSplitCount = 5;
inline constexpr int kFixedSplits[kFixedSplitCount] = {1, 2, 8, 32, 128};
/// The forward with the split count fixed (kFixedSplits), for the tests and the note's table.
extern const GpuForward kForwardFixed[kFixedSplitCount];
/// The forward as a GPU that gives a block at most 99 KiB runs it (an RTX 30xx/40xx: a ring
/// of two tiles at d = 128, and the plan for that occupancy), on this GPU: the tests run
/// that code path on the H200, and the note's table times it.
extern const GpuForward kForwardSmallBlocks;
/// The forward with its merge kernel launched after the split kernel, as any kernel, on
/// every GPU: what the early launch (programmatic dependent launch, sm_90) buys.
extern const GpuForward kForwardLateMerge;
/// The forward with the merge kernel, launched early, wherever it splits: never a
/// cluster's merge. What the merge in distributed shared memory buys (note 08).
extern const GpuForward kForwardMergeKernel;
/// m2 with the merge kernel waiting for the whole split kernel to end
/// (cudaGridDependencySynchronize) instead of each row for its own parts' tags: what the
/// tags buy (note 08, "Waiting for the parts, not the kernel").
extern const GpuForward kForwardGridWait;
/// The ring filled by TMA from a producer warp wherever the GPU and the plan allow it
/// (Hopper, d = 128, no cluster's merge: t1), and by the compute warps' cp.async at every
/// shape (c1): what production's choice between them (ring_by_tma) is measured against.
extern const GpuForward kForwardTma;
extern const GpuForward kForwardCpAsync;
/// A ring of six K/V tiles at every shape at d = 128, and of four (the plan is production's,
/// one block an SM either way): what production's choice between them (ring_tiles) is
/// measured against.
inline constexpr int kDeepRingD[] = {128, 0};
extern const GpuForward kForwardDeepRing;
extern const GpuForward kForwardRing4;
/// Whole units' splits at every shape (unit_plan), for note 08's table and tests.
extern const GpuForward kForwardUnitSplits;
/// The tiles shared by a wave of blocks at every shape (shared_plan), for note 08's table and tests.
extern const GpuForward kForwardShared;
/// The K/V reads without the L2 hint at every shape (l0), and evict-first at every shape
/// (l1), where production asks for it by reads_evict_first.
extern const GpuForward kForwardPlainReads;
extern const GpuForward kForwardEvictFirst;

}  // namespace fa::step08
