// Hopper's data-movement and tensor-core building blocks (sm_90), shared by the steps that
// use them (07, 08):
//   TMA         tensor maps made on the host, tile copies that complete on an mbarrier,
//               tile stores;
//   mbarriers   wait on a phase, arrive, arrive expecting bytes;
//   wgmma       the shared-memory matrix descriptor, fence / commit / wait, the products
//               (Wgmma<T, N>, their instructions generated in wgmma_ops.cuh) and the k loops
//               of the kinds of product the steps take;
//   warp specialisation: setmaxnreg and named barriers;
//   persistent grids: a tile counter, and a ring that tells a block's threads their tile.
// Where CUDA 13.0's libcu++ has the instruction (cuda::ptx: TMA, mbarrier, fences, bulk
// groups) it is used; inline PTX only for what it lacks, each with its PTX ISA section.
//
// One layout everywhere: a tile of R rows × d columns of 16-bit elements lives in shared
// memory as d/64 panels of R rows × 64 columns (128 bytes a row), each panel with the
// 128-byte swizzle (16-byte chunk c of row r stored at chunk c XOR r % 8). TMA writes exactly
// that (a 4-d tensor map: 64 columns, rows, panels, heads), and it is the canonical layout a
// wgmma descriptor with the 128-byte swizzle reads.
#pragma once

#include <cuda.h>           // CUtensorMap and its enums (types only: the driver is reached at run time)
#include <cudaTypedefs.h>   // PFN_cuTensorMapEncodeTiled
#include <cuda/atomic>
#include <cuda/ptx>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

#include "common/cuda_check.cuh"
#include "common/problem.hpp"

// wgmma and setmaxnreg exist only in the architecture-specific target sm_90a; a kernel that
// issues them is compiled only there (#if FA_SM90A). The host pass sees the whole body.
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_SM90A 1
#else
#define FA_SM90A 0
#endif

namespace fa::hopper {

constexpr int kPanel = 64;  ///< columns of a panel: 64 16-bit elements = 128 bytes a row

// ---------------------------------------------------------------------------------
// Host: tensor maps.

/// The driver's cuTensorMapEncodeTiled, found once through the runtime (nothing links
/// libcuda by hand).
inline PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    FA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || !f)
      throw Error("this CUDA driver has no cuTensorMapEncodeTiled (TMA needs driver 12.0 or newer)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

/// A TMA tensor map over one [heads, N, d] tensor of 16-bit elements, read or written in
/// boxes of `box_rows` rows × all d columns: a 4-d map (64 columns, N rows, d/64 panels,
/// heads) whose box lands in shared memory as the panels above. Rows past N read as zeros
/// and are not written.
inline CUtensorMap make_tile_map(const void* base, DType t, int N, std::size_t heads, int d, int box_rows,
                                 CUtensorMapL2promotion promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B) {
  // Dimensions, innermost first, and the byte strides of dimensions 1..3 (a row, a panel, a head).
  const cuuint64_t dims[4] = {cuuint64_t(kPanel), cuuint64_t(N), cuuint64_t(d / kPanel), cuuint64_t(heads)};
  const cuuint64_t strides[3] = {cuuint64_t(d) * 2, cuuint64_t(kPanel) * 2, cuuint64_t(N) * d * 2};
  const cuuint32_t box[4] = {cuuint32_t(kPanel), cuuint32_t(box_rows), cuuint32_t(d / kPanel), 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  CUtensorMap map{};
  const CUresult r = encode_tiled()(
      &map, t == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
      const_cast<void*>(base), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);  // out of bounds: zeros
  if (r != CUDA_SUCCESS)
    throw Error("cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ") for N = " +
                std::to_string(N) + ", d = " + std::to_string(d) + ", " + std::to_string(box_rows) + "-row boxes");
  return map;
}

// ---------------------------------------------------------------------------------
// mbarriers and TMA copies (cuda::ptx).

/// Blocks until the barrier's phase with this parity has completed.
__device__ __forceinline__ void wait(std::uint64_t* bar, std::uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}
/// The same wait, its loop's exit decided for the whole warp at once (a vote): between the
/// issue of wgmma products and the wait for them, a loop that threads may leave one by one
/// makes ptxas serialise every wgmma of the kernel (C7518/C7520, "... in divergent path").
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
/// TMA: shared memory at src into the box of `map` at (row, head); rows past N are dropped
/// by the map's bounds. Completes in a bulk group of the issuing thread.
__device__ __forceinline__ void store_tile(const CUtensorMap* map, const void* src, int row, int head) {
  const std::int32_t at[4] = {0, row, 0, head};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, map, at, src);
}

// ---------------------------------------------------------------------------------
// wgmma (PTX ISA 8.0, sm_90a: "Asynchronous Warpgroup Level Matrix Multiply-Accumulate
// Instructions"). A warpgroup is 4 consecutive warps; warp w of it owns rows 16w..16w+15
// of the m64 product. The fp32 accumulators of m64nNk16 are N/2 registers a thread in the
// mma.sync C layout repeated along N: register 4j + 2h + e holds row g + 8h and column
// 8j + 2t + e (lane = 4g + t).

/// The shared-memory matrix descriptor ("Matrix Descriptor Format"): start address,
/// leading- and stride-dimension byte offsets (all >> 4), swizzle mode 1 = 128 bytes.
/// For the panel layout:
///   K-major operand (the k index runs along a row): SBO = 1024, the step from 8 rows to the
///     next 8; LBO unused; the k-th 16-column step is start + 32·k bytes inside a panel,
///     and the next panel is `rows`·128 bytes further;
///   MN-major operand (the n index runs along a row): SBO = 1024, the step from 8 k-rows to
///     the next 8; LBO = the panel size, the step from 64 n-columns to the next 64; the k-th
///     16-row step is start + 2048·k.
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
/// "wgmma.wait_group N": waits until at most N groups are pending. The accumulators of a
/// pending group must not be touched: the "+f" ties make the compiler keep them where the
/// instruction writes them.
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
/// The same tie for A fragments a pending rs product reads: their registers are not reused
/// before this point.
template <int K>
__device__ __forceinline__ void fence_registers(std::uint32_t (&a)[K][4]) {
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(a[k][r])::"memory");
}

/// D(64×N, fp32) (+)= A(64×16)·B(16×N) for one k step: ss with A and B by descriptor, rs
/// with A from registers. kTransA, kTransB: 0 K-major, 1 MN-major.
template <class T, int N>
struct Wgmma {
  template <int kTransA, int kTransB>
  __device__ static void ss(float (&d)[N / 2], std::uint64_t a, std::uint64_t b, bool accumulate);
  template <int kTransB>
  __device__ static void rs(float (&d)[N / 2], const std::uint32_t (&a)[4], std::uint64_t b, bool accumulate);
};

// The k loops of the kinds of product, issued between the caller's wgmma_fence and
// wgmma_commit (which the kernels write out: the groups are what they wait on).

/// D(64×N) = A·Bᵀ over k = K: A (64 rows) and B (N rows) both K-major in shared memory, a and
/// b their first rows, in 64-column panels of a_rows and b_rows rows: a 16-column k step is
/// 32 bytes into a panel, the next panel after 4 steps.
template <class T, int N, int K>
__device__ __forceinline__ void ss_kk(float (&d)[N / 2], std::uint32_t a, int a_rows, std::uint32_t b, int b_rows) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    const std::uint32_t col = (kk % 4) * 32;
    Wgmma<T, N>::template ss<0, 0>(d, descriptor(a + (kk / 4) * a_rows * 128 + col, 0),
                                   descriptor(b + (kk / 4) * b_rows * 128 + col, 0), kk > 0);
  }
}

/// D(64×N) = A·Bᵀ over k = K: A from registers (K/16 k steps), B (N rows) K-major in shared
/// memory as in ss_kk.
template <class T, int N, int K>
__device__ __forceinline__ void rs_kk(float (&d)[N / 2], const std::uint32_t (&a)[K / 16][4], std::uint32_t b,
                                      int b_rows) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    Wgmma<T, N>::template rs<0>(d, a[kk], descriptor(b + (kk / 4) * b_rows * 128 + (kk % 4) * 32, 0), kk > 0);
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
/// 16-column k step is 32 bytes along its rows), B MN-major as in rs_mn.
template <class T, int N, int K>
__device__ __forceinline__ void ss_kmn(float (&d)[N / 2], std::uint32_t a, std::uint32_t b, std::uint32_t panel) {
  static_assert(K <= kPanel, "A is one panel");
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    Wgmma<T, N>::template ss<0, 1>(d, descriptor(a + kk * 32, 0), descriptor(b + kk * 16 * 128, panel), true);
}

/// D(64×N) = A·B with both MN-major in shared memory (A read transposed: its rows are the k
/// index, its m index runs along a row, as B's n does): a 16-row k step is 2048 bytes in
/// both; a_panel, b_panel their LBOs.
template <class T, int N, int K>
__device__ __forceinline__ void ss_mnmn(float (&d)[N / 2], std::uint32_t a, std::uint32_t a_panel, std::uint32_t b,
                                        std::uint32_t b_panel) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    Wgmma<T, N>::template ss<1, 1>(d, descriptor(a + kk * 16 * 128, a_panel), descriptor(b + kk * 16 * 128, b_panel),
                                   kk > 0);
}

/// D(64×N) = A·B: A MN-major in shared memory as in ss_mnmn (a_panel its LBO), B K-major as
/// in ss_kk (N rows, the k index along a row, 64-column panels b_rows rows apart).
template <class T, int N, int K>
__device__ __forceinline__ void ss_mnk(float (&d)[N / 2], std::uint32_t a, std::uint32_t a_panel, std::uint32_t b,
                                       int b_rows) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    Wgmma<T, N>::template ss<1, 0>(d, descriptor(a + kk * 16 * 128, a_panel),
                                   descriptor(b + (kk / 4) * b_rows * 128 + (kk % 4) * 32, 0), kk > 0);
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

/// Named barriers (PTX ISA "Parallel Synchronization and Communication Instructions: bar,
/// barrier"; cuda::ptx has no bar.sync with a thread count): `sync` waits until `threads`
/// threads arrived at barrier `id` (its own arrival included); `arrive` arrives without
/// waiting. Id 0 is __syncthreads'.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---------------------------------------------------------------------------------
// Persistent grids: a block an SM, taking tile after tile.

/// The next tile no block of a persistent grid has taken yet: the grid's blocks start on
/// tiles 0 … gridDim.x − 1, and the rest are handed out by a counter of tiles taken past
/// those (zeroed before the launch). `tiles` (the end) once none is left, or if the grid
/// has a block for every tile (the counter is not read then).
__device__ __forceinline__ int take_tile(int* taken, int tiles) {
  if (int(gridDim.x) >= tiles) return tiles;
  cuda::atomic_ref<int, cuda::thread_scope_device> counter(*taken);
  return int(gridDim.x) + counter.fetch_add(1, cuda::memory_order_relaxed);
}

/// Which tile a block works on, told by its producer (the one thread that takes tiles) to
/// the rest of the block through two slots of shared memory, tile n of the block in slot
/// n % 2 (a tile past the last: the end). Every thread that reads a slot arrives on its
/// "empty" barrier once it has, and the producer waits for all of them before it writes the
/// slot again (tile n + 2): a reader may run a tile behind the others, and each reading
/// thread's own arrival is what orders its read before the next write (compute-sanitizer's
/// racecheck sees no other path).
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

}  // namespace fa::hopper

#include "common/cuda/wgmma_ops.cuh"
