// Step 07's host plumbing: TMA tensor maps.
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <string>

#include "common/cuda_check.cuh"
#include "common/gpu.hpp"  // l2_bytes
#include "steps/07_hopper/forward.cuh"
#include "steps/07_hopper/hopper.cuh"
#include "steps/07_hopper/step07.hpp"

namespace fa::step07 {
namespace {

/// The driver's cuTensorMapEncodeTiled, found once through the runtime.
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    FA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || !f)
      throw Error("step07: this CUDA driver has no cuTensorMapEncodeTiled (TMA needs driver 12.0 or newer)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace

CUtensorMap make_tile_map(const void* base, DType t, int N, std::size_t heads, int d, int box_rows,
                          CUtensorMapL2promotion promotion) {
  // Dimensions, innermost first: 64 columns of a panel, N rows, d/64 panels, the heads.
  const cuuint64_t dims[4] = {cuuint64_t(kPanel), cuuint64_t(N), cuuint64_t(d / kPanel), cuuint64_t(heads)};
  // Byte strides of dimensions 1..3 (dimension 0 is contiguous): a row, a panel, a head.
  const cuuint64_t strides[3] = {cuuint64_t(d) * 2, cuuint64_t(kPanel) * 2, cuuint64_t(N) * d * 2};
  const cuuint32_t box[4] = {cuuint32_t(kPanel), cuuint32_t(box_rows), cuuint32_t(d / kPanel), 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  CUtensorMap map{};
  const CUresult r = encode_tiled()(
      &map, t == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
      const_cast<void*>(base), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);  // out of bounds: zeros
  if (r != CUDA_SUCCESS)
    throw Error("step07: cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ") for N = " +
                std::to_string(N) + ", d = " + std::to_string(d) + ", " + std::to_string(box_rows) + "-row boxes");
  return map;
}

TileOrder forward_order(const Problem& p, int rows) {
  // A head's tiles share its K and V: 2·N·d 16-bit elements.
  return tile_order(tiles::q_blocks(p.N, rows), int(p.heads()), p.causal, 4.0 * p.N * p.d, double(gpu::l2_bytes()),
                    gpu::sm_count());
}

ForwardMaps forward_maps(const Problem& p, const NativeFwdArgs& a, int keys) {
  return {make_tile_map(a.q, p.dtype, p.N, p.heads(), p.d, kRowsPerConsumer),
          make_tile_map(a.k, p.dtype, p.N, p.heads(), p.d, keys), make_tile_map(a.v, p.dtype, p.N, p.heads(), p.d, keys),
          make_tile_map(a.o, p.dtype, p.N, p.heads(), p.d, kRowsPerConsumer)};
}

}  // namespace fa::step07
