// Step 06 — tensor cores: step 03's algorithm on mma.sync, FlashAttention-2 style.
//
// Adds over step 03: 16-bit inputs (bf16 or fp16) and the tensor cores. Each warp
// owns 16 query rows of a B_r = 64 block; S = Q·Kᵀ and O += P·V are mma.sync
// m16n8k16 products with fp32 accumulators, and the online softmax runs on the
// accumulator fragments in registers: a row's statistics m, ℓ never leave the four
// lanes that hold it. P goes from the S accumulators straight into the A operand
// of the P·V product, rounded to 16 bits (the one rounding inside the algorithm).
// Version 2: fragments come from padded shared memory by ldmatrix, K/V tiles by
// cp.async into two buffers (version 1, plain 32-bit shared loads and synchronous
// tiles, is in git history and in the note's table).
// Leaves for later versions (issue 7): a swizzled layout, exp2 with the scale
// folded in, larger blocks, the backward.
// Limits: d = 64 or 128; forward only. Note: notes/06_tensor_cores.md.
#pragma once

#include "common/compare.hpp"
#include "common/hbm.hpp"
#include "common/step_api.hpp"

namespace fa::step06 {

constexpr int kBr = 64;  ///< query rows per thread block: 4 warps × 16
constexpr int kBc = 64;  ///< keys per K/V block

/// CPU model: the kernel's tiles, rounding where it rounds (inputs, P before P·V,
/// O at the end). p.dtype is bf16 or fp16.
ModelForward model_forward(const Problem& p, const Qkv& in);
Traffic traffic_forward(const Problem& p);  ///< elements (×2 bytes, L ×4)

/// The naive same-dtype computation that FlashAttention's tests measure against:
/// inputs, S, P and O each rounded to p.dtype, sums in fp32.
ForwardOut naive_lowp(const Problem& p, const Qkv& in);

/// Largest |x − ref| over all elements (the error measure of the budget rule).
double max_abs_error(const std::vector<float>& x, const std::vector<float>& ref);

/// Kernel vs its CPU model: both round P and O to 16 bits, after fp32 sums in
/// different orders, so a probability can round to the neighbouring 16-bit value:
/// a few units in the last place of O.
constexpr Tolerance kBf16Reorder{4e-3, 1.6e-2, "bf16 (8-bit mantissa) P and O after reordered fp32 sums"};
constexpr Tolerance kFp16Reorder{5e-4, 2e-3, "fp16 (11-bit mantissa) P and O after reordered fp32 sums"};

extern const GpuForward kForward;

}  // namespace fa::step06
