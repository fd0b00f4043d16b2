// The pieces of step 07's forward, shared by the production kernels (forward.cu, short.cu)
// and the lesson rows h2–h4 (versions_forward.cu): the shared-memory plan, the producer's
// loop, and a consumer warpgroup's products, mask, softmax and epilogue.
#pragma once

#include <cstdint>

#include "steps/02_fused/tile.hpp"
#include "steps/03_online_softmax/online_softmax.hpp"
#include "common/cuda/mma.cuh"
#include "steps/06_tensor_cores/step06.hpp"
#include "steps/07_hopper/hopper.cuh"
#include "steps/07_hopper/ragged.cuh"
#include "steps/07_hopper/step07.hpp"

namespace fa::step07 {

/// Shared memory of a block, in bytes from a 1024-aligned base: Q (one 64-row tile
/// per consumer), the K and V rings of kStages blocks of kBc keys, the mbarriers.
template <int kD, int kBc, int kStages, int kConsumers>
struct Smem {
  static constexpr int kQBytes = kRowsPerConsumer * kD * 2;  ///< one consumer's Q tile
  static constexpr int kKVBytes = kBc * kD * 2;              ///< one K (or V) block
  static constexpr int q = 0;
  static constexpr int k = q + kConsumers * kQBytes;
  static constexpr int v = k + kStages * kKVBytes;
  static constexpr int bars = v + kStages * kKVBytes;
  static constexpr int bytes = bars + 8 * (1 + 4 * kStages);  ///< + 1024 for the base's alignment
};

/// The mbarriers: Q's, and per stage K's and V's "full" (TMA done) and "empty" (all
/// consumer warps done with the buffer: one arrival per warp).
struct Barriers {
  std::uint64_t *q_full, *k_full, *k_empty, *v_full, *v_empty;
  __device__ Barriers(unsigned char* at, int stages)
      : q_full(reinterpret_cast<std::uint64_t*>(at)), k_full(q_full + 1), k_empty(k_full + stages),
        v_full(k_empty + stages), v_empty(v_full + stages) {}
  /// By one thread, before the block's first __syncthreads.
  __device__ void init(int stages, int consumers) {
    const int consumer_warps = 4 * consumers;
    cuda::ptx::mbarrier_init(q_full, 1);
    for (int s = 0; s < stages; ++s) {
      cuda::ptx::mbarrier_init(&k_full[s], 1);
      cuda::ptx::mbarrier_init(&v_full[s], 1);
      cuda::ptx::mbarrier_init(&k_empty[s], consumer_warps);
      cuda::ptx::mbarrier_init(&v_empty[s], consumer_warps);
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);  // visible to TMA
  }
};

/// The 1024-aligned base of dynamic shared memory (TMA's 128-byte swizzle repeats
/// every 1024 bytes, and the wgmma descriptors assume tiles on that boundary).
__device__ __forceinline__ unsigned char* aligned_smem(unsigned char* raw) {
  return raw + ((1024 - smem_u32(raw) % 1024) % 1024);
}

// Named barrier ids (0 is __syncthreads'): each consumer's turn, each consumer's epilogue.
__device__ __forceinline__ int turn_bar(int c) { return 1 + c; }
__device__ __forceinline__ int epilogue_bar(int c) { return 1 + kMaxConsumers + c; }

/// The K/V ring, by one thread: K_j and V_j, the block's n-th K/V block through the ring
/// (n = j but on a persistent grid), into stage n % kStages, each after the stage's
/// previous block was released by every consumer warp. `start`: the sequence's first row
/// (a ragged batch's).
template <int kD, int kBc, int kStages, int kConsumers>
__device__ void load_kv(const CUtensorMap* k_map, const CUtensorMap* v_map, unsigned char* smem, const Barriers& b,
                        int j, int n, int bh, int start = 0) {
  using L = Smem<kD, kBc, kStages, kConsumers>;
  const int s = n % kStages;
  const std::uint32_t phase = (n / kStages) % 2;
  // A buffer's first use waits on parity 1, which a fresh barrier reports as done.
  wait(&b.k_empty[s], phase ^ 1);
  arrive_expecting(&b.k_full[s], L::kKVBytes);
  load_tile(k_map, smem + L::k + s * L::kKVBytes, &b.k_full[s], start + j * kBc, bh);
  wait(&b.v_empty[s], phase ^ 1);
  arrive_expecting(&b.v_full[s], L::kKVBytes);
  load_tile(v_map, smem + L::v + s * L::kKVBytes, &b.v_full[s], start + j * kBc, bh);
}

/// Both consumers' Q tiles, by one thread, completing on q_full.
template <int kD, int kBc, int kStages, int kConsumers>
__device__ void load_q(const CUtensorMap* q_map, unsigned char* smem, const Barriers& b, int q0, int bh) {
  using L = Smem<kD, kBc, kStages, kConsumers>;
  arrive_expecting(b.q_full, kConsumers * L::kQBytes);
  for (int c = 0; c < kConsumers; ++c)
    load_tile(q_map, smem + L::q + c * L::kQBytes, b.q_full, q0 + c * kRowsPerConsumer, bh);
}

/// The producer's work for one tile, by one thread: both consumers' Q of query head bh, then
/// K/V blocks first..last of K/V head kvh through the ring; rows from the sequence's `start`.
template <int kD, int kBc, int kStages, int kConsumers>
__device__ void produce(const CUtensorMap* q_map, const CUtensorMap* k_map, const CUtensorMap* v_map,
                        unsigned char* smem, const Barriers& b, int q0, int first, int last, int bh, int kvh,
                        int start = 0) {
  load_q<kD, kBc, kStages, kConsumers>(q_map, smem, b, start + q0, bh);
  for (int j = first; j <= last; ++j)
    load_kv<kD, kBc, kStages, kConsumers>(k_map, v_map, smem, b, j, j - first, kvh, start);
}

/// The K/V blocks tile i of `rows` query rows visits: from the one holding the first key its
/// first row keeps to the one holding the last key its last row keeps (the band: step07.hpp).
struct KvRange {
  int first, last;
};
__device__ __forceinline__ KvRange kv_range(const Band& band, int N, int i, int rows, int keys) {
  const int q0 = i * rows, q1 = (q0 + rows < N ? q0 + rows : N) - 1;
  return {band.first_key(q0) / keys, band.last_key(q1, N) / keys};
}

/// What a ragged batch's forward kernels take beside the dense ones': the table of query
/// blocks and the tiles' order (ragged_tables made both on the device), and, for the last
/// tile of a sequence, where TMA's box would carry O's rows into the next sequence, O's base
/// and the packed rows of a head.
struct RaggedFwd {
  const SeqBlock* blocks;
  const TileOrder* order;
  void* o;
  int packed_rows;  ///< T
};

/// The tables of a ragged batch's query blocks of `rows` rows and their tiles' order, made on
/// the stream in the workspace (ragged_tables; the tile counter zeroed): what the kernels take.
RaggedFwd ragged_forward(const Problem& p, const NativeFwdArgs& a, int rows, void* workspace, Stream s);

/// `f.template operator()<kBanded>()` for p's band. kBanded = false where the band has no edge
/// (neither causal nor a window): the mask then tests only keys past N, a shorter main loop.
template <class F>
void with_band(const Problem& p, F&& f) {
  band_of(p).open() ? f.template operator()<false>() : f.template operator()<true>();
}

/// A consumer warpgroup: 64 query rows of the block, their O, m, ℓ in registers.
/// Thread layout: warp w of the warpgroup owns rows 16w..16w+15, lane = 4g + t.
template <class T, int kD, int kBc, int kStages, int kConsumers, bool kBanded, bool kRagged = false>
struct Consumer {
  using L = Smem<kD, kBc, kStages, kConsumers>;

  unsigned char* smem;
  const Barriers& bars;
  int c, warp, lane, g, t, r0, N;
  float mul;  // exp(scale·(s − m)) = 2^(s·mul − m·mul): m is kept in units of s
  std::uint32_t q_tile;
  Band band;  // the scores its rows keep: the causal mask, a window
  // A ragged batch's (in_sequence): N is the sequence's length, r0 counts from its first row.
  int start = 0;          // the sequence's first row in the packed tensors
  const RaggedFwd* rg = nullptr;

  float o[kD / 2] = {};  // O: 64 × kD; register 4n + 2h + e = row g + 8h, column 8n + 2t + e
  float m[2] = {-INFINITY, -INFINITY};  // [row g, g+8]: the running max, in units of s
  float l[2] = {0.0f, 0.0f};            // [row g, g+8]: this lane's part of ℓ
  float s[kBc / 2];                     // S, then P (fp32): 64 × kBc in the same layout
  std::uint32_t p[kBc / 16][4];         // P in 16 bits as wgmma A fragments: [k step][register]

  __device__ Consumer(unsigned char* smem_, const Barriers& b, int consumer, int q0, int N_, float scale, Band band_)
      : smem(smem_), bars(b), c(consumer), warp(threadIdx.x / 32 % 4), lane(threadIdx.x % 32), g(lane / 4),
        t(lane % 4), r0(q0 + consumer * kRowsPerConsumer + 16 * (threadIdx.x / 32 % 4)), N(N_),
        mul(scale * step06::kLog2e), q_tile(smem_u32(smem_ + L::q + consumer * L::kQBytes)), band(band_) {}

  /// S = Q_c·K_jᵀ from stage `stage`: kD/16 k steps, both operands K-major in shared memory.
  __device__ void issue_qk(int stage) {
    const std::uint32_t k_tile = smem_u32(smem + L::k + stage * L::kKVBytes);
    wgmma_fence();
    ss_kk<T, kBc, kD>(s, q_tile, kRowsPerConsumer, k_tile, kBc);
    wgmma_commit();
  }
  /// O += P·V_j from stage `stage`: kBc/16 k steps of 16 V rows (2048 bytes); V is
  /// MN-major (its rows are the k index), its panels kBc·128 bytes apart (LBO).
  __device__ void issue_pv(int stage) {
    const std::uint32_t v_tile = smem_u32(smem + L::v + stage * L::kKVBytes);
    wgmma_fence();
    rs_mn<T, kD, kBc>(o, p, v_tile, kBc * 128);
    wgmma_commit();
  }
  __device__ void wait_s() { wgmma_wait<0>(s); }
  /// Waits for S while the P·V issued after it may still run.
  __device__ void wait_s_not_pv() { wgmma_wait<1>(s); }
  /// Waits for P·V: only then may O be rescaled and P's registers be overwritten.
  __device__ void wait_pv() {
    wgmma_wait<0>(o);
    fence_registers(p);
  }
  __device__ void release_k(int stage) {
    if (lane == 0) arrive(&bars.k_empty[stage]);
  }
  __device__ void release_v(int stage) {
    if (lane == 0) arrive(&bars.v_empty[stage]);
  }

  /// The mask, only on blocks where this warp's 16 rows can meet it: the last (keys past N)
  /// and, with a banded kernel, those across an edge of the band (causal: reaching past the
  /// warp's first row).
  __device__ void mask(int j) {
    const int k0 = j * kBc;
    if (kBanded ? band.cuts(r0, r0 + 15, k0, k0 + kBc - 1, N) : k0 + kBc > N) {
#pragma unroll
      for (int x = 0; x < kBc / 2; ++x) {  // x = 4n + 2h + e: row g + 8h, key 8n + 2t + e
        const int row = r0 + g + 8 * (x % 4 / 2), col = k0 + 8 * (x / 4) + 2 * t + x % 2;
        if (kBanded ? !band.keeps(row, col, N) : col >= N) s[x] = -INFINITY;
      }
    }
  }

  /// Online softmax on S — step 06's, with its lazy rescaling: m moves only when some
  /// row of the warp saw its max grow by more than 2^kRescaleBits. S becomes P (fp32),
  /// m and ℓ move; returns whether O must be multiplied by alpha (per row h).
  __device__ bool softmax(float (&alpha)[2]) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int x = 0; x < kBc / 2; ++x) mx[x % 4 / 2] = fmaxf(mx[x % 4 / 2], s[x]);
    bool grow = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) grow |= (mx[h] - m[h]) * mul > step06::kRescaleBits;
    const bool rescale = __any_sync(0xffffffffu, grow);  // one decision per warp: no divergence
    float ms[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      alpha[h] = 1.0f;
      if (rescale) {  // the row's max: the quad holding it
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float m_new = fmaxf(m[h], mx[h]);
        // 0 on the first block (m = −∞); −∞ − (−∞) kept out.
        alpha[h] = mma::exp2_approx(m[h] * mul - (m_new == -INFINITY ? 0.0f : m_new * mul));
        m[h] = m_new;
      }
      ms[h] = m[h] == -INFINITY ? 0.0f : m[h] * mul;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int x = 0; x < kBc / 2; ++x) {  // one FFMA and one MUFU.EX2 per score
      s[x] = mma::exp2_approx(fmaf(s[x], mul, -ms[x % 4 / 2]));
      sum[x % 4 / 2] += s[x];
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = (rescale ? alpha[h] * l[h] : l[h]) + sum[h];
    return rescale;
  }
  __device__ void rescale_o(const float (&alpha)[2]) {
#pragma unroll
    for (int x = 0; x < kD / 2; ++x) o[x] *= alpha[x % 4 / 2];
  }
  /// P rounded to 16 bits into the A fragments of P·V (the one rounding inside the
  /// algorithm): registers 4n..4n+3 of S are columns 8n..8n+7; two n make a k step.
  __device__ void to_p() { to_a<T, kBc>(s, p); }

  // The schedule of h4 and after (forward.cu), a turn on the tensor cores at a time: this
  // consumer's named barrier, then the turn handed to consumer `next`. r counts the K/V
  // blocks through the ring (r = j on a grid of a block a tile). `s_done` runs once S_j is
  // in and K_j released (h9 releases its Q tile after a tile's last S there).

  /// The tile's first block j: S_j alone in a turn, its softmax (O is still 0: nothing to rescale).
  template <class SDone>
  __device__ void first_block(int j, int r, int next, SDone&& s_done) {
    float alpha[2];
    named_sync(turn_bar(c), 2 * 128);
    wait(&bars.k_full[r % kStages], (r / kStages) % 2);
    issue_qk(r % kStages);
    named_arrive(turn_bar(next), 2 * 128);
    wait_s();
    release_k(r % kStages);
    s_done();
    mask(j);
    softmax(alpha);
    to_p();
  }
  /// Block j ≥ 1: S_j and P_{j−1}·V_{j−1} in one turn; the softmax of j while P·V runs.
  template <class SDone>
  __device__ void next_block(int j, int r, int next, SDone&& s_done) {
    const int sj = r % kStages, sp = (r - 1) % kStages;
    float alpha[2];
    named_sync(turn_bar(c), 2 * 128);
    wait(&bars.k_full[sj], (r / kStages) % 2);
    issue_qk(sj);
    wait(&bars.v_full[sp], ((r - 1) / kStages) % 2);
    issue_pv(sp);
    named_arrive(turn_bar(next), 2 * 128);
    wait_s_not_pv();
    release_k(sj);
    s_done();
    mask(j);
    const bool rescale = softmax(alpha);
    wait_pv();
    release_v(sp);
    if (rescale) rescale_o(alpha);
    to_p();
  }
  /// The last block's P·V (at ring position r) in a turn, handed on if `hand_on`.
  __device__ void last_pv(int r, int next, bool hand_on) {
    named_sync(turn_bar(c), 2 * 128);
    wait(&bars.v_full[r % kStages], (r / kStages) % 2);
    issue_pv(r % kStages);
    if (hand_on) named_arrive(turn_bar(next), 2 * 128);
    wait_pv();
  }

  /// Epilogue: ℓ = the quad's four parts; O/ℓ in 16 bits into `o_tile` (the panel
  /// layout the TMA store reads): this consumer's own Q tile, its last S being done, or
  /// on a persistent grid a tile of its own; L = m·scale + log ℓ from registers; one
  /// thread, the warpgroup's first, whose r0 is the tile's first row, stores the 64 rows by
  /// TMA (rows past N dropped by the map). Before o_tile is reused, or the block exits,
  /// that thread waits until the store has read it (stored).
  __device__ void store(const CUtensorMap* o_map, float* lse, int bh, float scale, unsigned char* o_tile) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
      const float inv = 1.0f / l[h];
      const int r = 16 * warp + g + 8 * h;
#pragma unroll
      for (int n = 0; n < kD / 8; ++n)
        *reinterpret_cast<std::uint32_t*>(o_tile + swizzled(kRowsPerConsumer, r, 8 * n + 2 * t)) =
            mma::Mma<T>::pack(o[4 * n + 2 * h] * inv, o[4 * n + 2 * h + 1] * inv);
      const int row = r0 + g + 8 * h;
      const std::size_t at = kRagged ? std::size_t(bh) * rg->packed_rows + start + row : std::size_t(bh) * N + row;
      if (t == 0 && row < N) lse[at] = online::lse(m[h] * scale, l[h]);
    }
    // Ordinary stores, then a TMA read of them: the async proxy must see them.
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
    named_sync(epilogue_bar(c), 128);
    if constexpr (kRagged) {
      // A box past the sequence's end would write the next sequence's rows: the rows before
      // it copied by hand, 16 bytes a thread at a time (o_tile is reused only after the next
      // epilogue's barrier, which every thread reaches after this).
      const int first = r0 - 16 * warp;  // the warpgroup's first row
      if (first + kRowsPerConsumer > N) {
        T* o = static_cast<T*>(rg->o) + (std::size_t(bh) * rg->packed_rows + start + first) * kD;
        store_rows<kD>(o, o_tile, kRowsPerConsumer, N - first, threadIdx.x % 128, 128);
        return;
      }
    }
    if (threadIdx.x % 128 == 0) {
      store_tile(o_map, o_tile, start + r0, bh);
      cuda::ptx::cp_async_bulk_commit_group();
    }
  }
  __device__ unsigned char* q_buffer() const { return smem + L::q + c * L::kQBytes; }
  /// A ragged batch's tile: its sequence's first row, the packed layout.
  __device__ void in_sequence(int start_, const RaggedFwd& rg_) {
    start = start_;
    rg = &rg_;
  }
};

/// By a consumer's storing thread (the first of its warpgroup): waits until its O store
/// has read shared memory.
__device__ __forceinline__ void stored() {
  if (threadIdx.x % 128 == 0) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
}

/// The four tensor maps of a forward launch: Q and O in 64-row boxes (one consumer's
/// rows) over B·H heads, K and V in boxes of kBc keys over B·H_kv heads: query head bh
/// reads K/V head bh / G (G = H/H_kv divides H, so b·H + h over G is b·H_kv + h/G).
struct ForwardMaps {
  CUtensorMap q, k, v, o;
};
ForwardMaps forward_maps(const Problem& p, const NativeFwdArgs& a, int keys);

/// The order of the forward's tiles, query blocks of `rows` rows (TileOrder, step07.hpp):
/// with the causal mask heaviest first across sections of heads; else head after head.
TileOrder forward_order(const Problem& p, int rows);
/// Query block i of head bh, from a forward tile's index head after head, bh·T_r + p (what
/// a persistent block's producer tells its warps: only it works out the sections' order,
/// TileOrder::at): a head's p-th tile in order of cost is its query block T_r − 1 − p,
/// since with the mask the last visits the most K/V blocks.
struct QueryTile {
  int i, bh;
};
__device__ __forceinline__ QueryTile query_tile(int head_major, int q_blocks) {
  return {q_blocks - 1 - head_major % q_blocks, head_major / q_blocks};
}
/// A grid of a block a tile in forward_order's order, tile_grid (TileOrder::grid_tile): this
/// block's query block and head, from the block's indices and the order (a kernel
/// parameter). Its consumers keep only their first row (Consumer::r0) and the head.
__device__ __forceinline__ QueryTile grid_tile(const TileOrder& order) {
  const TileOrder::At at = order.grid_tile(int(blockIdx.x), int(blockIdx.y), int(blockIdx.z));
  return {order.blocks - 1 - at.p, at.bh};
}
inline dim3 tile_grid(const TileOrder& o) {
  return dim3(unsigned(o.blocks), unsigned(o.section()), unsigned(o.heads >> o.shift));
}

/// The forward's kernels, which kForward chooses between (two_blocks_an_sm,
/// persistent_grid), each taking its tiles in forward_order's order:
///   run_specialised  the warp-specialised kernel a block a tile (forward.cu; lesson row h7,
///                    production at d = 256);
///   run_persistent   the same on a persistent grid (forward.cu; lesson row h9, production at
///                    d = 64 and 128); its workspace is the tile counter (tile_counter bytes);
///   run_short        two warpgroups that both compute, no producer (short.cu; lesson row h1,
///                    production for short problems at d = 64, where two blocks share an SM).
void run_specialised(const Problem& p, const NativeFwdArgs& a, void* workspace, Stream s);
void run_persistent(const Problem& p, const NativeFwdArgs& a, void* workspace, Stream s);
std::size_t tile_counter(const Problem& p);
void run_short(const Problem& p, const NativeFwdArgs& a, Stream s);
/// The production forward (kForward): the kernel for the problem.
void run_forward(const Problem& p, const NativeFwdArgs& a, void* workspace, Stream s);
std::size_t forward_workspace(const Problem& p);
std::size_t forward_ragged_workspace(const Problem& p, int sequences);

}  // namespace fa::step07
