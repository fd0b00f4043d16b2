// Step 07 — Hopper: step 06's forward on the tensor memory accelerator, wgmma and
// warp specialisation, FlashAttention-3 style.
//
// Adds over step 06 (same algorithm, same rounding points, new hardware):
//   TMA        Q, K, V tiles copied by the tensor memory accelerator from tensor maps
//              made on the host, completing on mbarriers; K/V in a ring of stages.
//              The map's bounds do the tail (rows past N read as zeros).
//   wgmma      S = Q·Kᵀ with both operands in shared memory (descriptors over the
//              128-byte swizzle TMA writes) and O += P·V with P from registers, on a
//              warpgroup (4 warps, 64 query rows) instead of a warp (16 rows).
//   warp specialisation
//              a producer warpgroup only issues TMA and gives its registers away
//              (setmaxnreg); two consumer warpgroups only compute.
//   ping-pong  the two consumer warpgroups take turns on the tensor cores (named
//              barriers), so one's softmax runs under the other's products;
//   overlap    within a warpgroup, S of block j+1 is issued before P·V of block j,
//              and the softmax of j+1 runs while P·V of j is on the tensor cores.
//   epilogue   O through shared memory and a TMA store; L written as in every step.
// Backward (backward.cu): step 06's (K/V outer, its preprocess, its blocks and rounding
// points) on the same pieces — K_j, V_j once and Q_i, dO_i, L_i, D_i through a TMA ring,
// the five products on wgmma in two consumer warpgroups of 64 keys each (at d = 64 with
// their K and V held in registers; at d = 256 one block of 64 keys, the consumers
// splitting dK's and dV's columns; at d = 128 a step's dQ pieces in the next step), dQ added into an
// fp32 accumulator by TMA bulk reductions from the producer's second warp; a
// deterministic mode adds them in key-block order.
// Limits: d = 64, 128 or 256, bf16 or fp16; a Hopper GPU (sm_90:
// the kernels are built for sm_90a only, and refuse anything else in one line).
// Note: notes/07_hopper.md.
#pragma once

#include <cstdint>

#include "common/hd.hpp"
#include "common/hbm.hpp"
#include "common/step_api.hpp"

namespace fa::step07 {

/// The forward's block shape. A thread block is a producer warpgroup and `consumers`
/// consumer warpgroups of kRowsPerConsumer query rows each.
constexpr int kRowsPerConsumer = 64;  ///< wgmma's M
constexpr int kMaxConsumers = 3;
/// Registers a producer thread keeps after setmaxnreg. With two consumers a block of 384
/// threads starts with 168 registers each (65536 / 384, in steps of 8): 24 for the producer
/// leaves exactly 240 for each consumer; 32 would leave them short, and their setmaxnreg
/// would wait forever for registers that no warp gives back.
constexpr int kProducerRegs = 24;
constexpr int kBlockSmemBytes = 227 * 1024;  ///< the most shared memory a block may take on sm_90
struct FwdTile {
  int consumers;  ///< consumer warpgroups: B_r = 64·consumers query rows a block
  int keys;       ///< B_c: keys per K/V block (the N of S = Q·Kᵀ's wgmma)
  int stages;     ///< K/V blocks in flight: the depth of the TMA ring
  FA_HD constexpr int rows() const { return kRowsPerConsumer * consumers; }
  FA_HD constexpr int threads() const { return 128 * (1 + consumers); }
  /// Registers a consumer thread takes by setmaxnreg: what the SM's 65536 leave after
  /// the producer's 24·128, shared by the consumers, in steps of 8 (240 for two, 160
  /// for three) — at most what the block started with (registers_at_launch).
  FA_HD constexpr int consumer_regs() const { return (65536 / 128 - kProducerRegs) / consumers / 8 * 8; }
  /// Registers the block starts with: 65536 / threads a thread, in steps of 8.
  FA_HD constexpr int registers_at_launch() const { return 65536 / threads() / 8 * 8 * threads(); }
};
static_assert(FwdTile{2, 128, 2}.consumer_regs() == 240 && FwdTile{3, 128, 2}.consumer_regs() == 160,
              "a consumer's registers: 240 with two consumers, 160 with three");
static_assert(128 * kProducerRegs + 2 * 128 * FwdTile{2, 128, 2}.consumer_regs() <=
                      FwdTile{2, 128, 2}.registers_at_launch() &&
                  128 * kProducerRegs + 3 * 128 * FwdTile{3, 128, 2}.consumer_regs() <=
                      FwdTile{3, 128, 2}.registers_at_launch(),
              "setmaxnreg moves registers within a block: the producer's and the consumers' fit in what it started with");
/// Two consumers (128 query rows), 128 keys, two stages — except:
///   d = 64: three consumers (192 rows), FlashAttention-3's shape: the exponentials
///     cost as much as the products there, so a third warpgroup's softmax fills the
///     tensor cores' gaps; its 160 registers hold O (32), S (64) and P (32);
///   d = 256: 80 keys, where a consumer thread holds 128 fp32 accumulators of O and
///     the K/V ring needs 2·2·80·256·2 bytes of shared memory (FlashAttention-3's).
FA_HD constexpr FwdTile forward_tile(int d) {
  return d == 64 ? FwdTile{3, 128, 2} : d == 256 ? FwdTile{2, 80, 2} : FwdTile{2, 128, 2};
}

/// Short problems at d = 64 run on another kernel: lesson row h1's (TMA + wgmma, two
/// warpgroups that both compute, no producer). Its block is 256 threads of at most 128
/// registers and 80 KiB of shared memory, so two blocks share an SM, and one's fixed costs
/// (its barriers, its first copies, its epilogue) run under the other's products. That pays
/// where a query block visits few of the specialised kernel's K/V blocks: at most 8 on
/// average, N ≤ 1024 — or N ≤ 2048 with the causal mask (note 07, "Short problems"). At
/// d = 128 lesson row s1 (h1 with 64-key blocks) did the same for N ≤ 1024 until the
/// persistent grid (below) overtook it there.
constexpr int kShortRows = 128;     ///< query rows of the short problems' block (two warpgroups of 64)
constexpr int kShortKvBlocks = 8;   ///< K/V blocks of the specialised kernel a query block visits, at most
/// d = 64 and N ≤ 8 blocks of B_c = 128 keys (1024), or with the mask (about half as many
/// blocks a query block) N ≤ 2048.
FA_HD constexpr bool two_blocks_an_sm(int d, int N, bool causal) {
  return d == 64 && N <= (causal ? 2 : 1) * kShortKvBlocks * forward_tile(d).keys;
}
/// The rest run the warp-specialised kernel on a persistent grid (lesson row h9: a block an
/// SM, taking tile after tile from a counter) where a consumer's O tile fits in shared memory
/// beside its Q tile and the K/V ring — d = 64 and 128 — and a block a tile (h7) at d = 256,
/// where h9 (its O through the Q tile) measured level with h7 (note 07).
FA_HD constexpr bool persistent_grid(int d, int N, bool causal) {
  return (d == 64 || d == 128) && !two_blocks_an_sm(d, N, causal);
}
/// The forward's block for a problem: rows × keys.
struct FwdShape {
  int rows, keys;
};
FA_HD constexpr FwdShape forward_shape(int d, int N, bool causal) {
  return two_blocks_an_sm(d, N, causal) ? FwdShape{kShortRows, forward_tile(d).keys}
                                        : FwdShape{forward_tile(d).rows(), forward_tile(d).keys};
}

/// The order in which the blocks take a problem's tiles (a head's query blocks in the
/// forward, its key blocks in the backward): in a grid of a block a tile the hardware
/// starts blocks in index order, and a persistent grid's counter hands tiles out in the
/// same order, each to the block that finishes first. With the causal mask the tiles of a
/// head differ in cost (a query block visits i + 1 K/V blocks), and the order decides the
/// tail: taken head after head, the last tiles handed out are a whole head's, heavy ones
/// among them, and the SMs that finish early idle while those run. Taken heaviest first
/// across heads, every head's heaviest tile, then every head's next, the last tiles are
/// the cheapest, and the SMs finish nearly together (the longest-processing-time-first
/// rule of list scheduling). Across all heads at once, though, the tiles in flight read
/// every head's K and V: so the heads go in sections whose K/V stay in L2, heaviest first
/// within a section. Without the mask every tile costs the same, and a section is one head.
///
/// The last section alone goes heaviest first, the heads before it head after head, where a
/// wave of tiles head after head (one tile an SM) spans eight heads or more (a head having at
/// most SMs / 8 tiles): each wave then mixes every cost of several heads. Elsewhere every
/// section goes heaviest first (note 07, "The order of the tiles").

/// A section is 2^shift heads, a power of two that divides B·H, so that every section is
/// whole and a tile's place takes a shift, a mask and one division (a persistent block's
/// producer works it out in the 24 registers it keeps, and tells its warps the tile's
/// index head after head). The heads before `mixed_from` go head after head, each its
/// heaviest tile first; from it on, section after section, each heaviest first across its
/// heads: tile r of those (r = t − mixed_from·blocks) is the p-th tile of head bh in that
/// head's order (p = 0 its heaviest), with u = r >> shift: bh = mixed_from + (u / blocks)
/// sections, plus r's low bits; p = u mod blocks.
struct TileOrder {
  int blocks;       ///< tiles of a head
  int heads;        ///< B·H
  int shift;        ///< a section is 2^shift heads
  int mixed_from;   ///< the first head of the sections taken heaviest first (heads: none)
  int mixed_tiles;  ///< mixed_from·blocks, the tiles before them: a field, which a producer reads from
                    ///< the kernel's parameters, where the product took a register (the backward's spilled)
  struct At {
    int p, bh;  ///< the head's p-th tile (heaviest first), of head bh
  };
  FA_HD constexpr TileOrder(int blocks_, int heads_, int shift_, int mixed_from_)
      : blocks(blocks_), heads(heads_), shift(shift_), mixed_from(mixed_from_), mixed_tiles(mixed_from_ * blocks_) {}
  FA_HD constexpr int tiles() const { return blocks * heads; }
  FA_HD constexpr int section() const { return 1 << shift; }
  FA_HD constexpr At at(int t) const {
    if (t < mixed_tiles) return {t % blocks, t / blocks};  // head after head
    const int r = t - mixed_tiles, u = r >> shift, s = u / blocks;  // s: the section
    return {u - s * blocks, mixed_from + (s << shift) + (r & (section() - 1))};
  }
  /// The same order as a grid of a block a tile, whose blocks the hardware starts x
  /// fastest: grid (blocks, section(), heads / section()), z a section. Before mixed_from,
  /// block (x, y, z) is the p = x-th tile of head z·section() + y; from it on, with
  /// l = y·blocks + x its place in its section, the (l >> shift)-th tile of the section's
  /// head l mod section(). No division: shifts and masks of the block's indices and the
  /// kernel's parameters.
  FA_HD constexpr At grid_tile(int x, int y, int z) const {
    const int first = z << shift, l = y * blocks + x;  // the section's first head; the block's place in it
    const bool mixed = first >= mixed_from;
    return {mixed ? l >> shift : x, first + (mixed ? l & (section() - 1) : y)};
  }
};
/// The order for `heads` heads of `blocks` tiles, each head reading `bytes_a_head` bytes
/// that its tiles share, on a GPU of `sms` SMs with an L2 of `l2_bytes`: with the causal
/// mask sections of as many heads as take at most two thirds of the L2 (the rest for what
/// the tiles write and for the last section's stragglers), a power of two that divides B·H,
/// heaviest first in the last section or in every one (above); without it head after head.
FA_HD constexpr TileOrder tile_order(int blocks, int heads, bool causal, double bytes_a_head, double l2_bytes,
                                     int sms) {
  if (!causal) return {blocks, heads, 0, heads};
  int shift = 0;
  const double budget = l2_bytes * 2 / 3;
  for (long long s = 2; s <= heads && heads % s == 0 && double(s) * bytes_a_head <= budget; s *= 2) ++shift;
  const bool last_section_only = 8 * blocks <= sms;
  return {blocks, heads, shift, last_section_only ? heads - (1 << shift) : 0};
}

/// The shared-memory layout of every tile (hopper.cuh): R rows × d columns of 16-bit
/// elements as d/64 panels of R rows × 64 columns, 128 bytes a row, each panel with the
/// 128-byte swizzle — what TMA writes with CU_TENSOR_MAP_SWIZZLE_128B and what a wgmma
/// descriptor with swizzle mode 1 reads.
constexpr int kPanel = 64;  ///< columns of a panel: 64 16-bit elements = 128 bytes a row

/// Byte offset of element (r, c) in a tile of `rows` rows in panels: the 16-byte chunk
/// c/8 of row r is stored at chunk (c/8) XOR (r mod 8), so that the 8 rows a wgmma core
/// matrix spans fall in 8 different bank groups.
FA_HD constexpr std::uint32_t swizzled(int rows, int r, int c) {
  // exercise 07-swizzle: the 128-byte swizzle — panel, row, then the row's 16-byte chunk XOR the row mod 8, then the element in the chunk
  // stub: return std::uint32_t((c / kPanel) * rows * 128 + r * 128 + (c % kPanel) * 2);
  return std::uint32_t((c / kPanel) * rows * 128 + r * 128 + ((((c % kPanel) / 8) ^ (r % 8)) * 16) + (c % 8) * 2);
  // end exercise
}

/// The GPU step 07 runs on, compute capability ×10: exactly sm_90 (H100, H200, H20):
/// its kernels are sm_90a code, which no other architecture runs.
constexpr int kSm = 90;
inline constexpr int kSupportedD[] = {64, 128, 256, 0};

/// Throws fa::Error unless p is bf16 or fp16 with d in kSupportedD.
void require_supported(const Problem& p);

/// CPU model: step 06's model with step 07's blocks (forward_shape's rows × keys) — the
/// same rounding points (inputs, P before P·V, O at the end) and the same lazy rescaling
/// (the kernel decides per warp, the model per row).
ModelForward model_forward(const Problem& p, const Qkv& in);
Traffic traffic_forward(const Problem& p);  ///< elements (×2 bytes, L ×4)

/// The backward's block: a producer warpgroup (TMA loads; its second warp adds dQ into
/// the fp32 accumulator) and two consumer warpgroups of 64 keys each, so B_c = 128
/// keys a block, walking the query blocks 64 queries at a time — step 06's blocks —, 96
/// at d = 64 and 80 at d = 128 (backward_queries).
constexpr int kBwdConsumers = 2;
constexpr int kBwdKeys = kBwdConsumers * kRowsPerConsumer;  ///< B_c
constexpr int kBwdQueries = 64;                             ///< queries per step of the inner loop (96, 80 at d = 64, 128)
constexpr int kBwdStages = 2;                               ///< query blocks in flight (Q_i; dO_i too at d ≤ 128)
inline constexpr int kBackwardD[] = {64, 128, 256, 0};      ///< the head dimensions of the backward
/// B_c by d: at d = 256 a consumer cannot hold dK and dV for 64 keys (2·64·256 fp32, 256
/// registers a thread), so a block owns 64 keys and each consumer half of their columns.
FA_HD constexpr int backward_keys(int d) { return d == 256 ? kRowsPerConsumer : kBwdKeys; }
/// Queries a step by d: 80 at d = 128, where the products with both operands in shared
/// memory are bound by its bandwidth and an 80-query step reads 4.5 KiB for 80K
/// multiply-adds where a 64-query step reads 4 for 64K (note 07, lesson row b6); 96 at
/// d = 64, where a step's fixed costs (its barriers, waits and exponentials' latency) weigh
/// most against products of k = 64 (lesson row b7). d = 256: 64.
FA_HD constexpr int backward_queries(int d) { return d == 64 ? 96 : d == 128 ? 80 : kBwdQueries; }

/// CPU model of the backward: step 06's model, with step 07's blocks (backward_keys(d) keys ×
/// backward_queries(d) queries); its rounding points (Pᵀ and dSᵀ in 16 bits before their products, dQ summed
/// in fp32 over key blocks) are step 07's. Throws unless d is in kBackwardD.
ModelBackward model_backward(const Problem& p, const Qkv& in, const ForwardOut& fwd, const std::vector<float>& dout);
Traffic traffic_backward(const Problem& p);  ///< elements, as step 06's

/// The forward: the warp-specialised kernel (forward.cu) on a persistent grid at d = 64
/// and 128, a block a tile at d = 256; h1's kernel where two_blocks_an_sm.
extern const GpuForward kForward;
/// The backward: dQ added by TMA bulk reductions as the blocks finish, in any order.
extern const GpuBackward kBackward;
/// The same kernels with dQ added in key-block order (a semaphore per query block), on a
/// grid of a block a tile: two runs give the same bits.
extern const GpuBackward kBackwardDeterministic;
constexpr int kForwardVersionCount = 6;
/// The forward versions of note 07's table (versions_forward.cu), for the bench and tests.
extern const GpuForward kForwardVersions[kForwardVersionCount];

}  // namespace fa::step07
