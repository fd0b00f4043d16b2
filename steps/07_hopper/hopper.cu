// Step 07's host plumbing: the forward's tensor maps and the order of its tiles.
#include "common/gpu.hpp"  // l2_bytes, sm_count
#include "steps/07_hopper/forward.cuh"

namespace fa::step07 {

TileOrder forward_order(const Problem& p, int rows) {
  // A head's tiles share its K and V, 2·N·d 16-bit elements, and G query heads one K/V head.
  return tile_order(tiles::q_blocks(p.N, rows), int(p.heads()), p.causal, 4.0 * p.N * p.d / p.group(),
                    double(gpu::l2_bytes()), gpu::sm_count());
}

ForwardMaps forward_maps(const Problem& p, const NativeFwdArgs& a, int keys) {
  return {make_tile_map(a.q, p.dtype, p.N, p.heads(), p.d, kRowsPerConsumer),
          make_tile_map(a.k, p.dtype, p.N, p.kv_heads(), p.d, keys),
          make_tile_map(a.v, p.dtype, p.N, p.kv_heads(), p.d, keys),
          make_tile_map(a.o, p.dtype, p.N, p.heads(), p.d, kRowsPerConsumer)};
}

}  // namespace fa::step07
