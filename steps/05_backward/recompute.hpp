// The one piece of arithmetic the backward adds, shared by the CPU model and the
// kernels: from a score s, a dP value, the row's L and D,
//   P = e^(s − L) (0 where masked), dS = P·(dP − D).
#pragma once

#include "common/hd.hpp"
#include "steps/03_online_softmax/online_softmax.hpp"

namespace fa::step05 {

struct PdS {
  float p, ds;
};
FA_HD PdS rebuild(float s, float dp, float L, float D) {
  const float p = online::prob(s, L);  // masked s = −∞ gives 0
  return {p, p * (dp - D)};
}

}  // namespace fa::step05
