// Step 08 tests. Step 08 computes what step 06 computes — the same 16-bit inputs, P
// rounded before P·V, fp32 sums — on decoding shapes (N queries, the last N of N_kv
// positions; H/H_kv query heads per K/V head), with the keys split across thread blocks
// and merged. So: the fp64 reference by FlashAttention's rule (at most twice a naive
// same-dtype computation's error), its CPU model, step 06 on the same problem, and any
// split count against one split (the merge's reordering: a few 16-bit units).
#include <algorithm>
#include <cmath>
#include <iterator>

#include "reference/reference.hpp"
#include "steps/06_tensor_cores/step06.hpp"
#include "steps/08_split_kv/step08.hpp"
#include "tests/check.hpp"
#include "tests/lowp.hpp"
#ifdef FA_HAVE_CUDA
#include "common/gpu.hpp"
#include "common/gpu16.cuh"
#endif

using namespace fa;
using fa::test::make;

namespace {
using test::check_budget;
using test::inputs;
using test::lowp;
using test::reorder;

const std::vector<int> kAllD(std::begin(step08::kSupportedD), std::end(step08::kSupportedD) - 1);

/// A decoding problem: B·H query heads of N queries against N_kv keys, G query heads per K/V head.
Problem decode(int B, int H, int N, int Nk, int G, int d, bool causal, DType t = DType::bf16) {
  Problem p = lowp(make(B, H, N, d, causal), t);
  p.N_kv = Nk;
  p.H_kv = H / G;
  return p;
}

/// The shapes the tests sweep: 1, 16 and 17 queries (one row block, a full one, one row
/// over), N_kv = 1, 17, 113, 1000 (no tile multiple), one K/V head per query head or
/// four, causal and not. FA_TEST_QUICK keeps N_kv = 113 (sanitizer runs).
std::vector<Problem> decode_sweep(int d, DType t) {
  std::vector<Problem> out;
  for (int Nk : {1, 17, 113, 1000}) {
    if (test::quick() && Nk != 113) continue;
    for (int N : {1, 16, 17})
      for (int G : {1, 4})
        for (bool causal : {false, true})
          if (!causal || Nk >= N) out.push_back(decode(2, 4, N, Nk, G, d, causal, t));
  }
  return out;
}

/// A plan in words, for the tests' messages.
std::string cut(const step08::SplitPlan& s) {
  return std::to_string(s.blocks) + " blocks over " + std::to_string(s.units) + " units of " +
         std::to_string(s.tiles) + " tiles";
}

/// The problem's tiles shared by `blocks` blocks (at most one a tile): chunks that end
/// inside units unless blocks is a multiple of the units.
step08::SplitPlan shared(const Problem& p, long long blocks) {
  step08::SplitPlan s = step08::fixed_plan(p, 1);
  s.blocks = int(std::min(blocks, s.total()));
  return s;
}


/// Two forwards that must agree bit for bit, O and L (`what`: which two).
void check_same_bits(const Problem& p, const ForwardOut& got, const ForwardOut& want, const std::string& what) {
  FA_CHECK_CLOSE("O, " + what, got.o, want.o, tol::kBitExact, test::shape_o(p));
  FA_CHECK_CLOSE("L, " + what, got.lse, want.lse, tol::kBitExact, test::shape_l(p));
}
#ifdef FA_HAVE_CUDA
/// A lesson row against production where their merges may order the statistics
/// differently (production's cluster merge and its split epilogue: on an H100, L of a few
/// rows one fp32 unit apart): the 16-bit reorder tolerance for O, fp32's for L.
void check_close(const Problem& p, const ForwardOut& got, const ForwardOut& want, const std::string& what) {
  FA_CHECK_CLOSE("O, " + what, got.o, want.o, reorder(p.dtype), test::shape_o(p));
  FA_CHECK_CLOSE("L, " + what, got.lse, want.lse, tol::kFp32Forward, test::shape_l(p));
}
#endif
}  // namespace

TEST_CASE("step08 model meets the error budget of its 16-bit type, at every split count", "[cpu]") {
  for (DType t : {DType::bf16, DType::fp16})
    for (int d : kAllD)
      for (const Problem& p : decode_sweep(d, t)) {
        const Qkv in = inputs(p, 81);
        for (const step08::SplitPlan& s : {step08::fixed_plan(p, 1), step08::fixed_plan(p, 3),
                                           step08::fixed_plan(p, 1000), shared(p, 2 * step08::fixed_plan(p, 1).units + 1)}) {
          INFO(p.str() << ", seed 81, " << cut(s));
          check_budget(p, in, step08::model_forward(p, in, s).out, "model");
        }
      }
}

TEST_CASE("step08 model: any split, across units too, equals one block a unit, up to the merge's reordering", "[cpu]") {
  for (const Problem& p : {decode(1, 2, 1, 1000, 1, 128, false), decode(1, 8, 16, 4097, 4, 64, true),
                           decode(2, 2, 17, 777, 2, 128, true)}) {
    const Qkv in = inputs(p, 82);
    const ModelForward one = step08::model_forward(p, in, step08::fixed_plan(p, 1));
    std::vector<step08::SplitPlan> plans;
    for (int splits : {2, 3, 7, 16, 1000}) plans.push_back(step08::fixed_plan(p, splits));
    for (int extra : {1, 3}) plans.push_back(shared(p, 2 * step08::fixed_plan(p, 1).units + extra));  // across units
    for (const step08::SplitPlan& s : plans) {
      INFO(p.str() << ": " << cut(s) << " against one block a unit");
      const ModelForward m = step08::model_forward(p, in, s);
      FA_CHECK_CLOSE("O", m.out.o, one.out.o, reorder(p.dtype), test::shape_o(p));
      FA_CHECK_CLOSE("L", m.out.lse, one.out.lse, tol::kFp32Forward, test::shape_l(p));
    }
  }
}

TEST_CASE("step08 model equals step 06's model on decoding shapes, and on self-attention", "[cpu]") {
  for (const Problem& p : {decode(2, 4, 1, 1000, 4, 128, false), decode(1, 4, 16, 300, 1, 64, true),
                           decode(1, 2, 17, 130, 2, 128, true), lowp(make(1, 2, 113, 64, true), DType::fp16)}) {
    INFO(p.str());
    const Qkv in = inputs(p, 83);
    const ForwardOut a = step08::model_forward(p, in, step08::plan(p, step08::kH200)).out;
    const ForwardOut b = step06::model_forward(p, in).out;
    FA_CHECK_CLOSE("O", a.o, b.o, reorder(p.dtype), test::shape_o(p));
    FA_CHECK_CLOSE("L", a.lse, b.lse, tol::kFp32Forward, test::shape_l(p));
  }
}

TEST_CASE("step08 model: grouped-query attention is the problem with K/V repeated per head, bit for bit", "[cpu]") {
  // Packing a group's heads into one block changes which block a row is in, never the
  // row's arithmetic (its keys, its warps' slices, its splits, the merge order).
  for (bool causal : {false, true}) {
    const Problem p = decode(2, 8, 5, 300, 4, 64, causal);
    Problem e = p;
    e.H_kv = 0;
    INFO(p.str());
    const Qkv in = inputs(p, 84);
    const ForwardOut g = step08::model_forward(p, in, step08::fixed_plan(p, 2)).out;
    const ForwardOut x = step08::model_forward(e, test::repeated_kv(p, in), step08::fixed_plan(e, 2)).out;
    check_same_bits(p, g, x, "grouped vs K/V repeated");
    // and the reference agrees that they are the same problem
    FA_CHECK_CLOSE("reference O", reference::forward(p, in).o, reference::forward(e, test::repeated_kv(p, in)).o,
                   tol::kBitExact, test::shape_o(p));
  }
}

TEST_CASE("step08 model's HBM traffic equals the formula", "[cpu]") {
  for (const Problem& p : {decode(1, 1, 1, 1, 1, 64, false), decode(2, 4, 16, 1000, 4, 128, true),
                           decode(1, 2, 17, 4097, 1, 64, false), decode(1, 3, 40, 200, 3, 128, true)})
    for (const step08::SplitPlan& s :
         {step08::fixed_plan(p, 1), step08::fixed_plan(p, 2), step08::fixed_plan(p, 5), step08::fixed_plan(p, 64),
          shared(p, 7), step08::with_clusters(step08::fixed_plan(p, 2), step08::kH200)}) {
      INFO(p.str() << ", " << cut(s));
      const Traffic m = step08::model_forward(p, random_qkv(p, 1), s).traffic, f = step08::traffic_forward(p, s);
      CHECK(m.read == f.read);
      CHECK(m.written == f.written);
    }
}

TEST_CASE("step08 split plan: one wave of blocks sharing the tiles, no chunk under 4 tiles, at most 128 parts", "[cpu]") {
  const step08::GpuShape h200 = step08::kH200;
  // The ring: 4 tiles wherever a block may hold them; 2 at d = 128 on an RTX 4090 (99 KiB a block).
  CHECK(step08::stages(64, h200) == 4);
  CHECK(step08::stages(128, h200) == 4);
  const step08::GpuShape rtx4090{128, 100 * 1024, 99 * 1024};
  CHECK(step08::stages(64, rtx4090) == 4);
  CHECK(step08::stages(128, rtx4090) == 2);
  CHECK(step08::blocks_per_sm(64, h200) == 3);
  CHECK(step08::blocks_per_sm(128, h200) == 1);
  // Six tiles where every chunk streams at least 16 (d = 128, a block of 196 KiB at one an
  // SM): B·H = 128 (a head a block) and B·H = 32 (four chunks of a head) from 8k keys; 4
  // K/V heads are 33 chunks a unit: 3 or 4 tiles each at 8k keys, 15 or 16 at 32k, 31 or 32
  // at 64k. Four at d = 64, on an A100 (163 KiB a block), and where a chunk is shorter; two
  // on an RTX 4090.
  const auto ring = [](const Problem& p, const step08::GpuShape& g) {
    return step08::ring_tiles(p, step08::plan(p, g), g);
  };
  CHECK(ring(decode(1, 128, 1, 8192, 1, 128, false), h200) == step08::kDeepRing);
  CHECK(ring(decode(1, 32, 1, 8192, 1, 128, false), h200) == step08::kDeepRing);
  CHECK(ring(decode(1, 32, 1, 8192, 8, 128, false), h200) == 4);
  CHECK(ring(decode(1, 32, 1, 32768, 8, 128, false), h200) == 4);
  CHECK(ring(decode(1, 32, 1, 65536, 8, 128, false), h200) == step08::kDeepRing);
  CHECK(ring(decode(1, 32, 1, 1000, 1, 128, false), h200) == 4);  // 16 tiles a head: 4 a chunk
  CHECK(ring(decode(1, 128, 1, 8192, 1, 64, false), h200) == 4);
  CHECK(ring(decode(1, 128, 1, 8192, 1, 128, false), step08::GpuShape{108, 164 * 1024, 163 * 1024}) == 4);
  CHECK(ring(decode(1, 128, 1, 8192, 1, 128, false), rtx4090) == 2);
  // The decode shapes (d = 128, one block an SM on the H200): B·H = 32 makes 32
  // units, 4 splits each fill 128 of the 132 SMs; shared by 132 blocks the tiles are 31 a
  // block at 8k keys, too few to pay for the sharing, and 496 at 128k. B·H = 128 is one
  // block a unit, no merge: never shared. 4 K/V heads: 33 splits make the wave. 132 units
  // fill it: one block each.
  const int wave = 132;
  const Problem a = decode(1, 32, 1, 8192, 1, 128, false);
  CHECK(step08::plan(a, h200).blocks == 4 * 32);
  CHECK(step08::plan(a, h200).units == 32);
  CHECK(step08::plan(a, h200).end(0) - step08::plan(a, h200).begin(0) == 128 / 4);
  const Problem a128k = decode(1, 32, 1, 131072, 1, 128, false);
  CHECK(step08::plan(a128k, h200).blocks == wave);
  CHECK(step08::plan(a128k, h200).end(0) - step08::plan(a128k, h200).begin(0) == 32 * 2048 / wave);
  CHECK(step08::unit_plan(a128k, h200).blocks == 4 * 32);
  CHECK(step08::plan(decode(1, 32, 1, 131072, 8, 128, false), h200).blocks == wave);  // GQA: 4 K/V heads, 33 splits
  CHECK(step08::plan(decode(1, 32, 1, 131072, 8, 128, false), h200).parts(0) == 33);
  CHECK(step08::plan(decode(1, 128, 1, 8192, 1, 128, false), h200).direct());
  CHECK(step08::plan(decode(1, 128, 16, 131072, 1, 128, false), h200).direct());
  CHECK(step08::shared_plan(decode(1, 128, 16, 131072, 1, 128, false), h200).blocks == wave);
  CHECK(step08::plan(decode(1, 132, 16, 131072, 1, 128, false), h200).direct());
  CHECK(step08::plan(decode(1, 50, 1, 65000, 1, 128, false), h200).blocks == wave);  // the GPU test's shared shape
  // Few keys: 4 tiles a chunk at least; a row's parts at most kMaxParts.
  CHECK(step08::plan(decode(1, 1, 1, 1000, 1, 64, false), h200).blocks == 16 / 4);
  CHECK(step08::plan(decode(1, 1, 1, 100, 1, 64, false), h200).direct());
  CHECK(step08::plan(decode(1, 1, 1, 262144, 1, 64, false), h200).blocks == step08::kMaxParts);
  CHECK(step08::fixed_plan(decode(1, 1, 1, 262144, 1, 64, false), 1000).blocks == step08::kMaxParts);
  for (int Nk : {1, 63, 64, 65, 1000, 8192, 131072, 262144})
    for (int bh : {1, 8, 32, 100, 128, 1024})
      for (int N : {1, 16, 40}) {
        const Problem p = decode(1, bh, N, Nk, 1, 128, N <= Nk);
        const step08::SplitPlan s = step08::plan(p, h200);
        INFO(p.str() << ": " << cut(s));
        CHECK(s.units == std::int64_t(bh) * step08::row_blocks(p));
        CHECK(s.tiles == step08::kv_tiles(p));
        CHECK(s.blocks <= std::max<std::int64_t>(wave, s.units));  // one wave, unless the units are more
        CHECK((s.direct() || s.total() / s.blocks >= 4));           // no chunk under 4 tiles
        CHECK(step08::most_parts(s) <= step08::kMaxParts);
        // The chunks cover the tiles once, none empty; a unit's parts are the blocks that meet it.
        CHECK(s.begin(0) == 0);
        CHECK(s.end(s.blocks - 1) == s.total());
        int most = 0;
        for (std::int64_t u = 0; u < s.units && u < 300; ++u) {
          int meet = 0;
          for (int b = 0; b < s.blocks; ++b) meet += s.begin(b) < (u + 1) * s.tiles && s.end(b) > u * s.tiles;
          CHECK(s.parts(u) == meet);
          CHECK(s.begin(s.first(u)) <= u * s.tiles);
          CHECK(s.end(s.first(u)) > u * s.tiles);
          most = std::max(most, meet);
        }
        CHECK(most <= step08::most_parts(s));
      }
  // Fixed splits: every unit S chunks of its own.
  for (int splits : {1, 2, 3, 8}) {
    const step08::SplitPlan s = step08::fixed_plan(decode(2, 4, 17, 1000, 2, 64, true), splits);
    INFO(cut(s));
    CHECK(step08::most_parts(s) == splits);
    for (std::int64_t u = 0; u < s.units; ++u) CHECK((s.parts(u) == splits && s.first(u) == u * splits));
  }
  // Causal: a block's last tile is its latest query's; a block across two heads reaches
  // its heads' latest query, N − 1.
  CHECK(step08::tile_end(16, 1000, 1, true, 0) == (1000 - 16 + 15) / 64 + 1);
  CHECK(step08::tile_end(10, 70, 4, true, 0) == 70 / 64 + 1);  // rows 0–15: heads 0 and 1
  CHECK(step08::tile_end(40, 64, 1, true, 0) == (64 - 40 + 15) / 64 + 1);
}

TEST_CASE("step08 plan merges in clusters where every unit is 2 to 8 short chunks of its own and all the clusters fit",
          "[cpu]") {
  const step08::GpuShape h200 = step08::kH200;
  auto clustered = [&](const Problem& p, const step08::GpuShape& g) {
    return step08::with_clusters(step08::plan(p, g), g).cluster;
  };
  // The H200 runs 15 clusters of 8, 30 of 4, 39 of 3 and 66 of 2 at once (a cluster's
  // blocks share a GPC): 15 units of 8 chunks, 30 of 4, 39 of 3, 66 of 2 merge in clusters
  // at 8k keys ...
  CHECK(clustered(decode(1, 15, 1, 8192, 1, 128, false), h200) == 8);
  CHECK(clustered(decode(1, 120, 1, 8192, 8, 128, false), h200) == 8);   // 15 K/V heads of 8 query heads
  CHECK(clustered(decode(1, 30, 16, 8192, 1, 128, true), h200) == 4);
  CHECK(clustered(decode(1, 39, 1, 8192, 1, 128, false), h200) == 3);
  CHECK(clustered(decode(1, 66, 1, 8192, 1, 128, false), h200) == 2);
  // ... where a chunk is at most 64 tiles (4k keys): longer, the merge kernel.
  CHECK(clustered(decode(1, 15, 1, 32768, 1, 128, false), h200) == 8);   // 512 tiles, 64 a chunk
  CHECK(clustered(decode(1, 15, 1, 32769, 1, 128, false), h200) == 1);   // 513 tiles, a chunk of 65
  CHECK(clustered(decode(1, 66, 1, 16384, 1, 128, false), h200) == 1);   // 128 tiles a chunk
  // ... and not the shapes, whose plans need one cluster more than fit, or have no merge:
  CHECK(clustered(decode(1, 32, 1, 8192, 1, 128, false), h200) == 1);    // 32 units of 4 chunks: 30 fit
  CHECK(clustered(decode(1, 128, 1, 8192, 8, 128, false), h200) == 1);   // 16 units of 8 chunks: 15 fit
  CHECK(clustered(decode(1, 20, 1, 8192, 1, 128, false), h200) == 1);    // 20 units of 6 chunks: 17 fit
  CHECK(clustered(decode(1, 32, 1, 8192, 8, 128, false), h200) == 1);    // 4 K/V heads, 32 chunks each: too many
  CHECK(clustered(decode(1, 30, 1, 131072, 1, 128, false), h200) == 1);  // the tiles shared: chunks across units
  CHECK(clustered(decode(1, 128, 1, 8192, 1, 128, false), h200) == 1);   // one block a unit: no merge at all
  step08::GpuShape fewer = h200;  // a GPU that runs 14 clusters of 8 at once: the merge kernel for 15 units
  fewer.clusters[8] = 14;
  CHECK(clustered(decode(1, 15, 1, 8192, 1, 128, false), fewer) == 1);
  const step08::GpuShape a100{108, 164 * 1024, 163 * 1024};  // no clusters before Hopper
  CHECK(clustered(decode(1, 15, 1, 8192, 1, 128, false), a100) == 1);
  // The cluster's merge adds what the merge kernel adds in the same order: the same bits,
  // with the partials on chip instead of in HBM (written and read once each: S parts of
  // every row, d + 1 floats).
  for (const Problem& p : {decode(2, 8, 16, 3000, 8, 64, true), decode(1, 3, 1, 1000, 1, 128, false)})
    for (int S : {2, 3, 5}) {
      const step08::SplitPlan k = step08::fixed_plan(p, S), c = step08::with_clusters(k, h200);
      INFO(p.str() << ": " << cut(k));
      REQUIRE(c.cluster == S);
      const Qkv in = inputs(p, 91);
      const ModelForward a = step08::model_forward(p, in, k), b = step08::model_forward(p, in, c);
      check_same_bits(p, b.out, a.out, "cluster's merge vs the merge kernel's (model)");
      const std::uint64_t partials = std::uint64_t(S) * p.rows() * std::uint64_t(p.d + 1);
      CHECK(a.traffic.read - b.traffic.read == partials);
      CHECK(a.traffic.written - b.traffic.written == partials);
      CHECK(step08::workspace_bytes(p, c) == 0);
    }
}

TEST_CASE("step08 K/V reads evict-first where K and V are at most three L2s", "[cpu]") {
  const step08::GpuShape h200 = step08::kH200;  // 60 MiB of L2: up to 180 MiB of K and V
  auto first = [&](const Problem& p) { return step08::reads_evict_first(p, h200); };
  // The decoding shapes the rule was timed at: K and V of 16–128 MiB read evict-first ...
  CHECK(first(decode(1, 32, 1, 8192, 8, 128, false)));     // 4 K/V heads, 8k keys: 16 MiB
  CHECK(first(decode(1, 32, 1, 65536, 8, 128, false)));    // 128 MiB
  CHECK(first(decode(1, 128, 1, 16384, 8, 128, false)));   // 16 K/V heads: 128 MiB
  CHECK(first(decode(1, 32, 16, 8192, 1, 128, true)));     // 32 K/V heads, 8k keys: 128 MiB
  // ... from 256 MiB up, as any load.
  CHECK_FALSE(first(decode(1, 32, 1, 131072, 8, 128, false)));  // 256 MiB
  CHECK_FALSE(first(decode(1, 32, 1, 16384, 1, 128, false)));   // 256 MiB
  CHECK_FALSE(first(decode(1, 128, 16, 131072, 1, 128, true)));  // 8 GiB
  // The bound: 180 MiB exactly (512 bytes a key at d = 128: 2 heads of 184320 keys) is in, a key more is not.
  CHECK(first(decode(1, 2, 1, 184320, 1, 128, false)));
  CHECK_FALSE(first(decode(1, 2, 1, 184321, 1, 128, false)));
  // d = 64 reads half the bytes a key: twice the keys before the bound.
  CHECK(first(decode(1, 32, 1, 16384, 1, 64, false)));
  // A GPU whose L2 size is not known gets no hint.
  CHECK_FALSE(step08::reads_evict_first(decode(1, 1, 1, 64, 1, 128, false), {108, 164 * 1024, 163 * 1024}));
}

TEST_CASE("step08 ring filled by TMA where every chunk has 128 tiles or more, on Hopper at d = 128", "[cpu]") {
  const step08::GpuShape h200 = step08::kH200;
  auto tma = [&](const Problem& p) { return step08::ring_by_tma(p, step08::plan(p, h200), h200); };
  // Chunks of 128 tiles: 128 heads of 8k keys (a block a head), 32 of 32k (four blocks a
  // head), 16 K/V heads of 64k (eight a head); and longer.
  CHECK(tma(decode(1, 128, 1, 8192, 1, 128, false)));
  CHECK(tma(decode(1, 32, 1, 32768, 1, 128, false)));
  CHECK(tma(decode(1, 128, 1, 65536, 8, 128, false)));
  CHECK(tma(decode(1, 128, 16, 131072, 1, 128, true)));
  // Chunks of 64 tiles or fewer: cp.async.
  CHECK_FALSE(tma(decode(1, 128, 1, 4096, 1, 128, false)));
  CHECK_FALSE(tma(decode(1, 32, 1, 16384, 1, 128, false)));
  CHECK_FALSE(tma(decode(1, 32, 1, 131072, 8, 128, false)));  // 4 K/V heads: 33 chunks a head of 62 tiles
  // Not at d = 64, not without TMA (an A100; the RTX ring), not where a cluster merges.
  CHECK_FALSE(tma(decode(1, 128, 1, 16384, 1, 64, false)));
  const Problem p = decode(1, 128, 1, 16384, 1, 128, false);
  step08::GpuShape a100 = h200;
  a100.tma = false;
  CHECK_FALSE(step08::ring_by_tma(p, step08::plan(p, a100), a100));
  step08::SplitPlan clustered = step08::fixed_plan(p, 2);
  clustered.cluster = 2;
  CHECK(step08::ring_by_tma(p, step08::fixed_plan(p, 2), h200));
  CHECK_FALSE(step08::ring_by_tma(p, clustered, h200));
  // A paged cache: only in pages of whole tiles.
  for (int page : {64, 128, 256}) CHECK(step08::ring_by_tma(p, step08::fixed_plan(p, 2), h200, page));
  for (int page : {16, 32, 48, 80}) CHECK_FALSE(step08::ring_by_tma(p, step08::fixed_plan(p, 2), h200, page));
}

TEST_CASE("step08 refuses fp32, other head dimensions and groups that do not divide", "[cpu]") {
  const Problem f = decode(1, 1, 1, 40, 1, 64, false, DType::fp32);
  CHECK(test::contains(test::error_of([&] { step08::model_forward(f, random_qkv(f, 1), {}); }), "bf16 or fp16"));
  const Problem d = decode(1, 1, 1, 40, 1, 256, false);
  CHECK(test::contains(test::error_of([&] { step08::model_forward(d, random_qkv(d, 1), {}); }), "d = 64, 128"));
  Problem g = decode(1, 6, 1, 40, 1, 64, false);
  g.H_kv = 4;
  CHECK(test::contains(test::error_of([&] { g.validate(); }), "H_kv (K/V heads) must divide H"));
  const Problem c = decode(1, 1, 50, 40, 1, 64, true);
  CHECK(test::contains(test::error_of([&] { c.validate(); }), "N_kv must be at least N"));
}

// ---- A paged cache.

namespace {
/// The contiguous cache of p in a pool of pages of `page` positions, shuffled, with `spare`
/// pages no sequence uses; the rows no sequence uses are NaN (never to be read).
struct PagedPools {
  step08::PagedKv kv;
  Qkv pools;
};
PagedPools paged(const Problem& p, const Qkv& in, int page, int spare, std::vector<int> lengths = {}) {
  PagedPools r;
  r.kv.page = page;
  r.kv.lengths = std::move(lengths);
  const int pps = r.kv.pages_per_seq(p);
  r.kv.pool = p.B * pps + spare;
  std::vector<int> perm(std::size_t(r.kv.pool));
  for (int x = 0; x < r.kv.pool; ++x) perm[std::size_t(x)] = x;
  std::uint64_t seed = 0x9E3779B97F4A7C15ull;
  for (std::size_t x = perm.size() - 1; x > 0; --x) {  // Fisher–Yates, a fixed stream
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    std::swap(perm[x], perm[std::size_t(seed >> 33) % (x + 1)]);
  }
  r.kv.table.assign(perm.begin(), perm.begin() + std::size_t(p.B) * pps);
  const std::size_t elems = std::size_t(r.kv.pool) * p.kv_heads_per_batch() * page * p.d;
  r.pools = {in.q, std::vector<float>(elems, NAN), std::vector<float>(elems, NAN)};
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.kv_heads_per_batch(); ++h)
      for (int key = 0; key < r.kv.length(p, b); ++key)
        for (int c = 0; c < p.d; ++c) {
          const std::size_t from = ((std::size_t(b) * p.kv_heads_per_batch() + h) * p.keys() + key) * p.d + c;
          r.pools.k[step08::paged_row(p, r.kv, b, h, key) + c] = in.k[from];
          r.pools.v[step08::paged_row(p, r.kv, b, h, key) + c] = in.v[from];
        }
  return r;
}
/// Sequence b of p alone (B = 1, its own keys, its cache contiguous): its problem and inputs.
std::pair<Problem, Qkv> one_sequence(const Problem& p, const Qkv& in, int b, int keys) {
  Problem one = p;
  one.B = 1, one.N_kv = keys;
  const std::size_t q = std::size_t(p.H) * p.N * p.d, kv = std::size_t(p.kv_heads_per_batch()) * p.keys() * p.d;
  Qkv seq{std::vector<float>(in.q.begin() + b * q, in.q.begin() + (b + 1) * q), {}, {}};
  for (int h = 0; h < p.kv_heads_per_batch(); ++h) {
    const std::size_t from = b * kv + std::size_t(h) * p.keys() * p.d;
    seq.k.insert(seq.k.end(), in.k.begin() + from, in.k.begin() + from + std::size_t(keys) * p.d);
    seq.v.insert(seq.v.end(), in.v.begin() + from, in.v.begin() + from + std::size_t(keys) * p.d);
  }
  return {one, seq};
}
/// Rows of sequence b of out (B sequences of H·N rows).
ForwardOut rows_of(const Problem& p, const ForwardOut& out, int b) {
  const std::size_t q = std::size_t(p.H) * p.N * p.d, rows = std::size_t(p.H) * p.N;
  return {std::vector<float>(out.o.begin() + b * q, out.o.begin() + (b + 1) * q),
          std::vector<float>(out.lse.begin() + b * rows, out.lse.begin() + (b + 1) * rows)};
}
}  // namespace

TEST_CASE("step08 model on a paged cache: shuffled pages give the contiguous cache's bits (exercise 08-page)",
          "[cpu]") {
  for (int page : {16, 64, 256})
    for (bool causal : {false, true}) {
      const Problem p = decode(2, 4, 3, 1000, 2, 64, causal);  // 1000 keys: no multiple of a page
      INFO(p.str() << ", pages of " << page);
      const Qkv in = inputs(p, 161);
      const PagedPools pg = paged(p, in, page, 3);
      for (const step08::SplitPlan& s : {step08::fixed_plan(p, 1), step08::fixed_plan(p, 3), step08::plan(p, step08::kH200)}) {
        INFO(cut(s));
        const ModelForward got = step08::model_forward_paged(p, pg.pools, pg.kv, s), want = step08::model_forward(p, in, s);
        check_same_bits(p, got.out, want.out, "paged vs contiguous");
        CHECK(got.traffic.read == want.traffic.read);
      }
    }
}

TEST_CASE("step08 model on a paged cache: sequences of different lengths in one call, each within the budget",
          "[cpu]") {
  const std::vector<int> lengths = {1000, 37, 300, 4};
  for (bool causal : {false, true}) {
    const Problem p = decode(4, 4, 4, 1000, 4, 128, causal);
    const Qkv in = inputs(p, 171);
    const PagedPools pg = paged(p, in, 32, 0, lengths);
    for (const step08::SplitPlan& s : {step08::fixed_plan(p, 1), step08::fixed_plan(p, 8), step08::plan(p, step08::kH200)}) {
      const ForwardOut got = step08::model_forward_paged(p, pg.pools, pg.kv, s).out;
      for (int b = 0; b < p.B; ++b) {
        const auto [one, seq] = one_sequence(p, in, b, lengths[std::size_t(b)]);
        INFO(one.str() << " (sequence " << b << "), " << cut(s));
        check_budget(one, seq, rows_of(p, got, b), "paged model");
      }
    }
  }
}

TEST_CASE("step08 paged cache: a bad page size, table, length or pool is refused in one line", "[cpu]") {
  const Problem p = decode(2, 4, 3, 100, 2, 64, false);
  const Qkv in = inputs(p, 181);
  const PagedPools good = paged(p, in, 16, 1);
  auto error_with = [&](auto change) {
    PagedPools x = good;
    change(x);
    return test::error_of([&] { step08::model_forward_paged(p, x.pools, x.kv, step08::fixed_plan(p, 1)); });
  };
  CHECK(test::contains(error_with([](PagedPools& x) { x.kv.page = 8; }), "16 to 256 positions"));
  CHECK(test::contains(error_with([](PagedPools& x) { x.kv.table[3] = x.kv.pool; }), "is not a page of the pool"));
  CHECK(test::contains(error_with([](PagedPools& x) { x.kv.table.pop_back(); }), "page table must be B × 7"));
  CHECK(test::contains(error_with([](PagedPools& x) { x.kv.lengths = {100, 2}; }), "its 3 queries are its last"));
  CHECK(test::contains(error_with([](PagedPools& x) { x.pools.k.pop_back(); }), "holds"));
}

#ifdef FA_HAVE_CUDA
TEST_CASE("step08 kernel meets the error budget, matches its model and step 06", "[gpu]") {
  for (DType t : {DType::bf16, DType::fp16})
    for (int d : kAllD)
      for (const Problem& p : decode_sweep(d, t)) {
        const step08::SplitPlan s = step08::device_plan(p);
        INFO(p.str() << ", seed 85, " << cut(s));
        const Qkv in = inputs(p, 85);
        const ForwardOut out = gpu::forward(step08::kForward, p, in, true);
        check_budget(p, in, out, "kernel");
        const ForwardOut m = step08::model_forward(p, in, s).out;
        FA_CHECK_CLOSE("O vs model", out.o, m.o, reorder(t), test::shape_o(p));
        FA_CHECK_CLOSE("L vs model", out.lse, m.lse, tol::kFp32Forward, test::shape_l(p));
        const ForwardOut s06 = gpu::forward(step06::kForward, p, in, true);
        FA_CHECK_CLOSE("O vs step 06", out.o, s06.o, reorder(t), test::shape_o(p));
        FA_CHECK_CLOSE("L vs step 06", out.lse, s06.lse, tol::kFp32Forward, test::shape_l(p));
      }
}

TEST_CASE("step08 kernel at every fixed split count: its model, and one split", "[gpu]") {
  const std::vector<Problem> ps = test::quick() ? std::vector<Problem>{decode(1, 2, 17, 1000, 2, 64, true)}
                                                : std::vector<Problem>{decode(1, 2, 1, 9000, 1, 128, false),
                                                                       decode(2, 8, 16, 4097, 4, 64, true),
                                                                       decode(1, 4, 113, 1000, 1, 128, true)};
  for (const Problem& p : ps) {
    const Qkv in = inputs(p, 86);
    const ForwardOut one = gpu::forward(step08::kForwardFixed[0], p, in, true);
    for (int i = 0; i < step08::kFixedSplitCount; ++i) {
      const step08::SplitPlan s = step08::fixed_plan(p, step08::kFixedSplits[i]);
      INFO(p.str() << ": " << step08::kForwardFixed[i].name << " (" << cut(s) << ")");
      const ForwardOut out = gpu::forward(step08::kForwardFixed[i], p, in, true);
      const ForwardOut m = step08::model_forward(p, in, s).out;
      FA_CHECK_CLOSE("O vs model", out.o, m.o, reorder(p.dtype), test::shape_o(p));
      FA_CHECK_CLOSE("L vs model", out.lse, m.lse, tol::kFp32Forward, test::shape_l(p));
      FA_CHECK_CLOSE("O vs one split", out.o, one.o, reorder(p.dtype), test::shape_o(p));
      FA_CHECK_CLOSE("L vs one split", out.lse, one.lse, tol::kFp32Forward, test::shape_l(p));
    }
  }
}

TEST_CASE("step08 kernel as an RTX 30xx/40xx runs it (two stages at d = 128): its model, and the default", "[gpu]") {
  for (int d : kAllD)
    for (const Problem& p : {decode(1, 8, 1, 3000, 1, d, false), decode(2, 8, 16, 1000, 4, d, true)}) {
      if (test::quick() && p.N != 16) continue;
      const step08::SplitPlan s = step08::device_plan_small_blocks(p);
      INFO(p.str() << ": " << cut(s));
      const Qkv in = inputs(p, 89);
      const ForwardOut out = gpu::forward(step08::kForwardSmallBlocks, p, in, true);
      check_budget(p, in, out, "kernel, small blocks");
      const ForwardOut m = step08::model_forward(p, in, s).out;
      FA_CHECK_CLOSE("O vs model", out.o, m.o, reorder(p.dtype), test::shape_o(p));
      FA_CHECK_CLOSE("L vs model", out.lse, m.lse, tol::kFp32Forward, test::shape_l(p));
      const ForwardOut def = gpu::forward(step08::kForward, p, in, true);
      FA_CHECK_CLOSE("O vs the default", out.o, def.o, reorder(p.dtype), test::shape_o(p));
    }
}

TEST_CASE("step08 kernel where chunks end inside units, and where whole units are cut: its model", "[gpu]") {
  // Production shares the 1016 tiles of 50 units among a wave of blocks (384 or 385 a
  // block: chunks that end inside units, rows with parts in several blocks) and cuts the
  // other shapes' units into chunks of their own.
  for (const Problem& p : {decode(1, 32, 1, 20000, 4, 128, false), decode(2, 8, 16, 3000, 8, 128, true),
                           decode(1, 8, 1, 3000, 1, 64, false), decode(1, 50, 1, 65000, 1, 128, false)}) {
    if (test::quick() && p.N_kv != 3000) continue;
    const step08::SplitPlan s = step08::device_plan(p);
    INFO(p.str() << ": " << cut(s));
    const Qkv in = inputs(p, 90);
    const ForwardOut out = gpu::forward(step08::kForward, p, in, true);
    check_budget(p, in, out, "kernel");
    const ForwardOut m = step08::model_forward(p, in, s).out;
    FA_CHECK_CLOSE("O vs model", out.o, m.o, reorder(p.dtype), test::shape_o(p));
    FA_CHECK_CLOSE("L vs model", out.lse, m.lse, tol::kFp32Forward, test::shape_l(p));
  }
}

namespace {
/// Shapes for the lesson rows against production at a fixed split count: grouped and
/// causal heads, keys that end inside a tile; on an H200 the 2 and 8 splits of the short
/// ones merge in clusters, 32 and 128 in the merge kernel launched early (its rows waiting
/// on their parts' tags), and 8192 keys × 128 heads, one split, fill the ring by TMA.
std::vector<Problem> fixed_split_shapes(int d) {
  return {decode(1, 15, 1, 2100, 1, d, false), decode(2, 8, 16, 3000, 8, d, true), decode(1, 4, 17, 1000, 2, d, true),
          decode(1, 32, 1, 20000, 4, d, false), decode(1, 128, 1, 8192, 1, d, false)};
}
}  // namespace

TEST_CASE("step08 lesson rows 2 and 4 at every fixed split count: production's results", "[gpu]") {
  // Row 4's kernels (lesson.cu: a ring of two tiles, the merge kernel after the splits)
  // compute what production computes; the ring's depth, TMA or cp.async, the L2 hint and
  // the early launch change when things happen, and the cluster's merge the order of the
  // statistics (check_close). One split is row 2.
  for (int d : kAllD)
    for (const Problem& p : fixed_split_shapes(d)) {
      if (test::quick() && p.N_kv > 3000) continue;
      const Qkv in = inputs(p, 96);
      for (int i = 0; i < step08::kFixedSplitCount; ++i) {
        const step08::SplitPlan s = step08::with_clusters(step08::fixed_plan(p, step08::kFixedSplits[i]),
                                                          step08::device_shape());
        INFO(p.str() << ": " << step08::kForwardFixed[i].name << " (" << cut(s) << ", clusters of " << s.cluster
                     << (step08::ring_by_tma(p, s, step08::device_shape()) ? ", by TMA" : "") << ")");
        const ForwardOut prod = gpu::forward(step08::kForwardFixed[i], p, in, true);
        if (i == 0) check_budget(p, in, prod, "kernel");
        check_close(p, gpu::forward(step08::kLessonStatsFirstFixed[i], p, in, true), prod, "row 4 vs production");
      }
      check_close(p, gpu::forward(step08::kLessonOneSplit, p, in, true),
                  gpu::forward(step08::kForwardFixed[0], p, in, true), "row 2 vs production's one split");
    }
}

TEST_CASE("step08 lesson rows 3 and 4 on their plan: the budget, and production as a GPU of 99 KiB blocks runs it",
          "[gpu]") {
  // Rows 3 and 4 cut whole units for a ring of two tiles (device_lesson_plan); production
  // takes the same plan as an RTX 30xx/40xx (kForwardSmallBlocks) unless it shares the
  // tiles. Row 4 gives its results there; row 3's fold adds the parts in another order.
  int same_plan = 0;
  for (int d : kAllD)
    for (const Problem& p : {decode(1, 32, 1, 20000, 4, d, false), decode(2, 8, 16, 3000, 8, d, true),
                             decode(1, 8, 1, 3000, 1, d, false), decode(1, 4, 17, 1000, 2, d, true)}) {
      if (test::quick() && p.N_kv > 3000) continue;
      const step08::SplitPlan s = step08::device_lesson_plan(p), prod_plan = step08::device_plan_small_blocks(p);
      INFO(p.str() << ": " << cut(s) << "; production " << cut(prod_plan));
      const Qkv in = inputs(p, 97);
      const ForwardOut fold = gpu::forward(step08::kLessonFold, p, in, true), row4 = gpu::forward(step08::kLessonStatsFirst, p, in, true);
      check_budget(p, in, fold, "row 3");
      check_budget(p, in, row4, "row 4");
      const ForwardOut m = step08::model_forward(p, in, s).out;
      FA_CHECK_CLOSE("O of row 4 vs model", row4.o, m.o, reorder(p.dtype), test::shape_o(p));
      FA_CHECK_CLOSE("O of row 3 vs row 4", fold.o, row4.o, reorder(p.dtype), test::shape_o(p));
      FA_CHECK_CLOSE("L of row 3 vs row 4", fold.lse, row4.lse, tol::kFp32Forward, test::shape_l(p));
      if (s.units == prod_plan.units && s.tiles == prod_plan.tiles && s.blocks == prod_plan.blocks) {
        ++same_plan;
        check_close(p, row4, gpu::forward(step08::kForwardSmallBlocks, p, in, true), "row 4 vs production");
      }
    }
  CHECK(same_plan > 0);
}

TEST_CASE("step08 merge kernel's tags: a second call in the same workspace waits for its own parts", "[gpu]") {
  // The tags an earlier call left in the workspace are not this call's: a second call on
  // other inputs in the same buffers must merge its own partials, not wait on (or pass
  // through) the first call's tags. Each call's output against a call in a fresh,
  // poisoned workspace.
  const Problem p = decode(1, 32, 1, 20000, 4, 128, false);
  REQUIRE(step08::device_plan(p).merge_kernel());
  DeviceBuffer<char> ws(step08::kForward.workspace_bytes(p));
  DeviceBuffer<std::uint16_t> o(p.elems());
  DeviceBuffer<float> lse(p.rows());
  for (std::uint64_t seed : {97, 98, 99}) {
    const Qkv in = inputs(p, seed);
    const DeviceBuffer<std::uint16_t> q = gpu::upload16(p.dtype, in.q), k = gpu::upload16(p.dtype, in.k),
                                      v = gpu::upload16(p.dtype, in.v);
    step08::kForward.run_native(p, NativeFwdArgs{q.get(), k.get(), v.get(), o.get(), lse.get()}, ws.get(), nullptr);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    INFO("seed " << seed);
    check_same_bits(p, {gpu::download16(p.dtype, o), lse.download()}, gpu::forward(step08::kForward, p, in, true),
                    "a call in a used workspace vs a fresh one");
  }
}

TEST_CASE("step08 plan merges in clusters where it can: the budget and its model", "[gpu]") {
  // On an H200 these plans merge at d = 128 in clusters of 8, 8, 4, 3 and 2 (15, 15, 30,
  // 39 and 66 units); at d = 64 (three blocks an SM, more chunks a unit) none does. That
  // the cluster's merge gives the merge kernel's bits: the lesson row 4 test above.
  int clustered = 0;
  for (int d : kAllD)
    for (const Problem& p : {decode(1, 15, 1, 9000, 1, d, false), decode(1, 120, 1, 5000, 8, d, false),
                             decode(1, 30, 1, 3000, 1, d, false), decode(1, 39, 16, 3000, 1, d, true),
                             decode(2, 33, 16, 2000, 1, d, true)}) {
      if (test::quick() && p.N_kv > 3000) continue;
      const step08::SplitPlan s = step08::device_plan(p);
      INFO(p.str() << ": " << cut(s) << ", clusters of " << s.cluster);
      const step08::GpuShape g = step08::device_shape();
      const long long S = s.blocks / s.units;
      if (S <= step08::kMaxCluster && g.clusters[S] >= s.units && !s.direct() && s.blocks % s.units == 0 &&
          s.tiles <= S * step08::kMaxClusterChunk)
        CHECK(s.cluster == S);  // where the GPU can and the chunks are short, the plan merges in clusters
      clustered += s.cluster > 1;
      const Qkv in = inputs(p, 92);
      const ForwardOut c = gpu::forward(step08::kForward, p, in, true);
      check_budget(p, in, c, "kernel");
      const ForwardOut m = step08::model_forward(p, in, s).out;
      FA_CHECK_CLOSE("O vs model", c.o, m.o, reorder(p.dtype), test::shape_o(p));
      FA_CHECK_CLOSE("L vs model", c.lse, m.lse, tol::kFp32Forward, test::shape_l(p));
    }
  // On a GPU with clusters (and code for it), some of these merged in clusters: the test
  // cannot pass by never taking the cluster's path.
  if (step08::device_shape().clusters[2] > 0) CHECK(clustered > 0);
}

namespace {
/// The shapes where the plan cuts oddly, at d = 128: a head of one tile and a piece (65
/// keys), chunks of an odd number of tiles (2100), keys that end inside a tile after a long
/// chunk (40001), two heads cut into long shared chunks (150000), chunks that end inside
/// units (20000 × 32 heads in groups of 4), causal grouped heads, pieces shorter than the
/// ring (200), a block a head of 128 tiles (8192 × 128 heads: on Hopper the ring filled by
/// TMA).
std::vector<Problem> plan_edges() {
  return {decode(1, 32, 1, 20000, 4, 128, false), decode(2, 8, 16, 3000, 8, 128, true),
          decode(1, 4, 1, 200, 4, 128, false),    decode(1, 1, 1, 65, 1, 128, false),
          decode(1, 128, 1, 8192, 1, 128, false), decode(1, 15, 1, 2100, 1, 128, false),
          decode(1, 12, 1, 40001, 1, 128, false), decode(1, 2, 1, 150000, 1, 128, false)};
}
}  // namespace

TEST_CASE("step08 production at d = 128 on the plan's edge cases: the error budget and its model", "[gpu]") {
  for (const Problem& p : plan_edges()) {
    if (test::quick() && p.N_kv > 3000) continue;
    const step08::SplitPlan s = step08::device_plan(p);
    INFO(p.str() << ": " << cut(s));
    const Qkv in = inputs(p, 94);
    const ForwardOut out = gpu::forward(step08::kForward, p, in, true);
    check_budget(p, in, out, "kernel");
    const ForwardOut m = step08::model_forward(p, in, s).out;
    FA_CHECK_CLOSE("O vs model", out.o, m.o, reorder(p.dtype), test::shape_o(p));
    FA_CHECK_CLOSE("L vs model", out.lse, m.lse, tol::kFp32Forward, test::shape_l(p));
  }
}

TEST_CASE("step08 kernel on self-attention, huge logits and many row blocks", "[gpu]") {
  // Self-attention (N_kv = N): every row block of the causal mask stops at its own tile.
  for (const Problem& p : {lowp(make(1, 2, 300, 128, true), DType::bf16), lowp(make(2, 1, 1000, 64, false), DType::fp16),
                           decode(1, 2, 128, 5000, 2, 128, true)}) {
    if (test::quick() && p.N != 300) continue;
    INFO(p.str());
    const Qkv in = inputs(p, 87);
    check_budget(p, in, gpu::forward(step08::kForward, p, in, true), "kernel");
  }
  // Logits in the thousands: the max subtraction in the warps, in the merge of the warps and in
  // the merge of the splits all keep e^x finite.
  Problem h = decode(1, 2, 16, 2000, 1, 64, true);
  h.scale = 400.0f;
  const Qkv in = inputs(h, 88);
  check_budget(h, in, gpu::forward(step08::kForwardFixed[3], h, in, true), "kernel, 32 splits, huge logits");
}

TEST_CASE("step08 kernel on a paged cache: shuffled pages give the contiguous cache's bits", "[gpu]") {
  // The same plan, the same tiles: only where each 16-key run is read from changes. Pages of
  // 48 and 80 positions put page ends inside tiles; the unused rows of the pool are NaN.
  // 8192 keys × 128 heads at d = 128, one split: the ring filled by TMA in pages of whole tiles
  // (64, 256), by cp.async in the others.
  struct Case {
    Problem p;
    int fixed;  // index into kForwardFixed, or −1: production's plan
  };
  std::vector<Case> cases = {{decode(2, 8, 16, 3000, 8, 128, true), -1}, {decode(1, 4, 17, 1000, 2, 64, true), -1},
                             {decode(1, 15, 1, 2100, 1, 128, false), 1},  {decode(1, 32, 1, 20000, 4, 64, false), -1},
                             {decode(2, 4, 3, 1000, 2, 128, false), 3},   {decode(1, 128, 1, 8192, 1, 128, false), 0}};
  if (test::quick()) cases.resize(2);
  for (const Case& c : cases)
    for (int page : {16, 48, 64, 80, 256}) {
      const GpuForward& step = c.fixed < 0 ? step08::kForward : step08::kForwardFixed[c.fixed];
      INFO(c.p.str() << ", pages of " << page << ", " << step.name);
      const Qkv in = inputs(c.p, 191);
      const PagedPools pg = paged(c.p, in, page, 2);
      check_same_bits(c.p, gpu::forward_paged(step, c.p, pg.pools, pg.kv), gpu::forward(step, c.p, in, true),
                      "paged vs contiguous");
    }
}

TEST_CASE("step08 kernel on a paged cache: sequences of different lengths, each as it runs alone", "[gpu]") {
  // One split: a sequence's unit is one block whose tiles stop at its own keys, so each
  // sequence gets the bits it gets alone. Production's plan: its model and the budget.
  const std::vector<int> lengths = {9000, 37, 300, 16, 4097};
  for (int d : kAllD)
    for (bool causal : {false, true}) {
      const Problem p = decode(int(lengths.size()), 4, 16, 9000, 2, d, causal);
      if (test::quick() && (causal || d == 64)) continue;
      const Qkv in = inputs(p, 193);
      for (int page : {32, 48}) {
        INFO(p.str() << ", pages of " << page);
        const PagedPools pg = paged(p, in, page, 1, lengths);
        const ForwardOut one = gpu::forward_paged(step08::kForwardFixed[0], p, pg.pools, pg.kv);
        const ForwardOut prod = gpu::forward_paged(step08::kForward, p, pg.pools, pg.kv);
        if (page == 32) {  // (the model takes seconds)
          const ForwardOut m = step08::model_forward_paged(p, pg.pools, pg.kv, step08::device_plan(p)).out;
          FA_CHECK_CLOSE("O vs model", prod.o, m.o, reorder(p.dtype), test::shape_o(p));
          FA_CHECK_CLOSE("L vs model", prod.lse, m.lse, tol::kFp32Forward, test::shape_l(p));
        }
        for (int b = 0; b < p.B; ++b) {
          const auto [alone, seq] = one_sequence(p, in, b, lengths[std::size_t(b)]);
          INFO("sequence " << b << ": " << alone.str());
          check_same_bits(alone, rows_of(p, one, b), gpu::forward(step08::kForwardFixed[0], alone, seq, true),
                          "one split, paged vs alone");
          check_budget(alone, seq, rows_of(p, prod, b), "production, paged");
        }
      }
    }
}

TEST_CASE("step08 split plan's occupancy is the occupancy calculator's", "[gpu]") {
  // blocks_per_sm() counts shared memory and threads; the GPU's occupancy calculator
  // counts registers too. The plan is right only if registers are not the limit.
  for (int d : kAllD) {
    INFO("d = " << d << " on " << gpu::describe_device());
    CHECK(step08::device_blocks_per_sm(d) ==
          step08::blocks_per_sm(d, {gpu::sm_count(), gpu::smem_per_sm(), gpu::smem_per_block()}));
  }
  // The clusters this GPU runs at once (kH200 holds one H200's: a cluster's SMs share a
  // GPC, and which SMs a GPC has left differs between chips).
  const step08::GpuShape g = step08::device_shape();
  std::string fits;
  for (int S = 2; S <= step08::kMaxCluster; ++S) fits += " " + std::to_string(S) + ": " + std::to_string(g.clusters[S]);
  WARN("clusters of S blocks at once on " << gpu::describe_device() << " (S: count):" << fits);
  if (gpu::compute_capability() >= 90 && gpu::device_code_arch() >= 90)
    for (int S = 2; S <= step08::kMaxCluster; ++S) CHECK(g.clusters[S] >= 1);
}
#endif
