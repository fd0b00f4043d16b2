// Step 07's forward as note 07 measures it, one Hopper idea at a time: the versions of
// the lesson's table. Each is a configuration with named fields (FwdVersion) built
// from the one before it; one kernel takes them all, made of the same pieces as the
// production kernel (forward.cuh). The last rows, h7, h9, h10 and h11, are the production
// kernels themselves (forward.cu): h7, h4 with three consumers at d = 64, a block a tile
// (production at d = 256); h9, h7 on a persistent grid (production at d = 64 and 128). Short
// problems at d = 64 run h1's kernel instead (two_blocks_an_sm). h10 and h11 are those kernels
// with the causal tiles taken heaviest first across every section of heads and across the
// last section only (forward_order), where every row before them takes them head after head;
// the production forward takes one order or the other by a head's size (Heaviest::by_wave).
// The first row, h0,
// is step 06's kernel itself (its forward_block) with its loads by TMA: one Hopper
// feature alone.
//   h0  TMA alone: step 06's mma.sync kernel, each K/V block two TMA boxes completing on
//       an mbarrier (thread 0 issues them) instead of every thread's cp.async; d = 64
//       only, where step 06's swizzle of 128-byte rows is TMA's 128-byte swizzle
//   h1  TMA + wgmma: two warpgroups that both compute; the first thread of consumer 0
//       also issues the copies, one K/V block ahead; per block S, softmax, P·V in turn
//   h2  + warp specialisation: a producer warpgroup issues the copies and gives its
//       registers to the consumers (setmaxnreg)
//   h3  + ping-pong: the consumers take turns on the tensor cores (named barriers)
//   h4  + in a warpgroup, S_{j+1} issued before P_j·V_j, its softmax under that product
//   h5, h6  h4 with 64- and 176-key blocks (block shapes)
//   s1  h1 with 64-key blocks, two blocks an SM at d = 128: short problems' kernel there
//       until h9
//   h7  h4 with three consumers (192 query rows) at d = 64: production at d = 256
//   h9  h7 on a persistent grid (a block an SM), its tiles from a counter; the K/V ring
//       runs on across tiles, and O is staged in a tile of its own, so the next tile's Q
//       loads under the last one's products and epilogue: production at d = 64 and 128
//       (at d = 256 the O tiles do not fit: O goes through the Q tile, as in h7)
//   h10 h1 (short problems at d = 64), h9 (d = 64, 128) and h7 (d = 256) with the causal
//       tiles heaviest first across every section of heads
//   h11 the same, head after head up to the last section of heads, heaviest first across
//       that one (production where a head has at most SMs / 8 tiles)
#include <cstdint>

#include "common/cuda_check.cuh"
#include "steps/06_tensor_cores/forward.cuh"
#include "steps/07_hopper/forward.cuh"

namespace fa::step07 {
namespace {

// ---------------------------------------------------------------------------------
// h0: step 06's forward with its copies by TMA.

/// forward_block's copies by TMA (step 06's are CpAsyncLoads): thread 0 issues Q_i and
/// each K/V block as boxes of the tensor maps, completing on full[0] (Q) and full[1 + b]
/// (buffer b); every thread waits on the barrier instead of on its own cp.async group.
template <class T, bool kCausal>
struct TmaLoads {
  using S = step06::FwdSmem<T, 64, kCausal>;
  static constexpr std::uint32_t kKvBytes = 2 * S::kBc * 64 * sizeof(T);  // a K box and a V box
  const CUtensorMap *q_map, *k_map, *v_map;
  std::uint64_t* full;  ///< [3]: Q_i; K/V buffers 0 and 1
  int q0, bh;
  __device__ void issue_kv(const S& sm, int j) const {
    std::uint64_t* bar = &full[1 + j % 2];
    arrive_expecting(bar, kKvBytes);
    load_tile(k_map, sm.k_buf(j % 2), bar, j * S::kBc, bh);
    load_tile(v_map, sm.v_buf(j % 2), bar, j * S::kBc, bh);
  }
  __device__ void prologue(const S& sm) const {
    if (threadIdx.x != 0) return;
    arrive_expecting(&full[0], S::kRows * 64 * sizeof(T));
    load_tile(q_map, sm.q, &full[0], q0, bh);
    issue_kv(sm, 0);
  }
  /// Block next − 1 here (its barrier's phase (next − 1)/2), then block `next` into the
  /// other buffer: after the barrier every warp is done with block next − 2, which used it.
  __device__ void begin(const S& sm, int next, int end) const {
    const int j = next - 1;
    if (j == 0) wait(&full[0], 0);
    wait(&full[1 + j % 2], (j / 2) % 2);
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);  // this thread's ldmatrix reads before TMA's writes
    __syncthreads();
    if (threadIdx.x == 0 && next < end) issue_kv(sm, next);
  }
};

template <class T, bool kCausal>
__global__ void __launch_bounds__(step06::forward_tile(kCausal, 64).threads())
    tma_alone_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                     const __grid_constant__ CUtensorMap v_map, T* __restrict__ o, float* __restrict__ lse, int N,
                     float scale) {
#if FA_STEP07_ARCH_OK
  using S = step06::FwdSmem<T, 64, kCausal>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(smem_raw + S::kBytes);
  if (threadIdx.x == 0) {
    for (int b = 0; b < 3; ++b) cuda::ptx::mbarrier_init(&full[b], 1);
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);  // visible to TMA
  }
  __syncthreads();
  const int i = gridDim.y - 1 - blockIdx.y, bh = blockIdx.x;  // step 06's grid order
  const TmaLoads<T, kCausal> loads{&q_map, &k_map, &v_map, full, i * S::kRows, bh};
  step06::forward_block<T, 64, kCausal>(loads, smem_raw, i, bh, N, N, kCausal, scale, o, lse);
#endif
}

template <class T, bool kCausal>
void launch_h0(const Problem& p, const NativeFwdArgs& a, Stream stream) {
  using S = step06::FwdSmem<T, 64, kCausal>;
  const CUtensorMap q = make_tile_map(a.q, p.dtype, p.N, p.heads(), 64, S::kRows);
  const CUtensorMap k = make_tile_map(a.k, p.dtype, p.N, p.heads(), 64, S::kBc);
  const CUtensorMap v = make_tile_map(a.v, p.dtype, p.N, p.heads(), 64, S::kBc);
  const std::size_t smem = S::kBytes + 3 * sizeof(std::uint64_t);
  set_smem_limit(tma_alone_kernel<T, kCausal>, smem);
  const dim3 grid(unsigned(p.heads()), unsigned(tiles::q_blocks(p.N, S::kRows)));
  tma_alone_kernel<T, kCausal><<<grid, S::kTile.threads(), smem, stream>>>(q, k, v, static_cast<T*>(a.o), a.lse, p.N,
                                                                          p.softmax_scale());
  FA_CHECK_LAUNCH();
}

void run_h0(const Problem& p, const NativeFwdArgs& a, void*, Stream s) {  // d = 64 (kH0D)
  if (p.dtype == DType::bf16)
    p.causal ? launch_h0<__nv_bfloat16, true>(p, a, s) : launch_h0<__nv_bfloat16, false>(p, a, s);
  else
    p.causal ? launch_h0<__half, true>(p, a, s) : launch_h0<__half, false>(p, a, s);
}
constexpr int kH0D[] = {64, 0};

// ---------------------------------------------------------------------------------
// h1 … h6: one kernel, configured by what each version adds.

constexpr int kConsumers = 2;  // the versions: two consumers, 128 query rows a block
constexpr int kRows = kConsumers * kRowsPerConsumer;
constexpr FwdTile kTile{kConsumers, 128, 2};  // for the registers setmaxnreg gives (240)

/// One version of the forward kernel, by what it adds.
struct FwdVersion {
  bool specialised = false;  ///< a producer warpgroup (else consumer 0's first thread issues the copies)
  bool pingpong = false;     ///< the consumers take turns issuing their products
  bool overlap = false;      ///< S_{j+1} issued before P_j·V_j; softmax under P·V
  int keys = 128;            ///< keys per K/V block
  /// Threads a block: the producer warpgroup, if any, and the consumers.
  FA_HD constexpr int threads() const { return specialised ? kTile.threads() : 128 * kConsumers; }
};
using Version = FwdVersion (*)(int d);

// h1 at d = 64 keeps to 128 registers a thread (two blocks an SM), which the production
// forward counts on for short problems (two_blocks_an_sm); so does s1, h1 with 64-key
// blocks, at d = 128 (ptxas: 128 registers, no spill), in about 97 KiB of shared memory
// (production there for N ≤ 1024 until h9).
template <class T, int kD, bool kCausal, Version V>
__global__ void __launch_bounds__(V(kD).threads(), V(kD).specialised || (kD != 64 && V(kD).keys != 64) ? 1 : 2)
    version_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                   const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap o_map,
                   float* __restrict__ lse, int N, float scale, const TileOrder order) {
#if FA_STEP07_ARCH_OK
  constexpr FwdVersion kV = V(kD);
  constexpr int kBc = kV.keys, kStages = 2;
  // The overlap keeps V_{j−1} in use while K_j is read: only a producer can keep the
  // ring full then (one computing thread would wait on the buffer it is itself using).
  static_assert(!kV.overlap || kV.specialised, "the overlap needs a producer warpgroup");
  using L = Smem<kD, kBc, kStages, kConsumers>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = aligned_smem(smem_raw);
  Barriers bars(smem + L::bars, kStages);
  const auto [i, bh] = grid_tile(order);  // a block a tile, in forward_order's order (tile_grid)
  const int q0 = i * kRows;
  const int last = tiles::last_kv_block(N, kCausal, i, kRows, kBc);
  if (threadIdx.x == 0) bars.init(kStages, kConsumers);
  __syncthreads();

  const int first_consumer = kV.specialised ? 128 : 0;
  if (kV.specialised && threadIdx.x < 128) {
    release_registers<kProducerRegs>();
    if (threadIdx.x == 0) produce<kD, kBc, kStages, kConsumers>(&q_map, &k_map, &v_map, smem, bars, q0, last, bh);
    return;
  }
  if constexpr (kV.specialised) claim_registers<kTile.consumer_regs()>();
  Consumer<T, kD, kBc, kStages, kConsumers, kCausal> w(smem, bars, (threadIdx.x - first_consumer) / 128, q0, N, scale);
  const int c = w.c;
  // Without a producer, one computing thread issues the copies: Q and block 0 first,
  // then block j+1 at the start of block j (after both consumers released its stage).
  const bool issuer = !kV.specialised && threadIdx.x == 0;
  if (issuer) {
    load_q<kD, kBc, kStages, kConsumers>(&q_map, smem, bars, q0, bh);
    load_kv<kD, kBc, kStages, kConsumers>(&k_map, &v_map, smem, bars, 0, 0, bh);
  }
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
      if (issuer && j + 1 <= last) load_kv<kD, kBc, kStages, kConsumers>(&k_map, &v_map, smem, bars, j + 1, j + 1, bh);
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
    // The production schedule (forward.cu): ping-pong (below) and the overlap, its turns
    // taken by the Consumer's own steps.
    static_assert(!kV.overlap || kV.pingpong, "the overlapped steps take their turns");
    w.first_block(0, 1 - c, [] {});
    for (int j = 1; j <= last; ++j) w.next_block(j, j, 1 - c, [] {});
    w.last_pv(last, 1 - c, c != 1);
  }
  w.store(&o_map, lse, bh, scale, w.q_buffer());
  stored();
#endif
}

template <Version V, class T, int kD, bool kCausal>
void launch(const Problem& p, const NativeFwdArgs& a, Stream stream, Heaviest heaviest) {
  constexpr FwdVersion kV = V(kD);
  const ForwardMaps m = forward_maps(p, a, kV.keys);
  const TileOrder order = forward_order(p, kRows, heaviest);
  const std::size_t smem = Smem<kD, kV.keys, 2, kConsumers>::bytes + 1024;
  set_smem_limit(version_kernel<T, kD, kCausal, V>, smem);
  version_kernel<T, kD, kCausal, V><<<tile_grid(order), kV.threads(), smem, stream>>>(
      m.q, m.k, m.v, m.o, a.lse, p.N, p.softmax_scale(), order);
  FA_CHECK_LAUNCH();
}

template <Version V, int kD>
void run_d(const Problem& p, const NativeFwdArgs& a, Stream s, Heaviest heaviest = Heaviest::nowhere) {
  if (p.dtype == DType::bf16)
    p.causal ? launch<V, __nv_bfloat16, kD, true>(p, a, s, heaviest)
             : launch<V, __nv_bfloat16, kD, false>(p, a, s, heaviest);
  else
    p.causal ? launch<V, __half, kD, true>(p, a, s, heaviest)
             : launch<V, __half, kD, false>(p, a, s, heaviest);
}

/// A lesson row h1–h6: its tiles head after head, as they were measured.
template <Version V>
void run(const Problem& p, const NativeFwdArgs& a, void*, Stream s) {
  switch (p.d) {
    case 64: return run_d<V, 64>(p, a, s);
    case 128: return run_d<V, 128>(p, a, s);
    default: return run_d<V, 256>(p, a, s);  // gpu::forward checked d against the version's list
  }
}

// The versions, each from the one before it. Blocks of 128 keys (80 at d = 256), as
// the production kernel's (forward_tile).
FA_HD constexpr FwdVersion h1(int d) {  // TMA + wgmma, every warpgroup computes
  FwdVersion v;
  v.keys = forward_tile(d).keys;
  return v;
}
FA_HD constexpr FwdVersion h2(int d) {  // + a producer warpgroup, setmaxnreg
  FwdVersion v = h1(d);
  v.specialised = true;
  return v;
}
FA_HD constexpr FwdVersion h3(int d) {  // + ping-pong between the consumers
  FwdVersion v = h2(d);
  v.pingpong = true;
  return v;
}
FA_HD constexpr FwdVersion h4(int d) {  // + softmax under P·V in a warpgroup: the production kernel
  FwdVersion v = h3(d);
  v.overlap = true;
  return v;
}
FA_HD constexpr FwdVersion h5(int d) {  // h4 with 64-key blocks
  FwdVersion v = h4(d);
  v.keys = 64;
  return v;
}
FA_HD constexpr FwdVersion s1(int d) {  // h1 with 64-key blocks: two blocks an SM at d = 128 too
  FwdVersion v = h1(d);
  v.keys = 64;
  return v;
}
FA_HD constexpr FwdVersion h6(int d) {  // h4 with 176-key blocks (FlashAttention-3's at d = 128); not at d = 256
  FwdVersion v = h4(d);
  v.keys = d == 256 ? 80 : 176;
  return v;
}
static_assert(h4(64).keys == forward_tile(64).keys && h4(128).keys == forward_tile(128).keys &&
                  h4(256).keys == forward_tile(256).keys && forward_tile(64).stages == 2 &&
                  forward_tile(128).stages == 2 && forward_tile(256).stages == 2 &&
                  forward_tile(128).consumers == kConsumers && forward_tile(256).consumers == kConsumers,
              "h7, the production kernel, is h4 but for its three consumers at d = 64");

constexpr int kNarrowD[] = {64, 128, 0};  // h6: 176 keys of K and V do not fit beside Q at d = 256
static_assert(h1(64).threads() == 2 * 128 && kConsumers * kRowsPerConsumer == kShortRows &&
                  h1(64).keys == forward_shape(64, 1024, false).keys,
              "the production forward's short block (forward_shape) is h1's");

constexpr int kS1D[] = {128, 0};  // s1: the short problems' kernel at d = 128 until h9 (d = 64 has h1)
void run_s1(const Problem& p, const NativeFwdArgs& a, void*, Stream s) { run_d<s1, 128>(p, a, s); }

}  // namespace

void run_short(const Problem& p, const NativeFwdArgs& a, Stream s, Heaviest heaviest) {
  run_d<h1, 64>(p, a, s, heaviest);
}

namespace {
// h7 and h9: the production kernels with their tiles head after head, as they were measured.
void run_h7(const Problem& p, const NativeFwdArgs& a, void*, Stream s) { run_specialised(p, a, s, Heaviest::nowhere); }
void run_h9(const Problem& p, const NativeFwdArgs& a, void* ws, Stream s) {
  run_persistent(p, a, ws, s, Heaviest::nowhere);
}
// h10 and h11: the kernels of production (run_ordered), with the causal tiles heaviest first
// in every section of heads, and in the last one only.
void run_h10(const Problem& p, const NativeFwdArgs& a, void* ws, Stream s) {
  run_ordered(p, a, ws, s, Heaviest::every_section);
}
void run_h11(const Problem& p, const NativeFwdArgs& a, void* ws, Stream s) {
  run_ordered(p, a, ws, s, Heaviest::last_section);
}
}  // namespace

const GpuForward kForwardVersions[kForwardVersionCount] = {
    {"h0: TMA alone: step 06's kernel, its loads by TMA", 64, no_workspace, "", nullptr, run_h0, kH0D, kSm, true},
    {"h1: TMA + wgmma, no warp specialisation", 256, no_workspace, "", nullptr, run<h1>, kSupportedD, kSm, true},
    {"h2: + a producer warpgroup (setmaxnreg)", 256, no_workspace, "", nullptr, run<h2>, kSupportedD, kSm, true},
    {"h3: + ping-pong between the consumers", 256, no_workspace, "", nullptr, run<h3>, kSupportedD, kSm, true},
    {"h4: + softmax under P.V in a warpgroup", 256, no_workspace, "", nullptr, run<h4>, kSupportedD, kSm, true},
    {"h5: h4 with 64-key blocks", 256, no_workspace, "", nullptr, run<h5>, kSupportedD, kSm, true},
    {"h6: h4 with 176-key blocks", 128, no_workspace, "", nullptr, run<h6>, kNarrowD, kSm, true},
    {"s1: h1 with 64-key blocks (two blocks an SM at d = 128, short problems)", 128, no_workspace, "", nullptr,
     run_s1, kS1D, kSm, true},
    {"h7: h4 with three consumers at d = 64 (production's kernel at d = 256)", 256, no_workspace, "", nullptr, run_h7,
     kSupportedD, kSm, true},
    {"h9: h7 on a persistent grid, tiles from a counter, O in its own tile (production's kernel at d = 64, 128)", 256,
     tile_counter, "the tile counter", nullptr, run_h9, kSupportedD, kSm, true},
    {"h10: causal tiles heaviest first across every section of heads", 256, forward_workspace,
     "the tile counter", nullptr, run_h10, kSupportedD, kSm, true},
    {"h11: causal tiles head after head but in the last section of heads, heaviest first there", 256,
     forward_workspace, "the tile counter", nullptr, run_h11, kSupportedD, kSm, true},
};

}  // namespace fa::step07
