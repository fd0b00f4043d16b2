// Step 07's own pieces on top of the shared Hopper building blocks (common/cuda/hopper.cuh):
// accumulators rounded into wgmma A fragments, A fragments to and from the panel layout
// (one of them transposed by stmatrix), and a persistent block's tile told by its producer.
#pragma once

#include <cstdint>

#include "common/cuda/hopper.cuh"
#include "common/cuda/mma.cuh"         // smem_u32, Mma<T>::pack
#include "steps/07_hopper/step07.hpp"  // swizzled: the panel layout; TileOrder

namespace fa::step07 {

using namespace fa::hopper;  // TMA, mbarriers, wgmma, setmaxnreg, named barriers, TileRing
using mma::smem_u32;
static_assert(kPanel == hopper::kPanel, "step 07's panel layout is the one TMA and wgmma take");

/// An m64 accumulator (64 × N fp32: N/2 registers a thread) rounded to 16 bits as the A
/// fragments of a product with k = N: registers 4n..4n+3 are columns 8n..8n+7, two n make a
/// 16-column k step.
template <class T, int N>
__device__ __forceinline__ void to_a(const float (&acc)[N / 2], std::uint32_t (&a)[N / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) a[kk][r] = mma::Mma<T>::pack(acc[8 * kk + 2 * r], acc[8 * kk + 2 * r + 1]);
}

/// Where register r of k step kk of an A fragment lies in a panel-layout tile of `rows`
/// rows, for the 64 rows row0 … row0 + 63: row row0 + 16·warp + g (+8 if r is odd),
/// columns 16kk + 8⌊r/2⌋ + 2t, 2t + 1 — what to_a makes of an accumulator. In bytes.
__device__ __forceinline__ std::uint32_t a_fragment_at(int rows, int row0, int kk, int r, int warp, int g, int t) {
  return swizzled(rows, row0 + 16 * warp + g + 8 * (r % 2), 16 * kk + 8 * (r / 2) + 2 * t);
}

/// The A fragments (K/16 k steps) of rows row0 … row0 + 63 of a panel-layout tile, read
/// from shared memory (a_fragment_at).
template <int K>
__device__ __forceinline__ void load_a(std::uint32_t (&a)[K / 16][4], const unsigned char* tile, int rows, int row0,
                                       int warp, int g, int t) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r)
      a[kk][r] = *reinterpret_cast<const std::uint32_t*>(tile + a_fragment_at(rows, row0, kk, r, warp, g, t));
}

/// load_a's inverse: A fragments written into rows row0 … row0 + 63 of a panel-layout tile.
template <int K>
__device__ __forceinline__ void store_a(unsigned char* tile, const std::uint32_t (&a)[K / 16][4], int rows, int row0,
                                        int warp, int g, int t) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r)
      *reinterpret_cast<std::uint32_t*>(tile + a_fragment_at(rows, row0, kk, r, warp, g, t)) = a[kk][r];
}

/// store_a transposed: the A fragments of a 64-row × K tile written as its transpose, K rows
/// × 64 columns at columns col0 … col0 + 63 of a panel-layout tile of `rows` rows. One
/// "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16" (PTX ISA 7.8, sm_90: "Data Movement and
/// Conversion Instructions: stmatrix"; cuda::ptx has no stmatrix) per k step and warp: its
/// four 8×8 matrices are registers 0 … 3, register r holding rows 16·warp + g (+8 if r is
/// odd) and columns 16kk + 8⌊r/2⌋ + 2t, 2t + 1, which .trans stores as rows 16kk + 8⌊r/2⌋ +
/// 2t, 2t + 1 of eight contiguous 16-bit columns; lane l gives the address of row l mod 8 of
/// matrix ⌊l/8⌋.
template <int K>
__device__ __forceinline__ void store_a_transposed(unsigned char* tile, const std::uint32_t (&a)[K / 16][4], int rows,
                                                   int col0, int warp, int lane) {
  const int m = lane / 8, row = 8 * (m / 2) + lane % 8, col = col0 + 16 * warp + 8 * (m % 2);
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                     smem_u32(tile + swizzled(rows, 16 * kk + row, col))),
                 "r"(a[kk][0]), "r"(a[kk][1]), "r"(a[kk][2]), "r"(a[kk][3])
                 : "memory");
}

/// A persistent block's producer: the tile at position `pos` (< order.tiles()) in the order,
/// told to the block (slot n) as its index head after head, bh·blocks + p — so that only the
/// producer works the order out —, and returned.
__device__ __forceinline__ TileOrder::At tell_tile(const TileOrder& order, const TileRing& ring, int n, int pos) {
  const TileOrder::At at = order.at(pos);
  ring.publish(n, at.bh * order.blocks + at.p);
  return at;
}

}  // namespace fa::step07
