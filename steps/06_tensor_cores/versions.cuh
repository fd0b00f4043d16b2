// What the versions of note 06's tables share and the production kernels do not: the
// first order of the two-stage cp.async pipeline. The production kernels take
// mma::begin_block's order (the copies after the barrier, one barrier an iteration).
#pragma once

#include "common/cuda/mma.cuh"

namespace fa::step06 {

/// The top of iteration i: with kLateLoad, mma::begin_block. Otherwise the first
/// order: issue block i+1's copies (the other buffer is free since the barrier that
/// ended iteration i-1), wait for block i only, barrier — and the iteration ends with
/// a second barrier (version_end_block) before the next one refills its buffer.
template <bool kLateLoad, class F>
__device__ __forceinline__ void version_begin_block(int next, int end, F&& load_next) {
  if constexpr (kLateLoad) {
    mma::begin_block(next, end, load_next);
  } else {
    if (next < end) {
      load_next();
      mma::cp_async_commit();
      mma::cp_async_wait<1>();  // block i landed; block i+1 may still be in flight
    } else {
      mma::cp_async_wait<0>();
    }
    __syncthreads();  // every thread's copies of block i are visible to all
  }
}
/// The end of an iteration: in the first order, every warp must be done with this
/// iteration's buffer before the next iteration refills it.
template <bool kLateLoad>
__device__ __forceinline__ void version_end_block() {
  if constexpr (!kLateLoad) __syncthreads();
}

}  // namespace fa::step06
