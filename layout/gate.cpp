#include "layout/gate.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>

#include "formats/core/error.h"

namespace nl {

namespace {
struct Parser {
  const std::string& s;
  const GateLookup& look;
  size_t i = 0;
  void ws() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw UsageError("--require \"" + s + "\": " + what + " at column " + std::to_string(i + 1));
  }
  double factor() {
    ws();
    if (i >= s.size()) fail("expected a number or LAYOUT.METRIC");
    if (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.') {
      const char* b = s.c_str() + i;
      char* e = nullptr;
      double v = std::strtod(b, &e);
      if (e == b) fail("bad number");
      i += size_t(e - b);
      return v;
    }
    size_t b = i;
    auto name_char = [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '+' || c == '#' || c == '-';
    };
    while (i < s.size() && name_char(s[i])) ++i;
    std::string layout = s.substr(b, i - b);
    if (layout.empty()) fail("expected a number or LAYOUT.METRIC");
    if (i >= s.size() || s[i] != '.') fail("expected '.' after layout name '" + layout + "'");
    ++i;
    size_t mb = i;
    while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '_')) ++i;
    std::string metric = s.substr(mb, i - mb);
    if (metric.empty()) fail("expected a metric name after '" + layout + ".'");
    double v = 0;
    if (!look(layout, metric, v))
      throw UsageError("--require \"" + s + "\": unknown layout or metric '" + layout + "." + metric + "'");
    return v;
  }
  double side() {
    double v = factor();
    for (;;) {
      ws();
      if (i < s.size() && s[i] == '*') {
        ++i;
        v *= factor();
      } else {
        return v;
      }
    }
  }
};
}  // namespace

GateResult gate_check(const std::string& expr, const GateLookup& lookup) {
  Parser p{expr, lookup};
  GateResult r;
  r.lhs = p.side();
  p.ws();
  std::string op;
  if (p.i < expr.size() && (expr[p.i] == '<' || expr[p.i] == '>')) {
    op.push_back(expr[p.i++]);
    if (p.i < expr.size() && expr[p.i] == '=') op.push_back(expr[p.i++]);
  } else {
    p.fail("expected <=, <, >= or >");
  }
  r.rhs = p.side();
  p.ws();
  if (p.i != expr.size()) p.fail("unexpected text");
  if (op == "<=")
    r.ok = r.lhs <= r.rhs;
  else if (op == "<")
    r.ok = r.lhs < r.rhs;
  else if (op == ">=")
    r.ok = r.lhs >= r.rhs;
  else
    r.ok = r.lhs > r.rhs;
  char buf[128];
  std::snprintf(buf, sizeof buf, ": %.6g %s %.6g", r.lhs, op.c_str(), r.rhs);
  r.text = expr + buf;
  return r;
}

}  // namespace nl
