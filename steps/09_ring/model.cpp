// CPU model of step 09: R ranks of a ring in one process. Each rank's local calls are
// step 06's CPU model on the rows that rank holds and the rows of the K/V block visiting
// it; what travels is counted, not copied (every rank reads the global tensors through
// its chunks).
#include <cmath>
#include <string>

#include "common/compare.hpp"  // poison_value
#include "steps/06_tensor_cores/step06.hpp"
#include "steps/09_ring/step09.hpp"
#include "steps/09_ring/trace.hpp"

namespace fa::step09 {

Chunks chunks_of(int rank, int ranks) { return {rank, 2 * ranks - 1 - rank}; }

int kv_source(int rank, int step, int ranks) { return ((rank - step) % ranks + ranks) % ranks; }

std::vector<LocalCall> local_calls(int rank, int step, int ranks, bool causal) {
  const Chunks q = chunks_of(rank, ranks), kv = chunks_of(kv_source(rank, step, ranks), ranks);
  if (step == 0) return {{{q.early, q.late}, {kv.early, kv.late}, causal}};
  if (!causal) return {{{q.early, q.late}, {kv.early, kv.late}, false}};
  // exercise 09-zigzag: the visible (query chunk, key chunk) pairs once the block comes from another rank — a key chunk after a query chunk is masked; none of them is the diagonal
  // stub: (void)q, (void)kv;
  // stub: return {};
  std::vector<LocalCall> calls;
  for (int a : {q.early, q.late})
    for (int b : {kv.early, kv.late})
      if (b < a) calls.push_back({{a}, {b}, false});
  return calls;
  // end exercise
}

void require_supported(const Problem& p, int ranks) {
  step06::require_lowp(p, "step09", step06::kSupportedD);
  if (ranks < 1) throw Error("step09: the ring needs at least one rank (got " + std::to_string(ranks) + ")");
  if (p.N % (2 * ranks) != 0)
    throw Error("step09: N = " + std::to_string(p.N) + " must divide into 2·R = " + std::to_string(2 * ranks) +
                " chunks (the zigzag layout: rank r holds chunks r and 2R − 1 − r)");
}

void merge_normalised(float& L, float* o, float L_new, const float* o_new, int d) {
  const RowMerge w = merge_rows(L, L_new);
  for (int c = 0; c < d; ++c) o[c] = merge_column(w, o[c], o_new[c]);
  L = w.L;
}

/// The rows of `chunks` (each c rows) of every head of x ([B·H, N, d]), concatenated per
/// head: [B·H, |chunks|·c, d].
std::vector<float> gather(const std::vector<float>& x, std::size_t heads, int N, int width, const std::vector<int>& chunks,
                          int c) {
  std::vector<float> out;
  out.reserve(heads * chunks.size() * c * width);
  for (std::size_t bh = 0; bh < heads; ++bh)
    for (int ch : chunks) {
      const auto from = x.begin() + std::ptrdiff_t((bh * N + std::size_t(ch) * c) * width);
      out.insert(out.end(), from, from + std::ptrdiff_t(c) * width);
    }
  return out;
}

namespace {

/// The problem of one local call: the same heads, |q|·c queries against |kv|·c keys
/// (equal: the calls are square), the call's mask, p's scale and type.
Problem local_problem(const Problem& p, const LocalCall& call, int c) {
  Problem s = p;
  s.N = int(call.q.size()) * c;
  s.causal = call.causal;
  s.scale = p.softmax_scale();
  return s;
}

/// Query-key pairs one call computes (what the mask leaves).
std::uint64_t pairs_of(const Problem& s) {
  const std::uint64_t n = std::uint64_t(s.N);
  return s.heads() * (s.causal ? n * (n + 1) / 2 : n * n);
}

/// Position in a rank's [B·H, 2c, d] state of row `row` of chunk `ch` of head bh.
std::size_t rank_row(std::size_t bh, const Chunks& mine, int ch, int row, int c) {
  return bh * 2 * c + std::size_t(ch == mine.early ? 0 : c) + row;
}

/// A call's inputs: its query rows of Q, its key rows of K and V.
Qkv call_inputs(const Qkv& in, std::size_t heads, int N, int d, const LocalCall& call, int c) {
  return {gather(in.q, heads, N, d, call.q, c), gather(in.k, heads, N, d, call.kv, c),
          gather(in.v, heads, N, d, call.kv, c)};
}

/// part (a call's rows of `chunks`, [B·H, |chunks|·c, width]) added into acc, the
/// [B·H, 2c, width] rows of the rank whose chunks they are.
void add_rows(std::vector<float>& acc, const std::vector<float>& part, std::size_t heads, const Chunks& whose,
              const std::vector<int>& chunks, int c, int width) {
  const std::size_t n = chunks.size() * c;
  for (std::size_t bh = 0; bh < heads; ++bh)
    for (std::size_t i = 0; i < chunks.size(); ++i)
      for (int row = 0; row < c; ++row) {
        const std::size_t at = rank_row(bh, whose, chunks[i], row, c) * width, from = (bh * n + i * c + row) * width;
        for (int x = 0; x < width; ++x) acc[at + x] += part[from + x];
      }
}

}  // namespace

/// A rank's [B·H, 2c, width] rows into x ([B·H, N, width]) at its chunks, rounded to t
/// (fp32: as they are).
void put_rows(std::vector<float>& x, const std::vector<float>& rank, std::size_t heads, int N, int width,
              const Chunks& mine, int c, DType t) {
  for (std::size_t bh = 0; bh < heads; ++bh)
    for (int ch : {mine.early, mine.late})
      for (int row = 0; row < c; ++row) {
        const std::size_t at = rank_row(bh, mine, ch, row, c) * width,
                          to = (bh * N + std::size_t(ch) * c + row) * width;
        for (int e = 0; e < width; ++e) x[to + e] = t == DType::fp32 ? rank[at + e] : round_to(t, rank[at + e]);
      }
}

namespace {

RingStats empty_stats(int ranks) {
  return {std::vector<std::uint64_t>(ranks, 0), std::vector<std::vector<std::uint64_t>>(ranks, std::vector<std::uint64_t>(ranks, 0))};
}

}  // namespace

std::uint64_t sent_forward(const Problem& p, int ranks) {
  return std::uint64_t(ranks - 1) * 2 * p.heads() * (p.N / ranks) * p.d * 2;
}
std::uint64_t sent_backward(const Problem& p, int ranks) {
  const std::uint64_t block = p.heads() * std::uint64_t(p.N / ranks) * p.d;
  return ranks == 1 ? 0 : sent_forward(p, ranks) + std::uint64_t(ranks) * 2 * block * 4;
}

RingForward model_forward(const Problem& p, const Qkv& in, int ranks) { return model_forward(p, in, ranks, nullptr); }

RingForward model_forward(const Problem& p, const Qkv& in, int ranks, online::Trace* trace) {
  require_supported(p, ranks);
  const int c = p.N / (2 * ranks), d = p.d;
  const std::size_t heads = p.heads();
  // Poisoned: a row no rank writes back keeps compare()'s poison, and the tests see it.
  RingForward r{{std::vector<float>(p.elems(), poison_value()), std::vector<float>(p.rows(), poison_value())},
                empty_stats(ranks)};
  for (int rank = 0; rank < ranks; ++rank) {
    const Chunks mine = chunks_of(rank, ranks);
    std::vector<float> o(heads * 2 * c * d, 0.0f), L(heads * 2 * c, -INFINITY);  // this rank's (O, L), fp32
    for (int step = 0; step < ranks; ++step) {
      for (const LocalCall& call : local_calls(rank, step, ranks, p.causal)) {
        const Problem s = local_problem(p, call, c);
        const ForwardOut part = step06::model_forward(s, call_inputs(in, heads, p.N, d, call, c)).out;
        for (std::size_t bh = 0; bh < heads; ++bh)
          for (std::size_t i = 0; i < call.q.size(); ++i)
            for (int row = 0; row < c; ++row) {
              const std::size_t at = rank_row(bh, mine, call.q[i], row, c), from = (bh * s.N + i * c + row);
              if (trace && bh == 0 && std::size_t(call.q[i]) * c + row == trace->row) {
                const float w_old = merge_rows(L[at], part.lse[from]).w_old;
                merge_normalised(L[at], &o[at * d], part.lse[from], &part.o[from * d], d);
                trace->add("rank " + std::to_string(rank) + " step " + std::to_string(step) + " (K/V of rank " +
                               std::to_string(kv_source(rank, step, ranks)) + ")",
                           call.kv.front() * c, (call.kv.back() + 1) * c, L[at], 1.0f, w_old, &o[at * d], d, true);
                continue;
              }
              merge_normalised(L[at], &o[at * d], part.lse[from], &part.o[from * d], d);
            }
        r.stats.pairs[step][rank] += pairs_of(s);
      }
      if (step < ranks - 1) r.stats.sent[rank] += 2 * heads * std::uint64_t(2 * c) * d * 2;  // K, V to rank + 1
    }
    put_rows(r.out.o, o, heads, p.N, d, mine, c, p.dtype);
    put_rows(r.out.lse, L, heads, p.N, 1, mine, c, DType::fp32);
  }
  return r;
}

RingBackward model_backward(const Problem& p, const Qkv& in, const ForwardOut& fwd, const std::vector<float>& dout,
                            int ranks) {
  require_supported(p, ranks);
  const int c = p.N / (2 * ranks), d = p.d;
  const std::size_t heads = p.heads(), block = heads * 2 * c * d;
  RingBackward r{{std::vector<float>(p.elems(), poison_value()), std::vector<float>(p.elems(), poison_value()),
                  std::vector<float>(p.elems(), poison_value())},
                 empty_stats(ranks)};
  // dQ of each rank's rows; dK, dV of each rank's block, summed as the block travels.
  std::vector<std::vector<float>> dq(ranks, std::vector<float>(block, 0.0f)), dk = dq, dv = dq;
  for (int step = 0; step < ranks; ++step)
    for (int rank = 0; rank < ranks; ++rank) {
      const int src = kv_source(rank, step, ranks);
      const Chunks mine = chunks_of(rank, ranks), theirs = chunks_of(src, ranks);
      for (const LocalCall& call : local_calls(rank, step, ranks, p.causal)) {
        const Problem s = local_problem(p, call, c);
        const Qkv local = call_inputs(in, heads, p.N, d, call, c);
        const ForwardOut rows{gather(fwd.o, heads, p.N, d, call.q, c), gather(fwd.lse, heads, p.N, 1, call.q, c)};
        const Grads g = step06::model_backward(s, local, rows, gather(dout, heads, p.N, d, call.q, c)).grads;
        // The call's rows back to their places: its query rows into this rank's dQ, its
        // key rows into the visiting block's dK, dV (which travel on with it).
        add_rows(dq[rank], g.dq, heads, mine, call.q, c, d);
        add_rows(dk[src], g.dk, heads, theirs, call.kv, c, d);
        add_rows(dv[src], g.dv, heads, theirs, call.kv, c, d);
        r.stats.pairs[step][rank] += pairs_of(s);
      }
      if (step < ranks - 1) r.stats.sent[rank] += 2 * heads * std::uint64_t(2 * c) * d * 2;  // K, V onwards
      if (ranks > 1) r.stats.sent[rank] += 2 * std::uint64_t(block) * 4;                    // dK, dV onwards (fp32)
    }
  for (int rank = 0; rank < ranks; ++rank) {
    const Chunks mine = chunks_of(rank, ranks);
    put_rows(r.grads.dq, dq[rank], heads, p.N, d, mine, c, p.dtype);
    put_rows(r.grads.dk, dk[rank], heads, p.N, d, mine, c, p.dtype);
    put_rows(r.grads.dv, dv[rank], heads, p.N, d, mine, c, p.dtype);
  }
  return r;
}

}  // namespace fa::step09
