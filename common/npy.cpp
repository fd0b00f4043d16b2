#include "common/npy.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>

#include "common/problem.hpp"

namespace fa {

std::string printable(const std::string& s, std::size_t max) {
  std::string out;
  for (unsigned char c : s) {
    if (out.size() >= max) {
      out += "...";
      break;
    }
    if (c < 0x20 || c >= 0x7f) {
      char b[5];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out.push_back(char(c));
    }
  }
  return out;
}

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw Error(printable(path, 200) + ": " + why);
}

std::string errno_text(int e) { return std::strerror(e); }

// ---- the header: a Python literal, read as Python's ast.literal_eval reads it ----------
//
// The subset NumPy's three keys can use: dicts, tuples, lists, strings, ints,
// True/False/None, parentheses, signs, comments and line continuations. Anything
// else (floats, sets, bytes, f-strings, calls, names) is refused: NumPy would either
// refuse it too or read something this program does not take.

struct Value {
  enum Kind { kStr, kInt, kBool, kNone, kTuple, kList, kDict, kFloat, kBytes } kind = kNone;
  std::string str;                 // kStr: the string's characters (UTF-8)
  bool negative = false;           // kInt: the sign ...
  unsigned long long magnitude = 0;  // ... and |value|, valid unless `huge`
  bool huge = false;               // kInt: |value| ≥ 2^63
  bool signed_ = false;            // written with a unary + or −
  bool truth = false;              // kBool
  std::vector<Value> items;        // kTuple, kList; kDict: the values
  std::vector<std::string> keys;   // kDict: the keys (strings), the last of duplicates kept
  std::string text;                // the source, for messages
};

const char* kind_name(Value::Kind k) {
  switch (k) {
    case Value::kStr: return "a string";
    case Value::kInt: return "an integer";
    case Value::kBool: return "a bool";
    case Value::kNone: return "None";
    case Value::kTuple: return "a tuple";
    case Value::kList: return "a list";
    case Value::kDict: return "a dict";
    case Value::kFloat: return "a float";
    case Value::kBytes: return "bytes";
  }
  return "?";
}

void append_utf8(std::string& out, unsigned long cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

bool is_ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_ident(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Parser {
 public:
  Parser(const std::string& text, const std::string& path) : s_(text), path_(path) {}

  /// The whole header: spaces or tabs, one dict, then only blanks and comments.
  Value header() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
    if (i_ >= s_.size() || s_[i_] != '{') error("it does not start with '{'");
    Value v = value(0);
    skip();
    if (i_ != s_.size()) error("unexpected text after the dict");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 32;
  const std::string& s_;
  const std::string& path_;
  std::size_t i_ = 0;

  [[noreturn]] void error(const std::string& what) const {
    const std::size_t from = i_ < 20 ? 0 : i_ - 20;
    fail(path_, "not a header NumPy would read the same way: " + what + " (header byte " + std::to_string(i_) +
                    ", near '" + printable(s_.substr(from, 40), 40) + "')");
  }

  bool at_end() const { return i_ >= s_.size(); }
  char peek(std::size_t ahead = 0) const { return i_ + ahead < s_.size() ? s_[i_ + ahead] : '\0'; }

  /// Blanks, newlines, comments and backslash-newline continuations.
  void skip() {
    while (!at_end()) {
      const char c = s_[i_];
      if (c == ' ' || c == '\t' || c == '\f' || c == '\n' || c == '\r') {
        ++i_;
      } else if (c == '#') {
        while (!at_end() && s_[i_] != '\n' && s_[i_] != '\r') ++i_;
      } else if (c == '\\' && (peek(1) == '\n' || peek(1) == '\r')) {
        i_ += (peek(1) == '\r' && peek(2) == '\n') ? 3 : 2;
      } else {
        return;
      }
    }
  }

  /// Where a string literal starts: a quote, or a prefix (r, u, b, f, br, rb, fr, rf) and a quote.
  std::size_t string_prefix_length() const {
    std::size_t n = 0;
    while (n < 2 && is_ident_start(peek(n))) ++n;
    for (std::size_t k = 0; k <= n; ++k) {
      const char q = peek(k);
      if (q != '\'' && q != '"') continue;
      std::string prefix;
      for (std::size_t m = 0; m < k; ++m) prefix.push_back(char(std::tolower(static_cast<unsigned char>(peek(m)))));
      static const char* kPrefixes[] = {"", "r", "u", "b", "f", "br", "rb", "fr", "rf"};
      for (const char* p : kPrefixes)
        if (prefix == p) return k + 1;  // prefix and the quote
      return 0;
    }
    return 0;
  }

  Value value(int depth) {
    if (depth > kMaxDepth) error("nested more than " + std::to_string(kMaxDepth) + " deep");
    skip();
    if (at_end()) error("the header ends inside a value");
    const std::size_t start = i_;
    Value v;
    const char c = s_[i_];
    if (string_prefix_length() > 0) {
      v = string_value();
    } else if (c == '{') {
      v = dict(depth);
    } else if (c == '(' || c == '[') {
      v = sequence(depth);
    } else if (c == '+' || c == '-') {
      ++i_;
      v = value(depth + 1);
      if (v.kind != Value::kInt && v.kind != Value::kFloat) error(std::string("a sign before ") + kind_name(v.kind));
      if (v.signed_) error("two signs");
      if (c == '-') v.negative = !v.negative && (v.magnitude != 0 || v.huge);
      v.signed_ = true;
    } else if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
      v = number();
    } else if (is_ident_start(c)) {
      std::string name;
      while (!at_end() && is_ident(s_[i_])) name.push_back(s_[i_++]);
      if (name == "True" || name == "False") {
        v.kind = Value::kBool;
        v.truth = name == "True";
      } else if (name == "None") {
        v.kind = Value::kNone;
      } else {
        i_ = start;
        error("'" + printable(name, 20) + "' is not a literal");
      }
    } else {
      error("unexpected character");
    }
    v.text = s_.substr(start, i_ - start);
    return v;
  }

  /// One or more adjacent string literals ('<' 'f4' is '<f4', as in Python).
  Value string_value() {
    Value v;
    v.kind = Value::kStr;
    bool first = true;
    for (;;) {
      const std::size_t n = string_prefix_length();
      if (n == 0) break;
      std::string prefix;
      for (std::size_t m = 0; m + 1 < n; ++m) prefix.push_back(char(std::tolower(static_cast<unsigned char>(s_[i_ + m]))));
      const bool raw = prefix.find('r') != std::string::npos, bytes = prefix.find('b') != std::string::npos;
      if (prefix.find('f') != std::string::npos) error("an f-string");
      if (bytes) v.kind = Value::kBytes;  // refused by the checks after parsing, as NumPy's
      else if (!first && v.kind == Value::kBytes) error("bytes and a string side by side");
      i_ += n - 1;
      literal(raw, bytes, v.str);
      first = false;
      const std::size_t save = i_;
      skip();
      if (string_prefix_length() == 0) {
        i_ = save;
        break;
      }
    }
    return v;
  }

  /// One quoted literal from its quote on, escapes decoded, appended to `out`.
  void literal(bool raw, bool bytes, std::string& out) {
    const char q = s_[i_];
    const bool triple = peek(1) == q && peek(2) == q;
    i_ += triple ? 3 : 1;
    for (;;) {
      if (at_end()) error("an unterminated string");
      const char c = s_[i_];
      if (triple ? (c == q && peek(1) == q && peek(2) == q) : c == q) {
        i_ += triple ? 3 : 1;
        return;
      }
      if (!triple && (c == '\n' || c == '\r')) error("a line break inside a string");
      if (c != '\\') {
        out.push_back(c);
        ++i_;
        continue;
      }
      const char e = peek(1);
      if (e == '\0' && i_ + 1 >= s_.size()) error("an unterminated string");
      if (raw) {  // a backslash stays; it only keeps the next character from ending the string
        out.push_back('\\');
        if (e == q || e == '\\') out.push_back(e), i_ += 2;
        else ++i_;
        continue;
      }
      i_ += 2;
      switch (e) {
        case '\n': break;  // a continuation: nothing
        case '\r':
          if (peek() == '\n') ++i_;
          break;
        case '\\': case '\'': case '"': out.push_back(e); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x': case 'u': case 'U': {
          if (bytes && e != 'x') {  // not an escape in bytes: kept as written
            out.push_back('\\'), out.push_back(e);
            break;
          }
          const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          unsigned long cp = 0;
          for (int k = 0; k < digits; ++k) {
            const int h = hex_digit(peek());
            if (h < 0) error(std::string("a truncated \\") + e + " escape");
            cp = cp * 16 + unsigned(h), ++i_;
          }
          if (cp > 0x10FFFF) error("an escape past U+10FFFF");
          if (bytes) out.push_back(char(cp));
          else append_utf8(out, cp);
          break;
        }
        case 'N':
          if (bytes) {
            out.push_back('\\'), out.push_back('N');
            break;
          }
          error("a \\N{...} escape (not supported here)");
        default:
          if (e >= '0' && e <= '7') {  // up to three octal digits
            unsigned long cp = unsigned(e - '0');
            for (int k = 0; k < 2 && peek() >= '0' && peek() <= '7'; ++k) cp = cp * 8 + unsigned(peek() - '0'), ++i_;
            if (bytes) out.push_back(char(cp & 0xFF));
            else append_utf8(out, cp);
          } else {  // an unknown escape keeps its backslash, as in Python
            out.push_back('\\');
            --i_;
          }
      }
    }
  }

  /// An int literal (decimal, 0x, 0o, 0b, with single underscores between digits);
  /// floats and complex numbers are recognised only to be named in the error.
  Value number() {
    const std::size_t start = i_;
    while (!at_end()) {
      const char c = s_[i_];
      if (is_ident(c) || c == '.') {
        ++i_;
      } else if ((c == '+' || c == '-') && i_ > start && (s_[i_ - 1] == 'e' || s_[i_ - 1] == 'E') &&
                 !(s_[start] == '0' && i_ - start > 1 && std::strchr("xXoObB", s_[start + 1]))) {
        ++i_;  // an exponent's sign
      } else {
        break;
      }
    }
    const std::string tok = s_.substr(start, i_ - start);
    Value v;
    int base = 10;
    std::size_t p = 0;
    if (tok.size() > 1 && tok[0] == '0' && std::strchr("xXoObB", tok[1])) {
      base = std::tolower(static_cast<unsigned char>(tok[1])) == 'x' ? 16 : std::tolower(static_cast<unsigned char>(tok[1])) == 'o' ? 8 : 2;
      p = 2;
      if (p < tok.size() && tok[p] == '_') ++p;  // 0x_1F is valid Python
    } else if (tok.find_first_of(".eEjJ") != std::string::npos) {
      v.kind = Value::kFloat;  // (or not a number at all: NumPy refuses it either way)
      return v;
    }
    v.kind = Value::kInt;
    bool any = false, last_underscore = false;
    for (; p < tok.size(); ++p) {
      const char c = tok[p];
      if (c == '_') {
        if (!any || last_underscore) error("'" + printable(tok, 30) + "' is not an integer literal");
        last_underscore = true;
        continue;
      }
      const int dgt = hex_digit(c);
      if (dgt < 0 || dgt >= base) error("'" + printable(tok, 30) + "' is not an integer literal");
      if (base == 10 && any && v.magnitude == 0 && !v.huge && dgt != 0)
        error("'" + printable(tok, 30) + "' has leading zeros (not a Python integer)");
      if (v.magnitude > (ULLONG_MAX - unsigned(dgt)) / unsigned(base)) v.huge = true;
      else v.magnitude = v.magnitude * unsigned(base) + unsigned(dgt);
      any = true, last_underscore = false;
    }
    if (!any || last_underscore) error("'" + printable(tok, 30) + "' is not an integer literal");
    if (v.magnitude > (1ull << 63) - 1) v.huge = true;
    return v;
  }

  /// ( … ) and [ … ]: a tuple, a list, or — one value without a comma — parentheses.
  Value sequence(int depth) {
    const char open = s_[i_++], close = open == '(' ? ')' : ']';
    Value v;
    v.kind = open == '(' ? Value::kTuple : Value::kList;
    skip();
    if (peek() == close) {
      ++i_;
      return v;
    }
    bool comma = false;
    for (;;) {
      v.items.push_back(value(depth + 1));
      skip();
      if (peek() == ',') {
        comma = true;
        ++i_;
        skip();
        if (peek() == close) break;
        continue;
      }
      if (peek() == close) break;
      error(std::string("expected ',' or '") + close + "'");
    }
    ++i_;
    if (open == '(' && !comma) {  // (x) is x
      Value inner = v.items[0];
      return inner;
    }
    return v;
  }

  Value dict(int depth) {
    ++i_;
    Value v;
    v.kind = Value::kDict;
    skip();
    if (peek() == '}') {
      ++i_;
      return v;
    }
    for (;;) {
      Value key = value(depth + 1);
      if (key.kind != Value::kStr) error(std::string("a key that is ") + kind_name(key.kind) + ", not a string");
      skip();
      if (peek() != ':') error("expected ':' after a key");
      ++i_;
      Value val = value(depth + 1);
      const auto at = std::find(v.keys.begin(), v.keys.end(), key.str);
      if (at == v.keys.end()) {
        v.keys.push_back(key.str);
        v.items.push_back(std::move(val));
      } else {  // a key given twice: the last wins, as in a Python dict literal
        v.items[std::size_t(at - v.keys.begin())] = std::move(val);
      }
      skip();
      if (peek() == ',') {
        ++i_;
        skip();
        if (peek() == '}') break;
        continue;
      }
      if (peek() == '}') break;
      error("expected ',' or '}'");
    }
    ++i_;
    return v;
  }
};

/// Whether s is valid UTF-8 (no overlong forms, no surrogates); *chars: its characters.
bool valid_utf8(const std::string& s, std::size_t* chars) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int extra;
    unsigned long cp;
    if (c < 0x80) extra = 0, cp = c;
    else if ((c >> 5) == 6) extra = 1, cp = c & 0x1F;
    else if ((c >> 4) == 14) extra = 2, cp = c & 0x0F;
    else if ((c >> 3) == 30) extra = 3, cp = c & 0x07;
    else return false;
    if (i + std::size_t(extra) >= s.size()) return false;  // the sequence is cut off
    for (int k = 1; k <= extra; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + std::size_t(k)]);
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static const unsigned long kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += std::size_t(extra) + 1;
    ++n;
  }
  *chars = n;
  return true;
}

bool host_little_endian() {
  const std::uint16_t x = 1;
  unsigned char b;
  std::memcpy(&b, &x, 1);
  return b == 1;
}

constexpr std::size_t kMaxHeader = 10000;  // numpy.lib.format's max_header_size (np.load's default)

/// Where the header starts (after magic, version and length): 10 in version 1, else 12.
std::size_t header_start(int major) { return major == 1 ? 10 : 12; }
/// The little-endian header length after the version bytes (`bytes` holds them).
std::size_t header_length(const std::string& bytes, int major) {
  std::size_t hlen = 0;
  for (std::size_t k = 0; k < header_start(major) - 8; ++k)
    hlen |= std::size_t(static_cast<unsigned char>(bytes[8 + k])) << (8 * k);
  return hlen;
}

}  // namespace

NpyHeader parse_npy_header(const std::string& bytes, std::size_t file_size, const std::string& path, bool integers) {
  static const char kMagic[] = "\x93NUMPY";
  if (file_size == 0) fail(path, "is empty, not a .npy file");
  const std::size_t have = std::min<std::size_t>(bytes.size(), 6);
  if (std::memcmp(bytes.data(), kMagic, have) != 0 || (bytes.size() < 6 && file_size > bytes.size()))
    fail(path, "not a .npy file (it does not start with \\x93NUMPY)");
  if (bytes.size() < 8) fail(path, "truncated: the file ends inside the .npy magic string");
  NpyHeader h;
  const int major = static_cast<unsigned char>(bytes[6]), minor = static_cast<unsigned char>(bytes[7]);
  if (!((major == 1 || major == 2 || major == 3) && minor == 0))
    fail(path, "format version " + std::to_string(major) + "." + std::to_string(minor) +
                   " (NumPy reads versions 1.0, 2.0 and 3.0)");
  h.version = major;
  const std::size_t start = header_start(major);
  if (bytes.size() < start) fail(path, "truncated: the file ends inside the header length");
  const std::size_t hlen = header_length(bytes, major);
  if (hlen > kMaxHeader * (major == 3 ? 4 : 1))  // (UTF-8: up to 4 bytes a character)
    fail(path, "the header is " + std::to_string(hlen) + " bytes; NumPy refuses headers over " +
                   std::to_string(kMaxHeader) + " characters");
  if (bytes.size() < start + hlen)
    fail(path, "truncated: the header is " + std::to_string(hlen) + " bytes but the file ends after " +
                   std::to_string(bytes.size() - start));
  const std::string text = bytes.substr(start, hlen);
  if (text.find('\0') != std::string::npos) fail(path, "the header contains a NUL byte (Python refuses it)");
  std::size_t chars = hlen;
  if (major == 3 && !valid_utf8(text, &chars)) fail(path, "a version 3.0 header that is not valid UTF-8");
  if (chars > kMaxHeader)
    fail(path, "the header is " + std::to_string(chars) + " characters; NumPy refuses headers over " +
                   std::to_string(kMaxHeader));
  h.data_offset = start + hlen;

  const Value d = Parser(text, path).header();
  // NumPy's checks, in NumPy's order (numpy/lib/format.py, _read_array_header).
  std::vector<std::string> keys = d.keys;
  std::sort(keys.begin(), keys.end());
  if (keys != std::vector<std::string>{"descr", "fortran_order", "shape"}) {
    std::string got;
    for (const auto& k : keys) got += (got.empty() ? "'" : ", '") + printable(k, 20) + "'";
    fail(path, "the header's keys are {" + got + "}; a .npy header has exactly 'descr', 'fortran_order', 'shape'");
  }
  auto field = [&](const char* key) -> const Value& {
    return d.items[std::size_t(std::find(d.keys.begin(), d.keys.end(), key) - d.keys.begin())];
  };
  const Value& shape = field("shape");
  if (shape.kind != Value::kTuple)
    fail(path, std::string("'shape' is ") + kind_name(shape.kind) + " (" + printable(shape.text, 30) +
                   "); NumPy needs a tuple of ints");
  for (const Value& e : shape.items) {
    if (e.kind == Value::kBool)
      fail(path, "shape entry " + e.text + " is a bool (NumPy would read it as " + (e.truth ? "1" : "0") +
                     "): write integers");
    if (e.kind != Value::kInt)
      fail(path, "shape entry '" + printable(e.text, 30) + "' is " + kind_name(e.kind) + ", not an integer");
    if (e.negative) fail(path, "shape entry " + printable(e.text, 30) + " is negative");
    if (e.huge) fail(path, "shape entry " + printable(e.text, 30) + " is too large (2^63 or more)");
    h.shape.push_back(static_cast<long long>(e.magnitude));
  }
  if (h.shape.empty() || h.shape.size() > 4)
    fail(path, "has " + std::to_string(h.shape.size()) + " dimensions; expected 1 to 4 (e.g. [N, d] or [B, H, N, d])");
  const Value& fortran = field("fortran_order");
  if (fortran.kind != Value::kBool)
    fail(path, std::string("'fortran_order' is ") + kind_name(fortran.kind) + "; NumPy needs True or False");
  const Value& descr = field("descr");
  if (descr.kind == Value::kList) fail(path, "a structured dtype (descr is a list): save a plain float32 or float64 array");
  if (descr.kind != Value::kStr)
    fail(path, std::string("'descr' is ") + kind_name(descr.kind) + "; save a float32 or float64 array");
  // The descriptors np.save writes ('<f4', '>f8' …), and the native-order spellings
  // NumPy maps to the same dtype on this machine.
  const bool little = host_little_endian();
  const std::string& t = descr.str;
  const std::string kind = t.size() >= 2 ? t.substr(t.size() - 2) : t;  // 'f4' of '<f4', '=f4', 'f4'
  const bool order_ok = t.size() == 2 || (t.size() == 3 && (t[0] == '<' || t[0] == '>' || t[0] == '='));
  h.integer = kind == "i4" || kind == "i8";
  if (order_ok && (kind == "f4" || kind == "i4")) h.itemsize = 4;
  else if (order_ok && (kind == "f8" || kind == "i8")) h.itemsize = 8;
  else if (integers) fail(path, "dtype '" + printable(t, 20) + "' is not supported: save the indices as int32 or int64");
  else fail(path, "dtype '" + printable(t, 20) + "' is not supported: save float32 or float64 ('<f4', '<f8', either byte order)");
  if (h.integer != integers)
    fail(path, integers ? "holds floats ('" + printable(t, 20) + "'): indices must be integers: save int32 or int64"
                        : "dtype '" + printable(t, 20) +
                              "' is not supported: save float32 or float64 ('<f4', '<f8', either byte order)");
  h.big_endian = t[0] == '>' || (!little && t[0] != '<');
  if (fortran.truth) fail(path, "Fortran-ordered arrays are not supported: save np.ascontiguousarray(x)");

  // The element count, without wrapping; then the data against the file's real size.
  bool zero = false;
  for (long long s : h.shape) zero |= s == 0;
  std::size_t count = 1;
  if (zero) {
    count = 0;
  } else {
    for (long long s : h.shape)
      if (__builtin_mul_overflow(count, std::size_t(s), &count))
        fail(path, "the shape's element count overflows 64 bits");
  }
  std::size_t data_bytes = 0;
  if (__builtin_mul_overflow(count, std::size_t(h.itemsize), &data_bytes))
    fail(path, "the shape's size in bytes overflows 64 bits");
  h.count = count;
  const std::size_t have_data = file_size > h.data_offset ? file_size - h.data_offset : 0;
  if (have_data < data_bytes)
    fail(path, "truncated: the header promises " + std::to_string(count) + " elements (" + std::to_string(data_bytes) +
                   " bytes) but the file holds " + std::to_string(have_data) + " bytes of data");
  if (have_data > data_bytes)
    fail(path, "the file has " + std::to_string(have_data - data_bytes) +
                   " bytes past the data its header describes (NumPy would ignore them): a damaged or concatenated file?");
  return h;
}

namespace {

/// An open, regular input file.
struct InputFile {
  int fd = -1;
  std::size_t size = 0;
  InputFile(const std::string& path) {
    // O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer; the type
    // is checked before anything is read, and the flag cleared for a regular file.
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) fail(path, "cannot open (" + errno_text(errno) + ")");
    struct stat st{};
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      fail(path, "cannot stat (" + errno_text(e) + ")");
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      fail(path, S_ISDIR(st.st_mode)    ? "is a directory, not a .npy file"
                 : S_ISFIFO(st.st_mode) ? "is a FIFO (a named pipe), not a regular file: refusing to wait on it"
                                        : "is not a regular file (a device or socket)");
    }
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
      const int e = errno;
      ::close(fd);
      fail(path, "cannot open (" + errno_text(e) + ")");
    }
    size = std::size_t(st.st_size);
  }
  ~InputFile() {
    if (fd >= 0) ::close(fd);
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  /// Up to n bytes from the current position (fewer only at the end of the file).
  std::size_t read(void* dst, std::size_t n, const std::string& path) const {
    std::size_t got = 0;
    while (got < n) {
      const ssize_t r = ::read(fd, static_cast<char*>(dst) + got, n - got);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail(path, "cannot read (" + errno_text(errno) + ")");
      if (r == 0) break;
      got += std::size_t(r);
    }
    return got;
  }
};

NpyHeader header_of(const InputFile& f, const std::string& path, bool integers = false) {
  // The preamble, then exactly the header it announces (at most 40 kB: parse refuses more).
  std::string bytes(12, '\0');
  bytes.resize(f.read(&bytes[0], 12, path));
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), "\x93NUMPY", 6) == 0) {
    const int major = static_cast<unsigned char>(bytes[6]);
    const std::size_t start = header_start(major);
    if (bytes.size() >= start && (major == 1 || major == 2 || major == 3)) {
      const std::size_t hlen = header_length(bytes, major);
      if (hlen <= 4 * kMaxHeader) {  // (parse_npy_header refuses longer headers unread)
        const std::size_t old = bytes.size(), want = start + hlen;
        if (old < want) {
          bytes.resize(want);
          bytes.resize(old + f.read(&bytes[old], want - old, path));
        } else {
          bytes.resize(want);  // version 1 with a header under 2 bytes: the twelve read hold it all
        }
        if (::lseek(f.fd, off_t(bytes.size()), SEEK_SET) < 0) fail(path, "cannot seek (" + errno_text(errno) + ")");
      }
    }
  }
  return parse_npy_header(bytes, f.size, path, integers);
}

/// A checked header's data, in chunks of 64k elements (float64 and swapped data are converted
/// on the way, in a small buffer): each element's bytes, in the host's order, to store(i, p).
template <class Store>
void read_elements(const InputFile& f, const NpyHeader& h, const std::string& path, Store&& store) {
  const bool swap = h.big_endian == host_little_endian();
  constexpr std::size_t kChunk = 1 << 16;
  std::vector<unsigned char> buf(std::min(kChunk, h.count) * std::size_t(h.itemsize));
  for (std::size_t done = 0; done < h.count;) {
    const std::size_t n = std::min(kChunk, h.count - done), want = n * std::size_t(h.itemsize);
    if (f.read(buf.data(), want, path) != want) fail(path, "truncated while reading (the file shrank?)");
    for (std::size_t e = 0; e < n; ++e) {
      unsigned char* p = buf.data() + e * std::size_t(h.itemsize);
      if (swap) std::reverse(p, p + h.itemsize);
      store(done + e, p);
    }
    done += n;
  }
}

}  // namespace

NpyHeader read_npy_header(const std::string& path) {
  const InputFile f(path);
  return header_of(f, path);
}

NpyArray read_npy(const std::string& path) {
  const InputFile f(path);
  const NpyHeader h = header_of(f, path);  // the data fits in the file: checked before allocating
  NpyArray a;
  a.shape = h.shape;
  a.data.resize(h.count);
  read_elements(f, h, path, [&](std::size_t i, const unsigned char* p) {
    if (h.itemsize == 4) {
      std::memcpy(&a.data[i], p, 4);
    } else {
      double x;
      std::memcpy(&x, p, 8);
      a.data[i] = static_cast<float>(x);
    }
  });
  return a;
}

NpyInts read_npy_ints(const std::string& path) {
  const InputFile f(path);
  const NpyHeader h = header_of(f, path, true);
  NpyInts a;
  a.shape = h.shape;
  a.data.resize(h.count);
  read_elements(f, h, path, [&](std::size_t i, const unsigned char* p) {
    if (h.itemsize == 4) {
      std::int32_t x;
      std::memcpy(&x, p, 4);
      a.data[i] = x;
    } else {
      std::int64_t x;
      std::memcpy(&x, p, 8);
      a.data[i] = x;
    }
  });
  return a;
}

std::string shape_tuple(const std::vector<long long>& shape) {
  std::string s = "(";
  for (std::size_t k = 0; k < shape.size(); ++k) s += (k ? ", " : "") + std::to_string(shape[k]);
  return s + (shape.size() == 1 ? ",)" : ")");  // (3,) keeps its comma, (2, 3) does not
}

std::string npy_bytes(const std::vector<long long>& shape, const std::vector<float>& data) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_tuple(shape) + ", }";
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

// ---- writing ---------------------------------------------------------------------------

namespace {

std::string dir_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}
std::string base_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

/// What names a file: its device and inode when it exists, else its directory's
/// real path and its name.
struct FileId {
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  std::string where;
  bool operator==(const FileId& o) const {
    return exists == o.exists && (exists ? dev == o.dev && ino == o.ino : where == o.where);
  }
};
FileId file_id(const std::string& path) {
  FileId id;
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0) {
    id.exists = true, id.dev = st.st_dev, id.ino = st.st_ino;
    return id;
  }
  char* real = ::realpath(dir_of(path).c_str(), nullptr);
  id.where = (real ? std::string(real) : dir_of(path)) + "/" + base_of(path);
  std::free(real);
  return id;
}

/// Throws unless `path` can be replaced by a new regular file.
void check_target(const std::string& path) {
  if (path.empty()) throw Error("an output path is empty");
  if (base_of(path).empty() || base_of(path) == "." || base_of(path) == "..")
    fail(path, "names a directory, not an output file");
  struct stat st{};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode))
      fail(path, "is a symbolic link; outputs replace their file, so name the file itself");
    if (S_ISDIR(st.st_mode)) fail(path, "is a directory");
    if (!S_ISREG(st.st_mode)) fail(path, "is not a regular file (a device, FIFO or socket): refusing to replace it");
    if (st.st_nlink > 1)
      fail(path, "has " + std::to_string(st.st_nlink) +
                     " hard links; replacing it would leave the other names holding the old data");
    if (::access(path.c_str(), W_OK) != 0) fail(path, "cannot be written (" + errno_text(errno) + ")");
  } else if (errno != ENOENT && errno != ENOTDIR) {  // (ENOTDIR: the directory check below says which)
    fail(path, "cannot be checked (" + errno_text(errno) + ")");
  }
  const std::string dir = dir_of(path);
  struct stat ds{};
  if (::stat(dir.c_str(), &ds) != 0) fail(path, "its directory " + printable(dir, 200) + " cannot be used (" + errno_text(errno) + ")");
  if (!S_ISDIR(ds.st_mode)) fail(path, printable(dir, 200) + " is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    fail(path, "cannot create files in " + printable(dir, 200) + " (" + errno_text(errno) + ")");
}

// ---- the commit: temporaries, a lock, swaps that can be undone -------------------------
//
// This program's own temporaries are named ".flashattn.XXXXXX.new" (an output being
// written; once swapped with its target, the target's old content) and
// ".flashattn.XXXXXX.old" (a copy of a target's old content, where the file system
// cannot swap two names). Short and of fixed length, so that any output name the file
// system allows works; recognisable, so that the next commit in that directory, holding
// its lock, removes what a crash (SIGKILL, power) left there.

constexpr char kOwnPrefix[] = ".flashattn.";
constexpr std::size_t kOwnPrefixLength = sizeof kOwnPrefix - 1;
constexpr std::size_t kRandomLength = 6;

bool is_own_temporary(const char* name) {
  if (std::strncmp(name, kOwnPrefix, kOwnPrefixLength) != 0) return false;
  for (std::size_t k = kOwnPrefixLength; k < kOwnPrefixLength + kRandomLength; ++k)
    if (!std::isalnum(static_cast<unsigned char>(name[k]))) return false;  // (stops at the '\0' too)
  const char* rest = name + kOwnPrefixLength + kRandomLength;
  return std::strcmp(rest, ".new") == 0 || std::strcmp(rest, ".old") == 0;
}

/// ".flashattn.XXXXXX" with six random letters and digits.
std::string random_stem() {
  static const char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  static std::mt19937_64 rng;
  static pid_t seeded_for = 0;
  if (seeded_for != ::getpid()) {  // (a forked child must not repeat its parent's names)
    seeded_for = ::getpid();
    rng.seed(std::random_device{}() ^ (std::uint64_t(seeded_for) << 32));
  }
  std::string s = kOwnPrefix;
  for (std::size_t k = 0; k < kRandomLength; ++k) s.push_back(kAlnum[rng() % (sizeof kAlnum - 1)]);
  return s;
}

// The signals that end a process by default and can be caught. While the temporaries
// are written, their handler removes them before the process ends; while targets are
// replaced, they are blocked and delivered once every target is whole and consistent.
constexpr int kEnding[] = {SIGINT,  SIGTERM, SIGHUP,    SIGQUIT, SIGPIPE, SIGALRM,
                           SIGUSR1, SIGUSR2, SIGVTALRM, SIGPROF, SIGXCPU};
constexpr int kEndingCount = int(sizeof kEnding / sizeof kEnding[0]);
constexpr int kMaxFiles = 16;

// The temporaries being written, for the handler: fixed buffers, no allocation.
struct TempName {
  int dir = -1;
  char name[32] = {};
};
TempName g_temps[kMaxFiles];
volatile sig_atomic_t g_temp_count = 0;

extern "C" void remove_temps_and_die(int sig) {
  for (int k = 0; k < g_temp_count; ++k)
    if (g_temps[k].name[0]) ::unlinkat(g_temps[k].dir, g_temps[k].name, 0);
  ::signal(sig, SIG_DFL);
  ::raise(sig);  // delivered when the handler returns: the process ends as the signal says
}

sigset_t ending_set() {
  sigset_t s;
  sigemptyset(&s);
  for (int sig : kEnding) sigaddset(&s, sig);
  return s;
}

/// For the lifetime of a commit: the handlers while writing, then (hold) the signals
/// blocked while replacing. Afterwards the old handlers, then the old mask: a signal
/// that came meanwhile ends the process only now, with every target whole.
class SignalGuard {
 public:
  SignalGuard() {
    struct sigaction sa{};
    sa.sa_handler = remove_temps_and_die;
    sigemptyset(&sa.sa_mask);
    for (int k = 0; k < kEndingCount; ++k) ::sigaction(kEnding[k], &sa, &old_[k]);
    struct sigaction ign{};
    ign.sa_handler = SIG_IGN;  // a file-size limit: the write fails with EFBIG, reported as such
    sigemptyset(&ign.sa_mask);
    ::sigaction(SIGXFSZ, &ign, &old_xfsz_);
  }
  void hold() {
    const sigset_t s = ending_set();
    ::pthread_sigmask(SIG_BLOCK, &s, &before_);
    held_ = true;
  }
  ~SignalGuard() {
    g_temp_count = 0;
    for (int k = 0; k < kEndingCount; ++k) ::sigaction(kEnding[k], &old_[k], nullptr);
    ::sigaction(SIGXFSZ, &old_xfsz_, nullptr);
    if (held_) ::pthread_sigmask(SIG_SETMASK, &before_, nullptr);
  }
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;

 private:
  struct sigaction old_[kEndingCount];
  struct sigaction old_xfsz_;
  sigset_t before_;
  bool held_ = false;
};

/// The targets' directories, each opened once and locked (flock) for the commit, in
/// the order of (device, inode) so that two runs never wait on each other in a circle.
/// A second run writing into one of them waits here until the first has finished.
class Directories {
 public:
  struct Dir {
    int fd = -1;       // for the *at calls, the lock and the final fsync
    int lock_fd = -1;  // a lock file, where a directory cannot be locked itself (NFS)
    bool listable = false;
    dev_t dev = 0;
    ino_t ino = 0;
    std::string path;
  };

  /// Opens and locks the directory of every target; index(k) is target k's.
  explicit Directories(const std::vector<std::string>& targets) {
    try {
      open_and_lock(targets);
    } catch (...) {
      close_all();
      throw;
    }
  }
  ~Directories() { close_all(); }
  Directories(const Directories&) = delete;
  Directories& operator=(const Directories&) = delete;

  const Dir& of(std::size_t target) const { return dirs_[index_[target]]; }

  /// Removes the temporaries a crashed commit left (this one holds every lock).
  void remove_stale() const {
    for (const Dir& d : dirs_) {
      if (!d.listable) continue;
      const int fd = ::openat(d.fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (fd < 0) continue;
      DIR* listing = ::fdopendir(fd);
      if (!listing) {
        ::close(fd);
        continue;
      }
      std::vector<std::string> stale;
      while (const dirent* e = ::readdir(listing))
        if (is_own_temporary(e->d_name)) stale.push_back(e->d_name);
      ::closedir(listing);
      for (const auto& name : stale) ::unlinkat(d.fd, name.c_str(), 0);
    }
  }

  /// Best effort: the renames on disk before the program says it is done.
  void sync() const {
    for (const Dir& d : dirs_)
      if (d.listable) ::fsync(d.fd);
  }

 private:
  std::vector<Dir> dirs_;
  std::vector<std::size_t> index_;

  void open_and_lock(const std::vector<std::string>& targets) {
    for (const auto& t : targets) {
      const std::string path = dir_of(t);
      int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      const bool listable = fd >= 0;
      if (fd < 0 && errno == EACCES) fd = ::open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);  // write-only
      if (fd < 0) fail(t, "its directory " + printable(path, 200) + " cannot be opened (" + errno_text(errno) + ")");
      struct stat st{};
      ::fstat(fd, &st);
      std::size_t found = dirs_.size();
      for (std::size_t m = 0; m < dirs_.size(); ++m)
        if (dirs_[m].dev == st.st_dev && dirs_[m].ino == st.st_ino) found = m;
      if (found == dirs_.size()) {
        dirs_.push_back({fd, -1, listable, st.st_dev, st.st_ino, path});
      } else {
        ::close(fd);
      }
      index_.push_back(found);
    }
    std::vector<std::size_t> order(dirs_.size());
    for (std::size_t m = 0; m < order.size(); ++m) order[m] = m;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return std::pair(dirs_[a].dev, dirs_[a].ino) < std::pair(dirs_[b].dev, dirs_[b].ino);
    });
    for (std::size_t m : order) lock(dirs_[m]);
  }

  void close_all() {
    for (const Dir& d : dirs_) {
      if (d.lock_fd >= 0) ::close(d.lock_fd);
      ::close(d.fd);
    }
    dirs_.clear();
  }

  static void lock(Dir& d) {
    int r;
    while ((r = ::flock(d.fd, LOCK_EX)) != 0 && errno == EINTR) {
    }
    if (r == 0) return;
    // A file system that cannot lock a directory: a lock file in it instead.
    d.lock_fd = ::openat(d.fd, ".flashattn.lock", O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
    while (d.lock_fd >= 0 && (r = ::flock(d.lock_fd, LOCK_EX)) != 0 && errno == EINTR) {
    }
    if (d.lock_fd < 0 || r != 0)
      throw Error(printable(d.path, 200) + ": cannot lock the directory against another run writing there (" +
                  errno_text(errno) + "); no output file was written");
  }
};

/// Writes `bytes` to a new temporary in `dir` beside `target`; returns its name (in
/// that directory). Throws with the errno of the call that failed (the temporary removed).
std::string write_temp(const Directories::Dir& dir, const std::string& target, const std::string& bytes, int slot) {
  // The mode np.save would leave: the existing file's, else 0666 less the umask.
  struct stat st{};
  mode_t mode;
  if (::fstatat(dir.fd, base_of(target).c_str(), &st, 0) == 0) {
    mode = st.st_mode & 07777;
  } else {
    const mode_t mask = ::umask(0);
    ::umask(mask);
    mode = 0666 & ~mask;
  }
  // The handler knows the name before the file exists, and a name that was taken
  // already is forgotten before a signal can act on it: the signals wait meanwhile.
  const sigset_t ending = ending_set();
  std::string name;
  int fd = -1, made = 0;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    name = random_stem() + ".new";
    sigset_t before;
    ::pthread_sigmask(SIG_BLOCK, &ending, &before);
    std::memcpy(g_temps[slot].name, name.c_str(), name.size() + 1);
    g_temps[slot].dir = dir.fd;
    g_temp_count = slot + 1;
    fd = ::openat(dir.fd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    made = errno;
    if (fd < 0) g_temps[slot].name[0] = '\0';
    ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
    if (fd < 0 && made != EEXIST) break;
  }
  if (fd < 0) fail(target, "cannot create a file in " + printable(dir.path, 200) + " (" + errno_text(made) + ")");
  auto give_up = [&](const char* what, int e) {
    ::close(fd);
    ::unlinkat(dir.fd, name.c_str(), 0);
    g_temps[slot].name[0] = '\0';
    fail(target, std::string("cannot ") + what + " (" + errno_text(e) + ")");
  };
  if (::fchmod(fd, mode) != 0) give_up("set its permissions", errno);
  for (std::size_t done = 0; done < bytes.size();) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) give_up("write", errno);
    done += std::size_t(w);
  }
  if (::fsync(fd) != 0) give_up("write (flushing to disk)", errno);
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlinkat(dir.fd, name.c_str(), 0);
    g_temps[slot].name[0] = '\0';
    fail(target, "cannot write (closing: " + errno_text(e) + ")");
  }
  return name;
}

/// Copies file `from` to a new file `to` (both in directory `dir`), flushed to disk;
/// false with errno set if it could not.
bool copy_file(int dir, const std::string& from, const std::string& to) {
  const int in = ::openat(dir, from.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (in < 0) return false;
  const int out = ::openat(dir, to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  bool ok = out >= 0;
  char buf[1 << 16];
  while (ok) {
    const ssize_t r = ::read(in, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      ok = r == 0;
      break;
    }
    for (ssize_t done = 0; ok && done < r;) {
      const ssize_t w = ::write(out, buf + done, std::size_t(r - done));
      if (w < 0 && errno == EINTR) continue;
      ok = w > 0;
      done += w > 0 ? w : 0;
    }
  }
  ok = ok && ::fsync(out) == 0;
  const int e = errno;
  ::close(in);
  if (out >= 0) ::close(out);
  if (!ok && out >= 0) ::unlinkat(dir, to.c_str(), 0);
  errno = e;
  return ok;
}

/// Test hooks: a pause after each target is replaced (to signal or race a commit
/// half-way), and the copy path of file systems that cannot swap two names.
long pause_ms() {
  const char* s = std::getenv("FA_TEST_COMMIT_PAUSE_MS");
  return s ? std::strtol(s, nullptr, 10) : 0;
}
bool force_copy() {
  const char* s = std::getenv("FA_TEST_COMMIT_COPY");
  return s && *s && std::strcmp(s, "0") != 0;
}

}  // namespace

void check_output_paths(const std::vector<std::string>& outputs, const std::vector<std::string>& inputs) {
  std::vector<FileId> in_ids, out_ids;
  for (const auto& p : inputs) in_ids.push_back(file_id(p));
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    if (outputs[k].empty()) throw Error("an output path is empty");
    const FileId id = file_id(outputs[k]);
    for (std::size_t m = 0; m < out_ids.size(); ++m)
      if (out_ids[m] == id)
        fail(outputs[k], "is named for two outputs (also as " + printable(outputs[m], 200) + ")");
    for (std::size_t m = 0; m < in_ids.size(); ++m)
      if (in_ids[m] == id) fail(outputs[k], "is an input (" + printable(inputs[m], 200) + "); write outputs elsewhere");
    check_target(outputs[k]);
    out_ids.push_back(id);
  }
}

void OutputFiles::add(const std::string& path, const std::vector<long long>& shape, const std::vector<float>& data) {
  items_.push_back({path, npy_bytes(shape, data)});
}

void OutputFiles::commit(const std::vector<std::string>& inputs) {
  std::vector<std::string> paths;
  for (const auto& it : items_) paths.push_back(it.path);
  if (items_.size() > std::size_t(kMaxFiles)) throw Error("too many output files at once");
  check_output_paths(paths, inputs);

  // Locked before anything is written (a Ctrl-C while waiting just ends the program).
  const Directories dirs(paths);
  dirs.remove_stale();
  SignalGuard guard;
  std::vector<std::string> temps;
  auto cleanup = [&] {
    for (std::size_t k = 0; k < temps.size(); ++k) ::unlinkat(dirs.of(k).fd, temps[k].c_str(), 0);
  };
  try {
    for (std::size_t k = 0; k < items_.size(); ++k)
      temps.push_back(write_temp(dirs.of(k), items_[k].path, items_[k].bytes, int(k)));
    check_output_paths(paths, inputs);  // again: nothing may have appeared in the way meanwhile
  } catch (const Error& e) {
    cleanup();
    throw Error(std::string(e.what()) + "; no output file was written");
  }

  // Replace the targets one by one, keeping what each held, so that a refusal half-way
  // (an append-only or immutable file, a sticky directory, a full disk for a copy) puts
  // every earlier one back. An existing target is swapped with its temporary
  // (RENAME_EXCHANGE: the name never points at nothing, the temporary's name then holds
  // the old content); where the file system cannot swap, its content is copied aside
  // first. A crash at any point leaves every target whole, old or new.
  guard.hold();
  enum How { kSwapped, kCopied, kCreated };
  struct Done {
    How how;
    std::string keep;  // what holds the old content: the temporary's name, or the copy's
  };
  std::vector<Done> done;
  const long pause = pause_ms();
  const bool copy = force_copy();
  for (std::size_t k = 0; k < items_.size(); ++k) {
    const int dir = dirs.of(k).fd;
    const std::string name = base_of(items_[k].path);
    const char* tmp = temps[k].c_str();
    struct stat st{};
    int err = 0;
    std::string why;
    if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      if (!copy && ::renameat2(dir, tmp, dir, name.c_str(), RENAME_EXCHANGE) == 0) {
        done.push_back({kSwapped, temps[k]});
      } else if (!copy && errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
        err = errno;
      } else {
        const std::string old = temps[k].substr(0, temps[k].size() - 4) + ".old";
        if (!copy_file(dir, name, old)) {
          err = errno;
          why = "cannot keep a copy of its old content";
        } else if (::renameat(dir, tmp, dir, name.c_str()) != 0) {
          err = errno;
          ::unlinkat(dir, old.c_str(), 0);
        } else {
          done.push_back({kCopied, old});
        }
      }
    } else if (errno != ENOENT) {
      err = errno;
    } else if (::renameat2(dir, tmp, dir, name.c_str(), RENAME_NOREPLACE) == 0 ||
               ((errno == EINVAL || errno == ENOSYS) && ::renameat(dir, tmp, dir, name.c_str()) == 0)) {
      done.push_back({kCreated, ""});
    } else {
      err = errno;
    }
    if (err) {
      // Put back, latest first, every target replaced so far (its old content is in
      // `keep`; a target that did not exist is removed); then the unused temporaries.
      std::string put_back, lost;
      for (std::size_t m = done.size(); m-- > 0;) {
        const int dm = dirs.of(m).fd;
        const std::string nm = base_of(items_[m].path);
        const bool ok = done[m].how == kCreated ? ::unlinkat(dm, nm.c_str(), 0) == 0
                                                : ::renameat(dm, done[m].keep.c_str(), dm, nm.c_str()) == 0;
        const int e = errno;
        if (ok)
          put_back = printable(items_[m].path, 200) + (put_back.empty() ? "" : ", ") + put_back;
        else
          lost += "; could not put back " + printable(items_[m].path, 200) + " (" + errno_text(e) + ")" +
                  (done[m].how == kCreated ? std::string()
                                           : ": its old content is in " + printable(dirs.of(m).path, 200) + "/" +
                                                 done[m].keep + ", which the next run there removes: move it first");
      }
      for (std::size_t m = done.size(); m < items_.size(); ++m) ::unlinkat(dirs.of(m).fd, temps[m].c_str(), 0);
      std::string outcome = done.empty() ? "; no output file was written" : "";
      if (!put_back.empty()) outcome = "; " + put_back + " put back as before" + (lost.empty() ? ": no output file changed" : "");
      fail(items_[k].path, (why.empty() ? "cannot replace it" : why) + " (" + errno_text(err) + ")" + outcome + lost);
    }
    if (pause > 0) ::usleep(useconds_t(pause) * 1000);
  }
  for (std::size_t m = 0; m < done.size(); ++m)
    if (done[m].how != kCreated) ::unlinkat(dirs.of(m).fd, done[m].keep.c_str(), 0);
  dirs.sync();
  items_.clear();
}

}  // namespace fa
