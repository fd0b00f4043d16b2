// Step 07 backward: step 06's backward (K/V outer, FlashAttention-2's loop order), fed
// by TMA and computed by wgmma, with the work split between warpgroups that move data
// and warpgroups that compute.
//
// Three kernels, as in step 06: its preprocess (D = rowsum(dO∘O), L·log2 e, padded
// per head to a multiple of 64 rows), the dK/dV kernel below, and a convert kernel
// (dQ = scale·accumulator in 16 bits); a fourth converts dK and dV where a group's query
// heads are split into shares (below). The preprocess also zeroes the fp32 dQ accumulator,
// and the kernels after it are launched early (launch_early): each one's launch, and
// whatever it does before it needs the output of the kernel ahead of it, runs under that
// kernel.
//
// The grid is persistent: a block an SM, each taking tile after tile — a tile is K/V block
// j of one K/V head, visiting the query blocks of each query head of its group (dK_j and dV_j
// summed over them in registers) — from a counter (next_tile), until none is left (the
// deterministic mode: a block a tile). Where a group's tiles are too few to fill the GPU, its
// query heads go to shares, a tile each, whose dK_j and dV_j meet in fp32 sums (RED) turned
// into 16 bits by a fourth kernel (backward_parts). With the causal mask the tiles go
// heaviest first across sections of heads (backward_order, tile_order), so that the last
// handed out are the cheapest. For a tile
// (128 keys), a block visits the query blocks 96 queries at a time at d = 64, 80 at
// d = 128, and is 3 warpgroups:
//   producer (warpgroup 0)
//     warp 0, one thread:  takes the tiles and tells the block (TileRing); per tile
//                          K_j and V_j once; then per query block i Q_i, dO_i (TMA),
//                          L_i, D_i (bulk copies) into a ring of stages, completing
//                          on the stage's "full" mbarrier;
//     warp 1, one thread:  dQ's writer: each consumer's dQ partial, staged in shared
//                          memory, added into the fp32 accumulator in device memory by
//                          one TMA bulk reduction (cp.reduce.async.bulk .add.f32); at
//                          d = 128 one writer a consumer, warps 1 and 2, each's
//                          reductions in flight beside the other's; in the
//                          deterministic mode only once the key blocks before j have
//                          added theirs (a semaphore per query block);
//     it gives its registers away (setmaxnreg).
//   consumer c (1 and 2)   64 keys each, their dK, dV in registers (fp32) — at d = 64 K_c
//                          and V_c too (16-bit A fragments, read once); per i:
//       Sᵀ  = K_c·Q_iᵀ,  dPᵀ = V_c·dO_iᵀ       wgmma, Q_i and dO_i in shared memory, K_c and
//                                               V_c too at d = 128 (from registers at d = 64)
//       Pᵀ  = 2^(Sᵀ·scale·log2 e − L_i·log2 e)  (no max, no sum: L has them)
//       dSᵀ = Pᵀ∘(dPᵀ − D_i)
//       dV_c += Pᵀ·dO_i,  dK_c += dSᵀ·Q_i       wgmma, Pᵀ and dSᵀ from registers (16 bits)
//       dQ_i += dS·K_j                          wgmma from shared memory: dSᵀ of both
//                                               consumers (it needs all 128 keys), read
//                                               transposed; dQ_i's 64-column pieces
//                                               dealt to the consumers in turn (d = 128:
//                                               one each; d = 64: one, every other i).
//                                               With 96 or 80 queries computed as
//                                               dQᵢᵀ = K_jᵀ·dSᵀ, M being the piece's 64
//                                               columns, and dS stored as such (stmatrix).
//                                               At d = 128 a step's pieces are computed in the
//                                               next step, once its dV and dK are issued:
//                                               a consumer then waits for the other's dSᵀ a step
//                                               after it was stored, not in the same step.
//   Each proxy fence after a consumer's own stores (dSᵀ; a staged dQ piece) comes after the
//   next products are issued, so that the stores are done when it is reached (at d = 256 a
//   consumer's second piece is issued before its first is staged).
// The query blocks are visited last to first: with the causal mask every key block then
// starts at the same (the last) query block, so in the deterministic mode no block waits
// long for the ones before it.
// Epilogue of a tile: dK (×scale) and dV in 16 bits through K_j's and V_j's buffers and
// TMA stores (a share: added from registers into the sums), the buffers handed back to the
// producer (kv_empty) for the next tile's K and V; the next tile's first query blocks have
// been loading meanwhile.
//
// At d = 256 (dkdv_wide_kernel, below the first) the block owns 64 keys, and the two
// consumers split the columns of dK and dV instead of the keys; each consumer leaves two dQ
// pieces a step through its one slot, the second staged in the next step, under its dPᵀ.
//
// A ragged batch (kRagged, ragged.cuh): a tile is a key block of one sequence (the key
// blocks' table), its statistics and dQ pieces those of its sequence's query blocks (the
// query blocks' table), its query rows past the sequence's end masked, and dK, dV of a
// sequence's last key block stored by hand where a TMA box would cross into the next.
#include <cuda/atomic>

#include <algorithm>

#include "common/gpu.hpp"  // sm_count
#include "steps/06_tensor_cores/backward.cuh"  // preprocess_kernel, padded_rows
#include "steps/07_hopper/forward.cuh"         // aligned_smem, epilogue_bar

namespace fa::step07 {
namespace {

constexpr int kBc = kBwdKeys, kQ = kBwdQueries, kStages = kBwdStages;
/// One piece of dQ (fp32): a query block's rows × 64 columns.
FA_HD constexpr int chunk_floats(int queries) { return queries * kPanel; }
constexpr int kChunkFloats = chunk_floats(kQ);  ///< of a 64-query block

/// Shared memory of a block with kQi queries a step, in bytes from a 1024-aligned base.
template <int kD, int kQi>
struct BwdSmem {
  static constexpr int kKVBytes = kBc * kD * 2;   ///< K_j (or V_j): kD/64 panels of 128 rows
  static constexpr int kQBytes = kQi * kD * 2;    ///< Q_i (or dO_i): kD/64 panels of kQi rows
  static constexpr int kDsBytes = kBc * kQi * 2;  ///< dSᵀ: 128 keys × 64 queries, one panel (96 or 80
                                                  ///< queries: dS, kQi rows × two panels of 64 keys)
  static constexpr int k = 0;
  static constexpr int v = k + kKVBytes;
  static constexpr int q = v + kKVBytes;              ///< [stage]
  static constexpr int dout = q + kStages * kQBytes;  ///< [stage]
  static constexpr int ds = dout + kStages * kQBytes; ///< [2]: alternate query blocks
  static constexpr int dq = ds + 2 * kDsBytes;        ///< [consumer]: a staged dQ piece (fp32)
  static constexpr int l2 = dq + kBwdConsumers * chunk_floats(kQi) * 4;  ///< [stage][kQi]: L·log2 e
  static constexpr int dsum = l2 + kStages * kQi * 4;                     ///< [stage][kQi]: D
  static constexpr int bars = dsum + kStages * kQi * 4;
  static constexpr int tiles = bars + 8 * (2 + 2 * kStages + 2 * kBwdConsumers);  ///< the tile ring (TileRing)
  static constexpr int bytes = tiles + TileRing::kBytes;                          ///< + 1024 for alignment
};

/// The mbarriers: K/V's "full" (copies done) and "empty" (both consumers done with K/V's
/// buffers — dK and dV staged there and stored out, or a share's added from registers: one
/// arrival a consumer); per stage "full" and "empty" (every
/// consumer thread done with it: each read L_i, D_i itself); per consumer "dq_full" (its dQ
/// piece staged) and "dq_empty" (the writer's bulk reduction has read it).
struct BwdBarriers {
  std::uint64_t *kv_full, *kv_empty, *q_full, *q_empty, *dq_full, *dq_empty;
  __device__ explicit BwdBarriers(unsigned char* at)
      : kv_full(reinterpret_cast<std::uint64_t*>(at)), kv_empty(kv_full + 1), q_full(kv_empty + 1),
        q_empty(q_full + kStages), dq_full(q_empty + kStages), dq_empty(dq_full + kBwdConsumers) {}
  /// By one thread, before the block's first __syncthreads.
  __device__ void init() {
    cuda::ptx::mbarrier_init(kv_full, 1);
    cuda::ptx::mbarrier_init(kv_empty, kBwdConsumers);
    for (int s = 0; s < kStages; ++s) {
      cuda::ptx::mbarrier_init(&q_full[s], 1);
      cuda::ptx::mbarrier_init(&q_empty[s], 128 * kBwdConsumers);  // one arrival per consumer thread
    }
    for (int c = 0; c < kBwdConsumers; ++c) {
      cuda::ptx::mbarrier_init(&dq_full[c], 4);  // the consumer's four warps
      cuda::ptx::mbarrier_init(&dq_empty[c], 1);
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);  // visible to TMA
  }
};

/// Named barriers of both consumers (256 threads), alternating by step: dSᵀ complete.
/// Two ids, so that a consumer that only arrives (no dQ piece this step) cannot arrive
/// twice at one barrier before the other consumer has waited on it.
__device__ __forceinline__ int ds_bar(int it) { return 1 + it % 2; }
constexpr int kEpilogueBar = 3;  ///< both consumers, before the epilogue reuses the stages
/// At d = 128, where a step's dQ pieces are computed in the next step: one named barrier
/// per step and per consumer (ids 6–9, alternating by step; 4 and 5 are epilogue_bar's), on
/// which consumer c arrives once its dSᵀ of that step is stored and its dQ piece of the step
/// before is done, and the other consumer waits — 128 threads each way.
__device__ __forceinline__ int lag_bar(int step, int c) { return 6 + 2 * (step % 2) + c; }

/// dQ_i's pieces: its 64-column panels, each the product dS·K_j[:, panel] over all the
/// block's keys. They are dealt to the consumers in turn, piece m = it·kPanels + panel of
/// the block's it-th query block to consumer m % 2: at d = 128 consumer c always takes
/// panel c; at d = 64 the consumers take the one piece on alternate query blocks; at
/// d = 256 consumer c takes panels c and c + 2.
template <int kD>
struct DqPieces {
  static constexpr int kPanels = kD / kPanel;
  /// The first panel consumer c computes at iteration `it`, or −1 if none; its others
  /// (d = 256) follow every kBwdConsumers panels.
  __device__ static int panel(int c, int it) {
    const int p = ((c - it * kPanels) % kBwdConsumers + kBwdConsumers) % kBwdConsumers;
    return p < kPanels ? p : -1;
  }
  /// The consumer of panel `panel` at iteration `it` (piece m = it·kPanels + panel: m % 2),
  /// and the parity of its staging barriers there: how many pieces it staged before, mod 2.
  __device__ static int consumer(int it, int panel) { return (it * kPanels + panel) % kBwdConsumers; }
  __device__ static std::uint32_t parity(int it, int panel) { return (it * kPanels + panel) / kBwdConsumers % 2; }
};

static_assert(kBwdConsumers == 2, "pieces and the alternating barriers are written for two consumers");

/// The fp32 dQ accumulator's layout: per head and query block, kD/64 pieces of 64
/// columns, each as the consumers' registers hold it — registers 4u … 4u + 3 of thread
/// tid of a warpgroup at 512u + 4·tid — so that a warp stages 512 contiguous bytes in
/// shared memory with one 16-byte store a thread, and a piece is one contiguous run (16 KiB;
/// 20 or 24 KiB with 80 or 96 queries) for one bulk reduction. The convert kernel undoes it.
__host__ __device__ constexpr std::size_t dq_piece(std::size_t bh, int q_blocks, int i, int panel, int panels,
                                                   int chunk) {
  return ((bh * q_blocks + i) * panels + panel) * std::size_t(chunk);
}
/// The other way: piece number `piece` of that order — its head, query block and panel.
struct DqPieceAt {
  std::size_t bh;
  int i, panel;
};
__device__ __forceinline__ DqPieceAt dq_piece_at(std::size_t piece, int panels, int q_blocks) {
  const std::size_t block = piece / panels;
  return {block / q_blocks, int(block % q_blocks), int(piece % panels)};
}
/// Whether a step of `queries` queries computes dQ's pieces transposed (dQᵢᵀ = K_jᵀ·dSᵀ):
/// a wgmma's M is 64, so any other number of queries cannot be an accumulator's rows.
FA_HD constexpr bool dq_transposed(int queries) { return queries != kRowsPerConsumer; }

struct BwdParams {
  int N, Np, q_blocks;
  // A tile's unit: `walk` query heads of one K/V head, which it visits in turn — the whole group
  // (walk = G, parts = 1), or one of `parts` shares of it (walk = G/parts) where the group's
  // tiles would be too few to fill the GPU (backward_parts).
  int walk, parts;
  TileOrder schedule;  // the order of the T_c·B·H_kv·parts tiles (BwdTile): blocks = T_c
  int tiles;           // T_c·B·H_kv·parts
  float scale;
  bool deterministic;
  Band band;  // the scores a query keeps: the causal mask, a window (step07.hpp)
  const float *l2, *dsum;  // preprocess's, [B·H][Np]
  float* dq_acc;           // [B·H][q_blocks][kD/64][a piece: chunk_floats(queries a step)]
  int* order;              // [B·H][q_blocks]: key blocks that have added into query block i
  int* taken;              // tiles taken past the grid's first (next_tile), zeroed by the preprocess
  float *dk_acc, *dv_acc;  // parts > 1: [B·H_kv][N][d], the shares' dK (×scale) and dV added in fp32
  // A ragged batch's (the kRagged kernels; N above is then T, the packed rows of a head): the
  // key blocks' table and, for each, the first entry of its sequence in the query blocks' table
  // (its statistics' and dQ pieces' block index); the order and number of the tiles, made with it;
  // dK and dV, where a sequence's last key block is stored by hand (a TMA box would cross).
  const SeqBlock* key_blocks = nullptr;
  const int* q_first = nullptr;
  const TileOrder* ragged_order = nullptr;
  const int* ragged_tiles = nullptr;
  void *dk = nullptr, *dv = nullptr;
};

/// The dK/dV kernels' tiles — key block j of unit u — in the order the blocks take them
/// (the schedule, a TileOrder: step07.hpp): a unit's p-th tile is its key block j = p, so
/// that with the causal mask the key blocks with the most query blocks to visit come first
/// (across sections of heads), and in the deterministic mode a tile waits only on tiles taken
/// before it.
struct BwdTile {
  int j, unit;
};
/// The tiles' order and number: a dense problem's from the launch, a ragged batch's made on the
/// device with its table.
template <bool kRagged>
__device__ __forceinline__ const TileOrder& tile_schedule(const BwdParams& prm) {
  if constexpr (kRagged) return *prm.ragged_order;
  else return prm.schedule;
}
template <bool kRagged>
__device__ __forceinline__ int tile_count(const BwdParams& prm) {
  if constexpr (kRagged) return *prm.ragged_tiles;
  else return prm.tiles;
}
/// A tile as a block's producer tells the block of it (TileRing): its index unit after unit,
/// u·T_c + j — so that only the producer works out the sections' order (schedule.at, from
/// the position it took: blockIdx.x, then next_tile); past the last, the number of tiles.
__device__ __forceinline__ BwdTile bwd_tile(const TileOrder& schedule, int tile) {
  return {tile % schedule.blocks, tile / schedule.blocks};
}
/// A tile's key block in its sequence: block j of the rows start … start + N − 1, and the
/// query blocks' index of its sequence's first (where its statistics and dQ pieces lie). A
/// dense problem's tile u is key block u of its one sequence; a ragged batch's, entry u.
struct KeyTile {
  int j, start, N, q_first;
};
template <bool kRagged>
__device__ __forceinline__ KeyTile key_tile(const BwdParams& prm, int u) {
  if constexpr (kRagged) {
    const SeqBlock b = prm.key_blocks[u];
    return {b.i, b.start, b.length, prm.q_first[u]};
  } else {
    return {u, 0, prm.N, 0};
  }
}
/// The query blocks of one query head that key block j (kKeys keys) of a sequence of N rows
/// visits, kQi queries a step: from the block of the first row that sees one of its keys (the
/// mask's and the window's band) to the block of the last.
struct QRange {
  int first, last;
};
template <int kQi, int kKeys>
__device__ __forceinline__ QRange q_range(const BwdParams& prm, int j, int N) {
  const int k0 = j * kKeys, k1 = (k0 + kKeys < N ? k0 + kKeys : N) - 1;
  return {prm.band.first_row(k0) / kQi, prm.band.last_row(k1, N) / kQi};
}
/// Steps of key block j's tile: the query blocks of each query head of its unit, so that dK_j
/// and dV_j sum over the unit's heads in registers.
template <int kQi, int kKeys>
__device__ __forceinline__ int bwd_steps(const BwdParams& prm, int j, int N) {
  const QRange r = q_range<kQi, kKeys>(prm, j, N);
  return prm.walk * (r.last - r.first + 1);
}
/// Query block i of a head at step `it` of key block j's tile (the consumers' StepWalk::i,
/// worked out again each step: fewer registers held across the step than the walk's). The
/// remainder only past the first head: a division each step slowed the consumers (lab: 07_gqa_window).
template <int kQi, int kKeys>
__device__ __forceinline__ int step_block(const BwdParams& prm, int j, int it, int N) {
  const QRange r = q_range<kQi, kKeys>(prm, j, N);
  const int span = r.last - r.first + 1;
  return r.last - (it < span ? it : it % span);
}
/// A tile's steps in order: query block i of query head qh, each head's blocks last to first
/// (with the mask every key block starts at the last query block), the unit's heads in turn.
/// Two counters, no division: the producer and dQ's writer run on a producer's 24 registers.
struct StepWalk {
  int i, qh, first, last, end;  // end: the head after the unit's last
  __device__ StepWalk(const BwdParams& prm, QRange r, int unit)
      : i(r.last), qh(unit * prm.walk), first(r.first), last(r.last), end(qh + prm.walk) {}
  __device__ bool done() const { return qh == end; }
  __device__ void next() {
    if (i == first) {
      i = last;
      ++qh;
    } else {
      --i;
    }
  }
};
/// A block starts on tile blockIdx.x; the producer takes the next once it has issued a
/// tile's loads. In a grid of a block a tile (the deterministic mode) there is none; in a
/// persistent grid it is the next tile no block has taken yet (take_tile).
template <bool kRagged>
__device__ __forceinline__ int next_tile(const BwdParams& prm) {
  return take_tile(prm.taken, tile_count<kRagged>(prm));
}

/// dQ's writer, by one thread: the pieces of the block's tiles (TileRing), as their consumers
/// stage them (consumer c's at staging + c·chunk, announced on dq_full[c]), into the
/// accumulator by one bulk reduction each; a staging slot is handed back (dq_empty[c]) once
/// read. The pieces are numbered by the block's steps over all its tiles, as the consumers
/// number them. With one writer (d = 64 and 256) it takes every consumer's pieces, one
/// reduction at a time; with one a consumer (d = 128: kWriters = 2) writer w takes consumer
/// w's, so that one consumer's reduction does not wait behind the other's. In the
/// deterministic mode a query block's pieces go only after the key blocks before this one
/// have added theirs: order[i] counts the writers done with query block i (of a query head),
/// each key block adding kShares (the writers that hold a piece of it), so key block j's
/// writers wait until it reaches kShares times the key blocks before j that visit query block
/// i — those from the first holding a key its first row sees (j·kShares without a window).
template <int kD, int kQi, int kKeys, int kWriters, bool kRagged>
__device__ void write_dq(const BwdParams& prm, const TileRing& ring, const float* staging, std::uint64_t* dq_full,
                         std::uint64_t* dq_empty, int writer) {
  using P = DqPieces<kD>;
  constexpr int kChunk = chunk_floats(kQi);
  constexpr int kShares = kWriters == 1 || P::kPanels == 1 ? 1 : kBwdConsumers;
  static_assert(kWriters == 1 || kWriters == kBwdConsumers, "one writer, or one a consumer");
  cudaGridDependencySynchronize();  // launched early: the preprocess has zeroed the accumulator
  int done = 0;                     // the block's steps so far (the consumers' numbering)
  for (int n = 0;; ++n) {
    const int tile = ring.take(n);
    if (tile >= tile_count<kRagged>(prm)) break;
    const auto [u, unit] = bwd_tile(tile_schedule<kRagged>(prm), tile);
    [[maybe_unused]] const auto [j, start, N, q_first] = key_tile<kRagged>(prm, u);
    StepWalk walk(prm, q_range<kQi, kKeys>(prm, j, N), unit);
    for (; !walk.done(); walk.next(), ++done) {
      const int step = done, i = walk.i, qh = walk.qh, qi = q_first + i;  // qi: its statistics' and pieces' block
      // This writer's first panel of the step (every kWriters-th after it is its too), or none.
      const int first = kWriters == 1 ? 0 : P::panel(writer, step);
      if (first < 0) continue;
      cuda::atomic_ref<int, cuda::thread_scope_device> order(prm.order[std::size_t(qh) * prm.q_blocks + qi]);
      if (prm.deterministic) {
        // The key blocks before j that visit query block i: from the first its first row sees.
        const int before = j - prm.band.first_key(i * kQi) / kKeys;
        while (order.load(cuda::memory_order_acquire) < before * kShares) {
        }
        cuda::ptx::fence_proxy_async(cuda::ptx::space_global);  // the earlier blocks' sums, for this proxy
      }
      for (int panel = first; panel < P::kPanels; panel += kWriters) {
        const int c = P::consumer(step, panel);
        wait(&dq_full[c], P::parity(step, panel));
        cuda::ptx::cp_reduce_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, cuda::ptx::op_add,
                                        prm.dq_acc + dq_piece(qh, prm.q_blocks, qi, panel, P::kPanels, kChunk),
                                        staging + c * kChunk, std::uint32_t(kChunk * 4));
        cuda::ptx::cp_async_bulk_commit_group();
        cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});  // the staging is read
        arrive(&dq_empty[c]);
      }
      if (prm.deterministic) {
        cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});  // this writer's sums are in device memory
        cuda::ptx::fence_proxy_async(cuda::ptx::space_global);
        order.fetch_add(1, cuda::memory_order_release);
      }
    }
  }
  cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
}

/// A query block's statistics, kQi floats of L·log2 e or of D (preprocess's), into
/// shared memory by one bulk copy that completes on bar.
template <int kQi = kQ>
__device__ __forceinline__ void load_stats(unsigned char* dst, const float* src, std::uint64_t* bar) {
  cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, src, std::uint32_t(kQi * 4), bar);
}

/// A consumer's dK (×scale) and dV, m64nN accumulators (register 4n + 2h + e = key
/// 16·warp + g + 8h, column col0 + 8n + 2t + e), in 16 bits into 64-row tiles of the
/// panel layout, for the epilogue's TMA stores.
template <class T, int N>
__device__ __forceinline__ void store_dkdv(unsigned char* dk_tile, unsigned char* dv_tile, const float (&dk)[N / 2],
                                           const float (&dv)[N / 2], float scale, int col0, int warp, int g, int t) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 16 * warp + g + 8 * h;
#pragma unroll
    for (int n = 0; n < N / 8; ++n) {
      const std::uint32_t at = swizzled(kRowsPerConsumer, r, col0 + 8 * n + 2 * t);
      *reinterpret_cast<std::uint32_t*>(dk_tile + at) =
          mma::Mma<T>::pack(scale * dk[4 * n + 2 * h], scale * dk[4 * n + 2 * h + 1]);
      *reinterpret_cast<std::uint32_t*>(dv_tile + at) = mma::Mma<T>::pack(dv[4 * n + 2 * h], dv[4 * n + 2 * h + 1]);
    }
  }
}

/// A share of a group (parts > 1): its dK_j (×scale) and dV_j, fp32 registers as store_dkdv
/// takes them (key key0 + 8h, column col0 + 8n + 2t + e of a head of kD columns), added into
/// the sums of K/V head kvh by vector reductions (atomicAdd of a float2, its value unread:
/// RED); keys past the sequence's N dropped (its rows from `start` of the head's prm.N).
template <int kD, int kCols>
__device__ __forceinline__ void add_dkdv(const BwdParams& prm, const float (&dk)[kCols / 2],
                                         const float (&dv)[kCols / 2], int kvh, int key0, int col0, int t, int N,
                                         int start) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = key0 + 8 * h;
    if (key >= N) continue;
    const std::size_t at = (std::size_t(kvh) * prm.N + start + key) * kD + col0 + 2 * t;
#pragma unroll
    for (int n = 0; n < kCols / 8; ++n) {
      atomicAdd(reinterpret_cast<float2*>(prm.dk_acc + at + 8 * n),
                make_float2(prm.scale * dk[4 * n + 2 * h], prm.scale * dk[4 * n + 2 * h + 1]));
      atomicAdd(reinterpret_cast<float2*>(prm.dv_acc + at + 8 * n), make_float2(dv[4 * n + 2 * h], dv[4 * n + 2 * h + 1]));
    }
  }
}

/// A tile's dK and dV, staged in K/V's buffers (a box of kBox rows from key `first` of its
/// sequence), out by TMA from thread 0, then the buffers handed back once read. In a ragged
/// batch a box that would run past its sequence's end (into the next one's rows) goes by
/// hand, by every thread; the barrier that needs (sync) is taken on every tile, as under
/// the branch ptxas spilled the main loop's registers (lab: 07_ragged).
template <class T, int kD, int kBox, bool kRagged, class Sync>
__device__ __forceinline__ void write_dkdv(const BwdParams& prm, const CUtensorMap* dk_map, const CUtensorMap* dv_map,
                                           unsigned char* dk_tile, unsigned char* dv_tile, std::uint64_t* kv_empty,
                                           int first, int N, int start, int unit, int thread, int threads,
                                           Sync&& sync) {
  bool by_hand = false;
  if constexpr (kRagged) {
    by_hand = first + kBox > N;
    if (by_hand) {
      const std::size_t at = (std::size_t(unit) * prm.N + start + first) * kD;
      store_rows<kD>(static_cast<T*>(prm.dk) + at, dk_tile, kBox, N - first, thread, threads);
      store_rows<kD>(static_cast<T*>(prm.dv) + at, dv_tile, kBox, N - first, thread, threads);
    }
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);  // before TMA writes the next K, V there
    sync();
  }
  if (thread == 0) {
    if (!by_hand) {
      store_tile(dk_map, dk_tile, start + first, unit);  // unit = K/V head
      store_tile(dv_map, dv_tile, start + first, unit);
      cuda::ptx::cp_async_bulk_commit_group();
      cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
    }
    arrive(kv_empty);
  }
}

/// A consumer's dQ piece (fp32: an m64 accumulator of R registers a thread, 64 × 64 or
/// 64 × 80 or 64 × 96 transposed) to the writer, in two parts. stage_dq: once the slot is free
/// (dq_empty's phase of this parity), the piece stored as the accumulator lays it out
/// (dq_piece). announce_dq: the stores fenced for the bulk reduction's proxy, and the piece
/// announced by each warp's lane 0 — the fence waits until the warp's stores are done, so
/// the kernels issue the next products between the two.
template <int R>
__device__ __forceinline__ void store_dq(const float (&dq)[R], float* slot, int tid) {
#pragma unroll
  for (int u = 0; u < R / 4; ++u)
    *reinterpret_cast<float4*>(slot + 512 * u + 4 * tid) =
        make_float4(dq[4 * u], dq[4 * u + 1], dq[4 * u + 2], dq[4 * u + 3]);
}
template <int R>
__device__ __forceinline__ void stage_dq(const float (&dq)[R], float* slot, std::uint64_t* empty, std::uint32_t parity,
                                         int tid) {
  wait(empty, parity);
  store_dq(dq, slot, tid);
}
__device__ __forceinline__ void announce_dq(std::uint64_t* full, int tid) {
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);  // read by the bulk reduction
  __syncwarp();
  if (tid % 32 == 0) arrive(full);
}

/// dQ_i's piece `panel` = dS·K_j[:, panel] over the block's kKeys keys (128; 64 at d = 256),
/// issued (one commit group): A = dSᵀ read transposed (MN-major: the queries run along its rows),
/// B = K_j MN-major; k steps of 16 keys, 2048 bytes apart in both. With 96 or 80 queries (kDqT)
/// its transpose, dQ_iᵀ[panel] = K_j[:, panel]ᵀ·dSᵀ: A = K_j MN-major, B = dS K-major (kQi rows,
/// keys along them).
template <class T, int kQi, bool kDqT, int kKeys = kBc>
__device__ __forceinline__ void issue_dq(float (&dq)[chunk_floats(kQi) / 128], std::uint32_t k_tile, int panel,
                                         std::uint32_t ds_tile) {
  wgmma_fence();
  if constexpr (kDqT)
    ss_mnk<T, kQi, kKeys>(dq, k_tile + panel * kKeys * 128, kKeys * 128, ds_tile, kQi);
  else
    ss_mnmn<T, kPanel, kKeys>(dq, ds_tile, kKeys * 128, k_tile + panel * kKeys * 128, kKeys * 128);
  wgmma_commit();
}

static_assert(backward_queries(64) == 96 && backward_queries(128) == 80 && backward_queries(256) == kQ,
              "the queries a step the kernels below are written for");

template <class T, int kD, bool kRagged>
__global__ void __launch_bounds__(128 * (1 + kBwdConsumers), 1)
    dkdv_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap do_map,
                const __grid_constant__ CUtensorMap dk_map, const __grid_constant__ CUtensorMap dv_map,
                const BwdParams prm) {
#if FA_SM90A
  constexpr int kQi = backward_queries(kD);  // queries a step: Q_i's rows
  constexpr bool kDqT = dq_transposed(kQi);  // 96 or 80 queries: dQᵢᵀ = K_jᵀ·dSᵀ
  static_assert(kDqT, "96 or 80 queries a step: dQ's pieces computed transposed");
  using L = BwdSmem<kD, kQi>;
  using P = DqPieces<kD>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = aligned_smem(smem_raw);
  BwdBarriers bars(smem + L::bars);

  // A writer a consumer at d = 128 only: at d = 256 four pieces a step already load the L2 most,
  // and at d = 64 a second writer bought nothing (note 07).
  constexpr int kWriters = kD == 128 ? kBwdConsumers : 1;
  TileRing ring(smem + L::tiles);
  // The convert kernel may be launched from now on (launch_early); it waits for this grid.
  cudaTriggerProgrammaticLaunchCompletion();
  if (threadIdx.x == 0) {
    ring.init(kWriters + 128 * kBwdConsumers);
    bars.init();
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    // ---- Producer warpgroup.
    release_registers<kProducerRegs>();
    if (threadIdx.x == 0) {
      int issued = 0;  // query blocks loaded, over the block's tiles: the stages' ring runs on across them
      int start = 0, q_first = 0;  // the tile's sequence: its first row, its first query block (a ragged batch's)
      auto load_q = [&](StepWalk& walk) {  // a tile's next step: Q_i, dO_i, L_i, D_i into the next stage
        const int s = issued % kStages, i = walk.i, qh = walk.qh;
        walk.next();
        wait(&bars.q_empty[s], (issued / kStages) % 2 ^ 1);  // a fresh barrier: parity 1 is done
        arrive_expecting(&bars.q_full[s], 2 * L::kQBytes + 2 * kQi * 4);
        load_tile(&q_map, smem + L::q + s * L::kQBytes, &bars.q_full[s], start + i * kQi, qh);
        load_tile(&do_map, smem + L::dout + s * L::kQBytes, &bars.q_full[s], start + i * kQi, qh);
        const std::size_t stat = std::size_t(qh) * prm.Np + std::size_t(q_first + i) * kQi;
        load_stats<kQi>(smem + L::l2 + s * kQi * 4, prm.l2 + stat, &bars.q_full[s]);
        load_stats<kQi>(smem + L::dsum + s * kQi * 4, prm.dsum + stat, &bars.q_full[s]);
        ++issued;
      };
      for (int n = 0, taken = blockIdx.x;; ++n, taken = next_tile<kRagged>(prm)) {
        if (taken >= tile_count<kRagged>(prm)) {  // the end, told to the rest of the block
          ring.publish(n, tile_count<kRagged>(prm));
          break;
        }
        const auto [u, unit] = tell_tile(tile_schedule<kRagged>(prm), ring, n, taken);  // the unit's u-th tile
        const KeyTile kt = key_tile<kRagged>(prm, u);
        const int j = kt.j;
        start = kt.start, q_first = kt.q_first;
        StepWalk walk(prm, q_range<kQi, kBc>(prm, j, kt.N), unit);
        const int kvh = unit / prm.parts;
        if (n > 0) {  // a later tile: its first query blocks load as their stages free, under the last tile's epilogue,
          for (int k = 0; k < kStages && !walk.done(); ++k) load_q(walk);
          wait(bars.kv_empty, (n - 1) % 2);  // and K_j, V_j once that epilogue is done with their buffers
        }
        arrive_expecting(bars.kv_full, 2 * L::kKVBytes);
        load_tile(&k_map, smem + L::k, bars.kv_full, start + j * kBc, kvh);
        load_tile(&v_map, smem + L::v, bars.kv_full, start + j * kBc, kvh);
        // Launched early, this block may have started while the preprocess still runs:
        // K_j and V_j are inputs, but L·log2 e, D and the tile counter are the preprocess's.
        if (n == 0) cudaGridDependencySynchronize();
        while (!walk.done()) load_q(walk);
      }
    } else if (const int w = int(threadIdx.x) / 32 - 1; threadIdx.x % 32 == 0 && w >= 0 && w < kWriters) {
      // warp 1 (at d = 128: and warp 2), one thread: dQ's writer w
      write_dq<kD, kQi, kBc, kWriters, kRagged>(prm, ring, reinterpret_cast<const float*>(smem + L::dq), bars.dq_full,
                                       bars.dq_empty, w);
    }
    return;
  }

  // ---- Consumer warpgroup c: keys 64c .. 64c + 63 of each of the block's key blocks.
  claim_registers<FwdTile{kBwdConsumers, kBc, kStages}.consumer_regs()>();
  const int c = threadIdx.x / 128 - 1, tid = threadIdx.x % 128, warp = tid / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const float mul = prm.scale * step06::kLog2e;
  const std::uint32_t k_tile = smem_u32(smem + L::k), v_tile = smem_u32(smem + L::v);
  const std::uint32_t kv_rows = kRowsPerConsumer * c * 128;  // consumer c's keys inside a K/V panel
  float* stage_dq_at = reinterpret_cast<float*>(smem + L::dq) + c * chunk_floats(kQi);  // this consumer's slot
  constexpr bool kKvRegs = kD == 64;
  // dQ's pieces a step late at d = 128 only: at d = 64, where the consumers take the one piece on
  // alternate steps and drift half a step apart, a barrier each way every step cost more (note 07).
  constexpr bool kDqLate = kD == 128;

  for (int n = 0, done = 0;; ++n) {  // done: the block's steps before this tile (the stages' ring and dQ's pieces)
    const int tile = ring.take(n);
    if (tile >= tile_count<kRagged>(prm)) break;
    const auto [u, unit] = bwd_tile(tile_schedule<kRagged>(prm), tile);
    [[maybe_unused]] const auto [j, start, N, q_first] = key_tile<kRagged>(prm, u);  // N: the sequence's rows
    const int k0 = j * kBc, steps = bwd_steps<kQi, kBc>(prm, j, N);
    const int key0 = k0 + kRowsPerConsumer * c + 16 * warp + g;  // this thread's keys: key0, key0 + 8
    wait(bars.kv_full, n % 2);

    // dK_c, dV_c: 64 keys × kD; register 4n + 2h + e = key g + 8h, column 8n + 2t + e
    float dk[kD / 2] = {}, dv[kD / 2] = {};
    // d = 64: K_c and V_c as A fragments, read once. An m64n64k16 product with both operands in
    // shared memory reads 4 KiB for 64K multiply-adds, at the tensor cores' rate about the 128
    // bytes a cycle shared memory delivers, so Sᵀ and dPᵀ were bound by it; from registers, 2 KiB.
    // (At d = 128 the 64 registers they would take are dK's and dV's.)
    std::uint32_t ka[kD / 16][4], va[kD / 16][4];  // [16-column k step][register]
    if constexpr (kKvRegs) {
      load_a<kD>(ka, smem + L::k, kBc, kRowsPerConsumer * c, warp, g, t);
      load_a<kD>(va, smem + L::v, kBc, kRowsPerConsumer * c, warp, g, t);
    }

    // Main loop over the query blocks.
    bool staged = false;  // a dQ piece stored in this consumer's slot but not yet announced
    // dQ's piece of step `piece_step`, once its product is done, staged for the writer; announced
    // under the next step's products (the proxy fence waits until the stores are done).
    auto stage_piece = [&](float(&dq)[chunk_floats(kQi) / 128], int piece_step, int panel) {
      wgmma_wait<0>(dq);
      stage_dq(dq, stage_dq_at, &bars.dq_empty[c], P::parity(piece_step, panel) ^ 1, tid);
      staged = true;
    };
    for (int it = 0; it < steps; ++it) {
      const int step = done + it, s = step % kStages, q0 = step_block<kQi, kBc>(prm, j, it, N) * kQi;
      const std::uint32_t q_tile = smem_u32(smem + L::q + s * L::kQBytes);
      const std::uint32_t do_tile = smem_u32(smem + L::dout + s * L::kQBytes);
      const float* l2 = reinterpret_cast<const float*>(smem + L::l2) + s * kQi;
      const float* dsum = reinterpret_cast<const float*>(smem + L::dsum) + s * kQi;
      unsigned char* ds_tile = smem + L::ds + (step % 2) * L::kDsBytes;
      wait(&bars.q_full[s], (step / kStages) % 2);
      // Sᵀ = K_c·Q_iᵀ and dPᵀ = V_c·dO_iᵀ: kD/16 k steps each, both operands K-major; at d = 64
      // K_c and V_c from registers (kKvRegs), so that only Q_i and dO_i are read from shared memory.
      float st[kQi / 2], dpt[kQi / 2];  // 64 keys × kQi queries: register 4n + 2h + e = key g + 8h, query 8n + 2t + e
      wgmma_fence();
      if constexpr (kKvRegs)
        rs_kk<T, kQi, kD>(st, ka, q_tile, kQi);
      else
        ss_kk<T, kQi, kD>(st, k_tile + kv_rows, kBc, q_tile, kQi);
      wgmma_commit();
      if constexpr (kKvRegs)
        rs_kk<T, kQi, kD>(dpt, va, do_tile, kQi);
      else
        ss_kk<T, kQi, kD>(dpt, v_tile + kv_rows, kBc, do_tile, kQi);
      wgmma_commit();
      if (staged) {  // the last step's dQ piece, its stores done under these products' issue
        announce_dq(&bars.dq_full[c], tid);
        staged = false;
      }

      // Pᵀ (fp32 in st), masked where a key is past N or outside the query's band (causal: after it).
      wgmma_wait<1>(st);
#pragma unroll
      for (int x = 0; x < kQi / 2; ++x) st[x] = mma::exp2_approx(fmaf(st[x], mul, -l2[8 * (x / 4) + 2 * t + x % 2]));
      // Warp-uniform: whether the warp's 16 keys against the step's queries cross N or the band's
      // edges; in a ragged batch, whether the step's queries run past the sequence's end (its
      // last rows are the next sequence's, not padding).
      if ((kRagged && q0 + kQi > N) || prm.band.cuts(q0, q0 + kQi - 1, key0 - g, key0 - g + 15, N)) {
#pragma unroll
        for (int x = 0; x < kQi / 2; ++x) {
          const int row = q0 + 8 * (x / 4) + 2 * t + x % 2;
          if (!prm.band.keeps(row, key0 + 8 * (x % 4 / 2), N) || (kRagged && row >= N)) st[x] = 0.0f;
        }
      }
      // dV_c += Pᵀ·dO_i: Pᵀ rounded to 16 bits as A fragments; dO MN-major (its rows are the k index).
      // dK_c += dSᵀ·Q_i, dSᵀ = Pᵀ∘(dPᵀ − D_i) once dPᵀ is done. Both products wait until Pᵀ and
      // dSᵀ are formed and rounded: at d = 128 Pᵀ's 40 registers cannot stay beside its 16-bit
      // copy and dK, dV, dPᵀ (ptxas spills and serialises the wgmmas), and at d = 64 (K_c and
      // V_c beside them) the kernel takes the same order.
      std::uint32_t pa[kQi / 16][4], dsa[kQi / 16][4];  // [16-query k step][register]: Pᵀ, dSᵀ
      wgmma_wait<0>(dpt);
#pragma unroll
      for (int x = 0; x < kQi / 2; ++x) dpt[x] = st[x] * (dpt[x] - dsum[8 * (x / 4) + 2 * t + x % 2]);
      to_a<T, kQi>(st, pa);
      to_a<T, kQi>(dpt, dsa);
      // dSᵀ into shared memory for dQ, this consumer's 64 keys, transposed: rows = the queries,
      // two panels of 64 keys (store_a_transposed). Stored before dV's and dK's products are
      // issued, so that the stores are done by the fence.
      // At d = 128 first the other consumer's dSᵀ of the last step stored, and its dQ piece of
      // the step before done (that piece read the buffer this step's dSᵀ goes to).
      if (kDqLate && it > 0) named_sync(lag_bar(step - 1, 1 - c), 128 * kBwdConsumers);
      store_a_transposed<kQi>(ds_tile, dsa, kQi, kRowsPerConsumer * c, warp, lane);
      wgmma_fence();
      rs_mn<T, kD, kQi>(dv, pa, do_tile, kQi * 128);
      wgmma_commit();
      rs_mn<T, kD, kQi>(dk, dsa, q_tile, kQi * 128);
      wgmma_commit();
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);  // ordinary stores, read by wgmma
      // The stage is free once dV's and dK's products are done: its Q_i, dO_i read by the
      // products, its L_i, D_i by this thread's ordinary loads, which the fence orders before
      // the bulk copies that will refill it (PTX ISA, "Memory Consistency Model: Proxies":
      // generic and async proxy accesses to one location need a proxy fence between them).
      // Every thread arrives. dQ's piece reads only dSᵀ and K_j: it may still run.
      auto release_stage = [&] {
        fence_registers(pa);
        fence_registers(dsa);
        cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
        arrive(&bars.q_empty[s]);
      };
      float dq[chunk_floats(kQi) / 128];  // register 4n + 2h + e = query 16w + g + 8h, column 8n + 2t + e
                                          // (transposed: column 16w + g + 8h, query 8n + 2t + e)
      if constexpr (kDqLate) {
        // d = 128: the last step's piece, from its dSᵀ (the other buffer), now that this step's dV
        // and dK are issued; the other consumer's dSᵀ of it was waited for before this step's
        // stores (lag_bar). Then this step's dSᵀ stored and the last piece done: told.
        const int panel = it > 0 ? P::panel(c, step - 1) : -1;
        if (panel >= 0) {
          issue_dq<T, kQi, kDqT>(dq, k_tile, panel, smem_u32(smem + L::ds + ((step - 1) % 2) * L::kDsBytes));
          wgmma_wait<1>(dv);  // dV's and dK's products (dQ's may run)
          wgmma_wait<1>(dk);
          release_stage();
          stage_piece(dq, step - 1, panel);
        } else {
          wgmma_wait<0>(dv);
          wgmma_wait<0>(dk);
          release_stage();
        }
        named_arrive(lag_bar(step, c), 128 * kBwdConsumers);
      } else {
        const int panel = P::panel(c, step);
        if (panel < 0) {
          named_arrive(ds_bar(step), 128 * kBwdConsumers);  // no piece this step: dSᵀ is the other's to use
          wgmma_wait<0>(dv);
          wgmma_wait<0>(dk);
          release_stage();
        } else {
          named_sync(ds_bar(step), 128 * kBwdConsumers);
          issue_dq<T, kQi, kDqT>(dq, k_tile, panel, smem_u32(ds_tile));
          wgmma_wait<1>(dv);  // dV's and dK's products (dQ's may run)
          wgmma_wait<1>(dk);
          release_stage();
          stage_piece(dq, step, panel);
        }
      }
    }
    if constexpr (kDqLate) {  // the tile's last piece, once the other consumer's dSᵀ of it is stored
      const int last = done + steps - 1, panel = P::panel(c, last);
      if (staged) {  // the piece of the step before goes to the writer before this one takes the slot
        announce_dq(&bars.dq_full[c], tid);
        staged = false;
      }
      named_sync(lag_bar(last, 1 - c), 128 * kBwdConsumers);
      if (panel >= 0) {
        float dq[chunk_floats(kQi) / 128];
        issue_dq<T, kQi, kDqT>(dq, k_tile, panel, smem_u32(smem + L::ds + (last % 2) * L::kDsBytes));
        stage_piece(dq, last, panel);
      }
    }
    if (staged) announce_dq(&bars.dq_full[c], tid);  // the tile's last piece

    // Epilogue: dK = scale·Σ dSᵀ·Q and dV in 16 bits, into K/V's buffers (free once both
    // consumers are past their last products; the stages already hold the next tile's
    // query blocks), out by TMA; keys past N dropped by the map. K/V's buffers are handed
    // back to the producer once the stores have read them. A share adds its dK and dV
    // into the fp32 sums from registers instead, and hands the buffers back first.
    named_sync(kEpilogueBar, 128 * kBwdConsumers);
    if (prm.parts > 1) {
      // At d = 64 K_c and V_c were read by plain loads: fenced before TMA writes the next K, V there.
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
      named_sync(epilogue_bar(c), 128);
      if (tid == 0) arrive(bars.kv_empty);
      add_dkdv<kD, kD>(prm, dk, dv, unit / prm.parts, key0, 0, t, N, start);
    } else {
      unsigned char* dk_tile = smem + L::k + c * L::kKVBytes / 2;
      unsigned char* dv_tile = smem + L::v + c * L::kKVBytes / 2;
      store_dkdv<T, kD>(dk_tile, dv_tile, dk, dv, prm.scale, 0, warp, g, t);
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
      named_sync(epilogue_bar(c), 128);
      write_dkdv<T, kD, kRowsPerConsumer, kRagged>(prm, &dk_map, &dv_map, dk_tile, dv_tile, bars.kv_empty,
                                                   k0 + kRowsPerConsumer * c, N, start, unit, tid, 128,
                                                   [&] { named_sync(epilogue_bar(c), 128); });
    }
    done += steps;
  }
#endif
}

// ---------------------------------------------------------------------------------
// d = 256: the consumers split the columns.
//
// dK and dV of 64 keys would take 2·64·256 fp32 a consumer, 256 registers a thread, so
// at d = 256 a block owns 64 keys (B_c = 64, step 06's block there too) and the two
// consumers share each query block's work in another way (FlashAttention-3's at d = 256):
//   Sᵀ, dPᵀ   consumer c: all 64 keys × its half of the queries, 32c … 32c + 31 (m64n32);
//   Pᵀ, dSᵀ   in 16 bits into shared memory (a 64 × 64 tile each), then a barrier between
//             the consumers: every product below needs both halves;
//   dV, dK    consumer c holds columns 128c … 128c + 127 of both (64 + 64 registers):
//             dV_c += Pᵀ·dO_i[:, cols], dK_c += dSᵀ·Q_i[:, cols], A from the tiles;
//   dQ        consumer c: pieces c and c + 2 (DqPieces), dS·K_j[:, panel] over 64 keys.
// Shared memory: K_j, V_j; Q_i and L_i in two stages but dO_i and D_i in one (two would
// not fit beside the rest; dO_i is free once dV's product is done, so the next one loads
// under dK's and dQ's); Pᵀ and dSᵀ for alternate query blocks; a dQ piece a consumer.
constexpr int kWideD = 256, kWideKeys = backward_keys(kWideD);

struct WideSmem {
  static constexpr int kKVBytes = kWideKeys * kWideD * 2;  ///< K_j (or V_j): 4 panels of 64 rows
  static constexpr int kQBytes = kQ * kWideD * 2;          ///< Q_i (or dO_i): 4 panels of 64 rows
  static constexpr int kTileBytes = kWideKeys * kQ * 2;    ///< Pᵀ (or dSᵀ): 64 keys × 64 queries, one panel
  static constexpr int k = 0;
  static constexpr int v = k + kKVBytes;
  static constexpr int q = v + kKVBytes;              ///< [stage]
  static constexpr int dout = q + kStages * kQBytes;  ///< one stage
  static constexpr int p = dout + kQBytes;            ///< [2]: alternate query blocks
  static constexpr int ds = p + 2 * kTileBytes;       ///< [2]
  static constexpr int dq = ds + 2 * kTileBytes;      ///< [consumer]: a staged dQ piece (fp32)
  static constexpr int l2 = dq + kBwdConsumers * kChunkFloats * 4;  ///< [stage][kQ]: L·log2 e
  static constexpr int dsum = l2 + kStages * kQ * 4;                 ///< [kQ]: D
  static constexpr int bars = dsum + kQ * 4;
  static constexpr int tiles = bars + 8 * (2 + 2 * kStages + 2 + 2 * kBwdConsumers);  ///< the tile ring (TileRing)
  static constexpr int bytes = tiles + TileRing::kBytes;                              ///< + 1024 for alignment
};
static_assert(WideSmem::bytes + 1024 <= kBlockSmemBytes, "d = 256's block fits the 227 KiB a Hopper block may take");

/// The mbarriers at d = 256: BwdBarriers' with dO's stage apart from Q's.
struct WideBarriers {
  std::uint64_t *kv_full, *kv_empty, *q_full, *q_empty, *do_full, *do_empty, *dq_full, *dq_empty;
  __device__ explicit WideBarriers(unsigned char* at)
      : kv_full(reinterpret_cast<std::uint64_t*>(at)), kv_empty(kv_full + 1), q_full(kv_empty + 1),
        q_empty(q_full + kStages), do_full(q_empty + kStages), do_empty(do_full + 1), dq_full(do_empty + 1),
        dq_empty(dq_full + kBwdConsumers) {}
  __device__ void init() {
    cuda::ptx::mbarrier_init(kv_full, 1);
    cuda::ptx::mbarrier_init(kv_empty, 1);  // the one thread that stores dK and dV (or hands a share's buffers back)
    for (int s = 0; s < kStages; ++s) {
      cuda::ptx::mbarrier_init(&q_full[s], 1);
      cuda::ptx::mbarrier_init(&q_empty[s], 128 * kBwdConsumers);
    }
    cuda::ptx::mbarrier_init(do_full, 1);
    cuda::ptx::mbarrier_init(do_empty, 128 * kBwdConsumers);
    for (int c = 0; c < kBwdConsumers; ++c) {
      cuda::ptx::mbarrier_init(&dq_full[c], 4);
      cuda::ptx::mbarrier_init(&dq_empty[c], 1);
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
};

template <class T, bool kRagged>
__global__ void __launch_bounds__(128 * (1 + kBwdConsumers), 1)
    dkdv_wide_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                     const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap do_map,
                     const __grid_constant__ CUtensorMap dk_map, const __grid_constant__ CUtensorMap dv_map,
                     const BwdParams prm) {
#if FA_SM90A
  using L = WideSmem;
  using P = DqPieces<kWideD>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = aligned_smem(smem_raw);
  WideBarriers bars(smem + L::bars);
  TileRing ring(smem + L::tiles);
  cudaTriggerProgrammaticLaunchCompletion();  // as dkdv_kernel
  if (threadIdx.x == 0) {
    ring.init(1 + 128 * kBwdConsumers);
    bars.init();
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    // ---- Producer warpgroup: as dkdv_kernel's, dO_i and D_i into their one stage.
    release_registers<kProducerRegs>();
    if (threadIdx.x == 0) {
      int issued = 0;
      int start = 0, q_first = 0;  // as dkdv_kernel's
      auto load_q = [&](StepWalk& walk) {
        const int s = issued % kStages, i = walk.i, qh = walk.qh;
        walk.next();
        const std::size_t stat = std::size_t(qh) * prm.Np + std::size_t(q_first + i) * kQ;
        wait(&bars.q_empty[s], (issued / kStages) % 2 ^ 1);
        arrive_expecting(&bars.q_full[s], L::kQBytes + kQ * 4);
        load_tile(&q_map, smem + L::q + s * L::kQBytes, &bars.q_full[s], start + i * kQ, qh);
        load_stats(smem + L::l2 + s * kQ * 4, prm.l2 + stat, &bars.q_full[s]);
        wait(bars.do_empty, issued % 2 ^ 1);
        arrive_expecting(bars.do_full, L::kQBytes + kQ * 4);
        load_tile(&do_map, smem + L::dout, bars.do_full, start + i * kQ, qh);
        load_stats(smem + L::dsum, prm.dsum + stat, bars.do_full);
        ++issued;
      };
      for (int n = 0, taken = blockIdx.x;; ++n, taken = next_tile<kRagged>(prm)) {
        if (taken >= tile_count<kRagged>(prm)) {  // the end, told to the rest of the block
          ring.publish(n, tile_count<kRagged>(prm));
          break;
        }
        const auto [u, unit] = tell_tile(tile_schedule<kRagged>(prm), ring, n, taken);  // the unit's u-th tile
        const KeyTile kt = key_tile<kRagged>(prm, u);
        const int j = kt.j;
        start = kt.start, q_first = kt.q_first;
        StepWalk walk(prm, q_range<kQ, kWideKeys>(prm, j, kt.N), unit);
        const int kvh = unit / prm.parts;
        if (n > 0) {  // as dkdv_kernel, but one query block ahead: dO_i has one stage, and the second
          load_q(walk);  // would wait for the consumers to take the first, which needs K_j, V_j
          wait(bars.kv_empty, (n - 1) % 2);
        }
        arrive_expecting(bars.kv_full, 2 * L::kKVBytes);
        load_tile(&k_map, smem + L::k, bars.kv_full, start + j * kWideKeys, kvh);
        load_tile(&v_map, smem + L::v, bars.kv_full, start + j * kWideKeys, kvh);
        if (n == 0) cudaGridDependencySynchronize();  // as dkdv_kernel: the preprocess's L·log2 e, D and counter
        while (!walk.done()) load_q(walk);
      }
    } else if (threadIdx.x == 32) {  // one writer: a second one cost more here (note 07)
      write_dq<kWideD, kQ, kWideKeys, 1, kRagged>(prm, ring, reinterpret_cast<const float*>(smem + L::dq), bars.dq_full,
                                         bars.dq_empty, 0);
    }
    return;
  }

  // ---- Consumer warpgroup c: the block's 64 keys; queries 32c … 32c + 31 of each query
  // block for Sᵀ and dPᵀ; columns 128c … 128c + 127 of dK and dV.
  claim_registers<FwdTile{kBwdConsumers, kWideKeys, kStages}.consumer_regs()>();
  const int c = threadIdx.x / 128 - 1, tid = threadIdx.x % 128, warp = tid / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int half = 32 * c;  // this consumer's queries in a query block: half … half + 31
  const float mul = prm.scale * step06::kLog2e;
  const std::uint32_t k_tile = smem_u32(smem + L::k), v_tile = smem_u32(smem + L::v);
  const std::uint32_t do_tile = smem_u32(smem + L::dout);
  const std::uint32_t cols = 2 * c * kQ * 128;  // panels 2c, 2c + 1 of a Q_i or dO_i tile: this consumer's columns
  float* stage_dq_at = reinterpret_cast<float*>(smem + L::dq) + c * kChunkFloats;  // this consumer's slot

  for (int n = 0, done = 0;; ++n) {  // done: the block's steps before this tile
    const int tile = ring.take(n);
    if (tile >= tile_count<kRagged>(prm)) break;
    const auto [u, unit] = bwd_tile(tile_schedule<kRagged>(prm), tile);
    [[maybe_unused]] const auto [j, start, N, q_first] = key_tile<kRagged>(prm, u);  // N: the sequence's rows
    const int k0 = j * kWideKeys, steps = bwd_steps<kQ, kWideKeys>(prm, j, N);
    const int key0 = k0 + 16 * warp + g;  // this thread's keys: key0, key0 + 8
    wait(bars.kv_full, n % 2);
    // 64 keys × 128 columns: register 4n + 2h + e = key 16·warp + g + 8h, column 128c + 8n + 2t + e
    float dk[kWideD / 4] = {}, dv[kWideD / 4] = {};

    // Main loop over the query blocks.
    // A step's second dQ piece (piece 1 below): done at the step's end, staged in the next step.
    // 64 queries × 64 columns: register 4n + 2h + e = query 16·warp + g + 8h, column 8n + 2t + e
    float dq1[kChunkFloats / 128];
    bool held = false;  // dq1 holds the last step's piece, not yet staged
    for (int it = 0; it < steps; ++it) {
      const int step = done + it, s = step % kStages;
      const std::uint32_t q_tile = smem_u32(smem + L::q + s * L::kQBytes);
      const float* l2 = reinterpret_cast<const float*>(smem + L::l2) + s * kQ + half;
      const float* dsum = reinterpret_cast<const float*>(smem + L::dsum) + half;
      unsigned char* p_tile = smem + L::p + (step % 2) * L::kTileBytes;
      unsigned char* ds_tile = smem + L::ds + (step % 2) * L::kTileBytes;

      // Sᵀ = K_j·Q_iᵀ and dPᵀ = V_j·dO_iᵀ for this consumer's 32 queries: 16 k steps each.
      // Both stages are waited for before either product is issued: a wait between two
      // wgmma groups in flight makes ptxas serialise every wgmma of the kernel (C7520).
      // 64 keys × 32 queries: register 4n + 2h + e = key 16·warp + g + 8h, query half + 8n + 2t + e
      float st[kQ / 4], dpt[kQ / 4];
      wait(&bars.q_full[s], (step / kStages) % 2);
      wait(bars.do_full, step % 2);
      wgmma_fence();
      ss_kk<T, kQ / 2, kWideD>(st, k_tile, kWideKeys, q_tile + half * 128, kQ);
      wgmma_commit();
      ss_kk<T, kQ / 2, kWideD>(dpt, v_tile, kWideKeys, do_tile + half * 128, kQ);
      wgmma_commit();

      // Pᵀ and dSᵀ = Pᵀ∘(dPᵀ − D_i), in fp32, masked as in dkdv_kernel.
      wgmma_wait<1>(st);
#pragma unroll
      for (int x = 0; x < kQ / 4; ++x) st[x] = mma::exp2_approx(fmaf(st[x], mul, -l2[8 * (x / 4) + 2 * t + x % 2]));
      // Warp-uniform: whether the warp's 16 keys against this consumer's 32 queries cross N or the band's edges.
      const int q0 = step_block<kQ, kWideKeys>(prm, j, it, N) * kQ;  // worked out here: fewer registers held
      if ((kRagged && q0 + half + 32 > N) || prm.band.cuts(q0 + half, q0 + half + 31, key0 - g, key0 - g + 15, N)) {
#pragma unroll
        for (int x = 0; x < kQ / 4; ++x) {
          const int row = q0 + half + 8 * (x / 4) + 2 * t + x % 2;
          if (!prm.band.keeps(row, key0 + 8 * (x % 4 / 2), N) || (kRagged && row >= N)) st[x] = 0.0f;
        }
      }
      // The last step's second dQ piece. Its slot waited for while dPᵀ is in flight, by a
      // loop whose exit is the warp's (wait_warp), then staged once dPᵀ is done: between
      // the issue of a product and its wait, ptxas serialises every wgmma of the kernel for a
      // loop that threads may leave one by one (C7518), and waits for every product before a
      // read of a register some wgmma defined (C7517).
      if (held) wait_warp(&bars.dq_empty[c], P::parity(step - 1, c + kBwdConsumers) ^ 1);
      wgmma_wait<0>(dpt);
      if (held) {
        store_dq(dq1, stage_dq_at, tid);
        announce_dq(&bars.dq_full[c], tid);
        held = false;
      }
#pragma unroll
      for (int x = 0; x < kQ / 4; ++x) dpt[x] = st[x] * (dpt[x] - dsum[8 * (x / 4) + 2 * t + x % 2]);

      // Both in 16 bits into their tiles (rows = the keys, one 128-byte-swizzled panel of
      // 64 queries), for both consumers' products.
#pragma unroll
      for (int n = 0; n < kQ / 16; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const std::uint32_t at = swizzled(kWideKeys, 16 * warp + g + 8 * h, half + 8 * n + 2 * t);
          *reinterpret_cast<std::uint32_t*>(p_tile + at) =
              mma::Mma<T>::pack(st[4 * n + 2 * h], st[4 * n + 2 * h + 1]);
          *reinterpret_cast<std::uint32_t*>(ds_tile + at) =
              mma::Mma<T>::pack(dpt[4 * n + 2 * h], dpt[4 * n + 2 * h + 1]);
        }
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);  // ordinary stores, read by wgmma
      named_sync(ds_bar(step), 128 * kBwdConsumers);

      // dV_c += Pᵀ·dO_i[:, cols] and dK_c += dSᵀ·Q_i[:, cols]: 4 k steps of 16 queries.
      wgmma_fence();
      ss_kmn<T, kWideD / 2, kQ>(dv, smem_u32(p_tile), do_tile + cols, kQ * 128);
      wgmma_commit();
      ss_kmn<T, kWideD / 2, kQ>(dk, smem_u32(ds_tile), q_tile + cols, kQ * 128);
      wgmma_commit();
      // dO_i's stage is free once dV's product is done (and D_i read: above), Q_i's once
      // dK's is; each released with the proxy fence of dkdv_kernel's release_stage.
      wgmma_wait<1>(dv);
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
      arrive(bars.do_empty);

      // dQ_i's pieces c and c + 2 (DqPieces at d = 256): dS·K_j[:, panel] over the 64 keys,
      // A = dSᵀ read transposed. dK's product is done before the first piece is: Q_i's stage is
      // then free. The second piece is issued before the first is staged, so that the first
      // one's stores and fence run under it; the second is staged in the next step.
      float dq0[kChunkFloats / 128];  // as dq1
      auto issue_piece = [&](float(&dq)[kChunkFloats / 128], int piece) {
        issue_dq<T, kQ, false, kWideKeys>(dq, k_tile, c + kBwdConsumers * piece, smem_u32(ds_tile));
      };
      auto stage_piece = [&](float(&dq)[kChunkFloats / 128], int piece) {
        stage_dq(dq, stage_dq_at, &bars.dq_empty[c], P::parity(step, c + kBwdConsumers * piece) ^ 1, tid);
      };
      issue_piece(dq0, 0);
      wgmma_wait<1>(dk);
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
      arrive(&bars.q_empty[s]);
      issue_piece(dq1, 1);
      wgmma_wait<1>(dq0);
      stage_piece(dq0, 0);
      announce_dq(&bars.dq_full[c], tid);
      wgmma_wait<0>(dq1);
      held = true;  // staged in the next step, its slot waited for under that step's dPᵀ
    }
    if (held) {  // the tile's last piece
      stage_dq(dq1, stage_dq_at, &bars.dq_empty[c], P::parity(done + steps - 1, c + kBwdConsumers) ^ 1, tid);
      announce_dq(&bars.dq_full[c], tid);
    }

  // Epilogue: both consumers' columns of dK (×scale) and dV into one 64-row tile each
    // (K/V's buffers, free once both are past their last products), out by TMA from one
    // thread, which then hands the buffers back to the producer.
    named_sync(kEpilogueBar, 128 * kBwdConsumers);
    if (prm.parts > 1) {  // as dkdv_kernel: a share of the group, into the fp32 sums
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);  // K/V read by wgmma only here, but alike
      named_sync(kEpilogueBar, 128 * kBwdConsumers);
      if (threadIdx.x == 128) arrive(bars.kv_empty);
      add_dkdv<kWideD, kWideD / 2>(prm, dk, dv, unit / prm.parts, key0, kWideD / 2 * c, t, N, start);
    } else {
      unsigned char* dk_tile = smem + L::k;
      unsigned char* dv_tile = smem + L::v;
      store_dkdv<T, kWideD / 2>(dk_tile, dv_tile, dk, dv, prm.scale, kWideD / 2 * c, warp, g, t);
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
      named_sync(kEpilogueBar, 128 * kBwdConsumers);
      write_dkdv<T, kWideD, kWideKeys, kRagged>(prm, &dk_map, &dv_map, dk_tile, dv_tile, bars.kv_empty, k0, N, start,
                                                unit, int(threadIdx.x) - 128, 128 * kBwdConsumers,
                                                [] { named_sync(kEpilogueBar, 128 * kBwdConsumers); });
    }
    done += steps;
  }
#endif
}

/// dQ = scale·accumulator in 16 bits, out of dq_piece's layout: one block a piece, read in
/// the layout's order (coalesced, every load of a thread issued before the first store)
/// into shared memory as the piece's rows, then written row by row (coalesced, 128 bytes a
/// warp). Register 4u + 2h + e of thread tid (warp w, g = lane / 4, t = lane % 4) holds
/// query 16w + g + 8h, column 8u + 2t + e of a 64-query piece, and column 16w + g + 8h,
/// query 8u + 2t + e of a transposed one (96 or 80 queries a step).
/// A ragged batch's (kRagged): the pieces' query block u is entry u of the query blocks' table
/// (none past its q_count entries), its rows those of its sequence, from start (N: T).
template <class T, int kQi, bool kRagged>
__global__ void __launch_bounds__(256) convert_kernel(int N, int d, int q_blocks, float scale,
                                                      const float* __restrict__ acc, T* __restrict__ dq,
                                                      const SeqBlock* q_table, const int* q_count) {
#if FA_SM90A
  constexpr int kThreads = 256, kChunk = chunk_floats(kQi), kPad = kPanel + 1;  // a row, padded
  __shared__ float rows[kQi * kPad];                                              // [query][column]
  cudaGridDependencySynchronize();  // launched early: the dK/dV kernel's sums complete
  const std::size_t piece = blockIdx.x;
  const auto [bh, u, panel] = dq_piece_at(piece, d / kPanel, q_blocks);
  if (kRagged && u >= *q_count) return;  // past the table: no rows
  const auto [i, start, n] = seq_block<kRagged>(q_table, u, N);
  static_assert(kChunk / 4 % kThreads == 0 && kQi * kPanel / 2 % kThreads == 0, "whole rounds of the block");
#pragma unroll
  for (int k = 0; k < kChunk / 4 / kThreads; ++k) {
    const int f = threadIdx.x + k * kThreads;  // float4 f: registers 4u … 4u + 3 of thread tid
    const int u = f / 128, tid = f % 128, w = tid / 32, g = tid % 32 / 4, t = tid % 4;
    const float4 v = reinterpret_cast<const float4*>(acc + piece * kChunk)[f];
    const int a = 16 * w + g, b = 8 * u + 2 * t;  // registers 4u + 2h + e: (a + 8h, b + e) as (query, column),
    if constexpr (dq_transposed(kQi)) {           // or as (column, query) when transposed
      rows[b * kPad + a] = v.x, rows[(b + 1) * kPad + a] = v.y;
      rows[b * kPad + a + 8] = v.z, rows[(b + 1) * kPad + a + 8] = v.w;
    } else {
      rows[a * kPad + b] = v.x, rows[a * kPad + b + 1] = v.y;
      rows[(a + 8) * kPad + b] = v.z, rows[(a + 8) * kPad + b + 1] = v.w;
    }
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kQi * kPanel / 2 / kThreads; ++k) {
    const int f = threadIdx.x + k * kThreads;  // two columns a thread
    const int q = f / (kPanel / 2), col = 2 * (f % (kPanel / 2)), row = i * kQi + q;
    if (row < n)
      *reinterpret_cast<std::uint32_t*>(dq + (bh * N + start + row) * d + panel * kPanel + col) =
          mma::Mma<T>::pack(scale * rows[q * kPad + col], scale * rows[q * kPad + col + 1]);
  }
#endif
}

/// Where a group's shares add their dK and dV (parts > 1): dK and dV in 16 bits from the fp32
/// sums (dK's already × scale), two values a thread.
template <class T>
__global__ void __launch_bounds__(256) convert_dkdv_kernel(std::size_t pairs, const float2* __restrict__ dk_acc,
                                                           const float2* __restrict__ dv_acc,
                                                           std::uint32_t* __restrict__ dk, std::uint32_t* __restrict__ dv) {
#if FA_SM90A
  cudaGridDependencySynchronize();  // launched early behind dQ's convert kernel, which waits for the sums
  for (std::size_t x = blockIdx.x * std::size_t(256) + threadIdx.x; x < pairs; x += std::size_t(gridDim.x) * 256) {
    const float2 a = dk_acc[x], b = dv_acc[x];
    dk[x] = mma::Mma<T>::pack(a.x, a.y);
    dv[x] = mma::Mma<T>::pack(b.x, b.y);
  }
#endif
}

/// A ragged batch's preprocess: step 06's (D = rowsum(dO∘O), L·log2 e, the accumulator's row
/// zeroed; a warp a row, with its pieces), on the rows of the query blocks' table: padded
/// row u·kQi + r of a head is row r of entry u's block, D and L·log2 e 0 past its
/// sequence's end (and past the table's q_count entries).
template <class T, int kD, int kQi>
__global__ void __launch_bounds__(256)
    ragged_preprocess_kernel(int N, int Np, int rows, const SeqBlock* __restrict__ q_table,
                             const int* __restrict__ q_count, const T* __restrict__ o, const T* __restrict__ dout,
                             const float* __restrict__ lse, float* __restrict__ l2, float* __restrict__ dsum,
                             float* __restrict__ zero) {
#if FA_SM90A
  cudaTriggerProgrammaticLaunchCompletion();  // as step 06's: the dK/dV kernel waits for these writes
  const int r = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (r >= rows) return;
  step06::zero_row<kD>(zero, r, lane);
  const int bh = r / Np, u = r % Np / kQi;
  int row = -1;  // the packed row, if any
  if (u < *q_count) {
    const SeqBlock b = q_table[u];
    const int x = b.i * kQi + r % kQi;
    if (x < b.length) row = b.start + x;
  }
  const float acc = step06::row_dsum<T, kD>(o, dout, bh, N, row, row >= 0, lane);
  if (lane == 0) {
    dsum[r] = acc;
    l2[r] = row >= 0 ? lse[std::size_t(bh) * N + row] * step06::kLog2e : 0.0f;
  }
#endif
}

}  // namespace

/// Whole groups make T_c·B·H_kv tiles. With the causal mask they run from G·T_r steps down to
/// G, and it takes some four waves of them for the tail to even out; without it they are equal,
/// and half a wave still beats halving each tile (two waves of half tiles take as long as one
/// of whole ones). Where the tiles fall short, a group's G query heads go to the fewest shares,
/// dividing G, that make enough (or G): each share a tile, their dK and dV met in fp32 sums.
int backward_parts(const Problem& p, bool deterministic) {
  const int G = p.group();
  if (deterministic || G == 1) return 1;
  const long long whole = static_cast<long long>(tiles::kv_blocks(p.N, backward_keys(p.d))) * p.kv_heads();
  const long long want = p.causal ? 4LL * gpu::sm_count() : gpu::sm_count() / 2;
  for (int parts = 1; parts < G; ++parts)
    if (G % parts == 0 && whole * parts >= want) return parts;
  return G;
}

namespace {

struct BwdWorkspace {
  float *dk_acc, *dv_acc;  // grouped heads only: [B·H_kv][N][d] each, first (8-byte aligned for their RED.64)
  float *dq_acc, *l2, *dsum;
  int *order, *taken;
};
/// q_blocks: of `queries` rows a head (a ragged batch's: as many as its sequences may take, max_blocks).
BwdWorkspace carve(const Problem& p, void* ws, int queries, int q_blocks) {
  const std::size_t np = p.heads() * std::size_t(q_blocks) * queries, kv = p.group() > 1 ? p.kv_elems() : 0;
  float* base = static_cast<float*>(ws) + 2 * kv;
  int* order = reinterpret_cast<int*>(base + np * (p.d + 2));
  return {static_cast<float*>(ws), static_cast<float*>(ws) + kv, base, base + np * p.d, base + np * (p.d + 1), order,
          order + p.heads() * q_blocks};
}
std::size_t carved_bytes(const Problem& p, int queries, int q_blocks) {
  const std::size_t np = p.heads() * std::size_t(q_blocks) * queries;
  // The sums wherever a group could be split: not backward_parts, whose answer depends on the GPU the call runs on.
  const std::size_t kv = p.group() > 1 ? 2 * p.kv_elems() : 0;
  return (kv + np * (p.d + 2)) * sizeof(float) + (p.heads() * q_blocks + 1) * sizeof(int);
}
std::size_t workspace_bytes(const Problem& p) {
  const int queries = backward_queries(p.d);
  return carved_bytes(p, queries, tiles::q_blocks(p.N, queries));
}
/// A ragged batch's: carve's, for its most query blocks, then its tables (64-byte aligned).
int ragged_q_blocks(const Problem& p, int sequences) {
  return int(max_blocks(p.N, backward_queries(p.d), sequences));
}
std::size_t ragged_tables_at(const Problem& p, int sequences) {
  return (carved_bytes(p, backward_queries(p.d), ragged_q_blocks(p, sequences)) + 63) / 64 * 64;
}
std::size_t ragged_workspace_bytes(const Problem& p, int sequences) {
  return ragged_tables_at(p, sequences) +
         ragged_tables_bytes(p.N, backward_keys(p.d), backward_queries(p.d), sequences);
}
constexpr const char* kWorkspace =
    "the fp32 dQ accumulator, D and L·log2 e (B·H·Np·(d + 2) floats, Np = N rounded up to the queries of a "
    "step: 96 at d = 64, 80 at d = 128, 64 at d = 256), a counter per query block and the tile counter; with "
    "grouped heads split into shares, fp32 sums of dK and dV (2·B·H_kv·N·d floats)";

/// The dK/dV kernel of a head dimension, and its shared memory.
template <class T, int kD, bool kRagged>
struct DkdvKernel {
  static constexpr auto kernel = dkdv_kernel<T, kD, kRagged>;
  static constexpr std::size_t smem = BwdSmem<kD, backward_queries(kD)>::bytes + 1024;  // + the base's alignment
};
template <class T, bool kRagged>
struct DkdvKernel<T, kWideD, kRagged> {
  static constexpr auto kernel = dkdv_wide_kernel<T, kRagged>;
  static constexpr std::size_t smem = WideSmem::bytes + 1024;
};

/// The order of the backward's tiles, key blocks of `keys` keys of the B·H_kv·parts units
/// (TileOrder, step07.hpp): a unit's tiles share its G/parts query heads' Q and dO (16-bit)
/// and fp32 dQ accumulators, 8·N·d·G/parts bytes.
TileOrder backward_order(const Problem& p, int keys, int parts) {
  return tile_order(tiles::kv_blocks(p.N, keys), int(p.kv_heads()) * parts, p.causal,
                    8.0 * p.N * p.d * (p.group() / parts), double(gpu::l2_bytes()), gpu::sm_count());
}

/// The kernels (a fourth where the groups are split into shares). `deterministic`: dQ's pieces added in key-block order, on a grid of a
/// block a tile — on the persistent grid a block's writer runs up to a tile behind its
/// consumers, so a key block's wait for the one before it would also wait for that block's
/// older tiles (note 07, the deterministic mode).
/// A ragged batch (kRagged): its tables first (ragged_tables, made after the workspace's other
/// parts), its sequences' query blocks in the statistics and the accumulator, as many tiles
/// launched for as its key blocks may be (the kernels read the order made with the table).
template <class T, int kD, bool kRagged>
void launch(const Problem& p, const NativeBwdArgs& a, void* ws, Stream s, bool deterministic) {
  using K = DkdvKernel<T, kD, kRagged>;
  constexpr int kKeys = backward_keys(kD), kQi = backward_queries(kD);
  static_assert(K::smem <= kBlockSmemBytes, "a block's shared memory on sm_90");
  const int parts = backward_parts(p, deterministic);
  const int N = p.N, sequences = a.ragged.sequences;
  const int qb = kRagged ? ragged_q_blocks(p, sequences) : tiles::q_blocks(N, kQi), Np = qb * kQi;
  const BwdWorkspace w = carve(p, ws, kQi, qb);
  const std::size_t heads = p.heads();
  const int units = int(p.kv_heads()) * parts;
  // A unit's tiles share its G/parts query heads' Q and dO (16-bit) and fp32 dQ accumulators (backward_order).
  const RaggedTables rt =
      kRagged ? ragged_tables(a.ragged, N, kKeys, kQi, units, p.causal, 8.0 * N * kD * (p.group() / parts),
                              static_cast<unsigned char*>(ws) + ragged_tables_at(p, sequences), w.taken, s)
              : RaggedTables{};
  if (deterministic) FA_CUDA_CHECK(cudaMemsetAsync(w.order, 0, heads * qb * sizeof(int), s));  // read only there
  if (parts > 1) FA_CUDA_CHECK(cudaMemsetAsync(w.dk_acc, 0, 2 * p.kv_elems() * sizeof(float), s));  // dK's, dV's sums
  // The preprocess zeroes the dQ accumulator and the tile counter (next_tile: a persistent grid's;
  // a ragged batch's tables did).
  const int rows = int(heads) * Np;  // the accumulator is rows × kD floats: preprocess zeroes it row by row
  if constexpr (kRagged)
    ragged_preprocess_kernel<T, kD, kQi><<<(rows + 7) / 8, 256, 0, s>>>(
        N, Np, rows, rt.q_blocks, rt.q_count, static_cast<const T*>(a.o), static_cast<const T*>(a.dout), a.lse,
        w.l2, w.dsum, w.dq_acc);
  else
    step06::preprocess_kernel<T, kD><<<(rows + 7) / 8, 256, 0, s>>>(N, Np, rows, static_cast<const T*>(a.o),
                                                                    static_cast<const T*>(a.dout), a.lse, w.l2,
                                                                    w.dsum, w.dq_acc, deterministic ? nullptr : w.taken);
  FA_CHECK_LAUNCH();

  auto map = [&](const void* x, int box) { return make_tile_map(x, p.dtype, N, heads, kD, box); };
  auto kv_map = [&](const void* x, int box) { return make_tile_map(x, p.dtype, N, p.kv_heads(), kD, box); };
  const TileOrder schedule = backward_order(p, kKeys, parts);  // a ragged batch's: on the device
  const int tile_count = kRagged ? int(max_blocks(N, kKeys, sequences)) * units : schedule.tiles();
  const BwdParams prm{.N = N,
                      .Np = Np,
                      .q_blocks = qb,
                      .walk = p.group() / parts,
                      .parts = parts,
                      .schedule = schedule,
                      .tiles = tile_count,
                      .scale = p.softmax_scale(),
                      .deterministic = deterministic,
                      .band = band_of(p),
                      .l2 = w.l2,
                      .dsum = w.dsum,
                      .dq_acc = w.dq_acc,
                      .order = w.order,
                      .taken = w.taken,
                      .dk_acc = w.dk_acc,
                      .dv_acc = w.dv_acc,
                      .key_blocks = rt.blocks,
                      .q_first = rt.q_first,
                      .ragged_order = rt.order,
                      .ragged_tiles = rt.tiles,
                      .dk = a.dk,
                      .dv = a.dv};
  set_smem_limit(K::kernel, K::smem);
  const int grid = deterministic ? tile_count : std::min(tile_count, gpu::sm_count());  // a block a tile, or an SM
  launch_early(true, K::kernel, dim3(unsigned(grid)), dim3(128 * (1 + kBwdConsumers)), K::smem, s, map(a.q, kQi),
               kv_map(a.k, kKeys), kv_map(a.v, kKeys), map(a.dout, kQi), kv_map(a.dk, kRowsPerConsumer),
               kv_map(a.dv, kRowsPerConsumer), prm);

  const unsigned pieces = unsigned(heads * qb * (kD / kPanel));
  launch_early(true, convert_kernel<T, kQi, kRagged>, dim3(pieces), dim3(256), 0, s, N, kD, qb, p.softmax_scale(),
               static_cast<const float*>(w.dq_acc), static_cast<T*>(a.dq), rt.q_blocks,
               static_cast<const int*>(rt.q_count));
  if (parts > 1) {
    const std::size_t pairs = p.kv_elems() / 2;
    const unsigned blocks = unsigned(std::min<std::size_t>((pairs + 255) / 256, 8 * std::size_t(gpu::sm_count())));
    launch_early(true, convert_dkdv_kernel<T>, dim3(blocks), dim3(256), 0, s, pairs,
                 reinterpret_cast<const float2*>(w.dk_acc), reinterpret_cast<const float2*>(w.dv_acc),
                 static_cast<std::uint32_t*>(a.dk), static_cast<std::uint32_t*>(a.dv));
  }
}

template <int kD>
void run_d(const Problem& p, const NativeBwdArgs& a, void* ws, Stream s, bool deterministic) {
  with_ragged(a, [&]<bool kRagged>() {
    p.dtype == DType::bf16 ? launch<__nv_bfloat16, kD, kRagged>(p, a, ws, s, deterministic)
                           : launch<__half, kD, kRagged>(p, a, ws, s, deterministic);
  });
}
void run(const Problem& p, const NativeBwdArgs& a, void* ws, Stream s, bool deterministic) {
  // gpu::backward checked d
  p.d == 64    ? run_d<64>(p, a, ws, s, deterministic)
  : p.d == 128 ? run_d<128>(p, a, ws, s, deterministic)
               : run_d<256>(p, a, ws, s, deterministic);
}
void run_any_order(const Problem& p, const NativeBwdArgs& a, void* ws, Stream s) { run(p, a, ws, s, false); }
void run_in_order(const Problem& p, const NativeBwdArgs& a, void* ws, Stream s) { run(p, a, ws, s, true); }

}  // namespace

const GpuBackward kBackward{.name = "step07 backward",
                            .max_d = 256,
                            .workspace_bytes = workspace_bytes,
                            .workspace_what = kWorkspace,
                            .run = nullptr,
                            .run_native = run_any_order,
                            .only_d = kBackwardD,
                            .min_sm = kSm,
                            .exact_sm = true,
                            .groups = true,
                            .window = true,
                            .ragged_workspace_bytes = ragged_workspace_bytes};
const GpuBackward kBackwardDeterministic{.name = "det: dQ added in key-block order",
                                         .max_d = 256,
                                         .workspace_bytes = workspace_bytes,
                                         .workspace_what = kWorkspace,
                                         .run = nullptr,
                                         .run_native = run_in_order,
                                         .only_d = kBackwardD,
                                         .min_sm = kSm,
                                         .exact_sm = true,
                                         .groups = true,
                                         .window = true,
                                         .ragged_workspace_bytes = ragged_workspace_bytes};

}  // namespace fa::step07
