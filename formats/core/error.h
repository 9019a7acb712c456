// Typed errors shared by every module. Each binary catches them once (cli/common.h) and turns them into
// one line on stderr and the documented exit code (docs/cli.md "Exit codes").
#pragma once
#include <stdexcept>
#include <string>

namespace nl {

enum ExitCode : int {
  kExitOk = 0,
  kExitInternal = 1,  // a bug: an invariant did not hold
  kExitUsage = 2,     // bad command line
  kExitInput = 3,     // a malformed or inconsistent input file
  kExitIo = 4,        // the operating system refused a read or write
  kExitGate = 5,      // a quality gate (nl-layout eval --require) was violated
};

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  virtual int exit_code() const = 0;
};

class UsageError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return kExitUsage; }
};

// A file whose content is wrong. The message names the file: "<path>: <what is wrong>".
class InputError : public Error {
 public:
  InputError(const std::string& path, const std::string& what) : Error(one_line(path + ": " + what)) {}
  int exit_code() const override { return kExitInput; }
  // File content quoted in a message (an attribute, a key) may hold control characters; the error stays one line.
  static std::string one_line(std::string s) {
    for (char& c : s)
      if (c == '\n' || c == '\r') c = ' ';
    return s;
  }
};

// The OS failed us (open, read, write, fsync, rename). The message names the file and errno text.
class IoError : public Error {
 public:
  IoError(const std::string& path, const std::string& what) : Error(path + ": " + what) {}
  int exit_code() const override { return kExitIo; }
};

class GateError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return kExitGate; }
};

class InternalError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return kExitInternal; }
};

// "<what>: <strerror(errno)>" for the current errno.
std::string errno_text(const std::string& what);

}  // namespace nl
