// What the command-line programs share: comma-separated lists of numbers and words,
// and flashattn's option parser.
#pragma once

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/npy.hpp"      // printable
#include "common/problem.hpp"  // Error

namespace fa::cli {

/// "1024,2048" → {1024, 2048}.
inline std::vector<int> ints(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');) v.push_back(std::stoi(t));
  return v;
}
/// "fwd,bwd" → {"fwd", "bwd"}.
inline std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');) v.push_back(t);
  return v;
}

/// Options as parsed: `--name value` pairs and flags without a value.
struct Args {
  std::map<std::string, std::string> kv;
  std::set<std::string> flags;
  bool causal = false;  ///< --causal, which every command takes
  bool has(const std::string& flag) const { return flags.count(flag) > 0; }
};

/// argv[first..] as options: each in `with_value` takes the next argument as its value,
/// each in `flags` takes none. Throws fa::Error (one line) on an unknown option, a
/// missing value, a value that is itself an option (`--out --causal`: a forgotten
/// value, not a file named "--causal"; write ./--causal for that) and an option given
/// twice (which of the two was meant is not for the program to guess).
inline Args parse(int argc, char** argv, int first, const std::vector<std::string>& with_value,
                  const std::vector<std::string>& flags = {"--causal"}) {
  auto in = [](const std::vector<std::string>& v, const std::string& x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  Args a;
  for (int i = first; i < argc; ++i) {
    const std::string k = argv[i];
    if (in(flags, k)) {
      if (!a.flags.insert(k).second) throw Error("option " + k + " is given twice");
      continue;
    }
    if (!in(with_value, k)) throw Error("unknown option '" + printable(k, 40) + "' (see flashattn --help)");
    if (i + 1 >= argc) throw Error("option " + k + " needs a value");
    const std::string v = argv[++i];
    if (v.rfind("--", 0) == 0)
      throw Error("option " + k + " needs a value, not the option '" + printable(v, 40) + "' (for a file of that name, write ./" +
                  printable(v, 40) + ")");
    if (!a.kv.emplace(k, v).second)
      throw Error("option " + k + " is given twice ('" + printable(a.kv.at(k), 40) + "' and '" + printable(v, 40) + "')");
  }
  a.causal = a.has("--causal");
  return a;
}

}  // namespace fa::cli
