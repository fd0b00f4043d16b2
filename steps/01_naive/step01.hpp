// Step 01 — naive GPU attention: S and P written to device memory in full.
//
// Adds over the CPU reference: the GPU. Attention is computed the way a framework
// would without fusion (lecture p8–9), one kernel per operation:
//   S = scale·Q·Kᵀ   (tiled GEMM)          → N×N per head in device memory
//   P = softmax(S)   (one block per row)   → N×N per head in device memory, and L
//   O = P·V          (tiled GEMM)
// plus the no-softmax path O = (scale·QKᵀ)V that step 02 fuses, and the standard
// backward that materializes P, dP and dS.
// Leaves for step 02: fusion — never writing S to device memory.
// Limits: device memory grows as 2·B·H·N²·4 bytes; the launcher refuses, with the
// numbers, a problem the GPU cannot hold. Any d.
// Note: notes/01_naive.md.
#pragma once

#include <vector>

#include "common/hbm.hpp"
#include "common/problem.hpp"
#include "common/step_api.hpp"

namespace fa::step01 {

/// Square tile of the GEMM kernel: a 32×32 block of C per thread block, the
/// inner dimension walked 32 at a time through shared memory.
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
