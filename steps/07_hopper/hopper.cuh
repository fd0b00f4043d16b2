// Step 07's Hopper building blocks, for its forward and its backward:
//   the tensor memory accelerator (TMA): tensor maps made on the host, tile copies
//     that complete on an mbarrier, tile stores;
//   mbarriers: wait on a phase, arrive, arrive expecting bytes;
//   wgmma: the shared-memory matrix descriptor, fence / commit / wait, and the
//     products themselves (Wgmma<T, N>, its instructions in wgmma_ops.cuh);
//   warp specialisation: setmaxnreg and named barriers.
// Where the CUDA Toolkit's libcu++ has the instruction (cuda::ptx: TMA, mbarrier,
// fences, bulk groups) it is used; inline PTX only for what CUDA 13.0's libcu++ lacks
// (wgmma, setmaxnreg, named barriers), each with its PTX ISA section.
//
// One layout everywhere: a tile of R rows × d columns of 16-bit elements lives in
// shared memory as d/64 panels of R rows × 64 columns (128 bytes a row), each panel
// with the 128-byte swizzle (16-byte chunk c of row r stored at chunk c XOR r % 8).
// TMA writes exactly that (a 4-d tensor map: 64 columns, rows, panels, heads), and it
// is the canonical layout that a wgmma descriptor with 128-byte swizzle reads.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only: the driver is reached at run time)
#include <cuda/atomic>
#include <cuda/ptx>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/problem.hpp"
#include "common/cuda/mma.cuh"  // smem_u32: a shared-space address
#include "steps/07_hopper/step07.hpp"     // kPanel, swizzled: the panel layout

// wgmma and setmaxnreg exist only in the sm_90a target (step 07 builds for nothing
// else: its CMakeLists.txt). The host pass sees the whole body.
#if !defined(__CUDA_ARCH__) || (defined(__CUDA_ARCH_FEAT_SM90_ALL))
#define FA_STEP07_ARCH_OK 1
#else
#define FA_STEP07_ARCH_OK 0
#endif

namespace fa::step07 {

using step06::smem_u32;

// ---------------------------------------------------------------------------------
// Host: tensor maps.

/// A TMA tensor map over one [B·H, N, d] tensor of 16-bit elements, read or written
/// in boxes of `box_rows` rows × all d columns: a 4-d map (64 columns, N rows, d/64
/// panels, B·H heads) whose box lands in shared memory as the panels above, with
/// the 128-byte swizzle. Rows past N read as zeros and are not written.
/// Made through the driver's cuTensorMapEncodeTiled, reached by
/// cudaGetDriverEntryPointByVersion: nothing links libcuda by hand.
CUtensorMap make_tile_map(const void* base, DType t, int N, std::size_t heads, int d, int box_rows,
                          CUtensorMapL2promotion promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B);

// ---------------------------------------------------------------------------------
// mbarriers (cuda::ptx) and TMA copies.

/// Blocks until the barrier's phase with this parity has completed.
__device__ __forceinline__ void wait(std::uint64_t* bar, std::uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}
/// The same wait, its loop's exit decided for the whole warp at once (a vote): a branch that
/// ptxas can see is uniform. Between the issue of wgmma products and the wait for them, a
/// loop that threads may leave one by one makes ptxas serialise every wgmma of the kernel
/// (C7518/C7520, "... in divergent path").
__device__ __forceinline__ void wait_warp(std::uint64_t* bar, std::uint32_t parity) {
  while (!__all_sync(0xffffffffu, cuda::ptx::mbarrier_try_wait_parity(bar, parity))) {
  }
}
/// This thread's arrival, announcing `bytes` that TMA copies will complete on it.
__device__ __forceinline__ void arrive_expecting(std::uint64_t* bar, std::uint32_t bytes) {
  (void)cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                             bar, bytes);
}
__device__ __forceinline__ void arrive(std::uint64_t* bar) { (void)cuda::ptx::mbarrier_arrive(bar); }

/// TMA: the box of `map` at (row, head) into shared memory at dst; it completes on bar.
__device__ __forceinline__ void load_tile(const CUtensorMap* map, void* dst, std::uint64_t* bar, int row, int head) {
  const std::int32_t at[4] = {0, row, 0, head};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, map, at, bar);
}
/// TMA: shared memory at src into the box of `map` at (row, head); rows past N are
/// dropped by the map's bounds. Completes in a bulk group of the issuing thread.
__device__ __forceinline__ void store_tile(const CUtensorMap* map, const void* src, int row, int head) {
  const std::int32_t at[4] = {0, row, 0, head};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, map, at, src);
}

// ---------------------------------------------------------------------------------
// wgmma (PTX ISA 8.0, sm_90a: "Asynchronous Warpgroup Level Matrix Multiply-Accumulate
// Instructions"). A warpgroup is 4 consecutive warps; warp w of it owns rows 16w..16w+15
// of the m64 product. The fp32 accumulators of m64nNk16 are N/2 registers a thread in
// the mma.sync C layout repeated along N: register 4j + 2h + e holds row g + 8h and
// column 8j + 2t + e (lane = 4g + t).

/// The shared-memory matrix descriptor ("Matrix Descriptor Format"): start address,
/// leading- and stride-dimension byte offsets (all >> 4), swizzle mode 1 = 128 bytes.
/// For the panel layout above:
///   K-major operand (Q, K: the k index runs along a row): SBO = 1024, the step from
///     8 rows to the next 8; LBO unused; the k-th 16-column step is start + 32·k bytes
///     inside a panel, and the next panel is `rows`·128 bytes further;
///   MN-major operand (V in P·V: the n index runs along a row): SBO = 1024, the step
///     from 8 k-rows to the next 8; LBO = the panel size, the step from 64 n-columns to
///     the next 64; the k-th 16-row step is start + 2048·k.
/// Tiles start 1024-byte aligned, so the base-offset field stays 0.
__device__ __forceinline__ std::uint64_t descriptor(std::uint32_t addr, std::uint32_t lbo) {
  return std::uint64_t((addr & 0x3FFFF) >> 4) | std::uint64_t((lbo & 0x3FFFF) >> 4) << 16 |
         std::uint64_t(1024 >> 4) << 32 | std::uint64_t(1) << 62;
}

/// "wgmma.fence": orders this warpgroup's register writes (accumulators, A fragments)
/// before the wgmma that reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
/// "wgmma.commit_group": the wgmmas issued since the last commit become one group.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
/// "wgmma.wait_group N": waits until at most N groups are pending. The accumulators
/// of a pending group must not be touched: the "+f" ties below make the compiler
/// keep them where the instruction writes them.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
template <int N, int R>
__device__ __forceinline__ void wgmma_wait(float (&acc)[R]) {
  wgmma_wait<N>();
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}
/// The same tie for A fragments a pending rs product reads: their registers are not
/// reused before this point.
template <int K>
__device__ __forceinline__ void fence_registers(std::uint32_t (&a)[K][4]) {
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(a[k][r])::"memory");
}

/// D(64×N, fp32) (+)= A(64×16)·B(16×N) for one k step: ss with A and B by descriptor,
/// rs with A from registers. kTransA, kTransB: 0 K-major, 1 MN-major.
template <class T, int N>
struct Wgmma {
  template <int kTransA, int kTransB>
  __device__ static void ss(float (&d)[N / 2], std::uint64_t a, std::uint64_t b, bool accumulate);
  template <int kTransB>
  __device__ static void rs(float (&d)[N / 2], const std::uint32_t (&a)[4], std::uint64_t b, bool accumulate);
};

// The k loops of the two kinds of product, issued between the caller's wgmma_fence and
// wgmma_commit (which the kernels write out: the groups are what they wait on).

/// D(64×N) = A·Bᵀ over k = K: A (64 rows) and B (N rows) both K-major in shared memory (the
/// k index runs along a row), a and b their first rows, in 64-column panels of a_rows and
/// b_rows rows: a 16-column k step is 32 bytes into a panel, the next panel after 4 steps.
template <class T, int N, int K>
__device__ __forceinline__ void ss_kk(float (&d)[N / 2], std::uint32_t a, int a_rows, std::uint32_t b, int b_rows) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    const std::uint32_t col = (kk % 4) * 32;
    Wgmma<T, N>::template ss<0, 0>(d, descriptor(a + (kk / 4) * a_rows * 128 + col, 0),
                                   descriptor(b + (kk / 4) * b_rows * 128 + col, 0), kk > 0);
  }
}

/// An m64 accumulator (64 × N fp32: N/2 registers a thread) rounded to 16 bits as the A
/// fragments of a product with k = N: registers 4n..4n+3 are columns 8n..8n+7, two n
/// make a 16-column k step.
template <class T, int N>
__device__ __forceinline__ void to_a(const float (&acc)[N / 2], std::uint32_t (&a)[N / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) a[kk][r] = step06::Mma<T>::pack(acc[8 * kk + 2 * r], acc[8 * kk + 2 * r + 1]);
}

/// D(64×N) = A·Bᵀ over k = K: A from registers (K/16 k steps), B (N rows) K-major in
/// shared memory as in ss_kk. The backward's Sᵀ = K_c·Q_iᵀ and dPᵀ = V_c·dO_iᵀ at d = 64,
/// where K_c and V_c stay in registers.
template <class T, int N, int K>
__device__ __forceinline__ void rs_kk(float (&d)[N / 2], const std::uint32_t (&a)[K / 16][4], std::uint32_t b,
                                      int b_rows) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    Wgmma<T, N>::template rs<0>(d, a[kk], descriptor(b + (kk / 4) * b_rows * 128 + (kk % 4) * 32, 0), kk > 0);
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

/// D(64×N) += A·B: A from registers (K/16 k steps), B MN-major in shared memory at `b` (its
/// rows are the k index: a 16-row k step is 2048 bytes; its 64-column panels `panel` bytes
/// apart, the LBO).
template <class T, int N, int K>
__device__ __forceinline__ void rs_mn(float (&d)[N / 2], const std::uint32_t (&a)[K / 16][4], std::uint32_t b,
                                      std::uint32_t panel) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) Wgmma<T, N>::template rs<1>(d, a[kk], descriptor(b + kk * 16 * 128, panel), true);
}

/// D(64×N) += A·B with both in shared memory: A K-major in one 64-column panel (K ≤ 64: a
/// 16-column k step is 32 bytes along its rows), B MN-major as in rs_mn. The backward's
/// dV += Pᵀ·dO and dK += dSᵀ·Q at d = 256, where Pᵀ and dSᵀ come from shared memory.
template <class T, int N, int K>
__device__ __forceinline__ void ss_kmn(float (&d)[N / 2], std::uint32_t a, std::uint32_t b, std::uint32_t panel) {
  static_assert(K <= kPanel, "A is one panel");
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    Wgmma<T, N>::template ss<0, 1>(d, descriptor(a + kk * 32, 0), descriptor(b + kk * 16 * 128, panel), true);
}

/// D(64×N) = A·B with both MN-major in shared memory (A read transposed: its rows are the
/// k index, its m index runs along a row, as B's n does): a 16-row k step is 2048 bytes in
/// both; a_panel, b_panel their LBOs. The backward's dQ = dS·K, dS read from dSᵀ.
template <class T, int N, int K>
__device__ __forceinline__ void ss_mnmn(float (&d)[N / 2], std::uint32_t a, std::uint32_t a_panel, std::uint32_t b,
                                        std::uint32_t b_panel) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    Wgmma<T, N>::template ss<1, 1>(d, descriptor(a + kk * 16 * 128, a_panel), descriptor(b + kk * 16 * 128, b_panel),
                                   kk > 0);
}

/// D(64×N) = A·B: A MN-major in shared memory as in ss_mnmn (a 16-row k step is 2048 bytes;
/// a_panel its LBO), B K-major as in ss_kk (N rows, the k index along a row, 64-column
/// panels b_rows rows apart). The backward's dQᵀ = K_jᵀ·dSᵀ with 80 or 96 queries a step,
/// where dQ itself would need M = 80 or 96: a wgmma's M is 64, so the 64 columns of a panel of
/// K_j take that side.
template <class T, int N, int K>
__device__ __forceinline__ void ss_mnk(float (&d)[N / 2], std::uint32_t a, std::uint32_t a_panel, std::uint32_t b,
                                       int b_rows) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    Wgmma<T, N>::template ss<1, 0>(d, descriptor(a + kk * 16 * 128, a_panel),
                                   descriptor(b + (kk / 4) * b_rows * 128 + (kk % 4) * 32, 0), kk > 0);
}

/// store_a transposed: the A fragments of a 64-row × K tile (K/16 k steps, what to_a makes
/// of an accumulator) written as its transpose, K rows × 64 columns at columns col0 …
/// col0 + 63 of a panel-layout tile of `rows` rows. One "stmatrix.sync.aligned.m8n8.x4.trans
/// .shared.b16" (PTX ISA 7.8, sm_90: "Data Movement and Conversion Instructions: stmatrix";
/// libcu++'s cuda::ptx has no stmatrix) per k step and warp: its four 8×8 matrices are
/// registers 0 … 3, register r holding rows 16·warp + g (+8 if r is odd) and columns
/// 16kk + 8⌊r/2⌋ + 2t, 2t + 1, which .trans stores as rows 16kk + 8⌊r/2⌋ + 2t, 2t + 1 of
/// eight contiguous 16-bit columns; lane l gives the address of row l mod 8 of matrix ⌊l/8⌋.
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

// ---------------------------------------------------------------------------------
// Persistent grids: a block an SM, taking tile after tile.

/// The next tile no block of a persistent grid has taken yet: the grid's blocks start on
/// tiles 0 … gridDim.x − 1, and the rest are handed out by a counter of tiles taken past
/// those (zeroed before the launch), each fetch_add one tile. `tiles` (the end) once
/// none is left, or if the grid has a block for every tile (the counter is not read then).
__device__ __forceinline__ int take_tile(int* taken, int tiles) {
  if (int(gridDim.x) >= tiles) return tiles;
  cuda::atomic_ref<int, cuda::thread_scope_device> counter(*taken);
  return int(gridDim.x) + counter.fetch_add(1, cuda::memory_order_relaxed);
}

/// Which tile a block works on, told by its producer (the one thread that takes tiles) to
/// the rest of the block through two slots of shared memory, tile n of the block in slot
/// n % 2 (a tile past the last: the end). Every thread that reads a slot arrives on its
/// "empty" barrier once it has, and the producer waits for all of them before it writes
/// the slot again (tile n + 2): a reader may run a tile behind the others (the backward's
/// writer of dQ), and each reading thread's own arrival is what orders its read before the
/// next write (compute-sanitizer's racecheck sees no other path).
struct TileRing {
  static constexpr int kBytes = 2 * 8 + 2 * 8 + 2 * 4;
  std::uint64_t *full, *empty;  // [2] each
  int* slot;                    // [2]
  __device__ explicit TileRing(unsigned char* at)
      : full(reinterpret_cast<std::uint64_t*>(at)), empty(full + 2), slot(reinterpret_cast<int*>(empty + 2)) {}
  /// By one thread, before the block's barriers' fence_mbarrier_init: `readers` threads
  /// take every tile.
  __device__ void init(int readers) const {
    for (int s = 0; s < 2; ++s) {
      cuda::ptx::mbarrier_init(&full[s], 1);
      cuda::ptx::mbarrier_init(&empty[s], readers);
    }
  }
  /// By the producer: tile n of the block, once every reader has taken tile n − 2.
  __device__ void publish(int n, int tile) const {
    wait(&empty[n % 2], (n / 2) % 2 ^ 1);  // a fresh barrier: parity 1 is done
    slot[n % 2] = tile;
    arrive(&full[n % 2]);
  }
  /// By every reader: tile n of the block.
  __device__ int take(int n) const {
    wait(&full[n % 2], (n / 2) % 2);
    const int tile = slot[n % 2];
    arrive(&empty[n % 2]);
    return tile;
  }
};
/// A persistent block's producer: the tile at position `pos` (< order.tiles()) in the order,
/// told to the block (slot n) as its index head after head, bh·blocks + p — so that only the
/// producer works the order out —, and returned.
__device__ __forceinline__ TileOrder::At tell_tile(const TileOrder& order, const TileRing& ring, int n, int pos) {
  const TileOrder::At at = order.at(pos);
  ring.publish(n, at.bh * order.blocks + at.p);
  return at;
}

// ---------------------------------------------------------------------------------
// Warp specialisation.

/// "setmaxnreg" (PTX ISA 8.0, sm_90a, "Miscellaneous Instructions: setmaxnreg"): the
/// warpgroup gives registers back to the block's pool (dec) or takes them (inc).
template <int kRegs>
__device__ __forceinline__ void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

/// Named barriers ("Parallel Synchronization and Communication Instructions: bar,
/// barrier"): `sync` waits until `threads` threads arrived at barrier `id` (its own
/// arrival included); `arrive` arrives without waiting. Id 0 is __syncthreads'.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace fa::step07

#include "steps/07_hopper/wgmma_ops.cuh"
