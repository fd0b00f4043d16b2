// Step 09 over NCCL, one process a GPU, started by ring09 (CTest: "step09 nccl R=1, 2,
// 4", Not Run on a machine with fewer GPUs). Every rank runs this file on the same
// inputs (the same seeds) and checks its own rows: against the one-process ring on its
// GPU (the same local calls and merges in the same order — bit for bit but for dQ, which
// the local kernel adds in any order) and against the local kernel (local_kernels: step
// 07's on an H200, step 06's before) on the whole sequence (the merge's reordering; with
// one rank, bit for bit but for dQ).
#include <string>

#include "common/gpu.hpp"
#include "steps/09_ring/nccl.hpp"
#include "tests/lowp.hpp"
#include "tests/ring_sizes.hpp"

namespace fa {
namespace {

using test::grad_out;
using test::inputs;
using test::lowp;
using test::make;
using test::ring_sizes;

/// This rank's rows of got and want compared, indices as [head, row of the rank, column].
void check_rows(const char* what, const step09::RankShape& sh, int rank, int width, const std::vector<float>& got,
                const std::vector<float>& want, const Tolerance& t) {
  const std::vector<float> g = sh.rows(got, rank, width), w = sh.rows(want, rank, width);
  const Shape shape{{static_cast<long long>(sh.heads), 2LL * sh.c, width}};
  FA_CHECK_CLOSE(what, g, w, t, shape);
}

TEST_CASE("step09 over NCCL: each rank's rows equal the one-process ring's and the local kernel's", "[nccl]") {
  const step09::NcclRing ring;
  const int R = ring.ranks(), me = ring.rank();
  INFO("rank " << me << " of " << R << " (chunks " << step09::chunks_of(me, R).early << ", "
                << step09::chunks_of(me, R).late << ")");
  for (int N : ring_sizes(R))
    for (int d : {64, 128})
      for (bool causal : {false, true}) {
        const Problem p = lowp(make(1, 3, N, d, causal), DType::bf16);
        INFO(p.str() << ", seeds 140, 141");
        const step09::RankShape sh(p, R);
        const Qkv in = inputs(p, 140);
        const std::vector<float> kv = sh.kv_rows(in, me);

        step09::RankForward x(sh, sh.rows(in.q, me, d), kv);
        step09::nccl_forward(ring, sh, x);
        FA_CUDA_CHECK(cudaStreamSynchronize(ring.compute()));
        ForwardOut got{std::vector<float>(p.elems()), std::vector<float>(p.rows())};
        step09::put_forward(sh, me, x, got);
        const ForwardOut one = step09::gpu_forward(p, in, R);
        const ForwardOut whole = gpu::forward(*step09::local_kernels(p).forward, p, in, true);
        check_rows("O vs the one-process ring", sh, me, d, got.o, one.o, tol::kBitExact);
        check_rows("L vs the one-process ring", sh, me, 1, got.lse, one.lse, tol::kBitExact);
        check_rows("O vs the local kernel", sh, me, d, got.o, whole.o, R == 1 ? tol::kBitExact : step06::kBf16Reorder);
        check_rows("L vs the local kernel", sh, me, 1, got.lse, whole.lse, R == 1 ? tol::kBitExact : tol::kFp32Reorder);

        // The backward on the one-process ring's O and L, so that all three see the same.
        const std::vector<float> dout = grad_out(p, 141);
        step09::RankBackward y(sh, sh.rows(in.q, me, d), kv, sh.rows(one.o, me, d), sh.rows(one.lse, me, 1),
                               sh.rows(dout, me, d));
        step09::nccl_backward(ring, sh, y);
        FA_CUDA_CHECK(cudaStreamSynchronize(ring.compute()));
        Grads g{std::vector<float>(p.elems()), std::vector<float>(p.elems()), std::vector<float>(p.elems())};
        step09::put_backward(sh, me, y, g);
        const Grads g1 = step09::gpu_backward(p, in, one, dout, R);
        const Grads gw = gpu::backward(*step09::local_kernels(p).backward, p, in, one, dout);
        const Tolerance& t = R == 1 ? tol::kBitExact : step06::kBf16Reorder;
        check_rows("dQ vs the one-process ring", sh, me, d, g.dq, g1.dq, step06::kBf16Reorder);
        check_rows("dK vs the one-process ring", sh, me, d, g.dk, g1.dk, tol::kBitExact);
        check_rows("dV vs the one-process ring", sh, me, d, g.dv, g1.dv, tol::kBitExact);
        check_rows("dQ vs the local kernel", sh, me, d, g.dq, gw.dq, step06::kBf16Reorder);
        check_rows("dK vs the local kernel", sh, me, d, g.dk, gw.dk, t);
        check_rows("dV vs the local kernel", sh, me, d, g.dv, gw.dv, t);
      }
}

}  // namespace
}  // namespace fa
