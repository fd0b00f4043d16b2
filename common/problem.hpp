// The problem every step solves, and the tensors it reads and writes.
//
// Layout (all steps, all tensors): float32, row-major, shape [B, H, N, d] for
// Q, K, V, O, dO, dQ, dK, dV and [B, H, N] for the log-sum-exp L. Element
// (b, h, n, c) lives at ((b*H + h)*N + n)*d + c: one head is a contiguous N×d
// matrix, so a kernel sees B·H independent attention problems.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace fa {

/// Every error we report to a user: one clear line, thrown, never exit().
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The element type of Q, K, V and O on the device. The host interface is float32
/// throughout; a step that computes in 16 bits rounds its inputs on the way in.
enum class DType { fp32, bf16, fp16 };
const char* dtype_name(DType t);
DType parse_dtype(const std::string& name);  ///< "fp32", "bf16", "fp16"; throws fa::Error
/// x rounded to the nearest value of type t (ties to even), returned as float.
float round_to(DType t, float x);

/// One attention problem: B batches × H heads of N queries and N keys of width d.
struct Problem {
  int B = 1, H = 1, N = 1, d = 64;
  bool causal = false;            ///< query i attends to keys j <= i only
  std::optional<float> scale{};   ///< softmax scale; default 1/sqrt(d)
  DType dtype = DType::fp32;      ///< element type of Q, K, V, O on the device

  float softmax_scale() const { return scale ? *scale : 1.0f / std::sqrt(float(d)); }
  std::size_t heads() const { return std::size_t(B) * H; }
  std::size_t rows() const { return heads() * N; }        ///< elements of L
  std::size_t elems() const { return rows() * d; }        ///< elements of Q (and K, V, O)
  /// Forward FLOPs by the usual convention 4·B·H·N²·d (two N×N×d matrix products),
  /// halved for causal.
  double flops_forward() const {
    double f = 4.0 * double(heads()) * double(N) * double(N) * d;
    return causal ? f / 2 : f;
  }
  std::string str() const;        ///< "B=2 H=3 N=113 d=64 causal scale=0.125"
  void validate() const;          ///< throws fa::Error on N, d, B, H < 1 or a bad scale
};

/// Q, K, V on the host.
struct Qkv {
  std::vector<float> q, k, v;
};

/// What a forward pass returns: O, and L = m + log(l) per row (softmax steps only).
struct ForwardOut {
  std::vector<float> o, lse;
};

/// What a backward pass returns.
struct Grads {
  std::vector<float> dq, dk, dv;
};

/// Deterministic inputs: uniform in [-amplitude, amplitude] from a seed
/// (splitmix64, identical on every platform).
Qkv random_qkv(const Problem& p, std::uint64_t seed, float amplitude = 1.0f);
std::vector<float> random_tensor(std::size_t n, std::uint64_t seed, float amplitude = 1.0f);

/// Throws fa::Error naming `what` if any element is NaN or infinite.
void require_finite(const std::vector<float>& x, const std::string& what);

}  // namespace fa
