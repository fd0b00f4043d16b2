// Step 06 kernel (version 1): the online-softmax forward on tensor cores.
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

/// Two consecutive 16-bit elements of shared memory as one register.
template <class T>
__device__ __forceinline__ std::uint32_t ld2(const T* p) {
  return *reinterpret_cast<const std::uint32_t*>(p);
}
/// Two 16-bit elements from different rows (the B operand of P·V, V row-major).
template <class T>
__device__ __forceinline__ std::uint32_t ld2_rows(const T* p0, const T* p1) {
  const std::uint16_t lo = *reinterpret_cast<const std::uint16_t*>(p0), hi = *reinterpret_cast<const std::uint16_t*>(p1);
  return std::uint32_t(lo) | (std::uint32_t(hi) << 16);
}

/// rows×kD tile from global (rows consecutive in memory) to shared memory with
/// row stride kD + 8, 16 bytes per thread per step; rows at or past `valid` are 0.
template <class T, int kD>
__device__ __forceinline__ void load_tile(T* dst, const T* __restrict__ src, int rows, int valid) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per row
  for (int e = threadIdx.x; e < rows * kChunks; e += kThreads) {
    const int r = e / kChunks, c = (e % kChunks) * 8;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (r < valid) x = *reinterpret_cast<const uint4*>(src + std::size_t(r) * kD + c);
    *reinterpret_cast<uint4*>(dst + r * (kD + 8) + c) = x;
  }
}

template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(int N, bool causal, float scale, const T* __restrict__ q, const T* __restrict__ k,
                   const T* __restrict__ v, T* __restrict__ o, float* __restrict__ lse) {
  constexpr int ld = kD + 8;  // +16 bytes per row: the 8 quads of a fragment load hit 32 different banks
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* Qs = reinterpret_cast<T*>(smem_raw);  // [kBr][ld]
  T* Ks = Qs + kBr * ld;                   // [kBc][ld]
  T* Vs = Ks + kBc * ld;                   // [kBc][ld]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int q0 = blockIdx.x * kBr, r0 = 16 * warp;  // this warp's first row in the block
  const std::size_t head = std::size_t(blockIdx.y) * N * kD;

  load_tile<T, kD>(Qs, q + head + std::size_t(q0) * kD, kBr, N - q0);
  __syncthreads();
  // Q_i stays in registers as A fragments for the whole loop.
  std::uint32_t qf[kD / 16][4];
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const T* base = Qs + (r0 + g) * ld + 16 * kk + 2 * t;
    qf[kk][0] = ld2(base);
    qf[kk][1] = ld2(base + 8 * ld);
    qf[kk][2] = ld2(base + 8);
    qf[kk][3] = ld2(base + 8 * ld + 8);
  }

  float acc[kD / 8][4] = {};  // O: rows g, g+8 × columns 8·dt + 2t, +1
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g+8
  const int last = causal ? (min(N, q0 + kBr) - 1) / kBc : (N - 1) / kBc;

  for (int j = 0; j <= last; ++j) {
    const int k0 = j * kBc;
    __syncthreads();  // every warp is done with the previous K_j, V_j
    load_tile<T, kD>(Ks, k + head + std::size_t(k0) * kD, kBc, N - k0);
    load_tile<T, kD>(Vs, v + head + std::size_t(k0) * kD, kBc, N - k0);
    __syncthreads();

    // S = Q_i·K_jᵀ: 16×64 per warp, 8 n-tiles of 8 keys.
    float s[kBc / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
#pragma unroll
      for (int nt = 0; nt < kBc / 8; ++nt) {
        const T* kb = Ks + (8 * nt + g) * ld + 16 * kk + 2 * t;  // B[k][n] = K[n][k]: contiguous in K's row
        Mma<T>::run(s[nt], qf[kk], ld2(kb), ld2(kb + 8));
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
      const T* vb = Vs + (16 * c + 2 * t) * ld + g;  // B[k][n] = V[k][n]: two rows per register
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt) {
        const T* p = vb + 8 * dt;
        Mma<T>::run(acc[dt], a, ld2_rows(p, p + ld), ld2_rows(p + 8 * ld, p + 9 * ld));
      }
    }
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
  const std::size_t smem = std::size_t(kBr + 2 * kBc) * (kD + 8) * sizeof(T);
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
