// Step 07 — Hopper: step 06's algorithm (same blocks of work, same rounding points) on the
// tensor memory accelerator, wgmma and warp specialisation, FlashAttention-3 style.
//
// Adds over step 06:
//   TMA        Q, K, V tiles copied from tensor maps, completing on mbarriers; K/V in a ring.
//   wgmma      products on a warpgroup (64 rows), operands in shared memory by descriptor.
//   producer   a warpgroup that only issues copies and gives its registers away (setmaxnreg).
//   ping-pong  two consumer warpgroups take turns on the tensor cores; in each, the softmax
//              of block j+1 runs under P·V of block j.
//   persistent a block an SM taking tile after tile, the causal tiles heaviest first.
// Backward (backward.cu): step 06's on the same pieces, dQ added by TMA bulk reductions.
// Grouped K/V heads, a sliding window and ragged batches, kernels and model (note 07,
// "Attention as models use it").
// Leaves for step 08: decoding shapes (few queries, many keys), split across blocks.
// Limits: d = 64, 128, 256; bf16 or fp16; sm_90 only (its kernels are sm_90a code).
// The lesson: notes/07_hopper.md. The hardware pieces: common/cuda/hopper.cuh.
#pragma once

#include <cstdint>
#include <vector>

#include "common/hd.hpp"
#include "common/hbm.hpp"
#include "common/step_api.hpp"

namespace fa::step07 {

// ---- The forward's block (note 07, "What Hopper adds").

constexpr int kRowsPerConsumer = 64;         ///< query rows of a consumer warpgroup: wgmma's M
constexpr int kMaxConsumers = 3;             ///< the most consumers a block takes (d = 64)
/// Registers a producer thread keeps after setmaxnreg: with two consumers, 24 leaves each of
/// them 240; more would leave their setmaxnreg waiting forever.
constexpr int kProducerRegs = 24;
constexpr int kBlockSmemBytes = 227 * 1024;  ///< the most shared memory a block may take on sm_90
struct FwdTile {
  int consumers;  ///< consumer warpgroups: B_r = 64·consumers query rows a block
  int keys;       ///< B_c: keys per K/V block (the N of S = Q·Kᵀ's wgmma)
  int stages;     ///< K/V blocks in flight: the depth of the TMA ring
  FA_HD constexpr int rows() const { return kRowsPerConsumer * consumers; }
  FA_HD constexpr int threads() const { return 128 * (1 + consumers); }
  /// Registers a consumer thread takes: what the SM's 65536 leave after the producer's,
  /// shared by the consumers, in steps of 8 (240 for two, 160 for three).
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
/// Two consumers, 128 keys, two stages; at d = 64 three consumers (the exponentials cost as
/// much as the products there: a third softmax fills the gaps); at d = 256 80 keys (a
/// consumer holds 128 fp32 of O, and the ring must fit). Note 07, "What Hopper adds".
FA_HD constexpr FwdTile forward_tile(int d) {
  return d == 64 ? FwdTile{3, 128, 2} : d == 256 ? FwdTile{2, 80, 2} : FwdTile{2, 128, 2};
}

/// Short problems at d = 64 take lesson row h1's kernel (short.cu): two warpgroups that both
/// compute, two blocks an SM, so one's fixed costs run under the other's products. It pays
/// where a query block visits at most kShortKvBlocks K/V blocks (note 07, "Short problems").
constexpr int kShortRows = 128;    ///< query rows of the short problems' block
constexpr int kShortKvBlocks = 8;  ///< K/V blocks a query block visits, at most, for it to pay
/// d = 64 and N ≤ 8·128 (1024), or with the mask (half as many blocks a query block) 2048.
FA_HD constexpr bool two_blocks_an_sm(int d, int N, bool causal) {
  return d == 64 && N <= (causal ? 2 : 1) * kShortKvBlocks * forward_tile(d).keys;
}
/// The rest run on a persistent grid (h9) where a consumer's O tile fits beside its Q tile and
/// the ring (d = 64, 128), a block a tile (h7) at d = 256.
FA_HD constexpr bool persistent_grid(int d, int N, bool causal) {
  return (d == 64 || d == 128) && !two_blocks_an_sm(d, N, causal);
}
struct FwdShape {
  int rows, keys;
};
/// The forward's block for a problem, rows × keys (the CPU model takes it).
FA_HD constexpr FwdShape forward_shape(int d, int N, bool causal) {
  return two_blocks_an_sm(d, N, causal) ? FwdShape{kShortRows, forward_tile(d).keys}
                                        : FwdShape{forward_tile(d).rows(), forward_tile(d).keys};
}

// ---- The scores a row keeps, in the kernels (note 07, "Attention as models use it").

/// Row i keeps the scores of keys k with lo ≤ k − i ≤ hi (and k < N): the diagonals of a
/// window's band, the causal mask folded in as hi = 0, an open side past every diagonal. The
/// one way the mask and the window reach the kernels, forward and backward.
struct Band {
  static constexpr int kOpen = 1 << 30;  ///< past every diagonal (Problem caps a window's sides there)
  int lo = -kOpen, hi = kOpen;
  /// No edge: every row keeps every key (neither causal nor a window).
  FA_HD constexpr bool open() const { return lo == -kOpen && hi == kOpen; }
  /// The first and last key row i keeps (of N).
  FA_HD constexpr int first_key(int i) const { return i + lo > 0 ? i + lo : 0; }
  FA_HD constexpr int last_key(int i, int N) const { return i + hi < N - 1 ? i + hi : N - 1; }
  /// The first and last row that keeps key k (rows of N).
  FA_HD constexpr int first_row(int k) const { return k - hi > 0 ? k - hi : 0; }
  FA_HD constexpr int last_row(int k, int N) const { return k - lo < N - 1 ? k - lo : N - 1; }
  /// Whether row i keeps key k of N: lo ≤ k − i ≤ hi as one unsigned comparison, no branch.
  FA_HD constexpr bool keeps(int i, int k, int N) const {
    return (k < N) & (unsigned(k - i - lo) <= unsigned(hi) - unsigned(lo));
  }
  /// Whether rows [r0, r1] against keys [k0, k1] may drop a score: the blocks that need the test.
  FA_HD constexpr bool cuts(int r0, int r1, int k0, int k1, int N) const {
    return k1 >= N || k1 - r0 > hi || k0 - r1 < lo;
  }
};
/// p's band for the kernels.
inline Band band_of(const Problem& p) {
  return {p.window_left >= 0 ? -p.window_left : -Band::kOpen,
          p.causal ? 0 : p.window_right >= 0 ? p.window_right : Band::kOpen};
}

// ---- The order of the tiles (note 07, "The order of the tiles").
//
// With the causal mask a head's tiles differ in cost, and the order decides the tail: taken
// heaviest first across heads (longest processing time first), the last tiles handed out are
// the cheapest. The heads go in sections whose K/V stay in L2; the last section alone goes
// heaviest first where a wave of tiles head after head spans eight heads or more, every
// section elsewhere.

/// Tile t's place: heads before `mixed_from` head after head, each its heaviest tile first;
/// from it on section after section (2^shift heads), heaviest first across a section's heads.
struct TileOrder {
  int blocks;       ///< tiles of a head
  int heads;        ///< B·H
  int shift;        ///< a section is 2^shift heads
  int mixed_from;   ///< the first head of the sections taken heaviest first (heads: none)
  int mixed_tiles;  ///< mixed_from·blocks: a field, which a producer reads from the kernel's parameters
  struct At {
    int p, bh;  ///< the head's p-th tile (heaviest first), of head bh
  };
  FA_HD constexpr TileOrder(int blocks_, int heads_, int shift_, int mixed_from_)
      : blocks(blocks_), heads(heads_), shift(shift_), mixed_from(mixed_from_), mixed_tiles(mixed_from_ * blocks_) {}
  FA_HD constexpr int tiles() const { return blocks * heads; }
  FA_HD constexpr int section() const { return 1 << shift; }
  /// The t-th tile handed out (a persistent grid's counter): a shift, a mask, one division.
  FA_HD constexpr At at(int t) const {
    if (t < mixed_tiles) return {t % blocks, t / blocks};  // head after head
    const int r = t - mixed_tiles, u = r >> shift, s = u / blocks;  // s: the section
    return {u - s * blocks, mixed_from + (s << shift) + (r & (section() - 1))};
  }
  /// The same order for a grid of a block a tile (blocks, section(), heads / section()),
  /// started x fastest: shifts and masks of the block's indices, no division.
  FA_HD constexpr At grid_tile(int x, int y, int z) const {
    const int first = z << shift, l = y * blocks + x;  // the section's first head; the block's place in it
    const bool mixed = first >= mixed_from;
    return {mixed ? l >> shift : x, first + (mixed ? l & (section() - 1) : y)};
  }
};
/// `heads` heads of `blocks` tiles, each head reading `bytes_a_head` bytes its tiles share,
/// on `sms` SMs with `l2_bytes` of L2: sections of as many heads as take two thirds of the L2,
/// a power of two that divides B·H; without the mask head after head.
FA_HD constexpr TileOrder tile_order(int blocks, int heads, bool causal, double bytes_a_head, double l2_bytes,
                                     int sms) {
  if (!causal) return {blocks, heads, 0, heads};
  int shift = 0;
  const double budget = l2_bytes * 2 / 3;
  for (long long s = 2; s <= heads && heads % s == 0 && double(s) * bytes_a_head <= budget; s *= 2) ++shift;
  const bool last_section_only = 8 * blocks <= sms;  // a wave head after head spans eight heads
  return {blocks, heads, shift, last_section_only ? heads - (1 << shift) : 0};
}

// ---- The layout of a tile in shared memory (note 07, "What Hopper adds").

/// R rows × d columns as d/64 panels of R rows × 64 columns, 128 bytes a row, each panel with
/// the 128-byte swizzle: what TMA writes and a wgmma descriptor reads.
constexpr int kPanel = 64;

/// Byte offset of element (r, c) in a tile of `rows` rows: the 16-byte chunk c/8 of row r
/// lies at chunk (c/8) XOR (r mod 8), so a core matrix's 8 rows fall in 8 bank groups.
FA_HD constexpr std::uint32_t swizzled(int rows, int r, int c) {
  // exercise 07-swizzle: the 128-byte swizzle — panel, row, then the row's 16-byte chunk XOR the row mod 8, then the element in the chunk
  // stub: return std::uint32_t((c / kPanel) * rows * 128 + r * 128 + (c % kPanel) * 2);
  return std::uint32_t((c / kPanel) * rows * 128 + r * 128 + ((((c % kPanel) / 8) ^ (r % 8)) * 16) + (c % 8) * 2);
  // end exercise
}

// ---- What the step takes, its CPU model.

constexpr int kSm = 90;  ///< sm_90 exactly (H100, H200, H20): sm_90a code runs nowhere else
inline constexpr int kSupportedD[] = {64, 128, 256, 0};

/// Throws fa::Error unless p is bf16 or fp16 with d in kSupportedD.
void require_supported(const Problem& p);
/// Step 06's model with step 07's blocks (forward_shape): the same rounding points.
ModelForward model_forward(const Problem& p, const Qkv& in);
Traffic traffic_forward(const Problem& p);  ///< elements (×2 bytes, L ×4)

// ---- The backward's block (note 07, "The backward").

constexpr int kBwdConsumers = 2;                            ///< consumer warpgroups of 64 keys each
constexpr int kBwdKeys = kBwdConsumers * kRowsPerConsumer;  ///< B_c: step 06's 128 keys
constexpr int kBwdQueries = 64;                             ///< queries a step at d = 256
constexpr int kBwdStages = 2;                               ///< query blocks in flight: the TMA ring
inline constexpr int kBackwardD[] = {64, 128, 256, 0};
/// B_c by d: at d = 256 dK and dV of 64 keys take a consumer's registers, so a block owns 64
/// keys and each consumer half of their columns.
FA_HD constexpr int backward_keys(int d) { return d == 256 ? kRowsPerConsumer : kBwdKeys; }
/// Queries a step by d: 96 at d = 64, where a step's fixed costs weigh most against products
/// of k = 64; 80 at d = 128, where more multiply-adds a byte of shared memory read pay.
FA_HD constexpr int backward_queries(int d) { return d == 64 ? 96 : d == 128 ? 80 : kBwdQueries; }

/// Step 06's model with step 07's blocks (backward_keys × backward_queries). Throws unless d is in kBackwardD.
ModelBackward model_backward(const Problem& p, const Qkv& in, const ForwardOut& fwd, const std::vector<float>& dout);
Traffic traffic_backward(const Problem& p);  ///< elements, as step 06's

// ---- Ragged batches (note 07, "Attention as models use it").
//
// Sequences of different lengths packed one after another, with no padding: Q, K, V and O
// are [1, H, T, d] (K, V: H_kv heads) and L [1, H, T], T the total, and `offsets` cuts the
// T rows of every head — sequence b is rows offsets[b] … offsets[b + 1] − 1 (FlashAttention's
// cu_seqlens). Attention stays inside a sequence: the packed problem under a block-diagonal
// mask, which the blocks never cross, so no tile of padding or of another sequence is
// computed. p is the packed problem (B = 1, N = N_kv = T); causal and the window apply
// within each sequence.

/// On the GPU the kernels read a table of the batch's blocks (the forward's query blocks, the
/// backward's key blocks), which a one-block kernel builds from the offsets on the device
/// (ragged.cu): entry u of the table is block i of the sequence whose rows are start … start +
/// length − 1. A tile's mask, band and softmax run in its sequence's coordinates; only its
/// copies add `start`.
struct SeqBlock {
  int i, start, length;
};
/// Blocks of `rows` rows a ragged batch has at most: ⌈T/rows⌉ + sequences.
FA_HD constexpr long long max_blocks(int T, int rows, int sequences) { return (T + rows - 1LL) / rows + sequences; }

/// The table's order. Without the mask, the sequences' blocks one sequence after another.
/// With it, where the longest sequence has at least kSortFromBlocks blocks, by the blocks'
/// weight across the batch, as a dense batch's heads go heaviest first: the forward's query
/// block i sees i + 1 key blocks and the backward's key block j of c blocks is seen by c − j
/// query blocks, so the table goes by that distance k from the light end (the forward takes
/// its table from the end, k ascending; the backward from the start, k descending), then by
/// the sequences' block counts, most first, then in the sequences' order. Shorter sequences
/// keep their own order, whose tiles share their K/V in L2 (lab: 07_ragged).
constexpr int kSortFromBlocks = 16;
/// A ragged batch's tables as the kernels take them: `blocks` (the forward's query blocks of
/// `rows` rows, or with q_rows the backward's key blocks) in the order above; for each the
/// first entry of its sequence in `q_blocks`, the backward's query blocks of q_rows rows in
/// the sequences' order. Offsets are taken as the device takes them (ragged.cu: clamped to
/// [0, T], each the largest so far).
struct RaggedTable {
  std::vector<SeqBlock> blocks;
  std::vector<int> q_first;
  std::vector<SeqBlock> q_blocks;
};
/// The tables by the CPU (model.cpp), and as the GPU builds them (ragged.cu, copied back).
RaggedTable ragged_table_model(const std::vector<int>& offsets, int T, int rows, int q_rows, bool causal);
RaggedTable ragged_table_gpu(const std::vector<int>& offsets, int T, int rows, int q_rows, bool causal);

/// Sequence b of a ragged batch as a problem of its own (B = 1, N = its length).
Problem sequence(const Problem& p, const std::vector<int>& offsets, int b);
/// The model of each sequence on its rows: the blocks, the roundings, the traffic of each.
ModelForward model_forward_ragged(const Problem& p, const Qkv& in, const std::vector<int>& offsets);
ModelBackward model_backward_ragged(const Problem& p, const Qkv& in, const ForwardOut& fwd,
                                    const std::vector<float>& dout, const std::vector<int>& offsets);

// ---- The exports.

/// The forward: h1's kernel where two_blocks_an_sm, else the warp-specialised one (forward.cu).
extern const GpuForward kForward;
/// The backward: dQ added by TMA bulk reductions as the blocks finish, in any order.
extern const GpuBackward kBackward;
/// The same kernels with dQ added in key-block order, a block a tile: two runs, the same bits.
extern const GpuBackward kBackwardDeterministic;
/// The shares the backward splits a group's query heads into (1: a tile walks them all, dK and
/// dV summed in registers; more where the groups' tiles are too few for the GPU, each share's
/// dK and dV added in fp32 in no fixed order; always 1 in the deterministic mode). Needs a GPU.
int backward_parts(const Problem& p, bool deterministic);
/// The forward rows of note 07's table, h1, h2, h3, h4, h7, h9 (versions_forward.cu).
constexpr int kForwardVersionCount = 6;
extern const GpuForward kForwardVersions[kForwardVersionCount];

}  // namespace fa::step07
