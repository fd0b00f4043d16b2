// What the tests of the flashattn program share: a private working directory, the program
// run as a user runs it (exit status, stdout, stderr), and .npy files written for it.
// FA_FLASHATTN, the program's path, comes from the test target (tests/CMakeLists.txt).
#pragma once

#include <dirent.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/npy.hpp"

namespace fa::test {

/// A fresh directory under /tmp, made the working directory (CTest and the sanitizer
/// script may run several copies of a test program at once); its files, and it, go at exit.
struct PrivateDir {
  char path[48];
  bool ok;
  explicit PrivateDir(const char* prefix) {
    std::snprintf(path, sizeof path, "/tmp/%s_XXXXXX", prefix);
    ok = mkdtemp(path) != nullptr && chdir(path) == 0;
  }
  ~PrivateDir() {
    if (!ok) return;
    if (DIR* d = opendir(".")) {
      while (const dirent* e = readdir(d)) std::remove(e->d_name);  // (. and .. refuse)
      closedir(d);
    }
    if (chdir("/") == 0) rmdir(path);
  }
};

struct Result {
  int status;
  std::string out, err;
};

/// A file's bytes ("" if it cannot be read).
inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// Runs a shell command line, returning its exit status, its stdout and its stderr.
inline Result shell(const std::string& line) {
  const std::string cmd = "(" + line + ") >cli_out.txt 2>cli_err.txt";
  const int raw = std::system(cmd.c_str());
  return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, slurp("cli_out.txt"), slurp("cli_err.txt")};
}
/// Runs flashattn with `args`.
inline Result flashattn(const std::string& args) { return shell(std::string(FA_FLASHATTN) + " " + args); }

inline void save(const std::string& path, const std::vector<long long>& shape, const std::vector<float>& data) {
  OutputFiles f;
  f.add(path, shape, data);
  f.commit();
}
inline bool exists(const std::string& path) { return std::ifstream(path).good(); }
/// An index table as np.save writes np.int32 (or np.int64: `wide`) values.
inline void save_ints(const std::string& path, const std::vector<long long>& shape, const std::vector<long long>& v,
                      bool wide = false) {
  std::string data;
  for (long long x : v) {
    const std::int32_t narrow = std::int32_t(x);
    data.append(wide ? reinterpret_cast<const char*>(&x) : reinterpret_cast<const char*>(&narrow), wide ? 8 : 4);
  }
  write_file(path, npy_file(std::string("{'descr': '") + (wide ? "<i8" : "<i4") + "', 'fortran_order': False, " +
                                "'shape': " + shape_tuple(shape) + ", }",
                            data));
}

}  // namespace fa::test
