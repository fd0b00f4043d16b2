#include "tools/flashattn/steps_table.hpp"

#include <cctype>

#include "common/npy.hpp"
#include "reference/reference.hpp"
#include "steps/01_naive/step01.hpp"
#include "steps/02_fused/step02.hpp"
#include "steps/03_online_softmax/step03.hpp"
#include "steps/04_kv_outer/step04.hpp"
#include "steps/05_backward/step05.hpp"
#include "steps/06_tensor_cores/step06.hpp"
#include "steps/07_hopper/step07.hpp"
#include "steps/08_split_kv/step08.hpp"
#include "steps/08_split_kv/trace.hpp"
#include "steps/09_ring/trace.hpp"
#ifdef FA_HAVE_CUDA
#include "common/gpu.hpp"
#endif

namespace fa {
namespace {

// GPU entry points exist only in CUDA builds; elsewhere the rows keep their CPU
// models and formulas, and running the kernel says that it needs a GPU.
#ifdef FA_HAVE_CUDA
#define FA_GPU(x) (&(x))
#else
#define FA_GPU(x) nullptr
#endif

using ForwardFn = std::function<ForwardOut(const Problem&, const Qkv&)>;
using BackwardFn = std::function<Grads(const Problem&, const Qkv&, const ForwardOut&, const std::vector<float>&)>;

ForwardFn on_gpu(const GpuForward* s, bool softmax) {
  return [s, softmax](const Problem& p, const Qkv& in) -> ForwardOut {
#ifdef FA_HAVE_CUDA
    return gpu::forward(*s, p, in, softmax);
#else
    (void)p, (void)in, (void)softmax;
    throw Error(std::string(s ? s->name : "this step") + " needs a GPU, and this build has no CUDA");
#endif
  };
}
BackwardFn on_gpu(const GpuBackward* s) {
  return [s](const Problem& p, const Qkv& in, const ForwardOut& f, const std::vector<float>& dout) -> Grads {
#ifdef FA_HAVE_CUDA
    return gpu::backward(*s, p, in, f, dout);
#else
    (void)p, (void)in, (void)f, (void)dout;
    throw Error(std::string(s ? s->name : "this step") + " needs a GPU, and this build has no CUDA");
#endif
  };
}

/// Step 04's group size follows the GPU's SM count; without a GPU, the H200's 132.
int sms() {
#ifdef FA_HAVE_CUDA
  static const int n = gpu::available() ? gpu::sm_count() : 132;
  return n;
#else
  return 132;
#endif
}


/// Step 09's simulated ranks: R as asked, or the most of 4, 2, 1 that divide N into 2R chunks.
int ring_ranks(const Problem& p, int asked) {
  if (asked > 0) return asked;
  for (int r : {4, 2})
    if (p.N % (2 * r) == 0) return r;
  return 1;
}

/// Step 09's model as a model of the table (its traffic is what the ranks send, not HBM).
ModelForward ring_model(const Problem& p, const Qkv& in, online::Trace* trace, int ranks) {
  return {step09::model_forward(p, in, ring_ranks(p, ranks), trace).out, {}};
}

std::vector<StepEntry> make_table() {
  std::vector<StepEntry> t;
  t.push_back({"reference", "CPU, Eigen, fp64 accumulation: S, P, O in full", false, true,
               [](const Problem& p, const Qkv& in) { return reference::forward(p, in); },
               [](const Problem& p, const Qkv& in, const ForwardOut&, const std::vector<float>& dout) {
                 return reference::backward(p, in, dout);
               },
               {}, {}, {}, {}, nullptr, nullptr, "notes/00_reference.md"});
  // model: the CPU model of the same algorithm; traffic: the note's formula (the
  // tests assert that the two agree).
  t.push_back({"01", "naive: S and P (NxN) written to device memory", true, true,
               on_gpu(FA_GPU(step01::kForward), true), on_gpu(FA_GPU(step01::kBackward)),
               [](const Problem& p, const Qkv& in) { return step01::model_forward(p, in, true); },
               step01::model_backward,
               [](const Problem& p) { return step01::traffic_forward(p, true); }, step01::traffic_backward,
               FA_GPU(step01::kForward), FA_GPU(step01::kBackward), "notes/01_naive.md"});
  t.push_back({"02", "fused, no softmax: O = (scale*QK^T)V, K/V tiled", true, false,
               on_gpu(FA_GPU(step02::kForward), false), {},
               [](const Problem& p, const Qkv& in) { return step02::model_forward(p, in); }, {},
               [](const Problem& p) { return step02::traffic_forward(p); }, {},
               FA_GPU(step02::kForward), nullptr, "notes/02_fused.md"});
  t.push_back({"03", "online softmax, Q outer: m, l, O kept on chip", true, true,
               on_gpu(FA_GPU(step03::kForward), true), {},
               [](const Problem& p, const Qkv& in) { return step03::model_forward(p, in); }, {},
               [](const Problem& p) { return step03::traffic_forward(p); }, {}, FA_GPU(step03::kForward), nullptr,
               "notes/03_online_softmax.md"});
  t.back().model_traced = [](const Problem& p, const Qkv& in, online::Trace* trace, int) {
    step03::ModelOptions opt;
    opt.trace = trace;
    return step03::model_forward(p, in, opt);
  };
  t.push_back({"04", "K/V outer (Algorithm 1): m, l, O in device memory", true, true,
               on_gpu(FA_GPU(step04::kForward), true), {},
               [](const Problem& p, const Qkv& in) { return step04::model_forward(p, in, step04::default_group(p, sms())); },
               {}, [](const Problem& p) { return step04::traffic_forward(p, step04::default_group(p, sms())); }, {},
               FA_GPU(step04::kForward), nullptr, "notes/04_kv_outer.md"});
  t.back().model_traced = [](const Problem& p, const Qkv& in, online::Trace* trace, int) {
    return step04::model_forward(p, in, step04::default_group(p, sms()), {}, trace);
  };
  t.push_back({"05", "backward by recomputation (its forward: step 04)", true, true,
               on_gpu(FA_GPU(step04::kForward), true), on_gpu(FA_GPU(step05::kBackward)),
               [](const Problem& p, const Qkv& in) { return step04::model_forward(p, in, step04::default_group(p, sms())); },
               step05::model_backward, {}, step05::traffic_backward, nullptr, FA_GPU(step05::kBackward), "notes/05_backward.md"});
  t.push_back({"06", "tensor cores (mma.sync), bf16/fp16, FA-2 style", true, true,
               on_gpu(FA_GPU(step06::kForward), true), on_gpu(FA_GPU(step06::kBackward)), step06::model_forward,
               step06::model_backward, step06::traffic_forward, step06::traffic_backward, FA_GPU(step06::kForward),
               FA_GPU(step06::kBackward), "notes/06_tensor_cores.md", DType::bf16});
#ifdef FA_HAVE_CUDA
  for (const GpuForward& v : step06::kForwardVersions) t.back().forward_versions.push_back(&v);
  for (const GpuBackward& v : step06::kBackwardVersions) t.back().backward_versions.push_back(&v);
#endif
  t.push_back({"07", "Hopper: TMA, wgmma, warp-specialised, FA-3 style", true, true,
               on_gpu(FA_GPU(step07::kForward), true), on_gpu(FA_GPU(step07::kBackward)), step07::model_forward,
               step07::model_backward, step07::traffic_forward, step07::traffic_backward, FA_GPU(step07::kForward),
               FA_GPU(step07::kBackward), "notes/07_hopper.md", DType::bf16});
#ifdef FA_HAVE_CUDA
  for (const GpuForward& v : step07::kForwardVersions) t.back().forward_versions.push_back(&v);
  t.back().backward_versions.push_back(&step07::kBackwardDeterministic);
#endif
  // Step 08's model and traffic take the H200's split plan (the kernel takes its GPU's).
  t.push_back({"08", "split K/V for decoding: the merge across blocks", true, true,
               on_gpu(FA_GPU(step08::kForward), true), {},
               [](const Problem& p, const Qkv& in) { return step08::model_forward(p, in, h200_plan(p)); },
               {}, [](const Problem& p) { return step08::traffic_forward(p, h200_plan(p)); }, {},
               FA_GPU(step08::kForward), nullptr, "notes/08_split_kv.md", DType::bf16});
#ifdef FA_HAVE_CUDA
  for (const GpuForward& v : step08::kForwardFixed) t.back().forward_versions.push_back(&v);
  t.back().forward_versions.push_back(&step08::kForwardSmallBlocks);
  t.back().forward_versions.push_back(&step08::kLessonOneSplit);
  t.back().forward_versions.push_back(&step08::kLessonFold);
  t.back().forward_versions.push_back(&step08::kLessonStatsFirst);
#endif
  t.back().model_traced = [](const Problem& p, const Qkv& in, online::Trace* trace, int) {
    return step08::model_forward(p, in, h200_plan(p), trace);
  };
  // Step 09 runs across GPUs, one process a rank (ring09); here, its model: R ranks in
  // one process, each local call step 06's model.
  t.push_back({"09", "ring attention: K/V blocks passed round R ranks", false, true, {}, {},
               [](const Problem& p, const Qkv& in) { return ring_model(p, in, nullptr, 0); }, {}, {}, {}, nullptr,
               nullptr, "notes/09_ring.md", DType::bf16});
  t.back().model_traced = ring_model;
  t.back().kernel_elsewhere = "ring09 (NCCL, one process a GPU)";
  return t;
}

}  // namespace

/// Step 08's plan on the H200 (its parts merged in clusters where the H200 merges them so).
step08::SplitPlan h200_plan(const Problem& p) { return step08::with_clusters(step08::plan(p, step08::kH200), step08::kH200); }

const std::vector<StepEntry>& step_table() {
  static const std::vector<StepEntry> table = make_table();
  return table;
}

const StepEntry& find_step(const std::string& id) {
  std::string key = id;
  if (key.rfind("step", 0) == 0) key = key.substr(4);
  if (key.size() == 1 && std::isdigit(static_cast<unsigned char>(key[0]))) key = "0" + key;
  for (const auto& s : step_table())
    if (s.id == key) return s;
  std::string known;
  for (const auto& s : step_table()) known += (known.empty() ? "" : ", ") + s.id;
  throw Error("unknown step '" + printable(id, 40) + "' (this build has: " + known + ")");
}

std::vector<StepEntry> version_rows(const StepEntry& s) {
  auto id = [&](const char* name) { return s.id + std::string(name).substr(0, std::string(name).find(':')); };
  std::vector<StepEntry> rows;
  for (const GpuForward* v : s.forward_versions) {
    rows.push_back(s);
    rows.back().id = id(v->name), rows.back().gpu_forward = v, rows.back().gpu_backward = nullptr;
  }
  for (const GpuBackward* v : s.backward_versions) {
    rows.push_back(s);
    rows.back().id = id(v->name), rows.back().gpu_forward = nullptr, rows.back().gpu_backward = v;
  }
  return rows;
}

StepEntry find_kernels(const std::string& id) {
  for (const auto& s : step_table())
    if (id.size() > s.id.size() && id.rfind(s.id, 0) == 0 && !std::isdigit(static_cast<unsigned char>(id[s.id.size()]))) {
      std::string known;
      for (const StepEntry& v : version_rows(s)) {
        if (v.id == id) return v;
        known += (known.empty() ? "" : ", ") + v.id;
      }
      throw Error("step " + s.id + " has no version '" + printable(id, 40) + "' (" +
                  (known.empty() ? "it has none" : "its versions: " + known) + ")");
    }
  return find_step(id);
}

}  // namespace fa
