// Step 09 tests. The ring computes what step 06 computes on the whole sequence, in
// pieces merged by the course's rule: so against step 06's model on the same 16-bit
// inputs (bit for bit with one rank, within the merge's reordering with several), the
// fp64 reference by FlashAttention's rules (forward 2×, gradients 3× a naive same-dtype
// computation's error), and the zigzag layout's promise: every rank the same work at
// every step. What travels is counted against the formula.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "reference/reference.hpp"
#include "steps/06_tensor_cores/step06.hpp"
#include "steps/09_ring/step09.hpp"
#include "tests/check.hpp"
#include "tests/lowp.hpp"
#include "tests/ring_sizes.hpp"

using namespace fa;
using fa::test::make;

namespace {
using test::check_budget;
using test::check_grad_budget;
using test::check_grads_close;
using test::grad_out;
using test::inputs;
using test::lowp;
using test::reorder;
using test::ring_sizes;

}  // namespace

TEST_CASE("step09 zigzag layout: chunks, the ring's order, the calls of every rank and step", "[cpu]") {
  // R = 4: eight chunks; rank r holds r and 7 − r.
  CHECK(step09::chunks_of(0, 4).early == 0);
  CHECK(step09::chunks_of(0, 4).late == 7);
  CHECK(step09::chunks_of(3, 4).early == 3);
  CHECK(step09::chunks_of(3, 4).late == 4);
  // At step s rank r holds the block of rank r − s: every block visits every rank once.
  for (int r = 0; r < 4; ++r) {
    std::vector<int> seen;
    for (int s = 0; s < 4; ++s) seen.push_back(step09::kv_source(r, s, 4));
    std::sort(seen.begin(), seen.end());
    CHECK(seen == std::vector<int>{0, 1, 2, 3});
    CHECK(step09::kv_source(r, 1, 4) == (r + 3) % 4);
  }
  // Causal, after step 0: from a lower rank both query chunks meet the early key chunk;
  // from a higher rank the late query chunk meets both key chunks.
  const auto lower = step09::local_calls(2, 1, 4, true);  // the block of rank 1: chunks 1, 6
  REQUIRE(lower.size() == 2);
  CHECK((lower[0].q == std::vector<int>{2} && lower[0].kv == std::vector<int>{1}));
  CHECK((lower[1].q == std::vector<int>{5} && lower[1].kv == std::vector<int>{1}));
  const auto higher = step09::local_calls(1, 3, 4, true);  // the block of rank 2: chunks 2, 5
  REQUIRE(higher.size() == 2);
  CHECK((higher[0].q == std::vector<int>{6} && higher[0].kv == std::vector<int>{2}));
  CHECK((higher[1].q == std::vector<int>{6} && higher[1].kv == std::vector<int>{5}));
  for (int r = 0; r < 4; ++r)
    for (int s = 1; s < 4; ++s)
      for (const auto& call : step09::local_calls(r, s, 4, true)) {
        CHECK(!call.causal);              // never the diagonal after step 0
        CHECK(call.kv[0] < call.q[0]);    // and never a key chunk after its query chunk
      }
  const auto own = step09::local_calls(1, 0, 4, true);
  REQUIRE(own.size() == 1);
  CHECK(own[0].causal);
  CHECK((own[0].q == std::vector<int>{1, 6} && own[0].kv == std::vector<int>{1, 6}));
  REQUIRE(step09::local_calls(1, 2, 4, false).size() == 1);  // not causal: the whole block
}

TEST_CASE("step09 merge of two finished parts: the empty part changes nothing, two halves are the whole", "[cpu]") {
  const int d = 8;
  std::vector<float> s(16), v(16 * d);
  for (int j = 0; j < 16; ++j) s[j] = 0.37f * float(j % 5) - 1.1f + 0.05f * float(j);
  for (int x = 0; x < 16 * d; ++x) v[x] = std::sin(0.3f * float(x));
  // A softmax over keys [from, to): (O normalised, L), in double then stored in fp32.
  auto part = [&](int from, int to, std::vector<float>& o) {
    double m = -INFINITY, l = 0;
    for (int j = from; j < to; ++j) m = std::max(m, double(s[j]));
    std::vector<double> acc(d, 0.0);
    for (int j = from; j < to; ++j) {
      const double p = std::exp(double(s[j]) - m);
      l += p;
      for (int x = 0; x < d; ++x) acc[x] += p * v[j * d + x];
    }
    o.assign(d, 0.0f);
    for (int x = 0; x < d; ++x) o[x] = float(acc[x] / l);
    return float(m + std::log(l));
  };
  std::vector<float> whole, a, b;
  const float Lw = part(0, 16, whole), La = part(0, 7, a), Lb = part(7, 16, b);
  float L = La;
  std::vector<float> o = a;
  step09::merge_normalised(L, o.data(), Lb, b.data(), d);
  CHECK(std::fabs(L - Lw) < 1e-6f);
  for (int x = 0; x < d; ++x) CHECK(std::fabs(o[x] - whole[x]) < 1e-6f);
  // Merged the other way round: the same up to fp32 rounding; with an empty part: unchanged.
  float L2 = Lb;
  std::vector<float> o2 = b;
  step09::merge_normalised(L2, o2.data(), La, a.data(), d);
  for (int x = 0; x < d; ++x) CHECK(std::fabs(o2[x] - o[x]) < 1e-6f);
  const std::vector<float> zero(d, 0.0f), before = o;
  const float L_before = L;
  step09::merge_normalised(L, o.data(), -INFINITY, zero.data(), d);
  CHECK(L == L_before);
  CHECK(o == before);
  // Into an empty state: the part itself.
  float Le = -INFINITY;
  std::vector<float> oe(d, 0.0f);
  step09::merge_normalised(Le, oe.data(), La, a.data(), d);
  CHECK(Le == La);
  CHECK(oe == a);
}

TEST_CASE("step09 with one rank is step 06's model, bit for bit, forward and backward", "[cpu]") {
  for (DType t : {DType::bf16, DType::fp16})
    for (bool causal : {false, true})
      for (int N : {2, 34, 226}) {
        const Problem p = lowp(make(2, 3, N, 64, causal), t);
        INFO(p.str() << ", seeds 120, 121");
        const Qkv in = inputs(p, 120);
        const ForwardOut ring = step09::model_forward(p, in, 1).out, whole = step06::model_forward(p, in).out;
        FA_CHECK_CLOSE("O", ring.o, whole.o, tol::kBitExact, test::shape_o(p));
        FA_CHECK_CLOSE("L", ring.lse, whole.lse, tol::kBitExact, test::shape_l(p));
        const std::vector<float> dout = grad_out(p, 121);
        check_grads_close("backward", p, step09::model_backward(p, in, whole, dout, 1).grads,
                          step06::model_backward(p, in, whole, dout).grads, tol::kBitExact);
      }
}

TEST_CASE("step09 over 2, 3 and 4 ranks: step 06's result within the merge's reordering, and the budget", "[cpu]") {
  for (int ranks : {2, 3, 4})
    for (int N : ring_sizes(ranks))
      for (int d : {32, 128})
        for (bool causal : {false, true})
          for (DType t : {DType::bf16, DType::fp16}) {
            if (t == DType::fp16 && (d != 128 || N > 300)) continue;  // fp16: one d, the small sizes
            const Problem p = lowp(make(1, 2, N, d, causal), t);
            INFO(p.str() << ", R = " << ranks << ", seeds 122, 123");
            const Qkv in = inputs(p, 122);
            const ForwardOut ring = step09::model_forward(p, in, ranks).out, whole = step06::model_forward(p, in).out;
            check_budget(p, in, ring, "ring");
            FA_CHECK_CLOSE("O vs step 06", ring.o, whole.o, reorder(t), test::shape_o(p));
            FA_CHECK_CLOSE("L vs step 06", ring.lse, whole.lse, tol::kFp32Reorder, test::shape_l(p));
            const std::vector<float> dout = grad_out(p, 123);
            const Grads g = step09::model_backward(p, in, ring, dout, ranks).grads;
            check_grad_budget(p, in, dout, g, "ring");
            check_grads_close("vs step 06", p, g, step06::model_backward(p, in, ring, dout).grads, reorder(t));
          }
}

TEST_CASE("step09 with huge logits stays finite and within budget", "[cpu]") {
  for (bool causal : {false, true}) {
    const Problem p = lowp(make(1, 2, 136, 64, causal, 8.0f), DType::bf16);
    INFO(p.str() << ", R = 4");
    const Qkv in = inputs(p, 124);
    const ForwardOut ring = step09::model_forward(p, in, 4).out;
    check_budget(p, in, ring, "ring");
    const std::vector<float> dout = grad_out(p, 125);
    check_grad_budget(p, in, dout, step09::model_backward(p, in, ring, dout, 4).grads, "ring");
  }
}

TEST_CASE("step09 zigzag: with the mask every rank computes the same at every step; bytes sent = the formula",
          "[cpu]") {
  for (bool causal : {true, false}) {
    const int ranks = 4, c = 17;
    const Problem p = lowp(make(1, 2, 2 * ranks * c, 64, causal), DType::bf16);
    INFO(p.str());
    const Qkv in = inputs(p, 126);
    const step09::RingForward f = step09::model_forward(p, in, ranks);
    std::uint64_t total = 0;
    for (int s = 0; s < ranks; ++s)
      for (int r = 0; r < ranks; ++r) {
        CHECK(f.stats.pairs[s][r] == f.stats.pairs[s][0]);
        total += f.stats.pairs[s][r];
      }
    const std::uint64_t n = std::uint64_t(p.N);
    CHECK(total == p.heads() * (causal ? n * (n + 1) / 2 : n * n));  // every visible pair once
    if (causal) {  // after step 0 each rank computes half a block: two chunk pairs
      CHECK(f.stats.pairs[1][0] == p.heads() * 2 * std::uint64_t(c) * c);
    }
    const step09::RingBackward b = step09::model_backward(p, in, f.out, grad_out(p, 127), ranks);
    for (int r = 0; r < ranks; ++r) {
      CHECK(f.stats.sent[r] == step09::sent_forward(p, ranks));
      CHECK(b.stats.sent[r] == step09::sent_backward(p, ranks));
    }
  }
  const Problem one = lowp(make(1, 1, 8, 64, false), DType::bf16);
  CHECK(step09::sent_forward(one, 1) == 0);
  CHECK(step09::sent_backward(one, 1) == 0);
}

TEST_CASE("step09 refuses what the ring does not take, in one line", "[cpu]") {
  const Problem p = lowp(make(1, 1, 100, 64, false), DType::bf16);
  const Qkv in = random_qkv(p, 1);
  CHECK(test::contains(test::error_of([&] { step09::model_forward(p, in, 3); }), "must divide into 2·R = 6 chunks"));
  CHECK(test::contains(test::error_of([&] { step09::model_forward(p, in, 0); }), "at least one rank"));
  const Problem f = make(1, 1, 8, 64, false);
  CHECK(test::contains(test::error_of([&] { step09::model_forward(f, random_qkv(f, 1), 2); }), "bf16 or fp16"));
  Problem k = lowp(make(1, 1, 8, 64, false), DType::bf16);
  k.N_kv = 16;
  CHECK(test::contains(test::error_of([&] { step09::model_forward(k, random_qkv(k, 1), 2); }),
                       "as many keys as queries"));
  const Problem w = lowp(make(1, 1, 8, 40, false), DType::bf16);
  CHECK(test::contains(test::error_of([&] { step09::model_forward(w, random_qkv(w, 1), 2); }), "d = 32, 64"));
}

#ifdef FA_HAVE_CUDA
#include "common/gpu.hpp"

// The ring on one GPU: its ranks' local calls are local_kernels(p) (step 07's on an
// H200, step 06's on older GPUs), so against that kernel on the whole sequence (bit for
// bit with one rank but for dQ, which both steps add in any order; within the reordering
// with several), against the model (step 06's: the same calls and merges, the kernels'
// own fp32 order apart), and the budget.
TEST_CASE("step09 ring on one GPU, R = 1, 2, 4: the local kernel on the whole sequence, the model, the budget",
          "[gpu]") {
  for (int ranks : {1, 2, 4})
    for (int N : ring_sizes(ranks))
      for (int d : {64, 128})
        for (bool causal : {false, true}) {
          const Problem p = lowp(make(1, 3, N, d, causal), DType::bf16);
          INFO(p.str() << ", R = " << ranks << ", seeds 130, 131");
          const Qkv in = inputs(p, 130);
          INFO("local kernel: " << step09::local_kernels(p).forward->name);
          const ForwardOut ring = step09::gpu_forward(p, in, ranks);
          const ForwardOut whole = gpu::forward(*step09::local_kernels(p).forward, p, in, true);
          const Tolerance& t = ranks == 1 ? tol::kBitExact : step06::kBf16Reorder;
          FA_CHECK_CLOSE("O vs the local kernel", ring.o, whole.o, t, test::shape_o(p));
          FA_CHECK_CLOSE("L vs the local kernel", ring.lse, whole.lse, ranks == 1 ? tol::kBitExact : tol::kFp32Reorder,
                         test::shape_l(p));
          const ForwardOut model = step09::model_forward(p, in, ranks).out;
          FA_CHECK_CLOSE("O vs model", ring.o, model.o, step06::kBf16Reorder, test::shape_o(p));
          if (N <= 300) check_budget(p, in, ring, "ring");
          const std::vector<float> dout = grad_out(p, 131);
          const Grads g = step09::gpu_backward(p, in, ring, dout, ranks);
          // dQ: both steps' kernels add its pieces in any order (fp32 atomics, bulk
          // reductions), so even at R = 1 it is equal only within that reordering; dK and dV follow t.
          const Grads whole_g = gpu::backward(*step09::local_kernels(p).backward, p, in, ring, dout);
          FA_CHECK_CLOSE("dQ vs the local kernel", g.dq, whole_g.dq, step06::kBf16Reorder, test::shape_o(p));
          FA_CHECK_CLOSE("dK vs the local kernel", g.dk, whole_g.dk, t, test::shape_o(p));
          FA_CHECK_CLOSE("dV vs the local kernel", g.dv, whole_g.dv, t, test::shape_o(p));
          check_grads_close("vs model", p, g, step09::model_backward(p, in, ring, dout, ranks).grads,
                            step06::kBf16Reorder);
          if (N <= 300) check_grad_budget(p, in, dout, g, "ring");
        }
}

TEST_CASE("step09 ring on one GPU: fp16, huge logits, R = 3", "[gpu]") {
  for (bool causal : {false, true}) {
    const Problem p = lowp(make(2, 2, 102, 64, causal, 8.0f), DType::fp16);
    INFO(p.str() << ", R = 3");
    const Qkv in = inputs(p, 132);
    const ForwardOut ring = step09::gpu_forward(p, in, 3);
    check_budget(p, in, ring, "ring");
    const std::vector<float> dout = grad_out(p, 133);
    check_grad_budget(p, in, dout, step09::gpu_backward(p, in, ring, dout, 3), "ring");
  }
}
#endif

TEST_CASE("step09 merge of two empty parts changes nothing, and no NaN (exercise 09-merge)", "[cpu]") {
  // A row no key reached yet on either side (L = −∞ both): ℓ = 0, so the weights cannot
  // be divided by it — the merge must keep the old part as it is.
  const step09::RowMerge w = step09::merge_rows(-INFINITY, -INFINITY);
  FA_CHECK_EQ("both empty: the old part's weight", w.w_old, 1.0f);
  FA_CHECK_EQ("both empty: the new part's weight", w.w_new, 0.0f);
  FA_CHECK_EQ("both empty: the merged L", w.L, -INFINITY);
  const int d = 4;
  float L = -INFINITY;
  std::vector<float> o(d, 0.0f);
  const std::vector<float> empty(d, 0.0f);
  step09::merge_normalised(L, o.data(), -INFINITY, empty.data(), d);
  FA_CHECK_EQ("both empty: L after the merge", L, -INFINITY);
  for (int x = 0; x < d; ++x) FA_CHECK_EQ("both empty: O after the merge (0, not NaN)", o[x], 0.0f);
  // One side empty: the other comes through whole.
  const step09::RowMerge one = step09::merge_rows(-INFINITY, 3.0f);
  FA_CHECK_EQ("old part empty: its weight", one.w_old, 0.0f);
  FA_CHECK_EQ("old part empty: the new part's weight", one.w_new, 1.0f);
  FA_CHECK_EQ("old part empty: the merged L", one.L, 3.0f);
}
