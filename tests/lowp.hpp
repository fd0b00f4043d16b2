// What the 16-bit steps' tests (06, 07) share: problems in bf16 or fp16, inputs already
// rounded to that type, rows whose max keeps rising, and FlashAttention's error rule
// for the forward (against the fp64 reference on the same 16-bit inputs, at most twice
// the error of a naive computation in the same type) and the gradients (three times).
#pragma once

#include "reference/reference.hpp"
#include "steps/06_tensor_cores/step06.hpp"
#include "tests/check.hpp"

namespace fa::test {

inline Problem lowp(Problem p, DType t) {
  p.dtype = t;
  return p;
}

/// Inputs already representable in p.dtype, so that the reference and the step see
/// the same numbers and the budget measures the step's arithmetic alone.
inline Qkv inputs(const Problem& p, std::uint64_t seed) {
  return step06::rounded_inputs(p, random_qkv(p, seed));
}

/// Inputs whose scores rise along the keys: component 0 of every query is 16 and of
/// key j is 20·j/N, so at N = 1000, d = 64 a row's max climbs by ~40 (58 in log2
/// units) from its first key to its last, 3–8 log2 units per key block of 64 or 128:
/// some blocks (or pairs of blocks) raise it by more than 2^8 (the forward rescales
/// O and ℓ), others by less (the old max stays in use).
inline Qkv rising_scores(const Problem& p, std::uint64_t seed) {
  Qkv in = random_qkv(p, seed);
  for (std::size_t bh = 0; bh < p.heads(); ++bh)
    for (int r = 0; r < p.N; ++r) {
      const std::size_t at = (bh * p.N + r) * p.d;
      in.q[at] = 16.0f;
      in.k[at] = 20.0f * float(r) / float(p.N);
    }
  return step06::rounded_inputs(p, in);
}

/// err(step) <= 2·err(naive same-dtype), for O and L, against the fp64 reference;
/// every element of O and L finite and written.
inline void check_budget(const Problem& p, const Qkv& in, const ForwardOut& got, const char* who) {
  const ForwardOut ref = reference::forward(p, in), naive = step06::naive_lowp(p, in);
  const double eo = step06::max_abs_error(got.o, ref.o), no = step06::max_abs_error(naive.o, ref.o);
  const double el = step06::max_abs_error(got.lse, ref.lse), nl = step06::max_abs_error(naive.lse, ref.lse);
  INFO(who << ": max |O − ref| = " << eo << " (naive " << dtype_name(p.dtype) << ": " << no << "), max |L − ref| = "
           << el << " (naive: " << nl << ")");
  CHECK(eo <= 2 * no);
  CHECK(el <= 2 * nl + 1e-6);  // + 1e-6: at N = 1 both L errors are 0 up to fp32 rounding
  for (const auto* x : {&got.o, &got.lse}) {
    const auto r = compare(*x, *x, Tolerance{1.0, 0.0, "finite and written"});
    CHECK(r.nan == 0);
    CHECK(r.unwritten == 0);
  }
}

/// K and V of a grouped problem repeated for every query head: the same problem with H_kv = H.
inline Qkv repeated_kv(const Problem& p, const Qkv& in) {
  Qkv e{in.q, {}, {}};
  const std::size_t head = std::size_t(p.keys()) * p.d;
  for (std::size_t bh = 0; bh < p.heads(); ++bh) {
    const std::size_t from = p.kv_head(bh) * head;
    e.k.insert(e.k.end(), in.k.begin() + std::ptrdiff_t(from), in.k.begin() + std::ptrdiff_t(from + head));
    e.v.insert(e.v.end(), in.v.begin() + std::ptrdiff_t(from), in.v.begin() + std::ptrdiff_t(from + head));
  }
  return e;
}

/// A gradient of the output, representable in p.dtype.
inline std::vector<float> grad_out(const Problem& p, std::uint64_t seed) {
  return step06::rounded(random_qkv(p, seed).q, p.dtype);
}

/// err(step) <= 3·err(naive same-dtype) for dQ, dK and dV, against the fp64 reference;
/// every element finite and written. + 1e-5: at N = 1 the exact dS is 0 and the naive
/// one is exactly 0 too (it computes D from the same rounded dP), while fp32 sums in
/// two orders leave ~1e-7.
inline void check_grad_budget(const Problem& p, const Qkv& in, const std::vector<float>& dout, const Grads& got,
                              const char* who) {
  const Grads ref = reference::backward(p, in, dout), naive = step06::naive_lowp_backward(p, in, dout);
  struct Part {
    const char* name;
    const std::vector<float>&step, &ref, &naive;
  };
  for (const Part& g : {Part{"dQ", got.dq, ref.dq, naive.dq}, Part{"dK", got.dk, ref.dk, naive.dk},
                        Part{"dV", got.dv, ref.dv, naive.dv}}) {
    const double e = step06::max_abs_error(g.step, g.ref), n = step06::max_abs_error(g.naive, g.ref);
    INFO(who << ": max |" << g.name << " − ref| = " << e << " (naive " << dtype_name(p.dtype) << ": " << n << ")");
    CHECK(e <= 3 * n + 1e-5);
    const auto r = compare(g.step, g.ref, Tolerance{1.0, 0.0, "finite and written"});
    CHECK(r.nan == 0);
    CHECK(r.unwritten == 0);
  }
}

/// The three gradients against another computation's, element by element.
inline void check_grads_close(const char* what, const Problem& p, const Grads& got, const Grads& want,
                              const Tolerance& tl) {
  INFO(what);
  FA_CHECK_CLOSE("dQ", got.dq, want.dq, tl, test::shape_o(p));
  FA_CHECK_CLOSE("dK", got.dk, want.dk, tl, test::shape_kv(p));
  FA_CHECK_CLOSE("dV", got.dv, want.dv, tl, test::shape_kv(p));
}

/// Kernel against its model or another step: the 16-bit reorder tolerance of p's type.
inline const Tolerance& reorder(DType t) { return t == DType::bf16 ? step06::kBf16Reorder : step06::kFp16Reorder; }

}  // namespace fa::test
