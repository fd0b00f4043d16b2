// What the command-line programs share: comma-separated lists of numbers and words.
#pragma once

#include <sstream>
#include <string>
#include <vector>

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

}  // namespace fa::cli
