// The .npy reader and writer against the whole class of files a careful user or a
// careless script produces: what NumPy reads (and how), what it refuses, every
// truncation, and outputs that collide with each other, with inputs, with
// directories, devices and links, or that fail half-way. CI runs these under
// AddressSanitizer and UndefinedBehaviorSanitizer (FA_SANITIZE).
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
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
    CHECK(count_prefixed(".keep.npy.") == 0);
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
    CHECK(count_prefixed(".O.npy.") == 0);
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
    CHECK(count_prefixed(".big.npy.") == 0);
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
      seen = count_prefixed(".slow.npy.") > 0;
      if (!seen) usleep(100);
    }
    kill(pid, SIGTERM);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    if (seen && WIFSIGNALED(status)) {
      CHECK(WTERMSIG(status) == SIGTERM);
      CHECK(count_prefixed(".slow.npy.") == 0);
      CHECK(!exists("slow.npy"));
    } else {
      WARN("the commit finished before the signal: nothing to check");
      std::remove("slow.npy");
    }
  }
}
