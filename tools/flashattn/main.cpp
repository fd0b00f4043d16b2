// flashattn: the course's front door.
//
//   flashattn [tour] [--N n] [--d d] [--B b] [--H h] [--causal]   every step on one problem, one table
//   flashattn run --step ID --q Q.npy --k K.npy --v V.npy --out O.npy [--lse L.npy]
//                 [--causal] [--scale S] [--do dO.npy --dq dQ.npy --dk dK.npy --dv dV.npy]
//   flashattn list                                                 the steps in this build
//   flashattn traffic [--N n] [--d d] [--causal] [--M m1,m2,…]     HBM traffic of steps 02–04 against M
//   flashattn --help
//
// Errors: one line on stderr, exit status 2, and no output file created or changed.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <new>
#include <sstream>

#include "common/cli.hpp"
#include "common/compare.hpp"
#include "common/npy.hpp"
#include "reference/reference.hpp"
#include "tools/flashattn/steps_table.hpp"
#include "steps/04_kv_outer/step04.hpp"
#include "steps/03_online_softmax/step03.hpp"
#include "steps/02_fused/step02.hpp"
#ifdef FA_HAVE_CUDA
#include "common/gpu.hpp"
#endif

namespace {

using namespace fa;

const char* kHelp = R"(flashattn — FlashAttention, step by step (see README.md and notes/)

Usage:
  flashattn [tour] [--B b] [--H h] [--N n] [--d d] [--causal] [--seed s]
      Runs every step on one problem and prints one table: what each step
      computes, its error against the fp64 reference, its time and its HBM
      traffic. Without a CUDA device the CPU model of each step runs instead.
  flashattn run --step ID --q Q.npy --k K.npy --v V.npy --out O.npy
                [--lse L.npy] [--causal] [--scale S] [--dtype bf16|fp16]
                [--do dO.npy --dq dQ.npy --dk dK.npy --dv dV.npy]
      Runs one step on your tensors (float32 or float64 .npy, C order, shape
      [N, d], [H, N, d] or [B, H, N, d]) and writes float32 results. With --do
      and the three gradient paths it also runs the step's backward. --dtype
      picks the 16-bit type of steps 06, 07 and 08 (default bf16); inputs are rounded to it.
      K and V may hold another number of rows than Q ([.., N_kv, d]: N queries
      against N_kv keys, the queries the last N positions) and fewer heads
      ([.., H_kv, N_kv, d], H_kv dividing H: grouped-query attention); the
      reference, step 06's forward and step 08 take that, the other steps
      self-attention only.
  flashattn list
      The steps in this build, which need a GPU, which have a backward.
  flashattn traffic [--N n] [--d d] [--causal] [--M m1,m2,...]
      The HBM traffic of steps 02-04 (their CPU models, counted) with blocks
      chosen from an on-chip budget of M elements, as CSV: the lecture's
      Theta(N^2 d^2 / M), and how far the counts follow it. No GPU needed.

Exit status: 0 on success, 2 on bad input (one line on stderr, nothing written).
)";

// The options (common/cli.hpp): unknown, repeated or value-less options are refused.
using cli::Args;
using cli::parse;

int to_int(const std::string& s, const std::string& what) {
  try {
    std::size_t used = 0;
    const long v = std::stol(s, &used);
    if (used == s.size() && v >= 0 && v <= 1 << 30) return int(v);
  } catch (...) {
  }
  throw Error(what + " must be a non-negative integer (got '" + printable(s, 40) + "')");
}

std::string fmt(double x, int prec = 3) {
  std::ostringstream s;
  s.precision(prec);
  s << x;
  return s.str();
}

bool have_gpu(std::string* why) {
#ifdef FA_HAVE_CUDA
  return gpu::available(why);
#else
  *why = "this build has no CUDA (nvcc was not found at configure time)";
  return false;
#endif
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- tour -----------------------------------------------------------------------
int tour(const Args& a) {
  std::string why;
  const bool gpu = have_gpu(&why);
  Problem p;
  p.B = a.kv.count("--B") ? to_int(a.kv.at("--B"), "--B") : 1;
  p.H = a.kv.count("--H") ? to_int(a.kv.at("--H"), "--H") : (gpu ? 4 : 2);
  p.N = a.kv.count("--N") ? to_int(a.kv.at("--N"), "--N") : (gpu ? 1024 : 256);
  p.d = a.kv.count("--d") ? to_int(a.kv.at("--d"), "--d") : 64;
  p.causal = a.causal;
  p.validate();
  const int seed = a.kv.count("--seed") ? to_int(a.kv.at("--seed"), "--seed") : 1;
  const Qkv in = random_qkv(p, std::uint64_t(seed));
  const std::vector<float> dout = random_tensor(p.elems(), std::uint64_t(seed) + 100);

  std::cout << "FlashAttention, step by step — the tour\n";
  std::cout << "problem: " << p.str() << ", inputs uniform in [-1, 1) from seed " << seed << "\n";
#ifdef FA_HAVE_CUDA
  if (gpu) std::cout << "GPU:     " << gpu::describe_device() << "\n";
#endif
  if (!gpu)
    std::cout << "GPU:     none (" << why << ")\n"
              << "         -> each GPU step's CPU model runs instead of its kernel: same algorithm, same tiles,\n"
              << "            counting HBM traffic; no GPU times.\n";

  const auto t0 = std::chrono::steady_clock::now();
  const ForwardOut ref = reference::forward(p, in);
  const double ref_s = seconds_since(t0);
  const std::vector<float> ref_ns = reference::forward_nosoftmax(p, in);
  const Grads ref_g = reference::backward(p, in, dout);

  std::printf("\n%-13s %-52s %-6s %11s %11s %12s %12s\n", "step", "computes", "ran on", "max |err|", "time ms",
              "HBM MB", "scratch MB");
  std::printf("%-13s %-52s %-6s %11s %11s %12s %12s\n", "reference", "CPU, Eigen, fp64 accumulation", "CPU", "0",
              fmt(ref_s * 1e3).c_str(), "-", "-");
  auto mb = [](double elems) { return fmt(elems * 4 / 1e6, 4); };
  for (const StepEntry& s : step_table()) {
    if (s.id == "reference") continue;
    Problem ps = p;  // a 16-bit step runs in its own type: its error includes the rounding
    ps.dtype = s.dtype;
    const double elem = s.dtype == DType::fp32 ? 1.0 : 0.5;  // mb() counts 4-byte elements
    // Forward row (step 05's forward is step 04's: only its backward row is shown).
    if (s.traffic_forward) {
      std::vector<float> o;
      std::string where = "model", time = "-", scratch = "-";
      try {
        if (gpu) {
          o = s.forward(ps, in).o;
          where = "GPU";
#ifdef FA_HAVE_CUDA
          time = fmt(gpu::time_forward(*s.gpu_forward, ps, 10).median_ms);
          scratch = mb(double(s.gpu_forward->workspace_bytes(ps)) / 4);
#endif
        } else {
          o = s.model(ps, in).out.o;
        }
      } catch (const Error& e) {  // e.g. a d that step 06 does not take
        std::printf("%-13s %-52s %s\n", (s.id + " forward").c_str(), s.what.c_str(), e.what());
        continue;
      }
      const auto r = compare(o, s.softmax ? ref.o : ref_ns, tol::kFp32Forward);
      std::printf("%-13s %-52s %-6s %11s %11s %12s %12s\n", (s.id + " forward").c_str(), s.what.c_str(), where.c_str(),
                  fmt(r.max_abs, 2).c_str(), time.c_str(), mb(elem * double(s.traffic_forward(ps).total())).c_str(),
                  scratch.c_str());
    }
    if (s.traffic_backward) {
      std::string where = "model", time = "-", scratch = "-";
      Grads g;
      try {
        if (gpu) {
          g = s.backward(ps, in, ref, dout);
          where = "GPU";
#ifdef FA_HAVE_CUDA
          time = fmt(gpu::time_backward(*s.gpu_backward, ps, 10).median_ms);
          scratch = mb(double(s.gpu_backward->workspace_bytes(ps)) / 4);
#endif
        } else {
          g = s.model_backward(ps, in, ref, dout).grads;
        }
      } catch (const Error& e) {
        std::printf("%-13s %-52s %s\n", (s.id + " backward").c_str(), "", e.what());
        continue;
      }
      double e = 0;
      for (auto [x, y] : {std::pair{&g.dq, &ref_g.dq}, {&g.dk, &ref_g.dk}, {&g.dv, &ref_g.dv}})
        e = std::max(e, compare(*x, *y, tol::kFp32Backward).max_abs);
      const std::string err = fmt(e, 2);
      std::printf("%-13s %-52s %-6s %11s %11s %12s %12s\n", (s.id + " backward").c_str(),
                  s.id == "01" ? "dQ, dK, dV with P, dP, dS in memory" : "dQ, dK, dV with P rebuilt on chip",
                  where.c_str(), err.c_str(), time.c_str(), mb(elem * double(s.traffic_backward(ps).total())).c_str(),
                  scratch.c_str());
    }
  }
  std::cout << "\nExercises, cut from the steps' own code and graded by their tests (tools/course/exercise.py\n"
               "list | start ID | reset ID; then ctest --test-dir build -R stepNN):\n";
  {
    std::stringstream ex(FA_EXERCISES);
    std::map<std::string, std::string> by_step;
    for (std::string id; ex >> id;) by_step[id.substr(0, 2)] += (by_step[id.substr(0, 2)].empty() ? "" : ", ") + id;
    for (const auto& [step, ids] : by_step) std::cout << "  step " << step << ": " << ids << "\n";
  }
  std::cout << "\nmax |err|: largest element-wise difference from the fp64 reference (step 02: from the\n"
               "reference's attention without softmax; steps 06-08: computed in bf16, so ~1e-3 is their rounding). HBM MB: elements each step reads and writes in device\n"
               "memory by its note's formula (= its CPU model's count), x 4 bytes. scratch MB: extra device memory.\n"
               "Next: the notes in notes/, `flashattn list`, `flashattn run --help`.\n";
  return 0;
}

// ---- list -------------------------------------------------------------------------
int list() {
  std::string why;
  const bool gpu = have_gpu(&why);
  std::printf("%-10s %-8s %-9s %-52s %s\n", "step", "needs", "backward", "computes", "note");
  for (const auto& s : step_table())
    std::printf("%-10s %-8s %-9s %-52s %s\n", s.id.c_str(), s.gpu ? "GPU" : "CPU", s.backward ? "yes" : "no",
                s.what.c_str(), s.note.c_str());
  std::cout << (gpu ? "A CUDA device is present: every step can run.\n"
                    : "No usable CUDA device (" + why + "): only the reference runs; the tour runs the CPU models.\n");
  return 0;
}

// ---- traffic against M ------------------------------------------------------------
int traffic(const Args& a) {
  Problem p;
  p.N = a.kv.count("--N") ? to_int(a.kv.at("--N"), "--N") : 1024;
  p.d = a.kv.count("--d") ? to_int(a.kv.at("--d"), "--d") : 64;
  p.causal = a.causal;
  p.validate();
  std::vector<std::size_t> Ms;
  std::stringstream list(a.kv.count("--M") ? a.kv.at("--M") : "1100,2200,4400,9300,18800");
  for (std::string m; std::getline(list, m, ',');) Ms.push_back(std::size_t(to_int(m, "--M")));
  const Qkv in = random_qkv(p, 1);
  std::printf("step,N,d,causal,M,br,bc,model_read,model_written,formula_total,n2d2_over_M\n");
  for (std::size_t M : Ms) {
    const tiles::Tiles t = tiles::tiles_for(M, p.d);
    step03::ModelOptions opt;
    opt.tiles = t;
    const int G = tiles::q_blocks(p.N, t.br);  // Algorithm 1: one group per head
    const std::pair<const char*, std::pair<Traffic, Traffic>> rows[] = {
        {"02", {step02::model_forward(p, in, t).traffic, step02::traffic_forward(p, t)}},
        {"03", {step03::model_forward(p, in, opt).traffic, step03::traffic_forward(p, t)}},
        {"04", {step04::model_forward(p, in, G, t).traffic, step04::traffic_forward(p, G, t)}},
    };
    const double bound = double(p.N) * p.N * p.d * p.d / double(M);
    for (const auto& [step, tr] : rows)
      std::printf("%s,%d,%d,%d,%zu,%d,%d,%llu,%llu,%llu,%.1f\n", step, p.N, p.d, int(p.causal), M, t.br, t.bc,
                  (unsigned long long)tr.first.read, (unsigned long long)tr.first.written,
                  (unsigned long long)tr.second.total(), bound);
  }
  return 0;
}

// ---- run --------------------------------------------------------------------------

/// An input's values must be finite and, for a 16-bit step, stay finite once rounded to its type.
void require_representable(const std::vector<float>& x, const std::vector<long long>& shape, DType t,
                           const std::string& what) {
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i]))
      throw Error(what + " holds " + (std::isnan(x[i]) ? "NaN" : "Inf") + " at " + Shape{shape}.index_of(i) +
                  ": attention needs finite inputs");
    if (t != DType::fp32 && !std::isfinite(round_to(t, x[i])))
      throw Error(what + " holds " + fmt(x[i], 4) + " at " + Shape{shape}.index_of(i) + ", which is Inf in " +
                  dtype_name(t) + " (largest finite value " + (t == DType::fp16 ? "65504" : "3.39e38") + ")");
  }
}

/// A result that does not fit float32 is an error, not a file: finite inputs can
/// still overflow inside (scale·q·k past 3.4e38, or a gradient past it).
void require_finite_result(const std::vector<float>& x, const std::vector<long long>& shape, const std::string& step,
                           const std::string& what) {
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!std::isfinite(x[i]))
      throw Error("step " + step + ": " + what + " is " + (std::isnan(x[i]) ? "NaN" : "Inf") + " at " +
                  Shape{shape}.index_of(i) +
                  " although the inputs are finite: their values overflow the arithmetic (the scores "
                  "scale·q·k, or the gradients, must stay well below 3.4e38); nothing written");
}

int run(const Args& a) {
  if (!a.kv.count("--step")) throw Error("missing --step (see flashattn list)");
  const StepEntry& s = find_step(a.kv.at("--step"));
  if (!a.kv.count("--out")) throw Error("missing --out O.npy");
  const bool want_bwd = a.kv.count("--do") || a.kv.count("--dq") || a.kv.count("--dk") || a.kv.count("--dv");
  if (want_bwd && !(a.kv.count("--do") && a.kv.count("--dq") && a.kv.count("--dk") && a.kv.count("--dv")))
    throw Error("the backward needs all of --do, --dq, --dk and --dv");
  if (want_bwd && !s.backward) throw Error("step " + s.id + " has no backward (steps with one: reference, 01, 05, 06, 07)");
  if (a.kv.count("--lse") && !s.softmax) throw Error("step " + s.id + " computes no softmax, so it has no log-sum-exp");
  if (s.gpu) {
    std::string why;
    if (!have_gpu(&why)) throw Error("step " + s.id + " runs on the GPU: " + why);
  }
  for (const char* opt : {"--q", "--k", "--v"})
    if (!a.kv.count(opt)) throw Error(std::string("missing ") + opt + " (the " + (opt + 2) + " tensor)");

  // Every path first: no output may be an input, a second output, a link, a
  // directory or a device — refused before anything is read or run.
  std::vector<std::string> inputs = {a.kv.at("--q"), a.kv.at("--k"), a.kv.at("--v")}, outputs = {a.kv.at("--out")};
  if (want_bwd) inputs.push_back(a.kv.at("--do"));
  if (a.kv.count("--lse")) outputs.push_back(a.kv.at("--lse"));
  if (want_bwd)
    for (const char* opt : {"--dq", "--dk", "--dv"}) outputs.push_back(a.kv.at(opt));
  check_output_paths(outputs, inputs);

  // Then the headers, one file at a time: a file is refused before the next is
  // opened, and before any data is read.
  // Q (and dO) is [.., N, d]; K and V are [.., N_kv, d], the same but for N_kv (decoding:
  // fewer queries than keys); a step that takes self-attention only says so below.
  const std::vector<std::pair<const char*, const char*>> tensors = {{"--q", "Q"}, {"--k", "K"}, {"--v", "V"}, {"--do", "dO"}};
  std::vector<long long> sh, kv_sh;
  for (const auto& [opt, name] : tensors) {
    if (!a.kv.count(opt)) continue;
    const std::string& path = a.kv.at(opt);
    const NpyHeader h = read_npy_header(path);
    const std::string who = name;
    if (sh.empty()) {
      if (h.shape.size() < 2 || h.shape.size() > 4)
        throw Error(printable(path, 200) + ": Q has shape " + shape_tuple(h.shape) +
                    "; it must have 2 to 4 dimensions: [N, d], [H, N, d] or [B, H, N, d]");
      for (long long x : h.shape)
        if (x > INT32_MAX)
          throw Error(printable(path, 200) + ": Q's shape " + shape_tuple(h.shape) + " has a dimension over 2^31 - 1");
      sh = h.shape;
    } else if (who == "K") {
      // All but the rows (N_kv may differ from N) and the heads (H_kv may divide H).
      std::vector<long long> k_dims = h.shape, q_dims = sh;
      const std::size_t n = q_dims.size();
      if (k_dims.size() == n) {
        k_dims[n - 2] = q_dims[n - 2] = 0;
        if (n >= 3) k_dims[n - 3] = q_dims[n - 3] = 0;
      }
      if (k_dims != q_dims)
        throw Error(printable(path, 200) + ": K has shape " + shape_tuple(h.shape) + " but Q has " + shape_tuple(sh) +
                    " (K and V must be Q's shape but for the number of keys and of heads: [.., H_kv, N_kv, d] for "
                    "Q's [.., H, N, d])");
      // No keys or no K/V heads (where Q has some): 0 would read as "as many as Q's".
      if ((h.shape[n - 2] == 0 && sh[n - 2] != 0) || (n >= 3 && h.shape[n - 3] == 0 && sh[n - 3] != 0))
        throw Error(printable(path, 200) + ": K has shape " + shape_tuple(h.shape) +
                    ": attention needs at least one key (N_kv >= 1) and one K/V head");
      kv_sh = h.shape;
    } else if (who == "V" && h.shape != kv_sh) {
      throw Error(printable(path, 200) + ": V has shape " + shape_tuple(h.shape) + " but K has " + shape_tuple(kv_sh) +
                  " (a value for every key)");
    } else if (who == "dO" && h.shape != sh) {
      throw Error(printable(path, 200) + ": dO has shape " + shape_tuple(h.shape) + " but Q has " + shape_tuple(sh) +
                  " (dO must have the shape of O, which is Q's)");
    }
  }
  Problem p;
  const std::size_t r = sh.size();
  p.B = r == 4 ? int(sh[0]) : 1;
  p.H = r >= 3 ? int(sh[r - 3]) : 1;
  p.N = int(sh[r - 2]);
  p.d = int(sh[r - 1]);
  if (kv_sh[r - 2] != sh[r - 2]) p.N_kv = int(kv_sh[r - 2]);
  if (r >= 3 && kv_sh[r - 3] != sh[r - 3]) p.H_kv = int(kv_sh[r - 3]);  // grouped-query attention
  p.causal = a.causal;
  p.dtype = s.dtype;
  if (a.kv.count("--dtype")) {
    p.dtype = parse_dtype(a.kv.at("--dtype"));
    if ((p.dtype == DType::fp32) != (s.dtype == DType::fp32))
      throw Error("step " + s.id + " computes in " + (s.dtype == DType::fp32 ? "fp32" : "bf16 or fp16") +
                  " (got --dtype " + a.kv.at("--dtype") + ")");
  }
  if (a.kv.count("--scale")) {
    const std::string& t = a.kv.at("--scale");
    char* end = nullptr;
    errno = 0;
    const float x = std::strtof(t.c_str(), &end);
    if (t.empty() || end != t.c_str() + t.size() || errno == ERANGE)
      throw Error("--scale must be a number (got '" + printable(t, 40) + "')");
    p.scale = x;
  }
  p.validate();

  // The data, each file checked as it arrives.
  auto load = [&](const char* opt, const char* name, const std::vector<long long>& shape) {
    NpyArray x = read_npy(a.kv.at(opt));
    if (x.shape != shape) throw Error(printable(a.kv.at(opt), 200) + ": changed while being read");
    require_representable(x.data, shape, p.dtype, printable(a.kv.at(opt), 200) + " (" + name + ")");
    return std::move(x.data);
  };
  Qkv in;
  in.q = load("--q", "Q", sh);
  in.k = load("--k", "K", kv_sh);
  in.v = load("--v", "V", kv_sh);
  std::vector<float> dO;
  if (want_bwd) dO = load("--do", "dO", sh);

  std::vector<long long> lshape(sh.begin(), sh.end() - 1);
  const ForwardOut out = s.forward(p, in);
  require_finite_result(out.o, sh, s.id, "O");
  if (s.softmax) require_finite_result(out.lse, lshape, s.id, "L");
  OutputFiles files;
  files.add(a.kv.at("--out"), sh, out.o);
  if (a.kv.count("--lse")) files.add(a.kv.at("--lse"), lshape, out.lse);
  if (want_bwd) {
    const Grads g = s.backward(p, in, out, dO);
    require_finite_result(g.dq, sh, s.id, "dQ");
    require_finite_result(g.dk, kv_sh, s.id, "dK");
    require_finite_result(g.dv, kv_sh, s.id, "dV");
    files.add(a.kv.at("--dq"), sh, g.dq);
    files.add(a.kv.at("--dk"), kv_sh, g.dk);
    files.add(a.kv.at("--dv"), kv_sh, g.dv);
  }
  files.commit(inputs);
  std::cout << "step " << s.id << ": " << p.str() << " -> " << printable(a.kv.at("--out"), 200)
            << (want_bwd ? " and gradients" : "") << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "tour";
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
      std::cout << kHelp;
      return 0;
    }
    const std::vector<std::string> tour_opts = {"--B", "--H", "--N", "--d", "--seed"};
    if (cmd == "tour") return tour(parse(argc, argv, 2, tour_opts));
    if (cmd.rfind("--", 0) == 0) return tour(parse(argc, argv, 1, tour_opts));
    if (cmd == "list") return list();
    if (cmd == "traffic") return traffic(parse(argc, argv, 2, {"--N", "--d", "--M"}));
    if (cmd == "run") {
      if (argc > 2 && (std::string(argv[2]) == "--help" || std::string(argv[2]) == "-h")) {
        std::cout << kHelp;
        return 0;
      }
      return run(parse(argc, argv, 2,
                       {"--step", "--q", "--k", "--v", "--out", "--lse", "--scale", "--dtype", "--do", "--dq", "--dk", "--dv"}));
    }
    throw Error("unknown command '" + printable(cmd, 40) + "' (commands: tour, run, list; see flashattn --help)");
  } catch (const std::bad_alloc&) {
    std::cerr << "flashattn: error: out of host memory (the tensors do not fit in this machine's memory)\n";
    return 2;
  } catch (const std::exception& e) {
    std::string line = e.what();  // one line, whatever a message quotes
    for (char& c : line)
      if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    std::cerr << "flashattn: error: " << line << "\n";
    return 2;
  }
}
