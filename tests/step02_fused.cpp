// Step 02 tests: fused O = (scale·QKᵀ)V against step 01's materialized version,
// the reference and its own CPU model; traffic against the note's formula.
#include "reference/reference.hpp"
#include "steps/01_naive/step01.hpp"
#include "steps/02_fused/step02.hpp"
#include "steps/02_fused/tile.hpp"
#include "tests/check.hpp"
#ifdef FA_HAVE_CUDA
#include "common/gpu.hpp"
#endif

using namespace fa;
using fa::test::make;

TEST_CASE("step02 model equals the reference's attention without softmax", "[cpu]") {
  for (const Problem& p : test::sweep({1, 17, 113}, {16, 40})) {
    INFO(p.str() << ", seed 31");
    const Qkv in = random_qkv(p, 31);
    FA_CHECK_CLOSE("O", step02::model_forward(p, in).out.o, reference::forward_nosoftmax(p, in), tol::kFp32NoSoftmax,
                   test::shape_o(p));
  }
}

TEST_CASE("step02 model's HBM traffic equals the note's formula", "[cpu]") {
  for (const Problem& p : {make(1, 1, 1, 16, false), make(2, 3, 113, 40, true), make(1, 1, 100, 64, false),
                           make(1, 2, 97, 8, true)}) {
    INFO(p.str());
    const Traffic m = step02::model_forward(p, random_qkv(p, 1)).traffic, f = step02::traffic_forward(p);
    FA_CHECK_EQ("model's HBM reads vs formula (step 02)", m.read, f.read);
    FA_CHECK_EQ("model's HBM writes vs formula (step 02)", m.written, f.written);
  }
  // Closed forms (N a multiple of B_r = B_c = 32, T_r = N/32): Q once, K and V
  // T_r times, O once — and causal visits T_r(T_r+1)/2 of the T_r² block pairs.
  const std::uint64_t N = 256, d = 64, Tr = N / 32;
  CHECK(step02::traffic_forward(make(1, 1, 256, 64, false)).read == N * d + 2 * N * d * Tr);
  CHECK(step02::traffic_forward(make(1, 1, 256, 64, true)).read == N * d + 2 * d * 32 * Tr * (Tr + 1) / 2);
  CHECK(step02::traffic_forward(make(1, 1, 256, 64, false)).written == N * d);
  // Against step 01's no-softmax path at the same size: no N² term at all.
  CHECK(step02::traffic_forward(make(1, 1, 256, 64, false)).total() <
        step01::traffic_forward(make(1, 1, 256, 64, false), false).total());
}

TEST_CASE("step02 block sizes from the on-chip budget M (exercise 02-blocks)", "[cpu]") {
  // The largest square blocks b × b whose tiles fit M: Q_i, K_j, V_j, O_i (4·b·d), S_ij
  // (b²) and m, ℓ (2b) — the lecture's B_c ≈ M/(4d) while b ≪ d.
  auto need = [](std::size_t b, std::size_t d) { return 4 * b * d + b * b + 2 * b; };
  for (std::size_t M : {std::size_t(200), std::size_t(1100), std::size_t(4400), std::size_t(18800), std::size_t(100000)})
    for (int d : {16, 64, 128}) {
      if (need(1, std::size_t(d)) > M) continue;
      INFO("M = " << M << ", d = " << d);
      const tiles::Tiles t = tiles::tiles_for(M, d);
      FA_CHECK_EQ("B_r vs B_c (square blocks)", t.br, t.bc);
      const std::size_t b = std::size_t(t.br);
      FA_CHECK_BELOW("the blocks' elements vs M + 1 (they fit)", need(b, std::size_t(d)), M + 1);
      FA_CHECK_BELOW("M vs the elements of one size larger (b is the largest)", M, need(b + 1, std::size_t(d)));
      FA_CHECK_BELOW("b vs M/(4d) + 1", double(b), double(M) / (4.0 * d) + 1);
    }
  FA_CHECK_EQ("b for M = 4400, d = 64", tiles::tiles_for(4400, 64).br, 16);
}

#ifdef FA_HAVE_CUDA
TEST_CASE("step02 kernel matches step 01's no-softmax path, the reference and its model", "[gpu]") {
  for (const Problem& p : test::sweep()) {
    INFO(p.str() << ", seed 32");
    const Qkv in = random_qkv(p, 32);
    const std::vector<float> o = gpu::forward(step02::kForward, p, in, false).o;
    FA_CHECK_CLOSE("O vs step01", o, gpu::forward(step01::kForwardNoSoftmax, p, in, false).o, tol::kFp32NoSoftmax,
                   test::shape_o(p));
    FA_CHECK_CLOSE("O vs reference", o, reference::forward_nosoftmax(p, in), tol::kFp32NoSoftmax, test::shape_o(p));
    if (p.N <= 113)
      FA_CHECK_CLOSE("O vs model", o, step02::model_forward(p, in).out.o, tol::kFp32NoSoftmax, test::shape_o(p));
  }
}

TEST_CASE("step02 takes d up to 256 and refuses larger", "[gpu]") {
  const Problem p = make(1, 2, 70, 256, true);
  const Qkv in = random_qkv(p, 33);
  FA_CHECK_CLOSE("O d=256", gpu::forward(step02::kForward, p, in, false).o, reference::forward_nosoftmax(p, in),
                 tol::kFp32NoSoftmax, test::shape_o(p));
  const Problem big = make(1, 1, 8, 257, false);
  CHECK(test::contains(test::error_of([&] { gpu::forward(step02::kForward, big, random_qkv(big, 1), false); }),
                       "up to d = 256"));
}
#endif
