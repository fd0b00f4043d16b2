// Step 04 tests: K/V-outer order against step 03 — the same updates in the same
// order, so bit for bit — for several group sizes, and its traffic formula; and the
// lecture's Θ(N²d²/M) for steps 02–04, with the on-chip budget M varied.
#include <cmath>

#include "reference/reference.hpp"
#include "steps/02_fused/step02.hpp"
#include "steps/02_fused/tile.hpp"
#include "steps/02_fused/tile_model.hpp"
#include "steps/03_online_softmax/step03.hpp"
#include "steps/04_kv_outer/step04.hpp"
#include "tests/check.hpp"
#ifdef FA_HAVE_CUDA
#include "common/gpu.hpp"
#endif

using namespace fa;
using fa::test::make;

TEST_CASE("step04 model equals step 03's model bit for bit, for any group size", "[cpu]") {
  for (const Problem& p : test::sweep({1, 17, 113}, {16, 40})) {
    const Qkv in = random_qkv(p, 51);
    const ModelForward s3 = step03::model_forward(p, in);
    for (int G : {1, 2, tiles::q_blocks(p.N)}) {
      INFO(p.str() << ", G = " << G);
      const ModelForward s4 = step04::model_forward(p, in, G);
      FA_CHECK_CLOSE("O", s4.out.o, s3.out.o, tol::kBitExact, test::shape_o(p));
      FA_CHECK_CLOSE("L", s4.out.lse, s3.out.lse, tol::kBitExact, test::shape_l(p));
    }
  }
}

TEST_CASE("steps 02-04: traffic follows Θ(N²d²/M) as the on-chip budget M grows", "[cpu]") {
  // The CPU models with blocks chosen from M (tiles::tiles_for): the counted traffic
  // equals each note's formula at every M, falls as M grows, and the re-reads of K and
  // V, 2·N·d·T_r = 2N²d/b, stay within a constant factor of N²d²/M: 2M/(bd), which is
  // 8 + (2b + 4)/d when the b × b blocks use M up — between 8 and 9.3 here (b ≤ d/2).
  const int d = 64;
  for (bool causal : {false, true}) {
    const Problem p = make(1, 1, 1024, d, causal);
    const Qkv in = random_qkv(p, 53);
    const ForwardOut ref = reference::forward(p, in);
    std::uint64_t prev02 = ~0ull, prev03 = ~0ull, prev04 = ~0ull;
    for (std::size_t M : {1100, 2200, 4400, 9300}) {  // b = 4, 8, 16, 32
      const tiles::Tiles t = tiles::tiles_for(M, d);
      INFO(p.str() << ", M = " << M << " elements: " << t.br << " x " << t.bc << " blocks");
      CHECK(tiles::forward_on_chip(d, t) + 2 * std::size_t(t.br) <= M);  // the blocks fit the budget
      step03::ModelOptions opt;
      opt.tiles = t;
      const ModelForward m02 = step02::model_forward(p, in, t), m03 = step03::model_forward(p, in, opt);
      const int G = tiles::q_blocks(p.N, t.br);  // Algorithm 1: one group, K and V read once
      const ModelForward m04 = step04::model_forward(p, in, G, t);
      // Still exact attention with any blocks.
      FA_CHECK_CLOSE("O (step 03)", m03.out.o, ref.o, tol::kFp32Forward, test::shape_o(p));
      FA_CHECK_CLOSE("O (step 04)", m04.out.o, m03.out.o, tol::kBitExact, test::shape_o(p));
      const Traffic f02 = step02::traffic_forward(p, t), f03 = step03::traffic_forward(p, t),
                    f04 = step04::traffic_forward(p, G, t);
      FA_CHECK_EQ("step 02 model's HBM traffic vs formula at this M", m02.traffic.total(), f02.total());
      FA_CHECK_EQ("step 03 model's HBM traffic vs formula at this M", m03.traffic.total(), f03.total());
      FA_CHECK_EQ("step 04 model's HBM traffic vs formula at this M", m04.traffic.total(), f04.total());
      FA_CHECK_BELOW("step 02 HBM traffic vs the smaller M's (it falls as M grows)", f02.total(), prev02);
      FA_CHECK_BELOW("step 03 HBM traffic vs the smaller M's (it falls as M grows)", f03.total(), prev03);
      FA_CHECK_BELOW("step 04 HBM traffic vs the smaller M's (it falls as M grows)", f04.total(), prev04);
      prev02 = f02.total(), prev03 = f03.total(), prev04 = f04.total();
      if (!causal) {
        const double N = p.N, rereads = double(f02.read) - N * d;  // everything but Q's one read
        const double ratio = rereads * double(M) / (N * N * d * d);
        CHECK(std::fabs(ratio - 2.0 * double(M) / (double(t.br) * d)) < 1e-9);  // 2·N·d·(N/b) exactly
        CHECK(ratio >= 8.0);  // M ≥ 4bd + b² + 2b
        CHECK(ratio < 9.3);   // and M is nearly used up
      }
    }
  }
}

TEST_CASE("step04 model's HBM traffic equals the note's formula", "[cpu]") {
  for (const Problem& p : {make(1, 1, 1, 16, false), make(2, 3, 113, 40, true), make(1, 1, 200, 64, false),
                           make(1, 2, 257, 8, true)})
    for (int G : {1, 3, tiles::q_blocks(p.N)}) {
      INFO(p.str() << ", G = " << G);
      const Traffic m = step04::model_forward(p, random_qkv(p, 1), G).traffic, f = step04::traffic_forward(p, G);
      FA_CHECK_EQ("model's HBM reads vs formula (step 04)", m.read, f.read);
      FA_CHECK_EQ("model's HBM writes vs formula (step 04)", m.written, f.written);
    }
  // Closed form, N = 1024 = 32·T_r, G = T_r (Algorithm 1): K, V read once; Q read
  // T_c times; O, m, ℓ read T_c − 1 times and written T_c − 1 times, then O, L once.
  const std::uint64_t N = 1024, d = 64, T = 32;
  const Traffic t = step04::traffic_forward(make(1, 1, 1024, 64, false), 32);
  FA_CHECK_EQ("step 04 reads vs the closed form (N = 1024, G = T_r)", t.read, 2 * N * d + N * d * T + N * (d + 2) * (T - 1));
  FA_CHECK_EQ("step 04 writes vs the closed form (N = 1024, G = T_r)", t.written, N * (d + 2) * (T - 1) + N * (d + 1));
}

TEST_CASE("step04 default group keeps the GPU busy", "[cpu]") {
  CHECK(step04::default_group(make(1, 1, 4096, 64, false), 132) == 1);   // 128 query blocks, 1 head: G = 1
  CHECK(step04::default_group(make(16, 16, 4096, 64, false), 132) == 64);   // 256 heads: two groups per head
  CHECK(step04::default_group(make(1, 8, 4096, 64, false), 132) == 4);    // 33 groups of 4 per head
}

#ifdef FA_HAVE_CUDA
TEST_CASE("step04 kernel equals step 03's kernel bit for bit", "[gpu]") {
  for (const Problem& p : test::sweep()) {
    INFO(p.str() << ", seed 52");
    const Qkv in = random_qkv(p, 52);
    const ForwardOut s3 = gpu::forward(step03::kForward, p, in, true);
    for (const GpuForward* step : {&step04::kForward, &step04::kForwardAlgorithm1}) {
      INFO(step->name);
      const ForwardOut s4 = gpu::forward(*step, p, in, true);
      FA_CHECK_CLOSE("O", s4.o, s3.o, tol::kBitExact, test::shape_o(p));
      FA_CHECK_CLOSE("L", s4.lse, s3.lse, tol::kBitExact, test::shape_l(p));
    }
    FA_CHECK_CLOSE("O vs reference", s3.o, reference::forward(p, in).o, tol::kFp32Forward, test::shape_o(p));
    if (p.N <= 113) {  // and against its own CPU model, with the group size the kernel used
      const ModelForward m = step04::model_forward(p, in, step04::default_group(p, gpu::sm_count()));
      FA_CHECK_CLOSE("O vs model", gpu::forward(step04::kForward, p, in, true).o, m.out.o, tol::kFp32Reorder,
                     test::shape_o(p));
    }
  }
}
#endif
