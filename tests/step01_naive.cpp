// Step 01 tests: the CPU model against the reference, its traffic against the
// note's formulas, and (on a GPU) the kernels against the reference and the model.
#include "reference/reference.hpp"
#include "steps/01_naive/step01.hpp"
#include "tests/check.hpp"
#ifdef FA_HAVE_CUDA
#include "common/gpu.hpp"
#endif

using namespace fa;
using fa::test::make;

TEST_CASE("step01 model computes attention (softmax and not, forward and backward)", "[cpu]") {
  for (const Problem& p : test::sweep({1, 17, 113}, {16, 40})) {
    INFO(p.str() << ", seed 11");
    const Qkv in = random_qkv(p, 11);
    const ModelForward m = step01::model_forward(p, in, true);
    const ForwardOut ref = reference::forward(p, in);
    FA_CHECK_CLOSE("O", m.out.o, ref.o, tol::kFp32Forward, test::shape_o(p));
    FA_CHECK_CLOSE("L", m.out.lse, ref.lse, tol::kFp32Forward, test::shape_l(p));
    FA_CHECK_CLOSE("O without softmax", step01::model_forward(p, in, false).out.o, reference::forward_nosoftmax(p, in),
                   tol::kFp32NoSoftmax, test::shape_o(p));
    const std::vector<float> dout = random_tensor(p.elems(), 12);
    const Grads g = step01::model_backward(p, in, m.out, dout).grads, gr = reference::backward(p, in, dout);
    FA_CHECK_CLOSE("dQ", g.dq, gr.dq, tol::kFp32Backward, test::shape_o(p));
    FA_CHECK_CLOSE("dK", g.dk, gr.dk, tol::kFp32Backward, test::shape_o(p));
    FA_CHECK_CLOSE("dV", g.dv, gr.dv, tol::kFp32Backward, test::shape_o(p));
  }
}

TEST_CASE("step01 model's HBM traffic equals the note's formulas", "[cpu]") {
  for (const Problem& p : {make(1, 1, 1, 16, false), make(2, 1, 100, 40, true), make(1, 2, 64, 32, false),
                           make(1, 1, 257, 70, true)}) {
    INFO(p.str());
    const Qkv in = random_qkv(p, 1);
    for (bool softmax : {true, false}) {
      INFO("softmax " << softmax);
      const Traffic m = step01::model_forward(p, in, softmax).traffic, f = step01::traffic_forward(p, softmax);
      FA_CHECK_EQ("model's HBM reads vs formula (step 01)", m.read, f.read);
      FA_CHECK_EQ("model's HBM writes vs formula (step 01)", m.written, f.written);
    }
    const ModelForward fwd = step01::model_forward(p, in, true);
    const Traffic m = step01::model_backward(p, in, fwd.out, in.q).traffic, f = step01::traffic_backward(p);
    FA_CHECK_EQ("model's HBM reads vs formula (step 01)", m.read, f.read);
    FA_CHECK_EQ("model's HBM writes vs formula (step 01)", m.written, f.written);
  }
  // The lecture's Θ(Nd + N²): with d = 32 = the tile, N = 1024, the forward moves
  // 2N²(Q,K) + 3N² (softmax) + N²(P) + N²(V) reads and 2N² + N + Nd writes per head.
  const Problem p = make(1, 1, 1024, 32, false);
  const std::uint64_t N = 1024, NN = N * N;
  FA_CHECK_EQ("step 01 forward reads vs the closed form (N = 1024, d = 32)", step01::traffic_forward(p, true).read,
              2 * NN + 3 * NN + NN + NN);
  FA_CHECK_EQ("step 01 forward writes vs the closed form (N = 1024, d = 32)", step01::traffic_forward(p, true).written,
              2 * NN + N + N * 32);
}

TEST_CASE("step01's FLOPs: two N×N×d products a head, masked scores too (exercise 01-flops)", "[cpu]") {
  // The usual convention (Problem::flops_forward: 4·B·H·N²·d without a mask) — step 01
  // computes every score, so its causal forward costs as much.
  for (const Problem& p : {make(1, 1, 1, 16, false), make(2, 3, 113, 40, true), make(1, 2, 1024, 64, false)}) {
    INFO(p.str());
    Problem all = p;
    all.causal = false;
    FA_CHECK_EQ("step 01's FLOPs vs 4·B·H·N²·d", step01::flops_forward(p), std::uint64_t(all.flops_forward()));
  }
  FA_CHECK_EQ("step 01's FLOPs at N = 1024, d = 64, one head", step01::flops_forward(make(1, 1, 1024, 64, false)),
              std::uint64_t(268435456));
}

TEST_CASE("step01's device memory is Θ(N²): S and P beside the tensors", "[cpu]") {
  const Problem p = make(2, 3, 113, 40, false);
  const Qkv in = random_qkv(p, 1);
  const ForwardOut o = step01::model_forward(p, in, true).out;
  FA_CHECK_EQ("step 01's memory vs Q, K, V, O, L and S, P", step01::memory_forward(p),
              std::uint64_t(in.q.size() * 4 + o.lse.size() + 2 * p.heads() * std::size_t(p.N) * p.N));
}

#ifdef FA_HAVE_CUDA
TEST_CASE("step01 kernels match the reference and the CPU model", "[gpu]") {
  for (const Problem& p : test::sweep()) {
    INFO(p.str() << ", seed 21");
    const Qkv in = random_qkv(p, 21);
    const ForwardOut ref = reference::forward(p, in);
    const ForwardOut out = gpu::forward(step01::kForward, p, in, true);
    FA_CHECK_CLOSE("O vs reference", out.o, ref.o, tol::kFp32Forward, test::shape_o(p));
    FA_CHECK_CLOSE("L vs reference", out.lse, ref.lse, tol::kFp32Forward, test::shape_l(p));
    const std::vector<float> o_ns = gpu::forward(step01::kForwardNoSoftmax, p, in, false).o;
    FA_CHECK_CLOSE("O (no softmax) vs reference", o_ns, reference::forward_nosoftmax(p, in), tol::kFp32NoSoftmax,
                   test::shape_o(p));
    if (p.N <= 113) {  // the model is slow; the small shapes cover its tile edges
      const ModelForward m = step01::model_forward(p, in, true);
      FA_CHECK_CLOSE("O vs model", out.o, m.out.o, tol::kFp32Reorder, test::shape_o(p));
      FA_CHECK_CLOSE("L vs model", out.lse, m.out.lse, tol::kFp32Reorder, test::shape_l(p));
    }
    const std::vector<float> dout = random_tensor(p.elems(), 22);
    const Grads g = gpu::backward(step01::kBackward, p, in, out, dout), gr = reference::backward(p, in, dout);
    FA_CHECK_CLOSE("dQ vs reference", g.dq, gr.dq, tol::kFp32Backward, test::shape_o(p));
    FA_CHECK_CLOSE("dK vs reference", g.dk, gr.dk, tol::kFp32Backward, test::shape_o(p));
    FA_CHECK_CLOSE("dV vs reference", g.dv, gr.dv, tol::kFp32Backward, test::shape_o(p));
    if (p.N <= 113) {
      const Grads gm = step01::model_backward(p, in, out, dout).grads;
      FA_CHECK_CLOSE("dQ vs model", g.dq, gm.dq, tol::kFp32Backward, test::shape_o(p));
      FA_CHECK_CLOSE("dK vs model", g.dk, gm.dk, tol::kFp32Backward, test::shape_o(p));
      FA_CHECK_CLOSE("dV vs model", g.dv, gm.dv, tol::kFp32Backward, test::shape_o(p));
    }
  }
}

TEST_CASE("step01 refuses a problem whose S and P do not fit in device memory", "[gpu]") {
  const Problem p = make(1, 1, 300000, 16, false);  // 2·N² floats = 720 GB
  const Qkv in = random_qkv(p, 1);
  const std::string e = test::error_of([&] { gpu::forward(step01::kForward, p, in, true); });
  INFO(e);
  CHECK(test::contains(e, "S and P"));
  CHECK(test::contains(e, "free"));
}
#endif
