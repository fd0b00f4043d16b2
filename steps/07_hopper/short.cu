// Step 07's forward for short problems (lesson row h1; production at d = 64 where
// two_blocks_an_sm, step07.hpp): TMA and wgmma without warp specialisation. A block is two
// warpgroups of 64 query rows that both compute; the first thread of consumer 0 also issues
// the copies, one K/V block ahead. Per K/V block each warpgroup in turn:
//   S = Q_c·K_jᵀ   wgmma, both operands in shared memory
//   mask, online softmax on the S accumulators
//   O += P·V_j     wgmma, P from registers (16 bits)
// At d = 64 a thread keeps to 128 registers and a block to 80 KiB of shared memory, so two
// blocks share an SM and one's fixed costs (barriers, first copies, epilogue) run under the
// other's products: where a query block visits few K/V blocks, that beats the specialised
// kernel's one block an SM (note 07, "Short problems").
#include "common/cuda_check.cuh"
#include "steps/07_hopper/forward.cuh"

namespace fa::step07 {
namespace {

constexpr int kConsumers = kShortRows / kRowsPerConsumer;  // two warpgroups, both computing

template <class T, int kD, bool kBanded>
__global__ void __launch_bounds__(128 * kConsumers, kD == 64 ? 2 : 1)
    short_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                 const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap o_map,
                 float* __restrict__ lse, int N, int group, float scale, const Band band, const TileOrder order) {
#if FA_SM90A
  constexpr int kBc = forward_tile(kD).keys, kStages = 2;
  using L = Smem<kD, kBc, kStages, kConsumers>;
  // Declared 1024-aligned, as the kernels of this file were measured: aligned_smem folds away
  // (the dynamic shared memory of a block without static shared memory starts there).
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = aligned_smem(smem_raw);
  Barriers bars(smem + L::bars, kStages);
  const auto [i, bh] = grid_tile(order);  // a block a tile, in forward_order's order (tile_grid)
  const int q0 = i * kShortRows, kvh = bh / group;  // query head bh reads K/V head bh / G
  const auto [first, last] = kv_range(band, N, i, kShortRows, kBc);
  if (threadIdx.x == 0) bars.init(kStages, kConsumers);
  __syncthreads();

  Consumer<T, kD, kBc, kStages, kConsumers, kBanded> w(smem, bars, threadIdx.x / 128, q0, N, scale, band);
  // One computing thread issues the copies: Q and the first block first, then block j+1 at the
  // start of block j (once both consumers have released its stage).
  const bool issuer = threadIdx.x == 0;
  if (issuer) {
    load_q<kD, kBc, kStages, kConsumers>(&q_map, smem, bars, q0, bh);
    load_kv<kD, kBc, kStages, kConsumers>(&k_map, &v_map, smem, bars, first, 0, kvh);
  }
  wait(bars.q_full, 0);

  float alpha[2];
  for (int j = first; j <= last; ++j) {
    const int r = j - first, sj = r % kStages;  // r: the block's place in the ring
    const std::uint32_t phase = (r / kStages) % 2;
    if (issuer && j + 1 <= last) load_kv<kD, kBc, kStages, kConsumers>(&k_map, &v_map, smem, bars, j + 1, r + 1, kvh);
    wait(&bars.k_full[sj], phase);
    w.issue_qk(sj);
    w.wait_s();
    w.release_k(sj);
    w.mask(j);
    if (w.softmax(alpha)) w.rescale_o(alpha);
    w.to_p();
    wait(&bars.v_full[sj], phase);
    w.issue_pv(sj);
    w.wait_pv();
    w.release_v(sj);
  }
  w.store(&o_map, lse, bh, scale, w.q_buffer());
  stored();
#endif
}

template <class T, int kD, bool kBanded>
void launch(const Problem& p, const NativeFwdArgs& a, Stream stream) {
  constexpr int kBc = forward_tile(kD).keys;
  const ForwardMaps m = forward_maps(p, a, kBc);
  const TileOrder order = forward_order(p, kShortRows);
  const std::size_t smem = Smem<kD, kBc, 2, kConsumers>::bytes + 1024;  // + the base's alignment
  set_smem_limit(short_kernel<T, kD, kBanded>, smem);
  short_kernel<T, kD, kBanded><<<tile_grid(order), 128 * kConsumers, smem, stream>>>(
      m.q, m.k, m.v, m.o, a.lse, p.N, p.group(), p.softmax_scale(), band_of(p), order);
  FA_CHECK_LAUNCH();
}

template <int kD>
void run_d(const Problem& p, const NativeFwdArgs& a, Stream s) {
  with_band(p, [&]<bool kBanded>() {
    p.dtype == DType::bf16 ? launch<__nv_bfloat16, kD, kBanded>(p, a, s) : launch<__half, kD, kBanded>(p, a, s);
  });
}

static_assert(forward_shape(64, 1024, false).rows == kShortRows && forward_shape(64, 1024, false).keys == 128,
              "the short problems' block (forward_shape, the CPU model's) is this kernel's");

}  // namespace

/// Production takes it at d = 64 (two_blocks_an_sm); lesson row h1 at every d.
void run_short(const Problem& p, const NativeFwdArgs& a, Stream s) {
  switch (p.d) {
    case 64: return run_d<64>(p, a, s);
    case 128: return run_d<128>(p, a, s);
    default: return run_d<256>(p, a, s);  // gpu::forward checked d against kSupportedD
  }
}

}  // namespace fa::step07
