// Step 06 tests. The rule FlashAttention's own tests use: against the fp64
// reference, the step's error is at most twice the error of a naive computation
// in the same 16-bit type. The CPU model (which rounds where the kernel rounds)
// checks the algorithm and that budget without a GPU; the kernel must meet the
// budget on the GPU and agree with its model to a few 16-bit units.
#include "reference/reference.hpp"
#include "steps/06_tensor_cores/step06.hpp"
#include "tests/check.hpp"
#ifdef FA_HAVE_CUDA
#include "common/gpu.hpp"
#endif

using namespace fa;
using fa::test::make;

namespace {
Problem lowp(Problem p, DType t) {
  p.dtype = t;
  return p;
}

/// err(step) <= 2·err(naive same-dtype), for O and L, against the fp64 reference.
void check_budget(const Problem& p, const Qkv& in, const ForwardOut& got, const char* who) {
  const ForwardOut ref = reference::forward(p, in), naive = step06::naive_lowp(p, in);
  const double eo = step06::max_abs_error(got.o, ref.o), no = step06::max_abs_error(naive.o, ref.o);
  const double el = step06::max_abs_error(got.lse, ref.lse), nl = step06::max_abs_error(naive.lse, ref.lse);
  INFO(who << ": max |O − ref| = " << eo << " (naive " << dtype_name(p.dtype) << ": " << no << "), max |L − ref| = "
           << el << " (naive: " << nl << ")");
  CHECK(eo <= 2 * no);
  CHECK(el <= 2 * nl + 1e-6);  // + 1e-6: at N = 1 both L errors are 0 up to fp32 rounding
  const auto r = compare(got.o, ref.o, Tolerance{1.0, 0.0, "finite and written"});
  CHECK(r.nan == 0);
  CHECK(r.unwritten == 0);
}
}  // namespace

TEST_CASE("step06 model meets the error budget of its 16-bit type", "[cpu]") {
  for (DType t : {DType::bf16, DType::fp16})
    for (const Problem& base : test::sweep({1, 17, 113}, {64}))
      if (base.N < 1000) {
        const Problem p = lowp(base, t);
        INFO(p.str() << ", seed 71");
        const Qkv in = random_qkv(p, 71);
        check_budget(p, in, step06::model_forward(p, in).out, "model");
      }
}

TEST_CASE("step06 model's HBM traffic equals the formula", "[cpu]") {
  for (const Problem& base : {make(1, 1, 1, 64, false), make(2, 1, 130, 64, true), make(1, 2, 200, 128, false)}) {
    const Problem p = lowp(base, DType::bf16);
    INFO(p.str());
    const Traffic m = step06::model_forward(p, random_qkv(p, 1)).traffic, f = step06::traffic_forward(p);
    CHECK(m.read == f.read);
    CHECK(m.written == f.written);
  }
}

TEST_CASE("step06 model refuses fp32 problems", "[cpu]") {
  const Problem p = make(1, 1, 8, 64, false);
  CHECK(test::contains(test::error_of([&] { step06::model_forward(p, random_qkv(p, 1)); }), "bf16 or fp16"));
}

#ifdef FA_HAVE_CUDA
TEST_CASE("step06 kernel meets the error budget and matches its model", "[gpu]") {
  for (DType t : {DType::bf16, DType::fp16})
    for (const Problem& base : test::sweep({1, 113, 1000}, {64, 128})) {
      const Problem p = lowp(base, t);
      INFO(p.str() << ", seed 72");
      const Qkv in = random_qkv(p, 72);
      const ForwardOut out = gpu::forward(step06::kForward, p, in, true);
      check_budget(p, in, out, "kernel");
      if (p.N <= 113) {
        const ModelForward m = step06::model_forward(p, in);
        const Tolerance& tl = t == DType::bf16 ? step06::kBf16Reorder : step06::kFp16Reorder;
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
    const Qkv in = random_qkv(p, 73);
    check_budget(p, in, gpu::forward(step06::kForward, p, in, true), "kernel");
  }
}

TEST_CASE("step06 refuses what it does not support", "[gpu]") {
  const Problem p = make(1, 1, 8, 64, false);
  CHECK(test::contains(test::error_of([&] { gpu::forward(step06::kForward, p, random_qkv(p, 1), true); }),
                       "bf16 or fp16"));
  const Problem q = lowp(make(1, 1, 8, 40, false), DType::bf16);
  CHECK(test::contains(test::error_of([&] { gpu::forward(step06::kForward, q, random_qkv(q, 1), true); }),
                       "d = 64, 128"));
}
#endif
