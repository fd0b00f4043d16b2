// NumPy .npy files in and out, so users bring Q, K, V from NumPy or PyTorch
// (np.save) and take O, L and gradients back (np.load).
//
// Reads float32 or float64 ('<f4', '<f8'), C order, 1 to 4 dimensions (float64 is
// converted to float32, the steps' interface type). Writes float32 only.
#pragma once

#include <string>
#include <vector>

namespace fa {

struct NpyArray {
  std::vector<long long> shape;
  std::vector<float> data;
};

/// Reads one .npy file; throws fa::Error naming the file and what is wrong
/// (missing, unreadable, not a .npy, wrong dtype, Fortran order, truncated).
NpyArray read_npy(const std::string& path);

/// The bytes of a float32 .npy file (version 1.0 header, C order).
std::string npy_bytes(const std::vector<long long>& shape, const std::vector<float>& data);

/// Writes several output files all-or-nothing: each goes to a temporary file
/// beside its target first; only when every one was written completely are they
/// renamed into place. On any failure the temporaries are removed and no target
/// file is created or changed.
class OutputFiles {
 public:
  void add(const std::string& path, const std::vector<long long>& shape, const std::vector<float>& data);
  void commit();  ///< throws fa::Error; afterwards, all targets exist or none changed
 private:
  struct Item {
    std::string path;
    std::string bytes;
  };
  std::vector<Item> items_;
};

}  // namespace fa
