// The .npy reader and writer against the whole class of files a careful user or a
// careless script produces: what NumPy reads (and how), what it refuses, every
// truncation, and outputs that collide with each other, with inputs, with
// directories, devices and links, or that fail half-way. CI runs these under
// AddressSanitizer and UndefinedBehaviorSanitizer (FA_SANITIZE).
#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/npy.hpp"
#include "tests/check.hpp"

using namespace fa;

namespace {

std::string floats(std::initializer_list<float> xs) {
  std::string s;
  for (float x : xs) s.append(reinterpret_cast<const char*>(&x), 4);
  return s;
}
std::string dict(const std::string& descr, const std::string& shape, const std::string& fortran = "False") {
  return "{'descr': " + descr + ", 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
}

NpyHeader parse(const std::string& bytes) { return parse_npy_header(bytes, bytes.size(), "x.npy"); }
std::string refusal(const std::string& bytes) {
  return test::error_of([&] { parse(bytes); });
}

// Each test runs in a private directory (several copies may run at once).
struct PrivateDir {
  char path[32] = "/tmp/fa_npy_XXXXXX";
  bool ok = mkdtemp(path) != nullptr && chdir(path) == 0;
  ~PrivateDir() {
    if (ok && chdir("/") == 0) rmdir(path);  // empty unless a test failed: then kept to look at
  }
} kDir;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
bool exists(const std::string& path) {
  struct stat st{};
  return ::lstat(path.c_str(), &st) == 0;
}
/// Names in the current directory that start with `prefix` (temporaries left behind).
int count_prefixed(const std::string& prefix) {
  int n = 0;
  DIR* d = opendir(".");
  while (dirent* e = readdir(d))
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) ++n;
  closedir(d);
  return n;
}

}  // namespace

TEST_CASE("npy: headers NumPy writes, and the variants it reads the same way", "[cpu]") {
  REQUIRE(kDir.ok);
  const std::string d6 = floats({1, 2, 3, 4, 5, 6});
  struct Ok {
    std::string header;
    std::vector<long long> shape;
  };
  const Ok cases[] = {
      {dict("'<f4'", "(2, 3)"), {2, 3}},
      {"{'descr': '<f4', 'fortran_order': False , 'shape': (2, 3) }", {2, 3}},  // a space before the comma
      {dict("'<f4'", "((2, 3))"), {2, 3}},                                        // a parenthesised shape
      {dict("'<f4'", "((2), (3),)"), {2, 3}},
      {"{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (6,)}", {6}},    // double quotes
      {"{'shape': (2, 3), 'descr': '<f4', 'fortran_order': False}", {2, 3}},      // any key order
      {dict("'<' 'f4'", "(2, 3)"), {2, 3}},                                       // adjacent strings join
      {dict("'\\x3cf4'", "(2, 3)"), {2, 3}},                                      // escapes
      {dict("'\\74f4'", "(2, 3)"), {2, 3}},
      {dict("u'<f4'", "(2, 3)"), {2, 3}},
      {dict("r'<f4'", "(2, 3)"), {2, 3}},
      {dict("'''<f4'''", "(2, 3)"), {2, 3}},
      {dict("'<f4'", "(0x2, 0o3)"), {2, 3}},
      {dict("'<f4'", "(0b10, +3)"), {2, 3}},
      {dict("'<f4'", "(2, 3)") + "  # a comment\n", {2, 3}},
      {"{'descr': '<f4', # why not\n 'fortran_order':\n False, 'shape': (2,\n 3)}", {2, 3}},
      {"{'descr': '<f4', 'fortran_order': False, \\\n'shape': (2, 3)}", {2, 3}},  // a line continuation
      {"\t {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", {2, 3}},    // leading blanks
      {"{'descr': '<f8', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", {2, 3}},  // the last wins
      {dict("'=f4'", "(6,)"), {6}},
      {dict("'f4'", "(1, 1, 2, 3)"), {1, 1, 2, 3}},
  };
  for (const Ok& c : cases) {
    INFO(c.header);
    const std::string file = test::npy_file(c.header, d6);
    const NpyHeader h = parse(file);
    CHECK(h.shape == c.shape);
    CHECK(h.itemsize == 4);
    test::write_file("ok.npy", file);
    const NpyArray a = read_npy("ok.npy");
    CHECK(a.data == std::vector<float>{1, 2, 3, 4, 5, 6});
  }
  // 1_0 is ten, as in Python (not 1, as a prefix reader makes it).
  CHECK(parse(test::npy_file(dict("'<f4'", "(1_0,)"), std::string(40, '\0'))).shape == std::vector<long long>{10});
  // Versions 2.0 and 3.0 (UTF-8, here with a comment in it), and the old 16-byte alignment.
  CHECK(parse(test::npy_file(dict("'<f4'", "(2, 3)"), d6, 2)).version == 2);
  CHECK(parse(test::npy_file(dict("'<f4'", "(2, 3)") + " # \xc3\xa9t\xc3\xa9", d6, 3)).version == 3);
  CHECK(parse(test::npy_file(dict("'<f4'", "(2, 3)"), d6, 1, 16)).shape == std::vector<long long>{2, 3});
  // Zero-size arrays are valid files (the CLI refuses N = 0 itself).
  CHECK(parse(test::npy_file(dict("'<f4'", "(0, 4)"))).count == 0);
}

TEST_CASE("npy: float64 and big-endian data are read exactly", "[cpu]") {
  REQUIRE(kDir.ok);
  const double vals[3] = {1.5, -2.25, 1e-3};
  std::string le8(reinterpret_cast<const char*>(vals), sizeof vals), be8, be4;
  for (int e = 0; e < 3; ++e)
    for (int b = 7; b >= 0; --b) be8.push_back(le8[std::size_t(8 * e + b)]);
  const std::string le4 = floats({1.5f, -2.25f, 3e38f});
  for (int e = 0; e < 3; ++e)
    for (int b = 3; b >= 0; --b) be4.push_back(le4[std::size_t(4 * e + b)]);
  test::write_file("le8.npy", test::npy_file(dict("'<f8'", "(3,)"), le8));
  test::write_file("be8.npy", test::npy_file(dict("'>f8'", "(3,)"), be8));
  test::write_file("be4.npy", test::npy_file(dict("'>f4'", "(3,)"), be4));
  const std::vector<float> want8 = {1.5f, -2.25f, float(1e-3)};
  CHECK(read_npy("le8.npy").data == want8);
  CHECK(read_npy("be8.npy").data == want8);
  CHECK(read_npy("be4.npy").data == std::vector<float>{1.5f, -2.25f, 3e38f});
  for (const char* f : {"le8.npy", "be8.npy", "be4.npy", "ok.npy"}) std::remove(f);
}

TEST_CASE("npy: index tables are int32 or int64, either byte order; floats there are refused", "[cpu]") {
  REQUIRE(kDir.ok);
  const std::int64_t v8[3] = {0, -7, 5000000000LL};
  const std::int32_t v4[3] = {0, -7, 2147483647};
  std::string le8(reinterpret_cast<const char*>(v8), sizeof v8), le4(reinterpret_cast<const char*>(v4), sizeof v4), be8;
  for (int e = 0; e < 3; ++e)
    for (int b = 7; b >= 0; --b) be8.push_back(le8[std::size_t(8 * e + b)]);
  test::write_file("i8.npy", test::npy_file(dict("'<i8'", "(3,)"), le8));
  test::write_file("bi8.npy", test::npy_file(dict("'>i8'", "(3,)"), be8));
  test::write_file("i4.npy", test::npy_file(dict("'<i4'", "(1, 3)"), le4));
  test::write_file("f4.npy", test::npy_file(dict("'<f4'", "(3,)"), floats({0, 1, 2})));
  test::write_file("u4.npy", test::npy_file(dict("'<u4'", "(3,)"), le4));
  CHECK(read_npy_ints("i8.npy").data == std::vector<long long>{0, -7, 5000000000LL});
  CHECK(read_npy_ints("bi8.npy").data == std::vector<long long>{0, -7, 5000000000LL});
  CHECK(read_npy_ints("i4.npy").data == std::vector<long long>{0, -7, 2147483647});
  CHECK(read_npy_ints("i4.npy").shape == std::vector<long long>{1, 3});
  CHECK(test::contains(test::error_of([] { read_npy_ints("f4.npy"); }), "indices must be integers"));
  CHECK(test::contains(test::error_of([] { read_npy_ints("u4.npy"); }), "save the indices as int32 or int64"));
  CHECK(test::contains(test::error_of([] { read_npy("i4.npy"); }), "dtype '<i4' is not supported"));
  for (const char* f : {"i8.npy", "bi8.npy", "i4.npy", "f4.npy", "u4.npy"}) std::remove(f);
}

TEST_CASE("npy: what NumPy refuses or would read otherwise is refused, in one line", "[cpu]") {
  const std::string d6 = floats({1, 2, 3, 4, 5, 6});
  struct Bad {
    std::string file;
    const char* says;
  };
  const std::string ctrl = "'<f4\x01\x1b[31m'";
  const Bad cases[] = {
      // shapes
      {test::npy_file(dict("'<f4'", "(1.5, 4)"), d6), "is a float, not an integer"},
      {test::npy_file(dict("'<f4'", "(1e3,)"), d6), "is a float"},
      {test::npy_file(dict("'<f4'", "(2j,)"), d6), "is a float"},
      {test::npy_file(dict("'<f4'", "(1_, 6)"), d6), "not an integer literal"},
      {test::npy_file(dict("'<f4'", "(1__0, 6)"), d6), "not an integer literal"},
      {test::npy_file(dict("'<f4'", "(0x, 6)"), d6), "not an integer literal"},
      {test::npy_file(dict("'<f4'", "(0b12, 6)"), d6), "not an integer literal"},
      {test::npy_file(dict("'<f4'", "(06,)"), d6), "leading zeros"},
      {test::npy_file(dict("'<f4'", "(-1, 6)"), d6), "is negative"},
      {test::npy_file(dict("'<f4'", "(--2, 3)"), d6), "two signs"},
      {test::npy_file(dict("'<f4'", "(True, 6)"), d6), "is a bool"},
      {test::npy_file(dict("'<f4'", "(None, 6)"), d6), "is None"},
      {test::npy_file(dict("'<f4'", "('6',)"), d6), "is a string"},
      {test::npy_file(dict("'<f4'", "(9223372036854775808,)"), d6), "too large"},
      {test::npy_file(dict("'<f4'", "(99999999999999999999999999,)"), d6), "too large"},
      {test::npy_file(dict("'<f4'", "(4611686018427387905, 2, 17, 8)"), std::string(272 * 4, '\0')), "overflows 64 bits"},
      {test::npy_file(dict("'<f4'", "(2305843009213693952, 2)"), d6), "overflows 64 bits"},
      {test::npy_file(dict("'<f4'", "(2,,3)"), d6), "unexpected character"},
      {test::npy_file(dict("'<f4'", "(,2)"), d6), "unexpected character"},
      {test::npy_file(dict("'<f4'", "[2, 3]"), d6), "'shape' is a list"},
      {test::npy_file(dict("'<f4'", "6"), d6), "'shape' is an integer"},
      {test::npy_file(dict("'<f4'", "(6)"), d6), "'shape' is an integer"},
      {test::npy_file(dict("'<f4'", "()"), floats({1})), "has 0 dimensions"},
      {test::npy_file(dict("'<f4'", "(1, 1, 1, 1, 6)"), d6), "has 5 dimensions"},
      {test::npy_file(dict("'<f4'", "(2 3)"), d6), "expected ','"},
      {test::npy_file(dict("'<f4'", "(2, 3"), d6), "unexpected character"},
      {test::npy_file(dict("'<f4'", "((((((((((((((((((((((((((((((((((6))))))))))))))))))))))))))))))))))"), d6), "nested"},
      // keys and the dict
      {test::npy_file("{'descr': '<f4', 'shape': (6,)}", d6), "the header's keys are {'descr', 'shape'}"},
      {test::npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'extra': 1}", d6), "'extra'"},
      {test::npy_file("{'descr', 'fortran_order', 'shape'}", d6), "expected ':'"},
      {test::npy_file("{1: '<f4', 'fortran_order': False, 'shape': (6,)}", d6), "not a string"},
      {test::npy_file("['descr', '<f4']", d6), "does not start with '{'"},
      {test::npy_file("\n{'descr': '<f4', 'fortran_order': False, 'shape': (6,)}", d6), "does not start with '{'"},
      {test::npy_file(dict("'<f4'", "(6,)") + " x", d6), "unexpected text after the dict"},
      {test::npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (6,)", d6), "expected ',' or '}'"},
      {test::npy_file(dict("'<f4'", "(6,)", "0"), d6), "True or False"},
      {test::npy_file(dict("'<f4'", "(6,)", "false"), d6), "is not a literal"},
      {test::npy_file(dict("'<f4'", "(2, 3)", "True"), d6), "Fortran"},
      // descr
      {test::npy_file(dict("'<i4'", "(6,)"), d6), "dtype '<i4' is not supported"},
      {test::npy_file(dict("'<f2'", "(6,)"), d6), "dtype '<f2' is not supported"},
      {test::npy_file(dict("'|b1'", "(6,)"), d6), "is not supported"},
      {test::npy_file(dict("'float32'", "(6,)"), d6), "is not supported"},
      {test::npy_file(dict("[('a', '<f4')]", "(6,)"), d6), "structured dtype"},
      {test::npy_file(dict("b'<f4'", "(6,)"), d6), "'descr' is bytes"},
      {test::npy_file(dict("f'<f4'", "(6,)"), d6), "an f-string"},
      {test::npy_file(dict("'<f4\n'", "(6,)"), d6), "a line break inside a string"},
      {test::npy_file(dict("'\\N{LESS-THAN SIGN}f4'", "(6,)"), d6), "\\N{...}"},
      {test::npy_file(dict("'\\x3'", "(6,)"), d6), "truncated \\x escape"},
      {test::npy_file(dict(ctrl, "(6,)"), d6), "is not supported"},
      // the format
      {std::string("\x93NUMPY\x01\x01", 8) + test::npy_file(dict("'<f4'", "(6,)"), d6).substr(8), "format version 1.1"},
      {std::string("\x93NUMPY\x04\x00", 8) + test::npy_file(dict("'<f4'", "(6,)"), d6).substr(8), "format version 4.0"},
      {test::npy_file(dict("'<f4'", "(6,)") + std::string(10001, ' '), d6), "NumPy refuses headers over 10000"},
      {test::npy_file(dict("'<f4'", "(6,)") + std::string(10001, ' '), d6, 2), "NumPy refuses headers over 10000"},
      {test::npy_file(dict("'<f4'", "(6,)") + std::string("\0", 1), d6), "NUL"},
      {test::npy_file(dict("'<f4'", "(6,)") + " # \xff", d6, 3), "not valid UTF-8"},
      {test::npy_file(dict("'<f4'", "(6,)") + " \xc3\xa9", d6, 1), "unexpected text after the dict"},
      {test::npy_file(dict("'<f4'", "(6,)"), d6 + "xx"), "past the data"},
      {test::npy_file(dict("'<f4'", "(1, 1, 32768, 16384)"), d6), "truncated"},
      {"PK\x03\x04 a zip file", "not a .npy file"},
      {"", "is empty"},
  };
  for (const Bad& c : cases) {
    INFO(printable(c.file, 200));
    const std::string e = refusal(c.file);
    INFO(e);
    CHECK(test::contains(e, c.says));
    CHECK(e.rfind("x.npy: ", 0) == 0);  // names the file first
    // One printable line of bounded length, whatever the header holds.
    CHECK(e.size() < 400);
    for (unsigned char ch : e) CHECK((ch >= 0x20 || ch == '\t'));
  }
  // A 5000-character descr is quoted in a few dozen characters.
  const std::string e = refusal(test::npy_file(dict("'" + std::string(5000, 'x') + "'", "(6,)"), d6));
  CHECK(test::contains(e, "is not supported"));
  CHECK(e.size() < 300);
}

TEST_CASE("npy: every truncation of a valid file is refused", "[cpu]") {
  REQUIRE(kDir.ok);
  for (int major : {1, 2, 3}) {
    const std::string file = test::npy_file(dict("'<f8'", "(2, 3)"), std::string(48, '\x01'), major);
    for (std::size_t len = 0; len < file.size(); ++len) {
      INFO("version " << major << ", " << len << " of " << file.size() << " bytes");
      const std::string e = refusal(file.substr(0, len));
      CHECK((test::contains(e, "truncated") || test::contains(e, "is empty") ||
             test::contains(e, "not a header NumPy would read")));
      // The same through the file reader, which reads no more than the header announces.
      test::write_file("cut.npy", file.substr(0, len));
      CHECK(test::error_of([] { read_npy("cut.npy"); }) == std::string("cut.npy") + e.substr(5));
    }
  }
  std::remove("cut.npy");
}

TEST_CASE("npy: a rejected file costs memory by its real size, not its claim", "[cpu]") {
  REQUIRE(kDir.ok);
  // 4 TiB claimed in a 192-byte file: refused before anything is allocated (under
  // ASan an allocation of that size would abort, not throw).
  test::write_file("huge.npy", test::npy_file(dict("'<f4'", "(1024, 1024, 1024, 1024)"), std::string(64, '\0')));
  CHECK(test::contains(test::error_of([] { read_npy("huge.npy"); }), "truncated: the header promises 1099511627776"));
  CHECK(test::contains(test::error_of([] { read_npy_header("huge.npy"); }), "truncated"));
  // Not a regular file: a directory, a device.
  CHECK(test::contains(test::error_of([] { read_npy("."); }), "is a directory"));
  CHECK(test::contains(test::error_of([] { read_npy("/dev/zero"); }), "not a regular file"));
  CHECK(test::contains(test::error_of([] { read_npy("missing.npy"); }), "cannot open (No such file or directory)"));
  std::remove("huge.npy");
}

TEST_CASE("npy: outputs never replace an input, each other, a link, a directory or a device", "[cpu]") {
  REQUIRE(kDir.ok);
  test::write_file("in.npy", test::npy_file(dict("'<f4'", "(1,)"), floats({1})));
  ::mkdir("sub", 0755);
  test::write_file("file", "x");
  test::write_file("other.npy", "x");
  REQUIRE(::symlink("other.npy", "link.npy") == 0);
  REQUIRE(::symlink("nowhere", "dangling.npy") == 0);
  REQUIRE(::link("other.npy", "hard.npy") == 0);
  REQUIRE(::symlink("in.npy", "in_link.npy") == 0);
  struct Bad {
    std::vector<std::string> outputs;
    const char* says;
  };
  const Bad cases[] = {
      {{"o.npy", "o.npy"}, "named for two outputs"},
      {{"o.npy", "./o.npy"}, "named for two outputs"},
      {{"o.npy", "sub/../o.npy"}, "named for two outputs"},
      {{"in.npy"}, "is an input"},
      {{"./sub/../in.npy"}, "is an input"},
      {{"in_link.npy"}, "is an input"},  // a link to an input is the input
      {{"link.npy"}, "symbolic link"},
      {{"dangling.npy"}, "symbolic link"},
      {{"hard.npy"}, "hard links"},
      {{"sub"}, "is a directory"},
      {{"sub/"}, "names a directory"},
      {{"/dev/null"}, "not a regular file"},
      {{"missing_dir/o.npy"}, "No such file or directory"},
      {{"file/o.npy"}, "is not a directory"},
      {{""}, "empty"},
  };
  for (const Bad& c : cases) {
    INFO(c.outputs[0]);
    OutputFiles f;
    for (const auto& o : c.outputs) f.add(o, {1}, {2.0f});
    const std::string e = test::error_of([&] { f.commit({"in.npy"}); });
    INFO(e);
    CHECK(test::contains(e, c.says));
    CHECK(!exists("o.npy"));
  }
  // Nothing was touched: the input, the links, the device.
  CHECK(read_npy("in.npy").data == std::vector<float>{1});
  struct stat st{};
  REQUIRE(::lstat("link.npy", &st) == 0);
  CHECK(S_ISLNK(st.st_mode));
  REQUIRE(::stat("/dev/null", &st) == 0);
  CHECK(S_ISCHR(st.st_mode));
  CHECK(count_prefixed(".") == 2);  // "." and "..": no temporaries
  for (const char* f : {"in.npy", "other.npy", "link.npy", "in_link.npy", "dangling.npy", "hard.npy", "file"})
    std::remove(f);
  ::rmdir("sub");
}

TEST_CASE("npy: a commit writes all or nothing, with the real reason, and leaves no temporaries", "[cpu]") {
  REQUIRE(kDir.ok);
  SECTION("one good target and one impossible one: neither is written") {
    test::write_file("keep.npy", "precious");
    OutputFiles f;
    f.add("keep.npy", {2}, {1.0f, 2.0f});
    f.add("no_such_directory/bad.npy", {2}, {1.0f, 2.0f});
    const std::string e = test::error_of([&] { f.commit(); });
    CHECK(test::contains(e, "No such file or directory"));
    CHECK(slurp("keep.npy") == "precious");
    CHECK(count_prefixed(".flashattn.") == 0);
    std::remove("keep.npy");
  }
  SECTION("a user's own O.npy.partial is neither used nor removed; modes are kept") {
    test::write_file("O.npy.partial", "mine");
    test::write_file("O.npy", "old");
    ::chmod("O.npy", 0640);
    OutputFiles f;
    f.add("O.npy", {3}, {1.0f, 2.0f, 3.0f});
    f.commit();
    CHECK(slurp("O.npy.partial") == "mine");
    CHECK(read_npy("O.npy").data == std::vector<float>{1, 2, 3});
    struct stat st{};
    REQUIRE(::stat("O.npy", &st) == 0);
    CHECK((st.st_mode & 0777) == 0640);
    CHECK(count_prefixed(".flashattn.") == 0);
    std::remove("O.npy.partial");
    std::remove("O.npy");
  }
  SECTION("a write that fails half-way (a file-size limit): EFBIG, reported, nothing left") {
    test::write_file("big.npy", "old");
    const pid_t pid = fork();
    if (pid == 0) {  // the child: a 4 kB limit, a 400 kB output
      rlimit lim{4096, 4096};
      setrlimit(RLIMIT_FSIZE, &lim);
      OutputFiles f;
      f.add("big.npy", {100000}, std::vector<float>(100000, 1.0f));
      const std::string e = test::error_of([&] { f.commit(); });
      _exit(test::contains(e, "File too large") && test::contains(e, "no output file was written") ? 0 : 1);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(slurp("big.npy") == "old");
    CHECK(count_prefixed(".flashattn.") == 0);
    std::remove("big.npy");
  }
  SECTION("killed while writing: the temporaries go with the process") {
    // The child's handler runs on SIGTERM raised by the child itself, mid-commit:
    // a FIFO in the target's directory would block it; a signal from a file-size
    // limit would not (SIGXFSZ is ignored); so the write is made slow instead by
    // committing a large file and signalling as soon as its temporary appears.
    const pid_t pid = fork();
    if (pid == 0) {
      OutputFiles f;
      f.add("slow.npy", {1 << 24}, std::vector<float>(std::size_t(1) << 24, 1.0f));  // 64 MiB
      f.commit();
      _exit(3);
    }
    bool seen = false;
    for (int k = 0; k < 20000 && !seen; ++k) {
      seen = count_prefixed(".flashattn.") > 0;
      if (!seen) usleep(100);
    }
    kill(pid, SIGTERM);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    if (seen && WIFSIGNALED(status)) {
      CHECK(WTERMSIG(status) == SIGTERM);
      CHECK(count_prefixed(".flashattn.") == 0);
      CHECK(!exists("slow.npy"));
    } else {
      WARN("the commit finished before the signal: nothing to check");
      std::remove("slow.npy");
    }
  }
}

// ---- inputs that are not files, long names, and the commit under signals and races ------

namespace {

/// Waits up to `seconds` for child `pid`; kills it and returns -1 if it is still running.
int wait_for(pid_t pid, double seconds) {
  for (int k = 0; k < int(seconds * 1000); ++k) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    usleep(1000);
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  return -1;
}

/// In a forked child: the default disposition for the signals the tests send (Catch
/// catches some of them to report a crash), no core files.
void plain_child() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) ::signal(sig, SIG_DFL);
  rlimit none{0, 0};
  setrlimit(RLIMIT_CORE, &none);
}

/// The first float of an .npy file this program wrote, or NaN if it is not one (yet).
float first_value(const std::string& path) {
  const std::string s = slurp(path);
  if (s.size() < 132 || s.compare(0, 6, "\x93NUMPY") != 0) return std::nanf("");
  float x;
  std::memcpy(&x, s.data() + 128, 4);
  return x;
}

/// Waits (up to 20 s) until `path` holds an .npy file whose first value is `x`.
bool wait_until_value(const std::string& path, float x) {
  for (int k = 0; k < 20000; ++k) {
    if (first_value(path) == x) return true;
    usleep(1000);
  }
  return false;
}

/// Commits O.npy and L.npy, each 64 floats of `x`, with the test hooks given.
void commit_pair(float x, const char* pause_ms, bool copy) {
  if (pause_ms) setenv("FA_TEST_COMMIT_PAUSE_MS", pause_ms, 1);
  if (copy) setenv("FA_TEST_COMMIT_COPY", "1", 1);
  OutputFiles f;
  f.add("O.npy", {64}, std::vector<float>(64, x));
  f.add("L.npy", {64}, std::vector<float>(64, x));
  f.commit();
}

}  // namespace

TEST_CASE("npy: a FIFO, a directory or a device as an input is refused at once, never waited on", "[cpu]") {
  REQUIRE(kDir.ok);
  REQUIRE(::mkfifo("fifo.npy", 0644) == 0);
  // In a child: if opening the FIFO waited for a writer, the child would hang (and be killed).
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string a = test::error_of([] { read_npy_header("fifo.npy"); });
    const std::string b = test::error_of([] { read_npy("fifo.npy"); });
    _exit(test::contains(a, "fifo.npy: is a FIFO") && test::contains(b, "is a FIFO") ? 0 : 1);
  }
  const int status = wait_for(pid, 10);
  INFO("the reader waited on the FIFO (status -1) or did not refuse it");
  CHECK(status != -1);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK(test::contains(test::error_of([] { read_npy_header("/dev/null"); }), "not a regular file (a device"));
  CHECK(test::contains(test::error_of([] { read_npy_header("."); }), "is a directory"));
  std::remove("fifo.npy");
}

TEST_CASE("npy: output names as long as the file system allows (250 and 255 characters)", "[cpu]") {
  REQUIRE(kDir.ok);
  for (std::size_t length : {250, 255}) {
    const std::string name = std::string(length - 4, 'n') + ".npy";
    INFO("a name of " << name.size() << " characters");
    OutputFiles f;
    f.add(name, {2}, {1.0f, 2.0f});
    f.add("short.npy", {1}, {3.0f});
    CHECK(test::error_of([&] { f.commit(); }).empty());
    CHECK(read_npy(name).data == std::vector<float>{1, 2});
    std::remove(name.c_str());
    std::remove("short.npy");
  }
  CHECK(count_prefixed(".") == 2);  // "." and "..": no temporaries
}

TEST_CASE("npy: a signal during the commit is held until every target is whole", "[cpu]") {
  REQUIRE(kDir.ok);
  for (bool copy : {false, true})
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) {
      INFO("signal " << sig << (copy ? ", the copy path" : ", swaps"));
      test::write_file("O.npy", "old O");
      test::write_file("L.npy", "old L");
      const pid_t pid = fork();
      if (pid == 0) {
        plain_child();
        commit_pair(7, "300", copy);  // 300 ms after each target: the signal lands between O and L
        _exit(0);
      }
      // O is replaced, L not yet: the signal now.
      const bool replaced = wait_until_value("O.npy", 7);
      CHECK(replaced);
      kill(pid, sig);
      const int status = wait_for(pid, 20);
      CHECK((status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == sig));  // delivered after the commit
      CHECK(first_value("O.npy") == 7);
      CHECK(first_value("L.npy") == 7);
      CHECK(count_prefixed(".flashattn.") == 0);
      std::remove("O.npy");
      std::remove("L.npy");
    }
}

TEST_CASE("npy: SIGKILL during the commit leaves whole files; the next commit there removes its leftovers", "[cpu]") {
  REQUIRE(kDir.ok);
  for (bool copy : {false, true}) {
    INFO((copy ? "the copy path" : "swaps"));
    test::write_file("O.npy", "old O");
    test::write_file("L.npy", "old L");
    const pid_t pid = fork();
    if (pid == 0) {
      plain_child();
      commit_pair(5, "2000", copy);
      _exit(0);
    }
    CHECK(wait_until_value("O.npy", 5));
    kill(pid, SIGKILL);
    const int status = wait_for(pid, 20);
    CHECK((status != -1 && WIFSIGNALED(status)));
    CHECK(first_value("O.npy") == 5);  // new and whole
    CHECK(slurp("L.npy") == "old L");  // old and whole
    CHECK(count_prefixed(".flashattn.") >= 1);  // hidden, named as this program's own
    CHECK(count_prefixed(".flashattn.lock") == 0);
    OutputFiles f;
    f.add("other.npy", {1}, {1.0f});
    f.commit();
    CHECK(count_prefixed(".flashattn.") == 0);
    for (const char* p : {"O.npy", "L.npy", "other.npy"}) std::remove(p);
  }
}

TEST_CASE("npy: two commits to the same outputs take turns: O and L always come from one", "[cpu]") {
  REQUIRE(kDir.ok);
  // Forced: B starts while A pauses between O and L. Without the lock B would write
  // both in that pause and A's L would land last: O from B, L from A.
  for (bool copy : {false, true}) {
    INFO((copy ? "the copy path" : "swaps"));
    const pid_t a = fork();
    if (a == 0) {
      plain_child();
      commit_pair(1, "500", copy);
      _exit(0);
    }
    CHECK(wait_until_value("O.npy", 1));
    const pid_t b = fork();
    if (b == 0) {
      plain_child();
      commit_pair(2, nullptr, copy);
      _exit(0);
    }
    const int sa = wait_for(a, 20), sb = wait_for(b, 20);
    CHECK((sa != -1 && WIFEXITED(sa) && WEXITSTATUS(sa) == 0));
    CHECK((sb != -1 && WIFEXITED(sb) && WEXITSTATUS(sb) == 0));
    CHECK(first_value("O.npy") == 2);
    CHECK(first_value("L.npy") == 2);
  }
  // Free-running, 20 times: the pair always matches.
  int mixed = 0;
  for (int trial = 0; trial < 20; ++trial) {
    pid_t kids[2];
    for (int k = 0; k < 2; ++k) {
      kids[k] = fork();
      if (kids[k] == 0) {
        plain_child();
        commit_pair(float(10 + k), "2", false);
        _exit(0);
      }
    }
    for (pid_t kid : kids) CHECK(wait_for(kid, 20) == 0);
    mixed += first_value("O.npy") != first_value("L.npy");
  }
  CHECK(mixed == 0);
  CHECK(count_prefixed(".flashattn.") == 0);
  std::remove("O.npy");
  std::remove("L.npy");
}

// ---- refusals half-way: root only (ctest "npy append-only", "npy sticky") ----------------
// These need root (chattr, other users' files); where they cannot run they say why and
// exit 77, which CTest reports as "Not Run", never as passed.

namespace {

[[noreturn]] void not_run(const std::string& why) {
  std::printf("NOT RUN: %s\n", why.c_str());
  std::fflush(stdout);
  std::_Exit(77);
}

/// Sets or clears an inode flag (FS_APPEND_FL, FS_IMMUTABLE_FL) as chattr does; the errno if not.
int set_flag(const char* path, int flag, bool on) {
  const int fd = ::open(path, O_RDONLY | O_NONBLOCK);
  if (fd < 0) return errno;
  int flags = 0;
  int e = ::ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0 ? 0 : errno;
  if (!e) {
    flags = on ? (flags | flag) : (flags & ~flag);
    e = ::ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0 ? 0 : errno;
  }
  ::close(fd);
  return e;
}

}  // namespace

TEST_CASE("npy: an append-only or immutable target half-way: every earlier one is put back", "[append-only]") {
  REQUIRE(kDir.ok);
  test::write_file("probe", "x");
  const int e = set_flag("probe", FS_APPEND_FL, true);
  set_flag("probe", FS_APPEND_FL, false);
  std::remove("probe");
  if (e) not_run(std::string("cannot set the append-only flag here (chattr +a: ") + std::strerror(e) +
                 "; it needs root and a file system with inode flags)");
  for (int flag : {FS_APPEND_FL, FS_IMMUTABLE_FL})
    for (bool copy : {false, true})
      for (bool o_exists : {true, false}) {
        INFO((flag == FS_APPEND_FL ? "append-only" : "immutable") << (copy ? ", the copy path" : ", swaps")
                                                                  << (o_exists ? ", O existed" : ", O new"));
        if (o_exists) test::write_file("O.npy", "old O");
        test::write_file("L.npy", "old L");
        REQUIRE(set_flag("L.npy", flag, true) == 0);
        if (copy) setenv("FA_TEST_COMMIT_COPY", "1", 1);
        OutputFiles f;
        f.add("O.npy", {2}, {1.0f, 2.0f});
        f.add("L.npy", {2}, {1.0f, 2.0f});
        const std::string err = test::error_of([&] { f.commit(); });
        unsetenv("FA_TEST_COMMIT_COPY");
        set_flag("L.npy", flag, false);
        INFO(err);
        // Immutable: access() already says no, so it is refused before anything is written.
        CHECK(test::contains(err, flag == FS_IMMUTABLE_FL
                                      ? "L.npy: cannot be written (Operation not permitted)"
                                      : "L.npy: cannot replace it (Operation not permitted); O.npy put back as before"));
        CHECK(err.find('\n') == std::string::npos);
        if (o_exists) CHECK(slurp("O.npy") == "old O");
        else CHECK_FALSE(exists("O.npy"));
        CHECK(slurp("L.npy") == "old L");
        CHECK(count_prefixed(".flashattn.") == 0);
        std::remove("O.npy");
        std::remove("L.npy");
      }
}

TEST_CASE("npy: another user's file in a sticky directory half-way: every earlier one is put back", "[sticky]") {
  if (::geteuid() != 0) not_run("needs root, to make files of two other users in a sticky directory");
  char dir[] = "/tmp/fa_sticky_XXXXXX";  // (the private directory is root's, closed to others)
  REQUIRE(mkdtemp(dir) != nullptr);
  REQUIRE(::chmod(dir, 01777) == 0);
  const uid_t student = 65533, other = 65534;
  const std::string o = std::string(dir) + "/O.npy", l = std::string(dir) + "/L.npy";
  auto cannot = [&](const std::string& why) {
    std::remove(o.c_str());
    std::remove(l.c_str());
    ::rmdir(dir);
    not_run(why);
  };
  for (bool copy : {false, true}) {
    INFO((copy ? "the copy path" : "swaps"));
    test::write_file(o, "old O");
    test::write_file(l, "old L");
    if (::chown(o.c_str(), student, student) != 0 || ::chown(l.c_str(), other, other) != 0)
      cannot(std::string("cannot give files to users 65533 and 65534 here (") + std::strerror(errno) + ")");
    REQUIRE(::chmod(l.c_str(), 0666) == 0);  // writable by all: access() says yes, the sticky bit says no
    const pid_t pid = fork();
    if (pid == 0) {
      plain_child();
      if (setgid(student) != 0 || setuid(student) != 0) _exit(3);
      if (copy) setenv("FA_TEST_COMMIT_COPY", "1", 1);
      OutputFiles f;
      f.add(o, {2}, {1.0f, 2.0f});
      f.add(l, {2}, {1.0f, 2.0f});
      const std::string err = test::error_of([&] { f.commit(); });
      std::printf("child: %s\n", err.c_str());
      _exit(test::contains(err, "L.npy: cannot replace it (Operation not permitted)") &&
                    test::contains(err, "O.npy put back as before")
                ? 0
                : 1);
    }
    const int status = wait_for(pid, 20);
    if (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 3)
      cannot("cannot switch to another user here (setuid)");
    CHECK((status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0));
    CHECK(slurp(o) == "old O");
    CHECK(slurp(l) == "old L");
    int left = 0;
    if (DIR* d = opendir(dir)) {
      while (dirent* e = readdir(d)) left += std::strncmp(e->d_name, ".flashattn.", 11) == 0;
      closedir(d);
    }
    CHECK(left == 0);
    std::remove(o.c_str());
    std::remove(l.c_str());
  }
  ::rmdir(dir);
}
