// Step 06 kernel (version 2): the online-softmax forward on tensor cores.
// Version 2 over version 1: fragments come from shared memory by ldmatrix (one
// instruction per four 8×8 tiles; .trans for V), and K/V tiles arrive by cp.async
// into two buffers, so tile j+1 is in flight while tile j is multiplied.
//
// A thread block of 4 warps owns B_r = 64 query rows; warp w owns rows 16w..16w+15.
// Every product is mma.sync.m16n8k16 (A 16×16 row-major, B 16×8 column-major, fp32
// C 16×8). In the fragments, lane = 4g + t holds:
//   A: rows g and g+8, columns 2t, 2t+1 and 2t+8, 2t+9   (4 registers of 2 halves)
//   B: rows (k) 2t, 2t+1 and 2t+8, 2t+9, column (n) g     (2 registers)
//   C: rows g and g+8, columns 2t, 2t+1                   (4 floats)
// So a row of S lives in the 4 lanes of a quad: its max and sum are two shuffles.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/cuda_check.cuh"
#include "steps/03_online_softmax/online_softmax.hpp"
#include "steps/06_tensor_cores/step06.hpp"

namespace fa::step06 {
namespace {

constexpr int kWarps = kBr / 16, kThreads = 32 * kWarps;

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
};

/// Four 8×8 tiles of 16-bit elements from shared memory: lane l gives the address
/// of row l % 8 of tile l / 8; lane 4g + t receives, in register i, elements
/// (g, 2t) and (g, 2t + 1) of tile i — exactly an mma fragment. kTrans delivers
/// each tile transposed: elements (2t, g) and (2t + 1, g).
template <bool kTrans = false>
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* row_addr) {
  const auto a = static_cast<std::uint32_t>(__cvta_generic_to_shared(row_addr));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

/// rows×kD tile from global (rows consecutive in memory) to shared memory with row
/// stride kD + 8, 16 bytes per thread per copy, asynchronously (cp.async: no
/// registers on the way). Rows at or past `valid` are zero-filled: a source size
/// of 0 bytes reads nothing.
template <class T, int kD>
__device__ __forceinline__ void copy_tile_async(T* dst, const T* __restrict__ src, int rows, int valid) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per row
  for (int e = threadIdx.x; e < rows * kChunks; e += kThreads) {
    const int r = e / kChunks, c = (e % kChunks) * 8;
    const auto d = static_cast<std::uint32_t>(__cvta_generic_to_shared(dst + r * (kD + 8) + c));
    const T* g = src + std::size_t(r < valid ? r : 0) * kD + c;  // a valid address even when not read
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(g), "r"(r < valid ? 16 : 0));
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(int N, bool causal, float scale, const T* __restrict__ q, const T* __restrict__ k,
                   const T* __restrict__ v, T* __restrict__ o, float* __restrict__ lse) {
  constexpr int ld = kD + 8;  // +16 bytes per row: the 8 rows of an ldmatrix tile hit 32 different banks
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* Qs = reinterpret_cast<T*>(smem_raw);  // [kBr][ld]
  T* Ks = Qs + kBr * ld;                   // [2][kBc][ld]: two buffers
  T* Vs = Ks + 2 * kBc * ld;               // [2][kBc][ld]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int q0 = blockIdx.x * kBr, r0 = 16 * warp;  // this warp's first row in the block
  const std::size_t head = std::size_t(blockIdx.y) * N * kD;
  // The row and column offsets this lane addresses in an ldmatrix_x4 whose tiles are
  // (rows +0, cols +0), (rows +8, cols +0), (rows +0, cols +8), (rows +8, cols +8).
  const int lrow = lane % 8 + 8 * ((lane / 8) % 2), lcol = 8 * (lane / 16);

  float acc[kD / 8][4] = {};  // O: rows g, g+8 × columns 8·dt + 2t, +1
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g+8
  std::uint32_t qf[kD / 16][4];  // Q_i as A fragments, loaded once
  const int last = causal ? (min(N, q0 + kBr) - 1) / kBc : (N - 1) / kBc;

  // Prologue: Q_i and the first K/V tile, one group of copies.
  copy_tile_async<T, kD>(Qs, q + head + std::size_t(q0) * kD, kBr, N - q0);
  copy_tile_async<T, kD>(Ks, k + head, kBc, N);
  copy_tile_async<T, kD>(Vs, v + head, kBc, N);
  cp_async_commit();

  for (int j = 0; j <= last; ++j) {
    const int k0 = j * kBc, buf = j % 2;
    if (j < last) {  // start tile j+1 into the other buffer (free since the barrier ending iteration j-1)
      const int k1 = k0 + kBc;
      copy_tile_async<T, kD>(Ks + (1 - buf) * kBc * ld, k + head + std::size_t(k1) * kD, kBc, N - k1);
      copy_tile_async<T, kD>(Vs + (1 - buf) * kBc * ld, v + head + std::size_t(k1) * kD, kBc, N - k1);
      cp_async_commit();
      cp_async_wait<1>();  // tile j (and Q) landed; tile j+1 may still be in flight
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // every thread's copies of tile j are visible to all
    const T* Kb = Ks + buf * kBc * ld;
    const T* Vb = Vs + buf * kBc * ld;
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) ldmatrix_x4(qf[kk], Qs + (r0 + lrow) * ld + 16 * kk + lcol);
    }

    // S = Q_i·K_jᵀ: 16×64 per warp, 8 n-tiles of 8 keys.
    float s[kBc / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
#pragma unroll
      for (int nt = 0; nt < kBc / 8; nt += 2) {
        // B[k][n] = K[n][k], two n-tiles per ldmatrix: tiles (keys 8nt.., dims 16kk..), (same keys,
        // dims +8), (keys +8, dims 16kk..), (keys +8, dims +8). Lane rows: key 8nt + lane % 8 + 8·(lane / 16).
        std::uint32_t b[4];
        ldmatrix_x4(b, Kb + (8 * nt + lane % 8 + 8 * (lane / 16)) * ld + 16 * kk + 8 * ((lane / 8) % 2));
        Mma<T>::run(s[nt], qf[kk], b[0], b[1]);
        Mma<T>::run(s[nt + 1], qf[kk], b[2], b[3]);
      }

    // Online softmax on the fragments: half h = 0 is row g, h = 1 is row g + 8.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = q0 + r0 + g + 8 * h;
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = k0 + 8 * nt + 2 * t + e;
          float& x = s[nt][2 * h + e];
          x = (col >= N || (causal && col > row)) ? -INFINITY : scale * x;
          mx = fmaxf(mx, x);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the quad holding this row
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[h], mx), alpha = online::rescale(m[h], m_new);
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kBc / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[nt][2 * h + e];
          x = online::prob(x, m_new);
          sum += x;
        }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      l[h] = alpha * l[h] + sum;
      m[h] = m_new;
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt) acc[dt][2 * h] *= alpha, acc[dt][2 * h + 1] *= alpha;
    }

    // O += P·V_j: the S accumulators of n-tiles 2c and 2c+1 are exactly the A
    // fragment of key chunk c, once rounded to 16 bits.
#pragma unroll
    for (int c = 0; c < kBc / 16; ++c) {
      const std::uint32_t a[4] = {Mma<T>::pack(s[2 * c][0], s[2 * c][1]), Mma<T>::pack(s[2 * c][2], s[2 * c][3]),
                                  Mma<T>::pack(s[2 * c + 1][0], s[2 * c + 1][1]),
                                  Mma<T>::pack(s[2 * c + 1][2], s[2 * c + 1][3])};
#pragma unroll
      for (int dt = 0; dt < kD / 8; dt += 2) {
        // B[k][n] = V[k][n], transposed by ldmatrix: tiles (keys 16c.., dims 8dt..), (keys +8, same
        // dims), (keys 16c.., dims +8), (keys +8, dims +8). Lane rows: key 16c + lrow, column 8dt + lcol.
        std::uint32_t b[4];
        ldmatrix_x4<true>(b, Vb + (16 * c + lrow) * ld + 8 * dt + lcol);
        Mma<T>::run(acc[dt], a, b[0], b[1]);
        Mma<T>::run(acc[dt + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with buffer `buf` before iteration j+1 refills it
  }

  // Epilogue: O = acc / ℓ in 16 bits, L = m + log ℓ.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = q0 + r0 + g + 8 * h;
    if (row >= N) continue;
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt)
      *reinterpret_cast<std::uint32_t*>(o + head + std::size_t(row) * kD + 8 * dt + 2 * t) =
          Mma<T>::pack(acc[dt][2 * h] / l[h], acc[dt][2 * h + 1] / l[h]);
    if (t == 0) lse[std::size_t(blockIdx.y) * N + row] = online::lse(m[h], l[h]);
  }
}

template <class T, int kD>
void launch(const Problem& p, const NativeFwdArgs& a, Stream s) {
  const std::size_t smem = std::size_t(kBr + 4 * kBc) * (kD + 8) * sizeof(T);
  set_smem_limit(forward_kernel<T, kD>, smem);
  const dim3 grid((p.N + kBr - 1) / kBr, unsigned(p.heads()));
  forward_kernel<T, kD><<<grid, kThreads, smem, s>>>(p.N, p.causal, p.softmax_scale(), static_cast<const T*>(a.q),
                                                      static_cast<const T*>(a.k), static_cast<const T*>(a.v),
                                                      static_cast<T*>(a.o), a.lse);
  FA_CHECK_LAUNCH();
}

void run_native(const Problem& p, const NativeFwdArgs& a, void*, Stream s) {
  const bool bf16 = p.dtype == DType::bf16;
  if (p.d == 64) bf16 ? launch<__nv_bfloat16, 64>(p, a, s) : launch<__half, 64>(p, a, s);
  else bf16 ? launch<__nv_bfloat16, 128>(p, a, s) : launch<__half, 128>(p, a, s);
}

constexpr int kSupportedD[] = {64, 128, 0};

}  // namespace

const GpuForward kForward{"step06 forward", 128, no_workspace, "", nullptr, run_native, kSupportedD};

}  // namespace fa::step06
