// Test runner for every step's executable. With `--gpu` (how CTest runs the
// "[gpu]" tests) it first checks for a usable CUDA device; without one it says
// why and exits 77, which CTest reports as "Not Run" — never as "Passed".
// `--gpu-min-sm 80` (a step whose kernels need sm_80) does the same on an older GPU;
// with `--gpu-exact-sm` too (sm_90a code: step 07), on any GPU but that one.
#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#ifdef FA_HAVE_CUDA
#include "common/gpu.hpp"
#endif

int main(int argc, char** argv) {
  std::vector<char*> args;
  bool gpu = false;
  int min_sm = 0;
  bool exact_sm = false;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--gpu") == 0) gpu = true;
    else if (std::strcmp(argv[i], "--gpu-min-sm") == 0 && i + 1 < argc) min_sm = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--gpu-exact-sm") == 0) exact_sm = true;
    else args.push_back(argv[i]);
  }
  if (gpu) {
    std::string why = "built without CUDA";
#ifdef FA_HAVE_CUDA
    if (fa::gpu::available(&why)) {
      std::cout << "GPU: " << fa::gpu::describe_device() << "\n";
      why = fa::gpu::too_old(min_sm, exact_sm);
      try {  // which code path the kernels take: sm_80's too, on this GPU, in an 80-virtual build
        std::cout << "device code compiled for: sm_" << fa::gpu::device_code_arch() << "\n";
      } catch (const std::exception& e) {
        std::cout << "this build holds no device code for this GPU: " << e.what() << "\n";
        return 1;
      }
    }
#else
    (void)min_sm, (void)exact_sm;
#endif
    if (!why.empty()) {
      std::cout << "GPU tests NOT RUN: " << why << "\n";
      return 77;
    }
  }
  return Catch::Session().run(int(args.size()), args.data());
}
