// Step 07's forward as note 07's lesson table builds it, one Hopper idea a row:
//   h1  TMA + wgmma: two warpgroups that both compute, the first thread also issuing the
//       copies (short.cu: production's kernel for short problems at d = 64)
//   h2  + warp specialisation: a producer warpgroup issues the copies and gives its
//       registers to the consumers (setmaxnreg)
//   h3  + ping-pong: the consumers take turns on the tensor cores (named barriers)
//   h4  + in a warpgroup, S_{j+1} issued before P_j·V_j, its softmax under that product
//   h7  h4 with three consumers (192 query rows) at d = 64: production's kernel at d = 256
//       (forward.cu, a block a tile)
//   h9  h7 on a persistent grid, tiles from a counter, O in a tile of its own: production's
//       kernel at d = 64 and 128 (forward.cu)
// h2–h4 are lesson kernels of their own, below: one kernel configured by what each adds
// (FwdVersion), made of the production kernels' pieces (forward.cuh). None changes a row's
// arithmetic, so the tests hold them to production bit for bit.
#include <cstdint>

#include "common/cuda_check.cuh"
#include "steps/07_hopper/forward.cuh"

namespace fa::step07 {
namespace {

constexpr int kConsumers = 2;  // the versions: two consumers, 128 query rows a block
constexpr int kRows = kConsumers * kRowsPerConsumer;
constexpr FwdTile kTile{kConsumers, 128, 2};  // for the registers setmaxnreg gives (240)

/// One lesson row of the forward kernel, by what it adds to h2 (a producer warpgroup).
struct FwdVersion {
  bool pingpong = false;  ///< h3: the consumers take turns issuing their products
  bool overlap = false;   ///< h4: S_{j+1} issued before P_j·V_j; softmax under P·V
};
using Version = FwdVersion (*)();

template <class T, int kD, Version V, bool kBanded>
__global__ void __launch_bounds__(kTile.threads(), 1)
    version_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                   const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap o_map,
                   float* __restrict__ lse, int N, float scale, const Band band, const TileOrder order) {
#if FA_SM90A
  constexpr FwdVersion kV = V();
  constexpr int kBc = forward_tile(kD).keys, kStages = 2;
  using L = Smem<kD, kBc, kStages, kConsumers>;
  // Declared 1024-aligned, as the kernels of this file were measured: aligned_smem folds away
  // (the dynamic shared memory of a block without static shared memory starts there).
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = aligned_smem(smem_raw);
  Barriers bars(smem + L::bars, kStages);
  const auto [i, bh] = grid_tile(order);  // a block a tile, in forward_order's order (tile_grid)
  const int q0 = i * kRows;
  const int last = kv_range(band, N, i, kRows, kBc).last;  // from block 0: the versions take no window
  if (threadIdx.x == 0) bars.init(kStages, kConsumers);
  __syncthreads();

  if (threadIdx.x < 128) {  // the producer warpgroup
    release_registers<kProducerRegs>();
    if (threadIdx.x == 0) produce<kD, kBc, kStages, kConsumers>(&q_map, &k_map, &v_map, smem, bars, q0, 0, last, bh, bh);
    return;
  }
  claim_registers<kTile.consumer_regs()>();
  Consumer<T, kD, kBc, kStages, kConsumers, kBanded> w(smem, bars, (threadIdx.x - 128) / 128, q0, N, scale, band);
  const int c = w.c;
  // Turns on the tensor cores (ping-pong): consumer 1 lets consumer 0 go first; the
  // last turn of consumer 1 hands nothing on, since consumer 0's turns are over.
  auto begin_turn = [&] {
    if (kV.pingpong) named_sync(turn_bar(c), 2 * 128);
  };
  auto end_turn = [&](bool final) {
    if (kV.pingpong && !(final && c == 1)) named_arrive(turn_bar(1 - c), 2 * 128);
  };
  if (kV.pingpong && c == 1) named_arrive(turn_bar(0), 2 * 128);
  wait(bars.q_full, 0);

  if constexpr (!kV.overlap) {
    // Per block, in order: S, softmax, P·V (a turn for each product).
    float alpha[2];
    for (int j = 0; j <= last; ++j) {
      const int sj = j % kStages;
      const std::uint32_t phase = (j / kStages) % 2;
      begin_turn();
      wait(&bars.k_full[sj], phase);
      w.issue_qk(sj);
      end_turn(false);
      w.wait_s();
      w.release_k(sj);
      w.mask(j);
      if (w.softmax(alpha)) w.rescale_o(alpha);
      w.to_p();
      begin_turn();
      wait(&bars.v_full[sj], phase);
      w.issue_pv(sj);
      end_turn(j == last);
      w.wait_pv();
      w.release_v(sj);
    }
  } else {
    // The production schedule (forward.cu): ping-pong and the overlap, its turns taken by
    // the Consumer's own steps.
    static_assert(kV.pingpong, "the overlapped steps take their turns");
    w.first_block(0, 0, 1 - c, [] {});
    for (int j = 1; j <= last; ++j) w.next_block(j, j, 1 - c, [] {});
    w.last_pv(last, 1 - c, c != 1);
  }
  w.store(&o_map, lse, bh, scale, w.q_buffer());
  stored();
#endif
}

template <Version V, class T, int kD, bool kBanded>
void launch(const Problem& p, const NativeFwdArgs& a, Stream stream) {
  constexpr int kBc = forward_tile(kD).keys;
  const ForwardMaps m = forward_maps(p, a, kBc);
  const TileOrder order = forward_order(p, kRows);
  const std::size_t smem = Smem<kD, kBc, 2, kConsumers>::bytes + 1024;
  set_smem_limit(version_kernel<T, kD, V, kBanded>, smem);
  version_kernel<T, kD, V, kBanded><<<tile_grid(order), kTile.threads(), smem, stream>>>(
      m.q, m.k, m.v, m.o, a.lse, p.N, p.softmax_scale(), band_of(p), order);
  FA_CHECK_LAUNCH();
}

template <Version V, int kD>
void run_d(const Problem& p, const NativeFwdArgs& a, Stream s) {
  with_band(p, [&]<bool kBanded>() {
    p.dtype == DType::bf16 ? launch<V, __nv_bfloat16, kD, kBanded>(p, a, s) : launch<V, __half, kD, kBanded>(p, a, s);
  });
}

template <Version V>
void run(const Problem& p, const NativeFwdArgs& a, void*, Stream s) {
  switch (p.d) {
    case 64: return run_d<V, 64>(p, a, s);
    case 128: return run_d<V, 128>(p, a, s);
    default: return run_d<V, 256>(p, a, s);  // gpu::forward checked d against kSupportedD
  }
}

// The rows, each from the one before it.
FA_HD constexpr FwdVersion h2() { return {}; }  // a producer warpgroup, setmaxnreg
FA_HD constexpr FwdVersion h3() {               // + ping-pong between the consumers
  FwdVersion v = h2();
  v.pingpong = true;
  return v;
}
FA_HD constexpr FwdVersion h4() {  // + softmax under P·V in a warpgroup: the production schedule
  FwdVersion v = h3();
  v.overlap = true;
  return v;
}
static_assert(forward_tile(128).consumers == kConsumers && forward_tile(256).consumers == kConsumers &&
                  forward_tile(64).stages == 2 && forward_tile(128).stages == 2 && forward_tile(256).stages == 2,
              "h7, the production kernel, is h4 but for its three consumers at d = 64");

// h1, h7 and h9: production's kernels, at every d.
void run_h1(const Problem& p, const NativeFwdArgs& a, void*, Stream s) { run_short(p, a, s); }
void run_h7(const Problem& p, const NativeFwdArgs& a, void* ws, Stream s) { run_specialised(p, a, ws, s); }

}  // namespace

// Each row's name says what it adds; every row takes production's head dimensions.
const GpuForward kForwardVersions[kForwardVersionCount] = {
    {.name = "h1: TMA + wgmma, no warp specialisation", .max_d = 256, .workspace_bytes = no_workspace,
     .workspace_what = "", .run = nullptr, .run_native = run_h1, .only_d = kSupportedD, .min_sm = kSm, .exact_sm = true},
    {.name = "h2: + a producer warpgroup (setmaxnreg)", .max_d = 256, .workspace_bytes = no_workspace,
     .workspace_what = "", .run = nullptr, .run_native = run<h2>, .only_d = kSupportedD, .min_sm = kSm, .exact_sm = true},
    {.name = "h3: + ping-pong between the consumers", .max_d = 256, .workspace_bytes = no_workspace,
     .workspace_what = "", .run = nullptr, .run_native = run<h3>, .only_d = kSupportedD, .min_sm = kSm, .exact_sm = true},
    {.name = "h4: + softmax under P.V in a warpgroup", .max_d = 256, .workspace_bytes = no_workspace,
     .workspace_what = "", .run = nullptr, .run_native = run<h4>, .only_d = kSupportedD, .min_sm = kSm, .exact_sm = true},
    {.name = "h7: h4 with three consumers at d = 64 (production's kernel at d = 256)", .max_d = 256,
     .workspace_bytes = no_workspace, .workspace_what = "", .run = nullptr, .run_native = run_h7, .only_d = kSupportedD,
     .min_sm = kSm, .exact_sm = true},
    {.name = "h9: h7 on a persistent grid, tiles from a counter, O in its own tile (production's kernel at d = 64, 128)",
     .max_d = 256, .workspace_bytes = tile_counter, .workspace_what = "the tile counter", .run = nullptr,
     .run_native = run_persistent, .only_d = kSupportedD, .min_sm = kSm, .exact_sm = true},
};

}  // namespace fa::step07
