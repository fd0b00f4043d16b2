// Tests of the flashattn program: runs on user .npy tensors, and the promise for
// bad input — one line on stderr, exit status 2, no output file created or changed.
#include <dirent.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/npy.hpp"
#include "reference/reference.hpp"
#include "steps/06_tensor_cores/step06.hpp"
#include "steps/07_hopper/step07.hpp"
#include "tests/check.hpp"
#include "tests/cli_run.hpp"
#include "tools/flashattn/steps_table.hpp"
#ifdef FA_HAVE_CUDA
#include "common/gpu.hpp"
#endif

using namespace fa;

namespace {

using test::exists;
using test::flashattn;
using test::Result;
using test::save;
using test::shell;

test::PrivateDir kPrivateDir("fa_cli");
const bool kInPrivateDir = kPrivateDir.ok;
/// The first whitespace-separated word of a file ("" if none).
std::string first_word(const std::string& path) {
  std::ifstream f(path);
  std::string w;
  f >> w;
  return w;
}
void remove_all(std::initializer_list<const char*> paths) {
  for (auto p : paths) std::remove(p);
}

/// Writes cli_q/k/v.npy for problem p (shape [B,H,N,d], or [N,d] when B = H = 1).
Qkv write_inputs(const Problem& p, std::uint64_t seed, bool two_d) {
  const Qkv in = random_qkv(p, seed);
  auto shape = [&](int heads, int rows) {
    return two_d ? std::vector<long long>{rows, p.d} : std::vector<long long>{p.B, heads, rows, p.d};
  };
  save("cli_q.npy", shape(p.H, p.N), in.q);
  save("cli_k.npy", shape(p.kv_heads_per_batch(), p.keys()), in.k);
  save("cli_v.npy", shape(p.kv_heads_per_batch(), p.keys()), in.v);
  return in;
}

const char* kIn = "--q cli_q.npy --k cli_k.npy --v cli_v.npy";

/// A command line and what its one-line error must say.
struct Case {
  std::string args;
  const char* says;
};

}  // namespace

TEST_CASE("flashattn run computes the reference on .npy tensors, 2-D and 4-D", "[cpu]") {
  REQUIRE(kInPrivateDir);
  for (bool two_d : {true, false}) {
    const Problem p = two_d ? test::make(1, 1, 19, 8, true) : test::make(2, 3, 11, 5, false);
    INFO(p.str());
    const Qkv in = write_inputs(p, 3, two_d);
    save("cli_do.npy", two_d ? std::vector<long long>{p.N, p.d} : std::vector<long long>{p.B, p.H, p.N, p.d},
         in.v);
    const Result r = flashattn(std::string("run --step reference ") + kIn +
                               " --out cli_o.npy --lse cli_l.npy --do cli_do.npy --dq cli_dq.npy --dk cli_dk.npy "
                               "--dv cli_dv.npy" + (p.causal ? " --causal" : ""));
    INFO(r.err);
    REQUIRE(r.status == 0);
    const ForwardOut ref = reference::forward(p, in);
    const NpyArray o = read_npy("cli_o.npy"), l = read_npy("cli_l.npy"), dq = read_npy("cli_dq.npy");
    CHECK(o.shape.size() == (two_d ? 2u : 4u));
    CHECK(l.shape.size() == (two_d ? 1u : 3u));
    FA_CHECK_CLOSE("O", o.data, ref.o, tol::kBitExact, test::shape_o(p));
    FA_CHECK_CLOSE("L", l.data, ref.lse, tol::kBitExact, test::shape_l(p));
    FA_CHECK_CLOSE("dQ", dq.data, reference::backward(p, in, in.v).dq, tol::kBitExact, test::shape_o(p));
  }
  remove_all({"cli_q.npy", "cli_k.npy", "cli_v.npy", "cli_do.npy", "cli_o.npy", "cli_l.npy", "cli_dq.npy",
              "cli_dk.npy", "cli_dv.npy"});
}

TEST_CASE("flashattn run takes fewer queries than keys and fewer K/V heads (the reference)", "[cpu]") {
  REQUIRE(kInPrivateDir);
  for (bool causal : {false, true})
    for (int hkv : {0, 1}) {  // one K/V head per query head, or one for all three
      Problem p = test::make(2, 3, 4, 8, causal);
      p.N_kv = 29;
      p.H_kv = hkv;
      INFO(p.str());
      const Qkv in = write_inputs(p, 9, false);
      const std::vector<float> dout = random_tensor(p.elems(), 10);
      save("cli_do.npy", {p.B, p.H, p.N, p.d}, dout);
      const Result r = flashattn(std::string("run --step reference ") + kIn +
                                 " --out cli_o.npy --lse cli_l.npy --do cli_do.npy --dq cli_dq.npy --dk cli_dk.npy "
                                 "--dv cli_dv.npy" + (causal ? " --causal" : ""));
      INFO(r.err);
      REQUIRE(r.status == 0);
      CHECK(test::contains(r.out, hkv ? "N=4 N_kv=29 H_kv=1" : "N=4 N_kv=29 d="));
      const ForwardOut ref = reference::forward(p, in);
      const Grads g = reference::backward(p, in, dout);
      const NpyArray o = read_npy("cli_o.npy"), dk = read_npy("cli_dk.npy");
      CHECK(o.shape == std::vector<long long>{p.B, p.H, p.N, p.d});
      CHECK(dk.shape == std::vector<long long>{p.B, p.kv_heads_per_batch(), p.keys(), p.d});
      Problem kv = p;
      kv.N = p.keys(), kv.N_kv = 0, kv.H = p.kv_heads_per_batch(), kv.H_kv = 0;  // K's shape, for the indices
      FA_CHECK_CLOSE("O", o.data, ref.o, tol::kBitExact, test::shape_o(p));
      FA_CHECK_CLOSE("L", read_npy("cli_l.npy").data, ref.lse, tol::kBitExact, test::shape_l(p));
      FA_CHECK_CLOSE("dQ", read_npy("cli_dq.npy").data, g.dq, tol::kBitExact, test::shape_o(p));
      FA_CHECK_CLOSE("dK", dk.data, g.dk, tol::kBitExact, test::shape_o(kv));
      FA_CHECK_CLOSE("dV", read_npy("cli_dv.npy").data, g.dv, tol::kBitExact, test::shape_o(kv));
    }
  // V must have K's shape; the causal mask needs at least as many keys as queries; K/V
  // heads must divide the query heads.
  remove_all({"cli_o.npy"});
  {
    save("cli_q3.npy", {1, 3, 4, 8}, random_tensor(96, 14));
    save("cli_k2.npy", {1, 2, 9, 8}, random_tensor(144, 15));
    const Result r = flashattn("run --step reference --q cli_q3.npy --k cli_k2.npy --v cli_k2.npy --out cli_o.npy");
    INFO(r.err);
    CHECK(r.status == 2);
    CHECK(test::contains(r.err, "H_kv (K/V heads) must divide H"));
    CHECK_FALSE(exists("cli_o.npy"));
    remove_all({"cli_q3.npy", "cli_k2.npy"});
  }
  Problem p = test::make(1, 1, 6, 8, false);
  p.N_kv = 9;
  write_inputs(p, 11, true);
  save("cli_v5.npy", {5, 8}, random_tensor(40, 12));
  save("cli_q12.npy", {12, 8}, random_tensor(96, 13));
  for (const Case& c : {Case{"run --step reference --q cli_q.npy --k cli_k.npy --v cli_v5.npy --out cli_o.npy",
                             "V has shape (5, 8) but K has (9, 8)"},
                        Case{"run --step reference --q cli_q12.npy --k cli_k.npy --v cli_v.npy --out cli_o.npy --causal",
                             "N_kv must be at least N"}}) {
    const Result r = flashattn(c.args);
    INFO(c.args << "\nstderr: " << r.err);
    CHECK(r.status == 2);
    CHECK(test::contains(r.err, c.says));
    CHECK_FALSE(exists("cli_o.npy"));
  }
  remove_all({"cli_q.npy", "cli_k.npy", "cli_v.npy", "cli_do.npy", "cli_o.npy", "cli_l.npy", "cli_dq.npy",
              "cli_dk.npy", "cli_dv.npy", "cli_v5.npy", "cli_q12.npy", "cli_out.txt", "cli_err.txt"});
}

TEST_CASE("flashattn rejects bad input with one line, status 2, and writes nothing", "[cpu]") {
  const Problem p = test::make(1, 1, 9, 4, false);
  const Qkv in = write_inputs(p, 4, true);
  save("cli_k8.npy", {p.N, 8}, random_tensor(p.N * 8, 1));
  save("cli_empty.npy", {0, 4}, {});
  std::vector<float> nan = in.q;
  nan[5] = std::nanf("");
  save("cli_nan.npy", {p.N, p.d}, nan);
  std::ofstream("cli_text.npy") << "not numpy";
  save("cli_k0.npy", {0, 4}, {});
  save("cli_q4.npy", {1, 2, p.N, p.d}, random_tensor(std::size_t(2) * p.N * p.d, 2));
  save("cli_h0.npy", {1, 0, p.N, p.d}, {});
  // An existing output file must survive a failed run untouched.
  std::ofstream("cli_keep.npy") << "precious";

  const Case cases[] = {
      {"run --step reference --q missing.npy --k cli_k.npy --v cli_v.npy --out cli_keep.npy", "cannot open"},
      {"run --step reference --q cli_text.npy --k cli_k.npy --v cli_v.npy --out cli_keep.npy", "not a .npy"},
      {"run --step reference --q cli_q.npy --k cli_k8.npy --v cli_v.npy --out cli_keep.npy", "Q's shape but for the number of keys"},
      {"run --step reference --q cli_empty.npy --k cli_empty.npy --v cli_empty.npy --out cli_keep.npy",
       "N must be at least 1"},
      {"run --step reference --q cli_nan.npy --k cli_k.npy --v cli_v.npy --out cli_keep.npy", "NaN"},
      {"run --step 42 --q cli_q.npy --k cli_k.npy --v cli_v.npy --out cli_keep.npy", "unknown step"},
      {"run --step 02 --q cli_q.npy --k cli_k.npy --v cli_v.npy --out cli_keep.npy --lse cli_l.npy", "no log-sum-exp"},
      {"run --step 03 --q cli_q.npy --k cli_k.npy --v cli_v.npy --out cli_keep.npy --do cli_q.npy --dq a --dk b --dv c",
       "has no backward"},
      {"run --step reference --q cli_q.npy --k cli_k.npy --v cli_v.npy --out cli_keep.npy --do cli_q.npy",
       "needs all of"},
      {"run --step reference --q cli_q.npy --k cli_k.npy --v cli_v.npy --out cli_keep.npy --scale -2",
       "finite positive"},
      {"run --step reference --q cli_q.npy --k cli_k.npy --v cli_v.npy", "missing --out"},
      {"frobnicate", "unknown command"},
      {"run --step reference --bogus 1", "unknown option"},
      // A forgotten value is not a file named "--causal"; an option given twice is not a guess.
      {"run --step reference --q cli_q.npy --k cli_k.npy --v cli_v.npy --out --causal",
       "option --out needs a value, not the option '--causal'"},
      {"run --step reference --q cli_q.npy --k cli_k.npy --v cli_v.npy --out cli_keep.npy --out cli_l.npy",
       "option --out is given twice"},
      {"run --step reference --q cli_q.npy --k cli_k.npy --v cli_v.npy --out cli_keep.npy --causal --causal",
       "option --causal is given twice"},
      {"tour --N 10 --N 20", "option --N is given twice"},
      // K or V without keys (N_kv = 0) or without heads: refused about K, before anything runs.
      {"run --step reference --q cli_q.npy --k cli_k0.npy --v cli_k0.npy --out cli_keep.npy",
       "cli_k0.npy: K has shape (0, 4): attention needs at least one key"},
      {"run --step reference --q cli_q4.npy --k cli_h0.npy --v cli_h0.npy --out cli_keep.npy",
       "cli_h0.npy: K has shape (1, 0, 9, 4): attention needs at least one key"},
  };
  for (const Case& c : cases) {
    INFO("flashattn " << c.args);
    const Result r = flashattn(c.args);
    INFO("stderr: " << r.err);
    CHECK(r.status == 2);
    CHECK(r.err.rfind("flashattn: error: ", 0) == 0);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(test::contains(r.err, c.says));
    CHECK(first_word("cli_keep.npy") == "precious");  // an existing file survives
    CHECK_FALSE(exists("cli_l.npy"));
    CHECK_FALSE(exists("--causal"));
  }
  remove_all({"cli_q.npy", "cli_k.npy", "cli_v.npy", "cli_k8.npy", "cli_empty.npy", "cli_nan.npy", "cli_text.npy",
              "cli_keep.npy", "cli_k0.npy", "cli_q4.npy", "cli_h0.npy", "cli_out.txt", "cli_err.txt"});
}

TEST_CASE("flashattn never loses or corrupts a file: colliding, odd and failing outputs", "[cpu]") {
  REQUIRE(kInPrivateDir);
  const Problem p = test::make(1, 1, 300, 64, false);
  write_inputs(p, 5, true);
  std::ofstream("cli_keep.npy") << "precious";
  ::mkdir("cli_dir", 0755);
  std::ofstream("cli_other.npy") << "other";
  REQUIRE(::symlink("cli_other.npy", "cli_link.npy") == 0);
  const std::string in = std::string("run --step reference ") + kIn;
  std::vector<Case> cases = {
      {in + " --out cli_keep.npy --lse cli_keep.npy", "named for two outputs"},
      {in + " --out cli_o.npy --lse ./cli_o.npy", "named for two outputs"},
      {in + " --out cli_o.npy --lse cli_dir", "is a directory"},
      {in + " --out cli_q.npy", "is an input"},
      {in + " --out cli_o.npy --do cli_q.npy --dq cli_dq.npy --dk cli_q.npy --dv cli_dv.npy", "is an input"},
      {in + " --out cli_link.npy", "symbolic link"},
      {in + " --out /dev/null", "not a regular file"},
      {in + " --out no_such_dir/cli_o.npy", "No such file or directory"},
      {in + " --out cli_keep.npy/x.npy", "is not a directory"},
  };
  if (exists("/dev/full")) cases.push_back({in + " --out /dev/full", "not a regular file"});
  // A file-size limit: the write fails with EFBIG half-way (SIGXFSZ is ignored while
  // writing), which is reported as such, and the existing target stays.
  cases.push_back({"ulimit -f 16; " + std::string(FA_FLASHATTN) + " " + in + " --out cli_keep.npy", "File too large"});
  for (const Case& c : cases) {
    INFO(c.args);
    const Result r = c.args.rfind("ulimit", 0) == 0 ? shell(c.args) : flashattn(c.args);
    INFO("stderr: " << r.err);
    CHECK(r.status == 2);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(test::contains(r.err, c.says));
    CHECK(first_word("cli_keep.npy") == "precious");  // an existing file survives
    CHECK_FALSE(exists("cli_o.npy"));
    CHECK_FALSE(exists("cli_dq.npy"));
    CHECK(read_npy("cli_q.npy").shape == std::vector<long long>{p.N, p.d});
    struct stat st{};
    CHECK((::lstat("cli_link.npy", &st) == 0 && S_ISLNK(st.st_mode)));
    CHECK((::stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode)));
    // No temporaries: every name here is one the test made.
    int hidden = 0;
    if (DIR* d = opendir(".")) {
      while (dirent* e = readdir(d)) hidden += e->d_name[0] == '.' && std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..");
      closedir(d);
    }
    CHECK(hidden == 0);
  }
  ::rmdir("cli_dir");
  remove_all({"cli_q.npy", "cli_k.npy", "cli_v.npy", "cli_keep.npy", "cli_other.npy", "cli_link.npy", "cli_out.txt",
              "cli_err.txt"});
}

TEST_CASE("flashattn refuses a FIFO as an input at once; writes a 250-character output name", "[cpu]") {
  REQUIRE(kInPrivateDir);
  const Problem p = test::make(1, 1, 17, 8, false);
  write_inputs(p, 8, true);
  REQUIRE(::mkfifo("cli_fifo.npy", 0644) == 0);
  // (timeout: a program that waited on the FIFO would be ended with status 124)
  for (const char* opt : {"--q", "--k", "--v"}) {
    std::string args = std::string("run --step reference ") + kIn + " --out cli_o.npy";
    const std::string was = std::string(opt) + " cli_" + (opt + 2) + ".npy";
    args.replace(args.find(was), was.size(), std::string(opt) + " cli_fifo.npy");
    INFO(args);
    const Result r = shell("timeout 20 " + std::string(FA_FLASHATTN) + " " + args);
    INFO("stderr: " << r.err);
    CHECK(r.status == 2);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(test::contains(r.err, "cli_fifo.npy: is a FIFO"));
    CHECK_FALSE(exists("cli_o.npy"));
  }
  const std::string name = std::string(246, 'o') + ".npy";
  const Result r = flashattn(std::string("run --step reference ") + kIn + " --out " + name + " --lse cli_l.npy");
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(read_npy(name).shape == std::vector<long long>{p.N, p.d});
  remove_all({"cli_q.npy", "cli_k.npy", "cli_v.npy", "cli_fifo.npy", "cli_l.npy", name.c_str(), "cli_out.txt",
              "cli_err.txt"});
}

TEST_CASE("flashattn: two runs writing the same outputs at once take turns (O and L from one run)", "[cpu]") {
  REQUIRE(kInPrivateDir);
  const Problem p = test::make(1, 2, 33, 16, false);
  const Qkv a = random_qkv(p, 21), b = random_qkv(p, 22);
  const std::vector<long long> sh = {p.B, p.H, p.N, p.d};
  save("cli_qa.npy", sh, a.q), save("cli_ka.npy", sh, a.k), save("cli_va.npy", sh, a.v);
  save("cli_qb.npy", sh, b.q), save("cli_kb.npy", sh, b.k), save("cli_vb.npy", sh, b.v);
  auto cmd = [](char x, const std::string& o, const std::string& l) {
    return std::string(FA_FLASHATTN) + " run --step reference --q cli_q" + x + ".npy --k cli_k" + x + ".npy --v cli_v" +
           x + ".npy --out " + o + " --lse " + l;
  };
  // Each run alone first: what its O and L are.
  REQUIRE(shell(cmd('a', "cli_oa.npy", "cli_la.npy")).status == 0);
  REQUIRE(shell(cmd('b', "cli_ob.npy", "cli_lb.npy")).status == 0);
  const std::string oa = test::slurp("cli_oa.npy"), la = test::slurp("cli_la.npy"), ob = test::slurp("cli_ob.npy"),
                    lb = test::slurp("cli_lb.npy");
  REQUIRE(oa != ob);
  int mixed = 0, failed = 0;
  for (int trial = 0; trial < 20; ++trial) {
    // A pause between O and L (the test hook) widens the window two unlocked runs would mix in.
    const Result r = shell("export FA_TEST_COMMIT_PAUSE_MS=" + std::to_string(trial % 4 * 5) + "; " +
                           cmd('a', "cli_o.npy", "cli_l.npy") + " & a=$!; " + cmd('b', "cli_o.npy", "cli_l.npy") +
                           " & b=$!; wait $a && wait $b");
    failed += r.status != 0;
    const std::string o = test::slurp("cli_o.npy"), l = test::slurp("cli_l.npy");
    mixed += !((o == oa && l == la) || (o == ob && l == lb));
  }
  CHECK(failed == 0);
  CHECK(mixed == 0);
  remove_all({"cli_qa.npy", "cli_ka.npy", "cli_va.npy", "cli_qb.npy", "cli_kb.npy", "cli_vb.npy", "cli_oa.npy",
              "cli_la.npy", "cli_ob.npy", "cli_lb.npy", "cli_o.npy", "cli_l.npy", "cli_out.txt", "cli_err.txt"});
}

TEST_CASE("flashattn reads what NumPy reads, refuses the rest before reading on, and checks results", "[cpu]") {
  REQUIRE(kInPrivateDir);
  const Problem p = test::make(1, 1, 17, 8, false);
  write_inputs(p, 6, true);
  auto raw_npy = [](const std::string& path, const std::string& shape, std::size_t floats) {
    test::write_file(path, test::npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }",
                                          std::string(4 * floats, '\0')));
  };
  // The element count wraps in 64 bits to 272: refused, not run on another shape.
  raw_npy("cli_wrap.npy", "(4611686018427387905, 2, 17, 8)", 272);
  // 2 GiB claimed by a 192-byte file: refused at once, without taking the memory.
  raw_npy("cli_claim.npy", "(1, 1, 32768, 16384)", 16);
  raw_npy("cli_k9.npy", "(17, 9)", 17 * 9);
  const Case cases[] = {
      {"run --step reference --q cli_wrap.npy --k cli_wrap.npy --v cli_wrap.npy --out cli_o.npy", "overflows 64 bits"},
      {"run --step reference --q cli_claim.npy --k cli_k.npy --v cli_v.npy --out cli_o.npy", "truncated"},
      // K is refused on its header, before V is even opened.
      {"run --step reference --q cli_q.npy --k cli_claim.npy --v missing.npy --out cli_o.npy", "truncated"},
      {"run --step reference --q cli_q.npy --k cli_k9.npy --v missing.npy --out cli_o.npy",
       "cli_k9.npy: K has shape (17, 9) but Q has (17, 8)"},
      {"run --step reference --q cli_q.npy --k cli_claim.npy --v cli_v.npy --out cli_o.npy", "cli_claim.npy: "},
      {"run --step reference --q cli_q.npy --k cli_k.npy --v missing.npy --out cli_o.npy", "missing.npy: cannot open"},
  };
  for (const Case& c : cases) {
    INFO(c.args);
    const Result r = flashattn(c.args);
    INFO("stderr: " << r.err);
    CHECK(r.status == 2);
    CHECK(test::contains(r.err, c.says));
    CHECK_FALSE(exists("cli_o.npy"));
  }
  // Memory stays near the files' real sizes (the largest child so far: well under the 2 GiB claimed).
  rusage usage{};
  getrusage(RUSAGE_CHILDREN, &usage);
  CHECK(usage.ru_maxrss < 512 * 1024);  // kilobytes

  // Finite inputs whose results do not fit float32: L = m + log ℓ with m = scale·q·k
  // ≈ 1e40 (the reference computes in fp64; the output type is float32). An error,
  // and nothing written.
  const std::vector<float> big(std::size_t(p.N) * p.d, 1e20f);
  save("cli_big.npy", {p.N, p.d}, big);
  const Result r = flashattn(
      "run --step reference --q cli_big.npy --k cli_big.npy --v cli_big.npy --out cli_o.npy --lse cli_l.npy");
  INFO(r.err);
  CHECK(r.status == 2);
  CHECK(test::contains(r.err, "L is Inf at [0]"));
  CHECK(test::contains(r.err, "nothing written"));
  CHECK_FALSE(exists("cli_o.npy"));
  CHECK_FALSE(exists("cli_l.npy"));
  remove_all({"cli_q.npy", "cli_k.npy", "cli_v.npy", "cli_wrap.npy", "cli_claim.npy", "cli_k9.npy", "cli_big.npy", "cli_out.txt",
              "cli_err.txt"});
}

TEST_CASE("flashattn refuses a GPU step when there is no GPU", "[cpu]") {
  std::string why = "built without CUDA";
#ifdef FA_HAVE_CUDA
  if (gpu::available(&why)) {
    SUCCEED("a GPU is present: the [gpu] test runs the GPU steps instead");
    return;
  }
#endif
  const Problem p = test::make(1, 1, 9, 4, false);
  write_inputs(p, 6, true);
  const Result r = flashattn(std::string("run --step 03 ") + kIn + " --out cli_o.npy");
  INFO(r.err);
  CHECK(r.status == 2);
  CHECK(test::contains(r.err, "GPU"));
  CHECK_FALSE(exists("cli_o.npy"));
  remove_all({"cli_q.npy", "cli_k.npy", "cli_v.npy", "cli_out.txt", "cli_err.txt"});
}

TEST_CASE("flashattn list and the tour run", "[cpu]") {
  CHECK(flashattn("list").status == 0);
  CHECK(flashattn("--help").status == 0);
  const Result r = flashattn("tour --N 70 --H 2 --d 24 --causal");
  INFO(r.err);
  CHECK(r.status == 0);
}

#ifdef FA_HAVE_CUDA
TEST_CASE("flashattn runs GPU steps 03 and 05 on .npy tensors", "[gpu]") {
  const Problem p = test::make(2, 2, 37, 24, true);
  const Qkv in = write_inputs(p, 5, false);
  save("cli_do.npy", {p.B, p.H, p.N, p.d}, in.q);
  Result r = flashattn(std::string("run --step 03 --causal ") + kIn + " --out cli_o.npy --lse cli_l.npy");
  INFO(r.err);
  REQUIRE(r.status == 0);
  const ForwardOut ref = reference::forward(p, in);
  FA_CHECK_CLOSE("O", read_npy("cli_o.npy").data, ref.o, tol::kFp32Forward, test::shape_o(p));
  FA_CHECK_CLOSE("L", read_npy("cli_l.npy").data, ref.lse, tol::kFp32Forward, test::shape_l(p));
  r = flashattn(std::string("run --step 05 --causal ") + kIn +
                " --out cli_o.npy --do cli_do.npy --dq cli_dq.npy --dk cli_dk.npy --dv cli_dv.npy");
  REQUIRE(r.status == 0);
  FA_CHECK_CLOSE("dK", read_npy("cli_dk.npy").data, reference::backward(p, in, in.q).dk, tol::kFp32Backward,
                 test::shape_o(p));
  remove_all({"cli_q.npy", "cli_k.npy", "cli_v.npy", "cli_do.npy", "cli_o.npy", "cli_l.npy", "cli_dq.npy",
              "cli_dk.npy", "cli_dv.npy", "cli_out.txt", "cli_err.txt"});
}

/// The files a 16-bit step's `flashattn run` wrote (cli_o, cli_dq, cli_dk, cli_dv.npy)
/// against the reference: errors of inputs, P and outputs rounded to 16 bits.
void check_lowp_files(const Problem& p, const ForwardOut& ref, const Grads& ref_g) {
  const Tolerance t{3e-2, 3e-2, "inputs, P and outputs rounded to 16 bits"};
  FA_CHECK_CLOSE("O", read_npy("cli_o.npy").data, ref.o, t, test::shape_o(p));
  FA_CHECK_CLOSE("dQ", read_npy("cli_dq.npy").data, ref_g.dq, t, test::shape_o(p));
  FA_CHECK_CLOSE("dK", read_npy("cli_dk.npy").data, ref_g.dk, t, test::shape_o(p));
  FA_CHECK_CLOSE("dV", read_npy("cli_dv.npy").data, ref_g.dv, t, test::shape_o(p));
}

TEST_CASE("flashattn runs step 06 in bf16 and fp16, forward and backward", "[gpu]") {
  const Problem p = test::make(1, 2, 37, 64, true);
  const Qkv in = write_inputs(p, 7, false);
  save("cli_do.npy", {p.B, p.H, p.N, p.d}, in.q);
  const ForwardOut ref = reference::forward(p, in);
  const Grads ref_g = reference::backward(p, in, in.q);
  // float32 files in, rounded to 16 bits on the way: errors of the 16-bit type.
  for (const char* dtype : {"bf16", "fp16"}) {
    INFO(dtype);
    const Result r = flashattn(std::string("run --step 06 --causal --dtype ") + dtype + " " + kIn +
                               " --out cli_o.npy --lse cli_l.npy --do cli_do.npy --dq cli_dq.npy --dk cli_dk.npy"
                               " --dv cli_dv.npy");
    INFO(r.err);
    if (!gpu::too_old(step06::kMinSm).empty()) {  // a GPU before sm_80: one line, nothing written
      CHECK(r.status == 2);
      CHECK(test::contains(r.err, "needs a GPU of compute capability 8.0"));
      CHECK(!exists("cli_o.npy"));
      continue;
    }
    REQUIRE(r.status == 0);
    check_lowp_files(p, ref, ref_g);
  }
  remove_all({"cli_q.npy", "cli_k.npy", "cli_v.npy", "cli_do.npy", "cli_o.npy", "cli_l.npy", "cli_dq.npy",
              "cli_dk.npy", "cli_dv.npy", "cli_out.txt", "cli_err.txt"});
}
TEST_CASE("flashattn runs step 08 on a decoding shape, 4 query heads a K/V head; 06's backward refuses it", "[gpu]") {
  Problem p = test::make(1, 8, 5, 128, true);
  p.N_kv = 300, p.H_kv = 2;
  const Qkv in = write_inputs(p, 9, false);
  save("cli_do.npy", {p.B, p.H, p.N, p.d}, in.q);
  const Result r = flashattn(std::string("run --step 08 --causal ") + kIn + " --out cli_o.npy --lse cli_l.npy");
  INFO(r.err);
  if (!gpu::too_old(step06::kMinSm).empty()) {
    CHECK(r.status == 2);
    CHECK(test::contains(r.err, "needs a GPU of compute capability 8.0"));
  } else {
    REQUIRE(r.status == 0);
    CHECK(test::contains(r.out, "N=5 N_kv=300 H_kv=2"));
    const Tolerance t{3e-2, 3e-2, "inputs, P and outputs rounded to 16 bits"};
    const ForwardOut ref = reference::forward(p, in);
    FA_CHECK_CLOSE("O", read_npy("cli_o.npy").data, ref.o, t, test::shape_o(p));
    FA_CHECK_CLOSE("L", read_npy("cli_l.npy").data, ref.lse, t, test::shape_l(p));
    remove_all({"cli_o.npy", "cli_l.npy"});
    const Result b = flashattn(std::string("run --step 06 --causal ") + kIn +
                               " --out cli_o.npy --do cli_do.npy --dq cli_dq.npy --dk cli_dk.npy --dv cli_dv.npy");
    INFO(b.err);
    CHECK(b.status == 2);
    CHECK(test::contains(b.err, "takes as many keys as queries"));
    CHECK_FALSE(exists("cli_o.npy"));

    // The same cache in shuffled pages of 32 through a block table, the sequence holding 200 of
    // its keys: the kernels' O on the paged cache, bit for bit.
    PagedKv kv;
    kv.page = 32, kv.pool = 12, kv.lengths = {200};
    for (int x = 0; x < kv.pages_per_seq(p); ++x) kv.table.push_back((5 * x + 7) % kv.pool);  // distinct pages
    const std::size_t pool = std::size_t(kv.pool) * p.H_kv * kv.page * p.d;
    Qkv pages{in.q, std::vector<float>(pool, 0.0f), std::vector<float>(pool, 0.0f)};
    for (int h = 0; h < p.H_kv; ++h)
      for (int key = 0; key < 200; ++key)
        for (int c = 0; c < p.d; ++c) {
          const std::size_t at =
              ((std::size_t(kv.table[std::size_t(key / kv.page)]) * p.H_kv + h) * kv.page + key % kv.page) * p.d + c;
          pages.k[at] = in.k[(std::size_t(h) * p.N_kv + key) * p.d + c];
          pages.v[at] = in.v[(std::size_t(h) * p.N_kv + key) * p.d + c];
        }
    save("cli_pk.npy", {kv.pool, p.H_kv, kv.page, p.d}, pages.k);
    save("cli_pv.npy", {kv.pool, p.H_kv, kv.page, p.d}, pages.v);
    test::save_ints("cli_t.npy", {1, (long long)kv.table.size()}, {kv.table.begin(), kv.table.end()});
    test::save_ints("cli_len.npy", {1}, {200});
    const Result pr = flashattn("run --step 08 --causal --q cli_q.npy --k cli_pk.npy --v cli_pv.npy --block-table "
                                "cli_t.npy --page 32 --kv-lengths cli_len.npy --out cli_o.npy");
    INFO(pr.err);
    REQUIRE(pr.status == 0);
    Problem pb = p;
    pb.dtype = DType::bf16;
    FA_CHECK_CLOSE("paged O (file) vs the kernel's", read_npy("cli_o.npy").data,
                   gpu::forward_paged(*find_kernels("08").gpu_forward, pb, pages, kv).o, tol::kBitExact, test::shape_o(p));
  }
  remove_all({"cli_q.npy", "cli_k.npy", "cli_v.npy", "cli_do.npy", "cli_o.npy", "cli_l.npy", "cli_out.txt",
              "cli_err.txt", "cli_pk.npy", "cli_pv.npy", "cli_t.npy", "cli_len.npy"});
}

TEST_CASE("flashattn runs step 07 in bf16, forward and backward, or refuses in one line", "[gpu]") {
  const Problem p = test::make(1, 2, 37, 128, true);
  const Qkv in = write_inputs(p, 8, false);
  save("cli_do.npy", {p.B, p.H, p.N, p.d}, in.q);
  const Result r = flashattn(std::string("run --step 07 --causal --dtype bf16 ") + kIn +
                             " --out cli_o.npy --lse cli_l.npy --do cli_do.npy --dq cli_dq.npy --dk cli_dk.npy"
                             " --dv cli_dv.npy");
  INFO(r.err);
  if (!gpu::too_old(step07::kSm, true).empty()) {  // not a Hopper GPU: one line, nothing written
    CHECK(r.status == 2);
    CHECK(test::contains(r.err, "needs a GPU of compute capability 9.0"));
    CHECK(!exists("cli_o.npy"));
  } else {
    REQUIRE(r.status == 0);
    check_lowp_files(p, reference::forward(p, in), reference::backward(p, in, in.q));
    // The same rows as a ragged batch of two sequences: the kernels' on the batch, bit for bit.
    const Result rr = flashattn(std::string("run --step 07 --causal --dtype bf16 --seqlens 17,20 ") + kIn +
                                " --out cli_o.npy --do cli_do.npy --dq cli_dq.npy --dk cli_dk.npy --dv cli_dv.npy");
    INFO(rr.err);
    REQUIRE(rr.status == 0);
    Problem pb = p;
    pb.dtype = DType::bf16;
    const std::vector<int> offsets = {0, 17, 37};
    const ForwardOut f = gpu::forward(step07::kForward, pb, in, offsets);
    FA_CHECK_CLOSE("ragged O (file) vs the kernel's", read_npy("cli_o.npy").data, f.o, tol::kBitExact,
                   test::shape_o(p));
    const Grads g = gpu::backward(step07::kBackwardDeterministic, pb, in, f, in.q, offsets);
    // dK: summed in registers in both modes (one K/V head a query head), the same bits.
    FA_CHECK_CLOSE("ragged dK (file) vs the deterministic kernel's", read_npy("cli_dk.npy").data, g.dk,
                   tol::kBitExact, test::shape_kv(p));
  }
  remove_all({"cli_q.npy", "cli_k.npy", "cli_v.npy", "cli_do.npy", "cli_o.npy", "cli_l.npy", "cli_dq.npy",
              "cli_dk.npy", "cli_dv.npy", "cli_out.txt", "cli_err.txt"});
}
#endif
