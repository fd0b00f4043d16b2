// Tests of libfa_capi (tools/bench/fa_capi.h), the C interface through which ab.py times
// the steps beside PyTorch: it refuses what a step refuses, in the step's own words,
// before anything runs; and a plan's launches write what the host wrappers' launches
// write, bit for bit, outputs poisoned first — so that a figure timed through it is the
// figure of the kernel the other tests check.
#include <string>
#include <vector>

#include "common/gpu.hpp"
#include "common/gpu16.cuh"
#include "steps/06_tensor_cores/step06.hpp"
#include "tests/check.hpp"
#include "tools/bench/fa_capi.h"
#include "tools/flashattn/steps_table.hpp"

using namespace fa;

namespace {

fa_shape shape_of(const Problem& p) {
  return {p.B, p.H, p.H_kv, p.N, p.N_kv, p.d, int(p.causal), int(p.dtype), p.scale.value_or(0.0f),
          int(p.windowed()), p.window_left, p.window_right, 0};
}

/// What fa_plan answers for step `step` at shape s: "" when it makes a plan, else its message.
std::string refusal(const char* step, bool backward, const fa_shape& s) {
  char err[512] = "";
  unsigned long long ws = 0;
  void* plan = fa_plan(step, backward, &s, &ws, err, int(sizeof err));
  if (plan) {
    fa_free_plan(plan);
    return "";
  }
  return err[0] ? err : "(a refusal with no message)";
}
std::string refusal(const char* step, bool backward, const Problem& p) { return refusal(step, backward, shape_of(p)); }

Problem bf16(Problem p) {
  p.dtype = DType::bf16;
  return p;
}

/// A plan and its workspace, freed at the end of the scope.
struct Planned {
  void* plan = nullptr;
  DeviceBuffer<char> ws;
  Planned(const char* step, bool backward, const fa_shape& s) {
    char err[512] = "";
    unsigned long long bytes = 0;
    plan = fa_plan(step, backward, &s, &bytes, err, int(sizeof err));
    INFO(err);
    REQUIRE(plan);
    ws = DeviceBuffer<char>(bytes);
  }
  Planned(const char* step, bool backward, const Problem& p) : Planned(step, backward, shape_of(p)) {}
  Planned(const Planned&) = delete;
  Planned& operator=(const Planned&) = delete;
  ~Planned() { fa_free_plan(plan); }
};

/// A forward call's tensors on the device: Q, K and V uploaded from `in`, O and L poisoned.
struct DeviceQkv {
  DeviceBuffer<std::uint16_t> q, k, v, o;
  DeviceBuffer<float> lse;
  DeviceQkv(const Problem& p, const Qkv& in)
      : q(gpu::upload16(p.dtype, in.q)), k(gpu::upload16(p.dtype, in.k)), v(gpu::upload16(p.dtype, in.v)),
        o(std::vector<std::uint16_t>(p.elems(), gpu::kPoison16)), lse(gpu::poisoned(p.rows())) {}
  ForwardOut download(const Problem& p) const { return {gpu::download16(p.dtype, o), lse.download()}; }
};

/// A backward call's gradients on the device, poisoned: dQ shaped as Q, dK and dV as K and V.
struct DeviceGrads {
  DeviceBuffer<std::uint16_t> dq, dk, dv;
  explicit DeviceGrads(const Problem& p)
      : dq(std::vector<std::uint16_t>(p.elems(), gpu::kPoison16)),
        dk(std::vector<std::uint16_t>(p.kv_elems(), gpu::kPoison16)),
        dv(std::vector<std::uint16_t>(p.kv_elems(), gpu::kPoison16)) {}
  Grads download(const Problem& p) const {
    return {gpu::download16(p.dtype, dq), gpu::download16(p.dtype, dk), gpu::download16(p.dtype, dv)};
  }
};

/// The forward of `step` at p through the C interface, on device tensors made from `in`.
ForwardOut forward_capi(const char* step, const Problem& p, const Qkv& in) {
  Planned pl(step, false, p);
  DeviceQkv t(p, in);
  char err[512] = "";
  const int rc = fa_forward(pl.plan, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), pl.ws.get(), nullptr,
                            err, int(sizeof err));
  INFO(err);
  REQUIRE(rc == 0);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  return t.download(p);
}

}  // namespace

TEST_CASE("capi: fa_plan refuses in the step's own words, before anything runs", "[cpu]") {
  const Problem p = bf16(test::make(1, 2, 64, 64, false));
  CHECK(test::contains(refusal("99", false, p), "unknown step '99'"));
  CHECK(test::contains(refusal("reference", false, p), "step reference has no GPU forward"));
  CHECK(test::contains(refusal("02", true, p), "step 02 has no GPU backward"));
  fa_shape odd = shape_of(p);
  odd.dtype = 7;
  CHECK(test::contains(refusal("07", false, odd), "dtype must be 0 (fp32), 1 (bf16) or 2 (fp16)"));
  Problem d = p;
  d.d = 100;
  CHECK(test::contains(refusal("07", false, d), "supports d = 64, 128, 256 (got d = 100)"));
  Problem decode = p;
  decode.N_kv = 1000;
  CHECK(test::contains(refusal("07", false, decode), "takes as many keys as queries"));
  // A version of a step's note table, by fa_bench --versions' id.
  CHECK(test::contains(refusal("07s9", false, p), "step 07 has no version '07s9' (its versions: 07h1, 07h2"));
  CHECK(test::contains(refusal("07h4", true, p), "step 07h4 has no GPU backward"));
  // A ragged batch: only step 07's forward takes one, packed (B = 1), in 16 bits.
  fa_shape ragged = shape_of(p);
  ragged.sequences = 3;
  CHECK(test::contains(refusal("06", false, ragged), "step 06 takes no ragged batch forward"));
  CHECK(test::contains(refusal("06", true, ragged), "step 06 takes no ragged batch backward"));
  ragged.B = 2;
  CHECK(test::contains(refusal("07", false, ragged), "a ragged batch is B = 1 and at least one sequence"));
  ragged.B = 1, ragged.sequences = -1;
  CHECK(test::contains(refusal("07", false, ragged), ", -1 sequences)"));
  Problem bad = p;
  bad.N = 0;
  CHECK(!refusal("06", false, bad).empty());
  std::string why;
  if (!gpu::available(&why)) {  // CI: the shape is fine, the machine has no GPU
    CHECK(test::contains(refusal("06", false, p), "needs a GPU"));
    CHECK(test::contains(refusal("08", false, p), "needs a GPU"));
  }
}

TEST_CASE("capi: a plan's forward writes what the host wrapper's forward writes, bit for bit", "[gpu]") {
  struct Case {
    const char* step;
    Problem p;
  };
  Problem grouped = bf16(test::make(1, 4, 16, 64, true));  // decoding: 16 queries against 1000 keys, 2 K/V heads
  grouped.N_kv = 1000, grouped.H_kv = 2;
  Problem fp16 = test::make(2, 3, 113, 64, false);
  fp16.dtype = DType::fp16;
  Problem scaled = bf16(test::make(1, 2, 113, 64, true));  // fa_shape.scale reaches the kernel
  scaled.scale = 0.3f;
  const std::vector<Case> cases = {{"06", bf16(test::make(2, 3, 113, 64, true))}, {"06", fp16}, {"06", scaled},
                                   {"07", bf16(test::make(2, 3, 113, 128, true))}, {"07", bf16(test::make(1, 2, 1000, 64, false))},
                                   {"07h4", bf16(test::make(2, 3, 113, 128, true))},
                                   {"08", grouped}, {"08", bf16(test::make(1, 2, 1, 128, false))}};
  for (const Case& c : cases) {
    const Problem& p = c.p;
    INFO("step " << c.step << ", " << p.str());
    const GpuForward& step = *find_kernels(c.step).gpu_forward;
    const std::string old = gpu::too_old(step.min_sm, step.exact_sm);
    if (!old.empty()) {  // this GPU cannot run it: the C interface says so, as the step does
      CHECK(test::contains(refusal(c.step, false, p), old));
      continue;
    }
    const Qkv in = random_qkv(p, 11);
    const ForwardOut want = gpu::forward(step, p, in, true);
    const ForwardOut got = forward_capi(c.step, p, in);
    FA_CHECK_CLOSE("O", got.o, want.o, tol::kBitExact, test::shape_o(p));
    FA_CHECK_CLOSE("L", got.lse, want.lse, tol::kBitExact, test::shape_l(p));
  }
}

TEST_CASE("capi: a ragged batch's forward and backward write what the host wrapper's write, bit for bit", "[gpu]") {
  const std::vector<int> offsets = {0, 1, 130, 147, 1000};
  const Problem p = bf16(test::make(1, 4, offsets.back(), 128, true));
  const GpuForward& step = *find_kernels("07").gpu_forward;
  if (!gpu::too_old(step.min_sm, step.exact_sm).empty()) return;  // the refusal: the test above
  const Qkv in = random_qkv(p, 12);
  const ForwardOut want = gpu::forward(step, p, in, offsets);
  fa_shape s = shape_of(p);
  s.sequences = int(offsets.size()) - 1;
  char err[512] = "";
  DeviceQkv t(p, in);
  DeviceBuffer<int> offs(offsets);
  {
    Planned pl("07", false, s);
    // fa_forward has no offsets to take: refused, and nothing launched.
    CHECK(fa_forward(pl.plan, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), pl.ws.get(), nullptr, err,
                     int(sizeof err)) == 1);
    CHECK(test::contains(err, "fa_forward_ragged"));
    REQUIRE(fa_forward_ragged(pl.plan, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), offs.get(),
                              pl.ws.get(), nullptr, err, int(sizeof err)) == 0);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
  }
  FA_CHECK_CLOSE("O", gpu::download16(p.dtype, t.o), want.o, tol::kBitExact, test::shape_o(p));
  FA_CHECK_CLOSE("L", t.lse.download(), want.lse, tol::kBitExact, test::shape_l(p));

  // The backward, in the deterministic mode (07det): dQ, dK, dV those of the host wrapper, bit for bit.
  const std::vector<float> dout_h = random_tensor(p.elems(), 13);
  const Grads want_g = gpu::backward(*find_kernels("07det").gpu_backward, p, in, want, dout_h, offsets);
  DeviceBuffer<std::uint16_t> dout = gpu::upload16(p.dtype, dout_h);
  DeviceGrads g(p);
  {
    Planned pl("07det", true, s);
    REQUIRE(fa_backward_ragged(pl.plan, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), dout.get(),
                               g.dq.get(), g.dk.get(), g.dv.get(), offs.get(), pl.ws.get(), nullptr, err,
                               int(sizeof err)) == 0);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
  }
  const Grads got = g.download(p);
  FA_CHECK_CLOSE("dQ", got.dq, want_g.dq, tol::kBitExact, test::shape_o(p));
  FA_CHECK_CLOSE("dK", got.dk, want_g.dk, tol::kBitExact, test::shape_kv(p));
  FA_CHECK_CLOSE("dV", got.dv, want_g.dv, tol::kBitExact, test::shape_kv(p));

  // Offsets the host wrapper refuses reach the kernels through the C interface unchecked: an
  // empty sequence is one, and an offset below an earlier one is taken as that one (the
  // tables stay within their workspace: the sanitizers' runs). Both give {0, 130, 1000}'s O.
  const ForwardOut two = gpu::forward(step, p, in, {0, 130, 1000});
  for (const std::vector<int>& odd : {std::vector<int>{0, 130, 130, 1000}, std::vector<int>{0, 130, 100, 1000}}) {
    INFO("offsets " << odd[1] << ", " << odd[2]);
    fa_shape so = s;
    so.sequences = 3;
    Planned pl("07", false, so);
    DeviceBuffer<int> odd_dev(odd);
    DeviceBuffer<std::uint16_t> o2(std::vector<std::uint16_t>(p.elems(), gpu::kPoison16));
    REQUIRE(fa_forward_ragged(pl.plan, t.q.get(), t.k.get(), t.v.get(), o2.get(), t.lse.get(), odd_dev.get(),
                              pl.ws.get(), nullptr, err, int(sizeof err)) == 0);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    FA_CHECK_CLOSE("O", gpu::download16(p.dtype, o2), two.o, tol::kBitExact, test::shape_o(p));
  }
}

TEST_CASE("capi: a paged cache's forward writes what the host wrapper's writes, bit for bit", "[gpu]") {
  Problem p = bf16(test::make(3, 4, 5, 128, true));
  p.H_kv = 2, p.N_kv = 700;
  PagedKv kv;
  kv.page = 48;  // (a page end inside a 64-key tile)
  kv.lengths = {700, 5, 333};
  const int width = kv.pages_per_seq(p);
  kv.pool = p.B * width + 1;
  for (int x = 0; x < p.B * width; ++x) kv.table.push_back((7 * x + 3) % kv.pool);  // 7 and 46 coprime: shuffled
  const std::size_t pool_elems = std::size_t(kv.pool) * p.kv_heads_per_batch() * kv.page * p.d;
  const Qkv in{random_tensor(p.elems(), 21), random_tensor(pool_elems, 22), random_tensor(pool_elems, 23)};
  const GpuForward& step = *find_kernels("08").gpu_forward;
  const ForwardOut want = gpu::forward_paged(step, p, in, kv);
  char err[512] = "";
  Planned pl("08", false, p);
  DeviceQkv t(p, in);
  DeviceBuffer<int> table(kv.table), lengths(kv.lengths);
  auto call = [&](const int* tab, int page) {
    return fa_forward_paged(pl.plan, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), tab, lengths.get(),
                            page, kv.pool, pl.ws.get(), nullptr, err, int(sizeof err));
  };
  CHECK(call(table.get(), 40) == 1);  // refused, and nothing launched
  CHECK(test::contains(err, "16 to 256 positions"));
  CHECK(call(nullptr, kv.page) == 1);
  CHECK(test::contains(err, "page table"));
  REQUIRE(call(table.get(), kv.page) == 0);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  FA_CHECK_CLOSE("O", gpu::download16(p.dtype, t.o), want.o, tol::kBitExact, test::shape_o(p));
  FA_CHECK_CLOSE("L", t.lse.download(), want.lse, tol::kBitExact, test::shape_l(p));

  // A page number outside the pool reaches the kernel unchecked: taken as the nearest page
  // (the pool's last), the same bits as the host wrapper's table with that page.
  std::vector<int> odd = kv.table;
  odd[1] = kv.pool + 5;
  PagedKv near = kv;
  near.table[1] = kv.pool - 1;
  const ForwardOut want_near = gpu::forward_paged(step, p, in, near);
  DeviceBuffer<int> odd_dev(odd);
  REQUIRE(call(odd_dev.get(), kv.page) == 0);
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  FA_CHECK_CLOSE("O, a page outside the pool", gpu::download16(p.dtype, t.o), want_near.o, tol::kBitExact,
                 test::shape_o(p));

  // A step that decodes from a contiguous cache only (06) refuses a paged one.
  Planned pl06("06", false, p);
  CHECK(fa_forward_paged(pl06.plan, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), table.get(), nullptr,
                         kv.page, kv.pool, pl06.ws.get(), nullptr, err, int(sizeof err)) == 1);
  CHECK(test::contains(err, "does not take a paged K/V cache"));
}

TEST_CASE("capi: a plan's backward writes what the host wrapper's backward writes", "[gpu]") {
  for (const char* id : {"06", "07"}) {
    const Problem p = bf16(test::make(1, 2, 113, 64, true));
    INFO("step " << id << ", " << p.str());
    const StepEntry& e = find_step(id);
    const std::string old = gpu::too_old(e.gpu_backward->min_sm, e.gpu_backward->exact_sm);
    if (!old.empty()) {
      CHECK(test::contains(refusal(id, true, p), old));
      continue;
    }
    const Qkv in = random_qkv(p, 12);
    const std::vector<float> dout = random_tensor(p.elems(), 13);
    const ForwardOut fwd = gpu::forward(*e.gpu_forward, p, in, true);
    const Grads want = gpu::backward(*e.gpu_backward, p, in, fwd, dout);

    Planned pl(id, true, p);
    const DType t = p.dtype;
    DeviceBuffer<std::uint16_t> q = gpu::upload16(t, in.q), k = gpu::upload16(t, in.k), v = gpu::upload16(t, in.v);
    DeviceBuffer<std::uint16_t> o = gpu::upload16(t, fwd.o), dO = gpu::upload16(t, dout);
    DeviceBuffer<float> lse(fwd.lse);
    DeviceGrads g(p);
    char err[512] = "";
    const int rc = fa_backward(pl.plan, q.get(), k.get(), v.get(), o.get(), lse.get(), dO.get(), g.dq.get(),
                               g.dk.get(), g.dv.get(), pl.ws.get(), nullptr, err, int(sizeof err));
    INFO(err);
    REQUIRE(rc == 0);
    FA_CUDA_CHECK(cudaDeviceSynchronize());
    // dK and dV are each one block's own sums: bit for bit. dQ's pieces are added in the
    // order the key blocks finish (note 07), so its last bits may differ from run to run.
    const Grads got = g.download(p);
    FA_CHECK_CLOSE("dK", got.dk, want.dk, tol::kBitExact, test::shape_kv(p));
    FA_CHECK_CLOSE("dV", got.dv, want.dv, tol::kBitExact, test::shape_kv(p));
    FA_CHECK_CLOSE("dQ", got.dq, want.dq, step06::kBf16Reorder, test::shape_o(p));
  }
}
