// The vocabulary of the CPU models: explicit "HBM" arrays that count every
// element read and written, and an on-chip scratch of M elements that refuses
// to hold more. A step's CPU model runs the kernel's algorithm, tile for tile,
// over these; its traffic counts are what the step's note derives by hand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/problem.hpp"

namespace fa {

/// Elements (not bytes) moved between HBM and the chip; ×4 for fp32 bytes.
struct Traffic {
  std::uint64_t read = 0, written = 0;
  std::uint64_t total() const { return read + written; }
};

/// A tensor in device memory. load()/store() count; peek() is for the caller
/// that owns the result (no traffic) and is never used inside a model's loops.
class Hbm {
 public:
  Hbm(std::vector<float> init, Traffic& t) : data_(std::move(init)), t_(&t) {}
  Hbm(std::size_t n, Traffic& t, float fill = 0.0f) : data_(n, fill), t_(&t) {}
  float load(std::size_t i) const {
    ++t_->read;
    return data_[i];
  }
  void store(std::size_t i, float v) {
    ++t_->written;
    data_[i] = v;
  }
  std::size_t size() const { return data_.size(); }
  const std::vector<float>& peek() const { return data_; }
  std::vector<float> take() { return std::move(data_); }

 private:
  std::vector<float> data_;
  Traffic* t_;
};

/// On-chip memory (shared memory + registers) of M elements. Tiles are carved
/// out of it; asking for more than M throws, so a model cannot cheat by holding
/// a whole N×N matrix "on chip".
class OnChip {
 public:
  explicit OnChip(std::size_t capacity) : capacity_(capacity) {}
  std::vector<float> tile(std::size_t n, const char* what) {
    used_ += n;
    if (used_ > capacity_)
      throw Error(std::string("on-chip memory exceeded by tile '") + what + "': " + std::to_string(used_) +
                  " > M = " + std::to_string(capacity_) + " elements");
    return std::vector<float>(n, 0.0f);
  }
  std::size_t used() const { return used_; }

 private:
  std::size_t capacity_, used_ = 0;
};

/// What a CPU model returns for a forward pass.
struct ModelForward {
  ForwardOut out;
  Traffic traffic;
};
/// What a CPU model returns for a backward pass.
struct ModelBackward {
  Grads grads;
  Traffic traffic;
};

}  // namespace fa
