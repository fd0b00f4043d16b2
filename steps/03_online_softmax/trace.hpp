// A watch on one query row of the online softmax (flashattn trace): the models of steps
// 03, 04, 08 and 09 report that row's state to it after each K/V block, each split and
// each merge. Off by default — a null pointer, which the models test once per block.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace fa::online {

/// The watched row's state after one event (a K/V block, a split's end, a merge).
struct TraceRow {
  std::string stage;     ///< "block", "split 2", "merge", "rank 1 step 2", …
  int k0 = 0, k1 = 0;    ///< the keys the event brought in, [k0, k1)
  float m = 0, l = 0;    ///< the running max and the sum ℓ of e^(s − m) after it
  float rescale = 1;     ///< the factor the old ℓ and O were multiplied by (merge: the old part's weight)
  std::vector<float> o;  ///< the first columns of O / ℓ after it (the result so far)
};

struct Trace {
  std::size_t row = 0;  ///< the query row watched, in the first batch and head
  int cols = 4;         ///< how many columns of O to keep
  std::vector<TraceRow> rows;

  /// Records the state; `o` is the row's unnormalised O (divided by ℓ here) or, with
  /// `normalised`, O / ℓ already.
  void add(std::string stage, int k0, int k1, float m, float l, float rescale, const float* o, int d,
           bool normalised = false) {
    TraceRow r{std::move(stage), k0, k1, m, l, rescale, {}};
    for (int c = 0; c < d && c < cols; ++c) r.o.push_back(normalised ? o[c] : (l > 0 ? o[c] / l : 0.0f));
    rows.push_back(std::move(r));
  }
};

}  // namespace fa::online
