#include "cli/common.h"

#include <dirent.h>
#include <omp.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <new>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "formats/core/progress.h"
#include "nl_version.h"
#include "runtime/memory.h"

namespace nl::cli {

uint64_t parse_uint_arg(const std::string& option, const std::string& text, uint64_t lo, uint64_t hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
    throw UsageError(option + ": '" + text + "' is not a non-negative integer");
  uint64_t v = 0;
  for (char ch : text) {
    const uint64_t d = uint64_t(ch - '0');
    if (v > (UINT64_MAX - d) / 10) throw UsageError(option + ": '" + text + "' is out of range " + range);
    v = v * 10 + d;
  }
  if (v < lo || v > hi) throw UsageError(option + ": '" + text + "' is out of range " + range);
  return v;
}

double parse_double_arg(const std::string& option, const std::string& text, double lo, double hi) {
  if (std::string p = float_arg_problem(text); !p.empty()) throw UsageError(option + ": '" + text + "' " + p);
  const double v = std::strtod(text.c_str(), nullptr);
  if (!(v >= lo && v <= hi))
    throw UsageError(option + ": '" + text + "' is out of range [" + CLI::detail::to_string(lo) + ", " +
                     CLI::detail::to_string(hi) + "]");
  return v;
}

void require_memory(const std::string& what, uint64_t bytes) {
  const uint64_t avail = mem_available_bytes();
  if (!avail || bytes <= avail) return;  // unknown: the allocation itself reports a refusal (exit 4)
  throw IoError(what, "needs about " + format_bytes(bytes) + " of memory and MemAvailable is " + format_bytes(avail) +
                          ": refused before starting");
}

namespace {
// Every FLOAT option of `app` and its subcommands gets the finite-number check (CLI::Range compares, so NaN passes
// it; "inf" and subnormals make no sense for any option of these binaries).
void check_float_options(CLI::App* app) {
  for (CLI::Option* o : app->get_options()) {
    if (o->get_type_name().rfind("FLOAT", 0) != 0) continue;
    o->check(CLI::Validator(
        [](std::string& v) {
          const std::string p = float_arg_problem(v);
          return p.empty() ? std::string() : "'" + v + "' " + p;
        },
        "", "FINITE"));
  }
  for (CLI::App* sub : app->get_subcommands({})) check_float_options(sub);
}
}  // namespace

void add_global_options(CLI::App& app, GlobalOptions& g) {
  app.add_flag("-q,--quiet", g.quiet, "Print no progress or informational lines")->group("Global");
  app.add_flag("--json", g.json, "Print machine-readable JSON on stdout where figures are printed")->group("Global");
  app.add_option("--threads", g.threads, "Worker threads (0 = all cores, at most " + std::to_string(kMaxThreads) + ")")
      ->check(CLI::Range(0, kMaxThreads))
      ->group("Global");
}

namespace {

// The stack size libgomp gives its threads: OMP_STACKSIZE, else GOMP_STACKSIZE ("N[BKMG]", K when no unit, as
// libgomp's parse_stacksize reads them), else 0 = the pthread default, which libgomp then uses too.
size_t omp_stack_bytes() {
  for (const char* var : {"OMP_STACKSIZE", "GOMP_STACKSIZE"}) {
    const char* v = std::getenv(var);
    if (!v) continue;
    while (std::isspace(static_cast<unsigned char>(*v))) ++v;
    if (!std::isdigit(static_cast<unsigned char>(*v))) continue;
    char* end = nullptr;
    errno = 0;
    const unsigned long long n = std::strtoull(v, &end, 10);
    while (std::isspace(static_cast<unsigned char>(*end))) ++end;
    int shift = 10;
    if (*end) {
      switch (std::tolower(static_cast<unsigned char>(*end++))) {
        case 'b':
          shift = 0;
          break;
        case 'k':
          shift = 10;
          break;
        case 'm':
          shift = 20;
          break;
        case 'g':
          shift = 30;
          break;
        default:
          continue;
      }
      while (std::isspace(static_cast<unsigned char>(*end))) ++end;
      if (*end) continue;
    }
    if (errno != 0 || ((n << shift) >> shift) != n) continue;  // libgomp ignores what it cannot read
    return size_t(n << shift);
  }
  return 0;
}

// Creates n - 1 threads with libgomp's stack size, all alive at once as a team's are, then ends them. Returns 0, or
// the index of the first thread the system refused and its errno.
std::pair<int, int> try_create_threads(int n) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  if (const size_t stack = omp_stack_bytes()) pthread_attr_setstacksize(&attr, stack);
  std::vector<pthread_t> made;
  std::pair<int, int> refused{0, 0};
  for (int i = 1; i < n; ++i) {
    pthread_t t;
    const int err = pthread_create(
        &t, &attr, [](void*) -> void* { return nullptr; }, nullptr);
    if (err != 0) {
      refused = {i + 1, err};
      break;
    }
    made.push_back(t);
  }
  for (pthread_t t : made) pthread_join(t, nullptr);
  pthread_attr_destroy(&attr);
  return refused;
}

}  // namespace

void apply_global_options(const GlobalOptions& g) {
  Progress::set_quiet(g.quiet);
  if (g.threads > 0) {
    omp_set_num_threads(g.threads);
  } else if (omp_get_max_threads() > kMaxThreads) {
    // "All cores" means at most kMaxThreads; an explicit OMP_NUM_THREADS beyond it is refused like --threads.
    if (const char* env = std::getenv("OMP_NUM_THREADS"))
      throw UsageError("OMP_NUM_THREADS=" + std::string(env) + ": at most " + std::to_string(kMaxThreads) +
                       " threads (--threads)");
    omp_set_num_threads(kMaxThreads);
  }
  const int n = omp_get_max_threads();
  if (n <= 1) return;
  const auto [refused, err] = try_create_threads(n);
  const char* env = std::getenv("OMP_NUM_THREADS");
  if (refused)
    throw IoError(g.threads > 0 ? "--threads " + std::to_string(n)
                  : env         ? "OMP_NUM_THREADS=" + std::string(env)
                                : std::to_string(n) + " threads (all cores)",
                  "the system refused to create thread " + std::to_string(refused) + " (" + std::strerror(err) +
                      "); use fewer threads");
    // Start the team now, while it is known to fit; later parallel regions reuse these threads.
#pragma omp parallel num_threads(n)
  {}
}

void warn_empty_prompt(const std::string& binary) {
  std::fprintf(stderr, "%s: warning: --prompt is empty: generating from BOS alone (as llama.cpp does)\n",
               binary.c_str());
}

namespace {

struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  std::string name;  // set for an output that does not exist yet: (dev, ino) are its folder's
  bool operator==(const FileId& o) const { return dev == o.dev && ino == o.ino && name == o.name; }
};

std::string folder_of(const std::string& p) {
  auto pos = p.find_last_of('/');
  if (pos == std::string::npos) return ".";
  if (pos == 0) return "/";
  return p.substr(0, pos);
}
std::string name_of(const std::string& p) {
  auto pos = p.find_last_of('/');
  return pos == std::string::npos ? p : p.substr(pos + 1);
}
std::string quoted(const NamedPath& n) { return n.option + " " + n.path; }

}  // namespace

void check_paths(const std::vector<NamedPath>& inputs, const std::vector<NamedPath>& outputs) {
  std::vector<std::pair<FileId, NamedPath>> seen;
  auto add_input_file = [&](const NamedPath& n, const std::string& path, const struct stat& st) {
    const std::string kind = file_kind_name(st.st_mode);
    if (!kind.empty()) throw InputError(path, "is " + kind + ", not a regular file (" + n.option + ")");
    seen.push_back({FileId{st.st_dev, st.st_ino, ""}, {n.option, path}});
  };
  for (const NamedPath& n : inputs) {
    if (n.path.empty()) continue;
    struct stat st {};
    if (::stat(n.path.c_str(), &st) != 0) continue;  // the reader reports a missing input in its own words
    if (!S_ISDIR(st.st_mode)) {
      add_input_file(n, n.path, st);
      continue;
    }
    DIR* d = ::opendir(n.path.c_str());
    if (!d) continue;
    while (dirent* e = ::readdir(d)) {
      const std::string p = n.path + "/" + e->d_name;
      struct stat fs {};
      if (e->d_name[0] == '.' || ::stat(p.c_str(), &fs) != 0 || S_ISDIR(fs.st_mode)) continue;
      if (S_ISREG(fs.st_mode)) seen.push_back({FileId{fs.st_dev, fs.st_ino, ""}, {n.option, p}});
    }
    ::closedir(d);
  }
  for (const NamedPath& n : outputs) {
    if (n.path.empty()) continue;
    const std::string folder = folder_of(n.path);
    struct stat ds {};
    if (::stat(folder.c_str(), &ds) != 0 || !S_ISDIR(ds.st_mode))
      throw UsageError(quoted(n) + ": the folder " + folder + " does not exist");
    if (::access(folder.c_str(), W_OK) != 0) throw IoError(folder, errno_text("cannot write there (" + n.option + ")"));
    FileId id;
    struct stat st {};
    if (::stat(n.path.c_str(), &st) == 0) {
      const std::string kind = file_kind_name(st.st_mode);
      if (!kind.empty()) throw UsageError(quoted(n) + " is " + kind + ", not a file this command may replace");
      id = FileId{st.st_dev, st.st_ino, ""};
    } else {
      id = FileId{ds.st_dev, ds.st_ino, name_of(n.path)};
    }
    for (const auto& [other_id, other] : seen)
      if (other_id == id)
        throw UsageError(quoted(n) + " is the same file as " + quoted(other) + ": refusing to overwrite it");
    seen.push_back({id, n});
  }
}

std::vector<NamedPath> named_paths(const std::string& option, const std::vector<std::string>& paths) {
  std::vector<NamedPath> r;
  for (const std::string& p : paths) r.push_back({option, p});
  return r;
}

std::vector<NamedPath> hf_folder_outputs(const std::string& option, const std::string& folder) {
  struct stat st {};
  // A folder still to be created holds no input; only its parent must exist.
  if (::stat(folder.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return {{option, folder}};
  return {{option, folder + "/config.json"}, {option, folder + "/model.safetensors"}};
}

std::string utf8_for_json(const std::string& s, InvalidUtf8 mode) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 0x2;
    if (ok && n > 1) {  // no overlong forms, surrogates or code points past U+10FFFF
      uint32_t cp = c & (0x7F >> n);
      for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
      ok = cp >= (n == 2 ? 0x80u : n == 3 ? 0x800u : 0x10000u) && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    }
    if (ok) {
      out.append(s, i, n);
      i += n;
      continue;
    }
    if (mode == InvalidUtf8::kEscape) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    } else {
      out += "\xEF\xBF\xBD";
    }
    ++i;
  }
  return out;
}

namespace {
// A copy of `j` with every string and key passed through utf8_for_json.
nlohmann::json utf8_clean(const nlohmann::json& j, InvalidUtf8 mode) {
  if (j.is_string()) return utf8_for_json(j.get_ref<const std::string&>(), mode);
  if (j.is_array()) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& x : j) a.push_back(utf8_clean(x, mode));
    return a;
  }
  if (j.is_object()) {
    nlohmann::json o = nlohmann::json::object();
    for (auto it = j.begin(); it != j.end(); ++it) o[utf8_for_json(it.key(), mode)] = utf8_clean(it.value(), mode);
    return o;
  }
  return j;
}
}  // namespace

std::string json_dump(const nlohmann::json& j, int indent, InvalidUtf8 mode) {
  return utf8_clean(j, mode).dump(indent);
}

std::string printable(const std::string& s) {
  static const char* hex = "0123456789abcdef";
  std::string r;
  r.reserve(s.size());
  auto esc = [&](unsigned char c) { r += std::string("\\x") + hex[c >> 4] + hex[c & 15]; };
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      r += char(c);
      ++i;
      continue;
    }
    // A well-formed UTF-8 sequence (a file name in another script) is kept; anything else is escaped byte by byte.
    size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
    if (ok && len == 3) {  // no overlong forms, no surrogates
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      ok = !(c == 0xe0 && c1 < 0xa0) && !(c == 0xed && c1 >= 0xa0);
    }
    if (ok && len == 4) {
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      ok = !(c == 0xf0 && c1 < 0x90) && !(c == 0xf4 && c1 >= 0x90);
    }
    if (ok) {
      r.append(s, i, len);
      i += len;
    } else {
      esc(c);
      ++i;
    }
  }
  return r;
}

void info(const GlobalOptions& g, const std::string& line) {
  if (!g.quiet) std::fprintf(stderr, "%s\n", line.c_str());
}

namespace {
// Standard output is a command's product too: a write that failed (a full disk, /dev/full, a closed pipe's EIO) is
// exit 4, as cat and jq do, never exit 0 with the output lost.
int finish_stdout(const std::string& name) {
  std::cout.flush();
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int err = errno;
  if (flushed && !std::ferror(stdout) && !std::cout.fail()) return kExitOk;
  std::fprintf(stderr, "%s: error: standard output: %s\n", name.c_str(),
               err ? std::strerror(err) : "a write failed (output lost)");
  return kExitIo;
}
}  // namespace

int run_main(const std::string& name, const std::string& description, int argc, char** argv,
             const std::function<void(CLI::App&)>& setup) {
  try {
    install_cleanup_signal_handlers();  // SIGINT/SIGTERM remove temporary outputs; out of memory in a thread: exit 4
    CLI::App app(description, name);
    app.set_version_flag("-V,--version", name + " " + NL_VERSION);
    app.require_subcommand(1);
    app.fallthrough();
    setup(app);
    check_float_options(&app);
    int rc = kExitOk;
    try {
      app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
      rc = app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
      rc = app.exit(e);
    } catch (const CLI::CallForVersion& e) {
      rc = app.exit(e);
    } catch (const CLI::Success&) {  // a query option that printed its answer (nl-layout pack --list-synthetic-models)
    } catch (const CLI::ParseError& e) {
      std::fprintf(stderr, "%s: error: %s (run '%s --help')\n", name.c_str(), printable(e.what()).c_str(),
                   name.c_str());
      return kExitUsage;
    }
    return rc == kExitOk ? finish_stdout(name) : rc;
  } catch (const Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: %s\n", name.c_str(), printable(e.what()).c_str());
    return e.exit_code();
  } catch (const std::bad_alloc&) {
    // The system refused memory an input asked for: an I/O-class failure, not a bug (docs/cli.md).
    std::fprintf(stderr, "%s: error: out of memory\n", name.c_str());
    return kExitIo;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", name.c_str(), printable(e.what()).c_str());
    return kExitInternal;
  }
}

}  // namespace nl::cli
