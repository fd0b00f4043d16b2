// The tile geometry shared by the fused steps (02–05) and their CPU models.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/hd.hpp"
#include "common/problem.hpp"

namespace fa::tiles {

constexpr int kBr = 32;        ///< query rows per block (B_r)
constexpr int kBc = 32;        ///< key/value rows per block (B_c): one per lane of a warp
constexpr int kThreads = 256;  ///< 8 warps; warp w owns rows w, w+8, w+16, w+24 of a tile
constexpr int kRowsPerWarp = kBr / (kThreads / 32);
constexpr int kMaxD = 256;     ///< largest head dimension the fused kernels take

/// Shared-memory row stride for a tile of width d: odd, so that 32 lanes reading
/// 32 different rows at the same column hit 32 different banks.
FA_HD constexpr int padded(int d) { return d | 1; }

/// Block sizes of the fused steps' CPU models: the kernels' (B_r = B_c = 32) by
/// default, or chosen from an on-chip budget (tiles_for).
struct Tiles {
  int br = kBr, bc = kBc;
};

/// Square blocks b × b for an on-chip budget of M elements: the forward holds Q_i, O_i,
/// K_j, V_j (4·b·d), S_ij (b²) and a row's m, ℓ (2b), so b is the largest with
/// 4·b·d + b² + 2b ≤ M — close to the lecture's B_c = M/(4d) while b ≪ d. With N/b
/// query blocks each re-reading K and V, that traffic is 2·N·d·N/b =
/// (8 + (2b + 4)/d)·N²d²/M when M is used up: Θ(N²d²/M) (note 02).
inline Tiles tiles_for(std::size_t M, int d) {
  // exercise 02-blocks: the largest b whose blocks fit M (lecture p33–34, IO-aware notes 分块): Q_i, K_j, V_j, O_i (4·b·d), S_ij (b²) and a row's m, ℓ (2b) — 4·b·d + b² + 2b ≤ M
  // stub: int b = 1;
  int b = 0;
  while (4 * std::size_t(b + 1) * d + std::size_t(b + 1) * (b + 1) + 2 * std::size_t(b + 1) <= M) ++b;
  // end exercise
  if (b < 1) throw Error("an on-chip budget of " + std::to_string(M) + " elements holds no 1-row tile at d = " +
                         std::to_string(d));
  return {b, b};
}

// The block sizes default to steps 02–05's; step 06 passes its own (64 × 64).
FA_HD int q_blocks(int N, int br = kBr) { return (N + br - 1) / br; }   ///< T_r
FA_HD int kv_blocks(int N, int bc = kBc) { return (N + bc - 1) / bc; }  ///< T_c

/// Last K/V block query block i needs: all of them, or (causal) the one holding
/// the diagonal of its last row. Blocks after it are skipped, not just masked.
/// With Nk keys for the N queries (Nk = 0: N) the queries are the last N positions,
/// so row r sits at position r + Nk − N.
FA_HD int last_kv_block(int N, bool causal, int i, int br = kBr, int bc = kBc, int Nk = 0) {
  if (Nk == 0) Nk = N;
  if (!causal) return kv_blocks(Nk, bc) - 1;
  const int last_row = ((i + 1) * br < N ? (i + 1) * br : N) - 1;
  return (last_row + Nk - N) / bc;
}
/// First query block that needs K/V block j (causal: the one holding row j·B_c).
FA_HD int first_q_block(bool causal, int j, int br = kBr, int bc = kBc) { return causal ? (j * bc) / br : 0; }

/// Whether score (query, key) of a head of N keys is left out: a key past the end,
/// or, with the causal mask, a key after the query. (Queries past the end need no
/// test: their rows are computed on zero-filled tiles and never stored.)
FA_HD bool masked(int query, int key, int N, bool causal) { return key >= N || (causal && key > query); }

/// Rows of block `blk` (blocks of `rows` rows) that lie inside the sequence.
FA_HD int valid_rows(int N, int blk, int rows) { return N - blk * rows < rows ? N - blk * rows : rows; }

/// Blocks first … last (none where last < first).
struct BlockRange {
  int first, last;
};
/// The K/V blocks query block i needs: from the one holding the first key its first row sees
/// to the one holding the last key its last row sees (a window's or the mask's band; all of
/// them without either). Blocks outside are skipped, not just masked.
inline BlockRange kv_block_range(const Problem& p, int i, int br = kBr, int bc = kBc) {
  const int q0 = i * br, q1 = std::min(p.N, q0 + br) - 1;
  return {p.first_key(q0) / bc, p.last_key(q1) / bc};
}
/// The query blocks that need K/V block j: the rows that see one of its keys.
inline BlockRange q_block_range(const Problem& p, int j, int br = kBr, int bc = kBc) {
  const int first = p.first_query(j * bc), last = p.last_query(std::min(p.keys(), (j + 1) * bc) - 1);
  return first > last ? BlockRange{0, -1} : BlockRange{first / br, last / br};
}

/// Σ over query blocks i of the K/V rows that block i visits: N_kv·T_r without a
/// mask; with the causal mask, the K/V blocks up to the diagonal; with a window, its band.
inline std::uint64_t kv_rows_visited(const Problem& p, int br = kBr, int bc = kBc) {
  std::uint64_t s = 0;
  for (int i = 0; i < q_blocks(p.N, br); ++i) {
    const BlockRange r = kv_block_range(p, i, br, bc);
    s += std::uint64_t(std::min(p.keys(), (r.last + 1) * bc) - r.first * bc);
  }
  return s;
}

/// Σ over K/V blocks j of the query rows that visit block j (the backward's
/// K/V-outer pass re-reads Q_i, dO_i once per such visit): N·T_c without a mask.
inline std::uint64_t q_rows_visited(const Problem& p, int br = kBr, int bc = kBc) {
  std::uint64_t s = 0;
  for (int j = 0; j < kv_blocks(p.keys(), bc); ++j) {
    const BlockRange r = q_block_range(p, j, br, bc);
    for (int i = r.first; i <= r.last; ++i) s += std::uint64_t(valid_rows(p.N, i, br));
  }
  return s;
}

}  // namespace fa::tiles
