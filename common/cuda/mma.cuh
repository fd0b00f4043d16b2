// The warp-level building blocks of the mma.sync kernels (steps 06 and 08): the
// mma.sync instruction and its fragments, ldmatrix, cp.async and the step of a
// two-stage cp.async pipeline, the swizzled tile layout, a fast exp2, and the two
// warp-level products built from them. Each is one PTX instruction, an address
// formula or a loop over them; what the kernels compute with them lives in the steps.
//
// mma.sync.m16n8k16 (A 16×16 row-major, B 16×8 column-major, fp32 C 16×8): in the
// fragments, lane = 4g + t holds
//   A: rows g and g+8, columns 2t, 2t+1 and 2t+8, 2t+9   (4 registers of 2 halves)
//   B: rows (k) 2t, 2t+1 and 2t+8, 2t+9, column (n) g     (2 registers)
//   C: rows g and g+8, columns 2t, 2t+1                   (4 floats)
// so a row of a C tile lives in the 4 lanes of a quad, and two C tiles side by
// side (16×16) are, once rounded to 16 bits, exactly one A fragment.
// (PTX ISA: "Warp Level Matrix Multiply-Accumulate Instructions", m16n8k16.)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

// The oldest architecture these instructions assemble on: sm_80 (Ampere), for mma.sync
// on bf16 (m16n8k16) and cp.async. A build that also targets an older GPU (sm_75, a T4)
// compiles the kernel bodies that use them out of that architecture — each sits inside
// `#if FA_MMA_ARCH_OK` — and the host side refuses to launch them on such a GPU with one
// line (GpuForward::min_sm). The host pass and sm_80 on see the whole body.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define FA_MMA_ARCH_OK 1
#else
#define FA_MMA_ARCH_OK 0
// That pass sees the kernels' compile-time fields declared and never used: warning
// 177, an error under FA_WERROR.
#pragma nv_diag_suppress 177
#endif

namespace fa::mma {

/// The one instruction, per element type: D = A·B + D, fp32 accumulators.
template <class T>
struct Mma;
template <>
struct Mma<__nv_bfloat16> {
  __device__ static void run(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  /// Two floats to one register: `lo` in the low half (the lower column index).
  __device__ static std::uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
  /// Two consecutive elements (4-byte aligned) as floats.
  __device__ static float2 load2(const __nv_bfloat16* p) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
  }
};
template <>
struct Mma<__half> {
  __device__ static void run(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static std::uint32_t pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
  __device__ static float2 load2(const __half* p) { return __half22float2(*reinterpret_cast<const __half2*>(p)); }
};

/// Two C tiles side by side (columns 0–7 in c0, 8–15 in c1) as the A fragment of
/// a 16-wide k chunk, rounded to 16 bits: P (or dS) going from one product into the next.
template <class T>
__device__ __forceinline__ void to_a(std::uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = Mma<T>::pack(c0[0], c0[1]);
  a[1] = Mma<T>::pack(c0[2], c0[3]);
  a[2] = Mma<T>::pack(c1[0], c1[1]);
  a[3] = Mma<T>::pack(c1[2], c1[3]);
}

/// A pointer into shared memory as a 32-bit shared-space address: what ldmatrix
/// and cp.async take, and half the registers of a generic 64-bit pointer.
__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

/// One 32-bit store to a shared-space address (as ldmatrix takes): with the address
/// kept as a 32-bit number, moving it is one XOR or an immediate offset.
__device__ __forceinline__ void st_shared(std::uint32_t a, std::uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
}

/// Four 8×8 tiles of 16-bit elements from shared memory: lane l gives the address
/// of row l % 8 of tile l / 8; lane 4g + t receives, in register i, elements
/// (g, 2t) and (g, 2t + 1) of tile i — exactly an mma fragment. kTrans delivers
/// each tile transposed: elements (2t, g) and (2t + 1, g).
template <bool kTrans = false>
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t a) {
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

/// Columns of a shared-memory tile that holds rows of d elements: d rounded up to a
/// multiple of 64, so that every row is whole 128-byte lines and the swizzle below
/// applies. At d = 32 or 96 the columns past d are never copied and never read (the
/// products stop at d): half or a quarter of the tile's bytes unused, no extra work.
__host__ __device__ constexpr int smem_cols(int d) { return (d + 63) / 64 * 64; }

/// A tile of kCols 16-bit elements per row, unpadded, with its 16-byte chunks
/// swizzled: chunk c of row r is stored at chunk c ^ (r % 8). The 8 rows an
/// ldmatrix reads at one logical chunk land in 8 different physical chunks, i.e.
/// in all 32 banks once — no conflicts, and no padding bytes.
template <int kCols>
struct Swizzled {
  static_assert(kCols % 64 == 0, "rows of at least 128 bytes: 8 chunks to permute");
  /// Element offset of (row, col); col is a multiple of 8 (a chunk start) or any
  /// column inside it.
  __device__ __forceinline__ static int at(int row, int col) {
    return row * kCols + ((((col >> 3) ^ row) & 7) | ((col >> 3) & ~7)) * 8 + (col & 7);
  }
  /// Byte offset of (row, col) for 16-bit elements: what ldmatrix adds to a tile's address.
  __device__ __forceinline__ static std::uint32_t bytes(int row, int col) { return 2u * at(row, col); }
};

/// How a cp.async asks the L2 to keep the lines it reads: as any load (no hint), or by
/// a cache eviction policy made by createpolicy (PTX ISA, "Data Movement and Conversion
/// Instructions: createpolicy"; the `.L2::cache_hint` qualifier of cp.async). An
/// evict-first line is the first the L2 gives up when it needs room: for data read once
/// (a K/V cache streamed by a decoding kernel), so that it pushes out neither what will
/// be read again nor lines that would have to be written back first.
struct NoL2Hint {};
struct L2Hint {
  std::uint64_t policy;
};
/// Every line read with it evict-first (the fraction 1.0: all of them). sm_80 and newer.
__device__ __forceinline__ L2Hint l2_evict_first() {
  std::uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return {p};
}
/// One 16-byte cp.async, bypassing L1 (.cg): all 16 bytes, or (`bytes`) that many read
/// and the rest zero-filled.
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, NoL2Hint) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, int bytes, NoL2Hint) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, L2Hint h) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "l"(h.policy));
}
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, int bytes, L2Hint h) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
               "r"(bytes), "l"(h.policy));
}

/// Async copy of a rows×kCols tile from global (rows consecutive, kCols apart) to
/// a swizzled shared tile of smem_cols(kCols) columns, 16 bytes per thread per copy,
/// no registers on the way. Rows at or past `valid` are zero-filled: a source size of
/// 0 bytes reads nothing. A thread copies the same chunk of every kThreads/kChunks-th
/// row (a multiple of 8 rows apart), so its swizzled column is the same each time;
/// the threads of chunks past kCols (d = 32, 96) copy nothing. With kWholeFast,
/// a tile whose rows all exist (all but a head's last) is copied from one pointer
/// plus constant offsets, without the per-row bound and address arithmetic (the
/// price: a second code path, i.e. registers, in a kernel that has none to spare).
/// `hint`: the L2 policy of the reads (NoL2Hint: none).
template <int kThreads, int kCols, int kRowsT, bool kWholeFast = false, class T, class Hint = NoL2Hint>
__device__ __forceinline__ void copy_tile_async(T* dst, const T* __restrict__ src, int valid, Hint hint = {}) {
  constexpr int kW = smem_cols(kCols), kChunks = kW / 8, kStep = kThreads / kChunks;
  static_assert(kStep % 8 == 0 && kRowsT % kStep == 0, "whole passes over the tile, 8-row aligned");
  const int r0 = threadIdx.x / kChunks, c = (threadIdx.x % kChunks) * 8;
  if (kW != kCols && c >= kCols) return;  // the tile's unused columns
  const std::uint32_t d = smem_u32(dst + Swizzled<kW>::at(r0, c));
  if (kWholeFast && valid >= kRowsT) {
    const T* g = src + r0 * kCols + c;
#pragma unroll
    for (int i = 0; i < kRowsT / kStep; ++i) cp_async_16(d + 2 * i * kStep * kW, g + i * kStep * kCols, hint);
    return;
  }
#pragma unroll
  for (int r = r0, i = 0; i < kRowsT / kStep; r += kStep, ++i) {
    const T* g = src + std::size_t(r < valid ? r : 0) * kCols + c;  // a valid address even when not read
    cp_async_16(d + 2 * i * kStep * kW, g, r < valid ? 16 : 0, hint);
  }
}
/// copy_tile_async for a tile whose 16-row runs lie in different places (a paged cache's
/// pages): run j from row runs[j] of src (rows of kCols; 32 bits, half a 64-bit offset's
/// registers); rows at or past `valid` are zeros. A thread's rows are kStep ≤ 16 apart, so
/// which run each of them is in is known here.
template <int kThreads, int kCols, int kRowsT, class T, class Hint = NoL2Hint>
__device__ __forceinline__ void copy_runs_async(T* dst, const T* __restrict__ src,
                                                const std::uint32_t (&runs)[kRowsT / 16], int valid, Hint hint = {}) {
  constexpr int kW = smem_cols(kCols), kChunks = kW / 8, kStep = kThreads / kChunks;
  static_assert(kStep % 8 == 0 && 16 % kStep == 0 && kRowsT % 16 == 0, "a thread's rows, 8 or 16 apart, run by run");
  const int r0 = threadIdx.x / kChunks, c = (threadIdx.x % kChunks) * 8;
  if (kW != kCols && c >= kCols) return;  // the tile's unused columns
  const std::uint32_t d = smem_u32(dst + Swizzled<kW>::at(r0, c));
#pragma unroll
  for (int i = 0; i < kRowsT / kStep; ++i) {
    const int r = r0 + i * kStep, run = i * kStep / 16;
    const T* g = src + (r < valid ? (std::size_t(runs[run]) + r % 16) * kCols : 0) + c;  // valid even when not read
    cp_async_16(d + 2 * i * kStep * kW, g, r < valid ? 16 : 0, hint);
  }
}
/// `n` floats (a multiple of 4, 16-byte aligned at both ends) to shared memory.
template <int kThreads>
__device__ __forceinline__ void copy_floats_async(float* dst, const float* __restrict__ src, int n) {
  for (int e = 4 * threadIdx.x; e < n; e += 4 * kThreads) cp_async_16(smem_u32(dst + e), src + e, NoL2Hint{});
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/// The top of iteration i of a two-stage cp.async pipeline: make block i's tiles
/// visible to the whole thread block, then start the copies of block next = i+1 into
/// the other buffer if next < end (load_next issues them). After the barrier every
/// warp is done with iteration i-1, i.e. with the buffer block i+1 overwrites: one
/// barrier per iteration.
template <class F>
__device__ __forceinline__ void begin_block(int next, int end, F&& load_next) {
  cp_async_wait<0>();  // block i: this thread's copies landed ...
  __syncthreads();     // ... everyone's, and every warp is done with iteration i-1
  if (next < end) {
    load_next();
    cp_async_commit();
  }
}

/// p[0] += a, p[1] += b in device memory (p 8-byte aligned), atomically per element:
/// dQ's accumulation. sm_90 has a vector atomic for float2 (one RED.E.ADD.F32x2 of 8
/// bytes); before Hopper, as on the A100 or an RTX 4090, it is two scalar REDs.
__device__ __forceinline__ void atomic_add2(float* p, float a, float b) {
#if __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(a, b));
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

/// 2^x on the special-function unit (one MUFU.EX2; 2^−∞ = 0). With the softmax
/// scale folded into log2(e)·scale, exp(scale·s − m) becomes one FFMA and this.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Addressing in the two products below. Every ldmatrix row a lane addresses is
// (a multiple of 8) + (its own row in an 8×8 tile), so row % 8 — the swizzle key —
// is fixed per lane, and moving a fragment by 16 columns (k) or 8 columns (n)
// flips chunk bits that the key's XOR does not carry into: the address of chunk
// c0 + 2·kk is (address of chunk c0) XOR 32·kk bytes. One LOP per k step; moving
// by rows is an immediate offset. This needs tiles that start at a multiple of
// their row size (2·smem_cols(d) bytes) and first rows a0, b0 that are multiples of 8.

/// The XOR addressing above assumes dynamic shared memory starts 1024-byte
/// aligned (it does on every GPU we know; this makes "every" a checked claim).
__device__ __forceinline__ void require_aligned_smem(const void* base) {
  if (smem_u32(base) % 1024 != 0) __trap();
}

/// One k step of A·Bᵀ for a warp: acc[mt][nt] += (16 columns of A's rows 16·mt..)·(the
/// same 16 columns of B's kNT·8 rows)ᵀ, A's fragments af[mt] in registers, B's read by
/// ldmatrix at this lane's address b of the step (rows 8 apart: row_bytes each).
template <class T, int kMT, int kNT>
__device__ __forceinline__ void mma_abt_step(float (&acc)[kMT][kNT][4], const std::uint32_t (&af)[kMT][4],
                                             std::uint32_t b, std::uint32_t row_bytes) {
#pragma unroll
  for (int nt = 0; nt < kNT; nt += 2) {
    std::uint32_t bf[4];
    ldmatrix_x4(bf, b + 8 * row_bytes * nt);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      Mma<T>::run(acc[mt][nt], af[mt], bf[0], bf[1]);
      Mma<T>::run(acc[mt][nt + 1], af[mt], bf[2], bf[3]);
    }
  }
}

/// Lane `lane`'s ldmatrix address of an A fragment (tiles (rows +0, cols +0), (+8, +0),
/// (+0, +8), (+8, +8)) at k step 0, and of two B fragments (n-tiles nt, nt+1: tiles
/// (rows +0, cols +0), (+0, +8), (+8, +0), (+8, +8)), in a swizzled tile of smem_cols(kD)
/// columns from row a0 (b0); the k-th step is the address XOR 32·k (above).
template <int kD>
__device__ __forceinline__ std::uint32_t a_fragment_at(std::uint32_t A, int a0, int lane) {
  return A + Swizzled<smem_cols(kD)>::bytes(a0 + lane % 8 + 8 * ((lane / 8) % 2), 8 * (lane / 16));
}
template <int kD>
__device__ __forceinline__ std::uint32_t b_fragments_at(std::uint32_t B, int b0, int lane) {
  return B + Swizzled<smem_cols(kD)>::bytes(b0 + lane % 8 + 8 * (lane / 16), 8 * ((lane / 8) % 2));
}

/// acc[mt][nt] += A·Bᵀ over kD columns, for a warp: A is kMT·16 rows of a swizzled
/// shared tile (shared address A) starting at row a0, B is kNT·8 rows starting at
/// row b0 (both rows of d = kD elements in tiles of smem_cols(kD) columns, both
/// row-major: B's rows are the product's columns).
/// This is S = Q·Kᵀ in the forward, and Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ in the backward.
template <class T, int kD, int kMT, int kNT>
__device__ __forceinline__ void gemm_abt(float (&acc)[kMT][kNT][4], std::uint32_t A, int a0, std::uint32_t B,
                                         int b0) {
  static_assert(kD % 16 == 0, "whole k steps of 16");
  constexpr std::uint32_t kRow = 2 * smem_cols(kD);  // bytes per row
  const int lane = threadIdx.x % 32;
  const std::uint32_t a = a_fragment_at<kD>(A, a0, lane), b = b_fragments_at<kD>(B, b0, lane);
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    std::uint32_t af[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) ldmatrix_x4(af[mt], (a ^ (32u * kk)) + 16 * kRow * mt);
    mma_abt_step<T>(acc, af, b ^ (32u * kk), kRow);
  }
}

/// A's fragments for gemm_abt_regs: kMT·16 rows of a swizzled shared tile from row a0,
/// all kD columns (a[kk][mt]: k step kk, rows 16·mt..), as lane `lane` holds them, read
/// once where A stays the same for many products (Q in a decoding kernel).
template <int kD, int kMT>
__device__ __forceinline__ void load_a_fragments(std::uint32_t (&a)[kD / 16][kMT][4], std::uint32_t A, int a0, int lane) {
  constexpr std::uint32_t kRow = 2 * smem_cols(kD);
  const std::uint32_t at = a_fragment_at<kD>(A, a0, lane);
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk)
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) ldmatrix_x4(a[kk][mt], (at ^ (32u * kk)) + 16 * kRow * mt);
}

/// gemm_abt with A's fragments in registers (load_a_fragments) and B's at this lane's
/// address b_at(kk) of k step kk (its 8-row steps row_bytes apart), for a warp whose
/// product is small (a decoding tile: 16 rows × 16 keys, two n-tiles): the k steps go to
/// two accumulator chains, the even ones into acc and the odd ones into acc2, added at the
/// end. An mma waits for the one before it into the same accumulator: in one chain that
/// is kD/16 mma in a row per n-tile, and with two n-tiles there is little else to issue
/// meanwhile; two chains halve the wait. (The sum's order is not gemm_abt's: these
/// products agree with it to fp32 rounding, not bit for bit.) b_at lets a caller read B
/// in another layout (step 08's TMA ring: 64-column panels).
template <class T, int kD, int kMT, int kNT, class BAt>
__device__ __forceinline__ void gemm_abt_regs_at(float (&acc)[kMT][kNT][4], const std::uint32_t (&a)[kD / 16][kMT][4],
                                                 BAt b_at, std::uint32_t row_bytes) {
  static_assert(kD % 32 == 0, "k steps in pairs");
  float acc2[kMT][kNT][4] = {};  // [m-tile][n-tile][register]: the odd k steps
#pragma unroll
  for (int kk = 0; kk < kD / 16; kk += 2) {
    mma_abt_step<T>(acc, a[kk], b_at(kk), row_bytes);
    mma_abt_step<T>(acc2, a[kk + 1], b_at(kk + 1), row_bytes);
  }
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int x = 0; x < 4; ++x) acc[mt][nt][x] += acc2[mt][nt][x];
}
/// The same with B a swizzled tile of smem_cols(kD) columns, at this lane's address b
/// (b_fragments_at, taken once outside a loop): the k-th step is b XOR 32·k.
template <class T, int kD, int kMT, int kNT>
__device__ __forceinline__ void gemm_abt_regs(float (&acc)[kMT][kNT][4], const std::uint32_t (&a)[kD / 16][kMT][4],
                                              std::uint32_t b) {
  gemm_abt_regs_at<T, kD, kMT, kNT>(acc, a, [b](int kk) { return b ^ (32u * kk); }, 2 * smem_cols(kD));
}

/// gemm_pv's loop: acc[mt][dt] += P·V with P in registers (pa[mt][c]: rows 16·mt.., k
/// chunk c of 16) and this lane's ldmatrix address of V's k chunk c and n-tiles dt, dt+1
/// given by v_at(c, dt), V read transposed.
template <class T, int kMT, int kK, int kN, class VAt>
__device__ __forceinline__ void gemm_pv_at(float (&acc)[kMT][kN / 8][4], const std::uint32_t (&pa)[kMT][kK / 16][4],
                                           VAt v_at) {
  static_assert(kN % 16 == 0, "pairs of n-tiles");
#pragma unroll
  for (int c = 0; c < kK / 16; ++c)
#pragma unroll
    for (int dt = 0; dt < kN / 8; dt += 2) {
      std::uint32_t bf[4];
      ldmatrix_x4<true>(bf, v_at(c, dt));
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        Mma<T>::run(acc[mt][dt], pa[mt][c], bf[0], bf[1]);
        Mma<T>::run(acc[mt][dt + 1], pa[mt][c], bf[2], bf[3]);
      }
    }
}

/// acc[mt][dt] += P·V for a warp, with P already in registers as A fragments
/// (pa[mt][c]: rows 16·mt.., k chunk c of 16) and V a swizzled shared tile of kK
/// rows × kD columns (shared address V; smem_cols(kD) columns stored), read
/// transposed by ldmatrix: columns [n0, n0 + kN) of the product, n0 a multiple of
/// kN. This is O += P·V in the forward, and dV += Pᵀ·dO, dK += dSᵀ·Q, dQ += dS·K in
/// the backward.
template <class T, int kD, int kMT, int kK, int kN = kD>
__device__ __forceinline__ void gemm_pv(float (&acc)[kMT][kN / 8][4], const std::uint32_t (&pa)[kMT][kK / 16][4],
                                        std::uint32_t V, int n0 = 0) {
  using L = Swizzled<smem_cols(kD)>;
  constexpr std::uint32_t kRow = 2 * smem_cols(kD);
  constexpr bool kXor = kN == kD || (kN & (kN - 1)) == 0;  // see below
  const int lane = threadIdx.x % 32;
  // Tiles (rows +0, cols +0), (+8, +0), (+0, +8), (+8, +8): B fragments of n-tiles dt, dt+1.
  // Column n0 + 8·dt is chunk n0/8 + dt; when kN is a power of two, n0/8 and dt < kN/8
  // have no bit in common and one XOR moves the address. Otherwise (a 48-column slice
  // at d = 96) each pair's address comes from the layout, once, before the loop.
  const int r = lane % 8 + 8 * ((lane / 8) % 2), c8 = 8 * (lane / 16);
  if constexpr (kXor) {
    std::uint32_t v = V + L::bytes(r, c8);
    if constexpr (kN < kD) v ^= 2u * n0;
    gemm_pv_at<T, kMT, kK, kN>(acc, pa, [v](int c, int dt) { return (v ^ (16u * dt)) + 16 * kRow * c; });
  } else {
    std::uint32_t vd[kN / 16];
#pragma unroll
    for (int dt = 0; dt < kN / 8; dt += 2) vd[dt / 2] = V + L::bytes(r, n0 + 8 * dt + c8);
    gemm_pv_at<T, kMT, kK, kN>(acc, pa, [&vd](int c, int dt) { return vd[dt / 2] + 16 * kRow * c; });
  }
}

}  // namespace fa::mma
