// Tests of the CPU reference: against a plain triple loop, finite differences,
// closed-form cases and huge logits.
#include <algorithm>
#include <cmath>

#include "reference/reference.hpp"
#include "tests/check.hpp"

using namespace fa;
using fa::test::make;

namespace {

// The textbook formula, one loop at a time, in long double: independent of Eigen.
// N queries against N_kv keys, the queries being the last N positions.
ForwardOut loops(const Problem& p, const Qkv& in, bool softmax) {
  ForwardOut out{std::vector<float>(p.elems()), std::vector<float>(p.rows())};
  const long double scale = p.softmax_scale();
  const int nk = p.keys();
  for (std::size_t bh = 0; bh < p.heads(); ++bh)
    for (int i = 0; i < p.N; ++i) {
      std::vector<long double> s(nk);
      long double m = -INFINITY;
      const int last = p.causal ? nk - p.N + i : nk - 1;
      for (int j = 0; j <= last; ++j) {
        long double dot = 0;
        for (int c = 0; c < p.d; ++c)
          dot += (long double)in.q[(bh * p.N + i) * p.d + c] * in.k[(bh * nk + j) * p.d + c];
        s[j] = scale * dot;
        m = std::max(m, s[j]);
      }
      long double l = 0;
      for (int j = 0; j <= last; ++j) l += std::exp(s[j] - m);
      for (int c = 0; c < p.d; ++c) {
        long double o = 0;
        for (int j = 0; j <= last; ++j)
          o += (softmax ? std::exp(s[j] - m) / l : s[j]) * in.v[(bh * nk + j) * p.d + c];
        out.o[(bh * p.N + i) * p.d + c] = float(o);
      }
      out.lse[bh * p.N + i] = float(m + std::log(l));
    }
  return out;
}

reference::QkvD widen(const Qkv& in) {
  return {{in.q.begin(), in.q.end()}, {in.k.begin(), in.k.end()}, {in.v.begin(), in.v.end()}};
}

}  // namespace

TEST_CASE("reference forward equals the textbook loops on odd shapes", "[cpu]") {
  const int N = GENERATE(1, 7, 113);
  const int d = GENERATE(8, 40, 128);
  const bool causal = GENERATE(false, true);
  const Problem p = make(2, 3, N, d, causal);
  INFO(p.str());
  const Qkv in = random_qkv(p, 42);
  const ForwardOut ref = reference::forward(p, in), want = loops(p, in, true);
  constexpr Tolerance kRounding{1e-6, 1e-6, "fp64 vs long double, both rounded once to float"};
  FA_CHECK_CLOSE("O", ref.o, want.o, kRounding, test::shape_o(p));
  FA_CHECK_CLOSE("L", ref.lse, want.lse, kRounding, test::shape_l(p));
  FA_CHECK_CLOSE("O without softmax", reference::forward_nosoftmax(p, in), loops(p, in, false).o, kRounding,
                 test::shape_o(p));
}

TEST_CASE("reference backward agrees with central finite differences", "[cpu]") {
  const bool causal = GENERATE(false, true);
  const Problem p = make(1, 2, 6, 4, causal, 0.7f);
  INFO(p.str());
  const Qkv in = random_qkv(p, 3);
  const std::vector<float> dof = random_tensor(p.elems(), 99);
  const std::vector<double> dout(dof.begin(), dof.end());
  reference::QkvD x = widen(in);
  const reference::GradsD g = reference::backward_d(p, x, dout);

  // loss(Q, K, V) = Σ dO∘O, whose gradient the backward computes.
  auto loss = [&](const reference::QkvD& y) {
    const auto o = reference::forward_d(p, y).o;
    double s = 0;
    for (std::size_t i = 0; i < o.size(); ++i) s += dout[i] * o[i];
    return s;
  };
  const double h = 1e-4;
  std::vector<std::pair<std::vector<double>*, const std::vector<double>*>> pairs = {
      {&x.q, &g.dq}, {&x.k, &g.dk}, {&x.v, &g.dv}};
  const char* names[] = {"dQ", "dK", "dV"};
  for (int t = 0; t < 3; ++t) {
    std::vector<float> fd(p.elems()), an(p.elems());
    for (std::size_t i = 0; i < p.elems(); ++i) {
      double& e = (*pairs[t].first)[i];
      const double keep = e;
      e = keep + h;
      const double up = loss(x);
      e = keep - h;
      const double down = loss(x);
      e = keep;
      fd[i] = float((up - down) / (2 * h));
      an[i] = float((*pairs[t].second)[i]);
    }
    FA_CHECK_CLOSE(names[t], an, fd, tol::kFiniteDiff, test::shape_o(p));
  }
}

TEST_CASE("reference closed-form cases", "[cpu]") {
  SECTION("all-equal scores give the mean of V (causal: the mean of V_0..V_i)") {
    const bool causal = GENERATE(false, true);
    const Problem p = make(1, 1, 9, 5, causal);
    Qkv in = random_qkv(p, 5);
    std::fill(in.q.begin(), in.q.end(), 0.0f);  // S = 0 everywhere
    const ForwardOut out = reference::forward(p, in);
    std::vector<float> want(p.elems()), lse(p.rows());
    for (int i = 0; i < p.N; ++i) {
      const int n = causal ? i + 1 : p.N;
      for (int c = 0; c < p.d; ++c) {
        double s = 0;
        for (int j = 0; j < n; ++j) s += in.v[j * p.d + c];
        want[i * p.d + c] = float(s / n);
      }
      lse[i] = float(std::log(double(n)));  // log Σ e^0
    }
    FA_CHECK_CLOSE("O", out.o, want, tol::kFp32Forward, test::shape_o(p));
    FA_CHECK_CLOSE("L", out.lse, lse, tol::kFp32Forward, test::shape_l(p));
  }
  SECTION("causal row 0 sees only key 0: O_0 = V_0, L_0 = S_00") {
    const Problem p = make(2, 2, 17, 8, true);
    const Qkv in = random_qkv(p, 6);
    const ForwardOut out = reference::forward(p, in);
    for (std::size_t bh = 0; bh < p.heads(); ++bh)
      for (int c = 0; c < p.d; ++c) CHECK(out.o[bh * p.N * p.d + c] == in.v[bh * p.N * p.d + c]);
  }
  SECTION("adding a constant to a row of scores changes O, not the softmax") {
    // K_j + u for every j adds scale·q_i·u to row i of S: O is unchanged, L shifts.
    const Problem p = make(1, 2, 13, 6, false);
    const Qkv in = random_qkv(p, 8);
    Qkv shifted = in;
    const std::vector<float> u = random_tensor(p.d, 77, 3.0f);
    for (std::size_t r = 0; r < p.rows(); ++r)
      for (int c = 0; c < p.d; ++c) shifted.k[r * p.d + c] += u[c];
    FA_CHECK_CLOSE("O after shift", reference::forward(p, shifted).o, reference::forward(p, in).o,
                   tol::kFp32Forward, test::shape_o(p));
  }
}

TEST_CASE("reference is finite and exact with logits of ±1e4", "[cpu]") {
  // Small integers times a power-of-two scale: every score is an exact multiple of
  // 256, so softmax is one-hot on the argmax (ties split evenly): e^-256 ≈ 1e-111.
  const bool causal = GENERATE(false, true);
  const Problem p = make(1, 2, 33, 16, causal, 256.0f);
  Qkv in = random_qkv(p, 9, 3.0f);
  for (auto* t : {&in.q, &in.k})
    for (auto& e : *t) e = std::round(e);
  const ForwardOut out = reference::forward(p, in);
  std::vector<float> want(p.elems());
  double max_logit = 0;
  for (std::size_t bh = 0; bh < p.heads(); ++bh)
    for (int i = 0; i < p.N; ++i) {
      std::vector<double> s;
      for (int j = 0; j <= (causal ? i : p.N - 1); ++j) {
        double dot = 0;
        for (int c = 0; c < p.d; ++c) dot += in.q[(bh * p.N + i) * p.d + c] * in.k[(bh * p.N + j) * p.d + c];
        s.push_back(256.0 * dot);
        max_logit = std::max(max_logit, std::fabs(256.0 * dot));
      }
      const double m = *std::max_element(s.begin(), s.end());
      int ties = 0;
      for (double x : s) ties += x == m;
      for (int c = 0; c < p.d; ++c) {
        double o = 0;
        for (std::size_t j = 0; j < s.size(); ++j)
          if (s[j] == m) o += in.v[(bh * p.N + j) * p.d + c];
        want[(bh * p.N + i) * p.d + c] = float(o / ties);
      }
    }
  INFO("largest |logit| " << max_logit);
  CHECK(max_logit > 5e3);
  FA_CHECK_CLOSE("O", out.o, want, tol::kFp32Forward, test::shape_o(p));
}

TEST_CASE("reference with fewer queries than keys: the textbook loops, and the square problem's last rows", "[cpu]") {
  // N queries against N_kv keys are the last N rows of the N_kv × N_kv problem whose other
  // queries are anything (and, for the gradients, whose other rows of dO are zero).
  constexpr Tolerance kRounding{1e-6, 1e-6, "fp64 vs long double, or fp64 in two shapes, rounded once to float"};
  for (bool causal : {false, true})
    for (const auto& [N, Nk] : {std::pair{1, 37}, std::pair{5, 37}, std::pair{16, 130}}) {
      Problem p = make(2, 3, N, 24, causal);
      p.N_kv = Nk;
      INFO(p.str());
      const Qkv in = random_qkv(p, 31);
      const std::vector<float> dout = random_tensor(p.elems(), 32);
      const ForwardOut ref = reference::forward(p, in);
      const ForwardOut tl = loops(p, in, true);
      FA_CHECK_CLOSE("O vs loops", ref.o, tl.o, kRounding, test::shape_o(p));
      FA_CHECK_CLOSE("L vs loops", ref.lse, tl.lse, kRounding, test::shape_l(p));
      FA_CHECK_CLOSE("no softmax vs loops", reference::forward_nosoftmax(p, in), loops(p, in, false).o,
                     kRounding, test::shape_o(p));

      const Problem sq = make(2, 3, Nk, 24, causal);
      Qkv full{random_qkv(sq, 33).q, in.k, in.v};
      std::vector<float> dfull(sq.elems(), 0.0f);
      for (std::size_t bh = 0; bh < p.heads(); ++bh)
        for (int i = 0; i < N; ++i)
          for (int c = 0; c < p.d; ++c) {
            const std::size_t at = (bh * Nk + Nk - N + i) * p.d + c, from = (bh * N + i) * p.d + c;
            full.q[at] = in.q[from];
            dfull[at] = dout[from];
          }
      const ForwardOut fo = reference::forward(sq, full);
      const Grads g = reference::backward(p, in, dout), gf = reference::backward(sq, full, dfull);
      std::vector<float> o_rows, l_rows, dq_rows;
      for (std::size_t bh = 0; bh < p.heads(); ++bh)
        for (int i = Nk - N; i < Nk; ++i) {
          l_rows.push_back(fo.lse[bh * Nk + i]);
          for (int c = 0; c < p.d; ++c) {
            o_rows.push_back(fo.o[(bh * Nk + i) * p.d + c]);
            dq_rows.push_back(gf.dq[(bh * Nk + i) * p.d + c]);
          }
        }
      FA_CHECK_CLOSE("O vs the square problem", ref.o, o_rows, kRounding, test::shape_o(p));
      FA_CHECK_CLOSE("L vs the square problem", ref.lse, l_rows, kRounding, test::shape_l(p));
      FA_CHECK_CLOSE("dQ vs the square problem", g.dq, dq_rows, kRounding, test::shape_o(p));
      FA_CHECK_CLOSE("dK vs the square problem", g.dk, gf.dk, kRounding, test::shape_o(sq));
      FA_CHECK_CLOSE("dV vs the square problem", g.dv, gf.dv, kRounding, test::shape_o(sq));
    }
}

TEST_CASE("reference rejects inputs of the wrong size", "[cpu]") {
  const Problem p = make(1, 1, 4, 8, false);
  Qkv in = random_qkv(p, 1);
  in.k.pop_back();
  CHECK_THROWS_AS(reference::forward(p, in), fa::Error);
}
