// fa_bench: times every built GPU step over a sweep of shapes and writes CSV.
//
//   fa_bench [--N 1024,2048,...] [--d 64,128] [--causal 0,1] [--dir fwd,bwd] [--dtype fp32|bf16|fp16]
//            [--tokens 65536] [--reps 10] [--steps 01,03,...] [--csv out.csv]
//   fa_bench --max-n [--steps ...] [--csv out.csv]
//   fa_bench --once --steps 03 --N 4096 --d 64 --causal 0 --dir fwd   (for ncu)
//   fa_bench --dtype bf16 --versions ...   also times the versions of a step's note table (rows 06v3, …, 06b1, …)
//   fa_bench --decode [--Nq 1,16] [--Nkv 8192,...] [--bh 32,128] [--group 1,8] [--d 128] [--causal 0,1]
//            [--steps 06,08] [--versions] [--csv out.csv]
//      decoding shapes (N_q queries against N_kv keys, B = 1, H = bh query heads, H/group K/V
//      heads): time and achieved bandwidth — the fewest bytes (Q, K, V read once; O, L
//      written) over the time — beside this GPU's device-to-device copy bandwidth (row
//      "copy", bytes read plus written over the time of a 2 GiB cudaMemcpy).
//
// Sweep: B = 1 and H = tokens / N heads (so every N does the same number of
// query rows; at least one head). Each point: 2 warm-up launches, then `reps`
// launches timed with CUDA events, L2 flushed before each; the median is kept.
// TFLOP/s by the convention 4·B·H·N²·d (halved when causal), ×2.5 for backward.
// Peak extra device memory is the step's workspace (its N² buffers for step 01).
// --max-n: for each step, doubles N at B = H = 1 until the step cannot hold the
// problem in device memory (or N reaches 256k, or one launch takes over 2 s), and
// reports the largest N that ran.
// --once: runs each chosen step once per shape on random inputs, untimed, and
// prints the note's traffic formula in bytes: what tools/bench/ncu_traffic.py
// profiles with Nsight Compute to measure DRAM bytes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/cli.hpp"
#include "common/cuda_check.cuh"
#include "common/gpu.hpp"
#include "tools/flashattn/steps_table.hpp"

namespace {

using namespace fa;


using cli::ints;
using cli::words;

struct Row {
  std::string step, dir;
  Problem p;
  double ms = 0, tflops = 0;
  std::size_t scratch = 0, total = 0;  ///< workspace, and workspace + tensors
  unsigned long long formula_bytes = 0;  ///< HBM bytes by the step's note (= its CPU model's count)
  std::string status = "ok";
};

std::string device_fields() {
  int dev = 0, driver = 0, runtime = 0;
  cudaDeviceProp prop{};
  cudaGetDevice(&dev);
  cudaGetDeviceProperties(&prop, dev);
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::ostringstream s;
  s << prop.name << "," << driver / 1000 << "." << (driver % 1000) / 10 << "," << runtime / 1000 << "."
    << (runtime % 1000) / 10;
  return s.str();
}

void write_row(std::FILE* f, const Row& r, const std::string& dev) {
  std::fprintf(f, "fa,%s,%s,%s,%d,%d,%d,%d,%d,%.5f,%.3f,%zu,%s,%s,%llu,%zu\n", r.step.c_str(), r.dir.c_str(), dtype_name(r.p.dtype), r.p.B,
               r.p.H, r.p.N, r.p.d, int(r.p.causal), r.ms, r.tflops, r.scratch, r.status.c_str(), dev.c_str(),
               r.formula_bytes, r.total);
  std::fflush(f);
}

/// The note's HBM traffic in bytes: elements × the problem's element size (L, fp32
/// in every step, is counted at that size too: N elements beside N·d).
unsigned long long formula_bytes(const StepEntry& s, bool bwd, const Problem& p) {
  const unsigned long long elems = (bwd ? s.traffic_backward(p) : s.traffic_forward(p)).total();
  return elems * (p.dtype == DType::fp32 ? 4 : 2);
}

Row measure(const StepEntry& s, const std::string& dir, const Problem& p, int reps) {
  Row r{s.id, dir, p};
  const bool bwd = dir == "bwd";
  r.scratch = bwd ? s.gpu_backward->workspace_bytes(p) : s.gpu_forward->workspace_bytes(p);
  r.total = bwd ? gpu::backward_bytes(*s.gpu_backward, p) : gpu::forward_bytes(*s.gpu_forward, p);
  r.formula_bytes = formula_bytes(s, bwd, p);
  try {
    const gpu::Timing t = bwd ? gpu::time_backward(*s.gpu_backward, p, reps) : gpu::time_forward(*s.gpu_forward, p, reps);
    r.ms = t.median_ms;
    r.tflops = p.flops_forward() * (bwd ? 2.5 : 1.0) / (t.median_ms * 1e-3) / 1e12;
  } catch (const Error& e) {
    r.status = std::string(e.what()).find("free") != std::string::npos ? "out-of-memory" : "error";
    std::cerr << "  " << s.id << " " << dir << " " << p.str() << ": " << e.what() << "\n";
    cudaGetLastError();
  }
  return r;
}

/// The decode CSV's columns.
bool write_decode_header(std::FILE* f) {
  return std::fprintf(f, "impl,step,dtype,B,H,H_kv,N,N_kv,d,causal,ms,gbps,floor_bytes,scratch_bytes,status,gpu,"
                         "cuda_driver_api,cuda_runtime\n") > 0;
}

/// The fewest bytes a decoding forward moves: Q, K, V read once, O and L written once.
double floor_bytes(const Problem& p) {
  return 2.0 * (2.0 * double(p.elems()) + 2.0 * double(p.kv_elems())) + 4.0 * double(p.rows());
}

/// Device-to-device copy bandwidth, bytes read plus written per second (GB/s): the
/// median of 10 copies of 2 GiB.
double copy_bandwidth() {
  const std::size_t bytes = std::size_t(2) << 30;
  void *a = nullptr, *b = nullptr;
  FA_CUDA_CHECK(cudaMalloc(&a, bytes));
  FA_CUDA_CHECK(cudaMalloc(&b, bytes));
  FA_CUDA_CHECK(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  FA_CUDA_CHECK(cudaEventCreate(&e0));
  FA_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < 12; ++i) {
    FA_CUDA_CHECK(cudaEventRecord(e0));
    FA_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    FA_CUDA_CHECK(cudaEventRecord(e1));
    FA_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    FA_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    if (i >= 2) ms.push_back(t);  // two warm-up copies
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(e0), cudaEventDestroy(e1), cudaFree(a), cudaFree(b);
  return 2.0 * double(bytes) / (ms[ms.size() / 2] * 1e-3) / 1e9;
}

/// A measured row (measure()) in the decode CSV's columns, and on stderr.
void write_decode_row(std::FILE* f, const Row& r, const std::string& dev) {
  const Problem& p = r.p;
  const double gbps = r.ms > 0 ? floor_bytes(p) / (r.ms * 1e-3) / 1e9 : 0.0;
  std::fprintf(f, "fa,%s,%s,%d,%d,%d,%d,%d,%d,%d,%.5f,%.1f,%.0f,%zu,%s,%s\n", r.step.c_str(), dtype_name(p.dtype), p.B,
               p.H, p.kv_heads_per_batch(), p.N, p.keys(), p.d, int(p.causal), r.ms, gbps, floor_bytes(p), r.scratch,
               r.status.c_str(), dev.c_str());
  std::fflush(f);
  std::fprintf(stderr, "decode step %s %s: %.4f ms, %.0f GB/s %s\n", r.step.c_str(), p.str().c_str(), r.ms, gbps,
               r.status.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string Ns = "1024,2048,4096,8192,16384", ds = "64,128", causals = "0,1", dirs = "fwd,bwd", steps_arg,
                csv = "bench.csv";
    std::string Nqs = "1,16", Nkvs = "8192,32768,131072", bhs = "32,128", groups = "1";
    long tokens = 65536;
    int reps = 10;
    DType dtype = DType::fp32;
    bool max_n = false, once = false, versions = false, decode = false;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto val = [&]() -> std::string {
        if (i + 1 >= argc) throw Error(a + " needs a value");
        return argv[++i];
      };
      if (a == "--N") Ns = val();
      else if (a == "--d") ds = val();
      else if (a == "--causal") causals = val();
      else if (a == "--dir") dirs = val();
      else if (a == "--tokens") tokens = std::stol(val());
      else if (a == "--reps") reps = std::stoi(val());
      else if (a == "--steps") steps_arg = val();
      else if (a == "--csv") csv = val();
      else if (a == "--max-n") max_n = true;
      else if (a == "--once") once = true;
      else if (a == "--versions") versions = true;
      else if (a == "--decode") decode = true;
      else if (a == "--Nq") Nqs = val();
      else if (a == "--Nkv") Nkvs = val();
      else if (a == "--bh") bhs = val();
      else if (a == "--group") groups = val();
      else if (a == "--dtype") dtype = parse_dtype(val());
      else throw Error("unknown option " + a);
    }
    std::string why;
    if (!gpu::available(&why)) throw Error("fa_bench needs a GPU: " + why);
    const std::string dev = device_fields();
    std::FILE* f = std::fopen(csv.c_str(), "w");
    if (!f) throw Error("cannot write " + csv);
    if (decode) {
      if (dtype == DType::fp32) dtype = DType::bf16;  // the decoding steps compute in 16 bits
      if (!write_decode_header(f)) throw Error("cannot write " + csv);
    } else {
      std::fprintf(f, "impl,step,dir,dtype,B,H,N,d,causal,ms,tflops,scratch_bytes,status,gpu,cuda_driver_api,cuda_runtime,formula_bytes,total_bytes\n");
    }
    std::vector<const StepEntry*> chosen;
    for (const auto& s : step_table()) {
      if (!s.gpu || (s.dtype == DType::fp32) != (dtype == DType::fp32)) continue;  // steps of this dtype
      if (!steps_arg.empty()) {
        bool want = false;
        for (const auto& w : words(steps_arg)) want |= (&find_step(w) == &s);
        if (!want) continue;
      }
      chosen.push_back(&s);
    }
    // The versions of a step's note table: the step's row with another kernel, id "06v3".
    std::vector<StepEntry> version_rows;
    if (versions) {
      for (const StepEntry* s : chosen)
        for (StepEntry& e : fa::version_rows(*s)) version_rows.push_back(std::move(e));
      if (version_rows.empty()) throw Error("--versions: none of the chosen steps has versions (step 06 has; --dtype bf16)");
      for (const StepEntry& e : version_rows) chosen.push_back(&e);
    }
    std::cerr << "fa_bench on " << gpu::describe_device() << " -> " << csv << "\n";

    if (decode) {
      const double copy = copy_bandwidth();
      std::fprintf(f, "copy,-,bf16,0,0,0,0,0,0,0,0,%.1f,0,0,ok,%s\n", copy, dev.c_str());
      std::cerr << "device-to-device copy: " << copy << " GB/s (read + written)\n";
      for (const StepEntry* s : chosen) {
        if (!s->gpu_forward || !s->gpu_forward->decode) continue;
        for (int d : ints(ds))
          for (int c : ints(causals))
            for (int bh : ints(bhs))
              for (int G : ints(groups))
                for (int Nq : ints(Nqs))
                  for (int Nkv : ints(Nkvs)) {
                    if (c && Nq == 1) continue;  // one query sees every key: causal changes nothing
                    Problem p;
                    p.B = 1, p.H = bh, p.H_kv = bh / G, p.N = Nq, p.N_kv = Nkv, p.d = d, p.causal = c != 0;
                    p.dtype = dtype;
                    write_decode_row(f, measure(*s, "fwd", p, reps), dev);
                  }
      }
      std::fclose(f);
      return 0;
    }

    if (max_n) {
      // Largest N each step can hold at B·H = bh_max (forward; step 05: backward).
      for (const StepEntry* s : chosen) {
        const std::string dir = s->gpu_forward ? "fwd" : "bwd";
        Row last{s->id, dir, {}};
        last.status = "none";
        for (int N = 1024; N <= 262144; N *= 2) {
          Problem p;
          p.B = 1, p.H = 1, p.N = N, p.d = 64;
          Row r = measure(*s, dir, p, 1);
          std::cerr << "max-n " << s->id << " N=" << N << " " << r.status << " " << r.ms << " ms\n";
          if (r.status != "ok") {
            write_row(f, r, dev);
            break;
          }
          last = r;
          last.status = N == 262144 ? "largest-ok:sweep-end" : "largest-ok";
          if (r.ms > 2000) {  // the next doubling would take 4x as long
            last.status = "largest-ok:time-limit";
            break;
          }
        }
        write_row(f, last, dev);
      }
      std::fclose(f);
      return 0;
    }

    // One sweep; each point is either timed (a CSV row) or, with --once, run once untimed.
    const auto Nl = ints(Ns), dl = ints(ds), cl = ints(causals);
    const auto dl_dirs = words(dirs);
    auto has = [](const StepEntry& s, const std::string& dir) {
      return dir == "bwd" ? s.gpu_backward != nullptr : s.gpu_forward != nullptr;
    };
    // A kernel that does not take a head dimension (step 06's versions: d = 64, 128) is
    // left out at that d, said once on stderr, instead of an error row or, with --once, a stop.
    auto takes = [](const StepEntry& s, bool bwd, int d) {
      return bwd ? takes_d(s.gpu_backward->max_d, s.gpu_backward->only_d, d)
                 : takes_d(s.gpu_forward->max_d, s.gpu_forward->only_d, d);
    };
    std::size_t total = 0, done = 0;
    for (const StepEntry* s : chosen)
      for (const auto& dir : dl_dirs)
        if (has(*s, dir))
          for (int d : dl) total += takes(*s, dir == "bwd", d) ? Nl.size() * cl.size() : 0;
    for (const StepEntry* s : chosen)
      for (const auto& dir : dl_dirs) {
        if (!has(*s, dir)) continue;
        const bool bwd = dir == "bwd";
        for (int d : dl) {
          if (!takes(*s, bwd, d)) {
            std::cerr << "  " << s->id << " " << dir << ": does not take d = " << d << ", left out\n";
            continue;
          }
          for (int c : cl)
            for (int N : Nl) {
              Problem p;
              p.B = 1, p.H = int(std::max<long>(1, tokens / N)), p.N = N, p.d = d, p.causal = c != 0;
              p.dtype = dtype;
              if (once) {
                if (bwd) gpu::time_backward(*s->gpu_backward, p, 0);
                else gpu::time_forward(*s->gpu_forward, p, 0);
                std::printf("once step=%s dir=%s B=%d H=%d N=%d d=%d causal=%d formula_bytes=%llu\n", s->id.c_str(),
                            dir.c_str(), p.B, p.H, p.N, p.d, c, formula_bytes(*s, bwd, p));
                continue;
              }
              const Row r = measure(*s, dir, p, reps);
              write_row(f, r, dev);
              std::fprintf(stderr, "[%zu/%zu] step %s %s %s: %.3f ms, %.2f TFLOP/s %s\n", ++done, total, s->id.c_str(),
                           dir.c_str(), p.str().c_str(), r.ms, r.tflops, r.status.c_str());
            }
        }
      }
    std::fclose(f);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "fa_bench: error: " << e.what() << "\n";
    return 2;
  }
}
