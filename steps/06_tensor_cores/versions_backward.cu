// Step 06's backward as note 06 teaches it, one idea a row: the versions of the lesson's
// backward table. Production (backward.cu) is the table's last row.
//   b1   dK/dV outer, 64 keys per block (4 warps × 16), dQ by fp32 float2 atomics
//   b2   128 keys per block, 8 warps of 16
//   b6   + the mask behind a warp-uniform branch (with the heaviest key blocks first,
//        and b1's 64-key blocks at d = 64)
//   b7   + 32 keys per warp at d = 64 (4 warps, 128 keys; queries in two halves of 32)
//   b8   + FlashAttention-2's warp layouts at d = 128, Pᵀ and dSᵀ through shared memory
//   b11  + one barrier fewer per query block, and at d = 128 the loop's addresses
//        computed once
// Two kernels take them: 16·m_tiles keys per warp (version_dkdv_kernel), and
// FlashAttention-2's shared warp layouts (version_shared_kernel, b8 on, at d = 128);
// each version is a configuration with named fields (BwdVersion). The versions not
// kept are described in notes/lab/06_versions.md.
#include "steps/06_tensor_cores/backward.cuh"
#include "steps/06_tensor_cores/versions.cuh"

namespace fa::step06 {
namespace {

/// One version of the dK/dV kernel (at d = 64 or 128), by what it adds.
struct BwdVersion {
  int warps = 4;             ///< warps per block, side by side along the keys (8 in the shared layouts)
  int m_tiles = 1;           ///< 16-key mma tiles per warp (the shared layouts: 2, of 32-key warps)
  bool heavy_first = false;  ///< grid (heads, key blocks): the key blocks with the most query blocks first
  bool mask_branch = false;  ///< the mask's comparisons behind a warp-uniform branch (as forward v12)
  bool shared = false;       ///< FlashAttention-2's warp layouts, Pᵀ and dSᵀ through shared memory
  bool late_load = false;    ///< the next query block's copies after the opening barrier: one barrier fewer
  bool addr_once = false;    ///< the loop's shared-memory addresses and dQ pointer computed once, before it
  /// Keys per block: the warps side by side along the keys (4 of the 8 in the shared layouts).
  FA_HD constexpr int keys() const { return 16 * m_tiles * (shared ? 4 : warps); }
};

/// A version: its configuration at each head dimension (d = 64 or 128).
using Version = BwdVersion (*)(int d);

template <class T, int kD, Version V>
__global__ void __launch_bounds__(32 * V(kD).warps)
    version_dkdv_kernel(int N, int Np, bool causal, float scale, const T* __restrict__ q, const T* __restrict__ k,
                const T* __restrict__ v, const T* __restrict__ dout, const float* __restrict__ l2,
                const float* __restrict__ dsum, float* __restrict__ dq_acc, T* __restrict__ dk, T* __restrict__ dv) {
#if FA_MMA_ARCH_OK  // compiled out before sm_80 (common/cuda/mma.cuh)
  constexpr BwdVersion B = V(kD);
  static_assert(!B.shared && !B.addr_once, "the shared layout, and what b11 changes in it, are the other kernel's");
  constexpr int kWarps = B.warps, kMT = B.m_tiles, kK = B.keys(), kThreads = 32 * kWarps;
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
  const int j = B.heavy_first ? blockIdx.y : blockIdx.x, bh = B.heavy_first ? blockIdx.x : blockIdx.y;
  const int k0 = j * kK, w0 = 16 * kMT * warp;  // this warp's first key in the block
  const std::size_t head = std::size_t(bh) * N * kD, stat = std::size_t(bh) * Np;
  const float mul = scale * kLog2e;
  const int first = tiles::first_q_block(causal, j, kQ, kK), blocks = tiles::q_blocks(N, kQ);
  // (first + it, through a lambda: written out, ptxas schedules the versions differently
  // from what the tables measured.)
  auto q_block = [&](int it) { return first + it; };

  const QueryTiles<T, kD> qt{Qs, dOs, Lsm, Dsm};
  copy_tile_async<kThreads, kD, kK>(Ks, k + head + std::size_t(k0) * kD, N - k0);
  copy_tile_async<kThreads, kD, kK>(Vs, v + head + std::size_t(k0) * kD, N - k0);
  qt.template load<kThreads>(q_block(0), 0, N, head, stat, q, dout, l2, dsum);
  cp_async_commit();

  float dk_acc[kMT][kD / 8][4] = {}, dv_acc[kMT][kD / 8][4] = {};  // rows g, g+8 of the warp's key tiles
  for (int it = 0; it < blocks - first; ++it) {
    const int q0 = q_block(it) * kQ, buf = it % 2;
    version_begin_block<B.late_load>(it + 1, blocks - first, [&] { qt.template load<kThreads>(q_block(it + 1), 1 - buf, N, head, stat, q, dout, l2, dsum); });
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
            if (!B.mask_branch && mask && tiles::masked(query, key, N, causal)) p = 0.0f;
          }
      if (B.mask_branch && mask) {
        mask_tiles(pt, k0 + w0, q0 + c0, 0.0f, [&](int key, int query) { return tiles::masked(query, key, N, causal); });
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

      store_ds_t(dSs, sa, w0, c0);  // dSᵀ to shared memory, for dQ
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
    version_end_block<B.late_load>();  // dSs and buffer `buf` are free for the next iteration
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
template <class T, int kD, Version V>
__global__ void __launch_bounds__(256)
    version_shared_kernel(int N, int Np, bool causal, float scale, const T* __restrict__ q, const T* __restrict__ k,
                       const T* __restrict__ v, const T* __restrict__ dout, const float* __restrict__ l2,
                       const float* __restrict__ dsum, float* __restrict__ dq_acc, T* __restrict__ dk,
                       T* __restrict__ dv) {
#if FA_MMA_ARCH_OK  // compiled out before sm_80 (common/cuda/mma.cuh)
  constexpr BwdVersion B = V(kD);
  static_assert(B.warps == 8 && B.m_tiles == 2 && B.shared && B.mask_branch,
                "the 4 × 2 and 2 × 4 warp layouts of 32-row tiles, the mask behind a branch");
  constexpr int kK = B.keys(), kThreads = 256, kW = smem_cols(kD);
  constexpr int kKW = 4, kOW = 8 / kKW;  // warps along the keys × along queries (Sᵀ) or d (dK, dV)
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
  const int j = B.heavy_first ? blockIdx.y : blockIdx.x, bh = B.heavy_first ? blockIdx.x : blockIdx.y;
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
    // mma::begin_block's step spelled out: this is the code measured on the GPU;
    // through the helper nvcc schedules two index computations differently.
    if constexpr (B.late_load) {
      cp_async_wait<0>();  // block i landed (this thread's copies) ...
      __syncthreads();     // ... everyone's, and every warp is done with iteration i-1
      if (i + 1 < blocks) {
        qt.template load<kThreads, B.addr_once>(i + 1, 1 - buf, N, head, stat, q, dout, l2, dsum);
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
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < kSN; ++nt)
#pragma unroll
          for (int x = 0; x < 4; ++x) pt[mt][nt][x] = exp2_approx(fmaf(pt[mt][nt][x], mul, -Lb[qw + 8 * nt + 2 * t + x % 2]));
      if (k0 + kK > N || q0 + kQ > N || (causal && k0 + kw + 31 > q0 + qw)) {  // warp-uniform
        mask_tiles(pt, k0 + kw, q0 + qw, 0.0f, [&](int key, int query) { return tiles::masked(query, key, N, causal); });
      }
      gemm_abt<T, kD, 2, kSN>(ds, smem_u32(Vs), kw, smem_u32(dOb), qw);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < kSN; ++nt) {
          const int r = kw + 16 * mt + g, col = qw + 8 * nt + 2 * t;
#pragma unroll
          for (int x = 0; x < 4; ++x) ds[mt][nt][x] = pt[mt][nt][x] * (ds[mt][nt][x] - Db[col + x % 2]);
          if constexpr (B.addr_once) {  // (r, col) = (kw + g, qw + 2t) + (16mt rows, 8nt columns)
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
          if constexpr (V(kD).addr_once)  // rows +16mt, columns +16c (chunks +2c)
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
          if constexpr (V(kD).addr_once)  // rows +16c, columns +16mt (chunks +2mt)
            ldmatrix_x4<true>(qa[mt][c], (lq0 ^ (32u * mt)) + 16 * kRowQ * c);
          else
            ldmatrix_x4<true>(qa[mt][c], smem_u32(dSs) + LS::bytes(16 * c + lane % 8 + 8 * (lane / 16),
                                                                    qd + 16 * mt + 8 * ((lane / 8) % 2)));
      float dq[kQMT][kQN / 8][4] = {};
      gemm_pv<T, kD, kQMT, kK, kQN>(dq, qa, smem_u32(Ks), nd);
      if constexpr (V(kD).addr_once) {
        add_dq<kD>(dq0 + std::size_t(q0) * kD, dq, q0 + kQ <= N, q0 + qd + g, N);  // one pointer for all atomics
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
    dkdv_product(dk_acc, dSs, Qb);   // dK += dSᵀ·Q
    dq_product();
    version_end_block<B.late_load>();  // Pᵀ, dSᵀ and buffer `buf` are free for the next iteration
  }
  store_dkdv<T, kD>(dk, dv, dk_acc, dv_acc, scale, head, k0 + kw, nw, N);
#endif
}

template <class T, int kD, Version V>
void launch(const Problem& p, const NativeBwdArgs& a, void* ws, Stream s) {
  constexpr BwdVersion B = V(kD);
  constexpr int kK = B.keys();
  const unsigned blocks = unsigned(tiles::kv_blocks(p.N, kK)), heads = unsigned(p.heads());
  const dim3 grid = B.heavy_first ? dim3(heads, blocks) : dim3(blocks, heads);
  if constexpr (B.shared)
    launch_backward<T, kD>(p, a, ws, s, version_shared_kernel<T, kD, V>, grid, 256, dkdv_smem<T>(kD, kK, true));
  else
    launch_backward<T, kD>(p, a, ws, s, version_dkdv_kernel<T, kD, V>, grid, 32 * B.warps, dkdv_smem<T>(kD, kK, false));
}

template <Version V, int kD>
void run_d(const Problem& p, const NativeBwdArgs& a, void* ws, Stream s) {
  p.dtype == DType::bf16 ? launch<__nv_bfloat16, kD, V>(p, a, ws, s) : launch<__half, kD, V>(p, a, ws, s);
}
template <Version V>
void run(const Problem& p, const NativeBwdArgs& a, void* ws, Stream s) {
  p.d == 64 ? run_d<V, 64>(p, a, ws, s) : run_d<V, 128>(p, a, ws, s);
}

// The versions of the note's backward table, each as the one before it plus its idea.
FA_HD constexpr BwdVersion b1(int) { return {.warps = 4, .m_tiles = 1}; }  // 64 keys per block, 4 warps of 16
FA_HD constexpr BwdVersion b2(int d) {  // 128 keys per block, 8 warps of 16
  BwdVersion b = b1(d);
  b.warps = 8;
  return b;
}
FA_HD constexpr BwdVersion b6(int d) {  // + the mask behind a warp-uniform branch
  BwdVersion b = b2(d);
  b.heavy_first = true;      // (the lab's b3: the heaviest key blocks first)
  if (d == 64) b.warps = 4;  // (b4: b1's 64-key blocks at d = 64)
  b.mask_branch = true;
  return b;
}
FA_HD constexpr BwdVersion b7(int d) {  // + 32 keys per warp at d = 64 (queries in halves of 32)
  BwdVersion b = b6(d);
  if (d == 64) b.m_tiles = 2;
  return b;
}
FA_HD constexpr BwdVersion b8(int d) {  // + FlashAttention-2's warp layouts at d = 128
  BwdVersion b = b7(d);
  if (d == 128) b.m_tiles = 2, b.shared = true;
  return b;
}
FA_HD constexpr BwdVersion b11(int d) {  // + one barrier fewer; at d = 128 addresses computed once
  BwdVersion b = b8(d);
  b.late_load = true;  // (the lab's b9 at d = 128, b10 at d = 64)
  if (d == 128) b.addr_once = true;
  return b;
}
// Production (backward.cu) = b11 with Sᵀ and dPᵀ computed back to back (at d = 64 it
// is b11's kernel).
static_assert(b11(64).keys() == backward_keys(64) && b11(128).keys() == backward_keys(128),
              "production keeps b11's blocks");

}  // namespace

const GpuBackward kBackwardVersions[kBackwardVersionCount] = {
    {.name = "b1: 64 keys per block, 4 warps",
     .max_d = 128, .workspace_bytes = workspace_bytes, .workspace_what = kWorkspace, .run_native = run<b1>,
     .only_d = kVersionD, .min_sm = kMinSm},
    {.name = "b2: 128 keys per block, 8 warps",
     .max_d = 128, .workspace_bytes = workspace_bytes, .workspace_what = kWorkspace, .run_native = run<b2>,
     .only_d = kVersionD, .min_sm = kMinSm},
    {.name = "b6: + heaviest key blocks first, the mask behind a branch",
     .max_d = 128, .workspace_bytes = workspace_bytes, .workspace_what = kWorkspace, .run_native = run<b6>,
     .only_d = kVersionD, .min_sm = kMinSm},
    {.name = "b7: + 32 keys per warp at d = 64",
     .max_d = 128, .workspace_bytes = workspace_bytes, .workspace_what = kWorkspace, .run_native = run<b7>,
     .only_d = kVersionD, .min_sm = kMinSm},
    {.name = "b8: + FlashAttention-2's warp layouts at d = 128",
     .max_d = 128, .workspace_bytes = workspace_bytes, .workspace_what = kWorkspace, .run_native = run<b8>,
     .only_d = kVersionD, .min_sm = kMinSm},
    {.name = "b11: + one barrier fewer, addresses computed once at d = 128",
     .max_d = 128, .workspace_bytes = workspace_bytes, .workspace_what = kWorkspace, .run_native = run<b11>,
     .only_d = kVersionD, .min_sm = kMinSm},
};

}  // namespace fa::step06
