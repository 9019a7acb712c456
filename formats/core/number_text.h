// Numbers written as text: the one check of a floating-point value given on a command line or through the C API.
#pragma once
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

namespace nl {

// What is wrong with `text` as a floating-point value ("" when it is a finite, normal-or-zero number written whole):
// the check every FLOAT option of the three binaries gets (CLI::Range lets NaN through), and selection_parse's.
inline std::string float_arg_problem(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return "is not a number";
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0') return "is not a number";
  if (std::isnan(v)) return "is not a number (NaN)";
  if (std::isinf(v)) return "is not a finite number";
  if (std::fpclassify(v) == FP_SUBNORMAL || (v == 0 && errno == ERANGE))  // strtod's underflow
    return "is too close to zero (below the smallest normal double; use 0 or a larger value)";
  return "";
}

}  // namespace nl
