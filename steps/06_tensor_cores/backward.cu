// Step 06 backward kernels: step 05's recomputation on tensor cores, in
// FlashAttention-2's loop order.
//
// 1. preprocess: D = rowsum(dO∘O) in fp32, and L·log2(e), both padded per head to a
//    multiple of 64 rows so that a block's slice is one aligned cp.async run.
// 2. dK/dV: a thread block owns K/V block j (16 keys per warp, 4 or 8 warps; warp w
//    owns keys 16w..16w+15, so dK_j and dV_j live in its registers for the whole
//    pass) and walks the query blocks i (64 queries each; causal: from the diagonal
//    on). Per i, with Q_i, dO_i, L_i, D_i arriving by cp.async into the other of two
//    buffers:
//      Sᵀ  = K_j·Q_iᵀ                 (the warp's 16 keys × 64 queries)
//      Pᵀ  = 2^(Sᵀ·scale·log2 e − L_i·log2 e)
//      dPᵀ = V_j·dO_iᵀ
//      dSᵀ = Pᵀ∘(dPᵀ − D_i)
//      dV_j += Pᵀ·dO_i,  dK_j += dSᵀ·Q_i          (Pᵀ, dSᵀ rounded to 16 bits)
//      dQ_i += dS·K_j: dSᵀ goes through shared memory (a warp holds 16 keys, a row of
//                      dQ needs all of the block's), and each warp adds 16 queries × d
//                      (8 warps: × d/2) into an fp32 accumulator in device memory with
//                      vector atomics.
//    Every product is the forward's: gemm_abt (A·Bᵀ, both row-major in shared
//    memory) or gemm_pv (A from registers, B read transposed by ldmatrix).
// 3. convert: dQ = scale·accumulator, rounded to 16 bits.
// The versions of the note's backward table (b1 … b4) are the template arguments
// listed at the end of this file; b4 is the production kernel.
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
}

/// kWarps warps own 16 keys each (kK = 16·kWarps keys per block). kHeavyFirst: the
/// grid is (heads, key blocks), so that with the causal mask the key blocks with
/// the most query blocks to visit (j = 0 first) start first, in every head.
template <class T, int kD, int kWarps, bool kHeavyFirst>
__global__ void __launch_bounds__(32 * kWarps)
    dkdv_kernel(int N, int Np, bool causal, float scale, const T* __restrict__ q, const T* __restrict__ k,
                const T* __restrict__ v, const T* __restrict__ dout, const float* __restrict__ l2,
                const float* __restrict__ dsum, float* __restrict__ dq_acc, T* __restrict__ dk, T* __restrict__ dv) {
  constexpr int kK = 16 * kWarps, kThreads = 32 * kWarps;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* Ks = reinterpret_cast<T*>(smem_raw);  // [kK][kD], swizzled
  T* Vs = Ks + kK * kD;                    // [kK][kD]
  T* Qs = Vs + kK * kD;                    // [2][kQ][kD]: two buffers
  T* dOs = Qs + 2 * kQ * kD;               // [2][kQ][kD]
  T* dSs = dOs + 2 * kQ * kD;              // [kK][kQ]: dSᵀ, swizzled
  float* Lsm = reinterpret_cast<float*>(dSs + kK * kQ);  // [2][kQ]: L·log2 e
  float* Dsm = Lsm + 2 * kQ;                             // [2][kQ]: D

  require_aligned_smem(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int j = kHeavyFirst ? blockIdx.y : blockIdx.x, bh = kHeavyFirst ? blockIdx.x : blockIdx.y;
  const int k0 = j * kK, w0 = 16 * warp;  // this warp's first key in the block
  const std::size_t head = std::size_t(bh) * N * kD, stat = std::size_t(bh) * Np;
  const float mul = scale * kLog2e;
  const int first = tiles::first_q_block(causal, j, kQ, kK), blocks = tiles::q_blocks(N, kQ);

  auto load_q_block = [&](int i, int buf) {
    const int q0 = i * kQ;
    copy_tile_async<kThreads, kD, kQ>(Qs + buf * kQ * kD, q + head + std::size_t(q0) * kD, N - q0);
    copy_tile_async<kThreads, kD, kQ>(dOs + buf * kQ * kD, dout + head + std::size_t(q0) * kD, N - q0);
    copy_floats_async<kThreads>(Lsm + buf * kQ, l2 + stat + q0, kQ);
    copy_floats_async<kThreads>(Dsm + buf * kQ, dsum + stat + q0, kQ);
  };
  copy_tile_async<kThreads, kD, kK>(Ks, k + head + std::size_t(k0) * kD, N - k0);
  copy_tile_async<kThreads, kD, kK>(Vs, v + head + std::size_t(k0) * kD, N - k0);
  load_q_block(first, 0);
  cp_async_commit();

  float dk_acc[1][kD / 8][4] = {}, dv_acc[1][kD / 8][4] = {};  // rows g, g+8 of the warp's keys
  for (int i = first; i < blocks; ++i) {
    const int q0 = i * kQ, buf = (i - first) % 2;
    if (i + 1 < blocks) {  // the other buffer is free since the barrier ending iteration i-1
      load_q_block(i + 1, 1 - buf);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T *Qb = Qs + buf * kQ * kD, *dOb = dOs + buf * kQ * kD;
    const float *Lb = Lsm + buf * kQ, *Db = Dsm + buf * kQ;

    // Pᵀ: Sᵀ = K_j·Q_iᵀ, then exp2 against the saved L — no max, no sum: L already has them.
    float pt[1][kQ / 8][4] = {};
    gemm_abt<T, kD, 1, kQ / 8>(pt, smem_u32(Ks), w0, smem_u32(Qb), 0);
    const bool mask = k0 + kK > N || q0 + kQ > N || (causal && k0 + w0 + 15 > q0);
#pragma unroll
    for (int nt = 0; nt < kQ / 8; ++nt)
#pragma unroll
      for (int x = 0; x < 4; ++x) {  // x = 2h + e: key row g + 8h, query column 8nt + 2t + e
        const int key = k0 + w0 + g + 8 * (x / 2), col = 8 * nt + 2 * t + x % 2, query = q0 + col;
        float& p = pt[0][nt][x];
        p = exp2_approx(fmaf(p, mul, -Lb[col]));
        if (mask && (key >= N || query >= N || (causal && key > query))) p = 0.0f;
      }

    // dV_j += Pᵀ·dO_i, Pᵀ rounded to 16 bits (done first: its fragments die before dPᵀ lives).
    std::uint32_t pa[1][kQ / 16][4];
#pragma unroll
    for (int c = 0; c < kQ / 16; ++c) to_a<T>(pa[0][c], pt[0][2 * c], pt[0][2 * c + 1]);
    gemm_pv<T, kD, 1, kQ>(dv_acc, pa, smem_u32(dOb));

    // dPᵀ = V_j·dO_iᵀ, then dSᵀ = Pᵀ∘(dPᵀ − D_i), in place; dK_j += dSᵀ·Q_i, dSᵀ in 16 bits.
    float ds[1][kQ / 8][4] = {};
    gemm_abt<T, kD, 1, kQ / 8>(ds, smem_u32(Vs), w0, smem_u32(dOb), 0);
#pragma unroll
    for (int nt = 0; nt < kQ / 8; ++nt)
#pragma unroll
      for (int x = 0; x < 4; ++x) ds[0][nt][x] = pt[0][nt][x] * (ds[0][nt][x] - Db[8 * nt + 2 * t + x % 2]);
    std::uint32_t sa[1][kQ / 16][4];
#pragma unroll
    for (int c = 0; c < kQ / 16; ++c) to_a<T>(sa[0][c], ds[0][2 * c], ds[0][2 * c + 1]);
    gemm_pv<T, kD, 1, kQ>(dk_acc, sa, smem_u32(Qb));

    // dSᵀ to shared memory: register c of sa holds keys g / g+8, queries 16c + 2t (+8).
    using LS = Swizzled<kQ>;
#pragma unroll
    for (int c = 0; c < kQ / 16; ++c) {
      *reinterpret_cast<std::uint32_t*>(dSs + LS::at(w0 + g, 16 * c + 2 * t)) = sa[0][c][0];
      *reinterpret_cast<std::uint32_t*>(dSs + LS::at(w0 + g + 8, 16 * c + 2 * t)) = sa[0][c][1];
      *reinterpret_cast<std::uint32_t*>(dSs + LS::at(w0 + g, 16 * c + 8 + 2 * t)) = sa[0][c][2];
      *reinterpret_cast<std::uint32_t*>(dSs + LS::at(w0 + g + 8, 16 * c + 8 + 2 * t)) = sa[0][c][3];
    }
    __syncthreads();

    // dQ_i += dS·K_j: warp w takes queries 16·(w % 4).. and, with 8 warps, half of the
    // columns. dS's A fragments are dSᵀ read transposed — tiles (keys +0, queries +0),
    // (+0, +8), (+8, +0), (+8, +8).
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
#if __CUDA_ARCH__ >= 900
        atomicAdd(reinterpret_cast<float2*>(dst + 8 * dt), make_float2(dq[0][dt][2 * h], dq[0][dt][2 * h + 1]));
#else
        atomicAdd(dst + 8 * dt, dq[0][dt][2 * h]);
        atomicAdd(dst + 8 * dt + 1, dq[0][dt][2 * h + 1]);
#endif
      }
    }
    __syncthreads();  // dSs and buffer `buf` are free for the next iteration
  }

  // Epilogue: dK = scale·Σ dSᵀ·Q and dV, in 16 bits.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = k0 + w0 + g + 8 * h;
    if (row >= N) continue;
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
      const std::size_t at = head + std::size_t(row) * kD + 8 * dt + 2 * t;
      *reinterpret_cast<std::uint32_t*>(dk + at) =
          Mma<T>::pack(scale * dk_acc[0][dt][2 * h], scale * dk_acc[0][dt][2 * h + 1]);
      *reinterpret_cast<std::uint32_t*>(dv + at) = Mma<T>::pack(dv_acc[0][dt][2 * h], dv_acc[0][dt][2 * h + 1]);
    }
  }
}

/// dQ = scale·accumulator in 16 bits, four elements per thread (n is a multiple of 4).
template <class T>
__global__ void convert_kernel(std::size_t n, float scale, const float* __restrict__ acc, T* __restrict__ dq) {
  const std::size_t e = 4 * (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x);
  if (e >= n) return;
  const float4 a = *reinterpret_cast<const float4*>(acc + e);
  const uint2 r{Mma<T>::pack(scale * a.x, scale * a.y), Mma<T>::pack(scale * a.z, scale * a.w)};
  *reinterpret_cast<uint2*>(dq + e) = r;
}

struct Workspace {
  float *dq_acc, *l2, *dsum;
};
Workspace carve(const Problem& p, void* ws) {
  float* base = static_cast<float*>(ws);
  const std::size_t stats = p.heads() * std::size_t(padded_rows(p.N));
  return {base, base + p.elems(), base + p.elems() + stats};
}

template <class T, int kD, int kWarps, bool kHeavyFirst>
void launch(const Problem& p, const NativeBwdArgs& a, void* workspace, Stream s) {
  constexpr int kK = 16 * kWarps;
  const Workspace w = carve(p, workspace);
  const int N = p.N, Np = padded_rows(N);
  const T *q = static_cast<const T*>(a.q), *k = static_cast<const T*>(a.k), *v = static_cast<const T*>(a.v);
  const T *o = static_cast<const T*>(a.o), *dout = static_cast<const T*>(a.dout);
  FA_CUDA_CHECK(cudaMemsetAsync(w.dq_acc, 0, p.elems() * sizeof(float), s));
  const int rows = int(p.heads()) * Np;
  preprocess_kernel<T, kD><<<(rows + 7) / 8, 256, 0, s>>>(N, Np, rows, o, dout, a.lse, w.l2, w.dsum);
  FA_CHECK_LAUNCH();

  const std::size_t smem = (std::size_t(2 * kK + 4 * kQ) * kD + kK * kQ) * sizeof(T) + 4 * kQ * sizeof(float);
  set_smem_limit(dkdv_kernel<T, kD, kWarps, kHeavyFirst>, smem);
  const unsigned blocks = unsigned(tiles::kv_blocks(N, kK)), heads = unsigned(p.heads());
  const dim3 grid = kHeavyFirst ? dim3(heads, blocks) : dim3(blocks, heads);
  dkdv_kernel<T, kD, kWarps, kHeavyFirst><<<grid, 32 * kWarps, smem, s>>>(N, Np, p.causal, p.softmax_scale(), q, k, v, dout, w.l2, w.dsum,
                                                  w.dq_acc, static_cast<T*>(a.dk), static_cast<T*>(a.dv));
  FA_CHECK_LAUNCH();

  const std::size_t n4 = p.elems() / 4;
  convert_kernel<T><<<unsigned((n4 + 255) / 256), 256, 0, s>>>(p.elems(), p.softmax_scale(), w.dq_acc,
                                                               static_cast<T*>(a.dq));
  FA_CHECK_LAUNCH();
}

template <int kWarps, bool kHeavyFirst>
void run_version(const Problem& p, const NativeBwdArgs& a, void* ws, Stream s) {
  const bool bf16 = p.dtype == DType::bf16;
  if (p.d == 64)
    bf16 ? launch<__nv_bfloat16, 64, kWarps, kHeavyFirst>(p, a, ws, s) : launch<__half, 64, kWarps, kHeavyFirst>(p, a, ws, s);
  else
    bf16 ? launch<__nv_bfloat16, 128, kWarps, kHeavyFirst>(p, a, ws, s) : launch<__half, 128, kWarps, kHeavyFirst>(p, a, ws, s);
}

std::size_t workspace_bytes(const Problem& p) {
  return (p.elems() + 2 * p.heads() * std::size_t(padded_rows(p.N))) * sizeof(float);
}

}  // namespace

/// b4, the production backward: b3 with b1's 64-key blocks at d = 64 (3 blocks of 4
/// warps per SM there instead of one of 8).
void run_b4(const Problem& p, const NativeBwdArgs& a, void* ws, Stream s) {
  static_assert(backward_keys(64) == 64 && backward_keys(128) == 128, "the CPU model uses b4's blocks");
  p.d == 64 ? run_version<4, true>(p, a, ws, s) : run_version<8, true>(p, a, ws, s);
}
constexpr const char* kWorkspace = "the fp32 dQ accumulator and D, L·log2 e (B·H·N·(d + 2) floats)";
const GpuBackward kBackward{"step06 backward", 128, workspace_bytes, kWorkspace, nullptr, run_b4, kSupportedD};
const GpuBackward kBackwardVersions[kBackwardVersionCount] = {
    {"b1: 64 keys per block, 4 warps", 128, workspace_bytes, kWorkspace, nullptr, run_version<4, false>, kSupportedD},
    {"b2: 128 keys per block, 8 warps", 128, workspace_bytes, kWorkspace, nullptr, run_version<8, false>, kSupportedD},
    {"b3: + heaviest key blocks first", 128, workspace_bytes, kWorkspace, nullptr, run_version<8, true>, kSupportedD},
    {"b4: b3 with 64-key blocks at d = 64", 128, workspace_bytes, kWorkspace, nullptr, run_b4, kSupportedD},
};

}  // namespace fa::step06
