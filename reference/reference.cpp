#include "reference/reference.hpp"

#include <Eigen/Dense>
#include <cmath>
#include <limits>

namespace fa::reference {
namespace {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapD = Eigen::Map<const MatD>;

std::vector<double> widen(const std::vector<float>& x) { return {x.begin(), x.end()}; }
std::vector<float> narrow(const std::vector<double>& x) {
  std::vector<float> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = static_cast<float>(x[i]);
  return y;
}

void check_sizes(const Problem& p, std::size_t q, std::size_t k, std::size_t v) {
  p.validate();
  if (q != p.elems() || k != p.kv_elems() || v != p.kv_elems())
    throw Error("reference: Q must hold B·H·N·d = " + std::to_string(p.elems()) + " elements and K, V each " +
                "B·H_kv·N_kv·d = " + std::to_string(p.kv_elems()) + " for " + p.str());
}

// One head: P = softmax(scale·Q·Kᵀ) over the keys each query sees (N × N_kv), and L.
MatD probabilities(const Problem& p, const MapD& Q, const MapD& K, double* lse) {
  MatD S = double(p.softmax_scale()) * (Q * K.transpose());
  for (int i = 0; i < p.N; ++i) {
    const int first = p.first_key(i), last = p.last_key(i);  // the keys query i sees
    const double m = S.row(i).segment(first, last - first + 1).maxCoeff();
    double l = 0;
    for (int j = first; j <= last; ++j) l += std::exp(S(i, j) - m);
    for (int j = 0; j < p.keys(); ++j) S(i, j) = p.sees(i, j) ? std::exp(S(i, j) - m) / l : 0.0;
    if (lse) lse[i] = m + std::log(l);
  }
  return S;
}

}  // namespace

ForwardD forward_d(const Problem& p, const QkvD& in) {
  check_sizes(p, in.q.size(), in.k.size(), in.v.size());
  ForwardD out{std::vector<double>(p.elems()), std::vector<double>(p.rows())};
  const std::size_t head = std::size_t(p.N) * p.d, kv = std::size_t(p.keys()) * p.d;
  for (std::size_t bh = 0; bh < p.heads(); ++bh) {
    const std::size_t kvh = p.kv_head(bh);  // grouped-query attention: the K/V head query head bh reads
    MapD Q(in.q.data() + bh * head, p.N, p.d), K(in.k.data() + kvh * kv, p.keys(), p.d),
        V(in.v.data() + kvh * kv, p.keys(), p.d);
    const MatD P = probabilities(p, Q, K, out.lse.data() + bh * p.N);
    Eigen::Map<MatD>(out.o.data() + bh * head, p.N, p.d) = P * V;
  }
  return out;
}

ForwardOut forward(const Problem& p, const Qkv& in) {
  const ForwardD o = forward_d(p, {widen(in.q), widen(in.k), widen(in.v)});
  return {narrow(o.o), narrow(o.lse)};
}

std::vector<float> forward_nosoftmax(const Problem& p, const Qkv& in) {
  check_sizes(p, in.q.size(), in.k.size(), in.v.size());
  const auto q = widen(in.q), k = widen(in.k), v = widen(in.v);
  std::vector<double> o(p.elems());
  const std::size_t head = std::size_t(p.N) * p.d, kv = std::size_t(p.keys()) * p.d;
  for (std::size_t bh = 0; bh < p.heads(); ++bh) {
    const std::size_t kvh = p.kv_head(bh);
    MapD Q(q.data() + bh * head, p.N, p.d), K(k.data() + kvh * kv, p.keys(), p.d), V(v.data() + kvh * kv, p.keys(), p.d);
    MatD S = double(p.softmax_scale()) * (Q * K.transpose());
    for (int i = 0; i < p.N; ++i)
      for (int j = 0; j < p.keys(); ++j)
        if (!p.sees(i, j)) S(i, j) = 0.0;
    Eigen::Map<MatD>(o.data() + bh * head, p.N, p.d) = S * V;
  }
  return narrow(o);
}

GradsD backward_d(const Problem& p, const QkvD& in, const std::vector<double>& dout) {
  check_sizes(p, in.q.size(), in.k.size(), in.v.size());
  if (dout.size() != p.elems()) throw Error("reference: dO must have the shape of O");
  GradsD g{std::vector<double>(p.elems()), std::vector<double>(p.kv_elems()), std::vector<double>(p.kv_elems())};
  const std::size_t head = std::size_t(p.N) * p.d, kv = std::size_t(p.keys()) * p.d;
  const double scale = p.softmax_scale();
  for (std::size_t bh = 0; bh < p.heads(); ++bh) {
    const std::size_t kvh = p.kv_head(bh);
    MapD Q(in.q.data() + bh * head, p.N, p.d), K(in.k.data() + kvh * kv, p.keys(), p.d),
        V(in.v.data() + kvh * kv, p.keys(), p.d), dO(dout.data() + bh * head, p.N, p.d);
    const MatD P = probabilities(p, Q, K, nullptr);
    const MatD O = P * V;
    const Eigen::VectorXd D = (dO.array() * O.array()).rowwise().sum();  // D_i = dO_i · O_i
    const MatD dP = dO * V.transpose();
    const MatD dS = P.array() * (dP.colwise() - D).array();  // masked entries: P = 0 so dS = 0
    // A K/V head shared by a group of query heads gets the sum of their gradients.
    Eigen::Map<MatD>(g.dv.data() + kvh * kv, p.keys(), p.d) += P.transpose() * dO;
    Eigen::Map<MatD>(g.dq.data() + bh * head, p.N, p.d) = scale * dS * K;
    Eigen::Map<MatD>(g.dk.data() + kvh * kv, p.keys(), p.d) += scale * dS.transpose() * Q;
  }
  return g;
}

Grads backward(const Problem& p, const Qkv& in, const std::vector<float>& dout) {
  const GradsD g = backward_d(p, {widen(in.q), widen(in.k), widen(in.v)}, widen(dout));
  return {narrow(g.dq), narrow(g.dk), narrow(g.dv)};
}

}  // namespace fa::reference
