// Step 07 tests. Step 07 computes step 06's algorithm with Hopper's instructions, so
// it is held to the same rule (against the fp64 reference on the same 16-bit inputs,
// at most twice the error of a naive same-dtype computation), to its CPU model (step
// 06's model with step 07's blocks) and to step 06's kernel on the same inputs, to a
// few 16-bit units: the fp32 sums run in another order (wgmma's, over other blocks).
// The backward likewise, by the rule for gradients (3× the naive error), and its
// deterministic mode twice, bit for bit.
#include <algorithm>
#include <array>
#include <cstdint>
#include <iterator>
#include <string>
#include <tuple>
#include <utility>

#include "reference/reference.hpp"
#include "steps/02_fused/tile.hpp"
#include "steps/06_tensor_cores/step06.hpp"
#include "steps/07_hopper/step07.hpp"
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
using test::reorder;
using test::inputs;
using test::grad_out;
using test::check_grad_budget;

/// Every head dimension step 07 takes (kSupportedD, without its 0), and its backward.
const std::vector<int> kAllD(std::begin(step07::kSupportedD), std::end(step07::kSupportedD) - 1);
const std::vector<int> kBwdD(std::begin(step07::kBackwardD), std::end(step07::kBackwardD) - 1);
using test::check_grads_close;
}  // namespace

TEST_CASE("step07 model meets the error budget of its 16-bit type", "[cpu]") {
  for (DType t : {DType::bf16, DType::fp16})
    for (const Problem& base : test::sweep({1, 17, 113}, kAllD)) {
      const Problem p = lowp(base, t);
      INFO(p.str() << ", seed 91");
      const Qkv in = inputs(p, 91);
      check_budget(p, in, step07::model_forward(p, in).out, "model");
    }
}

TEST_CASE("step07 model's blocks: 128 query rows (192 at d = 64), 128 keys (80 at d = 256)", "[cpu]") {
  // The model is step 06's with step 07's tiles: at d = 128 step 07's model must equal
  // step 06's model run with 128 × 128 blocks at every N (N = 300, 1100), bit for bit;
  // and at d = 64 with h1's 128 × 128 where the short problems' kernel runs (N = 300),
  // 192 × 128 elsewhere (N = 1100).
  for (int d : kAllD) {
    CHECK(step07::forward_tile(d).keys == (d == 256 ? 80 : 128));
    CHECK(step07::forward_tile(d).rows() == (d == 64 ? 192 : 128));
  }
  CHECK(step07::forward_tile(64).consumer_regs() == 160);
  CHECK(step07::forward_tile(128).consumer_regs() == 240);
  for (int d : {64, 128})
    for (int N : {300, 1100}) {
      const Problem p = lowp(make(1, 1, N, d, false), DType::bf16);
      const int rows = d == 64 && N > 1024 ? 192 : 128;
      INFO(p.str() << ", step 06's model with " << rows << " × 128 blocks");
      const Qkv in = inputs(p, 92);
      const ModelForward m = step07::model_forward(p, in), r = step06::model_forward_tiled(p, in, rows, 128);
      FA_CHECK_CLOSE("O: step 07's model = step 06's", m.out.o, r.out.o, tol::kBitExact, test::shape_o(p));
    }
}

TEST_CASE("step07 short problems take h1's block at d = 64, and the model counts it", "[cpu]") {
  // Two blocks an SM where a query block visits at most 8 of the specialised kernel's
  // K/V blocks on average: N ≤ 1024, or N ≤ 2048 with the causal mask; at d = 64 only
  // (d = 128 runs the persistent grid at every N, d = 256 a block a tile).
  CHECK(step07::two_blocks_an_sm(64, 1, false));
  CHECK(step07::two_blocks_an_sm(64, 1024, false));
  CHECK_FALSE(step07::two_blocks_an_sm(64, 1025, false));
  CHECK(step07::two_blocks_an_sm(64, 2048, true));
  CHECK_FALSE(step07::two_blocks_an_sm(64, 2049, true));
  for (bool causal : {false, true})
    for (int N : {1, 1024, 1025, 4096}) {
      CHECK_FALSE(step07::two_blocks_an_sm(128, N, causal));
      CHECK_FALSE(step07::two_blocks_an_sm(256, N, causal));
      CHECK(step07::persistent_grid(128, N, causal));
      CHECK_FALSE(step07::persistent_grid(256, N, causal));
      CHECK(step07::persistent_grid(64, N, causal) == !step07::two_blocks_an_sm(64, N, causal));
    }
  for (int d : {64, 128})
    for (bool causal : {false, true})
      for (int N : {1000, 1024, 1025, 2048, 2049, 4096}) {
        const Problem p = lowp(make(1, 2, N, d, causal), DType::bf16);
        INFO(p.str());
        const bool short_block = step07::two_blocks_an_sm(d, N, causal);
        const int rows = short_block ? 128 : d == 64 ? 192 : 128, keys = 128;
        CHECK(step07::forward_shape(d, N, causal).rows == rows);
        CHECK(step07::forward_shape(d, N, causal).keys == keys);
        const Traffic got = step07::traffic_forward(p), want = step06::traffic_forward_tiled(p, rows, keys);
        CHECK(got.total() == want.total());
      }
}

TEST_CASE("step07 tile order: every tile once, a head's heaviest first, heads in sections that fit L2", "[cpu]") {
  for (int blocks : {1, 3, 8})
    for (int heads : {1, 6, 16, 48})
      for (int shift = 0; (1 << shift) <= heads; ++shift) {
        if (heads % (1 << shift) != 0) continue;  // sections are whole
        const int section = 1 << shift;
        // Heaviest first in every section, in the last only, in none.
        for (int mixed_from : {0, heads - section, heads}) {
          const step07::TileOrder o{blocks, heads, shift, mixed_from};
          INFO(blocks << " tiles a head, " << heads << " heads, sections of " << section << " from head " << mixed_from);
          REQUIRE(o.tiles() == blocks * heads);
          std::vector<int> next(heads, 0);  // the next p each head must hand out
          std::vector<int> seen(o.tiles(), 0);
          const int before = mixed_from * blocks;  // the tiles head after head
          for (int t = 0; t < o.tiles(); ++t) {
            const step07::TileOrder::At at = o.at(t);
            INFO("tile " << t << ": p " << at.p << ", head " << at.bh);
            REQUIRE(at.bh >= 0);
            REQUIRE(at.bh < heads);
            CHECK(at.p == next[at.bh]++);  // a head's tiles in its order, heaviest first
            if (t < before) {
              CHECK(at.bh == t / blocks);  // head after head
            } else {
              const int r = t - before;
              CHECK((at.bh - mixed_from) / section == r / (blocks * section));  // the heads of t's section, ...
              CHECK(at.bh % section == r % section);                            // ... the fastest index in it
            }
            ++seen[at.p * heads + at.bh];
          }
          for (int x : seen) CHECK(x == 1);
          // A grid of a block a tile (blocks, section, heads / section), started x fastest: the same order.
          int g_t = 0;
          for (int z = 0; z < heads / section; ++z)
            for (int y = 0; y < section; ++y)
              for (int x = 0; x < blocks; ++x, ++g_t) {
                const step07::TileOrder::At g = o.grid_tile(x, y, z);
                INFO("block (" << x << ", " << y << ", " << z << ")");
                CHECK(g.p == o.at(g_t).p);
                CHECK(g.bh == o.at(g_t).bh);
              }
        }
      }
  // The sections: without the mask one head; with it as many heads as take two thirds of
  // the L2 — a power of two that divides B·H.
  const double l2 = 50.0 * 1024 * 1024, mib = 1024.0 * 1024;
  const auto order = [&](int heads, bool causal, double bytes, int blocks = 8, int sms = 132) {
    return step07::tile_order(blocks, heads, causal, bytes, l2, sms);
  };
  CHECK(order(128, false, 1.0).section() == 1);
  CHECK(order(128, true, 0.25 * mib).section() == 128);  // 32 MiB: all of them
  CHECK(order(128, true, 0.5 * mib).section() == 64);    // 66 would fit
  CHECK(order(96, true, 0.25 * mib).section() == 32);    // 96 would fit: 32 divides 96
  CHECK(order(100, true, 1.0 * mib).section() == 4);     // 33 would fit: 4 divides 100
  CHECK(order(16, true, 64 * mib).section() == 1);       // none fits: one a section
  CHECK(order(17, true, 0.0).section() == 1);            // 17 heads: no power of two divides
  // Which heads go heaviest first: the last section's only where a head's tiles are at most an
  // eighth of the SMs (a wave head after head spans eight heads), every section's elsewhere;
  // none without the mask.
  for (const auto [blocks, sms, mixed_from] : {std::array{8, 132, 64}, std::array{16, 132, 64},
                                               std::array{17, 132, 0}, std::array{16, 120, 0}})
    CHECK(order(128, true, 0.5 * mib, blocks, sms).mixed_from == mixed_from);
  CHECK(order(128, true, 0.5 * mib, 8, 132).section() == 64);
  CHECK(order(100, true, 1.0 * mib, 8, 132).mixed_from == 96);
  CHECK(order(128, true, 0.25 * mib, 8, 132).mixed_from == 0);  // one section: all of it
  CHECK(order(128, false, 0.5 * mib, 8, 132).mixed_from == 128);
}

TEST_CASE("step07 tiles use TMA's 128-byte swizzle (exercise 07-swizzle)", "[cpu]") {
  // What the hardware does (CUTLASS's Swizzle<3, 4, 3>): in the unswizzled byte offset of
  // a panel, bits 4–6 (the 16-byte chunk of a 128-byte row) are XORed with bits 7–9 (the
  // row mod 8). swizzled() must place every element where TMA wrote it and wgmma reads it.
  int wrong = 0;
  for (int rows : {64, 80, 96, 128})
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < 256; ++c) {
        const std::uint32_t plain = std::uint32_t((c / 64) * rows * 128 + r * 128 + (c % 64) * 2);
        const std::uint32_t want = plain ^ (((plain >> 7) & 7u) << 4);
        if (step07::swizzled(rows, r, c) != want && ++wrong <= 5)
          FAIL_CHECK("rows = " << rows << ", element (" << r << ", " << c << "): swizzled() = "
                               << step07::swizzled(rows, r, c) << ", TMA's byte offset " << want);
      }
  CHECK(wrong == 0);
}

TEST_CASE("step07 model's HBM traffic equals the formula", "[cpu]") {
  for (const Problem& base : {make(1, 1, 1, 64, false), make(2, 1, 130, 64, true), make(1, 2, 300, 128, false),
                              make(1, 1, 257, 128, true), make(1, 2, 200, 256, true)}) {
    const Problem p = lowp(base, DType::bf16);
    INFO(p.str());
    const ModelForward mf = step07::model_forward(p, random_qkv(p, 1));
    const Traffic f = step07::traffic_forward(p);
    CHECK(mf.traffic.read == f.read);
    CHECK(mf.traffic.written == f.written);
  }
}

TEST_CASE("step07 model refuses fp32 problems and other head dimensions", "[cpu]") {
  const Problem p = make(1, 1, 8, 64, false);
  CHECK(test::contains(test::error_of([&] { step07::model_forward(p, random_qkv(p, 1)); }), "bf16 or fp16"));
  const Problem q = lowp(make(1, 1, 8, 96, false), DType::bf16);
  CHECK(test::contains(test::error_of([&] { step07::model_forward(q, random_qkv(q, 1)); }), "d = 64, 128, 256"));
  Problem c = lowp(make(1, 1, 8, 64, false), DType::bf16);
  c.N_kv = 40;  // decoding's shape: step 08's, not this step's
  CHECK(test::contains(test::error_of([&] { step07::model_forward(c, random_qkv(c, 1)); }),
                       "step07 takes as many keys as queries"));
}

TEST_CASE("step07 backward model meets the gradient budget of its 16-bit type", "[cpu]") {
  for (DType t : {DType::bf16, DType::fp16})
    for (const Problem& base : test::sweep({1, 17, 113}, kBwdD)) {
      const Problem p = lowp(base, t);
      INFO(p.str() << ", seeds 101, 102");
      const Qkv in = inputs(p, 101);
      const std::vector<float> dout = grad_out(p, 102);
      const ForwardOut fwd = step07::model_forward(p, in).out;
      check_grad_budget(p, in, dout, step07::model_backward(p, in, fwd, dout).grads, "model");
    }
}

TEST_CASE("step07 backward model refuses d = 32 and fp32; its traffic is the formula's", "[cpu]") {
  const Problem q = lowp(make(1, 1, 8, 32, false), DType::bf16);
  const Qkv iq = random_qkv(q, 1);
  CHECK(test::contains(test::error_of([&] { step07::model_backward(q, iq, {iq.q, std::vector<float>(q.rows())}, iq.q); }),
                       "d = 64, 128, 256"));
  const Problem f = make(1, 1, 8, 64, false);
  const Qkv in = random_qkv(f, 1);
  CHECK(test::contains(test::error_of([&] { step07::model_backward(f, in, {in.q, std::vector<float>(f.rows())}, in.q); }),
                       "bf16 or fp16"));
  const Problem p = lowp(make(1, 2, 300, 128, true), DType::bf16);
  const Qkv ip = inputs(p, 103);
  const Traffic m = step07::model_backward(p, ip, step07::model_forward(p, ip).out, ip.v).traffic,
                b = step07::traffic_backward(p);
  CHECK(m.read == b.read);
  CHECK(m.written == b.written);
}

// ---- Grouped K/V heads and a sliding window (the model here; the kernels below).

namespace {
Problem grouped(int H_kv, Problem p) {
  p.H_kv = H_kv;
  return p;
}
Problem windowed(int left, int right, Problem p) {
  p.window_left = left, p.window_right = right;
  return p;
}
/// dO with every query head zeroed but head `lone` of each group.
std::vector<float> only_head_of_groups(const Problem& p, std::vector<float> dout, int lone) {
  for (std::size_t bh = 0; bh < p.heads(); ++bh)
    if (int(bh % p.H % p.group()) != lone)
      std::fill(dout.begin() + bh * p.N * p.d, dout.begin() + (bh + 1) * p.N * p.d, 0.0f);
  return dout;
}
/// Of gradients on K and V repeated for every query head (w), query head `lone`'s dK and dV
/// for each group, laid out as p's K/V heads: what p's dK and dV are under only_head_of_groups.
std::pair<std::vector<float>, std::vector<float>> lone_head_kv(const Problem& p, const Grads& w, int lone) {
  std::vector<float> dk(p.kv_elems()), dv(p.kv_elems());
  const std::size_t head = std::size_t(p.N) * p.d;
  for (std::size_t bh = 0; bh < p.heads(); ++bh)
    if (int(bh % p.H % p.group()) == lone)
      for (std::size_t e = 0; e < head; ++e) {
        dk[p.kv_head(bh) * head + e] = w.dk[bh * head + e];
        dv[p.kv_head(bh) * head + e] = w.dv[bh * head + e];
      }
  return {dk, dv};
}
}  // namespace

TEST_CASE("step07 model with grouped K/V heads (groups 1, 2, 4, 8 and H) meets the budgets", "[cpu]") {
  for (int H_kv : {16, 8, 4, 2, 1})
    for (int N : {17, 113})
      for (bool causal : {false, true}) {
        const Problem p = grouped(H_kv, lowp(make(1, 16, N, 64, causal), N == 17 ? DType::fp16 : DType::bf16));
        INFO(p.str() << ", seeds 111, 112");
        const Qkv in = inputs(p, 111);
        const std::vector<float> dout = grad_out(p, 112);
        const ForwardOut fwd = step07::model_forward(p, in).out;
        check_budget(p, in, fwd, "model");
        check_grad_budget(p, in, dout, step07::model_backward(p, in, fwd, dout).grads, "model");
      }
}

TEST_CASE("step07 grouped K/V heads: the forward and dQ are those of K, V repeated, bit for bit; dK, dV a group's sum",
          "[cpu]") {
  // A grouped head's scores are those of its query head against the shared K/V: the same
  // arithmetic as with K and V copied for every query head. dK and dV sum over the group;
  // with dO zero but for one query head of each group, the others add exact zeros, so a
  // K/V head's gradients are that one head's, bit for bit (exercise 07-group).
  for (int d : {64, 128}) {
    const Problem p = grouped(2, lowp(make(2, 8, 113, d, true), DType::bf16)), r = grouped(0, p);
    INFO(p.str());
    const Qkv in = inputs(p, 121), rin = test::repeated_kv(p, in);
    const ForwardOut got = step07::model_forward(p, in).out, want = step07::model_forward(r, rin).out;
    FA_CHECK_CLOSE("O", got.o, want.o, tol::kBitExact, test::shape_o(p));
    FA_CHECK_CLOSE("L", got.lse, want.lse, tol::kBitExact, test::shape_l(p));
    for (int lone = 0; lone < p.group(); ++lone) {
      INFO("dO nonzero for query head " << lone << " of each group only");
      const std::vector<float> dout = only_head_of_groups(p, grad_out(p, 122), lone);
      const Grads g = step07::model_backward(p, in, got, dout).grads, w = step07::model_backward(r, rin, want, dout).grads;
      FA_CHECK_CLOSE("dQ", g.dq, w.dq, tol::kBitExact, test::shape_o(p));
      const auto [dk, dv] = lone_head_kv(p, w, lone);
      FA_CHECK_CLOSE("dK", g.dk, dk, tol::kBitExact, test::shape_kv(p));
      FA_CHECK_CLOSE("dV", g.dv, dv, tol::kBitExact, test::shape_kv(p));
    }
  }
}

TEST_CASE("a window's band, written out: which keys each query sees", "[cpu]") {
  // Rows: queries 0..5 (positions 2..7: N = 6 queries, N_kv = 8 keys); columns: keys 0..7.
  Problem p = windowed(2, 1, make(1, 1, 6, 64, false));
  p.N_kv = 8;
  const char* band[] = {"11110000", "01111000", "00111100", "00011110", "00001111", "00000111"};
  Problem c = windowed(2, 1, p);
  c.causal = true;  // causal: right = 0
  const char* causal_band[] = {"11100000", "01110000", "00111000", "00011100", "00001110", "00000111"};
  for (int i = 0; i < 6; ++i)
    for (int k = 0; k < 8; ++k) {
      INFO("query " << i << ", key " << k);
      CHECK(p.sees(i, k) == (band[i][k] == '1'));
      CHECK(c.sees(i, k) == (causal_band[i][k] == '1'));
    }
  // first_query, last_query and the block ranges agree with sees(), for every window.
  for (int N : {1, 7, 20})
    for (int extra : {0, 5})
      for (int left : {-1, 0, 1, 3, 30})
        for (int right : {-1, 0, 2, 30})
          for (bool causal : {false, true}) {
            Problem q = windowed(left, right, make(1, 1, N, 64, causal));
            q.N_kv = N + extra;
            INFO(q.str());
            for (int k = 0; k < q.keys(); ++k)
              for (int i = 0; i < N; ++i) CHECK(q.sees(i, k) == (q.first_query(k) <= i && i <= q.last_query(k)));
            for (int i = 0; i < N; ++i) CHECK(q.sees(i, q.first_key(i)));
            for (int br : {1, 4, 16})  // the block ranges: every seen key inside, a seen key in the first and the last
              for (int bc : {1, 3, 16}) {
                INFO("blocks " << br << " x " << bc);
                for (int b = 0; b * br < N; ++b) {
                  const tiles::BlockRange r = tiles::kv_block_range(q, b, br, bc);
                  auto seen_in = [&](int blk) {
                    for (int i = b * br; i < std::min(N, (b + 1) * br); ++i)
                      for (int k = blk * bc; k < std::min(q.keys(), (blk + 1) * bc); ++k)
                        if (q.sees(i, k)) return true;
                    return false;
                  };
                  CHECK(seen_in(r.first));
                  CHECK(seen_in(r.last));
                  CHECK_FALSE((r.first > 0 && seen_in(r.first - 1)));
                  CHECK_FALSE((r.last + 1 < tiles::kv_blocks(q.keys(), bc) && seen_in(r.last + 1)));
                }
              }
            double pairs = 0;
            for (int i = 0; i < N; ++i)
              for (int k = 0; k < q.keys(); ++k) pairs += q.sees(i, k);
            if (q.windowed()) CHECK(q.pairs() == pairs);
          }
}

// The kernels' Band (step07.hpp): the same scores as Problem::sees, its first and last keys
// and rows tight, and cuts() true on every block of rows and keys where some score is dropped
// (a block it passes over is not masked at all).
TEST_CASE("step07 kernels' band: the causal mask and the window as diagonals lo..hi", "[cpu]") {
  for (int N : {1, 7, 20, 33})
    for (int left : {-1, 0, 1, 3, 30, 1 << 30})  // 2^30: the widest side Problem takes
      for (int right : {-1, 0, 2, 30, 1 << 30})
        for (bool causal : {false, true}) {
          const Problem q = windowed(left, right, make(1, 1, N, 64, causal));
          const step07::Band band = step07::band_of(q);
          INFO(q.str());
          for (int i = 0; i < N; ++i)
            for (int k = 0; k < N + 5; ++k) REQUIRE(band.keeps(i, k, N) == (k < N && q.sees(i, k)));
          for (int x = 0; x < N; ++x) {  // x as a row, then as a key
            CHECK(band.first_key(x) == q.first_key(x));
            CHECK(band.last_key(x, N) == q.last_key(x));
            CHECK(band.first_row(x) == q.first_query(x));
            CHECK(band.last_row(x, N) == q.last_query(x));
          }
          for (int r0 = 0; r0 < N; r0 += 3)
            for (int k0 = 0; k0 < N; k0 += 4) {
              bool dropped = false;
              for (int i = r0; i < r0 + 3; ++i)
                for (int k = k0; k < k0 + 4; ++k) dropped |= !band.keeps(i, k, N);
              if (dropped) CHECK(band.cuts(r0, r0 + 2, k0, k0 + 3, N));
            }
        }
}

TEST_CASE("the reference with a window equals attention under the mask written out", "[cpu]") {
  const std::tuple<int, int, bool> windows[] = {{0, 0, false},  {16, 0, false}, {5, 3, false}, {-1, 7, false},
                                                {64, -1, false}, {9, 4, true},   {-1, 0, false}};
  for (auto [left, right, causal] : windows) {
    const Problem p = windowed(left, right, make(1, 2, 113, 16, causal));
    INFO(p.str());
    const Qkv in = random_qkv(p, 131);
    const ForwardOut got = reference::forward(p, in);
    std::vector<float> o(p.elems()), lse(p.rows());
    for (std::size_t h = 0; h < p.heads(); ++h)
      for (int i = 0; i < p.N; ++i) {
        std::vector<double> s(p.N, -INFINITY);
        double m = -INFINITY, l = 0;
        for (int j = 0; j < p.N; ++j) {
          const bool shown = (left < 0 || j >= i - left) && (right < 0 || j <= i + right) && !(causal && j > i);
          if (!shown) continue;
          s[j] = 0;
          for (int c = 0; c < p.d; ++c) s[j] += double(in.q[(h * p.N + i) * p.d + c]) * in.k[(h * p.N + j) * p.d + c];
          s[j] *= p.softmax_scale();
          m = std::max(m, s[j]);
        }
        for (int j = 0; j < p.N; ++j) l += std::exp(s[j] - m);
        for (int c = 0; c < p.d; ++c) {
          double acc = 0;
          for (int j = 0; j < p.N; ++j) acc += std::exp(s[j] - m) / l * in.v[(h * p.N + j) * p.d + c];
          o[(h * p.N + i) * p.d + c] = float(acc);
        }
        lse[h * p.N + i] = float(m + std::log(l));
      }
    FA_CHECK_CLOSE("O", got.o, o, tol::kFp32Forward, test::shape_o(p));
    FA_CHECK_CLOSE("L", got.lse, lse, tol::kFp32Forward, test::shape_l(p));
  }
}

TEST_CASE("step07 model with a sliding window meets the budgets, causal and not", "[cpu]") {
  const std::pair<int, int> windows[] = {{0, 0}, {16, 0}, {5, 3}, {-1, 7}, {64, -1}, {1000, 1000}};
  for (auto [left, right] : windows)
    for (int N : {17, 113, 300})
      for (bool causal : {false, true}) {
        if (test::quick() && N == 300) continue;
        const Problem p = windowed(left, right, lowp(make(1, 2, N, N == 300 ? 128 : 64, causal), DType::bf16));
        INFO(p.str() << ", seeds 141, 142");
        const Qkv in = inputs(p, 141);
        const std::vector<float> dout = grad_out(p, 142);
        const ForwardOut fwd = step07::model_forward(p, in).out;
        check_budget(p, in, fwd, "model");
        check_grad_budget(p, in, dout, step07::model_backward(p, in, fwd, dout).grads, "model");
      }
  // A window wider than the sequence is no window: the same bits as without one.
  const Problem p = lowp(make(1, 2, 113, 64, true), DType::bf16), w = windowed(200, 200, p);
  const Qkv in = inputs(p, 143);
  const ForwardOut a = step07::model_forward(p, in).out, b = step07::model_forward(w, in).out;
  FA_CHECK_CLOSE("O", b.o, a.o, tol::kBitExact, test::shape_o(p));
}

TEST_CASE("step07 model skips the tiles outside the window: its traffic falls with the window and is the formula's",
          "[cpu]") {
  for (const Problem& p : {windowed(100, 0, lowp(make(1, 2, 300, 64, true), DType::bf16)),
                           windowed(40, 70, grouped(1, lowp(make(1, 2, 300, 128, false), DType::bf16)))}) {
    INFO(p.str());
    const Qkv in = inputs(p, 151);
    const ModelForward mf = step07::model_forward(p, in);
    const Traffic f = step07::traffic_forward(p), b = step07::traffic_backward(p),
                  mb = step07::model_backward(p, in, mf.out, in.q).traffic;
    CHECK(mf.traffic.read == f.read);
    CHECK(mf.traffic.written == f.written);
    CHECK(mb.read == b.read);
    CHECK(mb.written == b.written);
  }
  // At N = 8192, d = 128 (causal): each halving of the window takes K/V reads down.
  Problem p = lowp(make(1, 1, 8192, 128, true), DType::bf16);
  std::uint64_t fwd = step07::traffic_forward(p).read, bwd = step07::traffic_backward(p).read;
  for (int left : {4096, 1024, 256}) {
    const Problem w = windowed(left, 0, p);
    INFO(w.str());
    CHECK(step07::traffic_forward(w).read < fwd);
    CHECK(step07::traffic_backward(w).read < bwd);
    fwd = step07::traffic_forward(w).read, bwd = step07::traffic_backward(w).read;
  }
}

TEST_CASE("grouped heads and windows: the steps that do not take them say so", "[cpu]") {
  const Problem g = grouped(1, lowp(make(1, 2, 17, 64, false), DType::bf16));
  const Problem w = windowed(4, 0, lowp(make(1, 2, 17, 64, false), DType::bf16));
  const Qkv ig = random_qkv(g, 1), iw = random_qkv(w, 1);
  CHECK(test::contains(test::error_of([&] { step06::model_backward(g, ig, {ig.q, std::vector<float>(g.rows())}, ig.q); }),
                       "step06 takes one K/V head per query head"));
  CHECK(test::contains(test::error_of([&] { step06::model_forward(w, iw); }), "step06 takes no window"));
  Problem bad = w;
  bad.window_left = -2;
  CHECK(test::contains(test::error_of([&] { step07::model_forward(bad, iw); }), "0 to 2^30, or -1"));
}

namespace {
/// Sequence b's rows of a packed [heads, T, width] tensor (Q, O, dO: the query heads, width d;
/// L: width 1; K, V: the K/V heads), every head's one after another.
std::vector<float> sequence_rows(const Problem& p, const std::vector<int>& offsets, int b, const std::vector<float>& x,
                                 std::size_t heads, int width) {
  const std::size_t at = std::size_t(offsets[std::size_t(b)]), n = std::size_t(offsets[std::size_t(b) + 1]) - at;
  std::vector<float> out;
  for (std::size_t h = 0; h < heads; ++h)
    out.insert(out.end(), x.begin() + std::ptrdiff_t((h * std::size_t(p.N) + at) * width),
               x.begin() + std::ptrdiff_t((h * std::size_t(p.N) + at + n) * width));
  return out;
}
/// Cumulative offsets of sequences of these lengths.
std::vector<int> offsets_of(const std::vector<int>& lengths) {
  std::vector<int> offsets = {0};
  for (int n : lengths) offsets.push_back(offsets.back() + n);
  return offsets;
}
}  // namespace

TEST_CASE("step07 model on a ragged batch: each sequence its own attention, no padding computed", "[cpu]") {
  // Lengths 1, 17, 1000 and mixed, packed into one [1, H, T, d]; each sequence against the
  // reference on its rows alone, and the packed problem against the reference under the
  // block-diagonal mask written out (a key of another sequence has no weight).
  const std::vector<int> cases[] = {{1}, {17}, {1000}, {1, 17, 1000, 3}, {130, 129, 1, 64}};
  for (const std::vector<int>& lengths : cases)
    for (bool causal : {false, true}) {
      if (test::quick() && lengths.size() == 1 && lengths[0] == 1000) continue;
      const std::vector<int> offsets = offsets_of(lengths);
      const Problem p = grouped(2, lowp(make(1, 4, offsets.back(), 64, causal), DType::bf16));
      INFO(p.str() << ", " << lengths.size() << " sequences");
      const Qkv in = inputs(p, 191);
      const std::vector<float> dout = grad_out(p, 192);
      const ModelForward mf = step07::model_forward_ragged(p, in, offsets);
      const ModelBackward mb = step07::model_backward_ragged(p, in, mf.out, dout, offsets);
      Traffic padded{};
      for (int b = 0; b < int(lengths.size()); ++b) {
        const Problem one = step07::sequence(p, offsets, b);
        INFO("sequence " << b << ": " << one.str());
        auto rows = [&](const std::vector<float>& x, std::size_t heads, int width) {
          return sequence_rows(p, offsets, b, x, heads, width);
        };
        const Qkv mine{rows(in.q, p.heads(), p.d), rows(in.k, p.kv_heads(), p.d), rows(in.v, p.kv_heads(), p.d)};
        const ForwardOut f{rows(mf.out.o, p.heads(), p.d), rows(mf.out.lse, p.heads(), 1)};
        check_budget(one, mine, f, "ragged model");
        check_grad_budget(one, mine, rows(dout, p.heads(), p.d),
                          {rows(mb.grads.dq, p.heads(), p.d), rows(mb.grads.dk, p.kv_heads(), p.d),
                           rows(mb.grads.dv, p.kv_heads(), p.d)},
                          "ragged model");
        Problem longest = one;
        longest.N = *std::max_element(lengths.begin(), lengths.end());
        const Traffic t = step07::traffic_forward(longest);
        padded.read += t.read, padded.written += t.written;
      }
      // No padding: the packed batch moves no more than B sequences padded to the longest.
      CHECK(mf.traffic.read <= padded.read);
      if (lengths.size() > 1) CHECK(mf.traffic.read < padded.read);
    }
  // The block-diagonal mask, written out, on the packed problem: the reference per query.
  const std::vector<int> offsets = {0, 5, 6, 20};
  const Problem p = lowp(make(1, 1, 20, 64, true), DType::bf16);
  const Qkv in = inputs(p, 193);
  const ForwardOut got = step07::model_forward_ragged(p, in, offsets).out;
  for (int i = 0; i < p.N; ++i) {
    const int b = int(std::upper_bound(offsets.begin(), offsets.end(), i) - offsets.begin()) - 1;
    double m = -INFINITY, l = 0, o0 = 0;
    for (int pass = 0; pass < 2; ++pass)
      for (int j = offsets[std::size_t(b)]; j <= i; ++j) {  // keys of its own sequence, up to itself
        double s = 0;
        for (int c = 0; c < p.d; ++c) s += double(in.q[std::size_t(i) * p.d + c]) * in.k[std::size_t(j) * p.d + c];
        s *= p.softmax_scale();
        if (pass == 0) m = std::max(m, s);
        else l += std::exp(s - m), o0 += std::exp(s - m) * in.v[std::size_t(j) * p.d];
      }
    INFO("query " << i << " of sequence " << b);
    CHECK(std::fabs(got.o[std::size_t(i) * p.d] - o0 / l) <= 1e-2);
    CHECK(std::fabs(got.lse[std::size_t(i)] - (m + std::log(l))) <= 1e-4);
  }
  CHECK(test::contains(test::error_of([&] { step07::model_forward_ragged(p, in, {0, 5, 5, 20}); }), "empty"));
  CHECK(test::contains(test::error_of([&] { step07::model_forward_ragged(p, in, {0, 5, 19}); }), "end at N = 20 (got 0,5,19)"));
}

namespace {
/// A table's entries as (start, i, length): which sequence's block each is.
std::string table_str(const std::vector<step07::SeqBlock>& t, std::size_t from, std::size_t n) {
  std::string out;
  for (std::size_t e = from; e < std::min(t.size(), from + n); ++e)
    out += "(" + std::to_string(t[e].start) + "," + std::to_string(t[e].i) + ") ";
  return out;
}
}  // namespace

TEST_CASE("step07 model of a ragged batch's table: by weight across the batch with the mask", "[cpu]") {
  // Three sequences of 20, 3 and 20 blocks of 64 rows (the second 5 rows short), starting at
  // rows 0, 1280 and 1467.
  const std::vector<int> offsets = offsets_of({20 * 64, 3 * 64 - 5, 20 * 64});
  const int T = offsets.back();
  // The forward's query blocks, taken from the table's end: distance k = i ascending, then
  // the longer sequence first (0 and 2 before 1), then the sequences' order.
  const step07::RaggedTable f = step07::ragged_table_model(offsets, T, 64, 0, true);
  REQUIRE(f.blocks.size() == 43);
  CHECK(table_str(f.blocks, 0, 7) == "(0,0) (1467,0) (1280,0) (0,1) (1467,1) (1280,1) (0,2) ");
  CHECK(table_str(f.blocks, 7, 4) == "(1467,2) (1280,2) (0,3) (1467,3) ");
  CHECK(table_str(f.blocks, 41, 2) == "(0,19) (1467,19) ");
  CHECK(f.blocks[2].length == 3 * 64 - 5);
  // The backward's key blocks, taken from the start: the largest distance first (key block 0
  // of the longest sequences), so each sequence's key blocks in order.
  const step07::RaggedTable b = step07::ragged_table_model(offsets, T, 64, 64, true);
  REQUIRE(b.blocks.size() == 43);
  CHECK(table_str(b.blocks, 0, 4) == "(0,0) (1467,0) (0,1) (1467,1) ");
  CHECK(table_str(b.blocks, 34, 9) == "(0,17) (1467,17) (1280,0) (0,18) (1467,18) (1280,1) (0,19) (1467,19) (1280,2) ");
  CHECK(b.q_first[36] == 20);  // sequence 1's first query block: after sequence 0's 20
  CHECK(b.q_blocks.size() == 43);
  // Without the mask, or with no sequence of kSortFromBlocks blocks: the sequences' order.
  for (const auto& [offs, causal] : {std::pair{offsets, false}, std::pair{offsets_of({15 * 64, 64, 700}), true}}) {
    const step07::RaggedTable s = step07::ragged_table_model(offs, offs.back(), 64, 0, causal);
    for (std::size_t e = 1; e < s.blocks.size(); ++e) {
      INFO("entry " << e << ": " << table_str(s.blocks, e - 1, 2));
      const bool next = s.blocks[e].start == s.blocks[e - 1].start && s.blocks[e].i == s.blocks[e - 1].i + 1;
      CHECK((next || (s.blocks[e].start > s.blocks[e - 1].start && s.blocks[e].i == 0)));
    }
  }
}

#ifdef FA_HAVE_CUDA
/// The forward version whose name starts with `id` and a colon.
const GpuForward& forward_version(const char* id) {
  for (const GpuForward& v : step07::kForwardVersions)
    if (std::string(v.name).rfind(std::string(id) + ":", 0) == 0) return v;
  throw Error(std::string("no version ") + id);
}

TEST_CASE("step07 kernel meets the error budget, matches its model and step 06", "[gpu]") {
  for (DType t : {DType::bf16, DType::fp16})
    for (const Problem& base : test::sweep({1, 17, 113, 1000}, kAllD)) {
      const Problem p = lowp(base, t);
      INFO(p.str() << ", seed 93");
      const Qkv in = inputs(p, 93);
      const ForwardOut out = gpu::forward(step07::kForward, p, in, true);
      check_budget(p, in, out, "kernel");
      const ForwardOut s06 = gpu::forward(step06::kForward, p, in, true);
      FA_CHECK_CLOSE("O vs step 06", out.o, s06.o, reorder(t), test::shape_o(p));
      FA_CHECK_CLOSE("L vs step 06", out.lse, s06.lse, tol::kFp32Reorder, test::shape_l(p));
      if (p.N <= 113) {
        const ModelForward m = step07::model_forward(p, in);
        FA_CHECK_CLOSE("O vs model", out.o, m.out.o, reorder(t), test::shape_o(p));
        FA_CHECK_CLOSE("L vs model", out.lse, m.out.lse, tol::kFp32Reorder, test::shape_l(p));
      }
    }
}

TEST_CASE("step07 kernel at N = 4097 (one past a tile multiple), several heads", "[gpu]") {
  if (test::quick()) return;
  for (int d : kAllD)
    for (bool causal : {false, true}) {
      const Problem p = lowp(make(1, 2, 4097, d, causal), DType::bf16);
      INFO(p.str() << ", seed 94");
      const Qkv in = inputs(p, 94);
      const ForwardOut out = gpu::forward(step07::kForward, p, in, true);
      if (d == 64) check_budget(p, in, out, "kernel");  // the fp64 reference: one d is enough
      const ForwardOut s06 = gpu::forward(step06::kForward, p, in, true);
      FA_CHECK_CLOSE("O vs step 06", out.o, s06.o, step06::kBf16Reorder, test::shape_o(p));
      FA_CHECK_CLOSE("L vs step 06", out.lse, s06.lse, tol::kFp32Reorder, test::shape_l(p));
    }
}

TEST_CASE("step07 forward at d = 64 and 128 on both sides of the switch to the short problems' kernel", "[gpu]") {
  // kForward runs h1's kernel where two_blocks_an_sm (d = 64), the persistent grid (h9)
  // elsewhere at d = 64 and 128: bit for bit the version that runs, and within budget.
  // h1, h7 and h9 also agree with each other (the same 128-key blocks, the same
  // arithmetic a row), so every version named here must give the same bits.
  const GpuForward &h1 = forward_version("h1"), &h7 = forward_version("h7"), &h9 = forward_version("h9");
  for (int d : {64, 128}) {
    std::vector<int> Ns{1024, 1025, 2048, 2049};
    if (test::quick()) Ns = {1024, 1025};  // under the sanitizers too
    for (bool causal : {false, true})
      for (int N : Ns) {
        const Problem p = lowp(make(1, 2, N, d, causal), DType::bf16);
        const bool short_block = step07::two_blocks_an_sm(d, N, causal);
        INFO(p.str() << ", seed 99, " << (short_block ? "h1's kernel" : "the persistent grid"));
        const Qkv in = inputs(p, 99);
        const ForwardOut out = gpu::forward(step07::kForward, p, in, true);
        check_budget(p, in, out, "kernel");
        const std::vector<const GpuForward*> same =
            d == 64 ? std::vector<const GpuForward*>{&h1, &h7, &h9} : std::vector<const GpuForward*>{&h7, &h9};
        for (const GpuForward* v : same) {
          INFO(v->name);
          const ForwardOut o = gpu::forward(*v, p, in, true);
          FA_CHECK_CLOSE("O vs the version", out.o, o.o, tol::kBitExact, test::shape_o(p));
          FA_CHECK_CLOSE("L vs the version", out.lse, o.lse, tol::kBitExact, test::shape_l(p));
        }
      }
  }
}

TEST_CASE("step07 with huge logits stays finite and within budget", "[gpu]") {
  // Scores of ±~100 after scaling: P is one-hot-like, exp must not overflow anywhere.
  for (int d : kAllD) {
    const Problem p = lowp(make(1, 2, 300, d, true, 8.0f), DType::bf16);
    INFO(p.str());
    const Qkv in = inputs(p, 95);
    check_budget(p, in, gpu::forward(step07::kForward, p, in, true), "kernel");
  }
}

TEST_CASE("step07 rescales correctly when the row max keeps rising", "[gpu]") {
  // A row's max climbs block after block, some blocks by more than 2^8 (O and ℓ
  // rescaled), some by less (test::rising_scores).
  for (const Problem& base : test::sweep({1000}, kAllD)) {
    const Problem p = lowp(base, DType::bf16);
    INFO(p.str());
    const Qkv in = test::rising_scores(p, 96);
    const ForwardOut out = gpu::forward(step07::kForward, p, in, true);
    check_budget(p, in, out, "kernel");
    const ModelForward m = step07::model_forward(p, in);
    FA_CHECK_CLOSE("O vs model", out.o, m.out.o, step06::kBf16Reorder, test::shape_o(p));
    FA_CHECK_CLOSE("L vs model", out.lse, m.out.lse, tol::kFp32Reorder, test::shape_l(p));
  }
}

TEST_CASE("step07 refuses what it does not support", "[gpu]") {
  const Problem p = make(1, 1, 8, 64, false);
  const Qkv in = random_qkv(p, 1);
  const ForwardOut f{in.q, std::vector<float>(p.rows())};
  CHECK(test::contains(test::error_of([&] { gpu::forward(step07::kForward, p, in, true); }), "bf16 or fp16"));
  CHECK(test::contains(test::error_of([&] { gpu::backward(step07::kBackward, p, in, f, in.q); }), "bf16 or fp16"));
  const Problem q = lowp(make(1, 1, 8, 32, false), DType::bf16);
  CHECK(test::contains(test::error_of([&] { gpu::forward(step07::kForward, q, random_qkv(q, 1), true); }),
                       "d = 64, 128, 256"));
  const Qkv iq = random_qkv(q, 1);
  const ForwardOut fq{iq.q, std::vector<float>(q.rows())};
  CHECK(test::contains(test::error_of([&] { gpu::backward(step07::kBackward, q, iq, fq, iq.q); }), "d = 64, 128, 256"));
  // The lesson's kernels take neither a window nor grouped heads: production does.
  const Problem w = windowed(16, 0, lowp(make(1, 2, 64, 64, true), DType::bf16));
  CHECK(test::contains(test::error_of([&] { gpu::forward(step07::kForwardVersions[1], w, random_qkv(w, 1), true); }),
                       "takes no window"));
  const Problem g = grouped(1, lowp(make(1, 2, 64, 64, false), DType::bf16));
  CHECK(test::contains(test::error_of([&] { gpu::forward(step07::kForwardVersions[1], g, random_qkv(g, 1), true); }),
                       "one K/V head per query head"));
}

// The backward: against the fp64 reference by FlashAttention's rule for gradients (3×
// the naive same-dtype error), against its model (step 06's) and step 06's kernel on
// the same inputs and the same forward: a few 16-bit units (fp32 sums in other orders).
TEST_CASE("step07 backward meets the gradient budget, matches its model and step 06", "[gpu]") {
  for (DType t : {DType::bf16, DType::fp16})
    for (const Problem& base : test::sweep({1, 17, 113, 1000}, kBwdD)) {
      const Problem p = lowp(base, t);
      INFO(p.str() << ", seeds 104, 105");
      const Qkv in = inputs(p, 104);
      const std::vector<float> dout = grad_out(p, 105);
      const ForwardOut fwd = gpu::forward(step07::kForward, p, in, true);
      const Grads g = gpu::backward(step07::kBackward, p, in, fwd, dout);
      check_grad_budget(p, in, dout, g, "kernel");
      check_grads_close("vs step 06", p, g, gpu::backward(step06::kBackward, p, in, fwd, dout), reorder(t));
      if (p.N <= 113) check_grads_close("vs model", p, g, step07::model_backward(p, in, fwd, dout).grads, reorder(t));
    }
}

TEST_CASE("step07 backward at N = 4097 and N = 130 (keys past N in a consumer's half), several heads", "[gpu]") {
  for (int N : {130, 4097})
    for (int d : kBwdD)
      for (bool causal : {false, true}) {
        if (test::quick() && N > 130) continue;
        const Problem p = lowp(make(1, 3, N, d, causal), DType::bf16);
        INFO(p.str() << ", seeds 106, 107");
        const Qkv in = inputs(p, 106);
        const std::vector<float> dout = grad_out(p, 107);
        const ForwardOut fwd = gpu::forward(step07::kForward, p, in, true);
        const Grads g = gpu::backward(step07::kBackward, p, in, fwd, dout);
        if (N == 130) check_grad_budget(p, in, dout, g, "kernel");  // the fp64 reference: the small N
        check_grads_close("vs step 06", p, g, gpu::backward(step06::kBackward, p, in, fwd, dout), step06::kBf16Reorder);
      }
}

TEST_CASE("step07 backward with huge logits stays finite and within budget", "[gpu]") {
  for (int d : kBwdD) {
    const Problem p = lowp(make(1, 2, 300, d, true, 8.0f), DType::bf16);
    INFO(p.str());
    const Qkv in = inputs(p, 108);
    const std::vector<float> dout = grad_out(p, 109);
    const ForwardOut fwd = gpu::forward(step07::kForward, p, in, true);
    check_grad_budget(p, in, dout, gpu::backward(step07::kBackward, p, in, fwd, dout), "kernel");
  }
}

// The deterministic mode adds dQ's partial sums in key-block order: two runs give the
// same bits; dK and dV never depend on that order, so they equal the default's.
TEST_CASE("step07 deterministic backward: two runs bit for bit; dK, dV = the default's", "[gpu]") {
  for (int N : {113, 1000, 4097})
    for (int d : kBwdD)
      for (bool causal : {false, true}) {
        if (test::quick() && N != 113) continue;
        const Problem p = lowp(make(2, 2, N, d, causal), DType::bf16);
        INFO(p.str() << ", seeds 110, 111");
        const Qkv in = inputs(p, 110);
        const std::vector<float> dout = grad_out(p, 111);
        const ForwardOut fwd = gpu::forward(step07::kForward, p, in, true);
        const Grads a = gpu::backward(step07::kBackwardDeterministic, p, in, fwd, dout);
        const Grads b = gpu::backward(step07::kBackwardDeterministic, p, in, fwd, dout);
        check_grads_close("run 2 vs run 1", p, b, a, tol::kBitExact);
        const Grads any = gpu::backward(step07::kBackward, p, in, fwd, dout);
        FA_CHECK_CLOSE("dK vs the default", a.dk, any.dk, tol::kBitExact, test::shape_o(p));
        FA_CHECK_CLOSE("dV vs the default", a.dv, any.dv, tol::kBitExact, test::shape_o(p));
        FA_CHECK_CLOSE("dQ vs the default", a.dq, any.dq, step06::kBf16Reorder, test::shape_o(p));
        if (N <= 1000) check_grad_budget(p, in, dout, a, "deterministic");
      }
}

// The deterministic mode's dK and dV against the default's: the same sums in the same order,
// bit for bit — unless the default split the groups into shares (backward_parts: too few tiles
// of whole groups), whose dK and dV meet in fp32 in no fixed order.
namespace {
void check_shares(const Problem& p, const Grads& det, const Grads& g) {
  const int parts = step07::backward_parts(p, false);
  INFO("the default's shares of a group: " << parts);
  const Tolerance& t = parts > 1 ? reorder(p.dtype) : tol::kBitExact;
  FA_CHECK_CLOSE("dK, deterministic vs the default", det.dk, g.dk, t, test::shape_kv(p));
  FA_CHECK_CLOSE("dV, deterministic vs the default", det.dv, g.dv, t, test::shape_kv(p));
}
}  // namespace

// Grouped K/V heads on the GPU: the forward reads K/V head bh / G; a backward tile owns a
// key block of a K/V head and walks the query blocks of its G query heads, dK and dV summed
// in registers (where the groups' tiles are too few, of a share of them: check_shares). Against the budgets and the model, and against the same kernels on K and V
// repeated for every query head: the forward bit for bit (the same loads, the same sums);
// in the deterministic mode dQ bit for bit (a query block's pieces in key-block order either
// way), and with dO zero but for one head of each group, dK and dV those of that head alone.
// Every group at N = 17 (16 query heads); at N = 1000 one K/V head for 4 (the CPU's checks
// of 16 heads would take minutes).
TEST_CASE("step07 kernels with grouped K/V heads (groups 1, 2, 4, 8 and H), forward and backward", "[gpu]") {
  for (const auto [H, H_kv, N] : {std::array{16, 16, 17}, {16, 8, 17}, {16, 4, 17}, {16, 2, 17}, {16, 1, 17},
                                  {4, 1, 1000}})
    for (int d : kBwdD)
      for (bool causal : {false, true}) {
        if (test::quick() && (N != 17 || H_kv == 8 || H_kv == 2)) continue;
        const Problem p = grouped(H_kv, lowp(make(1, H, N, d, causal), DType::bf16));
        INFO(p.str() << ", seeds 201, 202");
        const Qkv in = inputs(p, 201);
        const std::vector<float> dout = grad_out(p, 202);
        const ForwardOut fwd = gpu::forward(step07::kForward, p, in, true);
        check_budget(p, in, fwd, "kernel");
        const ModelForward mf = step07::model_forward(p, in);
        FA_CHECK_CLOSE("O vs the model", fwd.o, mf.out.o, reorder(p.dtype), test::shape_o(p));
        const Grads g = gpu::backward(step07::kBackward, p, in, fwd, dout);
        if (N <= 1000 && !test::quick()) check_grad_budget(p, in, dout, g, "kernel");
        check_grads_close("vs the model", p, g, step07::model_backward(p, in, fwd, dout).grads, reorder(p.dtype));
        const Grads det = gpu::backward(step07::kBackwardDeterministic, p, in, fwd, dout);
        check_shares(p, det, g);
      }
}

// A sliding window on the GPU: a tile visits the K/V blocks of its rows' band only (and a
// backward tile the query blocks that see its keys), masking across the band's edges. Windows
// of one key, one-sided, two-sided, wider than the sequence; causal and not; with the
// deterministic mode, whose key blocks wait only on the blocks that visit the same query block.
// Every d at N = 17; d = 128 at N = 1000, d = 64 and 256 at N = 2049 (the CPU's checks of
// every d at both would take minutes).
TEST_CASE("step07 kernels with a sliding window: the budgets, the model, both modes", "[gpu]") {
  const std::pair<int, int> windows[] = {{0, 0}, {16, 0}, {5, 3}, {-1, 7}, {64, -1}, {300, 300}, {1000, 0}};
  for (auto [left, right] : windows)
    for (int N : {17, 1000, 2049})
      for (int d : kBwdD)
        for (bool causal : {false, true}) {
          if ((N == 1000 && d != 128) || (N == 2049 && d == 128) || (test::quick() && N != 1000)) continue;
          const Problem p = windowed(left, right, grouped(causal ? 1 : 2, lowp(make(1, 2, N, d, causal), DType::bf16)));
          INFO(p.str() << ", seeds 221, 222");
          const Qkv in = inputs(p, 221);
          const std::vector<float> dout = grad_out(p, 222);
          const ForwardOut fwd = gpu::forward(step07::kForward, p, in, true);
          if (N <= 1000) check_budget(p, in, fwd, "kernel");
          FA_CHECK_CLOSE("O vs the model", fwd.o, step07::model_forward(p, in).out.o, reorder(p.dtype), test::shape_o(p));
          const Grads g = gpu::backward(step07::kBackward, p, in, fwd, dout);
          if (N <= 1000 && !test::quick()) check_grad_budget(p, in, dout, g, "kernel");
          check_grads_close("vs the model", p, g, step07::model_backward(p, in, fwd, dout).grads, reorder(p.dtype));
          const Grads det = gpu::backward(step07::kBackwardDeterministic, p, in, fwd, dout);
          const Grads again = gpu::backward(step07::kBackwardDeterministic, p, in, fwd, dout);
          check_grads_close("deterministic, run 2 vs run 1", p, again, det, tol::kBitExact);
          check_shares(p, det, g);
        }
}

// A ragged batch on the GPU: a forward tile is one query block of one sequence, a backward
// tile one key block of one (the tables ragged.cu builds from the offsets), their copies
// shifted to the sequence's rows, mask and band in the sequence's coordinates, the query rows
// of the next sequence masked in the backward, and the rows of a sequence's last tile stored
// by hand where TMA's box would run into the next one. So each sequence's rows must be exactly
// what the same kernels give on that sequence alone — the forward, and the deterministic
// backward (dQ added in key-block order) — and every row of the poisoned outputs written.
namespace {
/// Sequence b's Q, K, V (or their gradients) out of a ragged batch's.
Qkv sequence_qkv(const Problem& p, const std::vector<int>& offsets, int b, const Qkv& x) {
  return {sequence_rows(p, offsets, b, x.q, p.heads(), p.d), sequence_rows(p, offsets, b, x.k, p.kv_heads(), p.d),
          sequence_rows(p, offsets, b, x.v, p.kv_heads(), p.d)};
}
}  // namespace

TEST_CASE("step07 on a ragged batch: each sequence's rows are the kernels' on it alone, bit for bit", "[gpu]") {
  const std::vector<int> cases[] = {{1}, {17}, {1000}, {1, 17, 1000, 3}, {130, 129, 1, 64}, {2049, 5, 383, 4097}};
  const std::pair<int, int> bands[] = {{-1, -1}, {16, 0}, {300, 7}};  // none, a causal window, two-sided
  for (const std::vector<int>& lengths : cases)
    for (int d : kAllD)
      for (bool causal : {false, true})
        for (auto [left, right] : bands) {
          const bool long_case = lengths.size() == 4 && lengths[0] == 2049;
          if ((left >= 0 && lengths.size() == 1) || (right > 0 && causal) || (long_case && d == 256 && left >= 0))
            continue;
          if (test::quick() && (long_case || lengths.size() == 1 || left >= 0)) continue;
          const std::vector<int> offsets = offsets_of(lengths);
          const Problem p =
              windowed(left, right, grouped(2, lowp(make(1, 4, offsets.back(), d, causal), DType::bf16)));
          INFO(p.str() << ", " << lengths.size() << " sequences, seeds 231, 232");
          const Qkv in = inputs(p, 231);
          const std::vector<float> dout = grad_out(p, 232);
          const ForwardOut fwd = gpu::forward(step07::kForward, p, in, offsets);
          const Grads g = gpu::backward(step07::kBackward, p, in, fwd, dout, offsets);
          const Grads det = gpu::backward(step07::kBackwardDeterministic, p, in, fwd, dout, offsets);
          if (offsets.back() <= 1200 && left < 0 && d == 128) {  // the CPU's model: one d (every d: the cpu test)
            const ModelForward m = step07::model_forward_ragged(p, in, offsets);
            FA_CHECK_CLOSE("O vs the ragged model", fwd.o, m.out.o, reorder(p.dtype), test::shape_o(p));
            FA_CHECK_CLOSE("L vs the ragged model", fwd.lse, m.out.lse, tol::kFp32Reorder, test::shape_l(p));
            const ModelBackward mb = step07::model_backward_ragged(p, in, fwd, dout, offsets);
            check_grads_close("vs the ragged model", p, g, mb.grads, reorder(p.dtype));
          }
          check_shares(p, det, g);  // the default mode: the deterministic one's sums in another order
          FA_CHECK_CLOSE("dQ, deterministic vs the default", det.dq, g.dq, reorder(p.dtype), test::shape_o(p));
          for (int b = 0; b < int(lengths.size()); ++b) {
            const Problem one = step07::sequence(p, offsets, b);
            INFO("sequence " << b << ": " << one.str());
            const Qkv mine = sequence_qkv(p, offsets, b, in);
            const std::vector<float> my_dout = sequence_rows(p, offsets, b, dout, p.heads(), d);
            const ForwardOut alone = gpu::forward(step07::kForward, one, mine, true);
            FA_CHECK_CLOSE("O vs the sequence alone", sequence_rows(p, offsets, b, fwd.o, p.heads(), d), alone.o,
                           tol::kBitExact, test::shape_o(one));
            FA_CHECK_CLOSE("L vs the sequence alone", sequence_rows(p, offsets, b, fwd.lse, p.heads(), 1), alone.lse,
                           tol::kBitExact, test::shape_l(one));
            const Grads alone_det = gpu::backward(step07::kBackwardDeterministic, one, mine, alone, my_dout);
            const Qkv got = sequence_qkv(p, offsets, b, {det.dq, det.dk, det.dv});
            check_grads_close("deterministic, vs the sequence alone", one, {got.q, got.k, got.v}, alone_det,
                              tol::kBitExact);
          }
        }
}

TEST_CASE("step07's ragged tables on the GPU are the model's, entry for entry", "[gpu]") {
  // The one-block kernel counts where the model sorts: the same table, every run. Lengths
  // 1, 17, 1000, mixed, thousands of random ones, offsets the device must clamp, and a
  // sequence of more blocks than the kernel has threads (weight_sums' carry between rounds).
  std::vector<std::vector<int>> cases = {offsets_of({1}), offsets_of({17}), offsets_of({1000}),
                                         offsets_of({1, 17, 1000, 3}), offsets_of({2049, 5, 383, 4097}),
                                         offsets_of({20 * 64, 3 * 64 - 5, 20 * 64}), {5, 3, 900, 40, 5000, -7, 2000},
                                         offsets_of({70000, 300, 1100 * 64, 70000})};
  for (int sequences : {100, 3000}) {
    std::vector<int> lengths;
    for (int b = 0; b < sequences; ++b) lengths.push_back(1 + int((std::uint64_t(b) * 2654435761u) % 2500));
    cases.push_back(offsets_of(lengths));
  }
  for (const std::vector<int>& offsets : cases)
    for (auto [rows, q_rows] : {std::pair{128, 0}, std::pair{64, 0}, std::pair{128, 80}, std::pair{64, 64}})
      for (bool causal : {false, true}) {
        const int T = std::max(offsets.back(), 4000);
        INFO(offsets.size() - 1 << " sequences, T = " << T << ", rows " << rows << ", q_rows " << q_rows
                                << (causal ? ", causal" : ""));
        const step07::RaggedTable want = step07::ragged_table_model(offsets, T, rows, q_rows, causal);
        for (int run = 0; run < 2; ++run) {
          const step07::RaggedTable got = step07::ragged_table_gpu(offsets, T, rows, q_rows, causal);
          REQUIRE(got.blocks.size() == want.blocks.size());
          REQUIRE(got.q_blocks.size() == want.q_blocks.size());
          auto same = [](const step07::SeqBlock& x, const step07::SeqBlock& y) {
            return x.i == y.i && x.start == y.start && x.length == y.length;
          };
          for (std::size_t e = 0; e < want.blocks.size(); ++e)
            if (!same(got.blocks[e], want.blocks[e]) || (q_rows && got.q_first[e] != want.q_first[e])) {
              FAIL_CHECK("entry " << e << ": got " << table_str(got.blocks, e, 3) << "want "
                                  << table_str(want.blocks, e, 3));
              break;
            }
          for (std::size_t e = 0; e < want.q_blocks.size(); ++e)
            if (!same(got.q_blocks[e], want.q_blocks[e])) {
              FAIL_CHECK("query block " << e << ": got " << table_str(got.q_blocks, e, 3) << "want "
                                        << table_str(want.q_blocks, e, 3));
              break;
            }
        }
      }
}

TEST_CASE("step07 refuses a ragged batch it cannot take", "[gpu]") {
  const Problem p = lowp(make(1, 2, 20, 64, false), DType::bf16);
  const Qkv in = inputs(p, 232);
  CHECK(test::contains(test::error_of([&] { gpu::forward(step07::kForward, p, in, {0, 5, 5, 20}); }), "empty"));
  CHECK(test::contains(test::error_of([&] { gpu::forward(step07::kForward, p, in, {0, 5, 21}); }), "end at N = 20"));
  CHECK(test::contains(test::error_of([&] { gpu::forward(step06::kForward, p, in, {0, 5, 20}); }),
                       "does not take a ragged batch"));
  const ForwardOut fwd = gpu::forward(step07::kForward, p, in, {0, 5, 20});
  CHECK(test::contains(
      test::error_of([&] { gpu::backward(step07::kBackward, p, in, fwd, grad_out(p, 234), {0, 20, 20}); }), "empty"));
  CHECK(test::contains(
      test::error_of([&] { gpu::backward(step06::kBackward, p, in, fwd, grad_out(p, 234), {0, 5, 20}); }),
      "does not take a ragged batch"));
  const Problem fp32 = make(1, 2, 20, 64, false);
  CHECK(test::contains(test::error_of([&] { gpu::forward(step07::kForward, fp32, inputs(fp32, 235), {0, 5, 20}); }),
                       "16 bits"));
  const Problem d32 = lowp(make(1, 2, 20, 32, false), DType::bf16);
  CHECK(test::contains(test::error_of([&] { gpu::forward(step07::kForward, d32, inputs(d32, 236), {0, 5, 20}); }),
                       "d = 64, 128, 256"));
  const Problem two = lowp(make(2, 2, 10, 64, false), DType::bf16);
  CHECK(test::contains(test::error_of([&] { gpu::forward(step07::kForward, two, inputs(two, 233), {0, 10}); }),
                       "B = 1"));
}

TEST_CASE("step07 kernels with grouped K/V heads are those on K, V repeated: forward, dQ, and one head's dK, dV",
          "[gpu]") {
  for (int d : kBwdD)
    for (bool causal : {false, true}) {
      const Problem p = grouped(2, lowp(make(2, 8, test::quick() ? 113 : 1000, d, causal), DType::bf16));
      const Problem r = grouped(0, p);
      INFO(p.str() << ", seeds 211, 212");
      const Qkv in = inputs(p, 211), rin = test::repeated_kv(p, in);
      const ForwardOut got = gpu::forward(step07::kForward, p, in, true), want = gpu::forward(step07::kForward, r, rin, true);
      FA_CHECK_CLOSE("O", got.o, want.o, tol::kBitExact, test::shape_o(p));
      FA_CHECK_CLOSE("L", got.lse, want.lse, tol::kBitExact, test::shape_l(p));
      const int lone = 3;  // of each group of 4
      const std::vector<float> dout = only_head_of_groups(p, grad_out(p, 212), lone);
      const Grads g = gpu::backward(step07::kBackwardDeterministic, p, in, got, dout);
      const Grads w = gpu::backward(step07::kBackwardDeterministic, r, rin, want, dout);
      FA_CHECK_CLOSE("dQ", g.dq, w.dq, tol::kBitExact, test::shape_o(p));
      const auto [dk, dv] = lone_head_kv(p, w, lone);
      FA_CHECK_CLOSE("dK", g.dk, dk, tol::kBitExact, test::shape_kv(p));
      FA_CHECK_CLOSE("dV", g.dv, dv, tol::kBitExact, test::shape_kv(p));
    }
}

// The persistent grid (a block an SM, each taking tile after tile) against the deterministic
// mode's grid of a block a tile: the same kernels, so dK and dV bit for bit (the same sums),
// dQ within the reorder tolerance. The small cases of the other tests fit in one wave of
// blocks; here 200 heads of N = 130 (400 tiles of two query blocks at d ≤ 128, 600 of three
// at d = 256, keys past N in the last; also under the sanitizers) and 64 heads of N = 1000
// (512 tiles, 1024 at d = 256) give every block of a GPU of up to 132 SMs several tiles, so
// that the stages' ring, dQ's pieces (the last one of a tile announced after the loop) and
// K/V's buffers run on from tile to tile, with the causal mask tiles of every length. With
// the mask the tiles go in sections of heads (8·N·d bytes a head at 1 × 32 × 4097: 2, 4, 8
// MiB; on a GPU of 50 or 60 MiB of L2 sections of 16, 8 and 4 heads at d = 64, 128, 256),
// heaviest first in the last section at N = 130 and 1000, in every one at 4097.
TEST_CASE("step07 backward on a persistent grid equals a block a tile (the deterministic mode's)", "[gpu]") {
  for (const auto [B, H, N] : {std::array{2, 100, 130}, std::array{4, 16, 1000}, std::array{1, 32, 4097}})
    for (int d : kBwdD)
      for (bool causal : {false, true}) {
        if (test::quick() && N != 130) continue;
        const Problem p = lowp(make(B, H, N, d, causal), DType::bf16);
        INFO(p.str() << ", seeds 124, 125, " << gpu::sm_count() << " SMs");
        const Qkv in = inputs(p, 124);
        const std::vector<float> dout = grad_out(p, 125);
        const ForwardOut fwd = gpu::forward(step07::kForward, p, in, true);
        const Grads want = gpu::backward(step07::kBackwardDeterministic, p, in, fwd, dout);
        const Grads again = gpu::backward(step07::kBackwardDeterministic, p, in, fwd, dout);
        check_grads_close("deterministic, run 2 vs run 1", p, again, want, tol::kBitExact);
        const Grads g = gpu::backward(step07::kBackward, p, in, fwd, dout);
        FA_CHECK_CLOSE("dK vs a block a tile", g.dk, want.dk, tol::kBitExact, test::shape_o(p));
        FA_CHECK_CLOSE("dV vs a block a tile", g.dv, want.dv, tol::kBitExact, test::shape_o(p));
        FA_CHECK_CLOSE("dQ vs a block a tile", g.dq, want.dq, step06::kBf16Reorder, test::shape_o(p));
      }
}

TEST_CASE("step07 backward at d = 64 and 256, both modes (also under the sanitizers)", "[gpu]") {
  // FA_TEST_QUICK keeps d = 128 alone in the sweeps: this case keeps d = 64 and 256 there
  // (at d = 256 another kernel: the consumers split the columns). N = 113: two query
  // blocks at d = 256's 64 keys a block, the second one partial.
  for (int d : {64, 256})
    for (bool causal : {false, true}) {
      const Problem p = lowp(make(2, 3, 113, d, causal), DType::bf16);
      INFO(p.str() << ", seeds 112, 113");
      const Qkv in = inputs(p, 112);
      const std::vector<float> dout = grad_out(p, 113);
      const ForwardOut fwd = gpu::forward(step07::kForward, p, in, true);
      for (const GpuBackward* b : {&step07::kBackward, &step07::kBackwardDeterministic}) {
        const Grads g = gpu::backward(*b, p, in, fwd, dout);
        check_grad_budget(p, in, dout, g, b->name);
        check_grads_close("vs model", p, g, step07::model_backward(p, in, fwd, dout).grads, step06::kBf16Reorder);
      }
    }
}
#endif

#ifdef FA_HAVE_CUDA
// The rows of note 07's forward table against h7, the warp-specialised kernel a block a tile
// (production's at d = 256): h1 … h4 change only who issues what when, h7 how many consumers
// share a block and h9 how the blocks take their tiles, never a row's arithmetic, so they
// agree with it bit for bit.
TEST_CASE("step07 forward version h9 (persistent grid) equals h7 bit for bit", "[gpu]") {
  // h9's blocks loop over tiles only when there are more tiles than SMs: B·H·T_r of 320 to
  // 1280 here, the causal tiles of unequal length in sections of heads (4·N·d bytes of K/V a
  // head), N not a tile multiple; at d = 64 and 128 O staged in tiles of its own, at d = 256
  // in the Q tiles.
  const GpuForward &h7 = forward_version("h7"), &h9 = forward_version("h9");
  std::vector<int> Ns{1000, 2049};
  if (test::quick()) Ns = {1000};
  for (int d : kAllD)
    for (int N : Ns)
      for (bool causal : {false, true}) {
        const Problem p = lowp(make(2, N > 1000 ? 40 : 20, N, d, causal), DType::bf16);
        INFO(p.str() << ", seed 96");
        const Qkv in = inputs(p, 96);
        const ForwardOut want = gpu::forward(h7, p, in, true), got = gpu::forward(h9, p, in, true);
        FA_CHECK_CLOSE("O vs h7", got.o, want.o, tol::kBitExact, test::shape_o(p));
        FA_CHECK_CLOSE("L vs h7", got.lse, want.lse, tol::kBitExact, test::shape_l(p));
      }
}

TEST_CASE("step07 forward versions: h1 = h2 = h3 = h4 = h7 = h9 bit for bit", "[gpu]") {
  for (DType t : {DType::bf16, DType::fp16})
    for (const Problem& base : test::sweep({113, 1000}, kAllD)) {
      const Problem p = lowp(base, t);
      const Qkv in = inputs(p, 97);
      const ForwardOut h7 = gpu::forward(forward_version("h7"), p, in, true);
      for (const GpuForward& v : step07::kForwardVersions) {
        INFO(v.name << ", " << p.str() << ", seed 97");
        const ForwardOut out = gpu::forward(v, p, in, true);
        FA_CHECK_CLOSE("O vs h7", out.o, h7.o, tol::kBitExact, test::shape_o(p));
        FA_CHECK_CLOSE("L vs h7", out.lse, h7.lse, tol::kBitExact, test::shape_l(p));
      }
    }
}
#endif
