// step09_bench: the ring over NCCL timed, beside its local kernel on one GPU. Run by ring09:
//
//   ring09 --ranks R -- step09_bench [--N 16384,65536] [--d 128] [--causal 0,1] [--heads 8]
//                                    [--reps 10] [--csv FILE]
//
// N is the whole sequence (R ranks hold N/R rows each), B = 1, H = --heads, bf16. Per
// shape: the ring's forward and backward (CUDA events around one pass on every rank, the
// slowest rank's time, median of reps; the ranks start each repeat together), then, on
// rank 0 alone, the local kernel (local_kernels: step 07's on an H200, step 06's before
// Hopper) on one GPU at the same N (strong scaling) and at N/R (weak scaling: the same
// rows per GPU). Rank 0 prints a table and writes the CSV:
// TFLOP/s per GPU = FLOPs of the whole problem / R / time (backward: 2.5× the forward's
// FLOPs), and the efficiencies = the ring's TFLOP/s per GPU ÷ the local kernel's on one GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "common/cli.hpp"
#include "common/cuda_check.cuh"
#include "common/gpu.hpp"
#include "common/timer.cuh"
#include "steps/06_tensor_cores/step06.hpp"
#include "steps/09_ring/nccl.hpp"

using namespace fa;

namespace {

/// The slowest rank's time of one pass, median over reps; `pass` restarts and runs it on the compute stream.
template <class Pass>
double time_ring(const step09::NcclRing& ring, int reps, Pass pass) {
  EventTimer timer;
  pass(false);  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    pass(true);
    FA_CUDA_CHECK(cudaStreamSynchronize(ring.compute()));
    ring.max_over_ranks(0);  // every rank ready: start together
    timer.start(ring.compute());
    pass(false);
    ms.push_back(ring.max_over_ranks(timer.stop(ring.compute())));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

/// The local kernel alone on one GPU (rank 0), or NaN where it does not fit.
double single(bool backward, const Problem& p, int reps) {
  try {
    const step09::LocalKernels local = step09::local_kernels(p);
    return backward ? gpu::time_backward(*local.backward, p, reps).median_ms
                    : gpu::time_forward(*local.forward, p, reps).median_ms;
  } catch (const std::exception& e) {
    std::cerr << "the local kernel alone, " << p.str() << ": " << e.what() << "\n";
    return NAN;
  }
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<int> Ns{16384, 65536}, ds{128}, causals{0, 1};
  int heads = 8, reps = 10;
  std::string csv;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--N") Ns = cli::ints(val());
    else if (a == "--d") ds = cli::ints(val());
    else if (a == "--causal") causals = cli::ints(val());
    else if (a == "--heads") heads = std::stoi(val());
    else if (a == "--reps") reps = std::stoi(val());
    else if (a == "--csv") csv = val();
    else throw Error("step09_bench: unknown option " + a);
  }
  const step09::NcclRing ring;
  const int R = ring.ranks(), me = ring.rank();
  std::ofstream out;
  if (me == 0 && !csv.empty()) {
    out.open(csv);
    out << "ranks,heads,N,d,causal,dir,ring_ms,ring_tflops_per_gpu,one_gpu_ms,one_gpu_tflops,one_gpu_NoverR_tflops,"
           "strong_efficiency,weak_efficiency,gpu,local_kernel\n";
  }
  if (me == 0)
    std::printf("%5s %5s %7s %4s %6s %4s %10s %12s %10s %10s %12s %7s %7s\n", "ranks", "B·H", "N", "d", "causal", "dir",
                "ring ms", "TFLOP/s/GPU", "1 GPU ms", "1 GPU TF", "1 GPU N/R TF", "strong", "weak");
  for (int d : ds)
    for (int causal : causals)
      for (int N : Ns) {
        const Problem p = [&] {
          Problem q;
          q.B = 1;
          q.H = heads;
          q.N = N;
          q.d = d;
          q.causal = causal != 0;
          q.dtype = DType::bf16;
          return q;
        }();
        const step09::RankShape sh(p, R);
        step09::require_gpu(p, R);
        const Qkv in = random_qkv(sh.whole, 900 + std::uint64_t(me));  // this rank's rows, [B·H, 2c, d]
        std::vector<float> kv = in.k;
        kv.insert(kv.end(), in.v.begin(), in.v.end());
        step09::RankForward x(sh, in.q, kv);
        const double fwd = time_ring(ring, reps, [&](bool restart) {
          if (restart) x.restart(ring.compute());
          else step09::nccl_forward(ring, sh, x);
        });
        FA_CUDA_CHECK(cudaStreamSynchronize(ring.compute()));
        const std::vector<float> o = x.o.download(), lse = x.lse.download();
        step09::RankBackward y(sh, in.q, kv, o, lse, random_qkv(sh.whole, 950 + std::uint64_t(me)).q);
        const double bwd = time_ring(ring, reps, [&](bool restart) {
          if (restart) y.restart(ring.compute());
          else step09::nccl_backward(ring, sh, y);
        });
        Problem part = p;
        part.N = N / R;
        const step09::LocalKernels local = step09::local_kernels(p);
        for (const bool backward : {false, true}) {
          double one = NAN, one_part = NAN;
          if (me == 0) {
            one = single(backward, p, reps);
            one_part = single(backward, part, reps);
          }
          ring.max_over_ranks(0);  // the others wait for rank 0's single-GPU runs
          if (me != 0) continue;
          const double f = backward ? 2.5 : 1.0, ms = backward ? bwd : fwd;
          const double tf = p.flops_forward() * f / R / (ms * 1e-3) / 1e12;
          const double tf1 = p.flops_forward() * f / (one * 1e-3) / 1e12;
          const double tfp = part.flops_forward() * f / (one_part * 1e-3) / 1e12;
          std::printf("%5d %5d %7d %4d %6d %4s %10.3f %12.1f %10.3f %10.1f %12.1f %7.2f %7.2f\n", R, heads, N, d, causal,
                      backward ? "bwd" : "fwd", ms, tf, one, tf1, tfp, tf / tf1, tf / tfp);
          if (out)
            out << R << "," << heads << "," << N << "," << d << "," << causal << "," << (backward ? "bwd" : "fwd") << ","
                << ms << "," << tf << "," << one << "," << tf1 << "," << tfp << "," << tf / tf1 << "," << tf / tfp << ","
                << "\"" << gpu::describe_device() << "\","  // the GPU's line has commas
                << (backward ? local.backward->name : local.forward->name) << "\n";
        }
      }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "step09_bench: " << e.what() << "\n";
  return 1;
}
