// The solve's cost estimate (layout/solve_cost.h) against the cost curve it was fitted on (bench/solve_cost_curve.csv,
// measured by bench/solve_cost_curve.sh): issue 58 asks the printed estimate to be within 30 % of the measured time on
// the curve's points. A refit must update the constants and the CSV together, or this fails.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "layout/solve_cost.h"
#include "runtime/device.h"

using namespace nl;

namespace {
struct Point {
  uint32_t neurons = 0;
  uint64_t tokens = 0;
  double wall = 0, peak_bytes = 0, density = 0;
};
std::vector<Point> curve() {
  std::ifstream in(std::string(NL_SOURCE_DIR) + "/bench/solve_cost_curve.csv");
  REQUIRE(in.good());
  std::string line;
  std::getline(in, line);
  REQUIRE(line == "neurons,tokens,wall_s,user_s,sys_s,peak_kib,count_s,select_s,solve_phases_s,density,preset");
  std::vector<Point> out;
  while (std::getline(in, line)) {
    std::stringstream ss(line);
    std::string f;
    std::vector<std::string> v;
    while (std::getline(ss, f, ',')) v.push_back(f);
    REQUIRE(v.size() == 11);
    out.push_back(
        {uint32_t(std::stoul(v[0])), std::stoull(v[1]), std::stod(v[2]), std::stod(v[5]) * 1024, std::stod(v[9])});
  }
  return out;
}
// The objective nl-layout solve runs with by default (cli/layout_options.cpp eval_config_from): the built-in UFS 4.0
// device, bundles of the default size for the width, a 5 % cache.
SolveOptions solve_defaults() {
  SolveOptions o;
  o.eval.device = default_device();
  o.eval.bundle_bytes = 0;
  o.eval.cache_ratio = 0.05;
  return o;
}
}  // namespace

TEST_CASE("the estimate is within 30 % of every measured point of the cost curve (one layer, one thread)") {
  const std::vector<Point> pts = curve();
  CHECK(pts.size() == 15);
  const SolveOptions o = solve_defaults();  // what the curve ran with
  for (const Point& p : pts) {
    const SolveCostEstimate e = estimate_solve_cost({p.neurons}, p.tokens, p.density, 1, o);
    INFO("neurons " << p.neurons << " tokens " << p.tokens << " density " << p.density << ": measured " << p.wall
                    << " s, estimate " << e.wall_seconds << " s");
    CHECK(e.wall_seconds == doctest::Approx(e.layer_seconds));
    CHECK(std::fabs(e.wall_seconds - p.wall) <= 0.30 * p.wall);
    CHECK(std::fabs(double(e.peak_bytes) - p.peak_bytes) <= 0.30 * p.peak_bytes);
  }
}

TEST_CASE("layers are handed out to the first free thread; later layers reuse their thread's buffers") {
  const SolveOptions o = solve_defaults();
  const double alone = estimate_solve_cost({16384}, 131072, 0.032, 1, o).wall_seconds;
  const double steady = solve_layer_seconds(16384, 131072, 0.032, o);
  CHECK(steady > 0);
  CHECK(steady < alone);
  const std::vector<uint32_t> four(4, 16384);
  CHECK(estimate_solve_cost(four, 131072, 0.032, 1, o).wall_seconds == doctest::Approx(alone + 3 * steady));
  CHECK(estimate_solve_cost(four, 131072, 0.032, 2, o).wall_seconds == doctest::Approx(alone + steady));
  CHECK(estimate_solve_cost(four, 131072, 0.032, 64, o).wall_seconds == doctest::Approx(alone));  // 4 threads used
  // Memory: one layer's buffers per thread in flight, never more threads than layers.
  const uint64_t one = estimate_solve_cost(four, 131072, 0.032, 1, o).peak_bytes;
  const uint64_t two = estimate_solve_cost(four, 131072, 0.032, 2, o).peak_bytes;
  CHECK(two - one == solve_layer_bytes(16384, 131072, o));
  CHECK(estimate_solve_cost(four, 131072, 0.032, 64, o).peak_bytes ==
        estimate_solve_cost(four, 131072, 0.032, 4, o).peak_bytes);
}

TEST_CASE("the full pair matrix is counted only where it is kept; other methods count no pairs") {
  const SolveOptions defaults = solve_defaults();
  SolveOptions o = defaults;
  CHECK(estimate_solve_cost({16384}, 131072, 0.032, 1, o).full_matrix);
  CHECK_FALSE(estimate_solve_cost({28672}, 131072, 0.032, 1, o).full_matrix);  // 1.5 GiB of pairs > 1 GiB
  o.full_matrix_bytes = 0;
  CHECK_FALSE(estimate_solve_cost({16384}, 131072, 0.032, 1, o).full_matrix);
  CHECK(solve_layer_bytes(16384, 131072, o) < solve_layer_bytes(16384, 131072, defaults));
  o = defaults;
  o.method = "frequency";
  CHECK(estimate_solve_cost({16384}, 131072, 0.032, 1, o).wall_seconds == 0);
  CHECK(solve_layer_bytes(16384, 131072, o) < solve_layer_bytes(16384, 131072, defaults));
}
