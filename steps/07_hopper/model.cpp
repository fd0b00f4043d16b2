// CPU model of step 07's forward: the algorithm is step 06's, so is the model
// (model_forward_tiled); only the blocks are step 07's.
#include <algorithm>

#include "steps/06_tensor_cores/step06.hpp"
#include "steps/07_hopper/step07.hpp"

namespace fa::step07 {

void require_supported(const Problem& p) {
  step06::require_lowp(p, "step07", kSupportedD, Problem::kGroups | Problem::kWindow);
}

ModelForward model_forward(const Problem& p, const Qkv& in) {
  require_supported(p);
  const FwdShape b = forward_shape(p.d, p.N, p.causal);
  return step06::model_forward_tiled(p, in, b.rows, b.keys);
}

Traffic traffic_forward(const Problem& p) {
  const FwdShape b = forward_shape(p.d, p.N, p.causal);
  return step06::traffic_forward_tiled(p, b.rows, b.keys);
}

}  // namespace fa::step07

namespace fa::step07 {

// The backward's blocks own step 06's keys (128 at d ≤ 128, 64 at d = 256) and walk 96
// queries a step at d = 64, 80 at d = 128 and 64 at d = 256; its rounding points are step 06's:
// its model is step 06's, with those blocks. What differs is where dQ's partial sums go
// (TMA bulk reductions instead of atomics: the same fp32 additions, in another order), and
// at d = 256 which warpgroup computes which columns.
static_assert(backward_keys(64) == step06::backward_keys(64) && backward_keys(128) == step06::backward_keys(128) &&
                  backward_keys(256) == step06::backward_keys(256),
              "step 07's backward blocks own step 06's keys");

namespace {
void require_backward(const Problem& p) {
  step06::require_lowp(p, "step07 backward", kBackwardD, Problem::kGroups | Problem::kWindow);
}
}  // namespace

ModelBackward model_backward(const Problem& p, const Qkv& in, const ForwardOut& fwd, const std::vector<float>& dout) {
  require_backward(p);
  return step06::model_backward_tiled(p, in, fwd, dout, backward_keys(p.d), backward_queries(p.d));
}

Traffic traffic_backward(const Problem& p) {
  return step06::traffic_backward_tiled(p, backward_keys(p.d), backward_queries(p.d));
}

}  // namespace fa::step07

namespace fa::step07 {

Problem sequence(const Problem& p, const std::vector<int>& offsets, int b) {
  Problem one = p;
  one.N = offsets[std::size_t(b) + 1] - offsets[std::size_t(b)];
  one.N_kv = 0;
  return one;
}

namespace {
/// Sequence b's rows of the packed tensors: rows offsets[b] … of every head of a [heads, T, width]
/// tensor (Q, O, dO: the query heads, width d; L: width 1; K, V: the K/V heads), out or back in.
struct SequenceRows {
  std::size_t heads, kv_heads;
  int T, at, n, d;
  SequenceRows(const Problem& p, const std::vector<int>& offsets, int b)
      : heads(p.heads()), kv_heads(p.kv_heads()), T(p.N), at(offsets[std::size_t(b)]),
        n(offsets[std::size_t(b) + 1] - offsets[std::size_t(b)]), d(p.d) {}
  std::vector<float> of(const std::vector<float>& x, std::size_t hs, int width) const {
    std::vector<float> out;
    out.reserve(hs * n * width);
    for (std::size_t h = 0; h < hs; ++h) {
      const auto from = x.begin() + std::ptrdiff_t((h * T + at) * std::size_t(width));
      out.insert(out.end(), from, from + std::ptrdiff_t(n) * width);
    }
    return out;
  }
  void put(std::vector<float>& x, const std::vector<float>& part, std::size_t hs, int width) const {
    for (std::size_t h = 0; h < hs; ++h)
      std::copy(part.begin() + std::ptrdiff_t(h * n * width), part.begin() + std::ptrdiff_t((h + 1) * n * width),
                x.begin() + std::ptrdiff_t((h * T + at) * std::size_t(width)));
  }
  Qkv inputs(const Qkv& in) const { return {of(in.q, heads, d), of(in.k, kv_heads, d), of(in.v, kv_heads, d)}; }
};
void add(Traffic& t, const Traffic& x) { t.read += x.read, t.written += x.written; }
}  // namespace

ModelForward model_forward_ragged(const Problem& p, const Qkv& in, const std::vector<int>& offsets) {
  require_supported(p);
  require_offsets(p, offsets);
  ModelForward r;
  r.out = {std::vector<float>(p.elems()), std::vector<float>(p.rows())};
  const FwdShape blocks = forward_shape(p.d, p.N, p.causal);  // one launch: the packed problem's blocks
  for (int b = 0; b + 1 < int(offsets.size()); ++b) {
    const SequenceRows rows(p, offsets, b);
    const ModelForward m =
        step06::model_forward_tiled(sequence(p, offsets, b), rows.inputs(in), blocks.rows, blocks.keys);
    rows.put(r.out.o, m.out.o, rows.heads, p.d);
    rows.put(r.out.lse, m.out.lse, rows.heads, 1);
    add(r.traffic, m.traffic);
  }
  return r;
}

ModelBackward model_backward_ragged(const Problem& p, const Qkv& in, const ForwardOut& fwd,
                                    const std::vector<float>& dout, const std::vector<int>& offsets) {
  require_backward(p);
  require_offsets(p, offsets);
  ModelBackward r;
  r.grads = {std::vector<float>(p.elems()), std::vector<float>(p.kv_elems()), std::vector<float>(p.kv_elems())};
  for (int b = 0; b + 1 < int(offsets.size()); ++b) {
    const SequenceRows rows(p, offsets, b);
    const ForwardOut f{rows.of(fwd.o, rows.heads, p.d), rows.of(fwd.lse, rows.heads, 1)};
    const ModelBackward m = model_backward(sequence(p, offsets, b), rows.inputs(in), f, rows.of(dout, rows.heads, p.d));
    rows.put(r.grads.dq, m.grads.dq, rows.heads, p.d);
    rows.put(r.grads.dk, m.grads.dk, rows.kv_heads, p.d);
    rows.put(r.grads.dv, m.grads.dv, rows.kv_heads, p.d);
    add(r.traffic, m.traffic);
  }
  return r;
}

RaggedTable ragged_table_model(const std::vector<int>& offsets, int T, int rows, int q_rows, bool causal) {
  struct Seq {
    int start, length, count, q_first;
  };
  std::vector<Seq> seqs;
  RaggedTable t;
  int last = std::clamp(offsets.at(0), 0, T);  // the largest end so far: a sequence never starts before it
  for (std::size_t b = 0; b + 1 < offsets.size(); ++b) {
    const int end = std::clamp(offsets[b + 1], 0, T), length = std::max(end, last) - last;
    seqs.push_back({last, length, (length + rows - 1) / rows, int(t.q_blocks.size())});
    for (int i = 0; q_rows && i < (length + q_rows - 1) / q_rows; ++i) t.q_blocks.push_back({i, last, length});
    last = std::max(last, end);
  }
  const bool key_blocks = q_rows != 0;
  std::vector<std::pair<int, int>> order;  // (sequence, block), in the sequences' order
  int most = 0;
  for (int b = 0; b < int(seqs.size()); ++b) {
    most = std::max(most, seqs[std::size_t(b)].count);
    for (int i = 0; i < seqs[std::size_t(b)].count; ++i) order.emplace_back(b, i);
  }
  if (causal && most >= kSortFromBlocks) {
    // By weight: the distance from the light end (k), the forward's ascending, the backward's
    // descending; then the longer sequence first; stable, so then the sequences' order.
    auto k_of = [&](const std::pair<int, int>& x) {
      return key_blocks ? seqs[std::size_t(x.first)].count - 1 - x.second : x.second;
    };
    std::stable_sort(order.begin(), order.end(), [&](const auto& x, const auto& y) {
      const int kx = k_of(x), ky = k_of(y);
      if (kx != ky) return key_blocks ? kx > ky : kx < ky;
      return seqs[std::size_t(x.first)].count > seqs[std::size_t(y.first)].count;
    });
  }
  for (const auto& [b, i] : order) {
    const Seq& s = seqs[std::size_t(b)];
    t.blocks.push_back({i, s.start, s.length});
    if (key_blocks) t.q_first.push_back(s.q_first);
  }
  return t;
}

}  // namespace fa::step07
