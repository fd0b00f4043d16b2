// Step 03 tests: online softmax against step 01 and the reference; with the
// softmax compiled out against step 02 (bit for bit); the classic forgotten
// rescale must be caught, in both its forms; huge logits; the lecture's degenerate
// cases; the merge rule of two partial states.
#include <algorithm>
#include <cmath>

#include "reference/reference.hpp"
#include "steps/02_fused/step02.hpp"
#include "steps/03_online_softmax/online_softmax.hpp"
#include "steps/03_online_softmax/step03.hpp"
#include "tests/check.hpp"
#include "steps/01_naive/step01.hpp"
#ifdef FA_HAVE_CUDA
#include "common/gpu.hpp"
#endif

using namespace fa;
using fa::test::make;

namespace {
/// Integer Q, K with a power-of-two scale: every score is an exact multiple of 64
/// in fp32 as in fp64, with |logit| up to ~1e4, so the comparison can be tight.
Qkv huge_logits(const Problem& p, std::uint64_t seed) {
  Qkv in = random_qkv(p, seed, 4.0f);
  for (auto* t : {&in.q, &in.k})
    for (auto& e : *t) e = std::round(e);
  return in;
}
}  // namespace

TEST_CASE("step03 model computes softmax attention", "[cpu]") {
  for (const Problem& p : test::sweep({1, 17, 113}, {16, 40})) {
    INFO(p.str() << ", seed 41");
    const Qkv in = random_qkv(p, 41);
    const ModelForward m = step03::model_forward(p, in);
    const ForwardOut ref = reference::forward(p, in);
    FA_CHECK_CLOSE("O", m.out.o, ref.o, tol::kFp32Forward, test::shape_o(p));
    FA_CHECK_CLOSE("L", m.out.lse, ref.lse, tol::kFp32Forward, test::shape_l(p));
  }
}

TEST_CASE("step03 model with the softmax switched off is step 02's model, bit for bit", "[cpu]") {
  for (const Problem& p : test::sweep({17, 113}, {16, 40})) {
    INFO(p.str());
    const Qkv in = random_qkv(p, 42);
    FA_CHECK_CLOSE("O", step03::model_forward(p, in, {false, step03::Forget::nothing}).out.o, step02::model_forward(p, in).out.o,
                   tol::kBitExact, test::shape_o(p));
  }
}

TEST_CASE("step03: forgetting to rescale the old O is caught, and is only slightly wrong", "[cpu]") {
  const Problem p = make(1, 2, 200, 32, false);  // 7 K/V blocks per row
  const Qkv in = random_qkv(p, 43);
  const ForwardOut ref = reference::forward(p, in);
  CHECK(compare(step03::model_forward(p, in).out.o, ref.o, tol::kFp32Forward).ok());
  // The lecture's bug (IO-aware notes, "在线 softmax"): O not rescaled, ℓ rescaled.
  // Also both left unscaled, a second way to get it wrong. Both must be caught, and
  // both are quiet: no NaN, a modest relative error.
  for (step03::Forget forget : {step03::Forget::o, step03::Forget::o_and_l}) {
    const auto bad = compare(step03::model_forward(p, in, {true, forget}).out.o, ref.o, tol::kFp32Forward);
    INFO((forget == step03::Forget::o ? "O forgotten" : "O and l forgotten")
         << ": " << bad.report("O with the bug", test::shape_o(p), tol::kFp32Forward));
    CHECK_FALSE(bad.ok());
    CHECK(bad.nan == 0);       // no NaN to give it away:
    CHECK(bad.rel_fro < 0.5);  // "quietly, slightly wrong"
  }
}

TEST_CASE("step03: the two forms of the bug differ in what a sanity check can see", "[cpu]") {
  // With every value row equal to 1, correct attention is 1 exactly: the weights of a
  // row sum to 1. Forgetting O only breaks that sum (old blocks keep their larger,
  // stale weights in O but not in ℓ), so the output leaves [min V, max V]. Forgetting
  // both keeps O and ℓ on the same stale footing: every row is still a proper weighted
  // average, the output stays 1, and only a comparison with the reference (the test
  // above) finds the wrong weights.
  const Problem p = make(1, 2, 200, 32, false);
  Qkv in = random_qkv(p, 50);
  std::fill(in.v.begin(), in.v.end(), 1.0f);
  const std::vector<float> ones(p.elems(), 1.0f);
  const std::vector<float> forget_o = step03::model_forward(p, in, {true, step03::Forget::o}).out.o;
  const std::vector<float> forget_both = step03::model_forward(p, in, {true, step03::Forget::o_and_l}).out.o;
  CHECK(*std::max_element(forget_o.begin(), forget_o.end()) > 1.01f);
  FA_CHECK_CLOSE("O, O and l forgotten, V = 1", forget_both, ones, tol::kFp32Forward, test::shape_o(p));
}

// The merge rule: partial states (m, ℓ, O) of one row over disjoint key ranges.
namespace {
struct RowState {
  float m = -INFINITY, l = 0.0f;
  std::vector<float> o;
};
/// The state of one row over keys [k0, k1) with scores s and values v (d columns),
/// computed directly in fp32: m = max, ℓ = Σ e^(s − m), O = Σ e^(s − m)·v.
RowState state_of(const std::vector<float>& s, const std::vector<float>& v, int d, int k0, int k1) {
  RowState st;
  st.o.assign(std::size_t(d), 0.0f);
  for (int k = k0; k < k1; ++k) st.m = std::fmax(st.m, s[std::size_t(k)]);
  for (int k = k0; k < k1; ++k) {
    const float w = online::prob(s[std::size_t(k)], st.m);
    st.l += w;
    for (int c = 0; c < d; ++c) st.o[std::size_t(c)] += w * v[std::size_t(k) * d + c];
  }
  return st;
}
RowState merged(RowState a, const RowState& b) {
  online::merge(a.m, a.l, a.o.data(), b.m, b.l, b.o.data(), int(a.o.size()));
  return a;
}
/// O / ℓ: the attention output the state stands for.
std::vector<float> output(const RowState& st) {
  std::vector<float> o(st.o);
  for (float& x : o) x /= st.l;
  return o;
}
void check_same(const RowState& got, const RowState& want, const Tolerance& t) {
  CHECK(got.m == want.m);
  const Shape row{{1, int(got.o.size())}};
  FA_CHECK_CLOSE("l", std::vector<float>{got.l}, std::vector<float>{want.l}, t, (Shape{{1, 1}}));
  FA_CHECK_CLOSE("O", got.o, want.o, t, row);
}
}  // namespace

TEST_CASE("merge: the states of a split key range merge into the whole, at every split point", "[cpu]") {
  const int N = 300, d = 24;
  const std::vector<float> s = random_tensor(N, 60, 6.0f), v = random_tensor(std::size_t(N) * d, 61);
  const RowState whole = state_of(s, v, d, 0, N);
  for (int k = 0; k <= N; ++k) {
    INFO("split at key " << k << " of " << N);
    const RowState m = merged(state_of(s, v, d, 0, k), state_of(s, v, d, k, N));
    // An empty part (k = 0 or N) changes nothing, bit for bit; otherwise the two
    // partial sums are added in another order than the whole's.
    check_same(m, whole, k == 0 || k == N ? tol::kBitExact : tol::kFp32Reorder);
    FA_CHECK_CLOSE("O / l", output(m), output(whole), tol::kFp32Reorder, (Shape{{1, d}}));
  }
}

TEST_CASE("merge: commutative bit for bit, associative up to fp32 rounding", "[cpu]") {
  const int N = 240, d = 16;
  const std::vector<float> s = random_tensor(N, 62, 8.0f), v = random_tensor(std::size_t(N) * d, 63);
  for (int cut1 : {1, 17, 80, 119})
    for (int cut2 : {cut1 + 1, cut1 + 40, 239}) {
      INFO("parts [0, " << cut1 << "), [" << cut1 << ", " << cut2 << "), [" << cut2 << ", " << N << ")");
      const RowState a = state_of(s, v, d, 0, cut1), b = state_of(s, v, d, cut1, cut2), c = state_of(s, v, d, cut2, N);
      check_same(merged(a, b), merged(b, a), tol::kBitExact);
      check_same(merged(merged(a, b), c), merged(a, merged(b, c)), tol::kFp32Reorder);
      check_same(merged(merged(a, c), b), merged(merged(a, b), c), tol::kFp32Reorder);
    }
}

TEST_CASE("merge: logits of ±1e4 and empty (all-masked) parts stay exact", "[cpu]") {
  const int d = 8;
  // Scores that are exact in fp32: one part near +1e4, one near −1e4.
  std::vector<float> s = {1e4f, 9998.0f, 9999.0f, -1e4f, -9997.0f, -9999.0f};
  const std::vector<float> v = random_tensor(s.size() * d, 64);
  const RowState high = state_of(s, v, d, 0, 3), low = state_of(s, v, d, 3, 6);
  // e^(−2·10⁴) is 0 in fp32: the low part weighs nothing, and the high part is kept as it was.
  check_same(merged(high, low), high, tol::kBitExact);
  check_same(merged(low, high), high, tol::kBitExact);
  // All masked: every score −∞ gives m = −∞, ℓ = 0, O = 0 — weight 0 in any merge.
  std::vector<float> masked(4, -INFINITY);
  const RowState empty = state_of(masked, random_tensor(4 * d, 65), d, 0, 4);
  CHECK(empty.m == -INFINITY);
  CHECK(empty.l == 0.0f);
  check_same(merged(high, empty), high, tol::kBitExact);
  check_same(merged(empty, low), low, tol::kBitExact);
  const RowState none = merged(empty, empty);  // two empty parts: still empty, no NaN
  CHECK(none.m == -INFINITY);
  CHECK(none.l == 0.0f);
  for (float x : none.o) CHECK(x == 0.0f);
}

TEST_CASE("step03 degenerate cases: one K/V block, and blocks with no new max", "[cpu]") {
  SECTION("a single K/V block is the plain softmax (the rescale factor is never used)") {
    const Problem p = make(2, 2, 32, 24, false);
    const Qkv in = random_qkv(p, 44);
    const ForwardOut ref = reference::forward(p, in);
    FA_CHECK_CLOSE("O", step03::model_forward(p, in).out.o, ref.o, tol::kFp32Forward, test::shape_o(p));
    // ... which is why the forgotten rescale goes unnoticed on short sequences.
    FA_CHECK_CLOSE("O (bug)", step03::model_forward(p, in, {true, step03::Forget::o}).out.o, ref.o, tol::kFp32Forward,
                   test::shape_o(p));
  }
  SECTION("when the first block holds every row's max, e^(m − m_new) = 1 and the bug is harmless") {
    const Problem p = make(1, 1, 160, 16, false);
    Qkv in = random_qkv(p, 45, 0.1f);
    for (int c = 0; c < p.d; ++c) in.k[c] = 50.0f, in.q[c] = std::fabs(in.q[c]) + 0.01f;  // key 0 wins everywhere
    for (int i = 1; i < p.N; ++i)
      for (int c = 0; c < p.d; ++c) in.q[i * p.d + c] = std::fabs(in.q[i * p.d + c]) + 0.01f;
    const ForwardOut ref = reference::forward(p, in);
    FA_CHECK_CLOSE("O", step03::model_forward(p, in).out.o, ref.o, tol::kFp32Forward, test::shape_o(p));
    FA_CHECK_CLOSE("O (bug)", step03::model_forward(p, in, {true, step03::Forget::o}).out.o, ref.o, tol::kFp32Forward,
                   test::shape_o(p));
  }
}

TEST_CASE("step03 degenerate cases of the online update, as you write them (exercise 03-degenerate)", "[cpu]") {
  // exercise 03-degenerate: write this test (lecture p21–24; IO-aware notes, the degenerate checks): before the first block (m_old = −∞) the factor online::rescale is 0, also when that block is all masked (m_new = −∞: no NaN); with no new max it is exactly 1; one query against one key (N = 1) gives O = V and L = the score, bit for bit
  // stub: FAIL("exercise 03-degenerate: the test is not written yet");
  FA_CHECK_EQ("rescale before the first block", online::rescale(-INFINITY, 2.5f), 0.0f);
  FA_CHECK_EQ("rescale before an all-masked first block (no NaN)", online::rescale(-INFINITY, -INFINITY), 0.0f);
  for (float m : {-1e4f, -3.0f, 0.0f, 7.5f, 1e4f}) FA_CHECK_EQ("rescale with no new max", online::rescale(m, m), 1.0f);
  const Problem p = make(1, 2, 1, 16, false);
  const Qkv in = random_qkv(p, 47);
  const ModelForward one = step03::model_forward(p, in);
  FA_CHECK_CLOSE("O with one key (= V)", one.out.o, in.v, tol::kBitExact, test::shape_o(p));
  for (int h = 0; h < p.H; ++h) {
    float s = 0;  // the one score, as the model's tile product sums it
    for (int c = 0; c < p.d; ++c) s += in.q[h * p.d + c] * in.k[h * p.d + c];
    FA_CHECK_CLOSE("L with one key (= its score)", std::vector<float>{one.out.lse[h]}, std::vector<float>{p.softmax_scale() * s},
                   tol::kFp32Reorder, (Shape{{1, 1}}));
  }
  // end exercise
}

TEST_CASE("step03's device memory is Θ(Nd): its tensors, nothing N×N (exercise 03-memory)", "[cpu]") {
  for (const Problem& p : {make(1, 1, 1, 16, false), make(2, 3, 113, 40, true), make(1, 2, 100, 64, false)}) {
    INFO(p.str());
    const Qkv in = random_qkv(p, 1);
    const ForwardOut o = step03::model_forward(p, in).out;
    // What the model keeps in (counted) device memory: its inputs and its outputs.
    FA_CHECK_EQ("step 03's memory vs its model's arrays (Q, K, V, O, L)", step03::memory_forward(p),
                std::uint64_t(in.q.size() + in.k.size() + in.v.size() + o.o.size() + o.lse.size()));
    FA_CHECK_EQ("step 01's memory minus step 03's (S and P: 2·N² a head)",
                step01::memory_forward(p) - step03::memory_forward(p), 2 * p.heads() * std::uint64_t(p.N) * p.N);
  }
  // Twice the sequence, twice the memory: linear in N (step 01's grows four-fold).
  const Problem a = make(1, 1, 4096, 64, false), b = make(1, 1, 8192, 64, false);
  FA_CHECK_EQ("step 03's memory at N = 8192 vs twice N = 4096's", step03::memory_forward(b), 2 * step03::memory_forward(a));
}

TEST_CASE("step03 model stays exact with logits of ±1e4", "[cpu]") {
  for (bool causal : {false, true}) {
    const Problem p = make(1, 2, 100, 40, causal, 64.0f);
    INFO(p.str());
    const Qkv in = huge_logits(p, 46);
    const ForwardOut ref = reference::forward(p, in);
    float largest = 0;
    for (float l : ref.lse) largest = std::max(largest, std::fabs(l));
    CHECK(largest > 5e3f);  // the logits really are huge
    const ModelForward m = step03::model_forward(p, in);
    FA_CHECK_CLOSE("O", m.out.o, ref.o, tol::kFp32Forward, test::shape_o(p));
    FA_CHECK_CLOSE("L", m.out.lse, ref.lse, tol::kFp32Forward, test::shape_l(p));
  }
}

TEST_CASE("step03 model's HBM traffic equals the note's formula", "[cpu]") {
  for (const Problem& p : {make(1, 1, 1, 16, false), make(2, 3, 113, 40, true), make(1, 1, 100, 64, false)}) {
    INFO(p.str());
    const Traffic m = step03::model_forward(p, random_qkv(p, 1)).traffic, f = step03::traffic_forward(p);
    FA_CHECK_EQ("model's HBM reads vs formula (step 03)", m.read, f.read);
    FA_CHECK_EQ("model's HBM writes vs formula (step 03)", m.written, f.written);
  }
}

#ifdef FA_HAVE_CUDA
TEST_CASE("step03 kernel matches step 01, the reference and its model", "[gpu]") {
  for (const Problem& p : test::sweep()) {
    INFO(p.str() << ", seed 47");
    const Qkv in = random_qkv(p, 47);
    const ForwardOut out = gpu::forward(step03::kForward, p, in, true);
    const ForwardOut ref = reference::forward(p, in);
    FA_CHECK_CLOSE("O vs reference", out.o, ref.o, tol::kFp32Forward, test::shape_o(p));
    FA_CHECK_CLOSE("L vs reference", out.lse, ref.lse, tol::kFp32Forward, test::shape_l(p));
    const ForwardOut s1 = gpu::forward(step01::kForward, p, in, true);
    FA_CHECK_CLOSE("O vs step01", out.o, s1.o, tol::kFp32Reorder, test::shape_o(p));
    FA_CHECK_CLOSE("L vs step01", out.lse, s1.lse, tol::kFp32Reorder, test::shape_l(p));
    if (p.N <= 113) {
      const ModelForward m = step03::model_forward(p, in);
      FA_CHECK_CLOSE("O vs model", out.o, m.out.o, tol::kFp32Reorder, test::shape_o(p));
    }
  }
}

TEST_CASE("step03 kernel with the softmax compiled out is step 02's kernel, bit for bit", "[gpu]") {
  for (const Problem& p : test::sweep()) {
    INFO(p.str());
    const Qkv in = random_qkv(p, 48);
    FA_CHECK_CLOSE("O", gpu::forward(step03::kForwardNoSoftmax, p, in, false).o,
                   gpu::forward(step02::kForward, p, in, false).o, tol::kBitExact, test::shape_o(p));
  }
}

TEST_CASE("step03 kernel stays exact with logits of ±1e4, d up to 256", "[gpu]") {
  for (int d : {40, 128, 256})
    for (bool causal : {false, true}) {
      if (test::quick() && (d != 128 || !causal)) continue;
      const Problem p = make(2, 2, 300, d, causal, 64.0f);
      INFO(p.str());
      const Qkv in = huge_logits(p, 49);
      const ForwardOut out = gpu::forward(step03::kForward, p, in, true), ref = reference::forward(p, in);
      FA_CHECK_CLOSE("O", out.o, ref.o, tol::kFp32Forward, test::shape_o(p));
      FA_CHECK_CLOSE("L", out.lse, ref.lse, tol::kFp32Forward, test::shape_l(p));
    }
}
#endif
