#include "common/npy.hpp"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/problem.hpp"

namespace fa {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& why) { throw Error(path + ": " + why); }

// Value of `key` in the header dict {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }.
std::string dict_value(const std::string& header, const std::string& key, const std::string& path) {
  const auto k = header.find("'" + key + "'");
  if (k == std::string::npos) fail(path, "not a valid .npy file (header has no '" + key + "')");
  auto v = header.find(':', k);
  if (v == std::string::npos) fail(path, "not a valid .npy file (malformed header)");
  ++v;
  while (v < header.size() && header[v] == ' ') ++v;
  std::size_t end;
  if (header[v] == '(') {
    end = header.find(')', v);
    if (end == std::string::npos) fail(path, "not a valid .npy file (malformed shape)");
    ++end;
  } else {
    end = header.find_first_of(",}", v);
  }
  return header.substr(v, end - v);
}

}  // namespace

NpyArray read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, std::string("cannot open (") + std::strerror(errno) + ")");
  char magic[8] = {};
  f.read(magic, 8);
  if (!f || std::memcmp(magic, "\x93NUMPY", 6) != 0) fail(path, "not a .npy file (no \\x93NUMPY magic)");
  const int major = static_cast<unsigned char>(magic[6]);
  std::uint32_t hlen = 0;
  if (major == 1) {
    unsigned char b[2];
    f.read(reinterpret_cast<char*>(b), 2);
    hlen = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    f.read(reinterpret_cast<char*>(b), 4);
    hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (std::uint32_t(b[3]) << 24);
  } else {
    fail(path, "unsupported .npy format version " + std::to_string(major));
  }
  if (!f || hlen > (1u << 20)) fail(path, "not a valid .npy file (bad header length)");
  std::string header(hlen, '\0');
  f.read(header.data(), hlen);
  if (!f) fail(path, "not a valid .npy file (truncated header)");

  const std::string descr = dict_value(header, "descr", path);
  int bytes;
  if (descr == "'<f4'" || descr == "'=f4'") bytes = 4;
  else if (descr == "'<f8'" || descr == "'=f8'") bytes = 8;
  else fail(path, "dtype " + descr + " is not supported: save float32 or float64 (little-endian)");
  if (dict_value(header, "fortran_order", path) != "False")
    fail(path, "Fortran-ordered arrays are not supported: save np.ascontiguousarray(x)");

  NpyArray a;
  const std::string shp = dict_value(header, "shape", path);
  std::stringstream ss(shp.substr(1, shp.size() - 2));
  std::string tok;
  std::size_t count = 1;
  while (std::getline(ss, tok, ',')) {
    if (tok.find_first_not_of(' ') == std::string::npos) continue;
    long long dim = -1;
    try {
      dim = std::stoll(tok);
    } catch (...) {
      fail(path, "not a valid .npy file (shape " + shp + ")");
    }
    if (dim < 0) fail(path, "not a valid .npy file (shape " + shp + ")");
    a.shape.push_back(dim);
    count *= std::size_t(dim);
  }
  if (a.shape.empty() || a.shape.size() > 4)
    fail(path, "has " + std::to_string(a.shape.size()) + " dimensions; expected 1 to 4 (e.g. [N, d] or [B, H, N, d])");

  a.data.resize(count);
  if (bytes == 4) {
    f.read(reinterpret_cast<char*>(a.data.data()), std::streamsize(count * 4));
  } else {
    std::vector<double> tmp(count);
    f.read(reinterpret_cast<char*>(tmp.data()), std::streamsize(count * 8));
    for (std::size_t i = 0; i < count; ++i) a.data[i] = static_cast<float>(tmp[i]);
  }
  if (!f) fail(path, "truncated: the header promises " + std::to_string(count) + " elements");
  return a;
}

std::string npy_bytes(const std::vector<long long>& shape, const std::vector<float>& data) {
  std::string dims;
  for (auto s : shape) dims += std::to_string(s) + ", ";
  if (shape.size() > 1) dims.erase(dims.size() - 2);  // (3,) keeps its comma, (2, 3) does not
  else if (!dims.empty()) dims.pop_back();
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Pad with spaces so that magic + length + header + '\n' is a multiple of 64.
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(char(header.size() & 0xff));
  out.push_back(char(header.size() >> 8));
  out += header;
  out.append(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(float));
  return out;
}

void OutputFiles::add(const std::string& path, const std::vector<long long>& shape, const std::vector<float>& data) {
  items_.push_back({path, npy_bytes(shape, data)});
}

void OutputFiles::commit() {
  std::vector<std::string> temps;
  auto cleanup = [&] {
    for (auto& t : temps) std::remove(t.c_str());
  };
  for (auto& it : items_) {
    const std::string tmp = it.path + ".partial";
    temps.push_back(tmp);
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (f) f.write(it.bytes.data(), std::streamsize(it.bytes.size()));
    if (f) f.close();
    if (!f) {
      cleanup();
      throw Error(it.path + ": cannot write (" + std::strerror(errno) + "); no output file was written");
    }
  }
  for (std::size_t i = 0; i < items_.size(); ++i) {
    if (std::rename(temps[i].c_str(), items_[i].path.c_str()) != 0) {
      cleanup();
      throw Error(items_[i].path + ": cannot rename into place (" + std::strerror(errno) + ")");
    }
  }
  items_.clear();
}

}  // namespace fa
