// Test runner for every step's executable. With `--gpu` (how CTest runs the
// "[gpu]" tests) it first checks for a usable CUDA device; without one it says
// why and exits 77, which CTest reports as "Not Run" — never as "Passed".
#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

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
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--gpu") == 0) gpu = true;
    else args.push_back(argv[i]);
  }
  if (gpu) {
    std::string why = "built without CUDA";
#ifdef FA_HAVE_CUDA
    if (fa::gpu::available(&why)) {
      std::cout << "GPU: " << fa::gpu::describe_device() << "\n";
      why.clear();
    }
#endif
    if (!why.empty()) {
      std::cout << "GPU tests NOT RUN: " << why << "\n";
      return 77;
    }
  }
  return Catch::Session().run(int(args.size()), args.data());
}
