// FA_HD marks a function both the CPU model and the kernel call: one copy of
// the arithmetic, compiled by g++ for the model and by nvcc for the GPU.
#pragma once
#if defined(__CUDACC__)
#define FA_HD __host__ __device__ __forceinline__
#else
#define FA_HD inline
#endif
