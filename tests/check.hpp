// Test helpers: shapes for printing indices, and an element-by-element check
// whose failure message carries the report (first mismatches with indices).
#pragma once

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "common/compare.hpp"
#include "common/problem.hpp"
#include "tests/catch.hpp"

namespace fa::test {

inline Shape shape_o(const Problem& p) { return {{p.B, p.H, p.N, p.d}}; }
inline Shape shape_l(const Problem& p) { return {{p.B, p.H, p.N}}; }

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

}  // namespace fa::test

/// Every element of `got` against `want` within `tol`; on failure the report
/// names the counts, the errors and the first mismatches with their indices.
#define FA_CHECK_CLOSE(what, got, want, tol, shape)                          \
  do {                                                                       \
    const auto fa_r_ = ::fa::compare((got), (want), (tol));                  \
    INFO(fa_r_.report((what), (shape), (tol)));                              \
    CHECK(fa_r_.ok());                                                       \
  } while (0)
