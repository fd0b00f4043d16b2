// Step 07 forward kernels: step 06's forward, fed by TMA and computed by wgmma, with
// the work split between warpgroups that load and warpgroups that compute.
//
// A tile is kRows = 128 query rows of one head (192 at d = 64), and a thread block is
// 1 + kRows/64 warpgroups:
//   producer (warpgroup 0)   one thread issues every TMA copy: Q once a tile, then K_j
//                            and V_j into a ring of `stages` buffers, each completing on
//                            its "full" mbarrier; before reusing a buffer it waits on
//                            the buffer's "empty" mbarrier. It gives its registers
//                            away (setmaxnreg) since it holds almost nothing.
//   consumer c (1, 2, (3))   64 query rows each (wgmma's M); per K/V block j:
//                              S = Q_c·K_jᵀ        wgmma, both operands in shared memory
//                              mask, online softmax on the S accumulators (registers)
//                              O += P·V_j          wgmma, P from registers (16 bits)
// Two overlaps hide the softmax under the tensor cores:
//   ping-pong   the consumers take turns issuing their products (named barriers):
//               while one runs its softmax, the other's products run;
//   in a consumer, S of block j is issued before P·V of block j−1, and block j's
//               softmax runs while that P·V is still on the tensor cores.
// Epilogue: O/ℓ rounded to 16 bits into shared memory, one TMA store of 64 rows (rows
// past N dropped by the map), L from registers.
//
// Two grids (persistent_grid, step07.hpp):
//   persistent_kernel (production at d = 64, 128; lesson row h9)  one block an SM, each
//       taking tile after tile from a counter; the K/V ring runs on across a block's
//       tiles, and O is staged in a tile of its own, so the next tile's Q loads while the
//       last tile's final products and epilogue run (at d = 256 there is no room for
//       those tiles: O goes through the Q tile, and the next Q waits for its store);
//   forward_kernel (production at d = 256; lesson row h7)  a block a tile, O staged in
//       the consumer's Q tile; at d = 256 the persistent grid gains nothing (note 07).
// Short problems at d = 64 run on lesson row h1's kernel instead, which fits two blocks
// on an SM (two_blocks_an_sm, step07.hpp; short.cu).
// Every grid takes its tiles in forward_order's order (forward.cuh, step07.hpp's TileOrder):
// with the causal mask heaviest first across sections of heads, so that the last tiles handed
// out are the cheapest. A ragged batch (kRagged, ragged.cuh) runs the persistent grid at d = 64
// and 128, a block a tile at d = 256: a tile is a query block of one sequence (its table).
#include <algorithm>

#include "common/cuda_check.cuh"
#include "common/gpu.hpp"  // sm_count
#include "steps/07_hopper/forward.cuh"

namespace fa::step07 {
namespace {

template <class T, int kD, bool kBanded, bool kRagged>
__global__ void __launch_bounds__(forward_tile(kD).threads(), 1)
    forward_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                   const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap o_map,
                   float* __restrict__ lse, int N, int group, float scale, const Band band, const TileOrder order,
                   const RaggedFwd rg) {
#if FA_SM90A
  constexpr FwdTile kTile = forward_tile(kD);  // the block shape: step07.hpp
  constexpr int kBc = kTile.keys, kStages = kTile.stages, kConsumers = kTile.consumers, kRows = kTile.rows();
  using L = Smem<kD, kBc, kStages, kConsumers>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = aligned_smem(smem_raw);
  Barriers bars(smem + L::bars, kStages);

  // A block a tile, in forward_order's order (tile_grid): with the causal mask the tiles
  // with the most K/V blocks start first. A ragged batch's grid has a block for each query
  // block it may have (max_blocks): those past the table's end have nothing to do.
  const auto [u, bh] = grid_tile(order);
  if (kRagged && u >= rg.order->blocks) return;
  const auto [i, start, n] = seq_block<kRagged>(rg.blocks, u, N);  // n: the sequence's rows (N)
  const int q0 = i * kRows;
  const auto [first, last] = kv_range(band, n, i, kRows, kBc);
  if (threadIdx.x == 0) bars.init(kStages, kConsumers);
  __syncthreads();

  if (threadIdx.x < 128) {
    // ---- Producer warpgroup: one thread issues every copy; the others only give
    //      their registers back.
    release_registers<kProducerRegs>();
    if (threadIdx.x == 0)
      produce<kD, kBc, kStages, kConsumers>(&q_map, &k_map, &v_map, smem, bars, q0, first, last, bh, bh / group,
                                            start);
  } else {
    // ---- Consumer warpgroup c: 64 query rows.
    claim_registers<kTile.consumer_regs()>();
    Consumer<T, kD, kBc, kStages, kConsumers, kBanded, kRagged> w(smem, bars, threadIdx.x / 128 - 1, q0, n, scale,
                                                                  band);
    if constexpr (kRagged) w.in_sequence(start, rg);
    const int c = w.c, next = (c + 1) % kConsumers;  // turns go round: 0, 1, (2,) 0, …

    // Prologue: the last consumer lets consumer 0 take the first turn; the first block's S and softmax.
    if (c == kConsumers - 1) named_arrive(turn_bar(0), 2 * 128);
    wait(bars.q_full, 0);
    w.first_block(first, 0, next, [] {});

    // Main loop: in one turn, S_j and P_{j−1}·V_{j−1}; the softmax of j while P·V runs.
    for (int j = first + 1; j <= last; ++j) w.next_block(j, j - first, next, [] {});

    // Epilogue: the last block's P·V (a turn too: the last consumer hands no further
    // turn to consumer 0, whose turns are over), then O and L out.
    w.last_pv(last - first, next, c != kConsumers - 1);
    w.store(&o_map, lse, bh, scale, w.q_buffer());
    stored();
  }
#endif
}

template <class T, int kD, bool kBanded, bool kRagged>
void launch(const Problem& p, const NativeFwdArgs& a, void* workspace, Stream stream) {
  constexpr FwdTile kTile = forward_tile(kD);
  const ForwardMaps m = forward_maps(p, a, kTile.keys);
  // A ragged batch: its table first; a block for each query block it may have, head after head.
  const RaggedFwd rg = kRagged ? ragged_forward(p, a, kTile.rows(), workspace, stream) : RaggedFwd{};
  const TileOrder order =
      kRagged ? TileOrder(int(max_blocks(p.N, kTile.rows(), a.ragged.sequences)), int(p.heads()), 0, int(p.heads()))
              : forward_order(p, kTile.rows());
  const std::size_t smem = Smem<kD, kTile.keys, kTile.stages, kTile.consumers>::bytes + 1024;  // + the base's alignment
  set_smem_limit(forward_kernel<T, kD, kBanded, kRagged>, smem);
  forward_kernel<T, kD, kBanded, kRagged><<<tile_grid(order), kTile.threads(), smem, stream>>>(
      m.q, m.k, m.v, m.o, a.lse, p.N, p.group(), p.softmax_scale(), band_of(p), order, rg);
  FA_CHECK_LAUNCH();
}

template <int kD>
void run_d(const Problem& p, const NativeFwdArgs& a, void* ws, Stream s) {
  with_band(p, [&]<bool kBanded>() {
    with_ragged(a, [&]<bool kRagged>() {
      p.dtype == DType::bf16 ? launch<__nv_bfloat16, kD, kBanded, kRagged>(p, a, ws, s)
                             : launch<__half, kD, kBanded, kRagged>(p, a, ws, s);
    });
  });
}

// ---------------------------------------------------------------------------------
// The persistent grid (production at d = 64, 128; lesson row h9 at every d): the kernel
// above, tile after tile.

/// The persistent kernel's shared memory: forward_kernel's (Smem), then an O tile per
/// consumer where they fit (so that the next tile's Q may load into the Q tile while O is
/// written; not at d = 256), Q's "empty" barrier and the TileRing.
template <int kD, int kBc, int kStages, int kConsumers>
struct PersistentSmem {
  using L = Smem<kD, kBc, kStages, kConsumers>;
  static constexpr int kTail = 8 + TileRing::kBytes;         ///< Q's "empty" barrier, the TileRing
  static constexpr int o = (L::bytes + 1023) / 1024 * 1024;  ///< [consumer]: 64 rows of O, panels as Q's
  static constexpr int o_end = o + kConsumers * L::kQBytes;
  static constexpr bool own_o = o_end + kTail + 1024 <= kBlockSmemBytes;
  static constexpr int q_empty = own_o ? o_end : L::bytes;
  static constexpr int ring = q_empty + 8;
  static constexpr int bytes = q_empty + kTail;  ///< + 1024 for the base's alignment
};

template <class T, int kD, bool kBanded, bool kRagged>
__global__ void __launch_bounds__(forward_tile(kD).threads(), 1)
    persistent_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                      const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap o_map,
                      float* __restrict__ lse, int N, int group, float scale, const Band band,
                      const TileOrder dense_order, int* taken, const RaggedFwd rg) {
#if FA_SM90A
  constexpr FwdTile kTile = forward_tile(kD);
  constexpr int kBc = kTile.keys, kStages = kTile.stages, kConsumers = kTile.consumers, kRows = kTile.rows();
  using L = Smem<kD, kBc, kStages, kConsumers>;
  using P = PersistentSmem<kD, kBc, kStages, kConsumers>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = aligned_smem(smem_raw);
  Barriers bars(smem + L::bars, kStages);
  // Q's tiles free: with O tiles of its own, every consumer warp done with its last S; else
  // every consumer's O store (staged in its Q tile) done reading it.
  std::uint64_t* q_empty = reinterpret_cast<std::uint64_t*>(smem + P::q_empty);
  const TileRing ring(smem + P::ring);
  // A ragged batch's grid is launched early, under the table kernel (launch_persistent): its
  // table, order and counter are read once that kernel is done.
  if constexpr (kRagged) cudaGridDependencySynchronize();
  const TileOrder order = kRagged ? *rg.order : dense_order;  // a ragged batch's: made with its table
  const int tiles = order.tiles(), q_blocks = order.blocks;
  if (threadIdx.x == 0) {
    cuda::ptx::mbarrier_init(q_empty, P::own_o ? 4 * kConsumers : kConsumers);
    ring.init(128 * kConsumers);
    bars.init(kStages, kConsumers);  // its fence covers the two above
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    // ---- Producer: issues a tile's copies — its Q once the consumers are done with the
    //      last tile's, its K/V blocks on through the one ring (n counts the block's K/V
    //      blocks over all its tiles) — then takes the next tile: only then, when the
    //      consumers are a ring's depth from the end of this one (taken as soon as this
    //      one started, a long causal tile would hold the next one back from the blocks
    //      that finish first).
    release_registers<kProducerRegs>();
    if (threadIdx.x == 0) {
      // The counter hands out positions in forward_order's order; the consumers are told
      // each tile's index head after head, bh·T_r + p (query_tile reads it back).
      for (int t = 0, n = 0, pos = blockIdx.x;; ++t, pos = take_tile(taken, tiles)) {
        if (pos >= tiles) {
          ring.publish(t, tiles);  // the end
          break;
        }
        const auto [p, bh] = tell_tile(order, ring, t, pos);
        const auto [i, start, rows] = seq_block<kRagged>(rg.blocks, q_blocks - 1 - p, N);  // as query_tile
        const auto [first, last] = kv_range(band, rows, i, kRows, kBc);
        wait(q_empty, (t % 2) ^ 1);  // a fresh barrier: parity 1 is done
        load_q<kD, kBc, kStages, kConsumers>(&q_map, smem, bars, start + i * kRows, bh);
        for (int j = first; j <= last; ++j, ++n)
          load_kv<kD, kBc, kStages, kConsumers>(&k_map, &v_map, smem, bars, j, n, bh / group, start);
      }
    }
  } else {
    // ---- Consumer warpgroup c: forward_kernel's schedule tile after tile; the turns on
    //      the tensor cores go round without a break between tiles.
    claim_registers<kTile.consumer_regs()>();
    const int c = threadIdx.x / 128 - 1, next = (c + 1) % kConsumers;
    auto release_q = [&] {  // with O tiles of its own: once this warp's last S of the tile is done
      if (P::own_o && threadIdx.x % 32 == 0) arrive(q_empty);
    };
    if (c == kConsumers - 1) named_arrive(turn_bar(0), 2 * 128);
    int tile = ring.take(0);
    for (int t = 0, n = 0; tile < tiles; ++t) {  // n: the block's K/V blocks before this tile's first
      const auto [u, bh] = query_tile(tile, q_blocks);
      const auto [i, start, rows] = seq_block<kRagged>(rg.blocks, u, N);
      const int q0 = i * kRows;
      const auto [first, last] = kv_range(band, rows, i, kRows, kBc);
      Consumer<T, kD, kBc, kStages, kConsumers, kBanded, kRagged> w(smem, bars, c, q0, rows, scale, band);
      if constexpr (kRagged) w.in_sequence(start, rg);

      // Prologue: the first block's S and softmax.
      wait(bars.q_full, t % 2);
      w.first_block(first, n, next, [&] {
        if (last == first) release_q();
      });

      // Main loop: forward_kernel's, with the ring counted over the block's tiles.
      for (int j = first + 1; j <= last; ++j)
        w.next_block(j, n + j - first, next, [&] {
          if (j == last) release_q();  // the tile's last S is done: the next tile's Q may load
        });

      // Epilogue: the last P·V (a turn, handed on unless it was the block's last and the
      // next consumer's turns are over), then O: into its own tile once the last tile's
      // store has read it, or at d = 256 into the Q tile, released once this store has.
      tile = ring.take(t + 1);
      const int r = n + last - first;
      w.last_pv(r, next, next != 0 || tile < tiles);
      w.release_v(r % kStages);
      if constexpr (P::own_o) {
        stored();
        named_sync(epilogue_bar(c), 128);
        w.store(&o_map, lse, bh, scale, smem + P::o + c * L::kQBytes);
      } else {
        w.store(&o_map, lse, bh, scale, w.q_buffer());
        stored();
        if (threadIdx.x % 128 == 0) arrive(q_empty);
      }
      n += last - first + 1;
    }
    stored();
  }
#endif
}

template <class T, int kD, bool kBanded, bool kRagged>
void launch_persistent(const Problem& p, const NativeFwdArgs& a, void* workspace, Stream stream) {
  constexpr FwdTile kTile = forward_tile(kD);
  using P = PersistentSmem<kD, kTile.keys, kTile.stages, kTile.consumers>;
  const ForwardMaps m = forward_maps(p, a, kTile.keys);
  int* taken = static_cast<int*>(workspace);  // read only if some block takes a second tile
  // A ragged batch: the table (which zeroes the counter) and the order, worked out on the device.
  const RaggedFwd rg = kRagged ? ragged_forward(p, a, kTile.rows(), workspace, stream) : RaggedFwd{};
  const TileOrder order = forward_order(p, kTile.rows());  // a ragged batch's kernel reads its own (rg.order)
  const int tile_count =
      kRagged ? int(max_blocks(p.N, kTile.rows(), a.ragged.sequences) * p.heads()) : order.tiles();
  const int grid = std::min(tile_count, gpu::sm_count());
  if (!kRagged && tile_count > grid) FA_CUDA_CHECK(cudaMemsetAsync(taken, 0, sizeof(int), stream));
  set_smem_limit(persistent_kernel<T, kD, kBanded, kRagged>, P::bytes + 1024);
  // A ragged batch's grid launched under the table kernel: its launch and set-up hidden there.
  launch_early(kRagged, persistent_kernel<T, kD, kBanded, kRagged>, dim3(unsigned(grid)), dim3(kTile.threads()),
               P::bytes + 1024, stream, m.q, m.k, m.v, m.o, a.lse, p.N, p.group(), p.softmax_scale(), band_of(p), order,
               taken, rg);
}

template <int kD>
void run_persistent_d(const Problem& p, const NativeFwdArgs& a, void* ws, Stream s) {
  with_band(p, [&]<bool kBanded>() {
    with_ragged(a, [&]<bool kRagged>() {
      // A ragged tile's last O rows are copied by hand from an O tile of its own: none at d = 256.
      if constexpr (kRagged && !PersistentSmem<kD, forward_tile(kD).keys, 2, forward_tile(kD).consumers>::own_o)
        throw Error("a ragged batch at d = " + std::to_string(kD) + " runs a block a tile (run_forward)");
      else
        p.dtype == DType::bf16 ? launch_persistent<__nv_bfloat16, kD, kBanded, kRagged>(p, a, ws, s)
                               : launch_persistent<__half, kD, kBanded, kRagged>(p, a, ws, s);
    });
  });
}
static_assert(PersistentSmem<64, 128, 2, 3>::own_o && PersistentSmem<128, 128, 2, 2>::own_o &&
                  !PersistentSmem<256, 80, 2, 2>::own_o &&
                  PersistentSmem<256, 80, 2, 2>::bytes + 1024 <= kBlockSmemBytes,
              "O tiles of their own fit beside forward_kernel's at d = 64 and 128, not at d = 256");

}  // namespace

/// Short problems at d = 64 on the kernel of two blocks an SM, d = 64 and 128 otherwise
/// on the persistent grid, d = 256 a block a tile (step07.hpp).
/// A ragged batch on the persistent grid at d = 64 and 128 (its sequences' lengths vary: no
/// short problems' kernel), a block a tile at d = 256.
void run_forward(const Problem& p, const NativeFwdArgs& a, void* ws, Stream s) {
  if (a.ragged.sequences) return p.d == 256 ? run_specialised(p, a, ws, s) : run_persistent(p, a, ws, s);
  if (two_blocks_an_sm(p.d, p.N, p.causal)) return run_short(p, a, s);
  persistent_grid(p.d, p.N, p.causal) ? run_persistent(p, a, ws, s) : run_specialised(p, a, ws, s);
}
std::size_t forward_workspace(const Problem& p) { return persistent_grid(p.d, p.N, p.causal) ? tile_counter(p) : 0; }
// A ragged batch's workspace: the tile counter, then the tables.
constexpr std::size_t kRaggedTablesAt = 64;
std::size_t forward_ragged_workspace(const Problem& p, int sequences) {
  return kRaggedTablesAt + ragged_tables_bytes(p.N, forward_tile(p.d).rows(), 0, sequences);
}
RaggedFwd ragged_forward(const Problem& p, const NativeFwdArgs& a, int rows, void* ws, Stream s) {
  // Sections of heads as forward_order's (a head's K and V: all its sequences').
  const RaggedTables t = ragged_tables(a.ragged, p.N, rows, 0, int(p.heads()), p.causal, 4.0 * p.N * p.d / p.group(),
                                       static_cast<unsigned char*>(ws) + kRaggedTablesAt, static_cast<int*>(ws), s);
  return {t.blocks, t.order, a.o, p.N};  // p.N: the packed rows of a head
}

void run_persistent(const Problem& p, const NativeFwdArgs& a, void* ws, Stream s) {
  switch (p.d) {
    case 64: return run_persistent_d<64>(p, a, ws, s);
    case 128: return run_persistent_d<128>(p, a, ws, s);
    default: return run_persistent_d<256>(p, a, ws, s);  // gpu::forward checked d against kSupportedD
  }
}
std::size_t tile_counter(const Problem&) { return sizeof(int); }

void run_specialised(const Problem& p, const NativeFwdArgs& a, void* ws, Stream s) {
  switch (p.d) {
    case 64: return run_d<64>(p, a, ws, s);
    case 128: return run_d<128>(p, a, ws, s);
    default: return run_d<256>(p, a, ws, s);  // gpu::forward checked d against kSupportedD
  }
}

const GpuForward kForward{.name = "step07 forward",
                          .max_d = 256,
                          .workspace_bytes = forward_workspace,
                          .workspace_what = "the tile counter",
                          .run = nullptr,
                          .run_native = run_forward,
                          .only_d = kSupportedD,
                          .min_sm = kSm,
                          .exact_sm = true,
                          .groups = true,
                          .window = true,
                          .ragged_workspace_bytes = forward_ragged_workspace};

}  // namespace fa::step07
