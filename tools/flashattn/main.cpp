// flashattn: the course's front door.
//
//   flashattn [tour] [--N n] [--d d] [--B b] [--H h] [--causal]   every step on one problem, one table
//   flashattn run --step ID [--model] --q Q.npy --k K.npy --v V.npy --out O.npy [--lse L.npy]
//                 [--causal] [--scale S] [--do dO.npy --dq dQ.npy --dk dK.npy --dv dV.npy]
//   flashattn trace --step 03|04|08|09 --q Q.npy --k K.npy --v V.npy --row R [--csv FILE]
//                                                                  one row's online softmax, block by block
//   flashattn list                                                 the steps, and what of each runs here
//   flashattn traffic [--N n1,n2,…] [--d d] [--causal] [--M m1,m2,…]  HBM traffic of steps 01–04 against N and M
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
#include <cstring>
#include <iostream>
#include <map>
#include <new>
#include <optional>
#include <sstream>
#include <type_traits>

#include "common/cli.hpp"
#include "common/compare.hpp"
#include "common/npy.hpp"
#include "reference/reference.hpp"
#include "tools/flashattn/steps_table.hpp"
#include "steps/04_kv_outer/step04.hpp"
#include "steps/03_online_softmax/step03.hpp"
#include "steps/02_fused/step02.hpp"
#include "steps/01_naive/step01.hpp"
#include "steps/07_hopper/step07.hpp"
#include "steps/08_split_kv/step08.hpp"
#include "common/gpu.hpp"  // declarations only: a build without CUDA never calls them (on_kernels)

namespace {

using namespace fa;

const char* kHelp = R"(flashattn — FlashAttention, step by step (see README.md and notes/)

Usage:
  flashattn [tour] [--B b] [--H h] [--N n] [--d d] [--causal] [--seed s]
      Runs every step on one problem and prints one table: what each step
      computes, its error against the fp64 reference, its time and its HBM
      traffic. Without a CUDA device the CPU model of each step runs instead.
  flashattn run --step ID [--model] --q Q.npy --k K.npy --v V.npy --out O.npy
                [--lse L.npy] [--causal] [--scale S] [--dtype bf16|fp16] [--ranks n]
                [--window LEFT,RIGHT] [--seqlens n1,n2,... | --offsets OFFS.npy]
                [--block-table T.npy --page P [--kv-lengths L.npy]]
                [--do dO.npy --dq dQ.npy --dk dK.npy --dv dV.npy]
      Runs one step on your tensors (float32 or float64 .npy, C order, shape
      [N, d], [H, N, d] or [B, H, N, d]) and writes float32 results. With --do
      and the three gradient paths it also runs the step's backward. --model
      runs the step's CPU model instead of its kernel (no GPU needed; the
      backward too for steps 01, 05, 06, 07; step 09: --ranks n simulated ranks). --dtype
      picks the 16-bit type of steps 06, 07 and 08 (default bf16); inputs are rounded to it.
      K and V may hold another number of rows than Q ([.., N_kv, d]: N queries
      against N_kv keys, the queries the last N positions) and fewer heads
      ([.., H_kv, N_kv, d], H_kv dividing H: grouped-query attention); the
      reference, step 06's forward and step 08 take that, step 07's model the
      grouped heads, the other steps self-attention only. --window LEFT,RIGHT
      (FlashAttention's window_size; -1 leaves a side open): the query at
      position t sees keys t-LEFT..t+RIGHT only (the reference and step 07's model).
      --seqlens n1,n2,... (step 07, its kernels or its model): a ragged batch, sequences of those
      lengths packed one after another in Q, K, V [H, T, d], T their sum;
      attention (and the mask, and the window) stays inside each sequence.
      --offsets OFFS.npy: the same batch by its offsets (cu_seqlens: int32 or
      int64, 0 first, increasing, T last). --block-table T.npy --page P (step
      08, its kernels or its model): K and V are a paged cache, pools [pages, H_kv, P, d] (P from
      16 to 256, a multiple of 16); sequence b's keys P*x .. P*x+P-1 lie in page
      T[b, x] (T: int32 or int64, [B, W]); --kv-lengths L.npy (int, [B]) the keys
      each sequence holds (default W*P), its N queries the last N of them.
  flashattn trace --step 03|04|08|09 --q Q.npy --k K.npy --v V.npy --row R
                  [--causal] [--csv FILE]
      One query row's online softmax as the step's CPU model computes it: m, l,
      the rescale factor and the first columns of O after each K/V block (08: the
      splits and their merge; 09: the ranks). See flashattn trace --help.
  flashattn list
      The steps: whether the kernel, the CPU model or both can run here, and
      which have a backward.
  flashattn traffic [--N n1,n2,...] [--d d] [--causal] [--M m1,m2,...]
      The HBM traffic of steps 01-04 (their CPU models, counted; 02-04 with
      blocks chosen from an on-chip budget of M elements) as CSV: the lecture's
      Theta(N^2 d^2 / M), and how far the counts follow it. No GPU needed
      (tools/course/plot_traffic.py draws it).

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

/// Whether a CUDA device can run the kernels; if not, `why` says so in plain words.
bool have_gpu(std::string* why) {
#ifdef FA_HAVE_CUDA
  std::string detail;
  if (gpu::available(&detail)) return true;
  // CUDA's own words for "there is none" (no driver: "CUDA driver version is insufficient…").
  const bool none = detail.find("insufficient") != std::string::npos || detail.find("no CUDA") != std::string::npos ||
                    detail.find("no CUDA-capable") != std::string::npos;
  *why = none ? "no GPU found (no NVIDIA GPU or driver on this machine)" : "no usable GPU (" + detail + ")";
#else
  *why = "no GPU found (this build has no CUDA: the cpu preset, or no nvcc at configure time)";
#endif
  return false;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Step s's CPU model on p (step 09: `ranks` simulated ranks, 0 for its default), reporting
/// to `trace` where the step takes one.
ModelForward run_model(const StepEntry& s, const Problem& p, const Qkv& in, online::Trace* trace = nullptr,
                       int ranks = 0) {
  if (s.model_traced) return s.model_traced(p, in, trace, ranks);
  if (!s.model) throw Error("step " + s.id + " has no CPU model (the reference is computed on the CPU already)");
  return s.model(p, in);
}

/// Whether step s can run here: its kernel, its model.
std::string kernel_here(const StepEntry& s, bool gpu) {
  if (!s.kernel_elsewhere.empty()) return "ring09";
  if (!s.gpu) return "CPU";
  return gpu ? "here" : "GPU";
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
    std::cout << "GPU:     " << why << ".\n"
              << "         Each step's CPU model runs instead of its kernel: the same algorithm and tiles,\n"
              << "         counting HBM traffic; its time is the model's on this CPU, not a GPU's.\n";

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
    const bool on_gpu = gpu && s.forward && s.gpu;
    // Forward row (step 05's forward is step 04's: only its backward row is shown).
    if (s.traffic_forward || !s.traffic_backward) {
      std::vector<float> o;
      std::string where = "model", time = "-", scratch = "-", name = s.id + " forward";
      try {
        if (on_gpu) {
          o = s.forward(ps, in).o;
          where = "GPU";
#ifdef FA_HAVE_CUDA
          time = fmt(gpu::time_forward(*s.gpu_forward, ps, 10).median_ms);
          scratch = mb(double(s.gpu_forward->workspace_bytes(ps)) / 4);
#endif
        } else {
          const auto t = std::chrono::steady_clock::now();
          o = run_model(s, ps, in).out.o;
          time = fmt(seconds_since(t) * 1e3);
        }
      } catch (const Error& e) {  // e.g. a d that step 06 does not take
        std::printf("%-13s %-52s %s\n", name.c_str(), s.what.c_str(), e.what());
        continue;
      }
      const auto r = compare(o, s.softmax ? ref.o : ref_ns, tol::kFp32Forward);
      const std::string hbm = s.traffic_forward ? mb(elem * double(s.traffic_forward(ps).total())) : "-";
      std::printf("%-13s %-52s %-6s %11s %11s %12s %12s\n", name.c_str(), s.what.c_str(), where.c_str(),
                  fmt(r.max_abs, 2).c_str(), time.c_str(), hbm.c_str(), scratch.c_str());
    }
    if (s.traffic_backward) {
      std::string where = "model", time = "-", scratch = "-";
      Grads g;
      try {
        if (on_gpu && s.backward) {
          g = s.backward(ps, in, ref, dout);
          where = "GPU";
#ifdef FA_HAVE_CUDA
          time = fmt(gpu::time_backward(*s.gpu_backward, ps, 10).median_ms);
          scratch = mb(double(s.gpu_backward->workspace_bytes(ps)) / 4);
#endif
        } else {
          const auto t = std::chrono::steady_clock::now();
          g = s.model_backward(ps, in, ref, dout).grads;
          time = fmt(seconds_since(t) * 1e3);
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
  std::cout << "\nExercises, cut from the steps' own code and graded by their CPU tests:\n";
  {
    std::stringstream ex(FA_EXERCISES);
    std::map<std::string, std::string> by_step;
    for (std::string id; ex >> id;) by_step[id.substr(0, 2)] += (by_step[id.substr(0, 2)].empty() ? "" : ", ") + id;
    for (const auto& [step, ids] : by_step) std::cout << "  step " << step << ": " << ids << "\n";
  }
  std::cout << "  python3 tools/course/exercise.py start ID; then cmake --build --preset cpu --target stepNN_tests\n"
               "  and ctest --preset cpu -R \"stepNN cpu\" (reset ID puts the solution back)\n";
  std::cout << "\nmax |err|: largest element-wise difference from the fp64 reference (step 02: from the\n"
               "reference's attention without softmax; steps 06-09: computed in bf16, so ~1e-3 is their rounding).\n"
               "time ms: the kernel's on the GPU, or the CPU model's here (a model counts every element it moves:\n"
               "slow, and no guide to a GPU's time). HBM MB: elements each step reads and writes in device memory\n"
               "by its note's formula (= its CPU model's count), x 4 bytes. scratch MB: extra device memory.\n"
               "Step 09: its model, R = 4 simulated ranks in one process (2 or 1 where N does not divide into 8\n"
               "chunks); what matters there is what the ranks send each other (notes/09_ring.md).\n"
               "Next: the notes in notes/, `flashattn list`, `flashattn run --help`, `flashattn trace --help`.\n";
  return 0;
}

// ---- list -------------------------------------------------------------------------
int list() {
  std::string why;
  const bool gpu = have_gpu(&why);
  std::printf("%-10s %-7s %-6s %-9s %-52s %s\n", "step", "kernel", "model", "backward", "computes", "note");
  for (const auto& s : step_table()) {
    const bool model = s.model || s.model_traced;
    std::printf("%-10s %-7s %-6s %-9s %-52s %s\n", s.id.c_str(), kernel_here(s, gpu).c_str(), model ? "here" : "-",
                s.backward || s.model_backward ? "yes" : "no", s.what.c_str(), s.note.c_str());
  }
  std::cout << "kernel: \"here\" runs on this machine's GPU (flashattn run --step NN); \"GPU\" needs one; \"ring09\":\n"
               "several GPUs, one process each (notes/09_ring.md). model: the step's CPU model runs here\n"
               "(flashattn run --step NN --model; flashattn trace for steps 03, 04, 08, 09).\n";
  std::cout << (gpu ? "A CUDA device is present: every kernel and every model can run.\n"
                    : why + ": the models run, and the reference; the kernels need a GPU.\n");
  return 0;
}

// ---- traffic against M ------------------------------------------------------------
int traffic(const Args& a) {
  std::vector<int> Ns;
  std::stringstream n_list(a.kv.count("--N") ? a.kv.at("--N") : "1024");
  for (std::string n; std::getline(n_list, n, ',');) Ns.push_back(to_int(n, "--N"));
  std::vector<std::size_t> Ms;
  std::stringstream list(a.kv.count("--M") ? a.kv.at("--M") : "1100,2200,4400,9300,18800");
  for (std::string m; std::getline(list, m, ',');) Ms.push_back(std::size_t(to_int(m, "--M")));
  std::printf("step,N,d,causal,M,br,bc,model_read,model_written,formula_total,n2d2_over_M\n");
  for (int N : Ns) {
    Problem p;
    p.N = N;
    p.d = a.kv.count("--d") ? to_int(a.kv.at("--d"), "--d") : 64;
    p.causal = a.causal;
    p.validate();
    const Qkv in = random_qkv(p, 1);
    // Step 01 (its 32 × 32 GEMM tiles, whatever M): the N² terms of S and P.
    const Traffic m01 = step01::model_forward(p, in, true).traffic, f01 = step01::traffic_forward(p, true);
    std::printf("01,%d,%d,%d,0,%d,%d,%llu,%llu,%llu,0\n", p.N, p.d, int(p.causal), step01::kTile, step01::kTile,
                (unsigned long long)m01.read, (unsigned long long)m01.written, (unsigned long long)f01.total());
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


/// The tensors of `run` and `trace`: the paths checked, the headers read one file at a time
/// (a file refused before the next is opened, and before any data is read), the problem,
/// then the data, each file checked as it arrives.
struct Inputs {
  Problem p;
  Qkv in;
  std::vector<float> dO;
  std::vector<long long> sh, kv_sh;
  std::vector<std::string> paths;
};

/// A paged K/V cache as the options give it (--block-table, --page, --kv-lengths): the page
/// table as its file holds it, [rows, width], and the keys each sequence holds.
struct PagedArgs {
  int page = 0;
  long long rows = 0, width = 0, n_kv = 0;  ///< n_kv: the longest sequence's keys
  std::vector<long long> table, lengths;
};

/// The index tables' paths (--offsets, --block-table, --kv-lengths): inputs too.
std::vector<std::string> table_paths(const Args& a) {
  std::vector<std::string> paths;
  for (const char* opt : {"--offsets", "--block-table", "--kv-lengths"})
    if (a.kv.count(opt)) paths.push_back(a.kv.at(opt));
  return paths;
}

/// `paged`: K and V are its pools, [pages, H_kv, page, d], and N_kv its longest sequence.
Inputs read_inputs(const Args& a, const StepEntry& s, bool want_bwd, const std::vector<std::string>& outputs,
                   const PagedArgs* paged = nullptr) {
  for (const char* opt : {"--q", "--k", "--v"})
    if (!a.kv.count(opt)) throw Error(std::string("missing ") + opt + " (the " + (opt + 2) + " tensor)");
  // Every path first: no output may be an input, a second output, a link, a
  // directory or a device — refused before anything is read or run.
  Inputs r;
  r.paths = {a.kv.at("--q"), a.kv.at("--k"), a.kv.at("--v")};
  if (want_bwd) r.paths.push_back(a.kv.at("--do"));
  for (const std::string& path : table_paths(a)) r.paths.push_back(path);
  check_output_paths(outputs, r.paths);

  // Q (and dO) is [.., N, d]; K and V are [.., N_kv, d], the same but for N_kv (decoding:
  // fewer queries than keys); a step that takes self-attention only says so when it runs.
  const std::vector<std::pair<const char*, const char*>> tensors = {{"--q", "Q"}, {"--k", "K"}, {"--v", "V"}, {"--do", "dO"}};
  std::vector<long long>& sh = r.sh;
  std::vector<long long>& kv_sh = r.kv_sh;
  for (const auto& [opt, name] : tensors) {
    if (!a.kv.count(opt) || (std::string(opt) == "--do" && !want_bwd)) continue;
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
    } else if (who == "K" && paged) {
      if (h.shape.size() != 4 || h.shape[2] != paged->page || h.shape[3] != sh.back() || h.shape[0] == 0 || h.shape[1] == 0)
        throw Error(printable(path, 200) + ": K has shape " + shape_tuple(h.shape) + "; a paged cache's pool is [pages, " +
                    "H_kv, page, d] = [.., .., " + std::to_string(paged->page) + ", " + std::to_string(sh.back()) + "]");
      if (sh.size() < 3) throw Error("a paged cache serves sequences of heads: Q must be [H, N, d] or [B, H, N, d]");
      if (h.shape[0] > INT32_MAX || h.shape[1] > INT32_MAX)
        throw Error(printable(path, 200) + ": K's shape " + shape_tuple(h.shape) + " has a dimension over 2^31 - 1");
      kv_sh = h.shape;
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
  Problem& p = r.p;
  const std::size_t rank = sh.size();
  p.B = rank == 4 ? int(sh[0]) : 1;
  p.H = rank >= 3 ? int(sh[rank - 3]) : 1;
  p.N = int(sh[rank - 2]);
  p.d = int(sh[rank - 1]);
  if (paged) {  // the pool's heads; the keys: the longest sequence's
    if (kv_sh[1] != sh[rank - 3]) p.H_kv = int(kv_sh[1]);
    if (paged->n_kv != p.N) p.N_kv = int(paged->n_kv);
  } else {
    if (kv_sh[rank - 2] != sh[rank - 2]) p.N_kv = int(kv_sh[rank - 2]);
    if (rank >= 3 && kv_sh[rank - 3] != sh[rank - 3]) p.H_kv = int(kv_sh[rank - 3]);  // grouped-query attention
  }
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
  if (a.kv.count("--window")) {  // FlashAttention's window_size: LEFT,RIGHT, -1 for an open side
    const std::string& w = a.kv.at("--window");
    const std::size_t comma = w.find(',');
    auto side = [&](const std::string& x, const char* which) {
      return x == "-1" ? -1 : to_int(x, std::string("--window's ") + which + " side (or -1)");
    };
    if (comma == std::string::npos) throw Error("--window takes LEFT,RIGHT (got '" + printable(w, 40) + "')");
    p.window_left = side(w.substr(0, comma), "left");
    p.window_right = side(w.substr(comma + 1), "right");
  }
  p.validate();

  auto load = [&](const char* opt, const char* name, const std::vector<long long>& shape) {
    NpyArray x = read_npy(a.kv.at(opt));
    if (x.shape != shape) throw Error(printable(a.kv.at(opt), 200) + ": changed while being read");
    require_representable(x.data, shape, p.dtype, printable(a.kv.at(opt), 200) + " (" + name + ")");
    return std::move(x.data);
  };
  r.in.q = load("--q", "Q", sh);
  r.in.k = load("--k", "K", kv_sh);
  r.in.v = load("--v", "V", kv_sh);
  if (want_bwd) r.dO = load("--do", "dO", sh);
  return r;
}

/// --offsets OFFS.npy (cu_seqlens: 0, then each sequence's end) for a ragged batch.
std::vector<int> offsets_from_file(const std::string& path) {
  const NpyInts f = read_npy_ints(path);
  const std::string name = printable(path, 200);
  if (f.shape.size() != 1 || f.data.size() < 2)
    throw Error(name + ": offsets have shape " + shape_tuple(f.shape) +
                "; they are [sequences + 1]: 0, then where each sequence ends");
  if (f.data[0] != 0) throw Error(name + ": the first offset is " + std::to_string(f.data[0]) + "; it must be 0");
  std::vector<int> offsets = {0};
  for (std::size_t i = 1; i < f.data.size(); ++i) {
    if (f.data[i] <= f.data[i - 1])
      throw Error(name + ": offset " + std::to_string(i) + " (" + std::to_string(f.data[i]) + ") is not above offset " +
                  std::to_string(i - 1) + " (" + std::to_string(f.data[i - 1]) +
                  "): offsets increase, each sequence at least one row");
    if (f.data[i] > (1 << 30)) throw Error(name + ": offset " + std::to_string(i) + " is past 2^30 rows");
    offsets.push_back(int(f.data[i]));
  }
  return offsets;
}

/// f() on the step's kernels: a ragged batch or a paged cache (have_gpu was asked first: a
/// build without CUDA stops there, and never calls f, whose GPU wrappers it does not define).
template <class F>
std::invoke_result_t<F> on_kernels(const StepEntry& s, F&& f) {
#ifdef FA_HAVE_CUDA
  (void)s;
  return f();
#else
  (void)f;
  throw Error("step " + s.id + "'s kernel runs on the GPU, and this build has no CUDA");
#endif
}

/// --seqlens n1,n2,… or --offsets OFFS.npy (a ragged batch, step 07's): the offsets that
/// cut Q's rows; empty without either.
std::vector<int> offsets_of(const Args& a, const StepEntry& s) {
  const bool by_lengths = a.kv.count("--seqlens"), file = a.kv.count("--offsets");
  if (!by_lengths && !file) return {};
  if (by_lengths && file) throw Error("a ragged batch takes --seqlens or --offsets, not both");
  if (s.id != "07")
    throw Error(std::string(by_lengths ? "--seqlens" : "--offsets") + " (a ragged batch) is step 07's: add --step 07");
  if (file) return offsets_from_file(a.kv.at("--offsets"));
  const std::string& lengths = a.kv.at("--seqlens");
  if (lengths.empty() || lengths.back() == ',') throw Error("--seqlens takes n1,n2,... (got '" + printable(lengths, 40) + "')");
  std::vector<int> offsets = {0};
  for (const std::string& n : cli::words(lengths)) {
    const int len = to_int(n, "each of --seqlens");
    if (len < 1) throw Error("each of --seqlens must be at least 1 (an empty sequence has no attention)");
    if (offsets.back() > (1 << 30) - len) throw Error("--seqlens add up to more than 2^30 rows");
    offsets.push_back(offsets.back() + len);
  }
  return offsets;
}

/// --ranks R for step 09's model (0: its default); refused for any other step.
int ranks_of(const Args& a, const StepEntry& s) {
  if (!a.kv.count("--ranks")) return 0;
  if (s.id != "09") throw Error("--ranks is step 09's (its simulated ranks); step " + s.id + " has none");
  const int r = to_int(a.kv.at("--ranks"), "--ranks");
  if (r < 1) throw Error("--ranks must be at least 1");
  return r;
}

/// --block-table T.npy --page P [--kv-lengths L.npy] (a paged K/V cache, step 08's).
std::optional<PagedArgs> paged_of(const Args& a, const StepEntry& s) {
  const bool table = a.kv.count("--block-table"), page = a.kv.count("--page"), lengths = a.kv.count("--kv-lengths");
  if (!table && !page && !lengths) return std::nullopt;
  if (!table || !page) throw Error("a paged K/V cache takes --block-table T.npy and --page P (and --kv-lengths L.npy)");
  if (s.id != "08") throw Error("--block-table (a paged K/V cache) is step 08's: add --step 08 (or --step 08 --model)");
  PagedArgs g;
  g.page = to_int(a.kv.at("--page"), "--page");
  if (g.page < 16 || g.page > 256 || g.page % 16)
    throw Error("--page: a page holds 16 to 256 positions, a multiple of 16 (got " + std::to_string(g.page) + ")");
  const std::string tpath = printable(a.kv.at("--block-table"), 200);
  NpyInts t = read_npy_ints(a.kv.at("--block-table"));
  if (t.shape.size() != 2 || t.shape[0] < 1 || t.shape[1] < 1)
    throw Error(tpath + ": the page table has shape " + shape_tuple(t.shape) + "; it is [B, W]: W page numbers a sequence");
  g.rows = t.shape[0], g.width = t.shape[1];
  g.table = std::move(t.data);
  if (g.width > (1 << 30) / g.page) throw Error(tpath + ": " + std::to_string(g.width) + " pages a sequence pass 2^30 keys");
  g.n_kv = g.width * g.page;
  if (lengths) {
    const std::string lpath = printable(a.kv.at("--kv-lengths"), 200);
    NpyInts l = read_npy_ints(a.kv.at("--kv-lengths"));
    if (l.shape.size() != 1 || l.shape[0] != g.rows)
      throw Error(lpath + ": the lengths have shape " + shape_tuple(l.shape) + "; they are [B] = [" +
                  std::to_string(g.rows) + "], one a row of the page table");
    g.n_kv = 0;
    for (std::size_t b = 0; b < l.data.size(); ++b) {
      if (l.data[b] < 1 || l.data[b] > g.width * g.page)
        throw Error(lpath + ": sequence " + std::to_string(b) + " holds " + std::to_string(l.data[b]) +
                    " keys; its table row holds 1 to " + std::to_string(g.width * g.page));
      g.n_kv = std::max(g.n_kv, l.data[b]);
    }
    g.lengths = std::move(l.data);
  }
  // The entries a sequence reads must be int32 (a page of the pool: checked with the pool);
  // a padded table's other entries are never read.
  for (long long b = 0; b < g.rows; ++b) {
    const long long len = g.lengths.empty() ? g.width * g.page : g.lengths[std::size_t(b)];
    for (long long x = 0; x * g.page < len; ++x) {
      const long long at = g.table[std::size_t(b * g.width + x)];
      if (at < INT32_MIN || at > INT32_MAX)
        throw Error(tpath + ": entry (" + std::to_string(b) + ", " + std::to_string(x) + ") = " + std::to_string(at) +
                    " is not a page number");
    }
  }
  return g;
}

/// The paged cache for p: the table's first ⌈N_kv/page⌉ columns (the rest, a wider table's
/// padding, unread), the pool's pages, the lengths.
PagedKv paged_kv(const PagedArgs& g, const Problem& p, const std::vector<long long>& pool_shape) {
  if (g.rows != p.B)
    throw Error("the page table has " + std::to_string(g.rows) + " rows; Q has B = " + std::to_string(p.B) +
                " sequences (one row each)");
  PagedKv kv;
  kv.page = g.page;
  kv.pool = int(pool_shape[0]);
  const int cols = kv.pages_per_seq(p);
  for (long long b = 0; b < g.rows; ++b)
    for (int x = 0; x < cols; ++x) kv.table.push_back(int(g.table[std::size_t(b * g.width + x)]));
  for (long long len : g.lengths) kv.lengths.push_back(int(len));
  return kv;
}

int run(const Args& a) {
  const bool model = a.has("--model");
  if (!a.kv.count("--step")) throw Error("missing --step (see flashattn list)");
  const StepEntry& s = find_step(a.kv.at("--step"));
  if (!a.kv.count("--out")) throw Error("missing --out O.npy");
  const bool want_bwd = a.kv.count("--do") || a.kv.count("--dq") || a.kv.count("--dk") || a.kv.count("--dv");
  if (want_bwd && !(a.kv.count("--do") && a.kv.count("--dq") && a.kv.count("--dk") && a.kv.count("--dv")))
    throw Error("the backward needs all of --do, --dq, --dk and --dv");
  if (model && !s.model && !s.model_traced)
    throw Error("step " + s.id + " has no CPU model: it is computed on the CPU already (drop --model)");
  if (want_bwd && !(model ? bool(s.model_backward) : bool(s.backward)))
    throw Error("step " + s.id + (model ? "'s model" : "") + " has no backward (steps with one: " +
                (model ? "01, 05, 06, 07" : "reference, 01, 05, 06, 07") + ")");
  if (a.kv.count("--lse") && !s.softmax) throw Error("step " + s.id + " computes no softmax, so it has no log-sum-exp");
  const int ranks = ranks_of(a, s);
  if (ranks && !model) throw Error("--ranks: step 09's simulated ranks are its model's (add --model)");
  if (!model && !s.forward)
    throw Error("step " + s.id + " runs across GPUs with " + s.kernel_elsewhere + "; --model runs its CPU model here");
  if (!model && s.gpu) {
    std::string why;
    if (!have_gpu(&why))
      throw Error("step " + s.id + "'s kernel runs on the GPU: " + why + "; --model runs its CPU model here");
  }

  std::vector<std::string> outputs = {a.kv.at("--out")};
  if (a.kv.count("--lse")) outputs.push_back(a.kv.at("--lse"));
  if (want_bwd)
    for (const char* opt : {"--dq", "--dk", "--dv"}) outputs.push_back(a.kv.at(opt));
  {  // the index tables are read before Q, K, V: their paths checked first, as read_inputs checks all
    std::vector<std::string> inputs = table_paths(a);
    for (const char* opt : {"--q", "--k", "--v", "--do"})
      if (a.kv.count(opt)) inputs.push_back(a.kv.at(opt));
    check_output_paths(outputs, inputs);
  }
  const std::optional<PagedArgs> paged = paged_of(a, s);
  const Inputs x = read_inputs(a, s, want_bwd, outputs, paged ? &*paged : nullptr);
  const Problem& p = x.p;
  const std::vector<long long>&sh = x.sh, &kv_sh = x.kv_sh;

  std::vector<long long> lshape(sh.begin(), sh.end() - 1);
  const std::vector<int> offsets = offsets_of(a, s);
  if (!offsets.empty() && (p.B != 1 || offsets.back() != p.N))
    throw Error(std::string("a ragged batch is packed into one sequence: Q [H, T, d] or [1, H, T, d] with T ") +
                (a.kv.count("--offsets") ? "its last offset (" : "the sum of --seqlens (") +
                std::to_string(offsets.back()) + "; got " + p.str() + ")");
  auto run_paged = [&](const PagedKv& kv) {
    return model ? step08::model_forward_paged(p, x.in, kv, h200_plan(p)).out
                 : on_kernels(s, [&] { return gpu::forward_paged(*s.gpu_forward, p, x.in, kv); });
  };
  const ForwardOut out = !offsets.empty() ? (model ? step07::model_forward_ragged(p, x.in, offsets).out
                                                  : on_kernels(s, [&] { return gpu::forward(*s.gpu_forward, p, x.in, offsets); }))
                         : paged          ? run_paged(paged_kv(*paged, p, kv_sh))
                         : model          ? run_model(s, p, x.in, nullptr, ranks).out
                                          : s.forward(p, x.in);
  require_finite_result(out.o, sh, s.id, "O");
  if (s.softmax) require_finite_result(out.lse, lshape, s.id, "L");
  OutputFiles files;
  files.add(a.kv.at("--out"), sh, out.o);
  if (a.kv.count("--lse")) files.add(a.kv.at("--lse"), lshape, out.lse);
  if (want_bwd) {
    const Grads g = !offsets.empty() ? (model ? step07::model_backward_ragged(p, x.in, out, x.dO, offsets).grads
                                              : on_kernels(s, [&] {
                                                  return gpu::backward(*s.gpu_backward, p, x.in, out, x.dO, offsets);
                                                }))
                    : model          ? s.model_backward(p, x.in, out, x.dO).grads
                                     : s.backward(p, x.in, out, x.dO);
    require_finite_result(g.dq, sh, s.id, "dQ");
    require_finite_result(g.dk, kv_sh, s.id, "dK");
    require_finite_result(g.dv, kv_sh, s.id, "dV");
    files.add(a.kv.at("--dq"), sh, g.dq);
    files.add(a.kv.at("--dk"), kv_sh, g.dk);
    files.add(a.kv.at("--dv"), kv_sh, g.dv);
  }
  files.commit(x.paths);
  std::cout << "step " << s.id << (model ? " (CPU model)" : "") << ": " << p.str() << " -> "
            << printable(a.kv.at("--out"), 200) << (want_bwd ? " and gradients" : "") << "\n";
  return 0;
}

// ---- trace ------------------------------------------------------------------------
const char* kTraceHelp = R"(flashattn trace --step 03|04|08|09 --q Q.npy --k K.npy --v V.npy --row R
                [--causal] [--scale S] [--cols C] [--ranks n] [--csv FILE]
  The online softmax of one query row (row R of the first batch and head), as the
  step's CPU model computes it: after each K/V block, the running max m, the sum l
  (relative to m), the factor e^(m_old - m_new) the old l and O were rescaled by, and
  the first C columns (default 4) of O / l, the result so far. Step 08: each split's
  blocks (its four warps merged for the display), its finished part and the merge of
  the parts (rescale: each part's weight). Step 09: the rank holding the row, after
  each ring step's call (m: the merged L; l = 1, O normalised; rescale: the old part's
  weight); --ranks n simulated ranks. --csv FILE writes the table as CSV too
  (tools/course/plot_trace.py draws it).
)";

/// `text` written to `path` whole or not at all (a temporary beside it, then renamed).
void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".partial";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) throw Error("cannot write " + printable(path, 200) + ": " + std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw Error("cannot write " + printable(path, 200) + ": " + why);
  }
}

int trace(const Args& a) {
  if (!a.kv.count("--step")) throw Error("missing --step (03, 04, 08 or 09)");
  const StepEntry& s = find_step(a.kv.at("--step"));
  if (!s.model_traced) throw Error("step " + s.id + " has no trace (steps 03, 04, 08 and 09 have)");
  if (!a.kv.count("--row")) throw Error("missing --row R (the query row to watch)");
  const int ranks = ranks_of(a, s);
  online::Trace tr;
  tr.row = std::size_t(to_int(a.kv.at("--row"), "--row"));
  if (a.kv.count("--cols")) tr.cols = to_int(a.kv.at("--cols"), "--cols");
  std::vector<std::string> outputs;
  if (a.kv.count("--csv")) outputs.push_back(a.kv.at("--csv"));
  const Inputs x = read_inputs(a, s, false, outputs);
  if (tr.row >= std::size_t(x.p.N))
    throw Error("--row " + std::to_string(tr.row) + " is past the last query row (N = " + std::to_string(x.p.N) + ")");
  run_model(s, x.p, x.in, &tr, ranks);

  std::ostringstream csv;
  csv << "step,event,stage,k0,k1,m,l,rescale";
  for (int c = 0; c < tr.cols && c < x.p.d; ++c) csv << ",o" << c;
  csv << "\n";
  std::printf("step %s, %s, row %zu of the first head: the state after each event\n", s.id.c_str(), x.p.str().c_str(),
              tr.row);
  std::printf("%-4s %-30s %-13s %11s %11s %9s  %s\n", "#", "stage", "keys", "m", "l", "rescale", "O / l, first columns");
  for (std::size_t e = 0; e < tr.rows.size(); ++e) {
    const online::TraceRow& r = tr.rows[e];
    char o[256] = "", keys[32] = "";
    std::size_t at = 0;
    for (float v : r.o) at += std::size_t(std::snprintf(o + at, sizeof o - at, "%9.4f ", double(v)));
    if (r.k1 > r.k0) std::snprintf(keys, sizeof keys, "%d..%d", r.k0, r.k1 - 1);
    std::printf("%-4zu %-30s %-13s %11.5g %11.5g %9.5g  %s\n", e, r.stage.c_str(), keys[0] ? keys : "-", double(r.m),
                double(r.l), double(r.rescale), o);
    csv << s.id << ',' << e << ',' << r.stage << ',' << r.k0 << ',' << r.k1;
    for (float v : {r.m, r.l, r.rescale}) csv << ',' << fmt(v, 9);
    for (float v : r.o) csv << ',' << fmt(v, 9);
    csv << "\n";
  }
  if (tr.rows.empty()) std::printf("(no event: the row sees no key)\n");
  if (a.kv.count("--csv")) {
    write_text(a.kv.at("--csv"), csv.str());
    std::printf("-> %s\n", printable(a.kv.at("--csv"), 200).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "tour";
    if (cmd != "run" && std::find_if(argv + 1, argv + argc, [](const char* x) { return std::string(x) == "--model"; }) !=
                            argv + argc)
      throw Error("--model is an option of flashattn run");
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
      std::cout << kHelp;
      return 0;
    }
    auto asks_help = [&] { return argc > 2 && (std::string(argv[2]) == "--help" || std::string(argv[2]) == "-h"); };
    const std::vector<std::string> tour_opts = {"--B", "--H", "--N", "--d", "--seed"};
    if (cmd == "tour") return tour(parse(argc, argv, 2, tour_opts));
    if (cmd.rfind("--", 0) == 0) return tour(parse(argc, argv, 1, tour_opts));
    if (cmd == "list") return list();
    if (cmd == "traffic") return traffic(parse(argc, argv, 2, {"--N", "--d", "--M"}));
    if (cmd == "trace") {
      if (asks_help()) {
        std::cout << kTraceHelp;
        return 0;
      }
      return trace(parse(argc, argv, 2, {"--step", "--q", "--k", "--v", "--row", "--scale", "--cols", "--ranks", "--csv"}));
    }
    if (cmd == "run") {
      if (asks_help()) {
        std::cout << kHelp;
        return 0;
      }
      return run(parse(argc, argv, 2,
                       {"--step", "--q", "--k", "--v", "--out", "--lse", "--scale", "--window", "--seqlens", "--offsets",
                        "--block-table", "--page", "--kv-lengths", "--dtype", "--do", "--dq", "--dk", "--dv", "--ranks"},
                       {"--causal", "--model"}));
    }
    throw Error("unknown command '" + printable(cmd, 40) +
                "' (commands: tour, run, trace, list, traffic; see flashattn --help)");
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
