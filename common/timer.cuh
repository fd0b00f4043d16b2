// Timing with CUDA events (device time between two points of a stream), and an
// L2 flush so that each repeat starts with cold caches, as a real layer would.
#pragma once

#include <algorithm>
#include <vector>

#include "common/cuda_check.cuh"
#include "common/device_buffer.cuh"

namespace fa {

class EventTimer {
 public:
  EventTimer() {
    FA_CUDA_CHECK(cudaEventCreate(&start_));
    FA_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start(cudaStream_t s = nullptr) { FA_CUDA_CHECK(cudaEventRecord(start_, s)); }
  /// Records the stop event, waits for it and returns the elapsed milliseconds.
  float stop(cudaStream_t s = nullptr) {
    FA_CUDA_CHECK(cudaEventRecord(stop_, s));
    FA_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    FA_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

 private:
  cudaEvent_t start_{}, stop_{};
};

/// Writing a buffer twice the size of L2 evicts whatever the last repeat left there.
class L2Flusher {
 public:
  L2Flusher() {
    int dev = 0, l2 = 0;
    FA_CUDA_CHECK(cudaGetDevice(&dev));
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    buf_ = DeviceBuffer<char>(std::size_t(2) * std::max(l2, 1 << 20));
  }
  void flush(cudaStream_t s = nullptr) { FA_CUDA_CHECK(cudaMemsetAsync(buf_.get(), 0, buf_.size(), s)); }

 private:
  DeviceBuffer<char> buf_;
};

}  // namespace fa
