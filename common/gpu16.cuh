// 16-bit tensors between the host's float32 and the device (bf16 or fp16), and poisoned
// outputs: what gpu.cu's wrappers use, for code that drives its own launches (step 09's
// ring). Needs CUDA (DeviceBuffer).
#pragma once

#include <cstdint>
#include <vector>

#include "common/device_buffer.cuh"
#include "common/problem.hpp"

namespace fa::gpu {

/// The poison pattern of 16-bit outputs: a NaN in both formats, read back as
/// compare()'s poison.
constexpr std::uint16_t kPoison16 = 0x7FDE;
/// x rounded to t (to nearest, ties to even) on the device.
DeviceBuffer<std::uint16_t> upload16(DType t, const std::vector<float>& x);
/// Back to float32; the poison pattern as poison_value().
std::vector<float> download16(DType t, const DeviceBuffer<std::uint16_t>& b);
/// n floats holding poison_value().
DeviceBuffer<float> poisoned(std::size_t n);

}  // namespace fa::gpu
