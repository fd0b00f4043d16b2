// Step 08's split choice and CPU model: the kernels' blocks (a chunk of the units' 64-key
// tiles, each unit 16 packed rows), their four warps of 16 keys a tile, the merges in the
// kernels' order and the same rounding points (inputs, P before P·V, O at the end;
// partials in fp32).
#include <algorithm>
#include <cmath>

#include "steps/03_online_softmax/online_softmax.hpp"
#include "steps/06_tensor_cores/step06.hpp"
#include "steps/08_split_kv/step08.hpp"
#include "steps/08_split_kv/trace.hpp"

namespace fa::step08 {

void require_supported(const Problem& p) { step06::require_lowp(p, "step08", kSupportedD, Problem::kDecode); }

int row_blocks(const Problem& p) { return (p.group() * p.N + kRows - 1) / kRows; }
int kv_tiles(const Problem& p) { return (p.keys() + kTileKeys - 1) / kTileKeys; }

int stages(int d, const GpuShape& gpu) { return smem_bytes(d, 4) <= gpu.smem_per_block ? 4 : 2; }

int blocks_per_sm(int d, const GpuShape& gpu) { return blocks_fitting(gpu.smem_per_sm, d, stages(d, gpu)); }

namespace {
/// The problem's units and their tiles, shared by `blocks` blocks (at least one a unit).
SplitPlan shared_by(const Problem& p, long long blocks) {
  const long long units = static_cast<long long>(p.kv_heads()) * row_blocks(p);
  return {units, kv_tiles(p), int(std::max(blocks, units))};
}
/// Thread blocks the GPU holds at once.
long long wave_of(const Problem& p, const GpuShape& gpu) {
  return static_cast<long long>(gpu.sms) * blocks_per_sm(p.d, gpu);
}
constexpr int kMinTilesPerChunk = 4;  ///< below this, a chunk's partials cost more than its keys
/// Below this, a block's second piece costs more than the idle SMs that sharing the tiles
/// puts to work (note 08, "Sharing the tiles"): 24k keys a block.
constexpr int kMinSharedTiles = 384;
}  // namespace

int most_parts(const SplitPlan& s) {
  if (s.blocks % s.units == 0) return int(s.blocks / s.units);
  // Chunks of at least m tiles: a unit's tiles meet at most ⌈(tiles − 1)/m⌉ + 1 of them.
  const long long m = s.total() / s.blocks;
  return int(std::min<long long>(s.blocks, (s.tiles - 1 + m - 1) / m + 1));
}

SplitPlan fixed_plan(const Problem& p, int splits) {
  const SplitPlan one = shared_by(p, 1);
  return shared_by(p, one.units * std::clamp(splits, 1, std::min(kMaxParts, one.tiles)));
}

SplitPlan unit_plan(const Problem& p, const GpuShape& gpu) {
  const SplitPlan one = shared_by(p, 1);
  const long long wave = wave_of(p, gpu);
  if (one.units >= wave) return one;
  return fixed_plan(p, int(std::min<long long>(wave / one.units, std::max(1, one.tiles / kMinTilesPerChunk))));
}

SplitPlan shared_plan(const Problem& p, const GpuShape& gpu) {
  const SplitPlan one = shared_by(p, 1);
  SplitPlan s = shared_by(p, std::min(wave_of(p, gpu), one.total() / kMinTilesPerChunk));
  while (most_parts(s) > kMaxParts) --s.blocks;
  return s;
}

SplitPlan plan(const Problem& p, const GpuShape& gpu) {
  // exercise 08-splits: the blocks — whole units' splits (unit_plan), unless they split the units already (a merge either way) but leave SMs idle (fewer blocks than a wave), and the tiles shared by a wave (shared_plan) give every block at least kMinSharedTiles
  // stub: (void)gpu;
  // stub: return shared_by(p, 1);
  const SplitPlan whole = unit_plan(p, gpu);
  if (whole.direct() || whole.blocks >= wave_of(p, gpu)) return whole;
  const SplitPlan shared = shared_plan(p, gpu);
  return shared.total() / shared.blocks >= kMinSharedTiles ? shared : whole;
  // end exercise
}

int ring_tiles(const Problem& p, const SplitPlan& s, const GpuShape& gpu) {
  const int base = stages(p.d, gpu);
  const bool fits = p.d == 128 && smem_bytes(p.d, kDeepRing) <= gpu.smem_per_block &&
                    blocks_fitting(gpu.smem_per_sm, p.d, kDeepRing) == blocks_fitting(gpu.smem_per_sm, p.d, base);
  return fits && s.total() / s.blocks >= kDeepRingMinTiles ? kDeepRing : base;
}

bool ring_can_take_tma(const Problem& p, const SplitPlan& s, const GpuShape& gpu) {
  return p.d == 128 && gpu.tma && s.cluster <= 1;
}

bool ring_by_tma(const Problem& p, const SplitPlan& s, const GpuShape& gpu, int page) {
  return ring_can_take_tma(p, s, gpu) && s.total() / s.blocks >= kTmaMinTiles && page % kTileKeys == 0;
}

bool reads_evict_first(const Problem& p, const GpuShape& gpu) {
  const double kv_bytes = 2.0 * double(p.kv_elems()) * 2;  // K and V, 16-bit
  return kv_bytes <= double(kEvictFirstL2s) * double(gpu.l2_bytes);
}

SplitPlan with_clusters(SplitPlan s, const GpuShape& gpu) {
  const long long S = s.blocks / s.units;
  const bool whole_units = S > 1 && S <= kMaxCluster && s.blocks == S * s.units;
  if (whole_units && s.tiles <= S * kMaxClusterChunk && gpu.clusters[S] >= s.units) s.cluster = int(S);
  return s;
}

std::size_t workspace_bytes(const Problem& p, const SplitPlan& s) {
  if (!s.merge_kernel()) return 0;
  const std::size_t parts = std::size_t(most_parts(s));
  return parts * p.rows() * (std::size_t(p.d + 1) * sizeof(float) + 8) + 8;  // (+ 8: the tags 8-byte aligned)
}

namespace {

/// What the kernels move, by kind: 16-bit Q, K, V, O; fp32 L and partials.
struct Moved {
  std::uint64_t q = 0, kv = 0, o = 0, l = 0, part = 0;
};

/// The kernels' traffic, block by block and piece by piece (the model counts the same
/// loads and stores).
Moved moved(const Problem& p, const SplitPlan& s) {
  Moved m;
  const int G = p.group(), d = p.d, rbs = row_blocks(p);
  for (int b = 0; b < s.blocks; ++b)
    for (long long from = s.begin(b); from < s.end(b);) {
      const SplitPlan::Piece pc = s.piece(from, s.end(b));
      from += pc.t1 - pc.t0;
      const int rb = int(pc.unit % rbs), t1 = std::min(pc.t1, tile_end(p.N, p.keys(), G, p.causal, rb));
      const std::uint64_t rows = std::uint64_t(unit_rows(G, p.N, rbs, pc.unit));
      if (t1 > pc.t0) {
        m.q += rows * d;
        m.kv += 2 * std::uint64_t(std::min(p.keys(), t1 * kTileKeys) - pc.t0 * kTileKeys) * d;
      }
      if (s.merge_kernel()) m.part += 2 * rows * (d + 1);  // every piece's part written, then read back
    }
  m.o = p.elems(), m.l = p.rows();
  return m;
}

}  // namespace

Traffic traffic_forward(const Problem& p, const SplitPlan& s) {
  const Moved m = moved(p, s);
  return {m.q + m.kv + m.part / 2, m.o + m.l + m.part / 2};
}

double traffic_bytes(const Problem& p, const SplitPlan& s) {
  const Moved m = moved(p, s);
  return 2.0 * double(m.q + m.kv + m.o) + 4.0 * double(m.l + m.part);
}

namespace {
/// The merge kernel's statistics of one row, in its order (its warp 0; a cluster's merge
/// takes them the same way, one warp a row): lane i merges the
/// L's of splits i, i + 32, … in turn, then the 32 lanes' states are merged pairwise,
/// level by level, as the xor butterfly leaves them in lane 0.
void stats_tree(const std::vector<float>& ls, float& mm, float& ll) {
  constexpr int kLanes = 32;
  float m[kLanes], l[kLanes];
  for (int i = 0; i < kLanes; ++i) {
    m[i] = -INFINITY, l[i] = 0.0f;
    for (std::size_t sp = i; sp < ls.size(); sp += kLanes)
      merge_part_stats(m[i], l[i], ls[sp]);
  }
  for (int x = 1; x < kLanes; x *= 2)
    for (int i = 0; i < kLanes; i += 2 * x) online::merge(m[i], l[i], nullptr, m[i + x], l[i + x], nullptr, 0);
  mm = m[0], ll = l[0];
}
}  // namespace

std::size_t paged_row(const Problem& p, const PagedKv& kv, int b, int h, int key) {
  // exercise 08-page: the element offset of key `key` of K/V head h of sequence b — its page from the table (row b, column key / page), then head h's rows in that page, then the key's row in them
  // stub: (void)p, (void)kv, (void)b, (void)h;
  // stub: return std::size_t(key) * p.d;
  const int at = kv.table[std::size_t(b) * kv.pages_per_seq(p) + key / kv.page];
  return ((std::size_t(at) * p.kv_heads_per_batch() + h) * kv.page + key % kv.page) * p.d;
  // end exercise
}

ModelForward model_forward(const Problem& p, const Qkv& in, const SplitPlan& s) { return model_forward(p, in, s, nullptr); }

namespace {
/// The watched row's four warp states as one (what the block's epilogue would make of
/// them now), for the trace only.
void trace_warps(online::Trace& tr, const std::string& stage, int k0, int k1, const float* m, const float* l,
                 const std::vector<float>& acc, int rr, int d, float& m_before) {
  float mm = m[rr], ll = l[rr];
  for (int w = 1; w < kWarps; ++w) online::merge(mm, ll, nullptr, m[w * kRows + rr], l[w * kRows + rr], nullptr, 0);
  std::vector<float> o(std::size_t(d), 0.0f);
  for (int w = 0; w < kWarps; ++w)
    for (int x = 0; x < d; ++x) o[x] += online::rescale(m[w * kRows + rr], mm) * acc[(std::size_t(w) * kRows + rr) * d + x];
  tr.add(stage, k0, k1, mm, ll, online::rescale(m_before, mm), o.data(), d);
  m_before = mm;
}
}  // namespace

namespace {
ModelForward forward(const Problem& p, const Qkv& in, const SplitPlan& s, online::Trace* trace, const PagedKv* paged) {
  require_supported(p);
  ModelForward r;
  const DType t = p.dtype;
  Hbm Q(step06::rounded(in.q, t), r.traffic), K(step06::rounded(in.k, t), r.traffic),
      V(step06::rounded(in.v, t), r.traffic);
  Hbm O(p.elems(), r.traffic), L(p.rows(), r.traffic);
  const bool split = !s.direct();
  const std::size_t parts = split ? std::size_t(most_parts(s)) : 0;
  // The partials: in HBM for the merge kernel, or in the shared memory of a cluster's
  // blocks (moved on chip, counted apart from the HBM traffic).
  Traffic on_chip;
  Traffic& parts_traffic = s.merge_kernel() ? r.traffic : on_chip;
  Hbm PO(parts * p.elems(), parts_traffic), PL(parts * p.rows(), parts_traffic);
  const int N = p.N, Nk = p.keys(), d = p.d, G = p.group(), rbs = row_blocks(p);
  const float scale = p.softmax_scale();
  auto base_of = [&](long long u) { return first_row(p.H, G, N, rbs, u); };  // unit u's row rr is row base_of(u) + rr
  for (int b = 0; b < s.blocks; ++b)
    for (long long from = s.begin(b); from < s.end(b);) {
      const SplitPlan::Piece pc = s.piece(from, s.end(b));
      from += pc.t1 - pc.t0;
      const std::size_t kvh = std::size_t(pc.unit / rbs), base = base_of(pc.unit);
      const int rb = int(pc.unit % rbs), r0 = rb * kRows, rows = unit_rows(G, N, rbs, pc.unit);
      // Key `key` of the unit's K/V head: in its contiguous head, or in its sequence's page.
      const int seq = int(kvh / p.kv_heads_per_batch()), h = int(kvh % p.kv_heads_per_batch());
      const int len = paged ? paged->length(p, seq) : Nk;  // the sequence's keys
      auto row_of = [&](int key) { return paged ? paged_row(p, *paged, seq, h, key) : (kvh * Nk + key) * d; };
      const int t0 = pc.t0, t1 = std::min(pc.t1, tile_end(N, len, G, p.causal, rb));
      const std::size_t part = std::size_t(b - s.first(pc.unit));  // this block's part of the unit's rows
      OnChip chip(std::size_t(kRows) * d + 2 * std::size_t(kTileKeys) * d + std::size_t(kWarps) * kRows * (d + 2) +
                  kRows * kKeysPerWarp);
      auto Qi = chip.tile(std::size_t(kRows) * d, "Q_i"), Kj = chip.tile(std::size_t(kTileKeys) * d, "K_j"),
           Vj = chip.tile(std::size_t(kTileKeys) * d, "V_j");
      auto acc = chip.tile(std::size_t(kWarps) * kRows * d, "O of each warp");
      auto stats = chip.tile(std::size_t(kWarps) * kRows * 2, "m, l of each warp");
      auto P = chip.tile(std::size_t(kRows) * kKeysPerWarp, "P of a warp");
      float* m = stats.data();
      float* l = stats.data() + kWarps * kRows;
      std::fill(m, m + kWarps * kRows, -INFINITY);
      float traced_m = -INFINITY;  // the watched row's max before the tile (trace only)
      if (t1 > t0)
        for (int rr = 0; rr < rows; ++rr)
          for (int c = 0; c < d; ++c) Qi[rr * d + c] = Q.load((base + rr) * d + c);
      for (int tile = t0; tile < t1; ++tile) {
        const int k0 = tile * kTileKeys, nk = std::min(kTileKeys, len - k0);
        for (int kk = 0; kk < nk; ++kk) {
          const std::size_t at = row_of(k0 + kk);
          for (int c = 0; c < d; ++c) Kj[kk * d + c] = K.load(at + c), Vj[kk * d + c] = V.load(at + c);
        }
        for (int w = 0; w < kWarps; ++w)  // warp w: keys k0 + 16w … of the tile
          for (int rr = 0; rr < rows; ++rr) {
            const int pos = len - N + (r0 + rr) % N;  // the query's position among the keys
            float sc[kKeysPerWarp], mx = -INFINITY;
            for (int c = 0; c < kKeysPerWarp; ++c) {
              const int kk = kKeysPerWarp * w + c, key = k0 + kk;
              float dot = 0.0f;
              for (int x = 0; x < d && kk < nk; ++x) dot += Qi[rr * d + x] * Kj[kk * d + x];
              sc[c] = key >= len || (p.causal && key > pos) ? -INFINITY : scale * dot;
              mx = std::max(mx, sc[c]);
            }
            float& mw = m[w * kRows + rr];
            const float m_new = std::max(mw, mx), alpha = online::rescale(mw, m_new);
            float sum = 0.0f;
            for (int c = 0; c < kKeysPerWarp; ++c) {
              const float pr = online::prob(sc[c], m_new);
              sum += pr;                                  // ℓ sums the fp32 probabilities...
              P[rr * kKeysPerWarp + c] = round_to(t, pr);  // ...P·V takes them in 16 bits
            }
            l[w * kRows + rr] = alpha * l[w * kRows + rr] + sum;
            mw = m_new;
            float* o = &acc[(std::size_t(w) * kRows + rr) * d];
            for (int x = 0; x < d; ++x) {
              float a = alpha * o[x];
              for (int c = 0; c < kKeysPerWarp && kKeysPerWarp * w + c < nk; ++c)
                a += P[rr * kKeysPerWarp + c] * Vj[(kKeysPerWarp * w + c) * d + x];
              o[x] = a;
            }
          }
        if (trace && trace->row >= base && trace->row < base + std::size_t(rows))
          trace_warps(*trace, "split " + std::to_string(part), k0, k0 + nk, m, l, acc, int(trace->row - base), d,
                      traced_m);
      }
      // The four warps' states of a row merged (the kernel's epilogue): the statistics
      // folded in warp order, each warp's weight against their max, the weighted sum.
      std::vector<float> o(d);
      for (int rr = 0; rr < rows; ++rr) {
        float mm = m[rr], ll = l[rr];
        for (int w = 1; w < kWarps; ++w) online::merge(mm, ll, nullptr, m[w * kRows + rr], l[w * kRows + rr], nullptr, 0);
        std::fill(o.begin(), o.end(), 0.0f);
        for (int w = 0; w < kWarps; ++w) {
          const float wt = online::rescale(m[w * kRows + rr], mm);
          for (int x = 0; x < d; ++x) o[x] += wt * acc[(std::size_t(w) * kRows + rr) * d + x];
        }
        const std::size_t row = base + rr;
        if (!split) {
          for (int x = 0; x < d; ++x) O.store(row * d + x, round_to(t, o[x] / ll));
          L.store(row, online::lse(mm, ll));
        } else {  // an empty part (no key for this row): weight 0 in the merge below
          const std::size_t slot = part * p.rows() + row;
          for (int x = 0; x < d; ++x) PO.store(slot * d + x, ll > 0 ? o[x] / ll : 0.0f);
          PL.store(slot, ll > 0 ? online::lse(mm, ll) : -INFINITY);
        }
      }
    }
  if (split) {
    // The merge kernel, or the cluster's merge (the same sums in the same order): a row's
    // parts merged at once. A part's (O/ℓ, L) is the state (m = L, ℓ = 1, O/ℓ): e^L·1 =
    // e^m·ℓ. The statistics of all of them first (the merge over the L's alone, in the
    // kernel's tree), then every part weighted against the common max.
    std::vector<float> ls, o(d);
    for (long long u = 0; u < s.units; ++u)
      for (int rr = 0; rr < unit_rows(G, N, rbs, u); ++rr) {
        const std::size_t row = base_of(u) + rr;
        ls.resize(std::size_t(s.parts(u)));
        for (std::size_t j = 0; j < ls.size(); ++j) ls[j] = PL.load(j * p.rows() + row);
        float mm, ll;
        stats_tree(ls, mm, ll);
        std::fill(o.begin(), o.end(), 0.0f);
        const bool watched = trace && trace->row == row;
        for (std::size_t j = 0; j < ls.size(); ++j) {
          const float w = online::rescale(ls[j], mm);
          for (int c = 0; c < d; ++c) o[c] += w * PO.load((j * p.rows() + row) * d + c);
          if (watched)  // part j: its (O/ℓ, L) as the state (m = L, ℓ = 1), and its weight
            trace->add("part " + std::to_string(j), 0, 0, ls[j], ls[j] == -INFINITY ? 0.0f : 1.0f, w,
                       PO.peek().data() + (j * p.rows() + row) * d, d, true);
        }
        for (int c = 0; c < d; ++c) O.store(row * d + c, round_to(t, o[c] / ll));
        L.store(row, online::lse(mm, ll));
        if (watched) trace->add("merge", 0, Nk, mm, ll, 1.0f, o.data(), d);
      }
  }
  r.out = {O.take(), L.take()};
  return r;
}
}  // namespace

ModelForward model_forward(const Problem& p, const Qkv& in, const SplitPlan& s, online::Trace* trace) {
  return forward(p, in, s, trace, nullptr);
}

ModelForward model_forward_paged(const Problem& p, const Qkv& in, const PagedKv& kv, const SplitPlan& s) {
  require_supported(p);
  kv.validate(p, in.k.size());
  if (in.v.size() != in.k.size()) throw Error("the pools of K and V must be the same size");
  return forward(p, in, s, nullptr, &kv);
}

}  // namespace fa::step08
