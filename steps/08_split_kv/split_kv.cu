// Step 08's production kernels (step08.hpp: the plan; lesson.cu: the note's rows 2–4).
//
// split_kernel — one block a chunk of the plan, piece by piece (a piece: a run of one
// unit's tiles), each streamed through a ring of 64-key K/V tiles by cp.async. Warp w
// takes keys 16w … 16w+15 of every tile:
//   S = Q·K_wᵀ      mma.sync, Q's fragments in registers, two accumulator chains
//   online softmax  O's rescale skipped where no row of the warp has a new max (× 1 is exact)
//   O_w += P·V_w    P from registers, V transposed by ldmatrix
// The piece's epilogue merges the four warps through shared memory and writes O/ℓ and L:
// to O where each block is one unit, else as the block's part. On Hopper, where a unit's
// S ≤ 8 short chunks fit as one cluster, the cluster merges them through distributed
// shared memory (merge_in_cluster) and writes O and L.
// split_kernel_tma — Hopper, long chunks: the same, the ring filled by TMA from a producer
// warp, the compute warps waiting on mbarriers instead of issuing copies.
// Both take a paged cache (kPaged): each 16-key run of a tile (the TMA ring: each tile, its
// pages whole tiles) from its page of the pool, through the sequence's row of the block
// table, and the sequence's own length.
// combine_kernel — elsewhere: one block a row, launched early on Hopper, each row waiting
// for its parts' tags; the statistics of all parts first, then every part weighted.
#include <cooperative_groups.h>
#include <cuda/atomic>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <random>
#include <string>

#include "common/cuda/hopper.cuh"
#include "common/cuda_check.cuh"
#include "common/gpu.hpp"
#include "steps/02_fused/tile.hpp"
#include "steps/03_online_softmax/online_softmax.hpp"
#include "common/cuda/mma.cuh"
#include "steps/06_tensor_cores/step06.hpp"
#include "steps/08_split_kv/step08.hpp"

namespace fa::step08 {
namespace {

using mma::cp_async_commit;
using mma::cp_async_wait;
using mma::exp2_approx;
using mma::smem_cols;
using mma::smem_u32;

/// The merge rule's statistics (m, ℓ) of a row's parts, merged across a warp's 32 lanes
/// pairwise (xor butterfly). Every lane ends with the same max; lane 0's ℓ is the one the
/// CPU model computes (stats_tree: lane 0 keeps the left part first at every level).
__device__ __forceinline__ void merge_across_warp(float& m, float& l) {
#pragma unroll
  for (int x = 1; x < 32; x *= 2) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, x), l2 = __shfl_xor_sync(0xffffffffu, l, x);
    online::merge(m, l, nullptr, m2, l2, nullptr, 0);
  }
}

/// A piece's epilogue in shared memory, over the ring (free by then), after Q: the four
/// warps' states, the rows' statistics, and this block's part of its unit's rows for its
/// cluster's merge.
template <int kD>
struct EpilogueSmem {
  float* Ow;  // [kWarps][kRows][kD]: each warp's O
  float* Mw;  // [kWarps][kRows]: m in natural units (m·scale)
  float* Lw;  // [kWarps][kRows]: ℓ
  float* Ww;  // [kWarps][kRows]: the weight e^(m_w − M)
  float* Ms;  // [kRows]: M, the row's max over the four warps
  float* Ls;  // [kRows]: ℓ of the four
  float* Po;  // [kRows][kD]: the block's part O/ℓ (clusters only)
  float* Pl;  // [kRows]: its L
  static constexpr std::size_t kFloats = kWarps * kRows * (kD + 3) + 2 * kRows + kRows * (kD + 1);
  __device__ explicit EpilogueSmem(unsigned char* at)
      : Ow(reinterpret_cast<float*>(at)),
        Mw(Ow + kWarps * kRows * kD),
        Lw(Mw + kWarps * kRows),
        Ww(Lw + kWarps * kRows),
        Ms(Ww + kWarps * kRows),
        Ls(Ms + kRows),
        Po(Ls + kRows),
        Pl(Po + kRows * kD) {}
};

/// How the split kernel's K/V reads ask the L2 to keep their lines: as any load, or
/// evict-first where K and V are at most a few L2s (reads_evict_first). (0 is neither: a
/// zeroed SplitArgs asks for no policy by mistake.)
enum class KvLines { normal = 1, evict_first = 2 };

template <class T>
struct SplitArgs {
  int N, Nk, H, group;   // queries, keys, query heads a batch, query heads per K/V head
  int row_blocks;        // units a K/V head: ⌈G·N/16⌉
  std::size_t rows;      // B·H·N: rows of O, L and of each part's partials
  bool causal;
  float scale;
  KvLines kv;            // the K/V reads' L2 policy: normal or evict_first
  SplitPlan plan;        // plan.cluster > 1: each unit's blocks one cluster, merging there
  const T *q, *k, *v;
  T* o;                  // [B·H·N][d], written when plan.direct()
  float* lse;            // [B·H·N]
  float *part_o, *part_lse;  // [parts][B·H·N][d] and [parts][B·H·N] for the merge kernel
};

/// The partials' tags [parts][B·H·N], after the partials: a block releases this call's tag
/// for each row of its part once written, and the merge kernel's rows acquire their own
/// parts' tags, not the whole split kernel. at = nullptr where no merge kernel waits.
/// (A parameter of its own: 16 bytes more in SplitArgs make ptxas spill the two-tile ring.)
struct Tags {
  unsigned long long* at;
  unsigned long long tag;
};

/// A paged cache as the split kernel reads it (Paged, with the table's width): a 16-key run
/// of a tile lies in one page (a page is a whole number of runs), so a tile is at most four
/// places. Lengths and page numbers are clamped here, as nothing on the device checks them.
struct PagedRead {
  const int *table, *lengths;  // lengths: null where every sequence holds N_kv keys
  int page, pool, width;       // width: pages a sequence (⌈N_kv/page⌉)
};
/// Keys of the sequence of K/V head kvh (of kv_heads a batch): its length, within [N, N_kv].
__device__ __forceinline__ int paged_keys(const PagedRead& pg, int kvh, int kv_heads, int N, int Nk) {
  return pg.lengths ? min(max(pg.lengths[kvh / kv_heads], N), Nk) : Nk;
}
/// One K/V head of a paged cache as a piece reads it, worked out once a piece: its sequence's
/// row of the table and its head among the H_kv whose rows share each page.
struct PagedHead {
  const int* row;    // the sequence's row of the block table
  int head, kv_heads;
};
__device__ __forceinline__ PagedHead paged_head(const PagedRead& pg, int kvh, int kv_heads) {
  return {pg.table + std::size_t(kvh / kv_heads) * pg.width, kvh % kv_heads, kv_heads};
}
/// A walk along a head's pages from key k0, the one division a tile: then each 16-key run
/// steps down its page, and to the next page at the page's end, as a page is a whole number
/// of runs. At each step: the page (clamped into the pool), its rows' head in the pool's
/// heads (pages × H_kv) and the row there.
struct PageWalk {
  const PagedRead& pg;
  const PagedHead& ph;
  int x, at;  // the sequence's page x, row `at` of it
  __device__ PageWalk(const PagedRead& pg, const PagedHead& ph, int k0)
      : pg(pg), ph(ph), x(k0 / pg.page), at(k0 - x * pg.page) {}
  __device__ int pool_head() const { return min(max(ph.row[x], 0), pg.pool - 1) * ph.kv_heads + ph.head; }
  __device__ std::uint32_t pool_row() const { return std::uint32_t(pool_head()) * pg.page + at; }  // of the pool's rows
  __device__ void next(int rows) {
    at += rows;
    if (at == pg.page) at = 0, ++x;
  }
};

/// Where the ring's tiles start: after Q's 16 rows.
template <class T, int kD>
__device__ __forceinline__ unsigned char* after_q(unsigned char* smem) {
  return smem + kRows * smem_cols(kD) * sizeof(T);
}

/// One tile's softmax for a warp, on S's accumulators (16 rows × its 16 keys from key k0):
/// the mask where it can bite, the online update of (m, ℓ) and O's rescale, and P as the
/// A fragments of P·V.
template <class T, int kD>
__device__ __forceinline__ void online_step(const SplitArgs<T>& a, float (&s)[1][kKeysPerWarp / 8][4],
                                            float (&acc)[1][kD / 8][4], float (&m)[2], float (&l)[2],
                                            std::uint32_t (&pa)[1][1][4], int Nk, int k0, int r0, int g, int t,
                                            float mul) {
  const int N = a.N;
  // The mask, where it can bite: keys past N_kv, or (causal) keys past the earliest
  // query position, Nk − N.
  if (k0 + kKeysPerWarp > Nk || (a.causal && k0 + kKeysPerWarp - 1 > Nk - N)) {
#pragma unroll
    for (int nt = 0; nt < kKeysPerWarp / 8; ++nt)
#pragma unroll
      for (int x = 0; x < 4; ++x) {  // x = 2h + e: row g + 8h, key 8nt + 2t + e
        const int pos = Nk - N + (r0 + g + 8 * (x / 2)) % N;
        if (tiles::masked(pos, k0 + 8 * nt + 2 * t + x % 2, Nk, a.causal)) s[0][nt][x] = -INFINITY;
      }
  }

  // Online softmax (lecture p21): the row's max over the quad, then rescale and add.
  float alpha[2];             // rows g, g+8: e^(m_old − m_new)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = m[h];
#pragma unroll
    for (int nt = 0; nt < kKeysPerWarp / 8; ++nt) mx = fmaxf(mx, fmaxf(s[0][nt][2 * h], s[0][nt][2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // Until the row meets an unmasked key m = −∞: ms = 0 keeps −∞ − (−∞) out, and
    // alpha = 2^(−∞) = 0 clears nothing that is not zero already.
    const float ms = mx == -INFINITY ? 0.0f : mx * mul;
    alpha[h] = exp2_approx(m[h] * mul - ms);  // exactly 1 where the max did not move
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < kKeysPerWarp / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[0][nt][2 * h + e];
        x = exp2_approx(fmaf(x, mul, -ms));
        sum += x;
      }
    l[h] = alpha[h] * l[h] + sum;
    m[h] = mx;
  }
  // O rescaled, unless no row of the warp has a new max: × 1 changes no bit, and past
  // the first tiles a row's max seldom moves, so most tiles skip the kD/2 multiplies.
  if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f))
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt)
#pragma unroll
      for (int x = 0; x < 4; ++x) acc[0][dt][x] *= alpha[x / 2];
  mma::to_a<T>(pa[0][0], s[0][0], s[0][1]);
}

/// Where a piece of a block's chunk works: its unit's K/V head kvh and packed rows r0 … r0 + 15
/// (of the head's G·N), the rows that exist and the first of them in Q, O and L (packed row
/// r is row base + r), its tiles [t0, t1) — fewer than the plan's piece past the causal
/// mask's end or its sequence's keys —, the part of its unit's rows it writes, and the keys
/// its K/V head holds (N_kv, or its sequence's length in a paged cache).
struct PieceAt {
  int kvh, r0, rows;
  std::size_t base;
  int t0, t1, part, keys;
};
template <bool kPaged, class T>
__device__ __forceinline__ PieceAt piece_at(const SplitArgs<T>& a, const PagedRead& pg, const SplitPlan::Piece pc,
                                            int part) {
  const int kvh = int(pc.unit / a.row_blocks), rb = int(pc.unit % a.row_blocks);
  const int rows = unit_rows(a.group, a.N, a.row_blocks, pc.unit);
  const std::size_t base = first_row(a.H, a.group, a.N, a.row_blocks, pc.unit);
  const int keys = kPaged ? paged_keys(pg, kvh, a.H / a.group, a.N, a.Nk) : a.Nk;
  const int end = tile_end(a.N, keys, a.group, a.causal, rb);
  return {kvh, rb * kRows, rows, base, pc.t0, pc.t1 < end ? pc.t1 : end, part, keys};
}
/// Block b's chunk, piece by piece (a piece ends where the chunk or its unit does): run(piece).
template <bool kPaged, class T, class Run>
__device__ __forceinline__ void for_each_piece(const SplitArgs<T>& a, const PagedRead& pg, int b, Run&& run) {
  for (long long from = a.plan.begin(b); from < a.plan.end(b);) {
    const SplitPlan::Piece pc = a.plan.piece(from, a.plan.end(b));
    from += pc.t1 - pc.t0;
    run(piece_at<kPaged>(a, pg, pc, b - a.plan.first(pc.unit)));
    __syncthreads();  // the epilogue's reads of shared memory done before the next piece's copies
  }
}

/// A piece's epilogue, after its main loop: the four warps' states (acc, m, l) merged and the
/// rows' O/ℓ and L (or the block's part of them) written. `computes`: false for a thread
/// that only joins the block's barriers (the TMA kernel's producer warp).
template <class T, int kD>
__device__ __forceinline__ void finish_piece(const SplitArgs<T>& a, const PieceAt& pc, const Tags& tags,
                                             const float (&acc)[1][kD / 8][4], const float (&m)[2], float (&l)[2],
                                             bool computes) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int rows = pc.rows, part = pc.part;
  const std::size_t base = pc.base;
  // Epilogue, in the ring (free once every copy landed and every warp left the loop):
  // the four warps merged as the merge kernel merges parts, statistics first, then O.
  cp_async_wait<0>();
  __syncthreads();
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const EpilogueSmem<kD> ep(after_q<T, kD>(smem_raw));
  float *Ow = ep.Ow, *Mw = ep.Mw, *Lw = ep.Lw, *Ww = ep.Ww, *Ms = ep.Ms, *Ls = ep.Ls;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);  // the quad's four parts of ℓ
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const int r = g + 8 * h;
    if (!computes) break;
    if (t == 0) Mw[warp * kRows + r] = m[h] * a.scale, Lw[warp * kRows + r] = l[h];
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt)
      *reinterpret_cast<float2*>(&Ow[(warp * kRows + r) * kD + 8 * dt + 2 * t]) =
          make_float2(acc[0][dt][2 * h], acc[0][dt][2 * h + 1]);
  }
  __syncthreads();
  if (threadIdx.x < kRows) {  // row r's statistics and weights, once (not once per element)
    const int r = threadIdx.x;
    float mm = Mw[r], ll = Lw[r];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) online::merge(mm, ll, nullptr, Mw[w * kRows + r], Lw[w * kRows + r], nullptr, 0);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) Ww[w * kRows + r] = online::rescale(Mw[w * kRows + r], mm);
    Ms[r] = mm, Ls[r] = ll;
  }
  __syncthreads();
  // Element (r, c): c fastest, stores coalesce (none for a thread that only joins the barriers).
  for (int e = computes ? int(threadIdx.x) : rows * kD; e < rows * kD; e += kThreads) {
    const int r = e / kD, c = e % kD;
    const float mm = Ms[r], ll = Ls[r];
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += Ww[w * kRows + r] * Ow[(w * kRows + r) * kD + c];
    const std::size_t row = base + r;
    if (a.plan.direct()) {
      a.o[row * kD + c] = T(o / ll);
      if (c == 0) a.lse[row] = online::lse(mm, ll);
      continue;
    }
    // A part: (O/ℓ, L), and an empty one (no key for this row) (0, −∞): weight 0 in the merge.
    const float po = ll > 0.0f ? o / ll : 0.0f, pl = ll > 0.0f ? online::lse(mm, ll) : -INFINITY;
    if (a.plan.cluster > 1) {  // kept here for the cluster's merge
      ep.Po[r * kD + c] = po;
      if (c == 0) ep.Pl[r] = pl;
    } else {  // to HBM for the merge kernel
      const std::size_t at = std::size_t(part) * a.rows + row;
      a.part_o[at * kD + c] = po;
      if (c == 0) a.part_lse[at] = pl;
    }
  }
#if __CUDA_ARCH__ >= 900  // (the merge kernel is launched early, and so waits for tags, on Hopper only)
  if (tags.at != nullptr) {  // this part of the unit's rows written: announced, row by row
    __threadfence();        // (this thread's partials before the barrier, and so before the tags)
    __syncthreads();
    if (int(threadIdx.x) < rows)
      cuda::atomic_ref<unsigned long long, cuda::thread_scope_device>(
          tags.at[std::size_t(part) * a.rows + base + threadIdx.x])
          .store(tags.tag, cuda::memory_order_release);
  }
#endif
}

/// One piece of a block's chunk (PieceAt), through a ring of kStages tiles; kPaged: K and V
/// are pools of pages (PagedRead).
template <class T, int kD, int kStages, bool kPaged>
__device__ __forceinline__ void run_piece(const SplitArgs<T>& a, const PieceAt& pc, const Tags& tags,
                                          const PagedRead& pg) {
#if FA_MMA_ARCH_OK
  constexpr int kW = smem_cols(kD);
  static_assert(EpilogueSmem<kD>::kFloats * sizeof(float) <= 2 * kStages * kTileKeys * kW * sizeof(T),
                "the epilogue's per-warp states and the cluster's part fit in the ring they reuse");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* Qs = reinterpret_cast<T*>(smem_raw);  // [kRows][kW], swizzled
  T* Ks = Qs + kRows * kW;                 // [kStages][kTileKeys][kW]: the ring
  T* Vs = Ks + kStages * kTileKeys * kW;   // [kStages][kTileKeys][kW]

  mma::require_aligned_smem(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int Nk = pc.keys, r0 = pc.r0, rows = pc.rows, t0 = pc.t0, t1 = pc.t1;
  const std::size_t base = pc.base, kv_head = std::size_t(pc.kvh) * a.Nk * kD;
  const int last_key = Nk < t1 * kTileKeys ? Nk : t1 * kTileKeys;  // keys past the piece are not read
  const float mul = a.scale * step06::kLog2e;  // exp(scale·(s − m)) = 2^(s·mul − m·mul)

  auto slot_of = [&](int tile) { return (tile - t0) % kStages; };  // the ring's slot holding `tile`
  const PagedHead ph = kPaged ? paged_head(pg, pc.kvh, a.H / a.group) : PagedHead{};
  const mma::L2Hint once = mma::l2_evict_first();  // (used where a.kv asks for it)
  auto load_tile = [&](int tile) {  // tile `tile` of this head into its slot of the ring
    const int k0 = tile * kTileKeys, slot = slot_of(tile);
    auto copy = [&](auto hint) {
      if constexpr (kPaged) {  // each 16-key run from its page (none read past the sequence's keys)
        std::uint32_t runs[kTileKeys / 16];
        PageWalk walk(pg, ph, k0);
#pragma unroll
        for (int j = 0; j < kTileKeys / 16; ++j, walk.next(16)) runs[j] = k0 + 16 * j < last_key ? walk.pool_row() : 0;
        mma::copy_runs_async<kThreads, kD, kTileKeys>(Ks + slot * kTileKeys * kW, a.k, runs, last_key - k0, hint);
        mma::copy_runs_async<kThreads, kD, kTileKeys>(Vs + slot * kTileKeys * kW, a.v, runs, last_key - k0, hint);
      } else {
        const std::size_t from = kv_head + std::size_t(k0) * kD;
        mma::copy_tile_async<kThreads, kD, kTileKeys, true>(Ks + slot * kTileKeys * kW, a.k + from, last_key - k0,
                                                            hint);
        mma::copy_tile_async<kThreads, kD, kTileKeys, true>(Vs + slot * kTileKeys * kW, a.v + from, last_key - k0,
                                                            hint);
      }
    };
    a.kv == KvLines::evict_first ? copy(once) : copy(mma::NoL2Hint{});
  };

  float acc[1][kD / 8][4] = {};  // O_w: [m-tile][8-column n-tile][register] (rows g, g+8 × columns 2t, 2t+1)
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g, g+8: max (units of s), this lane's part of ℓ

  // Prologue: Q, then the first kStages − 1 tiles, one commit group each.
  if (t0 < t1) mma::copy_tile_async<kThreads, kD, kRows>(Qs, a.q + base * kD, rows);
  cp_async_commit();
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (t0 + st < t1) load_tile(t0 + st);
    cp_async_commit();  // (an empty group past the chunk's end keeps the count uniform)
  }
  // Q into registers once, as the A fragments of every tile's S (while the tiles land).
  cp_async_wait<kStages - 1>();  // Q landed (this thread's copies) ...
  __syncthreads();               // ... everyone's
  std::uint32_t qa[kD / 16][1][4];  // [16-column k step][m-tile][register]
  mma::load_a_fragments<kD, 1>(qa, smem_u32(Qs), 0, lane);
  // This lane's ldmatrix address of its warp's 16 keys in slot 0's first tile; a tile
  // further on is a whole number of tiles (16 KiB at d = 128) further.
  const std::uint32_t k_at = mma::b_fragments_at<kD>(smem_u32(Ks), kKeysPerWarp * warp, lane);

  // Main loop over the chunk's tiles.
  for (int tile = t0; tile < t1; ++tile) {
    const int slot = slot_of(tile);
    cp_async_wait<kStages - 2>();  // this tile landed (Q's group and the tiles' before it) ...
    __syncthreads();               // ... everyone's, and every warp is done with the last tile
    const int next = tile + kStages - 1;
    if (next < t1) load_tile(next);  // into the last tile's slot
    cp_async_commit();
    const int k0 = tile * kTileKeys + kKeysPerWarp * warp;
    const int at = slot * kTileKeys;  // the tile's first row in the ring
    const T* Vt = Vs + (at + kKeysPerWarp * warp) * kW;  // this warp's 16 rows of V

    // S = Q·K_wᵀ: 16 rows × this warp's 16 keys.
    float s[1][kKeysPerWarp / 8][4] = {};  // [m-tile][8-key n-tile][register]
    mma::gemm_abt_regs<T, kD, 1, kKeysPerWarp / 8>(s, qa, k_at + at * kW * sizeof(T));

    std::uint32_t pa[1][1][4];  // [m-tile][16-key k-chunk][register]: P as the A operand of P·V
    online_step<T, kD>(a, s, acc, m, l, pa, pc.keys, k0, r0, g, t, mul);

    // O_w += P·V_w, P rounded to 16 bits (the one rounding inside the algorithm).
    mma::gemm_pv<T, kD, 1, kKeysPerWarp>(acc, pa, smem_u32(Vt));
  }

  finish_piece<T, kD>(a, pc, tags, acc, m, l, true);
#endif
}

#if __CUDA_ARCH__ >= 900
/// The cluster's merge: block rank s holds part s of its unit. The merge kernel's rule and
/// its sums in its order (at most kMaxCluster parts: one a lane there), so its bits: one
/// warp a row, lane s < S reading part s's L from block s, then lane q summing columns
/// 4q … 4q + 3 of every part in order.
template <class T, int kD>
__device__ __forceinline__ void merge_in_cluster(const SplitArgs<T>& a, unsigned char* smem_raw) {
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const EpilogueSmem<kD> ep(after_q<T, kD>(smem_raw));
  cluster.sync();  // every block's part written (a release by each block, an acquire by all)
  const int S = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const long long unit = blockIdx.x / S;
  const int rows = unit_rows(a.group, a.N, a.row_blocks, unit);
  const std::size_t base = first_row(a.H, a.group, a.N, a.row_blocks, unit);
  for (int r = rank * kWarps + warp; r < rows; r += S * kWarps) {
    const float L = lane < S ? *cluster.map_shared_rank(ep.Pl + r, lane) : -INFINITY;
    float m = -INFINITY, l = 0.0f;
    if (lane < S) merge_part_stats(m, l, L);
    merge_across_warp(m, l);
    l = __shfl_sync(0xffffffffu, l, 0);  // lane 0's ℓ, as the merge kernel takes it
    const float w = lane < S ? online::rescale(L, m) : 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = 0; s < S; ++s) {
      const float ws = __shfl_sync(0xffffffffu, w, s);
      if (4 * lane < kD) {
        const float4 x = *reinterpret_cast<const float4*>(cluster.map_shared_rank(ep.Po + r * kD + 4 * lane, s));
        // The merge kernel's lane s: its one product (fmaf(w, x, 0)), added to the others in order.
        acc.x = __fadd_rn(acc.x, fmaf(ws, x.x, 0.0f)), acc.y = __fadd_rn(acc.y, fmaf(ws, x.y, 0.0f));
        acc.z = __fadd_rn(acc.z, fmaf(ws, x.z, 0.0f)), acc.w = __fadd_rn(acc.w, fmaf(ws, x.w, 0.0f));
      }
    }
    if (4 * lane < kD) {
      T* out = a.o + (base + r) * kD + 4 * lane;
      out[0] = T(acc.x / l), out[1] = T(acc.y / l), out[2] = T(acc.z / l), out[3] = T(acc.w / l);
    }
    if (lane == 0) a.lse[base + r] = online::lse(m, l);
  }
  cluster.sync();  // no block leaves (its shared memory) while another may still read it
}
#endif

/// The most blocks an SM holds with this ring, by the largest SM we build for (an H200's
/// 228 KiB, as the plan counts them): 3 with the small rings, 1 with four tiles or more at
/// d = 128. The launch bounds keep registers from allowing fewer.
template <int kD, int kRingTiles>
constexpr int kMostBlocksPerSm = blocks_fitting(kH200.smem_per_sm, kD, kRingTiles);

template <class T, int kD, int kStages, bool kPaged>
__global__ void __launch_bounds__(kThreads, (kMostBlocksPerSm<kD, kStages>))
    split_kernel(const SplitArgs<T> a, const Tags tags, const PagedRead pg) {
#if FA_MMA_ARCH_OK  // compiled out before sm_80 (common/cuda/mma.cuh)
#if __CUDA_ARCH__ >= 900
  // Programmatic dependent launch (CUDA C++ Programming Guide, "Programmatic Dependent
  // Launch and Synchronization"): the merge kernel may be launched from now on; its blocks
  // wait in cudaGridDependencySynchronize until this grid has finished and its writes
  // are visible, but the launch itself is off the critical path.
  cudaTriggerProgrammaticLaunchCompletion();
#endif
  for_each_piece<kPaged>(a, pg, blockIdx.x,
                         [&](const PieceAt& pc) { run_piece<T, kD, kStages, kPaged>(a, pc, tags, pg); });
#if __CUDA_ARCH__ >= 900
  if (a.plan.cluster > 1) {  // one piece a block: its unit's part number is its rank in the cluster
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    merge_in_cluster<T, kD>(a, smem_raw);
  }
#endif
#endif
}

// ---------------------------------------------------------------------------------
// Hopper: the ring filled by TMA from a producer warp (split_kernel_tma).
// The producer's lane 0 copies each K and V tile with one tensor copy onto the slot's
// `full` mbarrier; each compute warp waits on `full`, and arrives on `empty` when done
// with the slot; the producer waits on `empty` before refilling it. A slot's n-th fill is
// phase n of both, so a wait's parity is n mod 2. The compute warps no longer issue
// copies nor meet at a block barrier every tile.

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // (unused, and so not compiled, before Hopper)
/// A tile's panel (step07::swizzled): 64 keys × 64 columns, 128 bytes a key, 8 KiB.
constexpr std::uint32_t kPanelBytes = kTileKeys * 128;

/// A TMA tensor copy of the box at (key row `row`, panel `panel`, head `head`) of `map`
/// into dst, completing on bar, its L2 lines evict-first (PTX ISA, "cp.async.bulk.tensor",
/// the .L2::cache_hint qualifier, which libcu++'s cuda::ptx lacks) or as any load.
__device__ __forceinline__ void load_tile_tma(const CUtensorMap* map, void* dst, std::uint64_t* bar, int row, int panel,
                                              int head, mma::NoL2Hint) {
  const std::int32_t at[4] = {0, row, panel, head};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, map, at, bar);
}
__device__ __forceinline__ void load_tile_tma(const CUtensorMap* map, void* dst, std::uint64_t* bar, int row, int panel,
                                              int head, mma::L2Hint h) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(0), "r"(row), "r"(panel), "r"(head), "r"(smem_u32(bar)),
      "l"(h.policy)
      : "memory");
}

/// The TMA ring's mbarriers, where smem_bytes_tma puts them (after the V ring): full[kStages],
/// then empty[kStages].
template <int kD, int kStages>
__device__ __forceinline__ std::uint64_t* ring_barriers(unsigned char* smem) {
  return reinterpret_cast<std::uint64_t*>(smem + smem_bytes(kD, kStages));
}

/// One piece, as run_piece, with the ring filled by the producer warp. `filled`: the
/// ring's fills before this piece (the slots' phases go on from there). Returns the fills
/// of this piece: its tiles before the causal mask's end. kPaged: kmap and vmap are the
/// pools, [pages·H_kv, page, d], in the same boxes.
template <class T, int kD, int kStages, bool kPaged>
__device__ __forceinline__ int run_piece_tma(const SplitArgs<T>& a, const PieceAt& pc, const Tags& tags,
                                              const CUtensorMap* kmap, const CUtensorMap* vmap, int filled,
                                              const PagedRead& pg) {
  static_assert(kD == 128, "two 64-column panels a tile");
  constexpr std::uint32_t kTileBytes = kTileKeys * kD * sizeof(T);
  static_assert(EpilogueSmem<kD>::kFloats * sizeof(float) <= 2 * kStages * kTileBytes,
                "the epilogue's per-warp states fit in the ring they reuse");
  static_assert(kRows * smem_cols(kD) * sizeof(T) + 2 * kStages * kTileBytes == smem_bytes(kD, kStages),
                "Q and the ring end where ring_barriers puts the mbarriers");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* Qs = reinterpret_cast<T*>(smem_raw);       // [kRows][kD], step 06's swizzle
  unsigned char* Ks = after_q<T, kD>(smem_raw);  // [kStages] tiles in panels
  unsigned char* Vs = Ks + kStages * kTileBytes;
  std::uint64_t* full = ring_barriers<kD, kStages>(smem_raw);  // [kStages]
  std::uint64_t* empty = full + kStages;                       // [kStages]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int kvh = pc.kvh, r0 = pc.r0, rows = pc.rows, t0 = pc.t0, t1 = pc.t1;
  const std::size_t base = pc.base;
  const float mul = a.scale * step06::kLog2e;

  float acc[1][kD / 8][4] = {};  // O_w: [m-tile][8-column n-tile][register]
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  if (warp == kWarps) {  // the producer: one lane issues every copy of the piece
    if (lane == 0) {
      const PagedHead ph = kPaged ? paged_head(pg, kvh, a.H / a.group) : PagedHead{};
      auto fill = [&](auto hint) {
        for (int tile = t0; tile < t1; ++tile) {
          const int n = filled + tile - t0, slot = n % kStages;
          if (n >= kStages) hopper::wait(&empty[slot], (n / kStages - 1) & 1);  // its last tile consumed
          // The tile's rows; in a paged cache, from its page (pages of whole tiles on this ring), the
          // map's heads the pool's pages × H_kv, and rows past the sequence's end read too.
          int row = tile * kTileKeys, head = kvh;
          if constexpr (kPaged) {
            const PageWalk walk(pg, ph, row);
            row = walk.at, head = walk.pool_head();
          }
          hopper::arrive_expecting(&full[slot], 2 * kTileBytes);
          load_tile_tma(kmap, Ks + slot * kTileBytes, &full[slot], row, 0, head, hint);
          load_tile_tma(vmap, Vs + slot * kTileBytes, &full[slot], row, 0, head, hint);
        }
      };
      a.kv == KvLines::evict_first ? fill(mma::l2_evict_first()) : fill(mma::NoL2Hint{});
    }
  } else {
    // Prologue: Q by the compute warps (cp.async), into registers once.
    if (t0 < t1) mma::copy_tile_async<kThreads, kD, kRows>(Qs, a.q + base * kD, rows);
    cp_async_commit();
    cp_async_wait<0>();
    hopper::named_sync(1, kThreads);  // the compute warps' copies of Q (the producer is not waited for)
    std::uint32_t qa[kD / 16][1][4];  // [16-column k step][m-tile][register]
    mma::load_a_fragments<kD, 1>(qa, smem_u32(Qs), 0, lane);
    // This lane's ldmatrix rows in slot 0: K's B fragments (keys 16w + lane%8 + 8·(lane/16),
    // 8-column chunk (lane/8)%2 of a k step) and V's transposed ones (keys 16w + lane%8 +
    // 8·((lane/8)%2), chunk lane/16 of a 16-column step). The k step kk (n step dt) is the
    // chunk XOR 2·(kk%4) (dt%8) in panel kk/4 (dt/8).
    const int kr = kKeysPerWarp * warp + lane % 8 + 8 * (lane / 16), vr = kKeysPerWarp * warp + lane % 16;
    const std::uint32_t k_at = smem_u32(Ks) + kr * 128 + ((((lane / 8) % 2) ^ (kr % 8)) * 16);
    const std::uint32_t v_at = smem_u32(Vs) + vr * 128 + (((lane / 16) ^ (vr % 8)) * 16);

    // Main loop over the piece's tiles.
    for (int tile = t0; tile < t1; ++tile) {
      const int n = filled + tile - t0, slot = n % kStages;
      hopper::wait(&full[slot], (n / kStages) & 1);  // the tile landed
      const std::uint32_t kt = k_at + slot * kTileBytes, vt = v_at + slot * kTileBytes;
      const int k0 = tile * kTileKeys + kKeysPerWarp * warp;
      if (kPaged && k0 + kKeysPerWarp > pc.keys) {
        // V's rows past the sequence's keys hold another's keys or nothing: zeros, as P·V
        // takes them (P = 0 there, and 0·NaN is NaN). K's need not be: their S is masked.
        constexpr int kChunks = kD / 8;  // 16-byte chunks a row, over the panels
        for (int e = lane; e < kKeysPerWarp * kChunks; e += 32) {
          const int r = e / kChunks, p = e % kChunks / 8, c = e % 8;
          if (k0 + r >= pc.keys)
            *reinterpret_cast<uint4*>(Vs + slot * kTileBytes + p * kPanelBytes + (kKeysPerWarp * warp + r) * 128 +
                                      16 * c) = make_uint4(0, 0, 0, 0);
        }
        // The next TMA fill of the slot (async proxy) after these writes (PTX ISA, "membar/fence").
        cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
        __syncwarp();
      }

      // S = Q·K_wᵀ: 16 rows × this warp's 16 keys, the k steps in two chains.
      float s[1][kKeysPerWarp / 8][4] = {};  // [m-tile][8-key n-tile][register]
      mma::gemm_abt_regs_at<T, kD, 1, kKeysPerWarp / 8>(
          s, qa, [kt](int kk) { return (kt ^ (32u * (kk % 4))) + (kk / 4) * kPanelBytes; }, 128);

      std::uint32_t pa[1][1][4];  // [m-tile][16-key k-chunk][register]: P as the A operand of P·V
      online_step<T, kD>(a, s, acc, m, l, pa, pc.keys, k0, r0, g, t, mul);

      // O_w += P·V_w, P rounded to 16 bits, V read transposed.
      mma::gemm_pv_at<T, 1, kKeysPerWarp, kD>(
          acc, pa, [vt](int, int dt) { return (vt ^ (16u * (dt % 8))) + (dt / 8) * kPanelBytes; });
      __syncwarp();
      if (lane == 0) hopper::arrive(&empty[slot]);  // this warp is done with the slot
    }
  }
  finish_piece<T, kD>(a, pc, tags, acc, m, l, warp < kWarps);
  // The epilogue wrote the ring's bytes (generic proxy); the next piece's TMA copies
  // (async proxy) may overwrite them: the proxy fence (PTX ISA, "membar/fence").
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
  return t1 > t0 ? t1 - t0 : 0;
}

#endif

/// split_kernel with the ring filled by TMA from a producer warp (Hopper: sm_90 code only).
/// kmap, vmap: K and V as [B·H_kv, N_kv, d] in 64-key boxes, keys past N_kv read as zeros;
/// or (kPaged) the pools, [pages·H_kv, page, d], in the same boxes (a page: whole tiles).
template <class T, int kD, int kStages, bool kPaged>
__global__ void __launch_bounds__(kThreadsTma, 1)
    split_kernel_tma(const SplitArgs<T> a, const Tags tags, const __grid_constant__ CUtensorMap kmap,
                     const __grid_constant__ CUtensorMap vmap, const PagedRead pg) {
#if __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();  // (as split_kernel)
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  mma::require_aligned_smem(smem_raw);
  std::uint64_t* full = ring_barriers<kD, kStages>(smem_raw);  // [kStages]
  std::uint64_t* empty = full + kStages;                       // [kStages]
  if (threadIdx.x == kThreads) {  // the producer's lane 0
    // The tensor maps' descriptors fetched ahead of the first copies (PTX ISA, "prefetch,
    // prefetchu": .tensormap, which libcu++'s cuda::ptx lacks).
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(&kmap)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(&vmap)) : "memory");
    for (int i = 0; i < kStages; ++i) {
      cuda::ptx::mbarrier_init(&full[i], 1);        // the producer's arrival (and the tile's bytes)
      cuda::ptx::mbarrier_init(&empty[i], kWarps);  // one arrival a compute warp
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);  // visible to TMA
  }
  __syncthreads();
  // This block's chunk, piece by piece; `filled` counts the ring's fills so far.
  int filled = 0;
  for_each_piece<kPaged>(a, pg, blockIdx.x, [&](const PieceAt& pc) {
    filled += run_piece_tma<T, kD, kStages, kPaged>(a, pc, tags, &kmap, &vmap, filled, pg);
  });
#endif
}

/// The parts of each row merged: one block a row, 256 threads = d/4 column quads × J
/// lanes. The statistics of all parts first (M, ℓ and every weight e^(L_s − M), once),
/// then O = Σ e^(L_s − M)·O_s / ℓ, lane j taking parts s ≡ j (mod J): independent loads,
/// where a fold of the O's would make each wait for the last.
template <class T, int kD>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(const SplitArgs<T> a, const Tags tags) {
#if FA_MMA_ARCH_OK
  const std::size_t rows = a.rows, row = blockIdx.x;
  const float *part_o = a.part_o, *part_lse = a.part_lse;
  // The row's unit, and so its number of parts: row = (batch·H + h)·N + n is packed row
  // (h mod G)·N + n of K/V head batch·H_kv + h/G.
  const std::size_t n = row % a.N, h = row / a.N % a.H, batch = row / a.N / a.H;
  const std::size_t kvh = batch * (a.H / a.group) + h / a.group, packed = h % a.group * a.N + n;
  const int parts = a.plan.parts(static_cast<long long>(kvh) * a.row_blocks + static_cast<long long>(packed / kRows));
  constexpr int kQuads = kD / 4, kLanes = kCombineThreads / kQuads;
  static_assert(kMaxCluster <= kLanes, "a cluster's parts are one a lane here: the two merges' sums agree");
  __shared__ float ws[kMaxParts];            // the row's L of every part, then its weight e^(L_s − M)
  __shared__ float stats[2];                 // M and ℓ of all the row's parts
  __shared__ float4 sums[kLanes][kQuads];    // each lane's share of Σ e^(L_s − M)·O_s
  const int q = threadIdx.x % kQuads, j = threadIdx.x / kQuads;
  if (threadIdx.x < 32) {
    // The statistics as a tree: lane i folds parts i, i + 32, …, then a butterfly (lane 0
    // keeps the left part first: the model's stats_tree): 5 dependent levels, not 32.
    float m = -INFINITY, l = 0.0f;
    for (int s = threadIdx.x; s < parts; s += 32) {
#if __CUDA_ARCH__ >= 900  // (launched early, on Hopper only: part s announced, its block's writes visible from here on)
      const cuda::atomic_ref<unsigned long long, cuda::thread_scope_device> tag(tags.at[std::size_t(s) * rows + row]);
      while (tag.load(cuda::memory_order_acquire) != tags.tag) __nanosleep(200);
#endif
      const float L = part_lse[std::size_t(s) * rows + row];
      ws[s] = L;
      merge_part_stats(m, l, L);
    }
    merge_across_warp(m, l);
    // (M is the same in every lane: a max is exact in any order.)
    for (int s = threadIdx.x; s < parts; s += 32) ws[s] = online::rescale(ws[s], m);  // 0 if empty
    if (threadIdx.x == 0) stats[0] = m, stats[1] = l;
  }
  __syncthreads();
  const float m = stats[0], l = stats[1];
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
  for (int s = j; s < parts; s += kLanes) {
    const float w = ws[s];
    const float4 x = *reinterpret_cast<const float4*>(part_o + (std::size_t(s) * rows + row) * kD + 4 * q);
    acc.x = fmaf(w, x.x, acc.x), acc.y = fmaf(w, x.y, acc.y), acc.z = fmaf(w, x.z, acc.z), acc.w = fmaf(w, x.w, acc.w);
  }
  sums[j][q] = acc;
  __syncthreads();
  if (j == 0) {
    for (int jj = 1; jj < kLanes; ++jj)  // (the cluster's merge adds its products in this order)
      acc.x = __fadd_rn(acc.x, sums[jj][q].x), acc.y = __fadd_rn(acc.y, sums[jj][q].y),
      acc.z = __fadd_rn(acc.z, sums[jj][q].z), acc.w = __fadd_rn(acc.w, sums[jj][q].w);
    T* out = a.o + row * kD + 4 * q;
    out[0] = T(acc.x / l), out[1] = T(acc.y / l), out[2] = T(acc.z / l), out[3] = T(acc.w / l);
    if (q == 0) a.lse[row] = online::lse(m, l);
  }
#endif
}

/// Whether the code that runs here for the merge kernel was compiled for sm_90 or later
/// (from PTX of 9.0 or later): only then is it launched early, its rows waiting for their
/// parts' tags. A PTX build of 8.0 JIT-compiled for Hopper has no wait, and is launched
/// after the splits, as on every older GPU.
template <class T, int kD>
bool merge_waits() {
  static const bool kWaits = [] {
    cudaFuncAttributes f{};
    FA_CUDA_CHECK(cudaFuncGetAttributes(&f, combine_kernel<T, kD>));
    return f.ptxVersion >= 90;
  }();
  return kWaits;
}

/// This call's tag: new at every call — a random 64-bit start, then one more a call —, so
/// that a tag an earlier call left in the workspace never reads as this call's, and one
/// that the memory held before reads as this call's with a chance of 2^-64 a tag.
unsigned long long next_tag() {
  static std::atomic<unsigned long long> calls{(std::uint64_t(std::random_device{}()) << 32) | std::random_device{}()};
  return ++calls;
}

/// The TMA kernel's launch: K and V as [B·H_kv, N_kv, d] in 64-key boxes (step 07's tile
/// maps), without the 256-byte L2 promotion, which doubled the L2's traffic here (note 08,
/// "The ring by TMA"); a paged cache's pools as [pages·H_kv, page, d] in the same boxes.
template <class T, int kD, int kStages, bool kPaged>
void launch_tma(const Problem& p, const NativeFwdArgs& a, const SplitArgs<T>& args, const Tags& tags,
                const PagedRead& pg, Stream st) {
  const std::size_t smem = smem_bytes_tma(kD, kStages);
  const int rows = kPaged ? pg.page : p.keys();  // a head's rows: a page's, or N_kv
  const std::size_t heads = kPaged ? std::size_t(pg.pool) * p.kv_heads_per_batch() : p.kv_heads();
  auto map = [&](const void* x) {
    return hopper::make_tile_map(x, p.dtype, rows, heads, kD, kTileKeys, CU_TENSOR_MAP_L2_PROMOTION_NONE);
  };
  const CUtensorMap kmap = map(a.k), vmap = map(a.v);
  set_smem_limit(split_kernel_tma<T, kD, kStages, kPaged>, smem);
  split_kernel_tma<T, kD, kStages, kPaged>
      <<<unsigned(args.plan.blocks), kThreadsTma, smem, st>>>(args, tags, kmap, vmap, pg);
}

/// The split kernel with a ring of kStages tiles (and the merge kernel where the plan needs
/// it); tma: the ring filled by a producer warp (ring_by_tma: d = 128 only); kPaged: K and
/// V a paged cache (a.paged).
template <class T, int kD, int kStages, bool kPaged>
void launch(const Problem& p, const NativeFwdArgs& a, void* ws, Stream st, const SplitPlan& sp, KvLines kv, bool tma) {
  const std::size_t smem = smem_bytes(kD, kStages);
  auto* kernel = split_kernel<T, kD, kStages, kPaged>;
  set_smem_limit(kernel, smem);
  float* part_o = static_cast<float*>(ws);
  float* part_lse = part_o ? part_o + std::size_t(most_parts(sp)) * p.elems() : nullptr;
  // The tags after the partials (8-byte aligned), where the merge kernel is launched early
  // and waits for them (no workspace where nothing merges).
  const bool early = merge_waits<T, kD>();
  Tags tags{nullptr, next_tag()};
  if (early && sp.merge_kernel()) {
    const std::uintptr_t end = reinterpret_cast<std::uintptr_t>(part_lse + most_parts(sp) * p.rows());
    tags.at = reinterpret_cast<unsigned long long*>((end + 7) & ~std::uintptr_t(7));
  }
  const SplitArgs<T> args{p.N, p.keys(), p.H, p.group(), row_blocks(p), p.rows(), p.causal, p.softmax_scale(), kv, sp,
                          static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
                          static_cast<T*>(a.o), a.lse, part_o, part_lse};
  const PagedRead pg{a.paged.table, a.paged.lengths, a.paged.page, a.paged.pool,
                     a.paged.page ? (p.keys() + a.paged.page - 1) / a.paged.page : 0};
  if (sp.cluster > 1) {  // the units' parts merged in their clusters: no second kernel
    launch_clustered(sp.cluster, kernel, dim3(unsigned(sp.blocks)), dim3(kThreads), smem, st, args, tags, pg);
    return;
  }
  if (tma) {
    if constexpr (kD == 128) launch_tma<T, kD, kStages, kPaged>(p, a, args, tags, pg, st);
  } else {
    kernel<<<unsigned(sp.blocks), kThreads, smem, st>>>(args, tags, pg);
  }
  FA_CHECK_LAUNCH();
  if (sp.direct()) return;
  // The merge kernel, launched while the split kernel still runs where it can wait
  // (merge_waits), its rows waiting for their own parts' tags: the second launch's latency,
  // a large part of the shortest decoding shapes, and the merges of the rows whose parts
  // end early hide under the split kernel's tail (note 08).
  launch_early(early, combine_kernel<T, kD>, dim3(unsigned(p.rows())), dim3(kCombineThreads), 0, st, args, tags);
}

/// This GPU: its SMs, shared memory and clusters (where the code that runs was compiled
/// for sm_90 or later: a PTX build of 8.0 JIT-compiled on Hopper has no cluster merge).
/// The clusters counted for the split kernel at d = 128, one block an SM; at d = 64 a
/// block is smaller, and at least as many fit.
GpuShape this_gpu() {
  static const GpuShape kHere = [] {
    GpuShape g{gpu::sm_count(), gpu::smem_per_sm(), gpu::smem_per_block(), gpu::l2_bytes()};
    if (gpu::compute_capability() < 90 || gpu::device_code_arch() < 90) return g;
    g.tma = true;
    auto* kernel = split_kernel<__nv_bfloat16, 128, 4, false>;
    const std::size_t smem = smem_bytes(128, 4);
    if (smem > g.smem_per_block) return g;
    set_smem_limit(kernel, smem);
    for (int S = 2; S <= kMaxCluster; ++S) g.clusters[S] = max_active_clusters(kernel, S, dim3(kThreads), smem);
    return g;
  }();
  return kHere;
}
/// This GPU as one that gives a block 99 KiB would run the step (an RTX 30xx/40xx, which
/// has no clusters).
GpuShape small_blocks(GpuShape g) {
  g.smem_per_block = std::min<std::size_t>(g.smem_per_block, 99 * 1024);
  std::fill(std::begin(g.clusters), std::end(g.clusters), 0);
  g.tma = false;
  return g;
}

/// The test hooks of the production forward: a fixed split count, or this GPU seen as one
/// that gives a block 99 KiB. Hook{}: production as it runs here.
struct Hook {
  int splits = 0;             ///< 0: the plan's
  bool small_blocks = false;  ///< small_blocks(this_gpu())
};
GpuShape shape_for(const Hook& h) { return h.small_blocks ? small_blocks(this_gpu()) : this_gpu(); }
SplitPlan plan_for(const Problem& p, const GpuShape& g, const Hook& h) {
  return with_clusters(h.splits > 0 ? fixed_plan(p, h.splits) : plan(p, g), g);
}

template <class T, bool kPaged>
void run_t(const Problem& p, const NativeFwdArgs& a, void* ws, Stream st, const SplitPlan& sp, int ring, KvLines kv,
           bool tma) {
  if (p.d == 64) return launch<T, 64, 4, kPaged>(p, a, ws, st, sp, kv, tma);  // stages(64, ·) = 4 on every GPU
  if (ring == kDeepRing) return launch<T, 128, kDeepRing, kPaged>(p, a, ws, st, sp, kv, tma);
  ring == 4 ? launch<T, 128, 4, kPaged>(p, a, ws, st, sp, kv, tma) : launch<T, 128, 2, kPaged>(p, a, ws, st, sp, kv, tma);
}

/// The forward: the plan, the ring's depth, its filling and the reads' L2 hint, all
/// decided for this problem on this GPU.
template <const Hook& kH>
void run(const Problem& p, const NativeFwdArgs& a, void* ws, Stream st) {
  const GpuShape g = shape_for(kH);
  const SplitPlan sp = plan_for(p, g, kH);
  const KvLines kv = reads_evict_first(p, g) ? KvLines::evict_first : KvLines::normal;
  const int ring = ring_tiles(p, sp, g);
  const bool tma = ring_by_tma(p, sp, g, a.paged.page);
  if (a.paged.page)
    return p.dtype == DType::bf16 ? run_t<__nv_bfloat16, true>(p, a, ws, st, sp, ring, kv, tma)
                                  : run_t<__half, true>(p, a, ws, st, sp, ring, kv, tma);
  p.dtype == DType::bf16 ? run_t<__nv_bfloat16, false>(p, a, ws, st, sp, ring, kv, tma)
                         : run_t<__half, false>(p, a, ws, st, sp, ring, kv, tma);
}

template <const Hook& kH>
std::size_t workspace(const Problem& p) {
  return workspace_bytes(p, plan_for(p, shape_for(kH), kH));
}

template <int kD, int kStages>
int occupancy() {
  int n = 0;
  set_smem_limit(split_kernel<__nv_bfloat16, kD, kStages, false>, smem_bytes(kD, kStages));
  FA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, split_kernel<__nv_bfloat16, kD, kStages, false>, kThreads,
                                                              smem_bytes(kD, kStages)));
  return n;
}

constexpr Hook kProduction{}, kSmall{0, true}, kSplits1{1}, kSplits2{2}, kSplits8{8}, kSplits32{32}, kSplits128{128};
template <const Hook& kH>
constexpr GpuForward forward(const char* name) {
  return {.name = name,
          .max_d = 128,
          .workspace_bytes = workspace<kH>,
          .workspace_what = "the parts' partial O/l and L (fp32)",
          .run = nullptr,
          .run_native = run<kH>,
          .only_d = kSupportedD,
          .min_sm = kMinSm,
          .exact_sm = false,
          .decode = true,
          .paged = true};
}

}  // namespace

GpuShape device_shape() { return this_gpu(); }
SplitPlan device_plan(const Problem& p) { return plan_for(p, this_gpu(), kProduction); }
SplitPlan device_plan_small_blocks(const Problem& p) { return plan_for(p, shape_for(kSmall), kSmall); }
int device_blocks_per_sm(int d) {
  if (d == 64) return occupancy<64, 4>();
  return stages(128, this_gpu()) == 4 ? occupancy<128, 4>() : occupancy<128, 2>();
}

const GpuForward kForward = forward<kProduction>("step08 forward");
const GpuForward kForwardFixed[kFixedSplitCount] = {
    forward<kSplits1>("s1: one split"),    forward<kSplits2>("s2: 2 splits"),         forward<kSplits8>("s8: 8 splits"),
    forward<kSplits32>("s32: 32 splits"), forward<kSplits128>("s128: 128 splits"),
};
const GpuForward kForwardSmallBlocks = forward<kSmall>("r2: the RTX 30xx/40xx ring");
static_assert(kFixedSplits[0] == 1 && kFixedSplits[1] == 2 && kFixedSplits[2] == 8 && kFixedSplits[3] == 32 &&
                  kFixedSplits[4] == 128,
              "kForwardFixed follows kFixedSplits");

}  // namespace fa::step08
