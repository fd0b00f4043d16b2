// Element-by-element comparison of a result with an expected tensor, and the one
// table of tolerances every test uses.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace fa {

/// The bit pattern outputs are filled with before a kernel runs (a quiet NaN with
/// a recognisable payload). An element still holding it was never written.
constexpr std::uint32_t kPoisonBits = 0x7FC0DEADu;
inline float poison_value() {
  float f;
  std::memcpy(&f, &kPoisonBits, sizeof f);
  return f;
}
inline bool is_poison(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b == kPoisonBits;
}

/// |got − want| <= atol + rtol·|want|, with the reason for the numbers.
struct Tolerance {
  double atol, rtol;
  const char* why;
};

/// The tolerances, each justified by the arithmetic that separates the two sides.
namespace tol {
/// The same operations in the same order on the same inputs (step 04 vs 03, 03
/// without softmax vs 02, a kernel run twice): the IEEE results must be identical.
constexpr Tolerance kBitExact{0.0, 0.0, "same arithmetic in the same order: bit-equal"};
/// fp32 attention vs the fp64 reference. O is a convex combination of V rows
/// (|O| <= max|V| = 1); each step rounds S (a d-term dot product), exp, the
/// sums over N keys and the division. With sums over up to ~1000 terms the
/// worst case is about (N + d)·2^-24 ≈ 7e-5 relative; observed ≈ 1e-6.
constexpr Tolerance kFp32Forward{2e-5, 1e-4, "fp32 sums over N keys and d channels vs fp64"};
/// fp32 forward vs another fp32 forward with a different summation order
/// (a CPU model vs its kernel, step 02 vs step 01's no-softmax GEMMs): both
/// sides carry the rounding above, so twice the budget.
constexpr Tolerance kFp32Reorder{4e-5, 2e-4, "two fp32 summation orders"};
/// fp32 gradients vs fp64: dS = P∘(dP − D) subtracts nearly equal numbers, and
/// dQ, dK sum N such terms, so cancellation costs about two more digits.
constexpr Tolerance kFp32Backward{2e-4, 2e-3, "fp32 gradients: cancellation in dP − D, sums over N"};
/// The no-softmax path O = (scale·QKᵀ)V is not normalised: |O| grows like
/// N·scale·d·|q||k||v|/... so compare relatively to its size.
constexpr Tolerance kFp32NoSoftmax{1e-4, 2e-4, "unnormalised sums over N keys, fp32 vs fp64"};
/// Analytic gradients vs central finite differences (h = 1e-4 in fp64): the
/// truncation error is O(h²) ≈ 1e-8 times third derivatives; rounding ≈ 1e-12/h.
constexpr Tolerance kFiniteDiff{1e-6, 1e-5, "central differences in fp64, h = 1e-4"};
}  // namespace tol

/// A tensor's logical shape, for printing indices of mismatches: up to 4 dims.
struct Shape {
  std::vector<long long> dims;
  std::string index_of(std::size_t flat) const;  ///< "[b, h, n, c]"
};

struct Mismatch {
  std::size_t flat;
  float got, want;
};

struct CompareResult {
  std::size_t n = 0, bad = 0, nan = 0, unwritten = 0;
  double max_abs = 0, max_rel = 0;  ///< over finite pairs
  double rel_fro = 0;               ///< ||got − want||_F / ||want||_F
  std::vector<Mismatch> first;      ///< up to 8 failing elements
  bool ok() const { return bad == 0 && nan == 0 && unwritten == 0; }
  /// Multi-line report: counts, errors and the first mismatches with indices.
  std::string report(const std::string& what, const Shape& shape, const Tolerance& t) const;
};

/// Compares every element. NaN in `got` always fails (counted separately from
/// poisoned, i.e. unwritten, elements); NaN in `want` is a caller bug and throws.
CompareResult compare(const std::vector<float>& got, const std::vector<float>& want, const Tolerance& t);

}  // namespace fa
