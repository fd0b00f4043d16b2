// Test helpers: shapes for printing indices, an element-by-element check whose
// failure message carries the report (first mismatches with indices), checks that name
// what they compare, and failure output kept short: in each test case the first failed
// check prints in full, the others are counted, and the counts print at the end.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <map>
#include <type_traits>
#include <fstream>
#include <sstream>
#include <string>

#include "common/compare.hpp"
#include "common/problem.hpp"
#include "tests/catch.hpp"
#if __has_include(<catch2/interfaces/catch_interfaces_capture.hpp>)  // Catch2 v3: what v2's one header has
#include <catch2/catch_tostring.hpp>
#include <catch2/interfaces/catch_interfaces_capture.hpp>
#endif

namespace fa::test {

inline Shape shape_o(const Problem& p) { return {{p.B, p.H, p.N, p.d}}; }
inline Shape shape_l(const Problem& p) { return {{p.B, p.H, p.N}}; }
inline Shape shape_kv(const Problem& p) { return {{p.B, p.kv_heads_per_batch(), p.keys(), p.d}}; }

/// Builds a problem; `scale` < 0 means the default 1/sqrt(d).
inline Problem make(int B, int H, int N, int d, bool causal, float scale = -1) {
  Problem p;
  p.B = B, p.H = H, p.N = N, p.d = d, p.causal = causal;
  if (scale > 0) p.scale = scale;
  return p;
}

/// The shapes a step's tests sweep: N not a multiple of any tile (1, 17, 113,
/// 1000), d from 16 to 128 (some not a power of two), several batches and heads,
/// causal and not. FA_TEST_QUICK=1 (for compute-sanitizer runs, 10–100× slower)
/// keeps N in {17, 113} and d in {40, 128}: still partial tiles and both paths;
/// FA_TEST_QUICK=2 (racecheck, slower still) keeps N = 113 alone.
/// True under FA_TEST_QUICK (sanitizer runs): fixed-shape tests keep one shape.
inline bool quick() {
  const char* q = std::getenv("FA_TEST_QUICK");
  return q && (*q == '1' || *q == '2');
}

inline std::vector<Problem> sweep(std::vector<int> Ns = {1, 17, 113, 1000}, std::vector<int> ds = {16, 40, 64, 128}) {
  const char* quick = std::getenv("FA_TEST_QUICK");
  const bool q = quick && (*quick == '1' || *quick == '2'), q2 = q && *quick == '2';
  std::vector<Problem> out;
  for (int N : Ns) {
    if (q && N != 17 && N != 113) continue;
    if (q2 && N != 113) continue;
    for (int d : ds) {
      if (q && d != 40 && d != 128) continue;
      for (bool causal : {false, true}) out.push_back(N >= 1000 ? make(1, 2, N, d, causal) : make(2, 3, N, d, causal));
    }
  }
  return out;
}

/// The message of the fa::Error that f() throws, or "" if it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

/// A hand-made .npy file: magic, version `major`, the header length, `dict` padded with
/// spaces and '\n' to a multiple of `align` (64 as np.save writes it, 16 as old NumPy
/// did), then `data`.
inline std::string npy_file(const std::string& dict, const std::string& data = "", int major = 1,
                            std::size_t align = 64) {
  const std::size_t pre = major == 1 ? 10 : 12;
  std::string h = dict;
  while ((pre + h.size() + 1) % align) h.push_back(' ');
  h.push_back('\n');
  std::string out("\x93NUMPY", 6);
  out.push_back(char(major));
  out.push_back('\0');
  for (std::size_t k = 0; k < pre - 8; ++k) out.push_back(char((h.size() >> (8 * k)) & 0xff));
  return out + h + data;
}

/// Writes `bytes` to `path` as they are.
inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

/// True when `text` contains `part` (Catch2 v2 and v3 spell their matchers differently).
inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---- Short failures ----------------------------------------------------------------
// A wrong exercise should read as one failure, not as a thousand: the checks below print
// the first failure of a test case in full and count the rest.

/// The failed checks not shown, per test case; printed when the program ends.
struct Quiet {
  std::string test;     ///< the test case running
  bool failed = false;  ///< a check of it has failed (and printed)
  std::map<std::string, long> hidden;
  ~Quiet() {
    for (const auto& [name, n] : hidden)
      std::printf("%s: %ld more failed check%s after the first, not shown\n", name.c_str(), n, n == 1 ? "" : "s");
    std::fflush(stdout);
  }
};
inline Quiet& quiet() {
  static Quiet q;
  return q;
}
/// Whether a check may print: no check of this test case has failed yet.
inline bool may_print() {
  Quiet& q = quiet();
  const std::string t = Catch::getResultCapture().getCurrentTestName();
  if (t != q.test) q.test = t, q.failed = false;
  return !q.failed;
}
inline void printed(bool passed) { quiet().failed |= !passed; }
inline void hidden() { ++quiet().hidden[quiet().test]; }

/// A number as it is: integers whole, floating point by %g with 9 digits (1e-06, not 0.0f).
template <class T>
std::string text(T x) {
  if constexpr (std::is_floating_point_v<T>) {
    char b[40];
    std::snprintf(b, sizeof b, "%.9g", double(x));
    return b;
  } else {
    std::ostringstream s;
    s << x;
    return s.str();
  }
}

}  // namespace fa::test

// Floating-point values in Catch's own expansions with all their digits (its default
// prints the tolerance 1e-6f as 0.0f).
inline const bool fa_catch_digits = (Catch::StringMaker<float>::precision = 9, Catch::StringMaker<double>::precision = 15, true);

// CHECK and CHECK_FALSE, capped per test case as above (the same expansion as Catch's).
#undef CHECK
#undef CHECK_FALSE
#define CHECK(...)                                                                              \
  do {                                                                                          \
    if (::fa::test::may_print()) {                                                              \
      INTERNAL_CATCH_TEST("CHECK", Catch::ResultDisposition::ContinueOnFailure, __VA_ARGS__);   \
      ::fa::test::printed(Catch::getResultCapture().lastAssertionPassed());                     \
    } else if (!static_cast<bool>(__VA_ARGS__)) {                                               \
      ::fa::test::hidden();                                                                     \
    }                                                                                           \
  } while (false)
#define CHECK_FALSE(...) CHECK(!static_cast<bool>(__VA_ARGS__))

/// A named check: fails with "what: got G, want W" (e.g. "model's HBM reads vs formula
/// (step 01): got 50, want 52").
#define FA_CHECK_EQ(what, got, want)                                                          \
  do {                                                                                        \
    const auto fa_g_ = (got);                                                                 \
    const auto fa_w_ = (want);                                                                \
    if (fa_g_ == fa_w_) {                                                                     \
      SUCCEED();                                                                              \
    } else if (::fa::test::may_print()) {                                                     \
      ::fa::test::printed(false);                                                             \
      FAIL_CHECK((what) << ": got " << ::fa::test::text(fa_g_) << ", want " << ::fa::test::text(fa_w_)); \
    } else {                                                                                  \
      ::fa::test::hidden();                                                                   \
    }                                                                                         \
  } while (false)

/// A named bound: fails with "what: got G, which is not below B".
#define FA_CHECK_BELOW(what, got, bound)                                                      \
  do {                                                                                        \
    const auto fa_g_ = (got);                                                                 \
    const auto fa_b_ = (bound);                                                               \
    if (fa_g_ < fa_b_) {                                                                      \
      SUCCEED();                                                                              \
    } else if (::fa::test::may_print()) {                                                     \
      ::fa::test::printed(false);                                                             \
      FAIL_CHECK((what) << ": got " << ::fa::test::text(fa_g_) << ", which is not below "       \
                        << ::fa::test::text(fa_b_));                                          \
    } else {                                                                                  \
      ::fa::test::hidden();                                                                   \
    }                                                                                         \
  } while (false)

/// Every element of `got` against `want` within `tol`; on failure the report
/// names the counts, the errors and the first mismatches with their indices.
#define FA_CHECK_CLOSE(what, got, want, tol, shape)                          \
  do {                                                                       \
    const auto fa_r_ = ::fa::compare((got), (want), (tol));                  \
    INFO(fa_r_.report((what), (shape), (tol)));                              \
    CHECK(fa_r_.ok());                                                       \
  } while (0)
