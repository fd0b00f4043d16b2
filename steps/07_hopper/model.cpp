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

ModelBackward model_backward(const Problem& p, const Qkv& in, const ForwardOut& fwd, const std::vector<float>& dout) {
  step06::require_lowp(p, "step07 backward", kBackwardD, Problem::kGroups | Problem::kWindow);
  return step06::model_backward_tiled(p, in, fwd, dout, backward_keys(p.d), backward_queries(p.d));
}

Traffic traffic_backward(const Problem& p) {
  return step06::traffic_backward_tiled(p, backward_keys(p.d), backward_queries(p.d));
}

}  // namespace fa::step07

namespace fa::step07 {

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

Problem sequence(const Problem& p, const std::vector<int>& offsets, int b) {
  Problem one = p;
  one.N = offsets[std::size_t(b) + 1] - offsets[std::size_t(b)];
  one.N_kv = 0;
  return one;
}

namespace {
/// Rows [from, from + n) of every head of a [heads, T, width] tensor, or back into it.
std::vector<float> rows_of(const std::vector<float>& x, std::size_t heads, int T, int from, int n, int width) {
  std::vector<float> out;
  out.reserve(heads * n * width);
  for (std::size_t h = 0; h < heads; ++h) {
    const auto at = x.begin() + std::ptrdiff_t((h * T + from) * std::size_t(width));
    out.insert(out.end(), at, at + std::ptrdiff_t(n) * width);
  }
  return out;
}
void put_rows(std::vector<float>& x, const std::vector<float>& part, std::size_t heads, int T, int from, int n, int width) {
  for (std::size_t h = 0; h < heads; ++h)
    std::copy(part.begin() + std::ptrdiff_t(h * n * width), part.begin() + std::ptrdiff_t((h + 1) * n * width),
              x.begin() + std::ptrdiff_t((h * T + from) * std::size_t(width)));
}
void add(Traffic& t, const Traffic& x) { t.read += x.read, t.written += x.written; }
}  // namespace

ModelForward model_forward_ragged(const Problem& p, const Qkv& in, const std::vector<int>& offsets) {
  require_supported(p);
  require_offsets(p, offsets);
  ModelForward r;
  r.out = {std::vector<float>(p.elems()), std::vector<float>(p.rows())};
  const FwdShape blocks = forward_shape(p.d, p.N, p.causal);  // one launch: the packed problem's blocks
  for (int b = 0; b + 1 < int(offsets.size()); ++b) {
    const Problem one = sequence(p, offsets, b);
    const int at = offsets[std::size_t(b)];
    const Qkv mine{rows_of(in.q, p.heads(), p.N, at, one.N, p.d), rows_of(in.k, p.kv_heads(), p.N, at, one.N, p.d),
                   rows_of(in.v, p.kv_heads(), p.N, at, one.N, p.d)};
    const ModelForward m = step06::model_forward_tiled(one, mine, blocks.rows, blocks.keys);
    put_rows(r.out.o, m.out.o, p.heads(), p.N, at, one.N, p.d);
    put_rows(r.out.lse, m.out.lse, p.heads(), p.N, at, one.N, 1);
    add(r.traffic, m.traffic);
  }
  return r;
}

ModelBackward model_backward_ragged(const Problem& p, const Qkv& in, const ForwardOut& fwd,
                                    const std::vector<float>& dout, const std::vector<int>& offsets) {
  step06::require_lowp(p, "step07 backward", kBackwardD, Problem::kGroups | Problem::kWindow);
  require_offsets(p, offsets);
  ModelBackward r;
  r.grads = {std::vector<float>(p.elems()), std::vector<float>(p.kv_elems()), std::vector<float>(p.kv_elems())};
  for (int b = 0; b + 1 < int(offsets.size()); ++b) {
    const Problem one = sequence(p, offsets, b);
    const int at = offsets[std::size_t(b)], n = one.N, d = p.d;
    const Qkv mine{rows_of(in.q, p.heads(), p.N, at, n, d), rows_of(in.k, p.kv_heads(), p.N, at, n, d),
                   rows_of(in.v, p.kv_heads(), p.N, at, n, d)};
    const ForwardOut f{rows_of(fwd.o, p.heads(), p.N, at, n, d), rows_of(fwd.lse, p.heads(), p.N, at, n, 1)};
    const ModelBackward m = model_backward(one, mine, f, rows_of(dout, p.heads(), p.N, at, n, d));
    put_rows(r.grads.dq, m.grads.dq, p.heads(), p.N, at, n, d);
    put_rows(r.grads.dk, m.grads.dk, p.kv_heads(), p.N, at, n, d);
    put_rows(r.grads.dv, m.grads.dv, p.kv_heads(), p.N, at, n, d);
    add(r.traffic, m.traffic);
  }
  return r;
}

}  // namespace fa::step07
