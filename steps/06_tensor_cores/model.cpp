// CPU model of step 06's forward: step 03's block update with the kernel's tiles
// (forward_br(causal, d) query rows × forward_bc(causal, d) keys), its lazy rescaling
// and 16-bit rounding. Step 07 runs the same model with its own tiles.
#include <algorithm>
#include <cmath>

#include "steps/02_fused/tile.hpp"
#include "steps/03_online_softmax/online_softmax.hpp"
#include "steps/06_tensor_cores/step06.hpp"

namespace fa::step06 {

void require_lowp(const Problem& p, const char* step, const int* only_d, unsigned takes) {
  p.validate_for(step, takes);
  if (p.dtype == DType::fp32) throw Error(std::string(step) + " computes in bf16 or fp16: set the problem's dtype");
  if (!takes_d(0, only_d, p.d))
    throw Error(std::string(step) + " supports d = " + d_list(only_d) + " (got d = " + std::to_string(p.d) + ")");
}

void require_supported(const Problem& p) { require_lowp(p, "step06", kSupportedD); }

std::vector<float> rounded(const std::vector<float>& x, DType t) {
  std::vector<float> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = round_to(t, x[i]);
  return y;
}

Qkv rounded_inputs(const Problem& p, const Qkv& in) {
  return {rounded(in.q, p.dtype), rounded(in.k, p.dtype), rounded(in.v, p.dtype)};
}

ModelForward model_forward(const Problem& p, const Qkv& in) {
  require_lowp(p, "step06", kSupportedD, Problem::kDecode);
  return model_forward_tiled(p, in, forward_br(p.causal, p.d), forward_bc(p.causal, p.d));
}

ModelForward model_forward_tiled(const Problem& p, const Qkv& in, int kBr, int kBc) {
  ModelForward r;
  const DType t = p.dtype;
  // The device holds 16-bit tensors: rounding happens once, on the way in.
  Hbm Q(rounded(in.q, t), r.traffic), K(rounded(in.k, t), r.traffic), V(rounded(in.v, t), r.traffic);
  Hbm O(p.elems(), r.traffic), L(p.rows(), r.traffic);
  const int N = p.N, Nk = p.keys(), d = p.d;
  const float scale = p.softmax_scale();
  std::vector<float> s(kBc);
  for (std::size_t bh = 0; bh < p.heads(); ++bh) {
    const std::size_t head = bh * N * d, kv_head = p.kv_head(bh) * Nk * d;
    for (int i = 0; i * kBr < N; ++i) {
      const int q0 = i * kBr, rows = std::min(kBr, N - q0);
      OnChip chip(std::size_t(kBr) * d * 2 + 2 * std::size_t(kBc) * d + kBr * kBc + 2 * kBr);
      auto Qi = chip.tile(std::size_t(kBr) * d, "Q_i"), acc = chip.tile(std::size_t(kBr) * d, "O_i");
      auto Kj = chip.tile(std::size_t(kBc) * d, "K_j"), Vj = chip.tile(std::size_t(kBc) * d, "V_j");
      auto P = chip.tile(kBr * kBc, "P_ij"), stats = chip.tile(2 * kBr, "m_i, l_i");
      std::vector<float> m(kBr, -INFINITY), l(kBr, 0.0f);
      for (int rr = 0; rr < rows; ++rr)
        for (int c = 0; c < d; ++c) Qi[rr * d + c] = Q.load(head + std::size_t(q0 + rr) * d + c);
      const tiles::BlockRange band = tiles::kv_block_range(p, i, kBr, kBc);
      for (int j = band.first; j <= band.last; ++j) {
        const int k0 = j * kBc, kv = std::min(kBc, Nk - k0);
        for (int rr = 0; rr < kv; ++rr)
          for (int c = 0; c < d; ++c) {
            Kj[rr * d + c] = K.load(kv_head + std::size_t(k0 + rr) * d + c);
            Vj[rr * d + c] = V.load(kv_head + std::size_t(k0 + rr) * d + c);
          }
        for (int rr = 0; rr < kBr; ++rr) {
          float mx = -INFINITY;
          for (int c = 0; c < kBc; ++c) {
            float dot = 0.0f;
            for (int x = 0; x < d; ++x) dot += Qi[rr * d + x] * (c < kv ? Kj[c * d + x] : 0.0f);
            const bool masked = c >= kv || !p.sees(q0 + rr, k0 + c);
            s[c] = masked ? -INFINITY : scale * dot;
            mx = std::max(mx, s[c]);
          }
          // The kernel's lazy rescaling: m moves (and O, ℓ are rescaled) only when the
          // max grew by more than 2^kRescaleBits in base 2 (the kernel decides per warp,
          // this model per row: both exact, they differ in rounding only). A row
          // without any score yet (−∞ − −∞ is NaN) keeps m = −∞.
          const float grew = (mx - m[rr]) * kLog2e;
          const float m_new = grew > kRescaleBits ? std::max(m[rr], mx) : m[rr];
          const float alpha = online::rescale(m[rr], m_new);
          float sum = 0.0f;
          for (int c = 0; c < kBc; ++c) {
            const float pr = online::prob(s[c], m_new);
            sum += pr;                          // ℓ sums the fp32 probabilities...
            P[rr * kBc + c] = round_to(t, pr);  // ...P·V uses them rounded to 16 bits
          }
          l[rr] = alpha * l[rr] + sum;
          m[rr] = m_new;
          for (int x = 0; x < d; ++x) {
            float a = alpha * acc[rr * d + x];
            for (int c = 0; c < kv; ++c) a += P[rr * kBc + c] * Vj[c * d + x];
            acc[rr * d + x] = a;
          }
        }
      }
      for (int rr = 0; rr < rows; ++rr) {
        for (int x = 0; x < d; ++x) O.store(head + std::size_t(q0 + rr) * d + x, round_to(t, acc[rr * d + x] / l[rr]));
        L.store(bh * N + q0 + rr, online::lse(m[rr], l[rr]));
      }
    }
  }
  r.out = {O.take(), L.take()};
  return r;
}

Traffic traffic_forward(const Problem& p) { return traffic_forward_tiled(p, forward_br(p.causal, p.d), forward_bc(p.causal, p.d)); }

Traffic traffic_forward_tiled(const Problem& p, int br, int bc) {
  // Step 03's formula with these tiles: Q once, K and V once per query block that needs them
  // (per query head: a K/V head shared by a group is read once by each of its query heads).
  const std::uint64_t Nd = std::uint64_t(p.N) * p.d;
  return {p.heads() * (Nd + 2 * tiles::kv_rows_visited(p, br, bc) * p.d), p.heads() * (Nd + p.N)};
}

ForwardOut naive_lowp(const Problem& p, const Qkv& in) {
  require_lowp(p, "naive", kSupportedD, Problem::kDecode | Problem::kWindow);
  const DType t = p.dtype;
  const auto q = rounded(in.q, t), k = rounded(in.k, t), v = rounded(in.v, t);
  ForwardOut out{std::vector<float>(p.elems()), std::vector<float>(p.rows())};
  const int N = p.N, Nk = p.keys(), d = p.d;
  std::vector<float> S(Nk);
  for (std::size_t bh = 0; bh < p.heads(); ++bh) {
    const std::size_t head = bh * N * d, kv_head = p.kv_head(bh) * Nk * d;
    for (int i = 0; i < N; ++i) {
      const int first = p.first_key(i), vis = p.last_key(i) + 1;  // the keys query i sees
      float m = -INFINITY, l = 0.0f;
      for (int j = first; j < vis; ++j) {
        float dot = 0.0f;
        for (int x = 0; x < d; ++x) dot += q[head + std::size_t(i) * d + x] * k[kv_head + std::size_t(j) * d + x];
        S[j] = round_to(t, p.softmax_scale() * dot);  // S materialized in 16 bits
        m = std::max(m, S[j]);
      }
      for (int j = first; j < vis; ++j) l += std::exp(S[j] - m);
      for (int j = first; j < vis; ++j) S[j] = round_to(t, std::exp(S[j] - m) / l);  // P in 16 bits
      for (int x = 0; x < d; ++x) {
        float o = 0.0f;
        for (int j = first; j < vis; ++j) o += S[j] * v[kv_head + std::size_t(j) * d + x];
        out.o[head + std::size_t(i) * d + x] = round_to(t, o);
      }
      out.lse[bh * N + i] = m + std::log(l);
    }
  }
  return out;
}

double max_abs_error(const std::vector<float>& x, const std::vector<float>& ref) {
  double e = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double di = std::fabs(double(x[i]) - double(ref[i]));
    e = std::isnan(di) ? INFINITY : std::max(e, di);
  }
  return e;
}

}  // namespace fa::step06
