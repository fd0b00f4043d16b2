#include "common/problem.hpp"

#include <cstring>
#include <sstream>

namespace fa {

std::string Problem::str() const {
  std::ostringstream s;
  s << "B=" << B << " H=" << H << " N=" << N;
  if (keys() != N) s << " N_kv=" << keys();
  if (kv_heads_per_batch() != H) s << " H_kv=" << kv_heads_per_batch();
  s << " d=" << d << (causal ? " causal" : "");
  if (windowed()) s << " window=" << window_left << "," << window_right;
  s
    << " scale=" << softmax_scale();
  if (dtype != DType::fp32) s << " " << dtype_name(dtype);
  return s.str();
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::bf16: return "bf16";
    case DType::fp16: return "fp16";
    default: return "fp32";
  }
}

DType parse_dtype(const std::string& name) {
  for (DType t : {DType::fp32, DType::bf16, DType::fp16})
    if (name == dtype_name(t)) return t;
  throw Error("unknown dtype '" + name + "' (fp32, bf16 or fp16)");
}

float round_to(DType t, float x) {
  if (t == DType::fp16) return static_cast<float>(static_cast<_Float16>(x));
  if (t == DType::bf16) {
    if (std::isnan(x)) return x;
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest, ties to even, on the top 16 bits
    u &= 0xFFFF0000u;
    std::memcpy(&x, &u, 4);
  }
  return x;
}

void Problem::validate() const {
  if (B < 1 || H < 1) throw Error("B and H must be at least 1 (got " + str() + ")");
  if (N < 1) throw Error("N must be at least 1: an empty sequence has no attention (got " + str() + ")");
  if (d < 1) throw Error("d must be at least 1 (got " + str() + ")");
  if (N_kv < 0) throw Error("N_kv must be at least 1, or 0 for as many keys as queries (got " + std::to_string(N_kv) + ")");
  if (H_kv < 0 || (H_kv > 0 && H % H_kv != 0))
    throw Error("H_kv (K/V heads) must divide H (query heads), or be 0 for one K/V head per query head (got " + str() +
                ")");
  if (causal && keys() < N)
    throw Error("causal attention with fewer keys than queries: the queries are the last N of the N_kv positions, "
                "so N_kv must be at least N (got " + str() + ")");
  if (window_left < -1 || window_right < -1 || window_left > (1 << 30) || window_right > (1 << 30))
    throw Error("a window's sides must be 0 to 2^30, or -1 for no bound (got " + str() + ")");
  if (windowed() && keys() < N)
    throw Error("a window with fewer keys than queries: each query must see its own position, so N_kv must be at "
                "least N (got " + str() + ")");
  if (scale && !(std::isfinite(*scale) && *scale > 0))
    throw Error("the softmax scale must be a finite positive number (got " + std::to_string(*scale) + ")");
}

void Problem::validate_for(const std::string& who, unsigned takes) const {
  validate();
  if (keys() != N && !(takes & kDecode))
    throw Error(who + " takes as many keys as queries (got N = " + std::to_string(N) + " queries, N_kv = " +
                std::to_string(keys()) + " keys)");
  if (kv_heads_per_batch() != H && !(takes & (kDecode | kGroups)))
    throw Error(who + " takes one K/V head per query head (got H = " + std::to_string(H) + ", H_kv = " +
                std::to_string(kv_heads_per_batch()) + ")");
  if (windowed() && !(takes & kWindow))
    throw Error(who + " takes no window (got window = " + std::to_string(window_left) + "," +
                std::to_string(window_right) + ")");
}

double Problem::pairs() const {
  if (!windowed()) return causal ? double(N) * keys() - double(N) * N / 2 : double(N) * keys();
  double s = 0;
  for (int i = 0; i < N; ++i) s += last_key(i) - first_key(i) + 1;
  return s;
}

namespace {
std::uint64_t splitmix64(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

std::vector<float> random_tensor(std::size_t n, std::uint64_t seed, float amplitude) {
  std::vector<float> x(n);
  std::uint64_t s = seed;
  for (auto& e : x) {
    // 24 random bits -> [0, 1) exactly representable in float, then [-a, a).
    float u = float(splitmix64(s) >> 40) * (1.0f / 16777216.0f);
    e = amplitude * (2.0f * u - 1.0f);
  }
  return x;
}

Qkv random_qkv(const Problem& p, std::uint64_t seed, float amplitude) {
  return {random_tensor(p.elems(), seed * 3 + 1, amplitude),
          random_tensor(p.kv_elems(), seed * 3 + 2, amplitude),
          random_tensor(p.kv_elems(), seed * 3 + 3, amplitude)};
}

void require_finite(const std::vector<float>& x, const std::string& what) {
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!std::isfinite(x[i]))
      throw Error(what + " holds " + (std::isnan(x[i]) ? "NaN" : "Inf") + " at flat index " +
                  std::to_string(i) + ": attention needs finite inputs");
}

void require_offsets(const Problem& p, const std::vector<int>& offsets) {
  if (p.B != 1) throw Error("a ragged batch is packed into one: B = 1, N the total of its lengths (got " + p.str() + ")");
  if (offsets.size() < 2 || offsets.front() != 0 || offsets.back() != p.N) {
    std::string got;
    for (int x : offsets) got += (got.empty() ? "" : ",") + std::to_string(x);
    throw Error("the offsets of a ragged batch must start at 0 and end at N = " + std::to_string(p.N) + " (got " +
                (got.size() > 60 ? got.substr(0, 60) + "…" : got) + ")");
  }
  for (std::size_t b = 1; b < offsets.size(); ++b)
    if (offsets[b] <= offsets[b - 1])
      throw Error("sequence " + std::to_string(b - 1) + " of the ragged batch is empty: offsets must rise");
}

void PagedKv::validate(const Problem& p, std::size_t k_elems) const {
  if (page < 16 || page > 256 || page % 16)
    throw Error("a page holds 16 to 256 positions, a multiple of 16 (got " + std::to_string(page) + ")");
  if (pool < 1) throw Error("a paged cache needs at least one page");
  const std::size_t want = std::size_t(pool) * p.kv_heads_per_batch() * page * p.d;
  if (k_elems != want)
    throw Error("a pool of " + std::to_string(pool) + " pages of [H_kv, page, d] = [" +
                std::to_string(p.kv_heads_per_batch()) + ", " + std::to_string(page) + ", " + std::to_string(p.d) +
                "] holds " + std::to_string(want) + " elements of K and of V (got " + std::to_string(k_elems) + ")");
  if (table.size() != std::size_t(p.B) * pages_per_seq(p))
    throw Error("the page table must be B × " + std::to_string(pages_per_seq(p)) + " (⌈N_kv / page⌉) entries (got " +
                std::to_string(table.size()) + ")");
  if (!lengths.empty() && lengths.size() != std::size_t(p.B))
    throw Error("the lengths need one entry a sequence, B = " + std::to_string(p.B) + " (got " +
                std::to_string(lengths.size()) + ")");
  for (int b = 0; b < p.B; ++b) {
    const int len = length(p, b);
    if (len < p.N || len > p.keys())
      throw Error("sequence " + std::to_string(b) + " holds " + std::to_string(len) + " keys: its " +
                  std::to_string(p.N) + " queries are its last, and the table holds " + std::to_string(p.keys()));
    for (int x = 0; x * page < len; ++x) {
      const int at = table[std::size_t(b) * pages_per_seq(p) + x];
      if (at < 0 || at >= pool)
        throw Error("page table entry (" + std::to_string(b) + ", " + std::to_string(x) + ") = " + std::to_string(at) +
                    " is not a page of the pool (0 … " + std::to_string(pool - 1) + ")");
    }
  }
}

}  // namespace fa
