// Step 09's test sizes, for the one-process tests and the NCCL ones alike.
#pragma once

#include <vector>

#include "tests/check.hpp"

namespace fa::test {

/// N = 2R·c for chunks of c rows: c = 1 (a chunk of one row), 17, 113 (no tile multiple),
/// and N = 1000 where 2R divides it; FA_TEST_QUICK keeps c = 17.
inline std::vector<int> ring_sizes(int ranks) {
  std::vector<int> out;
  for (int c : {1, 17, 113})
    if (!quick() || c == 17) out.push_back(2 * ranks * c);
  if (!quick() && 1000 % (2 * ranks) == 0) out.push_back(1000);
  return out;
}

}  // namespace fa::test
