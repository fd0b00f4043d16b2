// Step 06 tests. The rule FlashAttention's own tests use: against the fp64
// reference on the same (16-bit) inputs, the step's error is at most twice the
// error of a naive computation in the same 16-bit type — three times for the
// gradients. The CPU models (which round where the kernels round) check the
// algorithms and that budget without a GPU; the kernels must meet the budget on
// the GPU and agree with their models to a few 16-bit units.
#include <iterator>
#include <vector>

#include "reference/reference.hpp"
#include "steps/06_tensor_cores/step06.hpp"
#include "tests/check.hpp"
#include "tests/lowp.hpp"
#ifdef FA_HAVE_CUDA
#include "common/gpu.hpp"
#endif

using namespace fa;
using fa::test::make;

namespace {
using test::check_budget;
using test::lowp;
using test::rising_scores;
using test::inputs;
using test::grad_out;
using test::check_grad_budget;
using test::check_grads_close;
/// Every head dimension the production kernels take (kSupportedD, without its 0).
const std::vector<int> kAllD(std::begin(step06::kSupportedD), std::end(step06::kSupportedD) - 1);
}  // namespace

TEST_CASE("step06 model meets the error budget of its 16-bit type", "[cpu]") {
  for (DType t : {DType::bf16, DType::fp16})
    for (const Problem& base : test::sweep({1, 17, 113}, {32, 64, 96, 256}))
      if (base.N < 1000) {
        const Problem p = lowp(base, t);
        INFO(p.str() << ", seed 71");
        const Qkv in = inputs(p, 71);
        check_budget(p, in, step06::model_forward(p, in).out, "model");
      }
}

TEST_CASE("step06 backward model meets the gradient budget of its 16-bit type", "[cpu]") {
  for (DType t : {DType::bf16, DType::fp16})
    for (const Problem& base : test::sweep({1, 17, 113}, {32, 64, 96, 128, 256}))
      if (base.N < 1000 && (base.d == 64 || base.N == 113)) {
        const Problem p = lowp(base, t);
        INFO(p.str() << ", seeds 74, 75");
        const Qkv in = inputs(p, 74);
        const std::vector<float> dout = grad_out(p, 75);
        const ForwardOut fwd = step06::model_forward(p, in).out;
        check_grad_budget(p, in, dout, step06::model_backward(p, in, fwd, dout).grads, "model");
      }
}

TEST_CASE("step06 model meets the budget when the row max keeps rising", "[cpu]") {
  for (bool causal : {false, true}) {
    const Problem p = lowp(make(1, 1, 1000, 64, causal), DType::bf16);
    INFO(p.str());
    const Qkv in = rising_scores(p, 84);
    check_budget(p, in, step06::model_forward(p, in).out, "model");
  }
}

TEST_CASE("step06 models' HBM traffic equals the formulas", "[cpu]") {
  for (const Problem& base : {make(1, 1, 1, 64, false), make(2, 1, 130, 64, true), make(1, 2, 200, 128, false),
                              make(1, 1, 257, 128, true), make(1, 1, 150, 32, true), make(1, 1, 150, 96, false),
                              make(1, 2, 200, 256, true)}) {
    const Problem p = lowp(base, DType::bf16);
    INFO(p.str());
    const Qkv in = random_qkv(p, 1);
    const ModelForward mf = step06::model_forward(p, in);
    const Traffic f = step06::traffic_forward(p);
    CHECK(mf.traffic.read == f.read);
    CHECK(mf.traffic.written == f.written);
    const Traffic mb = step06::model_backward(p, in, mf.out, in.v).traffic, b = step06::traffic_backward(p);
    CHECK(mb.read == b.read);
    CHECK(mb.written == b.written);
  }
}

TEST_CASE("step06 models refuse fp32 problems and other head dimensions", "[cpu]") {
  const Problem p = make(1, 1, 8, 64, false);
  const Qkv in = random_qkv(p, 1);
  CHECK(test::contains(test::error_of([&] { step06::model_forward(p, in); }), "bf16 or fp16"));
  CHECK(test::contains(test::error_of([&] { step06::model_backward(p, in, {in.q, {}}, in.q); }), "bf16 or fp16"));
  const Problem q = lowp(make(1, 1, 8, 40, false), DType::bf16);
  CHECK(test::contains(test::error_of([&] { step06::model_backward(q, random_qkv(q, 1), {}, {}); }),
                       "d = 32, 64, 96, 128, 256"));
}

#ifdef FA_HAVE_CUDA
TEST_CASE("step06 kernel meets the error budget and matches its model", "[gpu]") {
  for (DType t : {DType::bf16, DType::fp16})
    for (const Problem& base : test::sweep({1, 113, 1000}, kAllD)) {
      const Problem p = lowp(base, t);
      INFO(p.str() << ", seed 72");
      const Qkv in = inputs(p, 72);
      const ForwardOut out = gpu::forward(step06::kForward, p, in, true);
      check_budget(p, in, out, "kernel");
      if (p.N <= 113) {
        const ModelForward m = step06::model_forward(p, in);
        const Tolerance& tl = test::reorder(t);
        FA_CHECK_CLOSE("O vs model", out.o, m.out.o, tl, test::shape_o(p));
        FA_CHECK_CLOSE("L vs model", out.lse, m.out.lse, tol::kFp32Reorder, test::shape_l(p));
      }
    }
}

TEST_CASE("step06 kernel at N = 4097 (one past a tile multiple)", "[gpu]") {
  if (test::quick()) return;
  for (bool causal : {false, true}) {
    const Problem p = lowp(make(1, 1, 4097, 64, causal), DType::bf16);
    INFO(p.str());
    const Qkv in = inputs(p, 73);
    const ForwardOut fwd = gpu::forward(step06::kForward, p, in, true);
    check_budget(p, in, fwd, "kernel");
    const std::vector<float> dout = grad_out(p, 76);
    check_grad_budget(p, in, dout, gpu::backward(step06::kBackward, p, in, fwd, dout), "kernel");
  }
}

TEST_CASE("step06 forward versions of the note's table meet the budget", "[gpu]") {
  for (const GpuForward& version : step06::kForwardVersions)
    for (const Problem& base : test::sweep({113, 1000}, {64, 128})) {
      const Problem p = lowp(base, DType::bf16);
      INFO(version.name << ", " << p.str());
      const Qkv in = inputs(p, 77);
      check_budget(p, in, gpu::forward(version, p, in, true), version.name);
    }
}

TEST_CASE("step06 backward versions of the note's table meet the budget", "[gpu]") {
  for (const GpuBackward& version : step06::kBackwardVersions)
    for (const Problem& base : test::sweep({113, 1000}, {64, 128})) {
      const Problem p = lowp(base, DType::bf16);
      INFO(version.name << ", " << p.str());
      const Qkv in = inputs(p, 82);
      const std::vector<float> dout = grad_out(p, 83);
      const ForwardOut fwd = gpu::forward(step06::kForward, p, in, true);
      check_grad_budget(p, in, dout, gpu::backward(version, p, in, fwd, dout), version.name);
    }
}

// The versions as sub-steps, production last: each against the one before it. Where two
// rows do the same arithmetic in the same order they must agree bit for bit: production
// is v13 with one barrier fewer (the same arithmetic) except for its 128-key blocks at
// d = 64 without the mask (a different order of sums), and b11 with two independent
// products reordered (the same dK, dV sums; dQ's atomics add in any order). Elsewhere a
// version changes how P is rounded or summed: the kernel-vs-model tolerances apply.
TEST_CASE("step06 each forward version matches the one before it; production equals v13 bit for bit", "[gpu]") {
  std::vector<const GpuForward*> rows;
  for (const GpuForward& version : step06::kForwardVersions) rows.push_back(&version);
  rows.push_back(&step06::kForward);
  for (const Problem& base : test::sweep({113, 1000}, {64, 128})) {
    const Problem p = lowp(base, DType::bf16);
    const Qkv in = inputs(p, 78);
    const GpuForward* prev = nullptr;
    ForwardOut before;
    for (const GpuForward* row : rows) {
      const ForwardOut out = gpu::forward(*row, p, in, true);
      if (prev) {
        INFO(row->name << " against " << prev->name << ", " << p.str() << ", seed 78");
        const bool same = row == &step06::kForward && !(p.d == 64 && !p.causal);
        FA_CHECK_CLOSE("O", out.o, before.o, same ? tol::kBitExact : step06::kBf16Reorder, test::shape_o(p));
        FA_CHECK_CLOSE("L", out.lse, before.lse, same ? tol::kBitExact : tol::kFp32Reorder, test::shape_l(p));
      }
      prev = row;
      before = out;
    }
  }
}

TEST_CASE("step06 each backward version matches the one before it; production's dK, dV equal b11's bit for bit",
          "[gpu]") {
  std::vector<const GpuBackward*> rows;
  for (const GpuBackward& version : step06::kBackwardVersions) rows.push_back(&version);
  rows.push_back(&step06::kBackward);
  for (const Problem& base : test::sweep({113, 1000}, {64, 128})) {
    const Problem p = lowp(base, DType::bf16);
    const Qkv in = inputs(p, 84);
    const std::vector<float> dout = grad_out(p, 85);
    const ForwardOut fwd = gpu::forward(step06::kForward, p, in, true);
    const GpuBackward* prev = nullptr;
    Grads before;
    for (const GpuBackward* row : rows) {
      const Grads g = gpu::backward(*row, p, in, fwd, dout);
      if (prev) {
        INFO(row->name << " against " << prev->name << ", " << p.str() << ", seeds 84, 85");
        const bool same = row == &step06::kBackward;
        FA_CHECK_CLOSE("dQ", g.dq, before.dq, step06::kBf16Reorder, test::shape_o(p));
        FA_CHECK_CLOSE("dK", g.dk, before.dk, same ? tol::kBitExact : step06::kBf16Reorder, test::shape_o(p));
        FA_CHECK_CLOSE("dV", g.dv, before.dv, same ? tol::kBitExact : step06::kBf16Reorder, test::shape_o(p));
      }
      prev = row;
      before = g;
    }
  }
}

TEST_CASE("step06 backward kernel meets the gradient budget and matches its model", "[gpu]") {
  for (DType t : {DType::bf16, DType::fp16})
    for (const Problem& base : test::sweep({1, 113, 1000}, kAllD)) {
      const Problem p = lowp(base, t);
      INFO(p.str() << ", seeds 78, 79");
      const Qkv in = inputs(p, 78);
      const std::vector<float> dout = grad_out(p, 79);
      const ForwardOut fwd = gpu::forward(step06::kForward, p, in, true);
      const Grads g = gpu::backward(step06::kBackward, p, in, fwd, dout);
      check_grad_budget(p, in, dout, g, "kernel");
      if (p.N <= 113) {
        const Grads m = step06::model_backward(p, in, fwd, dout).grads;
        const Tolerance& tl = test::reorder(t);
        check_grads_close("vs model", p, g, m, tl);
      }
    }
}

TEST_CASE("step06 backward with huge logits stays finite and within budget", "[gpu]") {
  // Scores of ±~100 after scaling: P is one-hot-like, exp must not overflow anywhere.
  const Problem p = lowp(make(1, 2, 113, 64, true, 8.0f), DType::bf16);
  const Qkv in = inputs(p, 80);
  const std::vector<float> dout = grad_out(p, 81);
  const ForwardOut fwd = gpu::forward(step06::kForward, p, in, true);
  check_budget(p, in, fwd, "kernel");
  check_grad_budget(p, in, dout, gpu::backward(step06::kBackward, p, in, fwd, dout), "kernel");
}

TEST_CASE("step06 forward rescales correctly when the row max keeps rising", "[gpu]") {
  // Exercises both branches of the lazy rescaling on the GPU: blocks that raise a
  // row's max by more than 2^8 (O and ℓ rescaled) and blocks that raise it by less.
  for (const Problem& base : test::sweep({1000}, kAllD)) {
    const Problem p = lowp(base, DType::bf16);
    INFO(p.str());
    const Qkv in = rising_scores(p, 85);
    const ForwardOut out = gpu::forward(step06::kForward, p, in, true);
    check_budget(p, in, out, "kernel");
    const ModelForward m = step06::model_forward(p, in);
    FA_CHECK_CLOSE("O vs model", out.o, m.out.o, step06::kBf16Reorder, test::shape_o(p));
    FA_CHECK_CLOSE("L vs model", out.lse, m.out.lse, tol::kFp32Reorder, test::shape_l(p));
  }
}

TEST_CASE("step06 refuses what it does not support", "[gpu]") {
  const Problem p = make(1, 1, 8, 64, false);
  const Qkv in = random_qkv(p, 1);
  const ForwardOut f{in.q, std::vector<float>(p.rows())};
  CHECK(test::contains(test::error_of([&] { gpu::forward(step06::kForward, p, in, true); }), "bf16 or fp16"));
  CHECK(test::contains(test::error_of([&] { gpu::backward(step06::kBackward, p, in, f, in.q); }), "bf16 or fp16"));
  const Problem q = lowp(make(1, 1, 8, 40, false), DType::bf16);
  const Qkv iq = random_qkv(q, 1);
  const ForwardOut fq{iq.q, std::vector<float>(q.rows())};
  CHECK(test::contains(test::error_of([&] { gpu::forward(step06::kForward, q, iq, true); }), "d = 32, 64, 96, 128, 256"));
  CHECK(test::contains(test::error_of([&] { gpu::backward(step06::kBackward, q, iq, fq, iq.q); }),
                       "d = 32, 64, 96, 128, 256"));
  // The versions of the note's tables stop at d = 64, 128 (the production kernels do not).
  const Problem w = lowp(make(1, 1, 8, 96, false), DType::bf16);
  const Qkv iw = random_qkv(w, 1);
  CHECK(test::contains(test::error_of([&] { gpu::forward(step06::kForwardVersions[0], w, iw, true); }), "d = 64, 128"));
}

TEST_CASE("step06 kernels at the other head dimensions: d 32 96 256 (also under the sanitizers)", "[gpu]") {
  // The sweeps above cover these d too, but FA_TEST_QUICK keeps only d = 40 and 128
  // there: this case keeps one shape with partial tiles for the sanitizer runs.
  for (int d : {32, 96, 256})
    for (bool causal : {false, true}) {
      const Problem p = lowp(make(2, 3, 113, d, causal), DType::bf16);
      INFO(p.str() << ", seeds 86, 87");
      const Qkv in = inputs(p, 86);
      const std::vector<float> dout = grad_out(p, 87);
      const ForwardOut fwd = gpu::forward(step06::kForward, p, in, true);
      check_budget(p, in, fwd, "kernel");
      const ModelForward m = step06::model_forward(p, in);
      FA_CHECK_CLOSE("O vs model", fwd.o, m.out.o, step06::kBf16Reorder, test::shape_o(p));
      const Grads g = gpu::backward(step06::kBackward, p, in, fwd, dout);
      check_grad_budget(p, in, dout, g, "kernel");
      const Grads mg = step06::model_backward(p, in, fwd, dout).grads;
      check_grads_close("vs model", p, g, mg, step06::kBf16Reorder);
    }
}
#endif
