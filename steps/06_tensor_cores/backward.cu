// Step 06 backward kernels: step 05's recomputation on tensor cores, in
// FlashAttention-2's loop order.
//
// 1. preprocess: D = rowsum(dO∘O) in fp32, and L·log2(e), both padded per head to a
//    multiple of 64 rows so that a block's slice is one aligned cp.async run.
// 2. dK/dV: a thread block owns K/V block j (16·kMT keys per warp: warp w owns its
//    keys' dK_j and dV_j in registers for the whole pass) and walks the query blocks
//    i (64 queries each; causal: from the diagonal on). Per i, with Q_i, dO_i, L_i,
//    D_i arriving by cp.async into the other of two buffers:
//      Sᵀ  = K_j·Q_iᵀ                 (the warp's keys × 64 queries, or two halves of 32)
//      Pᵀ  = 2^(Sᵀ·scale·log2 e − L_i·log2 e)
//      dPᵀ = V_j·dO_iᵀ
//      dSᵀ = Pᵀ∘(dPᵀ − D_i)
//      dV_j += Pᵀ·dO_i,  dK_j += dSᵀ·Q_i          (Pᵀ, dSᵀ rounded to 16 bits)
//      dQ_i += dS·K_j: dSᵀ goes through shared memory (a warp holds some keys, a row
//                      of dQ needs all of the block's), and each warp adds 16 queries × d
//                      (8 warps: × d/2) into an fp32 accumulator in device memory with
//                      vector atomics.
//    Every product is the forward's: gemm_abt (A·Bᵀ, both row-major in shared
//    memory) or gemm_pv (A from registers, B read transposed by ldmatrix).
//    dkdv_shared_kernel (d = 128) computes the same in FlashAttention-2's warp
//    layouts, with Pᵀ as well as dSᵀ through shared memory.
// 3. convert: dQ = scale·accumulator, rounded to 16 bits.
// The versions of the note's backward table (b1 … b13) are the template arguments
// listed at the end of this file; b13 is the production kernel.
// The atomics make dQ's last bits depend on the order blocks finish (FlashAttention-2
// does the same; step 05 shows the deterministic alternative, a separate dQ pass).
#include <cstdint>

#include "common/cuda_check.cuh"
#include "steps/02_fused/tile.hpp"
#include "steps/06_tensor_cores/mma.cuh"
#include "steps/06_tensor_cores/step06.hpp"

namespace fa::step06 {
namespace {

constexpr int kQ = kBwdQueries;  // queries per step of the inner loop

/// Rows per head in the padded L·log2(e) and D arrays.
int padded_rows(int N) { return tiles::q_blocks(N, kQ) * kQ; }

/// One warp per row (of B·H·Np): D = Σ_c dO·O in fp32; rows past N get 0.
template <class T, int kD>
__global__ void preprocess_kernel(int N, int Np, int rows, const T* __restrict__ o, const T* __restrict__ dout,
                                  const float* __restrict__ lse, float* __restrict__ l2, float* __restrict__ dsum) {
#if FA_STEP06_ARCH_OK  // compiled out before sm_80 (mma.cuh)
  const int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (r >= rows) return;
  const int bh = r / Np, n = r % Np;
  float acc = 0.0f;
  if (n < N) {
    const std::size_t base = (std::size_t(bh) * N + n) * kD;
    for (int c = 2 * lane; c < kD; c += 64) {
      const float2 x = Mma<T>::load2(o + base + c), y = Mma<T>::load2(dout + base + c);
      acc += x.x * y.x + x.y * y.y;
    }
  }
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) {
    dsum[r] = acc;
    l2[r] = n < N ? lse[std::size_t(bh) * N + n] * kLog2e : 0.0f;
  }
#endif
}

/// The query side of a dK/dV kernel's shared memory: two buffers each of Q_i and
/// dO_i (kQ × kD in kQ × smem_cols(kD) tiles, swizzled), L_i·log2 e and D_i (kQ floats).
template <class T, int kD>
struct QueryTiles {
  T *Qs, *dOs;
  float *L, *D;
  /// Query block i into buffer `buf`, by cp.async (not committed); kWholeFast as copy_tile_async's.
  template <int kThreads, bool kWholeFast = false>
  __device__ __forceinline__ void load(int i, int buf, int N, std::size_t head, std::size_t stat,
                                       const T* __restrict__ q, const T* __restrict__ dout,
                                       const float* __restrict__ l2, const float* __restrict__ dsum) const {
    const int q0 = i * kQ;
    constexpr int kW = smem_cols(kD);
    copy_tile_async<kThreads, kD, kQ, kWholeFast>(Qs + buf * kQ * kW, q + head + std::size_t(q0) * kD, N - q0);
    copy_tile_async<kThreads, kD, kQ, kWholeFast>(dOs + buf * kQ * kW, dout + head + std::size_t(q0) * kD, N - q0);
    copy_floats_async<kThreads>(L + buf * kQ, l2 + stat + q0, kQ);
    copy_floats_async<kThreads>(D + buf * kQ, dsum + stat + q0, kQ);
  }
};

/// dK = scale·acc_k and dV = acc_v in 16 bits: kMT 16-row tiles of a warp from key
/// row0 on, kNT 8-column tiles from column col0 on; keys past N are not written.
template <class T, int kD, int kMT, int kNT>
__device__ __forceinline__ void store_dkdv(T* __restrict__ dk, T* __restrict__ dv, const float (&acc_k)[kMT][kNT][4],
                                           const float (&acc_v)[kMT][kNT][4], float scale, std::size_t head,
                                           int row0, int col0, int N) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 16 * mt + g + 8 * h;
      if (row >= N) continue;
#pragma unroll
      for (int dt = 0; dt < kNT; ++dt) {
        const std::size_t at = head + std::size_t(row) * kD + col0 + 8 * dt + 2 * t;
        *reinterpret_cast<std::uint32_t*>(dk + at) =
            Mma<T>::pack(scale * acc_k[mt][dt][2 * h], scale * acc_k[mt][dt][2 * h + 1]);
        *reinterpret_cast<std::uint32_t*>(dv + at) = Mma<T>::pack(acc_v[mt][dt][2 * h], acc_v[mt][dt][2 * h + 1]);
      }
    }
}

/// One version of the dK/dV kernel, as compile-time choices.
template <int kWarps_, int kMT_, bool kHeavyFirst_, bool kStagger_ = false, bool kMaskBranch_ = false,
          bool kShared_ = false, bool kLateLoad_ = false, bool kAddrOnce_ = false, bool kDqBeforeDk_ = false,
          bool kJoinProducts_ = false, int kKeyWarps_ = 4>
struct Bwd {
  static constexpr int kWarps = kWarps_;  ///< warps per block
  /// 16-key mma tiles per warp: a warp owns 16·kMT keys (a block: kKeys, below).
  /// With kMT = 2 each Qᵀ/dOᵀ fragment read from shared memory feeds two mma (as the
  /// forward's 32 rows per warp), and a query block is taken in two halves of 32
  /// so that the scores of both tiles fit in registers beside dK and dV.
  static constexpr int kMT = kMT_;
  /// The grid is (heads, key blocks), so that with the causal mask the key blocks
  /// with the most query blocks to visit (j = 0 first) start first, in every head.
  static constexpr bool kHeavyFirst = kHeavyFirst_;
  /// Without the mask, key block j walks the query blocks from block j mod T_r on,
  /// wrapping around, so the blocks running at once add into different rows of dQ.
  static constexpr bool kStagger = kStagger_;
  /// The mask's comparisons behind a warp-uniform branch (as forward v12), not
  /// predicated on every block.
  static constexpr bool kMaskBranch = kMaskBranch_;
  /// FlashAttention-2's division of the work instead (dkdv_shared_kernel): 8 warps,
  /// Pᵀ and dSᵀ through shared memory, each product with its own warp layout.
  static constexpr bool kShared = kShared_;
  /// The next query block's copies are issued after the barrier
  /// that opens an iteration instead of before it: every warp has then finished the
  /// previous iteration, so the barrier that closed each iteration goes.
  static constexpr bool kLateLoad = kLateLoad_;
  /// The thread's shared-memory addresses of Pᵀ and dSᵀ (stores, ldmatrix) and its
  /// dQ pointer computed once before the loop; inside it they move by XORs with
  /// constants and immediate offsets (mma.cuh, "Addressing"), instead of the swizzle
  /// formula per access: the loop's integer instructions, read in the SASS.
  static constexpr bool kAddrOnce = kAddrOnce_;
  /// dQ (and its atomics) between dV and dK, as FlashAttention-2 orders them: the
  /// atomics then drain while the dK product runs, not at the iteration's end.
  static constexpr bool kDqBeforeDk = kDqBeforeDk_;
  /// Sᵀ and dPᵀ computed back to back, before Sᵀ's exponentials and the mask's branch:
  /// the two independent products in one basic block, which ptxas may interleave (with
  /// the branch between them it schedules each alone).
  static constexpr bool kJoinProducts = kJoinProducts_;
  /// The shared layout's warps along the keys in the Sᵀ/dPᵀ and dK/dV products: 4 × 2
  /// (d = 128), or 2 × 4 (d = 256: 64 keys, so that dK and dV, 32 keys × d/4 columns
  /// per warp, are the same 128 registers a thread).
  static constexpr int kKeyWarps = kKeyWarps_;
  /// Keys per block: the warps side by side along the keys (kKeyWarps of the 8 when shared).
  static constexpr int kKeys = 16 * kMT * (kShared ? kKeyWarps : kWarps);
};

template <class T, int kD, class B>
__global__ void __launch_bounds__(32 * B::kWarps)
    dkdv_kernel(int N, int Np, bool causal, float scale, const T* __restrict__ q, const T* __restrict__ k,
                const T* __restrict__ v, const T* __restrict__ dout, const float* __restrict__ l2,
                const float* __restrict__ dsum, float* __restrict__ dq_acc, T* __restrict__ dk, T* __restrict__ dv) {
#if FA_STEP06_ARCH_OK  // compiled out before sm_80 (mma.cuh)
  static_assert(!B::kShared && !B::kAddrOnce && !B::kDqBeforeDk && !B::kJoinProducts,
                "the shared layout, and what b11-b13 change in it, are dkdv_shared_kernel's");
  constexpr int kWarps = B::kWarps, kMT = B::kMT, kK = B::kKeys, kThreads = 32 * kWarps;
  constexpr int kH = kMT == 1 ? kQ : kQ / 2;  // queries per pass over the scores
  constexpr int kW = smem_cols(kD);  // a shared tile's columns
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* Ks = reinterpret_cast<T*>(smem_raw);  // [kK][kW], swizzled
  T* Vs = Ks + kK * kW;                    // [kK][kW]
  T* Qs = Vs + kK * kW;                    // [2][kQ][kW]: two buffers
  T* dOs = Qs + 2 * kQ * kW;               // [2][kQ][kW]
  T* dSs = dOs + 2 * kQ * kW;              // [kK][kQ]: dSᵀ, swizzled
  float* Lsm = reinterpret_cast<float*>(dSs + kK * kQ);  // [2][kQ]: L·log2 e
  float* Dsm = Lsm + 2 * kQ;                             // [2][kQ]: D

  require_aligned_smem(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int j = B::kHeavyFirst ? blockIdx.y : blockIdx.x, bh = B::kHeavyFirst ? blockIdx.x : blockIdx.y;
  const int k0 = j * kK, w0 = 16 * kMT * warp;  // this warp's first key in the block
  const std::size_t head = std::size_t(bh) * N * kD, stat = std::size_t(bh) * Np;
  const float mul = scale * kLog2e;
  const int first = tiles::first_q_block(causal, j, kQ, kK), blocks = tiles::q_blocks(N, kQ);
  const int rot = B::kStagger && !causal ? j % blocks : 0;  // the it-th query block is first + it + rot, mod T_r
  auto q_block = [&](int it) {
    if constexpr (!B::kStagger) return first + it;
    return first + it + rot < blocks ? first + it + rot : first + it + rot - blocks;
  };

  const QueryTiles<T, kD> qt{Qs, dOs, Lsm, Dsm};
  copy_tile_async<kThreads, kD, kK>(Ks, k + head + std::size_t(k0) * kD, N - k0);
  copy_tile_async<kThreads, kD, kK>(Vs, v + head + std::size_t(k0) * kD, N - k0);
  qt.template load<kThreads>(q_block(0), 0, N, head, stat, q, dout, l2, dsum);
  cp_async_commit();

  float dk_acc[kMT][kD / 8][4] = {}, dv_acc[kMT][kD / 8][4] = {};  // rows g, g+8 of the warp's key tiles
  for (int it = 0; it < blocks - first; ++it) {
    const int q0 = q_block(it) * kQ, buf = it % 2;
    begin_block<B::kLateLoad>(it + 1, blocks - first, [&] { qt.template load<kThreads>(q_block(it + 1), 1 - buf, N, head, stat, q, dout, l2, dsum); });
    const T *Qb = Qs + buf * kQ * kW, *dOb = dOs + buf * kQ * kW;
    const float *Lb = Lsm + buf * kQ, *Db = Dsm + buf * kQ;
    const bool mask = k0 + kK > N || q0 + kQ > N || (causal && k0 + w0 + 16 * kMT - 1 > q0);

#pragma unroll
    for (int c0 = 0; c0 < kQ; c0 += kH) {  // queries c0 .. c0 + kH − 1 of the block
      // Pᵀ: Sᵀ = K_j·Q_iᵀ, then exp2 against the saved L — no max, no sum: L already has them.
      float pt[kMT][kH / 8][4] = {};
      gemm_abt<T, kD, kMT, kH / 8>(pt, smem_u32(Ks), w0, smem_u32(Qb), c0);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kH / 8; ++nt)
#pragma unroll
          for (int x = 0; x < 4; ++x) {  // x = 2h + e: key row g + 8h, query column 8nt + 2t + e
            const int key = k0 + w0 + 16 * mt + g + 8 * (x / 2), col = c0 + 8 * nt + 2 * t + x % 2,
                      query = q0 + col;
            float& p = pt[mt][nt][x];
            p = exp2_approx(fmaf(p, mul, -Lb[col]));
            if (!B::kMaskBranch && mask && (key >= N || query >= N || (causal && key > query))) p = 0.0f;
          }
      if (B::kMaskBranch && mask) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int nt = 0; nt < kH / 8; ++nt)
#pragma unroll
            for (int x = 0; x < 4; ++x) {
              const int key = k0 + w0 + 16 * mt + g + 8 * (x / 2), query = q0 + c0 + 8 * nt + 2 * t + x % 2;
              if (key >= N || query >= N || (causal && key > query)) pt[mt][nt][x] = 0.0f;
            }
      }

      // dV_j += Pᵀ·dO_i, Pᵀ rounded to 16 bits (done first: its fragments die before dPᵀ lives).
      {
        std::uint32_t pa[kMT][kH / 16][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int c = 0; c < kH / 16; ++c) to_a<T>(pa[mt][c], pt[mt][2 * c], pt[mt][2 * c + 1]);
        gemm_pv<T, kD, kMT, kH>(dv_acc, pa, smem_u32(dOb + c0 * kW));
      }

      // dPᵀ = V_j·dO_iᵀ, then dSᵀ = Pᵀ∘(dPᵀ − D_i), in place; dK_j += dSᵀ·Q_i, dSᵀ in 16 bits.
      float ds[kMT][kH / 8][4] = {};
      gemm_abt<T, kD, kMT, kH / 8>(ds, smem_u32(Vs), w0, smem_u32(dOb), c0);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kH / 8; ++nt)
#pragma unroll
          for (int x = 0; x < 4; ++x)
            ds[mt][nt][x] = pt[mt][nt][x] * (ds[mt][nt][x] - Db[c0 + 8 * nt + 2 * t + x % 2]);
      std::uint32_t sa[kMT][kH / 16][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int c = 0; c < kH / 16; ++c) to_a<T>(sa[mt][c], ds[mt][2 * c], ds[mt][2 * c + 1]);
      gemm_pv<T, kD, kMT, kH>(dk_acc, sa, smem_u32(Qb + c0 * kW));

      // dSᵀ to shared memory: register c of sa[mt] holds keys 16mt + g (+8), queries c0 + 16c + 2t (+8).
      using LS = Swizzled<kQ>;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int c = 0; c < kH / 16; ++c) {
          const int r = w0 + 16 * mt + g, col = c0 + 16 * c + 2 * t;
          *reinterpret_cast<std::uint32_t*>(dSs + LS::at(r, col)) = sa[mt][c][0];
          *reinterpret_cast<std::uint32_t*>(dSs + LS::at(r + 8, col)) = sa[mt][c][1];
          *reinterpret_cast<std::uint32_t*>(dSs + LS::at(r, col + 8)) = sa[mt][c][2];
          *reinterpret_cast<std::uint32_t*>(dSs + LS::at(r + 8, col + 8)) = sa[mt][c][3];
        }
    }
    __syncthreads();

    // dQ_i += dS·K_j: warp w takes queries 16·(w % 4).. and, with 8 warps, half of the
    // columns. dS's A fragments are dSᵀ read transposed — tiles (keys +0, queries +0),
    // (+0, +8), (+8, +0), (+8, +8).
    using LS = Swizzled<kQ>;
    constexpr int kSplit = kWarps / (kQ / 16), kN = kD / kSplit;  // column slices per query group
    const int qr = 16 * (warp % (kQ / 16)), n0 = kN * (warp / (kQ / 16));
    std::uint32_t qa[1][kK / 16][4];
#pragma unroll
    for (int c = 0; c < kK / 16; ++c)
      ldmatrix_x4<true>(qa[0][c], smem_u32(dSs) + LS::bytes(16 * c + lane % 8 + 8 * (lane / 16), qr + 8 * ((lane / 8) % 2)));
    float dq[1][kN / 8][4] = {};
    gemm_pv<T, kD, 1, kK, kN>(dq, qa, smem_u32(Ks), n0);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = q0 + qr + g + 8 * h;
      if (row >= N) continue;
      float* dst = dq_acc + head + std::size_t(row) * kD + n0 + 2 * t;
#pragma unroll
      for (int dt = 0; dt < kN / 8; ++dt) {
        atomic_add2(dst + 8 * dt, dq[0][dt][2 * h], dq[0][dt][2 * h + 1]);
      }
    }
    end_block<B::kLateLoad>();  // dSs and buffer `buf` are free for the next iteration
  }
  store_dkdv<T, kD>(dk, dv, dk_acc, dv_acc, scale, head, k0 + w0, 0, N);  // dK = scale·Σ dSᵀ·Q
#endif
}

/// The dK/dV kernel with FlashAttention-2's division of the work: 8 warps, 128 keys,
/// and each product in the warp layout that reads the least shared memory for it,
/// so that Pᵀ and dSᵀ go through shared memory between them:
///   Sᵀ, dPᵀ (128 keys × 64 queries, over d): warps 4 (keys) × 2 (queries), 32 × 32 each
///     (b13: the two products back to back, before Sᵀ's exponentials and the mask)
///   dV += Pᵀ·dO, dK += dSᵀ·Q (128 keys × d, over 64 queries): 4 (keys) × 2 (d)
///   dQ += dS·K (64 queries × d, over 128 keys): 2 (queries) × 4 (d)
/// At d = 256 (kKeyWarps = 2) the block has 64 keys: Sᵀ, dPᵀ in 2 × 4 warps of 32 keys
/// × 16 queries, dV, dK in 2 × 4 of 32 keys × d/4, dQ as above. At d = 96 dQ is 4 × 2
/// warps of 16 queries × 48 columns.
/// Every fragment read from shared memory feeds two mma (two 16-row tiles per warp);
/// in dkdv_kernel the warp owns 16 keys, and Qᵀ/dOᵀ fragments feed one each.
template <class T, int kD, class B>
__global__ void __launch_bounds__(256)
    dkdv_shared_kernel(int N, int Np, bool causal, float scale, const T* __restrict__ q, const T* __restrict__ k,
                       const T* __restrict__ v, const T* __restrict__ dout, const float* __restrict__ l2,
                       const float* __restrict__ dsum, float* __restrict__ dq_acc, T* __restrict__ dk,
                       T* __restrict__ dv) {
#if FA_STEP06_ARCH_OK  // compiled out before sm_80 (mma.cuh)
  static_assert(B::kWarps == 8 && B::kMT == 2 && B::kShared && B::kMaskBranch && !B::kStagger &&
                    (B::kKeyWarps == 4 || B::kKeyWarps == 2),
                "the 4 × 2 (or 2 × 4) and 2 × 4 warp layouts of 32-row tiles, the mask behind a branch");
  constexpr int kK = B::kKeys, kThreads = 256, kW = smem_cols(kD);
  constexpr int kKW = B::kKeyWarps, kOW = 8 / kKW;  // warps along the keys × along queries (Sᵀ) or d (dK, dV)
  constexpr int kSN = kQ / kOW / 8, kDN = kD / kOW;  // a warp's 8-query tiles of Sᵀ; its columns of dK, dV
  // dQ: 2 (queries) × 4 (d/4 columns) warps of two 16-query tiles; at d = 96, where d/4
  // is not a pair of 8-column tiles, 4 × 2 warps of one tile (16 queries × 48 columns).
  constexpr int kQMT = (kD / 4) % 16 == 0 ? 2 : 1, kQQW = kQ / (16 * kQMT), kQN = kD / (8 / kQQW);
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* Ks = reinterpret_cast<T*>(smem_raw);  // [kK][kW], swizzled
  T* Vs = Ks + kK * kW;                    // [kK][kW]
  T* Qs = Vs + kK * kW;                    // [2][kQ][kW]: two buffers
  T* dOs = Qs + 2 * kQ * kW;               // [2][kQ][kW]
  T* Pts = dOs + 2 * kQ * kW;              // [kK][kQ]: Pᵀ, swizzled
  T* dSs = Pts + kK * kQ;                  // [kK][kQ]: dSᵀ, swizzled
  float* Lsm = reinterpret_cast<float*>(dSs + kK * kQ);  // [2][kQ]: L·log2 e
  float* Dsm = Lsm + 2 * kQ;                             // [2][kQ]: D
  using LS = Swizzled<kQ>;

  require_aligned_smem(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int j = B::kHeavyFirst ? blockIdx.y : blockIdx.x, bh = B::kHeavyFirst ? blockIdx.x : blockIdx.y;
  const int k0 = j * kK;
  const int kw = 32 * (warp % kKW);         // this warp's first key (Sᵀ, dPᵀ, dK, dV)
  const int qw = 8 * kSN * (warp / kKW);    // its first query column of Sᵀ, dPᵀ
  const int nw = kDN * (warp / kKW);        // its first column of dK, dV
  const int qd = 16 * kQMT * (warp % kQQW), nd = kQN * (warp / kQQW);  // its first query and column of dQ
  const std::size_t head = std::size_t(bh) * N * kD, stat = std::size_t(bh) * Np;
  const float mul = scale * kLog2e;
  const int first = tiles::first_q_block(causal, j, kQ, kK), blocks = tiles::q_blocks(N, kQ);

  // kAddrOnce: the addresses below, each the first of a family that the loop reaches
  // by XOR (16 or 32 bytes: chunk bits the swizzle key does not touch) and by adding
  // whole rows (kRowQ bytes: the key, row % 8, stays the same).
  constexpr std::uint32_t kRowQ = 2 * kQ, kDsT = 2 * kK * kQ;  // bytes: a row of Pᵀ; dSs − Pts
  const std::uint32_t st0 = smem_u32(Pts) + LS::bytes(kw + g, qw + 2 * t);  // Pᵀ(kw + g, qw + 2t)
  const std::uint32_t la0 = smem_u32(Pts) + LS::bytes(kw + lane % 8 + 8 * ((lane / 8) % 2), 8 * (lane / 16));
  const std::uint32_t lq0 = smem_u32(dSs) + LS::bytes(lane % 8 + 8 * (lane / 16), qd + 8 * ((lane / 8) % 2));
  float* const dq0 = dq_acc + head + std::size_t(qd + g) * kD + nd + 2 * t;  // query qd + g, block 0

  const QueryTiles<T, kD> qt{Qs, dOs, Lsm, Dsm};
  copy_tile_async<kThreads, kD, kK>(Ks, k + head + std::size_t(k0) * kD, N - k0);
  copy_tile_async<kThreads, kD, kK>(Vs, v + head + std::size_t(k0) * kD, N - k0);
  qt.template load<kThreads>(first, 0, N, head, stat, q, dout, l2, dsum);
  cp_async_commit();

  float dk_acc[2][kDN / 8][4] = {}, dv_acc[2][kDN / 8][4] = {};  // keys kw + 16mt + g (+8), columns nw..
  for (int i = first; i < blocks; ++i) {
    const int q0 = i * kQ, buf = (i - first) % 2;
    // begin_block's step (mma.cuh) spelled out: this is the code measured on the GPU;
    // through the helper nvcc schedules two index computations differently.
    if constexpr (B::kLateLoad) {
      cp_async_wait<0>();  // block i landed (this thread's copies) ...
      __syncthreads();     // ... everyone's, and every warp is done with iteration i-1
      if (i + 1 < blocks) {
        qt.template load<kThreads, B::kAddrOnce>(i + 1, 1 - buf, N, head, stat, q, dout, l2, dsum);
        cp_async_commit();
      }
    } else {
      if (i + 1 < blocks) {  // the other buffer is free since the barrier ending iteration i-1
        qt.template load<kThreads>(i + 1, 1 - buf, N, head, stat, q, dout, l2, dsum);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
    }
    const T *Qb = Qs + buf * kQ * kW, *dOb = dOs + buf * kQ * kW;
    const float *Lb = Lsm + buf * kQ, *Db = Dsm + buf * kQ;

    // Pᵀ and dSᵀ for the warp's 32 keys × 32 (16) queries, into shared memory in 16 bits.
    {
      float pt[2][kSN][4] = {}, ds[2][kSN][4] = {};
      gemm_abt<T, kD, 2, kSN>(pt, smem_u32(Ks), kw, smem_u32(Qb), qw);
      if constexpr (B::kJoinProducts) gemm_abt<T, kD, 2, kSN>(ds, smem_u32(Vs), kw, smem_u32(dOb), qw);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < kSN; ++nt)
#pragma unroll
          for (int x = 0; x < 4; ++x) pt[mt][nt][x] = exp2_approx(fmaf(pt[mt][nt][x], mul, -Lb[qw + 8 * nt + 2 * t + x % 2]));
      if (k0 + kK > N || q0 + kQ > N || (causal && k0 + kw + 31 > q0 + qw)) {  // warp-uniform
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < kSN; ++nt)
#pragma unroll
            for (int x = 0; x < 4; ++x) {
              const int key = k0 + kw + 16 * mt + g + 8 * (x / 2), query = q0 + qw + 8 * nt + 2 * t + x % 2;
              if (key >= N || query >= N || (causal && key > query)) pt[mt][nt][x] = 0.0f;
            }
      }
      if constexpr (!B::kJoinProducts) gemm_abt<T, kD, 2, kSN>(ds, smem_u32(Vs), kw, smem_u32(dOb), qw);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < kSN; ++nt) {
          const int r = kw + 16 * mt + g, col = qw + 8 * nt + 2 * t;
#pragma unroll
          for (int x = 0; x < 4; ++x) ds[mt][nt][x] = pt[mt][nt][x] * (ds[mt][nt][x] - Db[col + x % 2]);
          if constexpr (B::kAddrOnce) {  // (r, col) = (kw + g, qw + 2t) + (16mt rows, 8nt columns)
            const std::uint32_t at = (st0 ^ (16u * nt)) + 16 * kRowQ * mt;
            st_shared(at, Mma<T>::pack(pt[mt][nt][0], pt[mt][nt][1]));
            st_shared(at + 8 * kRowQ, Mma<T>::pack(pt[mt][nt][2], pt[mt][nt][3]));
            st_shared(at + kDsT, Mma<T>::pack(ds[mt][nt][0], ds[mt][nt][1]));
            st_shared(at + kDsT + 8 * kRowQ, Mma<T>::pack(ds[mt][nt][2], ds[mt][nt][3]));
          } else {
            *reinterpret_cast<std::uint32_t*>(Pts + LS::at(r, col)) = Mma<T>::pack(pt[mt][nt][0], pt[mt][nt][1]);
            *reinterpret_cast<std::uint32_t*>(Pts + LS::at(r + 8, col)) = Mma<T>::pack(pt[mt][nt][2], pt[mt][nt][3]);
            *reinterpret_cast<std::uint32_t*>(dSs + LS::at(r, col)) = Mma<T>::pack(ds[mt][nt][0], ds[mt][nt][1]);
            *reinterpret_cast<std::uint32_t*>(dSs + LS::at(r + 8, col)) = Mma<T>::pack(ds[mt][nt][2], ds[mt][nt][3]);
          }
        }
    }
    __syncthreads();

    // dV += Pᵀ·dO and dK += dSᵀ·Q: the warp's 32 keys × kDN columns, A fragments of
    // Pᵀ (dSᵀ) by ldmatrix from shared memory — tiles (keys +0, queries +0), (+8, +0),
    // (+0, +8), (+8, +8).
    auto dkdv_product = [&](float (&acc)[2][kDN / 8][4], const T* tile, const T* b) {
      std::uint32_t a[2][kQ / 16][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int c = 0; c < kQ / 16; ++c)
          if constexpr (B::kAddrOnce)  // rows +16mt, columns +16c (chunks +2c)
            ldmatrix_x4(a[mt][c], (la0 ^ (32u * c)) + (tile == Pts ? 0 : kDsT) + 16 * kRowQ * mt);
          else
            ldmatrix_x4(a[mt][c], smem_u32(tile) + LS::bytes(kw + 16 * mt + lane % 8 + 8 * ((lane / 8) % 2),
                                                             16 * c + 8 * (lane / 16)));
      gemm_pv<T, kD, 2, kQ, kDN>(acc, a, smem_u32(b), nw);
    };

    // dQ += dS·K: the warp's 32 queries × d/4 columns (16 × d/2 at d = 96); dS's A fragments are dSᵀ read
    // transposed — tiles (keys +0, queries +0), (+0, +8), (+8, +0), (+8, +8).
    auto dq_product = [&] {
      std::uint32_t qa[kQMT][kK / 16][4];
#pragma unroll
      for (int mt = 0; mt < kQMT; ++mt)
#pragma unroll
        for (int c = 0; c < kK / 16; ++c)
          if constexpr (B::kAddrOnce)  // rows +16c, columns +16mt (chunks +2mt)
            ldmatrix_x4<true>(qa[mt][c], (lq0 ^ (32u * mt)) + 16 * kRowQ * c);
          else
            ldmatrix_x4<true>(qa[mt][c], smem_u32(dSs) + LS::bytes(16 * c + lane % 8 + 8 * (lane / 16),
                                                                    qd + 16 * mt + 8 * ((lane / 8) % 2)));
      float dq[kQMT][kQN / 8][4] = {};
      gemm_pv<T, kD, kQMT, kK, kQN>(dq, qa, smem_u32(Ks), nd);
      if constexpr (B::kAddrOnce) {
        // One pointer for all 16 atomics (immediate offsets), so that no address
        // register is rewritten while the atomics before it may not have read it yet.
        float* const dst = dq0 + std::size_t(q0) * kD;
        auto add = [&](auto row_ok) {
#pragma unroll
          for (int mt = 0; mt < kQMT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              if (row_ok(16 * mt + 8 * h))
#pragma unroll
                for (int dt = 0; dt < kQN / 8; ++dt)
                  atomic_add2(dst + (16 * mt + 8 * h) * kD + 8 * dt, dq[mt][dt][2 * h], dq[mt][dt][2 * h + 1]);
        };
        if (q0 + kQ <= N)
          add([](int) { return true; });
        else
          add([&](int r) { return q0 + qd + g + r < N; });
      } else {
#pragma unroll
        for (int mt = 0; mt < kQMT; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = q0 + qd + 16 * mt + g + 8 * h;
            if (row >= N) continue;
            float* dst = dq_acc + head + std::size_t(row) * kD + nd + 2 * t;
#pragma unroll
            for (int dt = 0; dt < kQN / 8; ++dt)
              atomic_add2(dst + 8 * dt, dq[mt][dt][2 * h], dq[mt][dt][2 * h + 1]);
          }
      }
    };
    dkdv_product(dv_acc, Pts, dOb);  // dV += Pᵀ·dO
    if constexpr (B::kDqBeforeDk) dq_product();
    dkdv_product(dk_acc, dSs, Qb);   // dK += dSᵀ·Q
    if constexpr (!B::kDqBeforeDk) dq_product();
    end_block<B::kLateLoad>();  // Pᵀ, dSᵀ and buffer `buf` are free for the next iteration
  }
  store_dkdv<T, kD>(dk, dv, dk_acc, dv_acc, scale, head, k0 + kw, nw, N);
#endif
}

/// dQ = scale·accumulator in 16 bits, four elements per thread (n is a multiple of 4).
template <class T>
__global__ void convert_kernel(std::size_t n, float scale, const float* __restrict__ acc, T* __restrict__ dq) {
#if FA_STEP06_ARCH_OK  // compiled out before sm_80 (mma.cuh)
  const std::size_t e = 4 * (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x);
  if (e >= n) return;
  const float4 a = *reinterpret_cast<const float4*>(acc + e);
  const uint2 r{Mma<T>::pack(scale * a.x, scale * a.y), Mma<T>::pack(scale * a.z, scale * a.w)};
  *reinterpret_cast<uint2*>(dq + e) = r;
#endif
}

struct Workspace {
  float *dq_acc, *l2, *dsum;
};
Workspace carve(const Problem& p, void* ws) {
  float* base = static_cast<float*>(ws);
  const std::size_t stats = p.heads() * std::size_t(padded_rows(p.N));
  return {base, base + p.elems(), base + p.elems() + stats};
}

template <class T, int kD, class B>
void launch(const Problem& p, const NativeBwdArgs& a, void* workspace, Stream s) {
  constexpr int kK = B::kKeys;
  const Workspace w = carve(p, workspace);
  const int N = p.N, Np = padded_rows(N);
  const T *q = static_cast<const T*>(a.q), *k = static_cast<const T*>(a.k), *v = static_cast<const T*>(a.v);
  const T *o = static_cast<const T*>(a.o), *dout = static_cast<const T*>(a.dout);
  FA_CUDA_CHECK(cudaMemsetAsync(w.dq_acc, 0, p.elems() * sizeof(float), s));
  const int rows = int(p.heads()) * Np;
  preprocess_kernel<T, kD><<<(rows + 7) / 8, 256, 0, s>>>(N, Np, rows, o, dout, a.lse, w.l2, w.dsum);
  FA_CHECK_LAUNCH();

  // Shared: K, V; two buffers of Q, dO, L, D; dSᵀ (and Pᵀ in the shared-layout kernel).
  const std::size_t smem = (std::size_t(2 * kK + 4 * kQ) * smem_cols(kD) + (B::kShared ? 2 : 1) * kK * kQ) * sizeof(T) +
                           4 * kQ * sizeof(float);
  const unsigned blocks = unsigned(tiles::kv_blocks(N, kK)), heads = unsigned(p.heads());
  const dim3 grid = B::kHeavyFirst ? dim3(heads, blocks) : dim3(blocks, heads);
  auto go = [&](auto kernel) {
    set_smem_limit(kernel, smem);
    kernel<<<grid, 32 * B::kWarps, smem, s>>>(N, Np, p.causal, p.softmax_scale(), q, k, v, dout, w.l2, w.dsum,
                                             w.dq_acc, static_cast<T*>(a.dk), static_cast<T*>(a.dv));
    FA_CHECK_LAUNCH();
  };
  if constexpr (B::kShared)
    go(dkdv_shared_kernel<T, kD, B>);
  else
    go(dkdv_kernel<T, kD, B>);

  const std::size_t n4 = p.elems() / 4;
  convert_kernel<T><<<unsigned((n4 + 255) / 256), 256, 0, s>>>(p.elems(), p.softmax_scale(), w.dq_acc,
                                                               static_cast<T*>(a.dq));
  FA_CHECK_LAUNCH();
}

/// Kernel choices B at head dimension kD, in the problem's 16-bit type.
template <class B, int kD>
void run_d(const Problem& p, const NativeBwdArgs& a, void* ws, Stream s) {
  p.dtype == DType::bf16 ? launch<__nv_bfloat16, kD, B>(p, a, ws, s) : launch<__half, kD, B>(p, a, ws, s);
}

/// A backward version of the note's table: B64 at d = 64, B128 at d = 128 (kVersionD).
template <class B64, class B128 = B64>
void run(const Problem& p, const NativeBwdArgs& a, void* ws, Stream s) {
  p.d == 64 ? run_d<B64, 64>(p, a, ws, s) : run_d<B128, 128>(p, a, ws, s);
}

std::size_t workspace_bytes(const Problem& p) {
  return (p.elems() + 2 * p.heads() * std::size_t(padded_rows(p.N))) * sizeof(float);
}

// The versions of the note's backward table.   warps  key tiles/warp  heavy first  stagger  mask branch
using B1 = Bwd<4, 1, false>;                         // 64 keys per block, 4 warps of 16
using B2 = Bwd<8, 1, false>;                         // 128 keys per block, 8 warps of 16
using B3 = Bwd<8, 1, true>;                          // + heaviest key blocks first
using B5_64 = Bwd<4, 1, true, true>;                 // b4 + staggered query blocks (not kept)
using B5_128 = Bwd<8, 1, true, true>;
using B6_64 = Bwd<4, 1, true, false, true>;          // b4 + the mask behind a uniform branch
using B6_128 = Bwd<8, 1, true, false, true>;
using B7_64 = Bwd<4, 2, true, false, true>;          // b6 with 32 keys per warp at d = 64
using B8 = Bwd<8, 2, true, false, true, true>;       // FlashAttention-2's warp layouts, Pᵀ and dSᵀ shared
using B9 = Bwd<8, 2, true, false, true, true, true>; // b8 with the next block's copies after the opening barrier
using B10_64 = Bwd<4, 2, true, false, true, false, true>;  // b9's barrier also at d = 64
//                                                 [addresses once, dQ before dK, Sᵀ and dPᵀ back to back]
using B11 = Bwd<8, 2, true, false, true, true, true, true>;        // b10 with addresses computed once at d = 128
using B12 = Bwd<8, 2, true, false, true, true, true, true, true>;  // b11 with dQ before dK (FlashAttention-2's order)
using B13 = Bwd<8, 2, true, false, true, true, true, true, false, true>;  // b11 with Sᵀ and dPᵀ back to back
// The production kernel at d = 256 (d = 32 takes d = 64's B10_64, d = 96 d = 128's B13):
using B13_256 = Bwd<8, 2, true, false, true, true, true, true, false, true, 2>;  // b13 with 64 keys, 2 × 4 warps

}  // namespace

/// b4: b3 with b1's 64-key blocks at d = 64 (3 blocks of 4 warps per SM there
/// instead of one of 8).
void run_b4(const Problem& p, const NativeBwdArgs& a, void* ws, Stream s) { run<Bwd<4, 1, true>, B3>(p, a, ws, s); }

/// b9: b7's 32 keys per warp at d = 64; at d = 128 FlashAttention-2's warp layouts
/// (b8) with one barrier fewer per query block.
void run_b9(const Problem& p, const NativeBwdArgs& a, void* ws, Stream s) { run<B7_64, B9>(p, a, ws, s); }

/// b13, the production backward: one barrier per query block at both d (b10); at
/// d = 128 the loop's addresses computed once (b11) and Sᵀ, dPᵀ back to back (b13).
/// d = 32 runs d = 64's kernel, d = 96 d = 128's (dQ in 4 × 2 warps: d/4 = 24 columns
/// is not a pair of n-tiles), d = 256 d = 128's with 64-key blocks.
void run_b13(const Problem& p, const NativeBwdArgs& a, void* ws, Stream s) {
  static_assert(B10_64::kKeys == backward_keys(32) && B10_64::kKeys == backward_keys(64) &&
                    B13::kKeys == backward_keys(96) && B13::kKeys == backward_keys(128) &&
                    B13_256::kKeys == backward_keys(256),
                "the CPU model uses the production kernel's blocks");
  switch (p.d) {
    case 32: return run_d<B10_64, 32>(p, a, ws, s);
    case 64: return run_d<B10_64, 64>(p, a, ws, s);
    case 96: return run_d<B13, 96>(p, a, ws, s);
    case 128: return run_d<B13, 128>(p, a, ws, s);
    default: return run_d<B13_256, 256>(p, a, ws, s);  // require_supported: d = 256
  }
}
constexpr const char* kWorkspace = "the fp32 dQ accumulator and D, L·log2 e (B·H·N·(d + 2) floats)";
const GpuBackward kBackward{"step06 backward", 256, workspace_bytes, kWorkspace, nullptr, run_b13, kSupportedD, kMinSm};
const GpuBackward kBackwardVersions[kBackwardVersionCount] = {
    {"b1: 64 keys per block, 4 warps", 128, workspace_bytes, kWorkspace, nullptr, run<B1>, kVersionD, kMinSm},
    {"b2: 128 keys per block, 8 warps", 128, workspace_bytes, kWorkspace, nullptr, run<B2>, kVersionD, kMinSm},
    {"b3: + heaviest key blocks first", 128, workspace_bytes, kWorkspace, nullptr, run<B3>, kVersionD, kMinSm},
    {"b4: b3 with 64-key blocks at d = 64", 128, workspace_bytes, kWorkspace, nullptr, run_b4, kVersionD, kMinSm},
    {"b5: + query blocks staggered per key block", 128, workspace_bytes, kWorkspace, nullptr, run<B5_64, B5_128>, kVersionD, kMinSm},
    {"b6: b4 with the mask behind a warp-uniform branch", 128, workspace_bytes, kWorkspace, nullptr, run<B6_64, B6_128>, kVersionD, kMinSm},
    {"b7: b6 with 32 keys per warp at d = 64", 128, workspace_bytes, kWorkspace, nullptr, run<B7_64, B6_128>, kVersionD, kMinSm},
    {"b8: b7, FlashAttention-2's warp layouts at d = 128", 128, workspace_bytes, kWorkspace, nullptr, run<B7_64, B8>, kVersionD, kMinSm},
    {"b9: b8 with one barrier fewer per query block", 128, workspace_bytes, kWorkspace, nullptr, run_b9, kVersionD, kMinSm},
    {"b10: b9 with one barrier fewer also at d = 64", 128, workspace_bytes, kWorkspace, nullptr, run<B10_64, B9>, kVersionD, kMinSm},
    {"b11: b10 with addresses computed once at d = 128", 128, workspace_bytes, kWorkspace, nullptr, run<B10_64, B11>, kVersionD, kMinSm},
    {"b12: b11 with dQ between dV and dK (FlashAttention-2's order)", 128, workspace_bytes, kWorkspace, nullptr, run<B10_64, B12>, kVersionD, kMinSm},
    {"b13: b11 with the S and dP products back to back", 128, workspace_bytes, kWorkspace, nullptr, run_b13, kVersionD, kMinSm},
};

}  // namespace fa::step06
