// NumPy .npy files in and out, so users bring Q, K, V from NumPy or PyTorch
// (np.save) and take O, L and gradients back (np.load).
//
// Reading follows NumPy's format (NEP 1, numpy/lib/format.py) exactly, or refuses:
// versions 1.0, 2.0 and 3.0; the header is a Python literal dict read by the same
// grammar as Python's (quotes, escapes, adjacent strings, comments, parentheses,
// int literals such as 1_0 or 0x10, a sign; a key given twice: the last wins) with
// NumPy's checks on it (exactly the keys 'descr', 'fortran_order', 'shape'; a tuple
// of ints; a bool; at most 10000 header bytes). Where NumPy would read a file
// differently from this reader, or not at all, the file is refused with one line
// naming it and what is wrong. Supported: float32 and float64, either byte order, C
// order, 1 to 4 dimensions (float64 is converted to float32, the steps' interface
// type); for index tables (a ragged batch's offsets, a paged cache's page table),
// int32 and int64. The header is read and checked against the file's real size before
// any memory is taken for the data.
//
// Writing is all-or-nothing (OutputFiles): float32, version 1.0, 64-byte aligned.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace fa {

/// What a .npy header says, once checked against the file.
struct NpyHeader {
  std::vector<long long> shape;  ///< each entry ≥ 0
  std::size_t count = 0;         ///< elements: the product of shape (checked for overflow)
  int itemsize = 4;              ///< 4 (float32, int32) or 8 (float64, int64)
  bool integer = false;          ///< '<i4' / '<i8': read only where integers are asked for
  bool big_endian = false;       ///< '>f4' / '>f8'
  int version = 1;               ///< the format's major version: 1, 2 or 3
  std::size_t data_offset = 0;   ///< where the data starts
};

struct NpyArray {
  std::vector<long long> shape;
  std::vector<float> data;
};

/// An index table: int32 or int64 values as they are.
struct NpyInts {
  std::vector<long long> shape;
  std::vector<long long> data;
};

/// Parses the header bytes of a .npy file (everything from the magic string on) as
/// NumPy would; throws fa::Error "<path>: …" on anything NumPy would not read the
/// same way. `file_size` is the file's real size: the data must fit in it. `integers`:
/// int32 or int64 expected, not floats.
NpyHeader parse_npy_header(const std::string& bytes, std::size_t file_size, const std::string& path,
                           bool integers = false);

/// Reads and checks one file's header only (a few hundred bytes, whatever the shape).
NpyHeader read_npy_header(const std::string& path);

/// Reads one .npy file; throws fa::Error naming the file and what is wrong
/// (missing, not a regular file: a FIFO or device is refused without waiting on it;
/// not a .npy, a header NumPy would read otherwise,
/// wrong dtype, Fortran order, truncated, trailing bytes).
NpyArray read_npy(const std::string& path);
/// Reads one .npy file of int32 or int64 (an index table), with read_npy's checks.
NpyInts read_npy_ints(const std::string& path);

/// A shape as the Python tuple a header holds: "(2, 3)", "(3,)", "()".
std::string shape_tuple(const std::vector<long long>& shape);

/// The bytes of a float32 .npy file (version 1.0 header, C order, 64-byte aligned).
std::string npy_bytes(const std::vector<long long>& shape, const std::vector<float>& data);

/// `s` as one printable line of at most `max` characters: control and non-ASCII
/// bytes as `\\xHH`, the rest cut with "..." — what error messages quote from a file.
std::string printable(const std::string& s, std::size_t max = 60);

/// Throws fa::Error unless every output path can be written without touching
/// anything else: no two outputs name the same file, no output names an input (by
/// device and inode, through links and "..", or by path for files yet to exist),
/// and every output is a regular file or does not exist yet, with one name only,
/// in a directory that exists and can be written. Symbolic links, directories,
/// devices and FIFOs are refused, not written through.
void check_output_paths(const std::vector<std::string>& outputs, const std::vector<std::string>& inputs);

/// Writes several output files all-or-nothing. Each goes first to a new temporary
/// beside its target (".flashattn.XXXXXX.new": short, so any name the file system allows
/// works as a target), written in full and flushed to disk. Only then are the targets
/// replaced, one by one, each keeping what it held (swapped with its temporary by
/// renameat2(RENAME_EXCHANGE), or copied aside where the file system cannot swap); if
/// one is refused (an append-only or immutable file, a sticky directory, ...) every
/// earlier one is put back and the error says so. An existing target keeps its
/// permission bits.
///
/// Concurrent commits into the same directory take turns: each holds an exclusive
/// flock on the directory of every target (a ".flashattn.lock" file in it where the file
/// system cannot lock a directory) from before the first write to the last rename, so
/// the outputs of one commit all come from it. Signals: while the temporaries are
/// written, SIGINT, SIGTERM, SIGHUP, SIGQUIT (and the other signals that end a process)
/// remove them before the process ends; while the targets are replaced they are blocked,
/// and delivered once every target holds the new data (or, after a refusal, the old).
/// SIGXFSZ is ignored so that a file-size limit fails the write with EFBIG. A SIGKILL or
/// a crash leaves every target whole, old or new; the hidden ".flashattn.XXXXXX.new" and
/// ".old" files it may leave beside them are removed by the next commit there.
///
/// Test hooks (environment): FA_TEST_COMMIT_PAUSE_MS pauses after each target is
/// replaced; FA_TEST_COMMIT_COPY=1 takes the copy path of file systems that cannot swap.
class OutputFiles {
 public:
  void add(const std::string& path, const std::vector<long long>& shape, const std::vector<float>& data);
  /// Throws fa::Error; afterwards, all targets hold the new data or none changed.
  /// `inputs` are the files read, which no output may replace.
  void commit(const std::vector<std::string>& inputs = {});

 private:
  struct Item {
    std::string path;
    std::string bytes;
  };
  std::vector<Item> items_;
};

}  // namespace fa
