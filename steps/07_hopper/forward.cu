// Step 07 forward kernel: step 06's forward, fed by TMA and computed by wgmma, with
// the work split between warpgroups that load and warpgroups that compute.
//
// A thread block owns kRows = 128 query rows of one head and is 3 warpgroups:
//   producer (warpgroup 0)   one thread issues every TMA copy: Q once, then K_j and
//                            V_j into a ring of `stages` buffers, each completing on
//                            its "full" mbarrier; before reusing a buffer it waits on
//                            the buffer's "empty" mbarrier. It gives its registers
//                            away (setmaxnreg) since it holds almost nothing.
//   consumer c (1 and 2)     64 query rows each (wgmma's M); per K/V block j:
//                              S = Q_c·K_jᵀ        wgmma, both operands in shared memory
//                              mask, online softmax on the S accumulators (registers)
//                              O += P·V_j          wgmma, P from registers (16 bits)
// Two overlaps hide the softmax under the tensor cores:
//   ping-pong   the consumers take turns issuing their products (named barriers):
//               while one runs its softmax, the other's products run;
//   in a consumer, S of block j is issued before P·V of block j−1, and block j's
//               softmax runs while that P·V is still on the tensor cores.
// Epilogue: O/ℓ rounded to 16 bits into the consumer's own Q buffer (its last S is
// done), one TMA store of 64 rows (rows past N dropped by the map), L from registers.
// With the causal mask the query blocks with the most K/V blocks start first.
#include <algorithm>
#include <cstdint>

#include "common/cuda_check.cuh"
#include "common/gpu.hpp"
#include "steps/07_hopper/forward.cuh"

namespace fa::step07 {
namespace {

/// The tiles of a problem, in the order the persistent blocks take them: head by head
/// (the blocks running side by side share a head's K and V in L2), and in a head the
/// query block with the most K/V blocks first (with the causal mask, the longest).
struct TileOrder {
  int q_blocks;  // T_r
  __device__ int head(int t) const { return t / q_blocks; }
  __device__ int q_block(int t) const { return q_blocks - 1 - t % q_blocks; }
};

template <class T, int kD, bool kCausal>
__global__ void __launch_bounds__(forward_tile(kD).threads(), 1)
    forward_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                   const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap o_map,
                   float* __restrict__ lse, int N, float scale, int tiles) {
#if FA_STEP07_ARCH_OK
  constexpr FwdTile kTile = forward_tile(kD);  // the block shape: step07.hpp
  constexpr int kBc = kTile.keys, kStages = kTile.stages, kConsumers = kTile.consumers, kRows = kTile.rows();
  using L = Smem<kD, kBc, kStages, kConsumers>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = aligned_smem(smem_raw);
  Barriers bars(smem + L::bars, kStages);
  const TileOrder order{tiles::q_blocks(N, kRows)};
  if (threadIdx.x == 0) bars.init(kStages, kConsumers);
  __syncthreads();

  // A persistent grid: one block per SM, each taking tiles blockIdx.x, + gridDim.x, …
  // The K/V ring and Q's barriers run on across tiles: `slot` counts the ring's uses,
  // `k` this block's tiles (the parity of Q's barriers).
  if (threadIdx.x < 128) {
    // ---- Producer warpgroup: one thread issues every copy; the others only give
    //      their registers back. It runs ahead into the next tile while the consumers
    //      finish this one: the next K/V blocks as stages free up, the next Q as soon
    //      as every consumer has stored the O it staged in its Q buffer.
    release_registers<kProducerRegs>();
    if (threadIdx.x == 0) {
      int slot = 0;
      for (int t = blockIdx.x, k = 0; t < tiles; t += gridDim.x, ++k) {
        const int i = order.q_block(t), bh = order.head(t);
        wait(bars.q_empty, (k % 2) ^ 1);  // a fresh barrier reports parity 1 as done
        load_q<kD, kBc, kStages, kConsumers>(&q_map, smem, bars, i * kRows, bh);
        const int last = tiles::last_kv_block(N, kCausal, i, kRows, kBc);
        for (int j = 0; j <= last; ++j, ++slot)
          load_kv<kD, kBc, kStages, kConsumers>(&k_map, &v_map, smem, bars, slot, j, bh);
      }
    }
    return;
  }
  // ---- Consumer warpgroup c: 64 query rows of each tile.
  claim_registers<kTile.consumer_regs()>();
  const int c = threadIdx.x / 128 - 1, next = (c + 1) % kConsumers;  // turns go round: 0, 1, (2,) 0, …
  int slot = 0;  // the ring's use of this tile's K/V block 0
  for (int t = blockIdx.x, k = 0; t < tiles; t += gridDim.x, ++k) {
    const int i = order.q_block(t), bh = order.head(t);
    const int q0 = i * kRows, last = tiles::last_kv_block(N, kCausal, i, kRows, kBc);
    Consumer<T, kD, kBc, kStages, kConsumers, kCausal> w(smem, bars, c, q0, N, scale);  // O = 0, m = −∞, ℓ = 0
    auto stage = [&](int j) { return (slot + j) % kStages; };
    auto parity = [&](int j) { return std::uint32_t((slot + j) / kStages % 2); };
    float alpha[2];

    // Prologue: the last consumer lets consumer 0 take the first turn; block 0's S and softmax.
    if (c == kConsumers - 1) named_arrive(turn_bar(0), 2 * 128);
    wait(bars.q_full, k % 2);
    named_sync(turn_bar(c), 2 * 128);  // my turn on the tensor cores...
    wait(&bars.k_full[stage(0)], parity(0));
    w.issue_qk(stage(0));
    named_arrive(turn_bar(next), 2 * 128);  // ...handed to the next consumer
    w.wait_s();
    w.release_k(stage(0));
    w.mask(0);
    w.softmax(alpha);  // O is still 0: nothing to rescale
    w.to_p();

    // Main loop: in one turn, S_j and P_{j−1}·V_{j−1}; the softmax of j while P·V runs.
    for (int j = 1; j <= last; ++j) {
      named_sync(turn_bar(c), 2 * 128);
      wait(&bars.k_full[stage(j)], parity(j));
      w.issue_qk(stage(j));
      wait(&bars.v_full[stage(j - 1)], parity(j - 1));
      w.issue_pv(stage(j - 1));
      named_arrive(turn_bar(next), 2 * 128);
      w.wait_s_not_pv();
      w.release_k(stage(j));
      w.mask(j);
      const bool rescale = w.softmax(alpha);
      w.wait_pv();
      w.release_v(stage(j - 1));
      if (rescale) w.rescale_o(alpha);
      w.to_p();
    }

    // Epilogue: the last block's P·V (a turn too: the last consumer hands no further
    // turn to consumer 0, whose turns in this tile are over), then O and L out.
    named_sync(turn_bar(c), 2 * 128);
    wait(&bars.v_full[stage(last)], parity(last));
    w.issue_pv(stage(last));
    if (c != kConsumers - 1) named_arrive(turn_bar(next), 2 * 128);
    w.wait_pv();
    w.release_v(stage(last));
    w.store(&o_map, lse, q0, bh, scale);  // its last arrival frees the Q buffer
    slot += last + 1;
  }
#endif
}

template <class T, int kD, bool kCausal>
void launch(const Problem& p, const NativeFwdArgs& a, Stream stream) {
  constexpr FwdTile kTile = forward_tile(kD);
  const ForwardMaps m = forward_maps(p, a, kTile.keys);
  const std::size_t smem = Smem<kD, kTile.keys, kTile.stages, kTile.consumers>::bytes + 1024;  // + the base's alignment
  set_smem_limit(forward_kernel<T, kD, kCausal>, smem);
  const std::size_t tiles = p.heads() * std::size_t(tiles::q_blocks(p.N, kTile.rows()));
  if (tiles > std::size_t(INT32_MAX)) throw Error("step07: more than 2^31 tiles");
  const unsigned grid = unsigned(std::min<std::size_t>(tiles, std::size_t(gpu::sm_count())));  // a block per SM
  forward_kernel<T, kD, kCausal><<<grid, kTile.threads(), smem, stream>>>(m.q, m.k, m.v, m.o, a.lse, p.N,
                                                                          p.softmax_scale(), int(tiles));
  FA_CHECK_LAUNCH();
}

template <int kD, bool kCausal>
void run_d(const Problem& p, const NativeFwdArgs& a, Stream s) {
  p.dtype == DType::bf16 ? launch<__nv_bfloat16, kD, kCausal>(p, a, s) : launch<__half, kD, kCausal>(p, a, s);
}

template <int kD>
void run_d(const Problem& p, const NativeFwdArgs& a, Stream s) {
  p.causal ? run_d<kD, true>(p, a, s) : run_d<kD, false>(p, a, s);
}

void run(const Problem& p, const NativeFwdArgs& a, void*, Stream s) {
  switch (p.d) {
    case 64: return run_d<64>(p, a, s);
    case 128: return run_d<128>(p, a, s);
    default: return run_d<256>(p, a, s);  // gpu::forward checked d against kSupportedD
  }
}

}  // namespace

const GpuForward kForward{"step07 forward", 256, no_workspace, "", nullptr, run, kSupportedD, kSm, true};

}  // namespace fa::step07
