// Warp and block reductions (max and sum) with shuffles.
#pragma once

#include <cuda_runtime.h>

namespace fa {

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

/// Every lane of the warp gets op over the 32 lanes' values (butterfly).
template <class Op>
__device__ __forceinline__ float warp_reduce(float x, Op op) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) x = op(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

/// Every thread of the block gets op over all threads' values. blockDim.x must be
/// a multiple of 32 (at most 1024); `scratch` holds 32 floats of shared memory.
template <class Op>
__device__ float block_reduce(float x, Op op, float* scratch, float identity) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  x = warp_reduce(x, op);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < warps ? scratch[lane] : identity;
  return warp_reduce(x, op);
}

}  // namespace fa
