// The problem every step solves, and the tensors it reads and writes.
//
// Layout (all steps, all tensors): float32, row-major, shape [B, H, N, d] for
// Q, K, V, O, dO, dQ, dK, dV and [B, H, N] for the log-sum-exp L. Element
// (b, h, n, c) lives at ((b*H + h)*N + n)*d + c: one head is a contiguous N×d
// matrix, so a kernel sees B·H independent attention problems.
#pragma once

#include <algorithm>
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
/// With a window (FlashAttention's window_size = (left, right)), the query at position t sees
/// the keys t − left … t + right only; −1 leaves a side unbounded, and causal caps right at 0.
struct Problem {
  int B = 1, H = 1, N = 1, d = 64;
  int N_kv = 0;                   ///< keys (and values) per head; 0: N, self-attention
  int H_kv = 0;                   ///< K/V heads; 0: H (one per query head)
  bool causal = false;            ///< query i attends to keys j <= i + keys() − N only
  std::optional<float> scale{};   ///< softmax scale; default 1/sqrt(d)
  int window_left = -1;           ///< keys a query sees before its own position; -1: all of them
  int window_right = -1;          ///< keys a query sees after its own position; -1: all (causal: none)
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
  bool windowed() const { return window_left >= 0 || window_right >= 0; }
  // The band of scores that count: query row i sits at position i + keys() − N and sees keys
  // first_key(i) … last_key(i); key k is seen by query rows first_query(k) … last_query(k)
  // (none where first > last). Both ends move up with i and with k.
  int first_key(int i) const { return window_left < 0 ? 0 : std::max(0, i + keys() - N - window_left); }
  int right() const { return causal ? 0 : window_right; }  ///< the band's right side (-1: unbounded)
  int last_key(int i) const { return right() < 0 ? keys() - 1 : std::min(keys() - 1, i + keys() - N + right()); }
  int first_query(int k) const { return right() < 0 ? 0 : std::max(0, k - right() - (keys() - N)); }
  int last_query(int k) const { return window_left < 0 ? N - 1 : std::min(N - 1, k + window_left - (keys() - N)); }
  bool sees(int i, int k) const { return first_key(i) <= k && k <= last_key(i); }
  /// Forward FLOPs by the usual convention 4·B·H·pairs·d (two N×N_kv×d matrix products).
  double flops_forward() const { return 4.0 * double(heads()) * pairs() * d; }
  /// The (query, key) pairs a head computes: N·N_kv, N²/2 off with the causal mask (the
  /// convention), and with a window the band's pairs, counted — so a window that leaves the
  /// causal band as it is counts its exact N(N+1)/2, not the convention's N²/2.
  double pairs() const;
  std::string str() const;        ///< "B=2 H=3 N=113 d=64 causal scale=0.125" (and "N_kv=…", "H_kv=…" when set)
  /// Throws fa::Error on N, d, B, H < 1, N_kv < 0, H_kv < 0 or not dividing H, causal with
  /// fewer keys than queries, or a bad scale.
  void validate() const;
  /// What a step's kernel or model takes beyond self-attention, one K/V head a query head
  /// (flags, or-ed).
  enum Takes : unsigned {
    kSelfAttention = 0,
    kDecode = 1,  ///< fewer queries than keys (N_kv ≠ N), and grouped K/V heads
    kGroups = 2,  ///< grouped K/V heads (H_kv ≠ H)
    kWindow = 4,  ///< a window
  };
  /// validate(), and throws unless `who` (a step's kernel or model) takes what p asks for.
  void validate_for(const std::string& who, unsigned takes) const;
  /// validate_for(who, kSelfAttention): as many keys as queries, one K/V head a query head, no window.
  void validate_self_attention(const std::string& who) const { validate_for(who, kSelfAttention); }
};

/// A ragged batch: sequences of different lengths packed into p's N rows (B = 1), sequence b
/// being rows offsets[b] … offsets[b + 1] − 1 of every head (FlashAttention's cu_seqlens).
/// Throws fa::Error unless B = 1 and the offsets start at 0, rise by at least 1 and end at N.
void require_offsets(const Problem& p, const std::vector<int>& offsets);

/// A paged K/V cache on the host (vLLM's PagedAttention; step 08): K and V as a pool of pages
/// of `page` positions, a page [H_kv, page, d] (each K/V head's rows of those positions,
/// contiguous); sequence b's keys at positions page·x … in page table[b·pages_per_seq + x].
/// Sequence b holds lengths[b] keys (empty: p.keys() each), its N queries the last N of them;
/// p.keys() is the longest, the table's width its pages.
struct PagedKv {
  int page = 16;             ///< positions a page: 16 … 256, a multiple of 16 (a warp's keys)
  int pool = 0;              ///< pages in K and V: they hold pool·H_kv·page·d elements each
  std::vector<int> table;    ///< B × pages_per_seq(p) page numbers, row by row
  std::vector<int> lengths;  ///< keys of each sequence, N … p.keys(); empty: p.keys()
  int pages_per_seq(const Problem& p) const { return (p.keys() + page - 1) / page; }
  int length(const Problem& p, int b) const { return lengths.empty() ? p.keys() : lengths[std::size_t(b)]; }
  /// Throws fa::Error unless the table, the lengths and K, V of k_elems elements fit p.
  void validate(const Problem& p, std::size_t k_elems) const;
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
