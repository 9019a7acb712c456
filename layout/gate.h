// Quality gates for nl-layout eval --require: "greedy+ls.io_ms <= 0.9 * greedy.io_ms".
// Grammar: side OP side; OP is <=, <, >=, >; a side is a product of factors; a factor is a number or
// LAYOUT.METRIC (layout names as eval prints them, e.g. identity, greedy, greedy+ls).
#pragma once
#include <functional>
#include <string>

namespace nl {

// Metric lookup: returns false if the layout or metric is unknown.
using GateLookup = std::function<bool(const std::string& layout, const std::string& metric, double& value)>;

struct GateResult {
  bool ok = false;
  double lhs = 0, rhs = 0;
  std::string text;  // "greedy+ls.reads <= 0.9 * greedy.reads: 12.3 <= 13.1"
};

// UsageError on a malformed expression or an unknown layout/metric.
GateResult gate_check(const std::string& expr, const GateLookup& lookup);

}  // namespace nl
