// Step 06 backward: step 05's recomputation on tensor cores, in FlashAttention-2's
// loop order (the preprocess and convert kernels around it: backward.cuh).
//
// The dK/dV kernel: a thread block owns K/V block j — its keys' dK_j, dV_j stay in
// registers for the whole pass — and walks the query blocks i (64 queries each;
// causal: from the diagonal on). Per i, with Q_i, dO_i, L_i, D_i arriving by cp.async
// into the other of two buffers:
//   Sᵀ  = K_j·Q_iᵀ,  dPᵀ = V_j·dO_iᵀ           (the two products back to back)
//   Pᵀ  = 2^(Sᵀ·scale·log2 e − L_i·log2 e)      (no max, no sum: L already has them)
//   dSᵀ = Pᵀ∘(dPᵀ − D_i)
//   dV_j += Pᵀ·dO_i,  dK_j += dSᵀ·Q_i           (Pᵀ, dSᵀ rounded to 16 bits)
//   dQ_i += dS·K_j                              (fp32 atomics into an accumulator)
// Two kernels compute it, by head dimension:
//   d ≤ 64:  dkdv_kernel — 4 warps of 32 keys (two 16-key tiles each), so every Qᵀ/dOᵀ
//            fragment feeds two products; the 64 queries in two halves of 32 so that
//            the scores of both tiles fit in registers beside dK and dV; dSᵀ through
//            shared memory for dQ, which needs all of the block's keys.
//   d ≥ 96:  dkdv_shared_kernel — FlashAttention-2's division of the work into 8 warps,
//            each product in its own warp layout, Pᵀ and dSᵀ through shared memory.
// The atomics make dQ's last bits depend on the order blocks finish (FlashAttention-2
// does the same; step 05 shows the deterministic alternative, a separate dQ pass).
// How each piece was found is note 06's lesson; its versions are versions_backward.cu.
#include "steps/06_tensor_cores/backward.cuh"

namespace fa::step06 {
namespace {

/// d ≤ 64: 4 warps, each owning 32 keys of the block's 128 as two 16-key tiles.
template <class T, int kD>
__global__ void __launch_bounds__(128)
    dkdv_kernel(int N, int Np, bool causal, float scale, const T* __restrict__ q, const T* __restrict__ k,
                const T* __restrict__ v, const T* __restrict__ dout, const float* __restrict__ l2,
                const float* __restrict__ dsum, float* __restrict__ dq_acc, T* __restrict__ dk, T* __restrict__ dv) {
#if FA_MMA_ARCH_OK  // compiled out before sm_80 (common/cuda/mma.cuh)
  constexpr int kWarps = 4, kMT = 2, kK = 16 * kMT * kWarps, kThreads = 32 * kWarps;
  constexpr int kH = kQ / 2;         // queries per pass over the scores: two halves of the block
  constexpr int kW = smem_cols(kD);  // a shared tile's columns
  static_assert(kK == backward_keys(kD), "the CPU model takes the kernel's blocks");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* Ks = reinterpret_cast<T*>(smem_raw);  // [kK][kW], swizzled
  T* Vs = Ks + kK * kW;                    // [kK][kW]
  T* Qs = Vs + kK * kW;                    // [2][kQ][kW]: two buffers
  T* dOs = Qs + 2 * kQ * kW;               // [2][kQ][kW]
  T* dSs = dOs + 2 * kQ * kW;              // [kK][kQ]: dSᵀ, swizzled
  float* Lsm = reinterpret_cast<float*>(dSs + kK * kQ);  // [2][kQ]: L·log2 e
  float* Dsm = Lsm + 2 * kQ;                             // [2][kQ]: D
  using LS = Swizzled<kQ>;

  require_aligned_smem(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // The grid is (heads, key blocks): with the causal mask the key blocks with the most
  // query blocks to visit (j = 0 first) start first, in every head.
  const int j = blockIdx.y, bh = blockIdx.x;
  const int k0 = j * kK, w0 = 16 * kMT * warp;  // this warp's first key in the block
  const std::size_t head = std::size_t(bh) * N * kD, stat = std::size_t(bh) * Np;
  const float mul = scale * kLog2e;
  const int first = tiles::first_q_block(causal, j, kQ, kK), blocks = tiles::q_blocks(N, kQ);

  // Prologue: K_j, V_j and the first query block, one group of copies.
  const QueryTiles<T, kD> qt{Qs, dOs, Lsm, Dsm};
  copy_tile_async<kThreads, kD, kK>(Ks, k + head + std::size_t(k0) * kD, N - k0);
  copy_tile_async<kThreads, kD, kK>(Vs, v + head + std::size_t(k0) * kD, N - k0);
  qt.template load<kThreads>(first, 0, N, head, stat, q, dout, l2, dsum);
  cp_async_commit();

  // dK_j, dV_j: [key m-tile][8-column n-tile][register] (keys w0 + 16mt + g, +8 × columns 8dt + 2t, +1).
  float dk_acc[kMT][kD / 8][4] = {}, dv_acc[kMT][kD / 8][4] = {};
  // Main loop over the query blocks.
  for (int it = 0; it < blocks - first; ++it) {  // query block first + it
    const int q0 = (first + it) * kQ, buf = it % 2;
    begin_block(it + 1, blocks - first,
                [&] { qt.template load<kThreads>(first + it + 1, 1 - buf, N, head, stat, q, dout, l2, dsum); });
    const T *Qb = Qs + buf * kQ * kW, *dOb = dOs + buf * kQ * kW;
    const float *Lb = Lsm + buf * kQ, *Db = Dsm + buf * kQ;
    // Whether this warp's scores can meet the mask: keys or queries past N, or the diagonal.
    const bool mask = k0 + kK > N || q0 + kQ > N || (causal && k0 + w0 + 16 * kMT - 1 > q0);

#pragma unroll
    for (int c0 = 0; c0 < kQ; c0 += kH) {  // queries c0 .. c0 + kH − 1 of the block
      // Pᵀ: Sᵀ = K_j·Q_iᵀ, then exp2 against the saved L — no max, no sum: L has them.
      float pt[kMT][kH / 8][4] = {};  // [key m-tile][8-query n-tile][register]
      gemm_abt<T, kD, kMT, kH / 8>(pt, smem_u32(Ks), w0, smem_u32(Qb), c0);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kH / 8; ++nt)
#pragma unroll
          for (int x = 0; x < 4; ++x)  // x = 2h + e: key row g + 8h, query column 8nt + 2t + e
            pt[mt][nt][x] = exp2_approx(fmaf(pt[mt][nt][x], mul, -Lb[c0 + 8 * nt + 2 * t + x % 2]));
      if (mask) {  // warp-uniform: a branch around the comparisons
        mask_tiles(pt, k0 + w0, q0 + c0, 0.0f, [&](int key, int query) { return tiles::masked(query, key, N, causal); });
      }

      // dV_j += Pᵀ·dO_i, Pᵀ rounded to 16 bits (done first: its fragments die before dPᵀ lives).
      {
        std::uint32_t pa[kMT][kH / 16][4];  // [key m-tile][16-query k-chunk][register]
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int c = 0; c < kH / 16; ++c) to_a<T>(pa[mt][c], pt[mt][2 * c], pt[mt][2 * c + 1]);
        gemm_pv<T, kD, kMT, kH>(dv_acc, pa, smem_u32(dOb + c0 * kW));
      }

      // dPᵀ = V_j·dO_iᵀ, then dSᵀ = Pᵀ∘(dPᵀ − D_i), in place; dK_j += dSᵀ·Q_i, dSᵀ in 16 bits.
      float ds[kMT][kH / 8][4] = {};  // [key m-tile][8-query n-tile][register]
      gemm_abt<T, kD, kMT, kH / 8>(ds, smem_u32(Vs), w0, smem_u32(dOb), c0);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kH / 8; ++nt)
#pragma unroll
          for (int x = 0; x < 4; ++x)
            ds[mt][nt][x] = pt[mt][nt][x] * (ds[mt][nt][x] - Db[c0 + 8 * nt + 2 * t + x % 2]);
      std::uint32_t sa[kMT][kH / 16][4];  // [key m-tile][16-query k-chunk][register]
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int c = 0; c < kH / 16; ++c) to_a<T>(sa[mt][c], ds[mt][2 * c], ds[mt][2 * c + 1]);
      gemm_pv<T, kD, kMT, kH>(dk_acc, sa, smem_u32(Qb + c0 * kW));

      store_ds_t(dSs, sa, w0, c0);  // dSᵀ to shared memory, for dQ
    }
    __syncthreads();  // dSᵀ complete

    // dQ_i += dS·K_j: warp w takes queries 16w.. ; dS's A fragments are dSᵀ read
    // transposed — tiles (keys +0, queries +0), (+0, +8), (+8, +0), (+8, +8).
    const int qr = 16 * warp;
    std::uint32_t qa[1][kK / 16][4];  // [query m-tile][16-key k-chunk][register]
#pragma unroll
    for (int c = 0; c < kK / 16; ++c)
      ldmatrix_x4<true>(qa[0][c], smem_u32(dSs) + LS::bytes(16 * c + lane % 8 + 8 * (lane / 16), qr + 8 * ((lane / 8) % 2)));
    float dq[1][kD / 8][4] = {};  // [query m-tile][8-column n-tile][register]
    gemm_pv<T, kD, 1, kK>(dq, qa, smem_u32(Ks));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = q0 + qr + g + 8 * h;
      if (row >= N) continue;
      float* dst = dq_acc + head + std::size_t(row) * kD + 2 * t;
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt) atomic_add2(dst + 8 * dt, dq[0][dt][2 * h], dq[0][dt][2 * h + 1]);
    }
    // (dSs and buffer `buf` are free once every warp passes the next begin_block's barrier.)
  }

  // Epilogue: dK = scale·Σ dSᵀ·Q and dV in 16 bits.
  store_dkdv<T, kD>(dk, dv, dk_acc, dv_acc, scale, head, k0 + w0, 0, N);
#endif
}

/// d ≥ 96: FlashAttention-2's division of the work — 8 warps, kKW of them side by side
/// along the keys (4: 128 keys; 2 at d = 256: 64 keys), each product in the warp layout
/// that reads the least shared memory for it, so that Pᵀ and dSᵀ go through shared
/// memory between them:
///   Sᵀ, dPᵀ (keys × 64 queries, over d): kKW (keys) × 8/kKW (queries) warps of 32 keys
///   dV += Pᵀ·dO, dK += dSᵀ·Q (keys × d, over 64 queries): kKW (keys) × 8/kKW (d)
///   dQ += dS·K (64 queries × d, over the keys): 2 (queries) × 4 (d) warps of 32 × d/4;
///     at d = 96, where d/4 is not a pair of 8-column tiles, 4 × 2 of 16 × 48
/// Every address in the loop is a base computed before it plus XORs with constants
/// and immediate offsets (common/cuda/mma.cuh, "Addressing").
template <class T, int kD, int kKW>
__global__ void __launch_bounds__(256)
    dkdv_shared_kernel(int N, int Np, bool causal, float scale, const T* __restrict__ q, const T* __restrict__ k,
                       const T* __restrict__ v, const T* __restrict__ dout, const float* __restrict__ l2,
                       const float* __restrict__ dsum, float* __restrict__ dq_acc, T* __restrict__ dk,
                       T* __restrict__ dv) {
#if FA_MMA_ARCH_OK  // compiled out before sm_80 (common/cuda/mma.cuh)
  constexpr int kK = 32 * kKW, kThreads = 256, kW = smem_cols(kD);
  constexpr int kOW = 8 / kKW;                       // warps along the queries (Sᵀ) or d (dK, dV)
  constexpr int kSN = kQ / kOW / 8, kDN = kD / kOW;  // a warp's 8-query tiles of Sᵀ; its columns of dK, dV
  constexpr int kQMT = (kD / 4) % 16 == 0 ? 2 : 1, kQQW = kQ / (16 * kQMT), kQN = kD / (8 / kQQW);  // dQ's layout
  static_assert(kK == backward_keys(kD), "the CPU model takes the kernel's blocks");
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
  const int j = blockIdx.y, bh = blockIdx.x;  // grid (heads, key blocks): the heaviest first
  const int k0 = j * kK;
  const int kw = 32 * (warp % kKW);         // this warp's first key (Sᵀ, dPᵀ, dK, dV)
  const int qw = 8 * kSN * (warp / kKW);    // its first query column of Sᵀ, dPᵀ
  const int nw = kDN * (warp / kKW);        // its first column of dK, dV
  const int qd = 16 * kQMT * (warp % kQQW), nd = kQN * (warp / kQQW);  // its first query and column of dQ
  const std::size_t head = std::size_t(bh) * N * kD, stat = std::size_t(bh) * Np;
  const float mul = scale * kLog2e;
  const int first = tiles::first_q_block(causal, j, kQ, kK), blocks = tiles::q_blocks(N, kQ);

  // The addresses the loop reaches by XOR (16 or 32 bytes: chunk bits the swizzle key
  // does not touch) and by adding whole rows (kRowQ bytes: the key, row % 8, stays).
  constexpr std::uint32_t kRowQ = 2 * kQ, kDsT = 2 * kK * kQ;  // bytes: a row of Pᵀ; dSs − Pts
  const std::uint32_t st0 = smem_u32(Pts) + LS::bytes(kw + g, qw + 2 * t);  // Pᵀ(kw + g, qw + 2t): stores
  const std::uint32_t la0 = smem_u32(Pts) + LS::bytes(kw + lane % 8 + 8 * ((lane / 8) % 2), 8 * (lane / 16));
  const std::uint32_t lq0 = smem_u32(dSs) + LS::bytes(lane % 8 + 8 * (lane / 16), qd + 8 * ((lane / 8) % 2));
  float* const dq0 = dq_acc + head + std::size_t(qd + g) * kD + nd + 2 * t;  // query qd + g, block 0

  // Prologue: K_j, V_j and the first query block, one group of copies.
  const QueryTiles<T, kD> qt{Qs, dOs, Lsm, Dsm};
  copy_tile_async<kThreads, kD, kK>(Ks, k + head + std::size_t(k0) * kD, N - k0);
  copy_tile_async<kThreads, kD, kK>(Vs, v + head + std::size_t(k0) * kD, N - k0);
  qt.template load<kThreads>(first, 0, N, head, stat, q, dout, l2, dsum);
  cp_async_commit();

  // dK_j, dV_j: [key m-tile][8-column n-tile][register] (keys kw + 16mt + g, +8 × columns nw + 8dt + 2t, +1).
  float dk_acc[2][kDN / 8][4] = {}, dv_acc[2][kDN / 8][4] = {};
  // Main loop over the query blocks.
  for (int i = first; i < blocks; ++i) {
    const int q0 = i * kQ, buf = (i - first) % 2;
    begin_block(i + 1, blocks, [&] {  // a whole tile from one pointer (the last may be partial)
      qt.template load<kThreads, true>(i + 1, 1 - buf, N, head, stat, q, dout, l2, dsum);
    });
    const T *Qb = Qs + buf * kQ * kW, *dOb = dOs + buf * kQ * kW;
    const float *Lb = Lsm + buf * kQ, *Db = Dsm + buf * kQ;

    // Pᵀ and dSᵀ for the warp's 32 keys × 8·kSN queries, into shared memory in 16 bits.
    {
      // Sᵀ = K_j·Q_iᵀ and dPᵀ = V_j·dO_iᵀ back to back, before the exponentials and the
      // mask's branch: two independent products in one basic block for ptxas to interleave.
      float pt[2][kSN][4] = {}, ds[2][kSN][4] = {};  // [key m-tile][8-query n-tile][register]
      gemm_abt<T, kD, 2, kSN>(pt, smem_u32(Ks), kw, smem_u32(Qb), qw);
      gemm_abt<T, kD, 2, kSN>(ds, smem_u32(Vs), kw, smem_u32(dOb), qw);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < kSN; ++nt)
#pragma unroll
          for (int x = 0; x < 4; ++x) pt[mt][nt][x] = exp2_approx(fmaf(pt[mt][nt][x], mul, -Lb[qw + 8 * nt + 2 * t + x % 2]));
      if (k0 + kK > N || q0 + kQ > N || (causal && k0 + kw + 31 > q0 + qw)) {  // warp-uniform
        mask_tiles(pt, k0 + kw, q0 + qw, 0.0f, [&](int key, int query) { return tiles::masked(query, key, N, causal); });
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < kSN; ++nt) {
          const int col = qw + 8 * nt + 2 * t;
#pragma unroll
          for (int x = 0; x < 4; ++x) ds[mt][nt][x] = pt[mt][nt][x] * (ds[mt][nt][x] - Db[col + x % 2]);
          // (row, col) = (kw + g, qw + 2t) + (16mt rows, 8nt columns)
          const std::uint32_t at = (st0 ^ (16u * nt)) + 16 * kRowQ * mt;
          st_shared(at, Mma<T>::pack(pt[mt][nt][0], pt[mt][nt][1]));
          st_shared(at + 8 * kRowQ, Mma<T>::pack(pt[mt][nt][2], pt[mt][nt][3]));
          st_shared(at + kDsT, Mma<T>::pack(ds[mt][nt][0], ds[mt][nt][1]));
          st_shared(at + kDsT + 8 * kRowQ, Mma<T>::pack(ds[mt][nt][2], ds[mt][nt][3]));
        }
    }
    __syncthreads();  // Pᵀ, dSᵀ complete

    // dV += Pᵀ·dO (tile offset 0) and dK += dSᵀ·Q (kDsT): the warp's 32 keys × kDN
    // columns, A fragments of Pᵀ (dSᵀ) by ldmatrix — tiles (keys +0, queries +0),
    // (+8, +0), (+0, +8), (+8, +8), at rows +16mt and chunks +2c.
    auto dkdv_product = [&](float (&acc)[2][kDN / 8][4], std::uint32_t tile, const T* b) {
      std::uint32_t a[2][kQ / 16][4];  // [key m-tile][16-query k-chunk][register]
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int c = 0; c < kQ / 16; ++c) ldmatrix_x4(a[mt][c], (la0 ^ (32u * c)) + tile + 16 * kRowQ * mt);
      gemm_pv<T, kD, 2, kQ, kDN>(acc, a, smem_u32(b), nw);
    };
    dkdv_product(dv_acc, 0, dOb);
    dkdv_product(dk_acc, kDsT, Qb);

    // dQ += dS·K: the warp's 16·kQMT queries × kQN columns; dS's A fragments are dSᵀ read
    // transposed — tiles (keys +0, queries +0), (+0, +8), (+8, +0), (+8, +8), at rows
    // +16c and chunks +2mt.
    {
      std::uint32_t qa[kQMT][kK / 16][4];  // [query m-tile][16-key k-chunk][register]
#pragma unroll
      for (int mt = 0; mt < kQMT; ++mt)
#pragma unroll
        for (int c = 0; c < kK / 16; ++c) ldmatrix_x4<true>(qa[mt][c], (lq0 ^ (32u * mt)) + 16 * kRowQ * c);
      float dq[kQMT][kQN / 8][4] = {};  // [query m-tile][8-column n-tile][register]
      gemm_pv<T, kD, kQMT, kK, kQN>(dq, qa, smem_u32(Ks), nd);
      add_dq<kD>(dq0 + std::size_t(q0) * kD, dq, q0 + kQ <= N, q0 + qd + g, N);
    }
    // (Pᵀ, dSᵀ and buffer `buf` are free once every warp passes the next begin_block's barrier.)
  }

  // Epilogue: dK = scale·Σ dSᵀ·Q and dV in 16 bits.
  store_dkdv<T, kD>(dk, dv, dk_acc, dv_acc, scale, head, k0 + kw, nw, N);
#endif
}

template <class T, int kD>
void launch(const Problem& p, const NativeBwdArgs& a, void* ws, Stream s) {
  constexpr int kK = backward_keys(kD);
  const dim3 grid(unsigned(p.heads()), unsigned(tiles::kv_blocks(p.N, kK)));
  if constexpr (kD <= 64)
    launch_backward<T, kD>(p, a, ws, s, dkdv_kernel<T, kD>, grid, 128, dkdv_smem<T>(kD, kK, false));
  else
    launch_backward<T, kD>(p, a, ws, s, dkdv_shared_kernel<T, kD, kK / 32>, grid, 256, dkdv_smem<T>(kD, kK, true));
}

template <int kD>
void run_d(const Problem& p, const NativeBwdArgs& a, void* ws, Stream s) {
  p.dtype == DType::bf16 ? launch<__nv_bfloat16, kD>(p, a, ws, s) : launch<__half, kD>(p, a, ws, s);
}

void run(const Problem& p, const NativeBwdArgs& a, void* ws, Stream s) {
  switch (p.d) {
    case 32: return run_d<32>(p, a, ws, s);
    case 64: return run_d<64>(p, a, ws, s);
    case 96: return run_d<96>(p, a, ws, s);
    case 128: return run_d<128>(p, a, ws, s);
    default: return run_d<256>(p, a, ws, s);  // require_supported: d = 256
  }
}

}  // namespace

const GpuBackward kBackward{.name = "step06 backward",
                            .max_d = 256,
                            .workspace_bytes = workspace_bytes,
                            .workspace_what = kWorkspace,
                            .run_native = run,
                            .only_d = kSupportedD,
                            .min_sm = kMinSm};

}  // namespace fa::step06
