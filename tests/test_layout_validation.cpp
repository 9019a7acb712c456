// greedy+ls's validated selection (layout/solve.h): the profile trace split by sequences into build and validation
// tokens, candidates built on the first only, chosen on the second, the paper's pipeline always among them.
#include <doctest/doctest.h>

#include <limits>
#include <random>
#include <set>

#include "layout/evaluate.h"
#include "layout/solve.h"
#include "layout/synthetic.h"
#include "mask_test_util.h"

using namespace nl;

namespace {

SolveOptions ls_options(uint64_t bundle_bytes) {
  SolveOptions o;
  o.method = "greedy+ls";
  o.eval.device = default_device();
  o.eval.gap = GapPolicy::parse("auto");
  o.eval.cache_ratio = 0.05;
  o.eval.bundle_bytes = bundle_bytes;
  return o;
}

std::vector<int64_t> sequences(uint64_t n_tokens, uint64_t len) {
  std::vector<int64_t> s;
  for (uint64_t t = 0; t < n_tokens; t += len) s.push_back(int64_t(t));
  return s;
}

}  // namespace

TEST_CASE("the validation split holds out the last sequences, or a token share of a single sequence") {
  const std::vector<int64_t> seq = sequences(1000, 100);
  TokenSplit s = validation_split(seq, 1000, 0.2);
  CHECK(s.build_end == 800);
  CHECK(s.validation_sequences == 2);
  s = validation_split(seq, 1000, 0.25);  // 2.5 sequences -> 3
  CHECK(s.build_end == 700);
  CHECK(validation_split(seq, 1000, 0.0).build_end == 1000);  // no split
  CHECK(!validation_split(seq, 1000, 0.0).split());
  s = validation_split({0}, 1000, 0.2);  // one sequence: split at a token
  CHECK(s.build_end == 800);
  CHECK(s.validation_sequences == 0);
  s = validation_split({0, 10}, 1000, 0.01);  // at least one sequence validates, at least one builds
  CHECK(s.build_end == 10);
  CHECK_THROWS(validation_split(seq, 1000, 1.0));
}

TEST_CASE("the build and validation masks are disjoint token ranges whose union is the trace") {
  std::mt19937_64 rng(5);
  for (uint64_t b : {0ull, 1ull, 63ull, 64ull, 65ull, 130ull, 200ull}) {
    LayerMask m(37, 201);
    for (uint32_t v = 0; v < m.n_neurons; ++v)
      for (uint64_t t = 0; t < m.n_tokens; ++t)
        if (rng() % 3 == 0) m.set(v, t);
    const LayerMask a = mask_tokens(m, 0, b), c = mask_tokens(m, b, m.n_tokens);
    REQUIRE(a.n_tokens == b);
    REQUIRE(c.n_tokens == m.n_tokens - b);
    CAPTURE(b);
    for (uint32_t v = 0; v < m.n_neurons; ++v) {
      for (uint64_t t = 0; t < m.n_tokens; ++t) CHECK((t < b ? a.test(v, t) : c.test(v, t - b)) == m.test(v, t));
      CHECK(a.count(v) + c.count(v) == m.count(v));  // no bit past a slice's last token
    }
  }
}

TEST_CASE("split_mask_tokens cuts a mask in place into the same two parts as mask_tokens") {
  std::mt19937_64 rng(9);
  for (uint64_t b : {0ull, 1ull, 63ull, 64ull, 65ull, 130ull, 200ull, 201ull}) {
    LayerMask m(29, 201);
    for (uint32_t v = 0; v < m.n_neurons; ++v)
      for (uint64_t t = 0; t < m.n_tokens; ++t)
        if (rng() % 3 == 0) m.set(v, t);
    const LayerMask a = mask_tokens(m, 0, b), c = mask_tokens(m, b, m.n_tokens);
    LayerMask cut = m;
    const uint64_t* storage = cut.bits.data();
    const LayerMask rest = split_mask_tokens(cut, b);
    CAPTURE(b);
    CHECK(cut.bits.data() == storage);  // no second copy of the build part
    CHECK(cut.n_tokens == a.n_tokens);
    CHECK(cut.words == a.words);
    CHECK(cut.bits == a.bits);  // equal words: no bit past the prefix's last token either
    CHECK(rest.n_tokens == c.n_tokens);
    CHECK(rest.bits == c.bits);
  }
}

TEST_CASE("solve_layer on a mask it may cut in place gives the same layer as on a const mask") {
  const uint64_t T = 3000;
  const LayerMask m = test::clustered_layer(400, T, 7);
  for (uint64_t len :
       {uint64_t(100), uint64_t(128), T}) {  // a split inside a word, on a word boundary, inside one sequence
    const std::vector<int64_t> seq = sequences(T, len);
    for (uint64_t bundle : {512ull, 16384ull}) {  // with and without the ends-in family
      CAPTURE(len);
      CAPTURE(bundle);
      const SolveOptions o = ls_options(bundle);
      const LayerSolve a = solve_layer(m, o, 0, &seq);
      LayerMask given = m;
      const LayerSolve b = solve_layer(std::move(given), o, 0, &seq);
      REQUIRE(a.split.split());
      CHECK(a.order == b.order);
      CHECK(a.cache.pinned == b.cache.pinned);
      CHECK(a.cache.admission == b.cache.admission);
      CHECK(a.cache.small_fraction == b.cache.small_fraction);
      CHECK(a.objective == b.objective);
      CHECK(a.objective == path_weight(m, a.order));  // every profile token
      CHECK(a.upper_bound == b.upper_bound);
      CHECK(a.chosen == b.chosen);
      REQUIRE(a.candidates.size() == b.candidates.size());
      for (size_t k = 0; k < a.candidates.size(); ++k)
        CHECK(a.candidates[k].validation_ms == b.candidates[k].validation_ms);
    }
  }
}

TEST_CASE("greedy+ls builds every candidate from the build tokens only: changing validation tokens changes none") {
  const uint64_t T = 3000, len = 100;
  const LayerMask m = test::clustered_layer(400, T, 7);
  const std::vector<int64_t> seq = sequences(T, len);
  SolveOptions o = ls_options(16384);
  o.rebuild = false;
  const LayerSolve a = solve_layer(m, o, 0, &seq);
  REQUIRE(a.split.split());
  CHECK(a.split.build_end == 2400);
  // The same build tokens, other validation tokens (another trace's), and the other way round.
  const LayerMask other = test::clustered_layer(400, T, 8);
  LayerMask val_changed = m, build_changed = m;
  for (uint32_t v = 0; v < m.n_neurons; ++v)
    for (uint64_t t = 0; t < T; ++t) {
      LayerMask& x = t >= a.split.build_end ? val_changed : build_changed;
      if (x.test(v, t) != other.test(v, t)) x.row(v)[t >> 6] ^= uint64_t(1) << (t & 63);
    }
  const LayerSolve b = solve_layer(val_changed, o, 0, &seq), c = solve_layer(build_changed, o, 0, &seq);
  REQUIRE(a.candidates.size() == b.candidates.size());
  REQUIRE(a.candidates.size() >= 4);
  bool some_validation_figure_moved = false, some_order_moved = false;
  for (size_t k = 0; k < a.candidates.size(); ++k) {
    CAPTURE(a.candidates[k].label);
    // (Which two policies are tried again with a larger small FIFO is itself chosen on validation.)
    if (a.candidates[k].label.find("small FIFO") == std::string::npos)
      CHECK(a.candidates[k].label == b.candidates[k].label);
    CHECK(a.candidates[k].order_hash == b.candidates[k].order_hash);  // built without the validation tokens
    some_validation_figure_moved |= a.candidates[k].validation_ms != b.candidates[k].validation_ms;
    if (k < c.candidates.size()) some_order_moved |= a.candidates[k].order_hash != c.candidates[k].order_hash;
  }
  CHECK(some_validation_figure_moved);  // ... but chosen on them
  CHECK(some_order_moved);              // the build tokens do shape the candidates (the check above can fail)
  // The build-token figure of each family is the same too: it never sees a validation token.
  REQUIRE(a.families.size() == b.families.size());
  for (size_t f = 0; f < a.families.size(); ++f)
    if (a.families[f].best == b.families[f].best) CHECK(a.families[f].build_ms == b.families[f].build_ms);
}

TEST_CASE("the paper's pipeline is always a candidate, so on validation the choice never loses to it") {
  struct Case {
    uint32_t n;
    uint64_t bundle;
    bool guard;
    double cache;
  };
  const std::vector<Case> cases = {{300, 16384, false, 0.05},
                                   {300, 256, false, 0.05},
                                   {500, 16384, true, 0.05},
                                   {300, 4096, false, 0.0},
                                   {200, 256, true, 0.10}};
  uint64_t seed = 11;
  for (const Case& cs : cases) {
    const uint64_t T = 2000;
    const LayerMask m = test::clustered_layer(cs.n, T, seed++);
    const std::vector<int64_t> seq = sequences(T, 50);
    SolveOptions o = ls_options(cs.bundle);
    o.guard_weight = cs.guard;
    o.eval.cache_ratio = cs.cache;
    for (bool rebuild : {false, true}) {
      o.rebuild = rebuild;
      CAPTURE(cs.n);
      CAPTURE(cs.bundle);
      CAPTURE(rebuild);
      const LayerSolve s = solve_layer(m, o, 0, &seq);
      REQUIRE(!s.candidates.empty());
      REQUIRE(s.split.split());
      // Candidate 0 is the paper's pipeline: greedy built on the build tokens, with the evaluator's cache.
      const LayerMask mb = mask_tokens(m, 0, s.split.build_end);
      SolveOptions g = o;
      g.method = "greedy";
      const LayerSolve greedy_build = solve_layer(mb, g, 0);
      CHECK(s.candidates[0].family == "paper");
      CHECK(s.candidates[0].order_hash == order_hash(greedy_build.order));
      CHECK(s.families[0].family == "paper");
      for (const CandidateFigure& c : s.candidates)
        if (c.validation_ms >= 0) CHECK(s.chosen_validation_ms <= c.validation_ms + 1e-12);
      CHECK(s.chosen_validation_ms <= s.candidates[0].validation_ms);
      // Measured independently on the validation tokens: the kept candidate against greedy with the paper's cache.
      if (!rebuild) {
        EvalConfig ev = o.eval;
        ev.token_begin = s.split.build_end;
        ev.token_end = T;
        const double ours = evaluate_layer(m, s.order, ev, 0, &s.cache).io_seconds;
        const double paper = evaluate_layer(m, greedy_build.order, ev, 0).io_seconds;
        CHECK(ours <= paper);
      } else if (s.kept_paper()) {  // the paper's recipe rebuilt on every token is plain greedy on the trace
        CHECK(s.order == solve_layer(m, g, 0).order);
        CHECK(s.cache.pinned.empty());
        CHECK(s.cache.admission == CacheAdmission::kUnset);
      }
    }
  }
}

TEST_CASE("greedy+ls with validation is deterministic, counts every token for its objective, and can rebuild") {
  const uint64_t T = 2400;
  const LayerMask m = test::clustered_layer(300, T, 21);
  const std::vector<int64_t> seq = sequences(T, 80);
  SolveOptions o = ls_options(16384);
  o.rebuild = true;
  const LayerSolve a = solve_layer(m, o, 0, &seq), b = solve_layer(m, o, 0, &seq);
  CHECK(a.order == b.order);
  CHECK(a.cache.pinned == b.cache.pinned);
  CHECK(a.rebuilt);
  CHECK(a.objective == path_weight(m, a.order));  // the objective counts every profile token
  o.rebuild = false;
  const LayerSolve c = solve_layer(m, o, 0, &seq);
  CHECK(!c.rebuilt);
  CHECK(c.objective == path_weight(m, c.order));
  // Without the rebuild the bound is the sum of the two parts' bounds: still a bound, at least the exact one.
  CHECK(c.upper_bound >= a.upper_bound);
  CHECK(double(c.objective) <= c.upper_bound);
}

TEST_CASE("an order pass measures each policy as evaluate_layer does, and a stopped one is a lower bound") {
  const uint64_t T = 2000;
  const LayerMask m = test::clustered_layer(300, T, 21);
  SolveOptions o = ls_options(256);
  o.eval.token_begin = 500;
  o.eval.token_end = 1800;
  std::vector<uint32_t> order(m.n_neurons);
  for (uint32_t v = 0; v < m.n_neurons; ++v) order[v] = (v * 7) % m.n_neurons;  // 7 is prime to 300
  std::vector<uint32_t> hot(order.begin(), order.begin() + 5);
  const std::vector<LayerCachePolicy> policies = {LayerCachePolicy{}, LayerCachePolicy{CacheAdmission::kAll, {}},
                                                  LayerCachePolicy{CacheAdmission::kAll, hot, 0.5}};
  const TokenMajorMask tm(m, 400, T);  // covers the range: shared, as the selection does
  for (const TokenMajorMask* t : {static_cast<const TokenMajorMask*>(nullptr), &tm}) {
    const OrderPass pass(m, order, o.eval, 3, t);
    REQUIRE(pass.tokens() == 1300);
    for (const LayerCachePolicy& p : policies) {
      const LayerEval want = evaluate_layer(m, order, o.eval, 3, &p);
      bool stopped = true;
      const LayerEval got = pass.run(&p, std::numeric_limits<double>::infinity(), &stopped);
      CHECK(!stopped);
      CHECK(got.tokens == want.tokens);
      CHECK(got.reads == want.reads);
      CHECK(got.bytes_read == want.bytes_read);
      CHECK(got.hits == want.hits);
      CHECK(got.max_read_bundles == want.max_read_bundles);
      CHECK(got.io_seconds == want.io_seconds);  // the same sum in the same order: equal, not close
      REQUIRE(want.io_seconds > 0);
      const double bound = want.io_seconds / 2;
      const LayerEval part = pass.run(&p, bound, &stopped);
      CHECK(stopped);
      CHECK(part.tokens < want.tokens);
      CHECK(part.io_seconds >= bound);
      CHECK(part.io_seconds <= want.io_seconds);
      const LayerEval at_end = pass.run(&p, want.io_seconds, &stopped);  // reached at the last token only
      CHECK(!stopped);
      CHECK(at_end.io_seconds == want.io_seconds);
    }
  }
}

TEST_CASE("stopping losing candidates early keeps the choice, every family's figure and the small-FIFO retries") {
  struct Case {
    uint32_t n;
    uint64_t bundle;
    bool guard;
    double cache;
  };
  const std::vector<Case> cases = {
      {300, 16384, false, 0.05}, {300, 256, false, 0.05}, {500, 16384, true, 0.05}, {200, 256, true, 0.10}};
  uint64_t seed = 31, stopped = 0, compared = 0;
  for (const Case& cs : cases) {
    const uint64_t T = 2000;
    const LayerMask m = test::clustered_layer(cs.n, T, seed++);
    const std::vector<int64_t> seq = sequences(T, 50);
    SolveOptions o = ls_options(cs.bundle);
    o.guard_weight = cs.guard;
    o.eval.cache_ratio = cs.cache;
    CAPTURE(cs.n);
    CAPTURE(cs.bundle);
    o.early_stop = false;
    const LayerSolve full = solve_layer(m, o, 0, &seq);
    o.early_stop = true;
    const LayerSolve fast = solve_layer(m, o, 0, &seq);
    CHECK(fast.order == full.order);
    CHECK(fast.cache.admission == full.cache.admission);
    CHECK(fast.cache.pinned == full.cache.pinned);
    CHECK(fast.cache.small_fraction == full.cache.small_fraction);
    CHECK(fast.chosen_family == full.chosen_family);
    CHECK(fast.chosen == full.chosen);
    CHECK(fast.chosen_validation_ms == full.chosen_validation_ms);
    REQUIRE(fast.families.size() == full.families.size());
    for (size_t f = 0; f < full.families.size(); ++f) {
      CHECK(fast.families[f].best == full.families[f].best);
      CHECK(fast.families[f].validation_ms == full.families[f].validation_ms);
      CHECK(fast.families[f].build_ms == full.families[f].build_ms);
      CHECK(fast.families[f].candidates == full.families[f].candidates);
    }
    // The same candidates (so the same two policies retried with the small FIFO), full figures where not stopped.
    REQUIRE(fast.candidates.size() == full.candidates.size());
    for (size_t k = 0; k < full.candidates.size(); ++k) {
      const CandidateFigure &a = full.candidates[k], &b = fast.candidates[k];
      CAPTURE(a.label);
      CHECK(!a.stopped);
      CHECK(b.label == a.label);
      CHECK(b.order_hash == a.order_hash);
      if (a.validation_ms < 0) continue;  // refused by the weight guard
      ++compared;
      if (!b.stopped) {
        CHECK(b.validation_ms == a.validation_ms);
        continue;
      }
      ++stopped;
      CHECK(b.validation_ms <= a.validation_ms);  // a lower bound
      for (const FamilyFigure& f : fast.families)
        if (f.family == b.family) CHECK(b.validation_ms >= f.validation_ms);  // and no better than its family's best
    }
  }
  MESSAGE(stopped << " of " << compared << " candidate passes stopped early");
  CHECK(stopped > 0);  // the comparison above saw some stopped passes
}

TEST_CASE(
    "the value cache is a candidate of every order family, and wins where the same neurons fire token after token") {
  // Groups of 6 neurons (scattered over the index order) that stay on at the next token with probability 0.92 and
  // come on with probability 0.015: about 16 % of the groups on at a token, each member of an active group firing
  // with probability 0.85. No neuron is much hotter than another, and most of a token's active set fires again at
  // the next token: what the value cache bets on (a static hot set has nothing to hold on to).
  const uint32_t n = 600, group = 6;
  const uint64_t T = 3000;
  std::mt19937_64 rng(17);
  std::vector<uint32_t> perm(n);
  for (uint32_t v = 0; v < n; ++v) perm[v] = v;
  std::shuffle(perm.begin(), perm.end(), rng);
  LayerMask m(n, T);
  std::vector<uint8_t> on(n / group, 0);
  std::uniform_real_distribution<double> u(0, 1);
  for (uint64_t t = 0; t < T; ++t)
    for (uint32_t g = 0; g < n / group; ++g) {
      on[g] = on[g] ? u(rng) < 0.92 : u(rng) < 0.015;
      if (on[g])
        for (uint32_t k = 0; k < group; ++k)
          if (u(rng) < 0.85) m.set(perm[g * group + k], t);
    }
  const std::vector<int64_t> seq = sequences(T, 100);
  SolveOptions o = ls_options(16384);
  const LayerSolve s = solve_layer(m, o, 0, &seq);
  std::set<std::string> with_value;
  for (const CandidateFigure& c : s.candidates)
    if (c.label.size() >= 7 && c.label.compare(c.label.size() - 7, 7, ", value") == 0) with_value.insert(c.family);
  CHECK(with_value == std::set<std::string>{"search", "pinned"});  // ends-in only where bundles are small
  MESSAGE("chosen: " << s.chosen_family << " (" << s.chosen << "), " << s.chosen_validation_ms << " ms/token");
  CHECK(s.cache.admission == CacheAdmission::kValue);
  // Its hotness order lists every neuron once, hottest (on the build tokens) first.
  REQUIRE(s.cache.hot.size() == m.n_neurons);
  std::vector<uint64_t> freq(m.n_neurons);
  for (uint32_t v = 0; v < m.n_neurons; ++v)
    for (uint64_t t = 0; t < s.split.build_end; ++t) freq[v] += m.test(v, t);
  for (size_t k = 1; k < s.cache.hot.size(); ++k) CHECK(freq[s.cache.hot[k - 1]] >= freq[s.cache.hot[k]]);
  // With 256-byte bundles the ends-in family is built and measures it too.
  const LayerSolve small = solve_layer(m, ls_options(256), 0, &seq);
  bool ends_in_value = false;
  for (const CandidateFigure& c : small.candidates)
    ends_in_value = ends_in_value || (c.family == "ends-in" && c.label.find(", value") != std::string::npos);
  CHECK(ends_in_value);
}
