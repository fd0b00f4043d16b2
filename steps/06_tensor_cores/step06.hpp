// Step 06 — tensor cores: steps 03 and 05 on mma.sync, FlashAttention-2 style.
//
// Adds over steps 03–05: 16-bit inputs (bf16 or fp16) and the tensor cores.
// Forward (forward.cu): each warp owns 16 or 32 query rows of a block (forward_tile);
// S = Q·Kᵀ and O += P·V are mma.sync m16n8k16 products with fp32 accumulators, and
// the online softmax runs on the accumulator fragments in registers: a row's
// statistics m, ℓ never leave the four lanes that hold it. P goes from the S
// accumulators straight into the A operand of the P·V product, rounded to 16 bits
// (the one rounding inside the algorithm). Fragments come from swizzled shared memory
// by ldmatrix, K/V tiles by cp.async into two buffers, exp is exp2 with the scale
// folded in, the mask is applied only on the blocks it can touch, O and ℓ are
// rescaled only when a row's max jumps by more than 2^8, and with the causal mask the
// longest query blocks are launched first.
// Backward (backward.cu, backward.cuh): K/V outer (a block owns 128 keys and their
// dK, dV in registers), P and dS rebuilt per query block on tensor cores, dQ added
// into an fp32 accumulator with atomics; from d = 96 on the work is split in
// FlashAttention-2's warp layouts with Pᵀ and dSᵀ through shared memory. mma.cuh holds
// the pieces both use. The versions of note 06's tables, one idea at a time, are
// versions_forward.cu and versions_backward.cu.
// Limits: d = 32, 64, 96, 128 or 256 (the versions: 64, 128); d = 32 and 96 are
// computed in shared tiles of 64 and 128 columns. GPUs: sm_80 and newer (kMinSm). The
// forward also takes decoding shapes (N_kv ≠ N, H_kv ≠ H: step 08's baseline); the
// backward takes self-attention only.
// Note: notes/06_tensor_cores.md.
#pragma once

#include "common/compare.hpp"
#include "common/hd.hpp"
#include "common/hbm.hpp"
#include "common/step_api.hpp"

namespace fa::step06 {

/// The forward kernel's block shape: `warps` warps, each owning `m_tiles` 16-row mma
/// tiles of query rows, and `keys` keys per K/V block. One table for every d (what
/// measured fastest: note 06), read by the kernel's launch and the CPU model alike.
struct FwdTile {
  int warps;    ///< warps per thread block
  int m_tiles;  ///< 16-row tiles per warp: 16·m_tiles·warps query rows per block (B_r)
  int keys;     ///< keys per K/V block (B_c)
  FA_HD constexpr int rows() const { return 16 * m_tiles * warps; }
  FA_HD constexpr int threads() const { return 32 * warps; }
};
/// 128 query rows (32 per warp) and 64 keys, except: at d ≤ 64 with the causal mask 64
/// rows (16 per warp: less work wasted on the diagonal, twice the blocks to balance);
/// at d ≤ 64 without it 128 keys (the per-block costs shared by twice the products);
/// at d = 256 8 warps of 16 rows (128 fp32 accumulators a thread for 16 rows).
FA_HD constexpr FwdTile forward_tile(bool causal, int d) {
  if (d == 256) return {8, 1, 64};
  if (d <= 64) return causal ? FwdTile{4, 1, 64} : FwdTile{4, 2, 128};
  return {4, 2, 64};
}
constexpr int forward_br(bool causal, int d) { return forward_tile(causal, d).rows(); }  ///< B_r
constexpr int forward_bc(bool causal, int d) { return forward_tile(causal, d).keys; }    ///< B_c
constexpr float kLog2e = 1.4426950408889634f;  ///< log2(e): e^x = 2^(x·log2 e)
/// Forward: O and ℓ are rescaled only when a row's max grows by more than 2^8
/// (in log2 units; v13): until then the old max stays the reference.
constexpr float kRescaleBits = 8.0f;
/// Backward: keys per thread block — 4 warps × 32 at d ≤ 64; at d = 96 and 128 8 warps,
/// 4 × 32 along the keys (b8 on); at d = 256 8 warps, 2 × 32.
FA_HD constexpr int backward_keys(int d) { return d == 256 ? 64 : 128; }
constexpr int kBwdQueries = 64;  ///< backward: queries per step of the inner loop
/// The oldest GPU step 06 runs on, compute capability ×10: sm_80 (A100, RTX 30xx/40xx,
/// H100/H200). Older architectures (sm_75, a T4) have its kernels compiled out (mma.cuh).
constexpr int kMinSm = 80;
inline constexpr int kSupportedD[] = {32, 64, 96, 128, 256, 0};  ///< the production kernels
inline constexpr int kVersionD[] = {64, 128, 0};                 ///< the versions of the note's tables

/// Throws fa::Error unless p is bf16 or fp16 self-attention with d in kSupportedD.
void require_supported(const Problem& p);
/// The same check for any 16-bit step: `step` names it in the message, only_d is its
/// 0-terminated list of head dimensions (step 07's too); with `decode`, N_kv ≠ N and
/// H_kv ≠ H are taken.
void require_lowp(const Problem& p, const char* step, const int* only_d, bool decode = false);

/// CPU model: the kernel's tiles, rounding where it rounds (inputs, P before P·V,
/// O at the end). p.dtype is bf16 or fp16; N_kv and H_kv as the kernel takes them.
ModelForward model_forward(const Problem& p, const Qkv& in);
Traffic traffic_forward(const Problem& p);  ///< elements (×2 bytes, L ×4)
/// The same model and traffic for blocks of br query rows × bc keys (step 07's tiles;
/// p is not checked against step 06's head dimensions).
ModelForward model_forward_tiled(const Problem& p, const Qkv& in, int br, int bc);
Traffic traffic_forward_tiled(const Problem& p, int br, int bc);

/// The naive same-dtype computation that FlashAttention's tests measure against:
/// inputs, S, P and O each rounded to p.dtype, sums in fp32.
ForwardOut naive_lowp(const Problem& p, const Qkv& in);

/// Backward CPU model: the kernel's blocks, rounding where it rounds (inputs, O,
/// Pᵀ and dSᵀ before their products, the gradients at the end), dQ summed in fp32
/// over K/V blocks in block order (the kernel's atomics add in any order).
ModelBackward model_backward(const Problem& p, const Qkv& in, const ForwardOut& fwd, const std::vector<float>& dout);
/// The same with blocks of `keys` keys visiting the query blocks `queries` at a time
/// (step 07's blocks; no check of p).
ModelBackward model_backward_tiled(const Problem& p, const Qkv& in, const ForwardOut& fwd,
                                   const std::vector<float>& dout, int keys, int queries);
/// Elements moved by the three backward kernels (16-bit tensors and fp32 L, D and
/// dQ accumulator alike counted as elements; the note gives the bytes).
Traffic traffic_backward(const Problem& p);
Traffic traffic_backward_tiled(const Problem& p, int keys, int queries);

/// The naive same-dtype backward: S, P, dP, dS and every gradient rounded to p.dtype.
Grads naive_lowp_backward(const Problem& p, const Qkv& in, const std::vector<float>& dout);

/// Inputs as the device holds them: every element rounded to p.dtype.
Qkv rounded_inputs(const Problem& p, const Qkv& in);
std::vector<float> rounded(const std::vector<float>& x, DType t);

/// Largest |x − ref| over all elements (the error measure of the budget rule).
double max_abs_error(const std::vector<float>& x, const std::vector<float>& ref);

/// Kernel vs its CPU model: both round P and O to 16 bits, after fp32 sums in
/// different orders, so a probability can round to the neighbouring 16-bit value:
/// a few units in the last place of O.
constexpr Tolerance kBf16Reorder{4e-3, 1.6e-2, "bf16 (8-bit mantissa) P and O after reordered fp32 sums"};
constexpr Tolerance kFp16Reorder{5e-4, 2e-3, "fp16 (11-bit mantissa) P and O after reordered fp32 sums"};

extern const GpuForward kForward;
constexpr int kForwardVersionCount = 5;
/// The rows of the note's forward table before production (versions_forward.cu).
extern const GpuForward kForwardVersions[kForwardVersionCount];
extern const GpuBackward kBackward;
constexpr int kBackwardVersionCount = 6;
/// The rows of the note's backward table before production (versions_backward.cu).
extern const GpuBackward kBackwardVersions[kBackwardVersionCount];

}  // namespace fa::step06
