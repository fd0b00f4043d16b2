// Step 07 on a ragged batch: the tables of blocks its kernels read (ragged.cu builds them on
// the device), and how a kernel finds its tile's sequence. Shared by the forward and the
// backward (note 07, "Attention as models use it").
#pragma once

#include <cstddef>

#include "common/hd.hpp"
#include "common/step_api.hpp"
#include "steps/07_hopper/step07.hpp"

namespace fa::step07 {

/// The tables ragged_tables lays out in a workspace, as the kernels read them.
struct RaggedTables {
  SeqBlock* blocks;              ///< each sequence's blocks of `rows` rows, the sequences in order
  TileOrder* order;              ///< the order of their tiles over `units` units (heads, or K/V heads' shares)
  int* tiles;                    ///< the number of those tiles (order's)
  int* q_count;                  ///< the backward: entries of q_blocks
  int* q_first = nullptr;        ///< the backward: [blocks] the first entry of the block's sequence in q_blocks
  SeqBlock* q_blocks = nullptr;  ///< the backward: each sequence's blocks of `q_rows` rows
};
/// Bytes of the tables of a ragged batch of T rows (q_rows = 0: no query blocks' table).
std::size_t ragged_tables_bytes(int T, int rows, int q_rows, int sequences);
/// The tables, made in `workspace` by one block on stream s, *taken (a persistent grid's tile
/// counter) zeroed. bytes_a_unit: what a unit's tiles share, for the order's sections (L2).
RaggedTables ragged_tables(const Ragged& r, int T, int rows, int q_rows, int units, bool causal, double bytes_a_unit,
                           void* workspace, int* taken, Stream s);

/// A tile's block in its sequence: block i of the rows start … start + length − 1 of the
/// packed tensors. A dense problem's tile u is block u of its one sequence, all N rows; a
/// ragged batch's is entry u of the table.
template <bool kRagged>
__device__ __forceinline__ SeqBlock seq_block(const SeqBlock* table, int u, int N) {
  if constexpr (kRagged) return table[u];
  else return {u, 0, N};
}

/// Rows 0 … count − 1 of a panel-layout tile of `rows` rows × kD 16-bit columns, copied to dst
/// (kD elements a row) 16 bytes at a time by threads `thread` of `threads`: what a TMA store of
/// the tile would write, for a sequence's last rows, where the box would run past its end.
template <int kD>
__device__ __forceinline__ void store_rows(void* dst, const unsigned char* tile, int rows, int count, int thread,
                                           int threads) {
  auto* out = static_cast<uint4*>(dst);
  for (int x = thread; x < count * (kD / 8); x += threads) {
    const int r = x / (kD / 8), col = 8 * (x % (kD / 8));
    out[(std::size_t(r) * kD + col) / 8] = *reinterpret_cast<const uint4*>(tile + swizzled(rows, r, col));
  }
}

/// `f.template operator()<kRagged>()`: kRagged where the arguments carry a ragged batch.
template <class Args, class F>
void with_ragged(const Args& a, F&& f) {
  a.ragged.sequences ? f.template operator()<true>() : f.template operator()<false>();
}

}  // namespace fa::step07
