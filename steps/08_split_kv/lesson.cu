// Step 08's lesson rows 2–4 (note 08's table), each a small kernel beside production
// (split_kv.cu, row 5). Row 1 is step 06's forward.
//   row 2  lesson_split_kernel, one split: 16 packed rows of one K/V head a block, four
//          warps taking 16 keys each of every 64-key tile, their states merged at the end
//   row 3  + splits: each unit's tiles cut into chunks of its own (unit_plan for a ring of
//          two tiles), the parts merged by fold_kernel, one thread per 4 columns of a row
//          folding the parts in turn (online::merge: each waits on the one before)
//   row 4  + the merge: stats_first_kernel, one block a row, the statistics of all parts
//          first (a tree), then every part weighted, its loads independent
// Every block streams one chunk through a ring of two K/V tiles (four at d = 64) by
// cp.async. What production adds (row 5): a ring of four or six tiles and one block an
// SM, chunks shared across units, the merge launched early or done in a cluster, TMA, an
// L2 hint. Rows 2 and 4 do production's arithmetic in its order: the tests hold them to
// it bit for bit; row 3's fold orders the merge's sums differently.
#include <algorithm>

#include "common/cuda_check.cuh"
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

template <class T>
struct LessonArgs {
  int N, Nk, H, group, row_blocks;  // queries, keys, query heads a batch, heads per K/V head, units a K/V head
  std::size_t rows;                 // B·H·N
  bool causal;
  float scale;
  SplitPlan plan;  // every unit cut into chunks of its own: one piece a block
  const T *q, *k, *v;
  T* o;                      // [B·H·N][d], written by the split kernel when plan.direct()
  float* lse;                // [B·H·N]
  float *part_o, *part_lse;  // [parts][B·H·N][d] and [parts][B·H·N]
};

/// One block a chunk of one unit: S = Q·K_wᵀ and O_w += P·V_w per warp, the online
/// softmax between them, then the four warps' states merged, and O/ℓ and L (or the
/// block's part of them) written.
template <class T, int kD, int kStages>
__global__ void __launch_bounds__(kThreads) lesson_split_kernel(const LessonArgs<T> a) {
#if FA_MMA_ARCH_OK
  constexpr int kW = smem_cols(kD);
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* Qs = reinterpret_cast<T*>(smem_raw);  // [kRows][kW], swizzled
  T* Ks = Qs + kRows * kW;                 // [kStages][kTileKeys][kW]: the ring
  T* Vs = Ks + kStages * kTileKeys * kW;   // [kStages][kTileKeys][kW]
  mma::require_aligned_smem(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

  // This block's chunk: tiles [t0, t1) of unit u (row block rb of K/V head kvh), part `part` of its rows.
  const SplitPlan::Piece pc = a.plan.piece(a.plan.begin(blockIdx.x), a.plan.end(blockIdx.x));
  const long long u = pc.unit;
  const int part = int(blockIdx.x) - a.plan.first(u), kvh = int(u / a.row_blocks), rb = int(u % a.row_blocks);
  const int r0 = rb * kRows, rows = unit_rows(a.group, a.N, a.row_blocks, u);
  const std::size_t base = first_row(a.H, a.group, a.N, a.row_blocks, u);
  const int N = a.N, Nk = a.Nk, t0 = pc.t0, end = tile_end(N, Nk, a.group, a.causal, rb), t1 = pc.t1 < end ? pc.t1 : end;
  const std::size_t kv_head = std::size_t(kvh) * Nk * kD;
  const int last_key = Nk < t1 * kTileKeys ? Nk : t1 * kTileKeys;
  const float mul = a.scale * step06::kLog2e;  // exp(scale·(s − m)) = 2^(s·mul − m·mul)
  auto load_tile = [&](int tile) {
    const int k0 = tile * kTileKeys, slot = (tile - t0) % kStages;
    const std::size_t from = kv_head + std::size_t(k0) * kD;
    mma::copy_tile_async<kThreads, kD, kTileKeys, true>(Ks + slot * kTileKeys * kW, a.k + from, last_key - k0);
    mma::copy_tile_async<kThreads, kD, kTileKeys, true>(Vs + slot * kTileKeys * kW, a.v + from, last_key - k0);
  };

  float acc[1][kD / 8][4] = {};  // O_w: rows g, g+8 × columns 2t, 2t+1 of each 8-column tile
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  // Prologue: Q, then the ring's first tiles, one commit group each; Q into registers.
  if (t0 < t1) mma::copy_tile_async<kThreads, kD, kRows>(Qs, a.q + base * kD, rows);
  cp_async_commit();
  for (int st = 0; st < kStages - 1; ++st) {
    if (t0 + st < t1) load_tile(t0 + st);
    cp_async_commit();
  }
  cp_async_wait<kStages - 1>();
  __syncthreads();
  std::uint32_t qa[kD / 16][1][4];
  mma::load_a_fragments<kD, 1>(qa, smem_u32(Qs), 0, lane);
  const std::uint32_t k_at = mma::b_fragments_at<kD>(smem_u32(Ks), kKeysPerWarp * warp, lane);

  for (int tile = t0; tile < t1; ++tile) {
    const int at = (tile - t0) % kStages * kTileKeys;  // the tile's first row in the ring
    cp_async_wait<kStages - 2>();
    __syncthreads();  // the tile landed for everyone, and every warp is done with the last one
    if (tile + kStages - 1 < t1) load_tile(tile + kStages - 1);
    cp_async_commit();
    const int k0 = tile * kTileKeys + kKeysPerWarp * warp;

    float s[1][kKeysPerWarp / 8][4] = {};  // S: 16 rows × this warp's 16 keys
    mma::gemm_abt_regs<T, kD, 1, kKeysPerWarp / 8>(s, qa, k_at + at * kW * sizeof(T));
    if (k0 + kKeysPerWarp > Nk || (a.causal && k0 + kKeysPerWarp - 1 > Nk - N))
      for (int nt = 0; nt < kKeysPerWarp / 8; ++nt)
        for (int x = 0; x < 4; ++x) {  // x = 2h + e: row g + 8h, key 8nt + 2t + e
          const int pos = Nk - N + (r0 + g + 8 * (x / 2)) % N;
          if (tiles::masked(pos, k0 + 8 * nt + 2 * t + x % 2, Nk, a.causal)) s[0][nt][x] = -INFINITY;
        }
    // Online softmax (lecture p21), rows g and g + 8: the quad's max, rescale, add.
    for (int h = 0; h < 2; ++h) {
      float mx = m[h];
      for (int nt = 0; nt < kKeysPerWarp / 8; ++nt) mx = fmaxf(mx, fmaxf(s[0][nt][2 * h], s[0][nt][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float ms = mx == -INFINITY ? 0.0f : mx * mul;  // keeps −∞ − (−∞) out
      const float alpha = exp2_approx(m[h] * mul - ms);
      float sum = 0.0f;
      for (int nt = 0; nt < kKeysPerWarp / 8; ++nt)
        for (int e = 0; e < 2; ++e) {
          float& x = s[0][nt][2 * h + e];
          x = exp2_approx(fmaf(x, mul, -ms));
          sum += x;
        }
      l[h] = alpha * l[h] + sum;
      m[h] = mx;
      for (int dt = 0; dt < kD / 8; ++dt) acc[0][dt][2 * h] *= alpha, acc[0][dt][2 * h + 1] *= alpha;
    }
    std::uint32_t pa[1][1][4];  // P rounded to 16 bits, the A operand of P·V
    mma::to_a<T>(pa[0][0], s[0][0], s[0][1]);
    mma::gemm_pv<T, kD, 1, kKeysPerWarp>(acc, pa, smem_u32(Vs + (at + kKeysPerWarp * warp) * kW));
  }

  // Epilogue, in the ring (free once every copy landed): the four warps' (m, ℓ, O) merged
  // per row, statistics first, then O as the weighted sum.
  cp_async_wait<0>();
  __syncthreads();
  float* Ow = reinterpret_cast<float*>(Ks);  // [kWarps][kRows][kD]
  float* Mw = Ow + kWarps * kRows * kD;      // [kWarps][kRows]: m·scale
  float* Lw = Mw + kWarps * kRows;           // [kWarps][kRows]: ℓ
  float* Ww = Lw + kWarps * kRows;           // [kWarps][kRows]: e^(m_w − M)
  float* Ms = Ww + kWarps * kRows;           // [kRows]: M
  float* Ls = Ms + kRows;                    // [kRows]: ℓ of the four
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);  // the quad's four parts of ℓ
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const int r = g + 8 * h;
    if (t == 0) Mw[warp * kRows + r] = m[h] * a.scale, Lw[warp * kRows + r] = l[h];
    for (int dt = 0; dt < kD / 8; ++dt)
      *reinterpret_cast<float2*>(&Ow[(warp * kRows + r) * kD + 8 * dt + 2 * t]) =
          make_float2(acc[0][dt][2 * h], acc[0][dt][2 * h + 1]);
  }
  __syncthreads();
  if (threadIdx.x < kRows) {
    const int r = threadIdx.x;
    float mm = Mw[r], ll = Lw[r];
    for (int w = 1; w < kWarps; ++w) online::merge(mm, ll, nullptr, Mw[w * kRows + r], Lw[w * kRows + r], nullptr, 0);
    for (int w = 0; w < kWarps; ++w) Ww[w * kRows + r] = online::rescale(Mw[w * kRows + r], mm);
    Ms[r] = mm, Ls[r] = ll;
  }
  __syncthreads();
  for (int e = int(threadIdx.x); e < rows * kD; e += kThreads) {
    const int r = e / kD, c = e % kD;
    const float mm = Ms[r], ll = Ls[r];
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) o += Ww[w * kRows + r] * Ow[(w * kRows + r) * kD + c];
    const std::size_t row = base + r;
    if (a.plan.direct()) {
      a.o[row * kD + c] = T(o / ll);
      if (c == 0) a.lse[row] = online::lse(mm, ll);
    } else {  // a part (O/ℓ, L); an empty one (no key for this row) (0, −∞): weight 0
      const std::size_t at = std::size_t(part) * a.rows + row;
      a.part_o[at * kD + c] = ll > 0.0f ? o / ll : 0.0f;
      if (c == 0) a.part_lse[at] = ll > 0.0f ? online::lse(mm, ll) : -INFINITY;
    }
  }
#endif
}

/// Row `row`'s number of parts: row = (batch·H + h)·N + n is packed row (h mod G)·N + n
/// of K/V head batch·H_kv + h/G.
template <class T>
__device__ __forceinline__ int parts_of(const LessonArgs<T>& a, std::size_t row) {
  const std::size_t n = row % a.N, h = row / a.N % a.H, batch = row / a.N / a.H;
  const std::size_t kvh = batch * (a.H / a.group) + h / a.group, packed = h % a.group * a.N + n;
  return a.plan.parts(static_cast<long long>(kvh) * a.row_blocks + static_cast<long long>(packed / kRows));
}

/// Row 3's merge: one thread per (row, 4 columns), the row's parts folded in order by
/// the merge rule, each part the state (m = L, ℓ = 1, O/ℓ).
constexpr int kFoldThreads = 256;
template <class T, int kD>
__global__ void __launch_bounds__(kFoldThreads) fold_kernel(const LessonArgs<T> a) {
  const std::size_t i = std::size_t(blockIdx.x) * kFoldThreads + threadIdx.x, row = i / (kD / 4);
  const int c = int(i % (kD / 4)) * 4;
  if (row >= a.rows) return;
  float m = -INFINITY, l = 0.0f, acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int s = 0, parts = parts_of(a, row); s < parts; ++s) {
    const std::size_t at = std::size_t(s) * a.rows + row;
    const float L = a.part_lse[at];
    const float4 x4 = *reinterpret_cast<const float4*>(a.part_o + at * kD + c);
    const float x[4] = {x4.x, x4.y, x4.z, x4.w};
    online::merge(m, l, acc, L, L == -INFINITY ? 0.0f : 1.0f, x, 4);
  }
  for (int e = 0; e < 4; ++e) a.o[row * kD + c + e] = T(acc[e] / l);
  if (c == 0) a.lse[row] = online::lse(m, l);
}

/// Row 4's merge, production's (combine_kernel) without its early launch: one block a
/// row, 256 threads = d/4 column quads × J lanes. Warp 0 merges the parts' statistics as a
/// tree (lane i the parts i, i + 32, …, then a butterfly) and takes every part's weight
/// e^(L_s − M) once; then lane j sums the parts s ≡ j (mod J), loads independent of each other.
template <class T, int kD>
__global__ void __launch_bounds__(kCombineThreads) stats_first_kernel(const LessonArgs<T> a) {
  const std::size_t rows = a.rows, row = blockIdx.x;
  const int parts = parts_of(a, row);
  constexpr int kQuads = kD / 4, kLanes = kCombineThreads / kQuads;
  __shared__ float ws[kMaxParts];          // each part's L, then its weight
  __shared__ float stats[2];               // M and ℓ
  __shared__ float4 sums[kLanes][kQuads];  // each lane's share of Σ e^(L_s − M)·O_s
  const int q = threadIdx.x % kQuads, j = threadIdx.x / kQuads;
  if (threadIdx.x < 32) {
    float m = -INFINITY, l = 0.0f;
    for (int s = threadIdx.x; s < parts; s += 32) {
      const float L = a.part_lse[std::size_t(s) * rows + row];
      ws[s] = L;
      merge_part_stats(m, l, L);
    }
    for (int x = 1; x < 32; x *= 2) {  // lane 0 keeps the left part first: the model's stats_tree
      const float m2 = __shfl_xor_sync(0xffffffffu, m, x), l2 = __shfl_xor_sync(0xffffffffu, l, x);
      online::merge(m, l, nullptr, m2, l2, nullptr, 0);
    }
    for (int s = threadIdx.x; s < parts; s += 32) ws[s] = online::rescale(ws[s], m);
    if (threadIdx.x == 0) stats[0] = m, stats[1] = l;
  }
  __syncthreads();
  const float m = stats[0], l = stats[1];
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
  for (int s = j; s < parts; s += kLanes) {
    const float w = ws[s];
    const float4 x = *reinterpret_cast<const float4*>(a.part_o + (std::size_t(s) * rows + row) * kD + 4 * q);
    acc.x = fmaf(w, x.x, acc.x), acc.y = fmaf(w, x.y, acc.y), acc.z = fmaf(w, x.z, acc.z), acc.w = fmaf(w, x.w, acc.w);
  }
  sums[j][q] = acc;
  __syncthreads();
  if (j == 0) {
    for (int jj = 1; jj < kLanes; ++jj)
      acc.x = __fadd_rn(acc.x, sums[jj][q].x), acc.y = __fadd_rn(acc.y, sums[jj][q].y),
      acc.z = __fadd_rn(acc.z, sums[jj][q].z), acc.w = __fadd_rn(acc.w, sums[jj][q].w);
    T* out = a.o + row * kD + 4 * q;
    out[0] = T(acc.x / l), out[1] = T(acc.y / l), out[2] = T(acc.z / l), out[3] = T(acc.w / l);
    if (q == 0) a.lse[row] = online::lse(m, l);
  }
}

/// Which lesson row a forward is.
enum class Row { one_split, fold, stats_first };

/// This GPU as the lesson rows see it: a block given at most 99 KiB, so a ring of two
/// tiles at d = 128 and three blocks an SM (stages, blocks_per_sm); no clusters, no TMA.
GpuShape two_tile_gpu() {
  const GpuShape here = device_shape();
  return {here.sms, here.smem_per_sm, std::min<std::size_t>(here.smem_per_block, 99 * 1024), here.l2_bytes};
}
/// A row's plan; splits > 0: the tests' fixed split count instead.
SplitPlan plan_of(const Problem& p, Row r, int splits = 0) {
  return splits > 0 ? fixed_plan(p, splits) : r == Row::one_split ? fixed_plan(p, 1) : unit_plan(p, two_tile_gpu());
}

template <class T, int kD, int kStages>
void launch(const Problem& p, const NativeFwdArgs& x, void* ws, Stream st, Row r, int splits) {
  const SplitPlan sp = plan_of(p, r, splits);
  float* part_o = static_cast<float*>(ws);
  const LessonArgs<T> a{p.N, p.keys(), p.H, p.group(), row_blocks(p), p.rows(), p.causal, p.softmax_scale(), sp,
                        static_cast<const T*>(x.q), static_cast<const T*>(x.k), static_cast<const T*>(x.v),
                        static_cast<T*>(x.o), x.lse, part_o,
                        part_o ? part_o + std::size_t(most_parts(sp)) * p.elems() : nullptr};
  const std::size_t smem = smem_bytes(kD, kStages);
  set_smem_limit(lesson_split_kernel<T, kD, kStages>, smem);
  lesson_split_kernel<T, kD, kStages><<<unsigned(sp.blocks), kThreads, smem, st>>>(a);
  FA_CHECK_LAUNCH();
  if (sp.direct()) return;
  if (r == Row::fold) {
    const std::size_t threads = p.rows() * (kD / 4);
    fold_kernel<T, kD><<<unsigned((threads + kFoldThreads - 1) / kFoldThreads), kFoldThreads, 0, st>>>(a);
  } else {
    stats_first_kernel<T, kD><<<unsigned(p.rows()), kCombineThreads, 0, st>>>(a);
  }
  FA_CHECK_LAUNCH();
}

template <Row kR, int kSplits>
void run(const Problem& p, const NativeFwdArgs& x, void* ws, Stream st) {
  // The ring of two_tile_gpu(): four tiles at d = 64 (66 KiB), two at d = 128 (68 KiB).
  if (p.dtype == DType::bf16)
    p.d == 64 ? launch<__nv_bfloat16, 64, 4>(p, x, ws, st, kR, kSplits)
              : launch<__nv_bfloat16, 128, 2>(p, x, ws, st, kR, kSplits);
  else
    p.d == 64 ? launch<__half, 64, 4>(p, x, ws, st, kR, kSplits) : launch<__half, 128, 2>(p, x, ws, st, kR, kSplits);
}
template <Row kR, int kSplits>
std::size_t workspace(const Problem& p) {
  return workspace_bytes(p, plan_of(p, kR, kSplits));
}
template <Row kR, int kSplits = 0>
constexpr GpuForward lesson(const char* name) {
  return {.name = name,
          .max_d = 128,
          .workspace_bytes = workspace<kR, kSplits>,
          .workspace_what = "the parts' partial O/l and L (fp32)",
          .run = nullptr,
          .run_native = run<kR, kSplits>,
          .only_d = kSupportedD,
          .min_sm = kMinSm,
          .exact_sm = false,
          .decode = true};
}

}  // namespace

SplitPlan device_lesson_plan(const Problem& p) { return plan_of(p, Row::fold); }

const GpuForward kLessonOneSplit = lesson<Row::one_split>("row2: 16 packed rows, four warps split each tile, one split");
const GpuForward kLessonFold = lesson<Row::fold>("row3: + splits, merged by a fold (one thread per 4 columns)");
const GpuForward kLessonStatsFirst = lesson<Row::stats_first>("row4: + the merge: statistics first, every split weighted");
const GpuForward kLessonStatsFirstFixed[kFixedSplitCount] = {
    lesson<Row::stats_first, kFixedSplits[0]>("row4s1: row 4, one split"),
    lesson<Row::stats_first, kFixedSplits[1]>("row4s2: row 4, 2 splits"),
    lesson<Row::stats_first, kFixedSplits[2]>("row4s8: row 4, 8 splits"),
    lesson<Row::stats_first, kFixedSplits[3]>("row4s32: row 4, 32 splits"),
    lesson<Row::stats_first, kFixedSplits[4]>("row4s128: row 4, 128 splits"),
};

}  // namespace fa::step08
