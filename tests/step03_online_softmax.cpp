// Step 03 tests: online softmax against step 01 and the reference; with the
// softmax compiled out against step 02 (bit for bit); the classic forgotten
// rescale must be caught; huge logits; the lecture's degenerate cases.
#include <algorithm>
#include <cmath>

#include "reference/reference.hpp"
#include "steps/02_fused/step02.hpp"
#include "steps/03_online_softmax/step03.hpp"
#include "tests/check.hpp"
#ifdef FA_HAVE_CUDA
#include "common/gpu.hpp"
#include "steps/01_naive/step01.hpp"
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
    FA_CHECK_CLOSE("O", step03::model_forward(p, in, {false, false}).out.o, step02::model_forward(p, in).out.o,
                   tol::kBitExact, test::shape_o(p));
  }
}

TEST_CASE("step03: forgetting to rescale the old O is caught, and is only slightly wrong", "[cpu]") {
  const Problem p = make(1, 2, 200, 32, false);  // 7 K/V blocks per row
  const Qkv in = random_qkv(p, 43);
  const ForwardOut ref = reference::forward(p, in);
  const auto bad = compare(step03::model_forward(p, in, {true, true}).out.o, ref.o, tol::kFp32Forward);
  INFO(bad.report("O with the bug", test::shape_o(p), tol::kFp32Forward));
  CHECK_FALSE(bad.ok());
  CHECK(bad.nan == 0);          // no NaN to give it away:
  CHECK(bad.rel_fro < 0.5);     // "quietly, slightly wrong" (lecture notes)
  CHECK(compare(step03::model_forward(p, in).out.o, ref.o, tol::kFp32Forward).ok());
}

TEST_CASE("step03 degenerate cases: one K/V block, and blocks with no new max", "[cpu]") {
  SECTION("a single K/V block is the plain softmax (the rescale factor is never used)") {
    const Problem p = make(2, 2, 32, 24, false);
    const Qkv in = random_qkv(p, 44);
    const ForwardOut ref = reference::forward(p, in);
    FA_CHECK_CLOSE("O", step03::model_forward(p, in).out.o, ref.o, tol::kFp32Forward, test::shape_o(p));
    // ... which is why the forgotten rescale goes unnoticed on short sequences.
    FA_CHECK_CLOSE("O (bug)", step03::model_forward(p, in, {true, true}).out.o, ref.o, tol::kFp32Forward,
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
    FA_CHECK_CLOSE("O (bug)", step03::model_forward(p, in, {true, true}).out.o, ref.o, tol::kFp32Forward,
                   test::shape_o(p));
  }
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
    CHECK(m.read == f.read);
    CHECK(m.written == f.written);
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
