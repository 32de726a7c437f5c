// fake_nvrtc.cpp — libnvrtc.so for machines without CUDA.
//
// Every exported function has the C prototype of the NVRTC entry point it
// is named after. "Compiling" does not generate code (fake_cuda.cpp runs
// kernels through the CPU emulator, by name); it does what a test of the
// backend needs from a compiler:
//
//   - the options are checked: each must start with '-', and the target
//     comes from --gpu-architecture=ARCH or -arch=ARCH (or the option
//     followed by ARCH as the next entry). A real architecture (sm_XY) gives
//     a CUBIN; a virtual one (compute_XY), or none, compiles but gives an
//     empty CUBIN, as NVRTC does;
//   - an #error directive outside any #if block fails the compilation with
//     NVRTC_ERROR_COMPILATION and a log in NVRTC's format that names the
//     file and line, honouring #line directives ("k.cu(3): error: #error
//     directive: ..."), so the backend's error path can be tested;
//   - two extern "C" kernels with the same name fail the same way;
//   - the CUBIN is a text image that fake_cuda.cpp's cuModuleLoadData reads:
//       GCFAKECUBIN 1\n arch sm_90\n kernel <name>[\t<param type>]...\n ...
//       source <bytes>\n<the source>\n end\n NUL
//     listing every extern "C" __global__ function of the source (comments,
//     strings and preprocessor lines skipped) with its parameters' C types,
//     so that loading a kernel the source does not define fails as it would
//     on a GPU. The source travels with the image: a kernel the emulator's
//     table does not hold (one a backend generates at run time) is built
//     from it by the driver when it is first launched (fake_cuda.cpp).

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>
#include <set>
#include <string>
#include <vector>

typedef int nvrtcResult;

namespace {

enum : int {
  NVRTC_SUCCESS = 0,
  NVRTC_ERROR_OUT_OF_MEMORY = 1,
  NVRTC_ERROR_PROGRAM_CREATION_FAILURE = 2,
  NVRTC_ERROR_INVALID_INPUT = 3,
  NVRTC_ERROR_INVALID_PROGRAM = 4,
  NVRTC_ERROR_INVALID_OPTION = 5,
  NVRTC_ERROR_COMPILATION = 6,
  NVRTC_ERROR_BUILTIN_OPERATION_FAILURE = 7,
  NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION = 8,
  NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION = 9,
  NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID = 10,
  NVRTC_ERROR_INTERNAL_ERROR = 11,
  NVRTC_ERROR_TIME_FILE_WRITE_FAILED = 12,
};

struct Program {
  std::string src;
  std::string name;
  std::string log;
  std::string cubin;  // empty until a compilation for a real architecture
  bool compiled = false;
};

std::mutex mu;
std::set<Program*> programs;

bool live(Program* p) {
  std::lock_guard<std::mutex> g(mu);
  return programs.count(p) != 0;
}

// A position in the user's terms: the file and line #line directives say.
struct Where {
  std::string file;
  int line;
};

// Token is a lexical token of the source, with where it starts.
struct Token {
  enum Kind { Ident, String, Punct } kind;
  std::string text;
  size_t line;  // physical line, 1-based
};

// Source maps physical lines to the file and line #line directives name,
// finds #error directives outside conditionals, and cuts the rest into
// tokens.
struct Source {
  std::vector<Where> where;  // by physical line - 1
  std::vector<std::pair<size_t, std::string>> errors;  // physical line, text
  std::vector<Token> tokens;
};

bool ident_start(char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool ident_char(char c) { return ident_start(c) || (c >= '0' && c <= '9'); }

// directive handles one preprocessor line (text after '#', continuation
// lines joined). depth counts the open #if blocks.
void directive(Source& out, const std::string& d, size_t phys, int& depth, std::string& file, int& next_line) {
  size_t i = 0;
  while (i < d.size() && (d[i] == ' ' || d[i] == '\t')) i++;
  size_t j = i;
  while (j < d.size() && ident_char(d[j])) j++;
  const std::string word = d.substr(i, j - i);
  std::string rest = d.substr(j);
  while (!rest.empty() && (rest[0] == ' ' || rest[0] == '\t')) rest.erase(0, 1);
  while (!rest.empty() && (rest.back() == ' ' || rest.back() == '\t' || rest.back() == '\r')) rest.pop_back();
  if (word == "if" || word == "ifdef" || word == "ifndef") {
    depth++;
  } else if (word == "endif") {
    if (depth > 0) depth--;
  } else if (word == "error" && depth == 0) {
    out.errors.push_back({phys, rest});
  } else if (word == "line" || (word.empty() && j < d.size() && d[j] >= '0' && d[j] <= '9')) {
    // #line N "file" (or the GNU form # N "file"): the next line is N.
    const char* p = word.empty() ? d.c_str() + j : rest.c_str();
    char* end = nullptr;
    long n = strtol(p, &end, 10);
    if (end != p && n > 0) {
      next_line = (int)n;
      const char* q = strchr(end, '"');
      if (q) {
        const char* r = strchr(q + 1, '"');
        if (r) file.assign(q + 1, (size_t)(r - q - 1));
      }
    }
  }
}

Source scan(const std::string& src, const std::string& name) {
  Source out;
  std::string file = name;
  int line = 1;
  int depth = 0;
  size_t phys = 1;
  bool line_start = true;  // only blanks so far on this physical line
  const size_t n = src.size();
  size_t i = 0;
  out.where.push_back({file, line});
  auto newline = [&](int next) {
    phys++;
    line = next;
    out.where.push_back({file, line});
    line_start = true;
  };
  while (i < n) {
    const char c = src[i];
    if (c == '\n') {
      i++;
      newline(line + 1);
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
      i++;
      continue;
    }
    if (c == '#' && line_start) {
      // Collect the directive with its continuation lines.
      std::string d;
      const size_t at = phys;
      i++;
      size_t extra = 0;
      while (i < n && src[i] != '\n') {
        if (src[i] == '\\' && i + 1 < n && src[i + 1] == '\n') {
          i += 2;
          extra++;
          continue;
        }
        d += src[i++];
      }
      int next_line = -1;
      directive(out, d, at, depth, file, next_line);
      for (size_t k = 0; k < extra; k++) newline(line + 1);
      if (i < n) i++;  // the newline
      newline(next_line > 0 ? next_line : line + 1);
      continue;
    }
    line_start = false;
    if (c == '/' && i + 1 < n && src[i + 1] == '/') {
      while (i < n && src[i] != '\n') i++;
      continue;
    }
    if (c == '/' && i + 1 < n && src[i + 1] == '*') {
      i += 2;
      while (i < n && !(src[i] == '*' && i + 1 < n && src[i + 1] == '/')) {
        if (src[i] == '\n') {
          newline(line + 1);
          line_start = false;
        }
        i++;
      }
      i = i + 2 < n ? i + 2 : n;
      continue;
    }
    if (c == '"' || c == '\'') {
      const size_t start = i++;
      while (i < n && src[i] != c && src[i] != '\n') i += src[i] == '\\' ? 2 : 1;
      if (i < n && src[i] == c) i++;
      if (c == '"') out.tokens.push_back({Token::String, src.substr(start, i - start), phys});
      continue;
    }
    if (ident_start(c)) {
      const size_t start = i;
      while (i < n && ident_char(src[i])) i++;
      out.tokens.push_back({Token::Ident, src.substr(start, i - start), phys});
      continue;
    }
    out.tokens.push_back({Token::Punct, std::string(1, c), phys});
    i++;
  }
  return out;
}

// Attribute-like keywords whose parenthesized argument comes before a
// kernel's name.
bool is_attribute(const std::string& t) {
  return t == "__launch_bounds__" || t == "__attribute__" || t == "__declspec" || t == "alignas" ||
         t == "__cluster_dims__" || t == "__maxnreg__";
}

// kernel_at reads a declaration starting at tokens[i] (just after `extern
// "C"` or at a declaration inside an extern "C" block) and returns the
// index of its name token if it declares a __global__ function, or -1.
long kernel_at(const std::vector<Token>& t, size_t i) {
  bool global = false;
  long last_ident = -1;
  for (; i < t.size(); i++) {
    const Token& k = t[i];
    if (k.kind == Token::Punct && (k.text == ";" || k.text == "{" || k.text == "}" || k.text == "=")) return -1;
    if (k.kind == Token::Ident && is_attribute(k.text)) {
      // Skip the balanced parentheses that follow.
      size_t j = i + 1;
      int parens = 0;
      for (; j < t.size(); j++) {
        if (t[j].text == "(") parens++;
        if (t[j].text == ")" && --parens == 0) break;
      }
      i = j;
      continue;
    }
    if (k.kind == Token::Ident) {
      if (k.text == "__global__") global = true;
      last_ident = (long)i;
      continue;
    }
    if (k.text == "(") return global ? last_ident : -1;
  }
  return -1;
}

// kernels lists the extern "C" __global__ functions' name tokens, as
// indices into t.
std::vector<size_t> kernels(const std::vector<Token>& t) {
  std::vector<size_t> out;
  for (size_t i = 0; i + 1 < t.size(); i++) {
    if (!(t[i].kind == Token::Ident && t[i].text == "extern" && t[i + 1].kind == Token::String &&
          t[i + 1].text == "\"C\"")) {
      continue;
    }
    size_t j = i + 2;
    if (j < t.size() && t[j].text == "{") {
      // extern "C" { ... }: every declaration at the block's top level.
      int depth = 1;
      bool decl_start = true;
      for (j++; j < t.size() && depth > 0; j++) {
        const std::string& x = t[j].text;
        if (decl_start && depth == 1) {
          long k = kernel_at(t, j);
          if (k >= 0) out.push_back((size_t)k);
        }
        decl_start = false;
        if (x == "{") depth++;
        if (x == "}") {
          depth--;
          decl_start = depth == 1;
        }
        if (x == ";" && depth == 1) decl_start = true;
      }
      i = j - 1;
      continue;
    }
    long k = kernel_at(t, j);
    if (k >= 0) out.push_back((size_t)k);
  }
  return out;
}

// param_types reads the parameter list after the kernel name at t[name]
// and returns each parameter's C type as a declaration spells it, without
// the parameter's name ("const float*", "long long"). A list of one
// "void", or none, has no parameters.
std::vector<std::string> param_types(const std::vector<Token>& t, size_t name) {
  std::vector<std::string> out;
  size_t i = name + 1;
  if (i >= t.size() || t[i].text != "(") return out;
  std::vector<std::vector<const Token*>> params(1);
  int depth = 1;
  for (i++; i < t.size(); i++) {
    const std::string& x = t[i].text;
    if (x == "(" || x == "[" || x == "<") depth++;
    if (x == ")" || x == "]" || x == ">") {
      if (--depth == 0) break;
    }
    if (x == "," && depth == 1) {
      params.emplace_back();
      continue;
    }
    params.back().push_back(&t[i]);
  }
  for (const auto& p : params) {
    size_t n = p.size();
    if (n == 0 || (n == 1 && p[0]->text == "void")) continue;
    // The last identifier after a type is the parameter's name.
    if (n > 1 && p[n - 1]->kind == Token::Ident) n--;
    std::string ty;
    for (size_t k = 0; k < n; k++) {
      const std::string& x = p[k]->text;
      if (!ty.empty() && x != "*" && x != "&") ty += ' ';
      ty += x;
    }
    out.push_back(ty);
  }
  return out;
}

std::string where(const Source& s, size_t phys) {
  const Where& w = s.where[phys - 1 < s.where.size() ? phys - 1 : s.where.size() - 1];
  return w.file + "(" + std::to_string(w.line) + ")";
}

// arch_option extracts the architecture from the options; 0 if none, -1
// (with *bad set) if an option is malformed.
int arch_option(int n, const char* const* opts, std::string* arch, std::string* bad) {
  for (int i = 0; i < n; i++) {
    const char* o = opts[i];
    if (!o || o[0] != '-') {
      *bad = o ? o : "(null)";
      return -1;
    }
    static const char* const prefixes[] = {"--gpu-architecture=", "-arch=", "--gpu-architecture", "-arch"};
    for (const char* p : prefixes) {
      const size_t len = strlen(p);
      if (strncmp(o, p, len) != 0) continue;
      if (o[len] == '\0' && p[len - 1] != '=') {
        // The value is the next option.
        if (i + 1 >= n || !opts[i + 1]) {
          *bad = o;
          return -1;
        }
        *arch = opts[++i];
      } else if (p[len - 1] == '=') {
        *arch = o + len;
        if (arch->empty()) {
          *bad = o;
          return -1;
        }
      } else {
        continue;  // "-architecture-foo" is not this option
      }
      break;
    }
  }
  return arch->empty() ? 0 : 1;
}

// valid_arch accepts sm_XY and compute_XY with an optional a/f suffix.
bool valid_arch(const std::string& a, bool* real) {
  size_t i;
  if (a.compare(0, 3, "sm_") == 0) {
    *real = true;
    i = 3;
  } else if (a.compare(0, 8, "compute_") == 0) {
    *real = false;
    i = 8;
  } else {
    return false;
  }
  size_t digits = 0;
  while (i < a.size() && a[i] >= '0' && a[i] <= '9') i++, digits++;
  if (digits < 2 || digits > 3) return false;
  return i == a.size() || (i + 1 == a.size() && (a[i] == 'a' || a[i] == 'f'));
}

}  // namespace

extern "C" {

nvrtcResult nvrtcVersion(int* major, int* minor) {
  if (!major || !minor) return NVRTC_ERROR_INVALID_INPUT;
  *major = 12;
  *minor = 8;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcCreateProgram(Program** prog, const char* src, const char* name, int num_headers,
                               const char* const* headers, const char* const* include_names) {
  if (!prog || !src) return NVRTC_ERROR_INVALID_INPUT;
  if (num_headers < 0 || (num_headers > 0 && (!headers || !include_names))) return NVRTC_ERROR_INVALID_INPUT;
  Program* p = new Program;
  p->src = src;
  p->name = name && *name ? name : "default_program";
  std::lock_guard<std::mutex> g(mu);
  programs.insert(p);
  *prog = p;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcDestroyProgram(Program** prog) {
  if (!prog) return NVRTC_ERROR_INVALID_INPUT;
  std::lock_guard<std::mutex> g(mu);
  if (!programs.erase(*prog)) return NVRTC_ERROR_INVALID_PROGRAM;
  delete *prog;
  *prog = nullptr;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcCompileProgram(Program* p, int num_options, const char* const* options) {
  if (!live(p)) return NVRTC_ERROR_INVALID_PROGRAM;
  if (num_options < 0 || (num_options > 0 && !options)) return NVRTC_ERROR_INVALID_INPUT;
  p->compiled = false;
  p->cubin.clear();
  std::string arch, bad;
  if (arch_option(num_options, options, &arch, &bad) < 0) {
    p->log = "nvrtc: error: invalid option \"" + bad + "\"\n";
    return NVRTC_ERROR_INVALID_OPTION;
  }
  bool real = false;
  if (arch.empty()) {
    arch = "compute_52";  // NVRTC's default target: virtual, so no CUBIN
  }
  if (!valid_arch(arch, &real)) {
    p->log = "nvrtc: error: invalid value \"" + arch + "\" for option --gpu-architecture (-arch)\n";
    return NVRTC_ERROR_INVALID_OPTION;
  }

  const Source s = scan(p->src, p->name);
  std::string log;
  int errors = 0;
  for (const auto& e : s.errors) {
    log += where(s, e.first) + ": error: #error directive: " + e.second + "\n\n";
    errors++;
  }
  const std::vector<size_t> names = kernels(s.tokens);
  std::set<std::string> seen;
  for (size_t i : names) {
    const Token* k = &s.tokens[i];
    if (!seen.insert(k->text).second) {
      log += where(s, k->line) + ": error: function \"" + k->text + "\" has already been defined\n\n";
      errors++;
    }
  }
  if (errors > 0) {
    log += std::to_string(errors) + (errors == 1 ? " error" : " errors") + " detected in the compilation of \"" +
           p->name + "\".\n";
    p->log = log;
    return NVRTC_ERROR_COMPILATION;
  }
  p->log.clear();
  p->compiled = true;
  if (real) {
    std::string img = "GCFAKECUBIN 1\narch " + arch + "\n";
    for (size_t i : names) {
      img += "kernel " + s.tokens[i].text;
      for (const std::string& ty : param_types(s.tokens, i)) img += "\t" + ty;
      img += "\n";
    }
    img += "source " + std::to_string(p->src.size()) + "\n" + p->src + "\n";
    img += "end\n";
    img.push_back('\0');
    p->cubin = img;
  }
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetProgramLogSize(Program* p, size_t* n) {
  if (!live(p)) return NVRTC_ERROR_INVALID_PROGRAM;
  if (!n) return NVRTC_ERROR_INVALID_INPUT;
  *n = p->log.size() + 1;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetProgramLog(Program* p, char* log) {
  if (!live(p)) return NVRTC_ERROR_INVALID_PROGRAM;
  if (!log) return NVRTC_ERROR_INVALID_INPUT;
  memcpy(log, p->log.c_str(), p->log.size() + 1);
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetCUBINSize(Program* p, size_t* n) {
  if (!live(p)) return NVRTC_ERROR_INVALID_PROGRAM;
  if (!n) return NVRTC_ERROR_INVALID_INPUT;
  if (!p->compiled) return NVRTC_ERROR_INVALID_PROGRAM;
  *n = p->cubin.size();
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetCUBIN(Program* p, char* out) {
  if (!live(p)) return NVRTC_ERROR_INVALID_PROGRAM;
  if (!out) return NVRTC_ERROR_INVALID_INPUT;
  if (!p->compiled) return NVRTC_ERROR_INVALID_PROGRAM;
  memcpy(out, p->cubin.data(), p->cubin.size());
  return NVRTC_SUCCESS;
}

const char* nvrtcGetErrorString(nvrtcResult r) {
  switch (r) {
    case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
    case NVRTC_ERROR_OUT_OF_MEMORY: return "NVRTC_ERROR_OUT_OF_MEMORY";
    case NVRTC_ERROR_PROGRAM_CREATION_FAILURE: return "NVRTC_ERROR_PROGRAM_CREATION_FAILURE";
    case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
    case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
    case NVRTC_ERROR_INVALID_OPTION: return "NVRTC_ERROR_INVALID_OPTION";
    case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
    case NVRTC_ERROR_BUILTIN_OPERATION_FAILURE: return "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE";
    case NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION: return "NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION";
    case NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION: return "NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION";
    case NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID: return "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID";
    case NVRTC_ERROR_INTERNAL_ERROR: return "NVRTC_ERROR_INTERNAL_ERROR";
    case NVRTC_ERROR_TIME_FILE_WRITE_FAILED: return "NVRTC_ERROR_TIME_FILE_WRITE_FAILED";
  }
  return "NVRTC_ERROR unknown";
}

}  // extern "C"
