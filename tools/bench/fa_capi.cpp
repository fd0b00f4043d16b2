// libfa_capi.so (fa_capi.h): the steps' GPU kernels behind a C interface. tools/bench/ab.py
// loads it with ctypes to time a step and PyTorch's attention in one process, on the same
// tensors, in alternation — so that neither side is measured on a GPU in another state
// (warmer, busier) than the other. The plan checks once, untimed; the forward and backward
// calls launch, and nothing else: what the timer sees.
#include <cuda_runtime.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "common/gpu.hpp"
#include "tools/bench/fa_capi.h"
#include "tools/flashattn/steps_table.hpp"

namespace {

struct Plan {
  fa::Problem p;
  int sequences = 0;  ///< a ragged batch's (fa_forward_ragged)
  const fa::GpuForward* forward = nullptr;
  const fa::GpuBackward* backward = nullptr;
};

void say(char* err, int n, const std::string& what) {
  if (err && n > 0) std::snprintf(err, std::size_t(n), "%s", what.c_str());
}

/// Runs f, turning an exception into `err` and a return code of 1. (The steps check
/// their own launches, FA_CHECK_LAUNCH: a failed launch is an exception here too.)
template <class F>
int guarded(char* err, int n, F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    say(err, n, e.what());
    return 1;
  }
}

/// The step's kernel for one direction, checked against p: its workspace into *bytes.
template <class Step>
const Step* checked(const Step* step, const fa::StepEntry& e, const char* direction, const fa::Problem& p,
                    unsigned long long* bytes) {
  if (!step) throw fa::Error("step " + e.id + " has no GPU " + direction);
  fa::gpu::check_runnable(*step, p);
  *bytes = step->workspace_bytes(p);
  return step;
}

}  // namespace

extern "C" {

FA_CAPI void* fa_plan(const char* step, int backward, const fa_shape* s, unsigned long long* workspace_bytes, char* err,
                      int n) {
  void* made = nullptr;
  guarded(err, n, [&] {
    const fa::StepEntry e = fa::find_kernels(step);
    auto plan = std::make_unique<Plan>();
    fa::Problem& p = plan->p;
    p.B = s->B, p.H = s->H, p.H_kv = s->H_kv, p.N = s->N, p.N_kv = s->N_kv, p.d = s->d, p.causal = s->causal != 0;
    if (s->scale != 0.0f) p.scale = s->scale;
    if (s->windowed) p.window_left = s->window_left, p.window_right = s->window_right;
    if (s->dtype < 0 || s->dtype > 2) throw fa::Error("dtype must be 0 (fp32), 1 (bf16) or 2 (fp16)");
    p.dtype = fa::DType(s->dtype);
    if (s->sequences) {  // a ragged batch: what the shape must be, before the GPU is asked
      if (backward ? !e.gpu_backward || !e.gpu_backward->ragged_workspace_bytes
                   : !e.gpu_forward || !e.gpu_forward->ragged_workspace_bytes)
        throw fa::Error("step " + e.id + " takes no ragged batch " + (backward ? "backward" : "forward"));
      if (s->sequences < 1 || p.B != 1)
        throw fa::Error("a ragged batch is B = 1 and at least one sequence (got " + p.str() + ", " +
                        std::to_string(s->sequences) + " sequences)");
      if (p.dtype == fa::DType::fp32) throw fa::Error("a ragged batch is bf16 or fp16");
      plan->sequences = s->sequences;
    }
    if (backward)
      plan->backward = checked(e.gpu_backward, e, "backward", p, workspace_bytes);
    else
      plan->forward = checked(e.gpu_forward, e, "forward", p, workspace_bytes);
    if (plan->sequences)
      *workspace_bytes = backward ? plan->backward->ragged_workspace_bytes(p, plan->sequences)
                                  : plan->forward->ragged_workspace_bytes(p, plan->sequences);
    made = plan.release();
  });
  return made;
}

FA_CAPI void fa_free_plan(void* plan) { delete static_cast<Plan*>(plan); }

FA_CAPI int fa_forward(const void* plan, const void* q, const void* k, const void* v, void* o, float* lse, void* workspace,
               void* stream, char* err, int n) {
  const auto* pl = static_cast<const Plan*>(plan);
  return guarded(err, n, [&] {
    if (!pl || !pl->forward) throw fa::Error("fa_forward needs a forward plan");
    if (pl->sequences) throw fa::Error("a ragged batch's plan: fa_forward_ragged, with its offsets");
    const auto st = static_cast<fa::Stream>(stream);
    if (pl->p.dtype == fa::DType::fp32)
      pl->forward->run(pl->p, {static_cast<const float*>(q), static_cast<const float*>(k),
                               static_cast<const float*>(v), static_cast<float*>(o), lse}, workspace, st);
    else
      pl->forward->run_native(pl->p, {q, k, v, o, lse}, workspace, st);
  });
}

FA_CAPI int fa_forward_ragged(const void* plan, const void* q, const void* k, const void* v, void* o, float* lse,
                              const int* offsets, void* workspace, void* stream, char* err, int n) {
  const auto* pl = static_cast<const Plan*>(plan);
  return guarded(err, n, [&] {
    if (!pl || !pl->forward || !pl->sequences) throw fa::Error("fa_forward_ragged needs a ragged batch's forward plan");
    if (!offsets) throw fa::Error("fa_forward_ragged needs the offsets");
    pl->forward->run_native(pl->p, {q, k, v, o, lse, {offsets, pl->sequences}}, workspace,
                            static_cast<fa::Stream>(stream));
  });
}

FA_CAPI int fa_forward_paged(const void* plan, const void* q, const void* k, const void* v, void* o, float* lse,
                             const int* table, const int* lengths, int page, int pool, void* workspace, void* stream,
                             char* err, int n) {
  const auto* pl = static_cast<const Plan*>(plan);
  return guarded(err, n, [&] {
    if (!pl || !pl->forward || pl->sequences) throw fa::Error("fa_forward_paged needs a forward plan, not a ragged one");
    if (!pl->forward->paged) throw fa::Error(std::string(pl->forward->name) + " does not take a paged K/V cache");
    if (page < 16 || page > 256 || page % 16)
      throw fa::Error("a page holds 16 to 256 positions, a multiple of 16 (got " + std::to_string(page) + ")");
    if (pool < 1) throw fa::Error("a paged cache needs at least one page");
    if (!table) throw fa::Error("fa_forward_paged needs the page table");
    pl->forward->run_native(pl->p, {q, k, v, o, lse, {}, {table, lengths, page, pool}}, workspace,
                            static_cast<fa::Stream>(stream));
  });
}

FA_CAPI int fa_backward(const void* plan, const void* q, const void* k, const void* v, const void* o, const float* lse,
                const void* dout, void* dq, void* dk, void* dv, void* workspace, void* stream, char* err, int n) {
  const auto* pl = static_cast<const Plan*>(plan);
  return guarded(err, n, [&] {
    if (!pl || !pl->backward) throw fa::Error("fa_backward needs a backward plan");
    if (pl->sequences) throw fa::Error("a ragged batch's plan: fa_backward_ragged, with its offsets");
    const auto st = static_cast<fa::Stream>(stream);
    if (pl->p.dtype == fa::DType::fp32) {
      auto f = [](const void* x) { return static_cast<const float*>(x); };
      pl->backward->run(pl->p, {f(q), f(k), f(v), f(o), lse, f(dout), static_cast<float*>(dq),
                                static_cast<float*>(dk), static_cast<float*>(dv)}, workspace, st);
    } else {
      pl->backward->run_native(pl->p, {q, k, v, o, lse, dout, dq, dk, dv}, workspace, st);
    }
  });
}

FA_CAPI int fa_backward_ragged(const void* plan, const void* q, const void* k, const void* v, const void* o,
                               const float* lse, const void* dout, void* dq, void* dk, void* dv, const int* offsets,
                               void* workspace, void* stream, char* err, int n) {
  const auto* pl = static_cast<const Plan*>(plan);
  return guarded(err, n, [&] {
    if (!pl || !pl->backward || !pl->sequences)
      throw fa::Error("fa_backward_ragged needs a ragged batch's backward plan");
    if (!offsets) throw fa::Error("fa_backward_ragged needs the offsets");
    pl->backward->run_native(pl->p, {q, k, v, o, lse, dout, dq, dk, dv, {offsets, pl->sequences}}, workspace,
                             static_cast<fa::Stream>(stream));
  });
}

}  // extern "C"
