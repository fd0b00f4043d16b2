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

/// One attention problem: B batches × H heads of N queries and N keys of width d — or,
/// with N_kv set, N queries against N_kv keys (decoding: a few new queries against a long
/// cache), the queries being the last N of the N_kv positions; with H_kv set, grouped-query
/// attention: H/H_kv consecutive query heads share one K/V head (h reads K/V head h / (H/H_kv)).
struct Problem {
  int B = 1, H = 1, N = 1, d = 64;
  int N_kv = 0;                   ///< keys (and values) per head; 0: N, self-attention
  int H_kv = 0;                   ///< K/V heads; 0: H (one per query head)
  bool causal = false;            ///< query i attends to keys j <= i + keys() − N only
  std::optional<float> scale{};   ///< softmax scale; default 1/sqrt(d)
  DType dtype = DType::fp32;      ///< element type of Q, K, V, O on the device

  float softmax_scale() const { return scale ? *scale : 1.0f / std::sqrt(float(d)); }
  std::size_t heads() const { return std::size_t(B) * H; }
  std::size_t rows() const { return heads() * N; }        ///< elements of L
  std::size_t elems() const { return rows() * d; }        ///< elements of Q (and O; K and V: kv_elems)
  int keys() const { return N_kv ? N_kv : N; }             ///< keys per head
  int kv_heads_per_batch() const { return H_kv ? H_kv : H; }  ///< K/V heads per batch
  int group() const { return H / kv_heads_per_batch(); }       ///< query heads per K/V head
  std::size_t kv_heads() const { return std::size_t(B) * kv_heads_per_batch(); }  ///< K/V heads in all
  /// The K/V head that query head bh = b·H + h reads: b·H_kv + h / group().
  std::size_t kv_head(std::size_t bh) const { return bh / H * kv_heads_per_batch() + bh % H / group(); }
  std::size_t kv_elems() const { return kv_heads() * std::size_t(keys()) * d; }  ///< elements of K (and V)
  /// Forward FLOPs by the usual convention 4·B·H·N·N_kv·d (two N×N_kv×d matrix
  /// products); causal: the pairs a query sees, N·N_kv − N²/2 (N²/2 when N_kv = N).
  double flops_forward() const {
    const double pairs = causal ? double(N) * keys() - double(N) * N / 2 : double(N) * keys();
    return 4.0 * double(heads()) * pairs * d;
  }
  std::string str() const;        ///< "B=2 H=3 N=113 d=64 causal scale=0.125" (and "N_kv=…", "H_kv=…" when set)
  /// Throws fa::Error on N, d, B, H < 1, N_kv < 0, H_kv < 0 or not dividing H, causal with
  /// fewer keys than queries, or a bad scale.
  void validate() const;
  /// validate(), and throws unless there are as many keys as queries and one K/V head per
  /// query head: `who` (a step's kernel or model) computes self-attention only.
  void validate_self_attention(const std::string& who) const;
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
