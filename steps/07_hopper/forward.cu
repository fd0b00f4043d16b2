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
// Short problems at d = 64 and 128 run on lesson row h1's and s1's kernel instead, which
// fits two blocks on an SM (two_blocks_an_sm, step07.hpp; versions_forward.cu).
#include "common/cuda_check.cuh"
#include "steps/07_hopper/forward.cuh"

namespace fa::step07 {
namespace {

template <class T, int kD, bool kCausal>
__global__ void __launch_bounds__(forward_tile(kD).threads(), 1)
    forward_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                   const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap o_map,
                   float* __restrict__ lse, int N, float scale) {
#if FA_STEP07_ARCH_OK
  constexpr FwdTile kTile = forward_tile(kD);  // the block shape: step07.hpp
  constexpr int kBc = kTile.keys, kStages = kTile.stages, kConsumers = kTile.consumers, kRows = kTile.rows();
  using L = Smem<kD, kBc, kStages, kConsumers>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = aligned_smem(smem_raw);
  Barriers bars(smem + L::bars, kStages);

  // The grid is (query blocks, heads): the blocks of one head run side by side and
  // share its K and V in L2. Block x takes query block T_r − 1 − x, so with the
  // causal mask the blocks with the most K/V blocks start first.
  const int i = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y;
  const int q0 = i * kRows;
  const int last = tiles::last_kv_block(N, kCausal, i, kRows, kBc);
  if (threadIdx.x == 0) bars.init(kStages, kConsumers);
  __syncthreads();

  if (threadIdx.x < 128) {
    // ---- Producer warpgroup: one thread issues every copy; the others only give
    //      their registers back.
    release_registers<kProducerRegs>();
    if (threadIdx.x == 0) produce<kD, kBc, kStages, kConsumers>(&q_map, &k_map, &v_map, smem, bars, q0, last, bh);
  } else {
    // ---- Consumer warpgroup c: 64 query rows.
    claim_registers<kTile.consumer_regs()>();
    Consumer<T, kD, kBc, kStages, kConsumers, kCausal> w(smem, bars, threadIdx.x / 128 - 1, q0, N, scale);
    const int c = w.c, next = (c + 1) % kConsumers;  // turns go round: 0, 1, (2,) 0, …
    float alpha[2];

    // Prologue: the last consumer lets consumer 0 take the first turn; block 0's S and softmax.
    if (c == kConsumers - 1) named_arrive(turn_bar(0), 2 * 128);
    wait(bars.q_full, 0);
    named_sync(turn_bar(c), 2 * 128);  // my turn on the tensor cores...
    wait(&bars.k_full[0], 0);
    w.issue_qk(0);
    named_arrive(turn_bar(next), 2 * 128);  // ...handed to the next consumer
    w.wait_s();
    w.release_k(0);
    w.mask(0);
    w.softmax(alpha);  // O is still 0: nothing to rescale
    w.to_p();

    // Main loop: in one turn, S_j and P_{j−1}·V_{j−1}; the softmax of j while P·V runs.
    for (int j = 1; j <= last; ++j) {
      const int sj = j % kStages, sp = (j - 1) % kStages;
      named_sync(turn_bar(c), 2 * 128);
      wait(&bars.k_full[sj], (j / kStages) % 2);
      w.issue_qk(sj);
      wait(&bars.v_full[sp], ((j - 1) / kStages) % 2);
      w.issue_pv(sp);
      named_arrive(turn_bar(next), 2 * 128);
      w.wait_s_not_pv();
      w.release_k(sj);
      w.mask(j);
      const bool rescale = w.softmax(alpha);
      w.wait_pv();
      w.release_v(sp);
      if (rescale) w.rescale_o(alpha);
      w.to_p();
    }

    // Epilogue: the last block's P·V (a turn too: the last consumer hands no further
    // turn to consumer 0, whose turns are over), then O and L out.
    named_sync(turn_bar(c), 2 * 128);
    wait(&bars.v_full[last % kStages], (last / kStages) % 2);
    w.issue_pv(last % kStages);
    if (c != kConsumers - 1) named_arrive(turn_bar(next), 2 * 128);
    w.wait_pv();
    w.store(&o_map, lse, q0, bh, scale, w.q_buffer());
    stored();
  }
#endif
}

template <class T, int kD, bool kCausal>
void launch(const Problem& p, const NativeFwdArgs& a, Stream stream) {
  constexpr FwdTile kTile = forward_tile(kD);
  const ForwardMaps m = forward_maps(p, a, kTile.keys);
  const std::size_t smem = Smem<kD, kTile.keys, kTile.stages, kTile.consumers>::bytes + 1024;  // + the base's alignment
  set_smem_limit(forward_kernel<T, kD, kCausal>, smem);
  const dim3 grid(unsigned(tiles::q_blocks(p.N, kTile.rows())), unsigned(p.heads()));
  forward_kernel<T, kD, kCausal><<<grid, kTile.threads(), smem, stream>>>(m.q, m.k, m.v, m.o, a.lse, p.N, p.softmax_scale());
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

/// Short problems at d = 64 and 128 on the kernel of two blocks an SM (step07.hpp); the
/// rest on the warp-specialised one.
void run(const Problem& p, const NativeFwdArgs& a, void* ws, Stream s) {
  two_blocks_an_sm(p.d, p.N, p.causal) ? run_short(p, a, ws, s) : run_specialised(p, a, ws, s);
}

}  // namespace

void run_specialised(const Problem& p, const NativeFwdArgs& a, void*, Stream s) {
  switch (p.d) {
    case 64: return run_d<64>(p, a, s);
    case 128: return run_d<128>(p, a, s);
    default: return run_d<256>(p, a, s);  // gpu::forward checked d against kSupportedD
  }
}

const GpuForward kForward{"step07 forward", 256, no_workspace, "", nullptr, run, kSupportedD, kSm, true};

}  // namespace fa::step07
