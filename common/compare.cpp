#include "common/compare.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/problem.hpp"

namespace fa {

std::string Shape::index_of(std::size_t flat) const {
  std::vector<long long> idx(dims.size());
  for (std::size_t k = dims.size(); k-- > 0;) {
    idx[k] = static_cast<long long>(flat % std::size_t(dims[k]));
    flat /= std::size_t(dims[k]);
  }
  std::ostringstream s;
  s << "[";
  for (std::size_t k = 0; k < idx.size(); ++k) s << (k ? ", " : "") << idx[k];
  s << "]";
  return s.str();
}

CompareResult compare(const std::vector<float>& got, const std::vector<float>& want, const Tolerance& t) {
  if (got.size() != want.size())
    throw Error("compare: sizes differ (" + std::to_string(got.size()) + " vs " + std::to_string(want.size()) + ")");
  CompareResult r;
  r.n = got.size();
  double diff2 = 0, want2 = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const float g = got[i], w = want[i];
    if (std::isnan(w)) throw Error("compare: the expected tensor holds NaN at " + std::to_string(i));
    bool fail = false;
    if (is_poison(g)) {
      ++r.unwritten;
      fail = true;
    } else if (std::isnan(g)) {
      ++r.nan;
      fail = true;
    } else {
      const double e = std::fabs(double(g) - double(w));
      r.max_abs = std::max(r.max_abs, e);
      if (w != 0) r.max_rel = std::max(r.max_rel, e / std::fabs(double(w)));
      diff2 += e * e;
      want2 += double(w) * w;
      if (!(e <= t.atol + t.rtol * std::fabs(double(w)))) {
        ++r.bad;
        fail = true;
      }
    }
    if (fail && r.first.size() < 8) r.first.push_back({i, g, w});
  }
  r.rel_fro = want2 > 0 ? std::sqrt(diff2 / want2) : std::sqrt(diff2);
  return r;
}

std::string CompareResult::report(const std::string& what, const Shape& shape, const Tolerance& t) const {
  std::ostringstream s;
  s.precision(9);
  s << what << ": " << (ok() ? "OK" : "MISMATCH") << " — " << n << " elements, " << bad
    << " outside |got-want| <= " << t.atol << " + " << t.rtol << "·|want| (" << t.why << "), " << nan
    << " NaN, " << unwritten << " unwritten; max abs err " << max_abs << ", max rel err " << max_rel
    << ", rel Frobenius err " << rel_fro;
  for (const auto& m : first)
    s << "\n    at " << shape.index_of(m.flat) << ": got "
      << (is_poison(m.got) ? std::string("<unwritten>") : std::to_string(m.got)) << ", want " << m.want;
  return s.str();
}

}  // namespace fa
