// Step 05 tests: the recomputing backward against step 01's materialized one and
// the reference; the whole pipeline (step 03/04 forward, step 05 backward)
// against finite differences; determinism; traffic formula.
#include "reference/reference.hpp"
#include "steps/01_naive/step01.hpp"
#include "steps/03_online_softmax/step03.hpp"
#include "steps/05_backward/step05.hpp"
#include "tests/check.hpp"
#ifdef FA_HAVE_CUDA
#include "common/gpu.hpp"
#include "steps/04_kv_outer/step04.hpp"
#endif

using namespace fa;
using fa::test::make;

TEST_CASE("step05 model computes the gradients", "[cpu]") {
  for (const Problem& p : test::sweep({1, 17, 113}, {16, 40})) {
    INFO(p.str() << ", seed 61");
    const Qkv in = random_qkv(p, 61);
    const std::vector<float> dout = random_tensor(p.elems(), 62);
    const ForwardOut fwd = step03::model_forward(p, in).out;
    const Grads g = step05::model_backward(p, in, fwd, dout).grads, ref = reference::backward(p, in, dout);
    FA_CHECK_CLOSE("dQ", g.dq, ref.dq, tol::kFp32Backward, test::shape_o(p));
    FA_CHECK_CLOSE("dK", g.dk, ref.dk, tol::kFp32Backward, test::shape_o(p));
    FA_CHECK_CLOSE("dV", g.dv, ref.dv, tol::kFp32Backward, test::shape_o(p));
  }
}

TEST_CASE("step03 forward + step05 backward agree with finite differences", "[cpu]") {
  // The pipeline's gradient against central differences of the exact (fp64)
  // function: the fp32 pipeline's own error dominates, hence kFp32Backward.
  for (bool causal : {false, true}) {
    const Problem p = make(1, 2, 37, 8, causal);
    INFO(p.str());
    const Qkv in = random_qkv(p, 63);
    const std::vector<float> dout = random_tensor(p.elems(), 64);
    const Grads g = step05::model_backward(p, in, step03::model_forward(p, in).out, dout).grads;
    reference::QkvD x{{in.q.begin(), in.q.end()}, {in.k.begin(), in.k.end()}, {in.v.begin(), in.v.end()}};
    auto loss = [&] {
      const auto o = reference::forward_d(p, x).o;
      double s = 0;
      for (std::size_t i = 0; i < o.size(); ++i) s += double(dout[i]) * o[i];
      return s;
    };
    const double h = 1e-4;
    std::vector<double>* inputs[] = {&x.q, &x.k, &x.v};
    const std::vector<float>* grads[] = {&g.dq, &g.dk, &g.dv};
    const char* names[] = {"dQ", "dK", "dV"};
    for (int t = 0; t < 3; ++t) {
      std::vector<float> fd(p.elems());
      for (std::size_t i = 0; i < p.elems(); ++i) {
        double& e = (*inputs[t])[i];
        const double keep = e;
        e = keep + h;
        const double up = loss();
        e = keep - h;
        const double down = loss();
        e = keep;
        fd[i] = float((up - down) / (2 * h));
      }
      FA_CHECK_CLOSE(names[t], *grads[t], fd, tol::kFp32Backward, test::shape_o(p));
    }
  }
}

TEST_CASE("step05 model's HBM traffic equals the note's formula, and has no N² term", "[cpu]") {
  for (const Problem& p : {make(1, 1, 1, 16, false), make(2, 3, 113, 40, true), make(1, 1, 100, 64, false)}) {
    INFO(p.str());
    const Qkv in = random_qkv(p, 1);
    const ForwardOut fwd = step03::model_forward(p, in).out;
    const Traffic m = step05::model_backward(p, in, fwd, in.v).traffic, f = step05::traffic_backward(p);
    FA_CHECK_EQ("model's HBM reads vs formula (step 05)", m.read, f.read);
    FA_CHECK_EQ("model's HBM writes vs formula (step 05)", m.written, f.written);
  }
  const Problem p = make(1, 1, 2048, 64, false);
  CHECK(step05::traffic_backward(p).total() < step01::traffic_backward(p).total());
}

TEST_CASE("step05's extra memory is Θ(N): one float per row, D", "[cpu]") {
  // The model's one array beyond its inputs and outputs is D, sized by workspace_bytes —
  // the kernel's workspace too. Doubling N doubles it, at every N (step 01's backward
  // keeps P, dP and dS instead: 3·N² floats per head, quadrupling).
  for (int heads : {1, 16}) {
    std::size_t prev = 0;
    for (int N = 1024; N <= 1 << 20; N *= 2) {
      const Problem p = make(1, heads, N, 64, false);
      const std::size_t w = step05::workspace_bytes(p);
      INFO("H = " << heads << ", N = " << N << ": " << w << " bytes");
      CHECK(w == sizeof(float) * std::size_t(heads) * std::size_t(N));
      if (prev) CHECK(w == 2 * prev);
      prev = w;
    }
  }
}

#ifdef FA_HAVE_CUDA
TEST_CASE("step05 kernels match step 01's backward, the reference and the model", "[gpu]") {
  for (const Problem& p : test::sweep()) {
    INFO(p.str() << ", seed 65");
    const Qkv in = random_qkv(p, 65);
    const std::vector<float> dout = random_tensor(p.elems(), 66);
    const ForwardOut fwd = gpu::forward(step04::kForward, p, in, true);
    const Grads g = gpu::backward(step05::kBackward, p, in, fwd, dout);
    const Grads ref = reference::backward(p, in, dout);
    FA_CHECK_CLOSE("dQ vs reference", g.dq, ref.dq, tol::kFp32Backward, test::shape_o(p));
    FA_CHECK_CLOSE("dK vs reference", g.dk, ref.dk, tol::kFp32Backward, test::shape_o(p));
    FA_CHECK_CLOSE("dV vs reference", g.dv, ref.dv, tol::kFp32Backward, test::shape_o(p));
    const Grads g1 = gpu::backward(step01::kBackward, p, in, fwd, dout);
    FA_CHECK_CLOSE("dQ vs step01", g.dq, g1.dq, tol::kFp32Backward, test::shape_o(p));
    FA_CHECK_CLOSE("dK vs step01", g.dk, g1.dk, tol::kFp32Backward, test::shape_o(p));
    FA_CHECK_CLOSE("dV vs step01", g.dv, g1.dv, tol::kFp32Backward, test::shape_o(p));
    if (p.N <= 113) {
      const Grads gm = step05::model_backward(p, in, fwd, dout).grads;
      FA_CHECK_CLOSE("dQ vs model", g.dq, gm.dq, tol::kFp32Backward, test::shape_o(p));
      FA_CHECK_CLOSE("dK vs model", g.dk, gm.dk, tol::kFp32Backward, test::shape_o(p));
      FA_CHECK_CLOSE("dV vs model", g.dv, gm.dv, tol::kFp32Backward, test::shape_o(p));
    }
    // No atomics: a second run gives the same bits.
    const Grads again = gpu::backward(step05::kBackward, p, in, fwd, dout);
    FA_CHECK_CLOSE("dQ rerun", again.dq, g.dq, tol::kBitExact, test::shape_o(p));
    FA_CHECK_CLOSE("dK rerun", again.dk, g.dk, tol::kBitExact, test::shape_o(p));
  }
}

TEST_CASE("step05 handles d = 256 with huge logits", "[gpu]") {
  const Problem p = make(1, 2, 150, 256, true);
  const Qkv in = random_qkv(p, 67, 3.0f);
  const std::vector<float> dout = random_tensor(p.elems(), 68);
  const ForwardOut fwd = gpu::forward(step03::kForward, p, in, true);
  const Grads g = gpu::backward(step05::kBackward, p, in, fwd, dout), ref = reference::backward(p, in, dout);
  FA_CHECK_CLOSE("dQ", g.dq, ref.dq, tol::kFp32Backward, test::shape_o(p));
  FA_CHECK_CLOSE("dK", g.dk, ref.dk, tol::kFp32Backward, test::shape_o(p));
  FA_CHECK_CLOSE("dV", g.dv, ref.dv, tol::kFp32Backward, test::shape_o(p));
}
#endif
