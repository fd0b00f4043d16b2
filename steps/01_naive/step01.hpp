// Step 01 — naive GPU attention: S and P written to device memory in full.
// Adds over the CPU reference: the GPU, one kernel per operation as a framework without
// fusion runs it (lecture p8–9): S = scale·Q·Kᵀ and P = softmax(S), N×N per head in device
// memory, then O = P·V; the no-softmax path step 02 fuses; the backward with P, dP, dS.
// Leaves for step 02: never writing S. Limits: 2·B·H·N² floats of device memory (a
// problem the GPU cannot hold is refused with the numbers); any d. Note: notes/01_naive.md.
#pragma once

#include <vector>

#include "common/hbm.hpp"
#include "common/problem.hpp"
#include "common/step_api.hpp"

namespace fa::step01 {

/// The GEMM's tile: 32×32 of C a thread block, the inner dimension 32 at a time.
constexpr int kTile = 32;

// ---- CPU model: the kernels' algorithm over counted "HBM" arrays -------------
ModelForward model_forward(const Problem& p, const Qkv& in, bool softmax);
ModelBackward model_backward(const Problem& p, const Qkv& in, const ForwardOut& fwd,
                             const std::vector<float>& dout);

// ---- The note's closed-form traffic (elements), which the model must match ---
Traffic traffic_forward(const Problem& p, bool softmax);
Traffic traffic_backward(const Problem& p);

// ---- What attention costs besides traffic (lecture p6, p33–34) -----------------
/// Floating-point operations of the forward's two matrix products, S = QKᵀ and O = PV
/// (a multiply-add is 2): step 01 computes every score, masked or not.
std::uint64_t flops_forward(const Problem& p);
/// Device memory the forward holds at once, in elements: Q, K, V, O, L, and S and P
/// (N×N per head each) — Θ(N²) against step 03's Θ(Nd).
std::uint64_t memory_forward(const Problem& p);

// ---- The GPU step (kernels.cu) ------------------------------------------------
extern const GpuForward kForward;           ///< softmax attention, writes O and L
extern const GpuForward kForwardNoSoftmax;  ///< O = (scale·QKᵀ)V
extern const GpuBackward kBackward;         ///< dQ, dK, dV with P, dP, dS in device memory

/// The backward's first pass, D_i = Σ_c dO_ic·O_ic (one warp per row); step 05 uses it too.
void launch_rowdot(std::size_t rows, int d, const float* dout, const float* o, float* D, Stream s);

}  // namespace fa::step01
