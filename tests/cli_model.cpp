// Tests of the flashattn program's no-GPU paths, run as a student would: `run --model`
// for every step (forward, and backward where the model has one), `trace` for steps 03,
// 04, 08 and 09, and `list`. Each result file must be what the step's model gives when
// called directly, bit for bit (the same model, the same writer).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/npy.hpp"
#include "reference/reference.hpp"
#include "tests/check.hpp"
#include "tests/cli_run.hpp"
#include "steps/07_hopper/step07.hpp"
#include "steps/08_split_kv/step08.hpp"
#include "tools/flashattn/steps_table.hpp"

using namespace fa;

namespace {

using test::exists;
using test::flashattn;
using test::Result;
using test::slurp;

test::PrivateDir kPrivateDir("fa_cli_model");

void save(const char* path, const Problem& p, const std::vector<float>& x) { test::save(path, {p.B, p.H, p.N, p.d}, x); }

const char* kIn = "--q q.npy --k k.npy --v v.npy";

/// Writes q, k, v (and do) .npy for p; returns the tensors.
Qkv write_inputs(const Problem& p, std::vector<float>* dout = nullptr) {
  const Qkv in = random_qkv(p, 7);
  save("q.npy", p, in.q), save("k.npy", p, in.k), save("v.npy", p, in.v);
  if (dout) *dout = random_tensor(p.elems(), 8), save("do.npy", p, *dout);
  return in;
}

}  // namespace

TEST_CASE("flashattn run --model: every step's model on .npy tensors, as the model gives it", "[cpu]") {
  REQUIRE(kPrivateDir.ok);
  Problem p = test::make(1, 2, 64, 64, true);
  std::vector<float> dout;
  const Qkv in = write_inputs(p, &dout);
  const ForwardOut ref = reference::forward(p, in);
  for (const StepEntry& s : step_table()) {
    if (s.id == "reference") continue;
    INFO("step " << s.id);
    const bool bwd = bool(s.model_backward);
    const Result r = flashattn("run --model --step " + s.id + " --causal " + kIn + " --out o.npy" +
                               (s.softmax ? " --lse l.npy" : "") +
                               (bwd ? " --do do.npy --dq dq.npy --dk dk.npy --dv dv.npy" : ""));
    INFO(r.err);
    REQUIRE(r.status == 0);
    CHECK(test::contains(r.out, "(CPU model)"));
    Problem ps = p;
    ps.dtype = s.dtype;
    const Qkv rounded = in;  // the CLI's inputs are float32: the model rounds them itself
    const ModelForward m = s.model_traced ? s.model_traced(ps, rounded, nullptr, 0) : s.model(ps, rounded);
    FA_CHECK_CLOSE("O (file) vs the model's", read_npy("o.npy").data, m.out.o, tol::kBitExact, test::shape_o(p));
    if (s.softmax) FA_CHECK_CLOSE("L (file) vs the model's", read_npy("l.npy").data, m.out.lse, tol::kBitExact, test::shape_l(p));
    // The fp32 steps are attention to fp32 accuracy (02: attention without softmax).
    if (s.dtype == DType::fp32)
      FA_CHECK_CLOSE("O (file) vs the reference", read_npy("o.npy").data,
                     s.softmax ? ref.o : reference::forward_nosoftmax(p, in), tol::kFp32NoSoftmax, test::shape_o(p));
    if (bwd) {
      const Grads g = s.model_backward(ps, in, m.out, dout).grads;
      FA_CHECK_CLOSE("dQ (file) vs the model's", read_npy("dq.npy").data, g.dq, tol::kBitExact, test::shape_o(p));
      FA_CHECK_CLOSE("dK (file) vs the model's", read_npy("dk.npy").data, g.dk, tol::kBitExact, test::shape_o(p));
      FA_CHECK_CLOSE("dV (file) vs the model's", read_npy("dv.npy").data, g.dv, tol::kBitExact, test::shape_o(p));
    }
    for (const char* f : {"o.npy", "l.npy", "dq.npy", "dk.npy", "dv.npy"}) std::remove(f);
  }
}

TEST_CASE("flashattn run --model --step 07: grouped K/V heads and a window, as the model gives them", "[cpu]") {
  REQUIRE(kPrivateDir.ok);
  Problem p = test::make(1, 4, 70, 64, true);
  p.H_kv = 2, p.window_left = 20, p.window_right = 0, p.dtype = DType::bf16;
  const Qkv in = random_qkv(p, 9);
  const std::vector<float> dout = random_tensor(p.elems(), 10);
  save("q.npy", p, in.q), save("do.npy", p, dout);
  test::save("k.npy", {1, 2, 70, 64}, in.k), test::save("v.npy", {1, 2, 70, 64}, in.v);
  const Result r = flashattn("run --model --step 07 --causal --window 20,-1 " + std::string(kIn) +
                             " --out o.npy --lse l.npy --do do.npy --dq dq.npy --dk dk.npy --dv dv.npy");
  INFO(r.err);
  REQUIRE(r.status == 0);
  const ModelForward m = find_step("07").model(p, in);
  const Grads g = find_step("07").model_backward(p, in, m.out, dout).grads;
  FA_CHECK_CLOSE("O (file) vs the model's", read_npy("o.npy").data, m.out.o, tol::kBitExact, test::shape_o(p));
  FA_CHECK_CLOSE("L (file) vs the model's", read_npy("l.npy").data, m.out.lse, tol::kBitExact, test::shape_l(p));
  FA_CHECK_CLOSE("dQ (file) vs the model's", read_npy("dq.npy").data, g.dq, tol::kBitExact, test::shape_o(p));
  FA_CHECK_CLOSE("dK (file) vs the model's", read_npy("dk.npy").data, g.dk, tol::kBitExact, test::shape_kv(p));
  FA_CHECK_CLOSE("dV (file) vs the model's", read_npy("dv.npy").data, g.dv, tol::kBitExact, test::shape_kv(p));
  CHECK(read_npy("dk.npy").shape == std::vector<long long>{1, 2, 70, 64});
  // A ragged batch: sequences of 30, 1 and 39 rows packed into the 70 (forward and backward).
  const Result rr = flashattn("run --model --step 07 --causal --seqlens 30,1,39 " + std::string(kIn) +
                              " --out o.npy --lse l.npy --do do.npy --dq dq.npy --dk dk.npy --dv dv.npy");
  INFO(rr.err);
  REQUIRE(rr.status == 0);
  Problem pr = p;
  pr.window_left = -1, pr.window_right = -1;
  const std::vector<int> offsets = {0, 30, 31, 70};
  const ModelForward mr = step07::model_forward_ragged(pr, in, offsets);
  const Grads gr = step07::model_backward_ragged(pr, in, mr.out, dout, offsets).grads;
  FA_CHECK_CLOSE("ragged O (file) vs the model's", read_npy("o.npy").data, mr.out.o, tol::kBitExact, test::shape_o(p));
  FA_CHECK_CLOSE("ragged L (file) vs the model's", read_npy("l.npy").data, mr.out.lse, tol::kBitExact, test::shape_l(p));
  FA_CHECK_CLOSE("ragged dK (file) vs the model's", read_npy("dk.npy").data, gr.dk, tol::kBitExact, test::shape_kv(p));
  for (const auto& [args, says] :
       {std::pair<std::string, const char*>{"--step 07 --seqlens 30,39", "the sum of --seqlens (69"},
        {"--step 07 --seqlens 30,0,40", "at least 1"},
        {"--step 06 --seqlens 70", "is step 07's: add --step 07"}}) {
    const Result bad = flashattn("run --model " + args + " " + std::string(kIn) + " --out x.npy");
    INFO(args << ": " << bad.err);
    CHECK(bad.status == 2);
    CHECK(test::contains(bad.err, says));
    CHECK_FALSE(exists("x.npy"));
  }
  // The same batch by its offsets (cu_seqlens, int32 and int64), and offsets a user gets wrong.
  for (bool wide : {false, true}) {
    test::save_ints("offs.npy", {4}, {0, 30, 31, 70}, wide);
    const Result ro = flashattn("run --model --step 07 --causal --offsets offs.npy " + std::string(kIn) + " --out o.npy");
    INFO(ro.err);
    REQUIRE(ro.status == 0);
    FA_CHECK_CLOSE("ragged O by --offsets", read_npy("o.npy").data, mr.out.o, tol::kBitExact, test::shape_o(p));
  }
  test::save("offs_f.npy", {4}, {0, 30, 31, 70});
  const std::pair<std::vector<long long>, const char*> bad_offsets[] = {
      {{0, 30, 30, 70}, "offset 2 (30) is not above offset 1 (30)"},
      {{1, 30, 70}, "the first offset is 1"},
      {{0, 30, 69}, "its last offset (69"},
      {{0}, "[sequences + 1]"},
  };
  for (const auto& [offs, says] : bad_offsets) {
    test::save_ints("bad.npy", {static_cast<long long>(offs.size())}, offs);
    const Result bad = flashattn("run --model --step 07 --offsets bad.npy " + std::string(kIn) + " --out x.npy");
    INFO(bad.err);
    CHECK(bad.status == 2);
    CHECK(test::contains(bad.err, says));
    CHECK((!bad.err.empty() && bad.err.find('\n') == bad.err.size() - 1));  // one line
    CHECK_FALSE(exists("x.npy"));
  }
  for (const auto& [args, says] :
       {std::pair<std::string, const char*>{"--offsets offs_f.npy", "indices must be integers"},
        {"--offsets offs.npy --seqlens 30,40", "not both"},
        {"--offsets offs.npy --out offs.npy", "is an input"}}) {  // an input is never an output
    const Result bad = flashattn("run --model --step 07 " + args + " " + std::string(kIn) +
                                 (test::contains(args, "--out") ? "" : " --out x.npy"));
    INFO(args << ": " << bad.err);
    CHECK(bad.status == 2);
    CHECK(test::contains(bad.err, says));
    CHECK_FALSE(exists("x.npy"));
  }
  CHECK(read_npy_ints("offs.npy").data == std::vector<long long>{0, 30, 31, 70});  // not overwritten
  for (const char* f : {"o.npy", "l.npy", "dq.npy", "dk.npy", "dv.npy", "k.npy", "v.npy", "do.npy", "q.npy", "offs.npy",
                        "offs_f.npy", "bad.npy"})
    std::remove(f);
}

TEST_CASE("flashattn run --model --step 08: a paged cache through a block table, as the model reads it", "[cpu]") {
  REQUIRE(kPrivateDir.ok);
  // Two sequences of 40 and 70 keys (not multiples of the page) in shuffled pages of 16, the
  // table one column wider than they need (a padded table's entries unread), grouped heads.
  Problem p = test::make(2, 4, 3, 64, true);
  p.H_kv = 2, p.N_kv = 70, p.dtype = DType::bf16;
  const int page = 16, width = 6, pool = 12;
  const std::vector<long long> lengths = {40, 70};
  const std::vector<long long> table = {7, 2, 9, -1, -1, -1, 0, 11, 4, 5, 1, -1};  // 3 and 5 pages used
  const std::vector<float> q = random_tensor(p.elems(), 11);
  const std::vector<float> kp = random_tensor(std::size_t(pool) * 2 * page * 64, 12);
  const std::vector<float> vp = random_tensor(kp.size(), 13);
  save("q.npy", p, q);
  test::save("k.npy", {pool, 2, page, 64}, kp), test::save("v.npy", {pool, 2, page, 64}, vp);
  test::save_ints("t.npy", {2, width}, table), test::save_ints("len.npy", {2}, lengths, true);
  const std::string paged = std::string(kIn) + " --block-table t.npy --page 16 --kv-lengths len.npy";
  const Result r = flashattn("run --model --step 08 --causal " + paged + " --out o.npy --lse l.npy");
  INFO(r.err);
  REQUIRE(r.status == 0);
  step08::PagedKv kv;
  kv.page = page, kv.pool = pool, kv.lengths = {40, 70};
  for (int b = 0; b < 2; ++b)
    for (int x = 0; x < 5; ++x) kv.table.push_back(int(table[std::size_t(b * width + x)]));
  const ModelForward m = step08::model_forward_paged(p, {q, kp, vp}, kv, h200_plan(p));
  FA_CHECK_CLOSE("paged O (file) vs the model's", read_npy("o.npy").data, m.out.o, tol::kBitExact, test::shape_o(p));
  FA_CHECK_CLOSE("paged L (file) vs the model's", read_npy("l.npy").data, m.out.lse, tol::kBitExact, test::shape_l(p));

  test::save_ints("t_far.npy", {2, width}, {7, 2, 12, -1, -1, -1, 0, 11, 4, 5, 1, -1});
  test::save_ints("t_short.npy", {1, width}, {7, 2, 9, 3, 4, 5});
  test::save_ints("len_short.npy", {2}, {2, 70});
  test::save_ints("len_long.npy", {2}, {40, 97});
  test::save_ints("len_one.npy", {1}, {40});
  test::save("t_f.npy", {2, width}, std::vector<float>(table.begin(), table.end()));
  const std::pair<std::string, const char*> bad[] = {
      {"--step 08 " + std::string(kIn) + " --block-table t_far.npy --page 16 --kv-lengths len.npy",
       "page table entry (0, 2) = 12 is not a page of the pool (0 … 11)"},
      {"--step 08 " + std::string(kIn) + " --block-table t.npy --page 24", "a multiple of 16"},
      {"--step 08 " + std::string(kIn) + " --block-table t_f.npy --page 16", "indices must be integers"},
      {"--step 08 " + std::string(kIn) + " --block-table t_short.npy --page 16", "Q has B = 2"},
      {"--step 08 " + std::string(kIn) + " --block-table t.npy --page 16 --kv-lengths len_short.npy",
       "its 3 queries are its last"},
      {"--step 08 " + std::string(kIn) + " --block-table t.npy --page 16 --kv-lengths len_long.npy", "1 to 96"},
      {"--step 08 " + std::string(kIn) + " --block-table t.npy --page 16 --kv-lengths len_one.npy", "[B] = [2]"},
      {"--step 08 " + std::string(kIn) + " --block-table t.npy", "--page P"},
      {"--step 07 " + std::string(kIn) + " --block-table t.npy --page 16", "is step 08's: add --step 08"},
      {"--step 08 " + std::string(kIn) + " --block-table t.npy --page 32", "a paged cache's pool is"},
      {"--step 08 " + std::string(kIn) + " --block-table t.npy --page 16 --lse t.npy", "is an input"},
      {"--step 08 " + std::string(kIn) + " --block-table t.npy --page 16 --kv-lengths len.npy --lse len.npy",
       "is an input"},
  };
  for (const auto& [args, says] : bad) {
    const Result b = flashattn("run --model " + args + " --out x.npy");
    INFO(args << ": " << b.err);
    CHECK(b.status == 2);
    CHECK(test::contains(b.err, says));
    CHECK((!b.err.empty() && b.err.find('\n') == b.err.size() - 1));  // one line
    CHECK_FALSE(exists("x.npy"));
  }
  CHECK(read_npy_ints("t.npy").data == table);  // an input named as an output is left alone
  // Without --kv-lengths every sequence holds its row's pages, W·P keys: a full table, padding unread past it.
  test::save_ints("t_full.npy", {2, 3}, {7, 2, 9, 0, 11, 4});
  const Result rf = flashattn("run --model --step 08 " + std::string(kIn) + " --block-table t_full.npy --page 16 --out o.npy");
  INFO(rf.err);
  REQUIRE(rf.status == 0);
  Problem pf = p;
  pf.N_kv = 48;
  step08::PagedKv full;
  full.page = page, full.pool = pool, full.table = {7, 2, 9, 0, 11, 4};
  pf.causal = false;
  FA_CHECK_CLOSE("paged O, full table (file) vs the model's", read_npy("o.npy").data,
                 step08::model_forward_paged(pf, {q, kp, vp}, full, h200_plan(pf)).out.o, tol::kBitExact,
                 test::shape_o(pf));
  for (const char* f : {"o.npy", "l.npy", "q.npy", "k.npy", "v.npy", "t.npy", "len.npy", "t_far.npy", "t_short.npy", "t_full.npy",
                        "len_short.npy", "len_long.npy", "len_one.npy", "t_f.npy"})
    std::remove(f);
}

TEST_CASE("flashattn run --model refuses what a model cannot do, in one line, writing nothing", "[cpu]") {
  REQUIRE(kPrivateDir.ok);
  const Problem p = test::make(1, 1, 17, 16, false);
  std::vector<float> dout;
  write_inputs(p, &dout);
  const std::string grads = " --do do.npy --dq dq.npy --dk dk.npy --dv dv.npy";
  const std::pair<std::string, const char*> cases[] = {
      {"run --model --step reference " + std::string(kIn) + " --out o.npy", "no CPU model"},
      {"run --model --step 03 " + std::string(kIn) + " --out o.npy" + grads, "has no backward"},
      {"run --model --step 03 --ranks 2 " + std::string(kIn) + " --out o.npy", "--ranks is step 09's"},
      {"run --step 09 " + std::string(kIn) + " --out o.npy", "--model"},
      {"run --model --step 09 --ranks 0 " + std::string(kIn) + " --out o.npy", "at least 1"},
      {"run --model --step 09 " + std::string(kIn) + " --out o.npy", "d = "},  // step 09 takes d = 64, 128, …
      {"run --model --step 06 --dtype fp32 " + std::string(kIn) + " --out o.npy", "bf16 or fp16"},
      {"list --model", "--model is an option of flashattn run"},
      {"run --model --step 07 --window 3 " + std::string(kIn) + " --out o.npy", "--window takes LEFT,RIGHT"},
      {"run --model --step 07 --window 3,x " + std::string(kIn) + " --out o.npy", "--window's right side"},
      {"run --model --step 07 --window -2,0 " + std::string(kIn) + " --out o.npy", "--window's left side"},
      {"run --model --step 07 --seqlens 17, " + std::string(kIn) + " --out o.npy", "--seqlens takes n1,n2"},
      {"run --model --step 06 --window 4,0 " + std::string(kIn) + " --out o.npy", "step06 takes no window"},
  };
  for (const auto& [args, says] : cases) {
    INFO("flashattn " << args);
    const Result r = flashattn(args);
    INFO(r.err);
    CHECK(r.status == 2);
    CHECK(test::contains(r.err, says));
    CHECK(r.err.find('\n') == r.err.size() - 1);  // one line
    CHECK_FALSE(exists("o.npy"));
    CHECK_FALSE(exists("dq.npy"));
  }
}

TEST_CASE("flashattn trace: one row's m, l and O block by block, from the models", "[cpu]") {
  REQUIRE(kPrivateDir.ok);
  const Problem p = test::make(1, 2, 100, 64, true);  // 4 K/V blocks of 32 keys, the last partial
  const Qkv in = write_inputs(p);
  const int row = 70;  // causal: blocks 0, 1, 2 (keys 0..70)
  const ForwardOut ref = reference::forward(p, in);
  auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    std::stringstream s(text);
    for (std::string l; std::getline(s, l);) out.push_back(l);
    return out;
  };
  auto field = [](const std::string& line, int k) {
    std::stringstream s(line);
    std::string f;
    for (int i = 0; i <= k; ++i) std::getline(s, f, ',');
    return f;
  };
  std::vector<std::string> m03;
  for (const char* step : {"03", "04"}) {
    INFO("step " << step);
    const Result r = flashattn(std::string("trace --step ") + step + " --causal " + kIn + " --row 70 --csv t.csv");
    INFO(r.err);
    REQUIRE(r.status == 0);
    CHECK(test::contains(r.out, "K/V block 2"));
    const std::vector<std::string> csv = lines(slurp("t.csv"));
    REQUIRE(csv.size() == 4);  // the header, then blocks 0, 1, 2
    CHECK(csv[0] == "step,event,stage,k0,k1,m,l,rescale,o0,o1,o2,o3");
    CHECK(field(csv[1], 7) == "0");  // the first block rescales nothing: e^(−∞ − m) = 0
    CHECK(field(csv[3], 4) == "96");  // block 2 brings keys 64..95 (the mask hides 71..95 from row 70)
    // After the last block, O / l is the row's output.
    for (int c = 0; c < 4; ++c) {
      INFO("column " << c);
      CHECK(std::fabs(std::stof(field(csv[3], 8 + c)) - ref.o[std::size_t(row) * p.d + c]) < 1e-5f);
    }
    // Step 04 does step 03's updates in the same order: the same states, digit for digit.
    for (std::size_t e = 1; e < csv.size(); ++e) {
      const std::string state = csv[e].substr(csv[e].find(',') + 1);
      if (m03.size() < csv.size() - 1) m03.push_back(state);
      else CHECK(state == m03[e - 1]);
    }
    std::remove("t.csv");
  }
  const Result r08 = flashattn(std::string("trace --step 08 --causal ") + kIn + " --row 70");
  INFO(r08.err);
  CHECK(r08.status == 0);
  CHECK(test::contains(r08.out, "split 0"));
  const Result r09 = flashattn(std::string("trace --step 09 --causal --ranks 2 ") + kIn + " --row 70");
  INFO(r09.err);
  CHECK(r09.status == 0);
  CHECK(test::contains(r09.out, "rank 1 step 1 (K/V of rank 0)"));  // row 70: chunk 2 of 4, rank 1's
  for (const std::string args : {"trace --step 05 --row 1", "trace --step 03 --row 100", "trace --step 03"}) {
    const Result bad = flashattn(args + " " + kIn);
    INFO(args << ": " << bad.err);
    CHECK(bad.status == 2);
  }
}

TEST_CASE("flashattn list says what runs here, and the tour says so without a GPU", "[cpu]") {
  REQUIRE(kPrivateDir.ok);
  const Result r = flashattn("list");
  CHECK(r.status == 0);
  CHECK(test::contains(r.out, "kernel"));
  CHECK(test::contains(r.out, "model"));
  CHECK(test::contains(r.out, "09         ring09  here"));
  CHECK(test::contains(r.out, "03         "));
#ifndef FA_HAVE_CUDA
  CHECK(test::contains(r.out, "no GPU found"));
  const Result t = flashattn("tour --N 64 --H 1 --d 64");
  INFO(t.err);
  CHECK(t.status == 0);
  CHECK(test::contains(t.out, "no GPU found"));
  CHECK(test::contains(t.out, "09 forward"));
  CHECK_FALSE(test::contains(t.out, "insufficient"));
#endif
}
