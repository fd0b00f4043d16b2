// Step 06 — tensor cores: steps 03 and 05 on mma.sync, FlashAttention-2 style.
// Note: notes/06_tensor_cores.md.
//
// Adds over steps 03–05: 16-bit inputs (bf16, fp16) and the tensor cores. The forward
// (forward.cu, forward.cuh) gives each warp whole query rows, runs the online softmax on
// the mma accumulators in registers and hands P to O += P·V without shared memory; the
// backward (backward.cu, backward.cuh) keeps dK, dV of a key block in registers and adds
// dQ by fp32 atomics, in FlashAttention-2's warp layouts from d = 96 on. The warp-level
// instructions are common/cuda/mma.cuh. The rows of the note's tables: versions_*.cu.
// Leaves for step 07: Hopper's TMA and wgmma. Limits: d = 32, 64, 96, 128, 256; sm_80 on.
#pragma once

#include "common/compare.hpp"
#include "common/hd.hpp"
#include "common/hbm.hpp"
#include "common/step_api.hpp"

namespace fa::step06 {

/// The forward's block: `warps` warps of `m_tiles` 16-row mma tiles each, `keys` keys
/// per K/V block. Read by the kernel's launch and by the CPU model alike.
struct FwdTile {
  int warps;    ///< warps per thread block
  int m_tiles;  ///< 16-row tiles per warp: B_r = 16·m_tiles·warps
  int keys;     ///< keys per K/V block (B_c)
  FA_HD constexpr int rows() const { return 16 * m_tiles * warps; }
  FA_HD constexpr int threads() const { return 32 * warps; }
};
/// One table for every case (note 06, "The forward kernel"): causal at d ≤ 64, 64 rows
/// (less work on the diagonal); else d ≤ 64, 128 keys (per-block costs shared by more
/// products); d = 256, one tile a warp (its O accumulator alone is 128 floats a thread).
FA_HD constexpr FwdTile forward_tile(bool causal, int d) {
  if (d == 256) return {8, 1, 64};
  if (d <= 64) return causal ? FwdTile{4, 1, 64} : FwdTile{4, 2, 128};
  return {4, 2, 64};
}
constexpr int forward_br(bool causal, int d) { return forward_tile(causal, d).rows(); }  ///< B_r
constexpr int forward_bc(bool causal, int d) { return forward_tile(causal, d).keys; }    ///< B_c
constexpr float kLog2e = 1.4426950408889634f;  ///< e^x = 2^(x·log2 e): one FFMA + ex2 (note 06, "exp2")
/// O and ℓ are rescaled only when a row's max grows by more than 2^kRescaleBits:
/// probabilities stay ≤ 256, exact in fp32 (note 06, "lazy rescaling").
constexpr float kRescaleBits = 8.0f;
/// Backward keys per block: 128, 64 at d = 256 where dK, dV must still fit in registers
/// (note 06, "The backward kernels").
FA_HD constexpr int backward_keys(int d) { return d == 256 ? 64 : 128; }
constexpr int kBwdQueries = 64;  ///< backward: queries per step of the inner loop
/// Compute capability ×10 of the oldest GPU (mma.sync on bf16, cp.async: sm_80).
constexpr int kMinSm = 80;
inline constexpr int kSupportedD[] = {32, 64, 96, 128, 256, 0};  ///< the production kernels
inline constexpr int kVersionD[] = {64, 128, 0};                 ///< the note's rows

/// Throws fa::Error unless p is bf16 or fp16 self-attention with d in kSupportedD.
void require_supported(const Problem& p);
/// The same check for any 16-bit step named `step`, its 0-terminated head dimensions
/// only_d, and what it takes beyond self-attention.
void require_lowp(const Problem& p, const char* step, const int* only_d, unsigned takes = Problem::kSelfAttention);

/// CPU model: the kernel's tiles, rounding where it rounds (inputs, P, O).
ModelForward model_forward(const Problem& p, const Qkv& in);
Traffic traffic_forward(const Problem& p);  ///< elements (×2 bytes, L ×4)
/// The same for blocks of br × bc (step 07's tiles; p not checked against kSupportedD).
ModelForward model_forward_tiled(const Problem& p, const Qkv& in, int br, int bc);
Traffic traffic_forward_tiled(const Problem& p, int br, int bc);

/// The naive same-dtype forward FlashAttention's tests measure against: inputs, S, P,
/// O each rounded to p.dtype, sums in fp32.
ForwardOut naive_lowp(const Problem& p, const Qkv& in);

/// Backward CPU model: the kernel's blocks, rounding where it rounds (inputs, O, Pᵀ and
/// dSᵀ, the gradients); dQ summed over K/V blocks in block order.
ModelBackward model_backward(const Problem& p, const Qkv& in, const ForwardOut& fwd, const std::vector<float>& dout);
/// The same with `keys` keys a block and `queries` a step (step 07's; p not checked).
ModelBackward model_backward_tiled(const Problem& p, const Qkv& in, const ForwardOut& fwd,
                                   const std::vector<float>& dout, int keys, int queries);
/// Elements moved by the three backward kernels (L, D and the dQ accumulator included).
Traffic traffic_backward(const Problem& p);
Traffic traffic_backward_tiled(const Problem& p, int keys, int queries);

/// The naive same-dtype backward: S, P, dP, dS and every gradient rounded to p.dtype.
Grads naive_lowp_backward(const Problem& p, const Qkv& in, const std::vector<float>& dout);

/// Inputs as the device holds them: every element rounded to p.dtype.
Qkv rounded_inputs(const Problem& p, const Qkv& in);
std::vector<float> rounded(const std::vector<float>& x, DType t);

/// Largest |x − ref| over all elements (the error measure of the budget rule).
double max_abs_error(const std::vector<float>& x, const std::vector<float>& ref);

/// Kernel vs its CPU model: both round P and O to 16 bits after fp32 sums in different
/// orders, so a value can round to its 16-bit neighbour: a few units in the last place.
constexpr Tolerance kBf16Reorder{4e-3, 1.6e-2, "bf16 (8-bit mantissa) P and O after reordered fp32 sums"};
constexpr Tolerance kFp16Reorder{5e-4, 2e-3, "fp16 (11-bit mantissa) P and O after reordered fp32 sums"};

extern const GpuForward kForward;
extern const GpuBackward kBackward;
/// The rows of the note's tables before production (versions_forward.cu,
/// versions_backward.cu), for the bench and the tests.
constexpr int kForwardVersionCount = 5;
extern const GpuForward kForwardVersions[kForwardVersionCount];
constexpr int kBackwardVersionCount = 6;
extern const GpuBackward kBackwardVersions[kBackwardVersionCount];

}  // namespace fa::step06
