// CUDA error checking: every runtime call and every launch is checked, and a
// failure throws fa::Error naming the call, the file and the line.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "common/problem.hpp"

namespace fa {
[[noreturn]] inline void cuda_fail(cudaError_t e, const char* call, const char* file, int line) {
  throw Error(std::string("CUDA error: ") + call + " failed at " + file + ":" + std::to_string(line) + ": " +
              cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
}  // namespace fa

#define FA_CUDA_CHECK(call)                                        \
  do {                                                             \
    cudaError_t fa_err_ = (call);                                  \
    if (fa_err_ != cudaSuccess) ::fa::cuda_fail(fa_err_, #call, __FILE__, __LINE__); \
  } while (0)

/// After every kernel launch: catches bad launch configurations at once.
#define FA_CHECK_LAUNCH() FA_CUDA_CHECK(cudaGetLastError())

namespace fa {
/// Ceiling division, for grid sizes and tile counts.
template <class T>
constexpr __host__ __device__ T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

/// Raises a kernel's dynamic shared-memory limit above the default 48 KB when needed; a
/// GPU whose blocks may not take that much (an A100 gives 163 KiB, an RTX 30xx/40xx 99 KiB)
/// gets one clear error instead of a failed launch.
template <class Kernel>
void set_smem_limit(Kernel kernel, std::size_t bytes) {
  if (bytes <= 48 * 1024) return;
  int dev = 0, most = 0;
  FA_CUDA_CHECK(cudaGetDevice(&dev));
  FA_CUDA_CHECK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (bytes > std::size_t(most))
    throw Error("this kernel needs " + std::to_string(bytes / 1024) + " KiB of shared memory a block, and this GPU gives " +
                std::to_string(most / 1024) + " KiB (a smaller head dimension, or a GPU with more, runs it)");
  FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

namespace detail {
/// kernel<<<grid, block, smem, s>>>(args...) with the launch attributes attrs[0, n).
template <class... Params, class... Args>
void launch_with(const cudaLaunchAttribute* attrs, unsigned n, void (*kernel)(Params...), dim3 grid, dim3 block,
                 std::size_t smem, cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = const_cast<cudaLaunchAttribute*>(attrs);
  cfg.numAttrs = n;
  FA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}
/// The launch attribute that groups consecutive blocks into clusters of `blocks` along x.
inline cudaLaunchAttribute cluster_of(int blocks) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(blocks);
  attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
  return attr;
}
}  // namespace detail

/// kernel<<<grid, block, smem, s>>>(args...), but where `early`, launched before the kernel
/// ahead of it in the stream has finished: programmatic dependent launch (CUDA C++
/// Programming Guide, "Programmatic Dependent Launch and Synchronization"). Its blocks are
/// scheduled once every block of that kernel has called
/// cudaTriggerProgrammaticLaunchCompletion() or exited, and each thread that reads what
/// that kernel writes must first wait in cudaGridDependencySynchronize() (sm_90 and up; a
/// kernel with no such wait must not be launched early). Launch latency and whatever a
/// block does before its wait then run under the kernel before it.
template <class... Params, class... Args>
void launch_early(bool early, void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t s,
                  Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  detail::launch_with(&attr, early ? 1 : 0, kernel, grid, block, smem, s, std::forward<Args>(args)...);
}

/// kernel<<<grid, block, smem, s>>>(args...) with every `cluster` consecutive blocks (along
/// x; grid.x a multiple of it) one thread block cluster (sm_90 and up; CUDA C++ Programming
/// Guide, "Thread Block Clusters"): scheduled together on the SMs of one GPC, and able to
/// read and write each other's shared memory.
template <class... Params, class... Args>
void launch_clustered(int cluster, void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t s,
                      Args&&... args) {
  const cudaLaunchAttribute attr = detail::cluster_of(cluster);
  detail::launch_with(&attr, 1, kernel, grid, block, smem, s, std::forward<Args>(args)...);
}

/// How many clusters of `cluster` blocks of kernel (block threads, smem bytes of dynamic
/// shared memory, its limit already raised) the current GPU runs at once: the occupancy
/// calculator's count, which knows that a cluster's blocks share one GPC.
template <class... Params>
int max_active_clusters(void (*kernel)(Params...), int cluster, dim3 block, std::size_t smem) {
  const cudaLaunchAttribute attr = detail::cluster_of(cluster);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(cluster));
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = const_cast<cudaLaunchAttribute*>(&attr);
  cfg.numAttrs = 1;
  int n = 0;
  FA_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
  return n;
}
}  // namespace fa
