// Tests of the plumbing: .npy I/O, comparison, random inputs, problem checks,
// and (on a GPU) the host wrappers' error paths.
#include <cmath>
#include <cstdio>
#include <fstream>

#include "common/npy.hpp"
#include "tests/check.hpp"
#ifdef FA_HAVE_CUDA
#include "common/gpu.hpp"
#endif

using namespace fa;

namespace {
std::string tmp_path(const std::string& name) { return "fa_test_" + name; }
bool exists(const std::string& path) { return std::ifstream(path).good(); }
}  // namespace

TEST_CASE(".npy float32 round trip, 1-D to 4-D", "[cpu]") {
  for (std::vector<long long> shape : {std::vector<long long>{5}, {3, 4}, {2, 3, 4}, {2, 1, 3, 5}}) {
    std::size_t n = 1;
    for (auto s : shape) n *= std::size_t(s);
    const auto data = random_tensor(n, 1);
    OutputFiles out;
    out.add(tmp_path("rt.npy"), shape, data);
    out.commit();
    const NpyArray a = read_npy(tmp_path("rt.npy"));
    CHECK(a.shape == shape);
    CHECK(a.data == data);
  }
  std::remove(tmp_path("rt.npy").c_str());
}

TEST_CASE(".npy float64 is read and converted", "[cpu]") {
  std::string f = test::npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }");
  const double vals[4] = {1.5, -2.25, 3.0, 1e-3};
  f.append(reinterpret_cast<const char*>(vals), sizeof vals);
  test::write_file(tmp_path("f8.npy"), f);
  const NpyArray a = read_npy(tmp_path("f8.npy"));
  REQUIRE(a.data.size() == 4);
  CHECK(a.data[1] == -2.25f);
  CHECK(a.data[3] == float(1e-3));
  std::remove(tmp_path("f8.npy").c_str());
}

TEST_CASE(".npy errors name the file and the problem", "[cpu]") {
  auto message = [](const std::string& path) { return test::error_of([&] { read_npy(path); }); };
  CHECK(message("does_not_exist.npy").find("cannot open") != std::string::npos);
  test::write_file(tmp_path("text.npy"), "hello, not numpy");
  CHECK(message(tmp_path("text.npy")).find("not a .npy") != std::string::npos);
  test::write_file(tmp_path("i4.npy"), test::npy_file("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", std::string(8, '\0')));
  CHECK(message(tmp_path("i4.npy")).find("dtype '<i4'") != std::string::npos);
  test::write_file(tmp_path("fo.npy"), test::npy_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", std::string(16, '\0')));
  CHECK(message(tmp_path("fo.npy")).find("Fortran") != std::string::npos);
  test::write_file(tmp_path("short.npy"), test::npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 4), }", std::string(12, '\0')));
  CHECK(message(tmp_path("short.npy")).find("truncated") != std::string::npos);
  test::write_file(tmp_path("5d.npy"), test::npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 2), }", std::string(8, '\0')));
  CHECK(message(tmp_path("5d.npy")).find("dimensions") != std::string::npos);
  for (auto n : {"text", "i4", "fo", "short", "5d"}) std::remove(tmp_path(std::string(n) + ".npy").c_str());
}

TEST_CASE("output files are written all or nothing", "[cpu]") {
  OutputFiles out;
  out.add(tmp_path("good.npy"), {2}, {1.0f, 2.0f});
  out.add("no_such_directory/bad.npy", {2}, {1.0f, 2.0f});
  CHECK_THROWS_AS(out.commit(), Error);
  CHECK_FALSE(exists(tmp_path("good.npy")));
  CHECK_FALSE(exists(tmp_path("good.npy.partial")));
}

TEST_CASE("compare finds unwritten, NaN and out-of-tolerance elements with their indices", "[cpu]") {
  std::vector<float> want(24, 1.0f), got = want;
  got[5] = poison_value();
  got[7] = std::nanf("");
  got[11] = 1.1f;
  const auto r = compare(got, want, tol::kFp32Forward);
  CHECK_FALSE(r.ok());
  CHECK(r.unwritten == 1);
  CHECK(r.nan == 1);
  CHECK(r.bad == 1);
  const std::string rep = r.report("x", Shape{{1, 2, 3, 4}}, tol::kFp32Forward);
  INFO(rep);
  CHECK(rep.find("[0, 0, 1, 1]: got <unwritten>") != std::string::npos);
  CHECK(rep.find("[0, 0, 2, 3]") != std::string::npos);
  CHECK(compare(want, want, tol::kBitExact).ok());
}

TEST_CASE("random inputs are deterministic and in range", "[cpu]") {
  const auto a = random_tensor(1000, 5, 2.0f), b = random_tensor(1000, 5, 2.0f), c = random_tensor(1000, 6, 2.0f);
  CHECK(a == b);
  CHECK(a != c);
  for (float x : a) CHECK((x >= -2.0f && x < 2.0f));
}

TEST_CASE("problems and inputs are validated", "[cpu]") {
  Problem p;
  p.N = 0;
  CHECK_THROWS_AS(p.validate(), Error);
  p.N = 4;
  p.scale = -1.0f;
  CHECK_THROWS_AS(p.validate(), Error);
  p.scale.reset();
  CHECK_NOTHROW(p.validate());
  CHECK(p.softmax_scale() == 0.125f);
  // Fewer queries than keys: the queries are the last N positions.
  p.N_kv = 64;
  CHECK(p.keys() == 64);
  CHECK(p.kv_elems() == 64u * p.d);
  CHECK(p.str() == "B=1 H=1 N=4 N_kv=64 d=64 scale=0.125");
  CHECK(p.flops_forward() == 4.0 * 4 * 64 * 64);
  p.causal = true;
  CHECK(p.flops_forward() == 4.0 * (4 * 64 - 8) * 64);  // by the convention, N·N_kv − N²/2 pairs
  CHECK(test::contains(test::error_of([&] { p.validate_self_attention("step06 forward"); }),
                       "step06 forward takes as many keys as queries (got N = 4 queries, N_kv = 64 keys)"));
  p.N_kv = 2;
  CHECK(test::contains(test::error_of([&] { p.validate(); }), "N_kv must be at least N"));
  p.N_kv = -1;
  CHECK_THROWS_AS(p.validate(), Error);
  p.N_kv = 0;
  CHECK(p.keys() == p.N);
  CHECK_NOTHROW(p.validate_self_attention("step06 forward"));
  std::vector<float> x(4, 1.0f);
  x[2] = INFINITY;
  CHECK(test::error_of([&] { require_finite(x, "K"); }) == "K holds Inf at flat index 2: attention needs finite inputs");
}

#ifdef FA_HAVE_CUDA
namespace {
void writes_nothing(const Problem&, const FwdArgs&, void*, Stream) {}
std::size_t a_petabyte(const Problem&) { return std::size_t(1) << 50; }
}  // namespace

TEST_CASE("GPU wrappers: poisoned outputs, memory and size checks", "[gpu]") {
  const Problem p = test::make(1, 2, 17, 8, false);
  const Qkv in = random_qkv(p, 1);
  SECTION("an output the kernel never writes is reported as unwritten") {
    const GpuForward lazy{"lazy", 0, no_workspace, "", writes_nothing};
    const ForwardOut out = gpu::forward(lazy, p, in, true);
    const auto r = compare(out.o, std::vector<float>(p.elems(), 0.0f), tol::kFp32Forward);
    CHECK(r.unwritten == p.elems());
  }
  SECTION("a problem that does not fit is refused before anything is allocated") {
    const GpuForward greedy{"greedy", 0, a_petabyte, "a petabyte of scratch", writes_nothing};
    const std::string e = test::error_of([&] { gpu::forward(greedy, p, in, true); });
    INFO(e);
    CHECK((test::contains(e, "needs") && test::contains(e, "a petabyte of scratch") && test::contains(e, "free")));
  }
  SECTION("an unsupported d is refused") {
    const GpuForward small{"small", 4, no_workspace, "", writes_nothing};
    CHECK(test::contains(test::error_of([&] { gpu::forward(small, p, in, true); }), "up to d = 4"));
  }
  SECTION("a GPU older than the step's architecture is refused in one line") {
    // A step built for one compute capability past this GPU's: what step 06 (sm_80)
    // meets on a T4 (sm_75), reproduced on whatever GPU runs the test.
    const int newer = gpu::compute_capability() + 10;
    const GpuForward future{"future", 0, no_workspace, "", writes_nothing, nullptr, nullptr, newer};
    const std::string e = test::error_of([&] { gpu::forward(future, p, in, true); });
    INFO(e);
    CHECK(test::contains(e, "future needs a GPU of compute capability " + std::to_string(newer / 10) + "."));
    CHECK(test::contains(e, "sm_" + std::to_string(gpu::compute_capability())));
    CHECK(e.find('\n') == std::string::npos);
    CHECK(gpu::too_old(gpu::compute_capability()).empty());
  }
}
#endif
