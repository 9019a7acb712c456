// Solving a whole trace: per layer, count co-activations (graph/), run the chosen method, and record the
// objective and upper bound; layers in parallel (OpenMP). greedy+ls builds candidates (order + cache policy) in
// families on the first sequences of the profile trace, chooses the one the runtime pays least for on the last
// sequences (validation tokens the candidates never saw), and optionally rebuilds the chosen recipe on all tokens. The
// paper's pipeline (greedy + the evaluator's cache) is always a candidate, so on validation the choice never loses
// to it. How it works and how to change the objective: docs/solvers.md.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "formats/layout.h"
#include "layout/evaluate.h"
#include "layout/local_search.h"
#include "layout/pins.h"
#include "layout/solvers.h"

namespace nl {

struct SolveOptions {
  std::string method = "greedy+ls";
  uint64_t seed = 1;
  uint32_t top_k =
      256;  // candidates per neuron: greedy matches an every-pair Algorithm 1 on the presets (docs/workloads.md)
  uint32_t rcm_min_count = 1;
  // greedy / greedy+ls count the full pair matrix and run Algorithm 1 over every pair when it fits in this many
  // bytes per layer (n(n-1)/2 x 4: 512 MiB at 16,384 neurons); else over the top-k lists. On the dense presets
  // top-k truncation costs greedy a lot (Llama-2: 4.94 with k = 256 vs 6.65 with k = 4,096; docs/solvers.md).
  uint64_t full_matrix_bytes = uint64_t(1) << 30;
  // The device objective greedy+ls optimises and chooses by (same settings as nl-layout eval).
  EvalConfig eval;  // gap, cache ratio, device, bundle bytes (0 = default for the layer width)
  LsOptions ls;     // merge gap / costs are filled in from `eval` by solve_layer
  // greedy+ls co-designs the layout with the cache at the same capacity: admission "all" (plain S3-FIFO, which
  // keeps the neurons of persistent runs; linking-aligned admission rejects them) and, when pin_share > 0,
  // policies that pin the hottest pin_share x capacity neurons (or part of them).
  CacheAdmission admission = CacheAdmission::kAll;
  double pin_share = 1.0;
  // Rounds of swaps refining the pinned set for the searched order (layout/pins.h); 0 = the hottest set only.
  uint32_t pin_rounds = 8;
  // Each cache candidate with an S3-FIFO part is also tried with this small-FIFO share (recorded per layer as
  // `small_fraction`); 0 = only S3-FIFO's 10 %. Full candidate set only.
  double small_fraction = 0.5;
  // Which cache policies each searched order is measured under. Lean (default): the value cache, the admission rule
  // with the hottest neurons pinned and with the refined pinned set (the admission rule alone where nothing can be
  // pinned); these held every winner of 120 real and preset layers, where the best of the other policies was at
  // least 2 % slower on validation (docs/solvers.md). Full: also the paper's cache, the admission rule alone, 6/8,
  // 5/8 and 4/8 of the pinned set under both admission rules, and the small-FIFO retries: about four times the
  // validation passes.
  bool full_candidates = false;
  // Share of the profile trace's sequences (the last ones) held out to choose between candidates; the rest builds
  // them. 0 = build on every token and choose on the first guard_tokens of them (before validated selection).
  double validation_share = 0.2;
  // Flash replication (greedy+ls): at most this share of the layer's neurons get a second copy beside a group they
  // fire with (layout/replicate.h); the level is chosen on validation tokens. 0 = off.
  double replicate_share = 0;
  // Rebuild the chosen recipe on all profile tokens (validation_share > 0). Off: it gained at most 0.06 % held out
  // on the presets and nothing on tiny-relu for about 11 % more CPU (docs/benchmarks.md "Layout solver").
  bool rebuild = false;
  uint64_t guard_tokens = 16384;  // validation tokens (a prefix of the held-out part) the choice is made on
  bool guard_weight = false;      // a candidate must keep greedy's path weight (gap-0 reads without a cache)
  // The ends-in family's swap polish (layout/span.h): tokens and slots visited per polish, a deterministic budget.
  uint64_t polish_work = uint64_t(1) << 25;
  // Deterministic search budget when ls.max_evaluations is 0: this many move evaluations per neuron, and at least
  // min_evaluations per layer without the weight guard, so that small layers reach a local optimum (the real tiny
  // models' layers at 16 KiB: +0.1-0.3 % held out, docs/benchmarks.md "Layout solver"; layers of 16,384 neurons and
  // more are not affected).
  uint32_t evaluations_per_neuron = 4;
  uint64_t min_evaluations = 65536;
  // Where the search's window terms price the planner exactly (merge gap + 1 <= ls.max_window: bundles of a few KiB
  // and more), a small layer's search also gets min(converge_evaluations, converge_work / neurons) evaluations, so it
  // reaches a local optimum of its widening candidate lists (ls.max_neighbours; +0.2-0.4 % validation I/O on the real
  // models at 16 KiB, docs/benchmarks.md "Layout solver"); a layer of 16,384 neurons keeps 65,536. Where the merge gap
  // is wider the ends-in family wins and more evaluations changed no choice.
  uint64_t converge_evaluations = uint64_t(1) << 19;
  uint64_t converge_work = uint64_t(1) << 30;
  // The selection stops a candidate's pass over the validation tokens once its I/O time shows it can be neither the
  // winner, its family's best nor one of the two policies retried with the small FIFO (the same layout; its
  // CandidateFigure is then a lower bound). false: every candidate's full figure (tests compare the two).
  bool early_stop = true;
  // Measure each family's best candidate on the build tokens too (FamilyFigure::build_ms, for the progress line): one
  // more planner-and-cache pass per family. Off: build_ms stays 0 (nl-layout -q, which prints no progress).
  bool family_build_figures = true;
};

// Whether a layer of n neurons keeps its full pair-count matrix under `opt` (greedy over every pair): greedy and
// greedy+ls, when the n(n-1)/2 uint32 counts fit in full_matrix_bytes. solve_layer and the cost estimate
// (layout/solve_cost.h) both ask this.
bool keeps_full_matrix(uint32_t n_neurons, const SolveOptions& opt);
// Whether greedy+ls's ends-in family runs on a layer of n neurons whose planner merges gaps of `merge_gap` bundles:
// where that is wider than the search's windows (small bundles).
bool runs_ends_in(uint32_t n_neurons, uint32_t merge_gap, const SolveOptions& opt);

// The profile tokens of one layer split by sequences: [0, build_end) builds the candidates, [build_end, n_tokens)
// validates them. The last ceil(share x sequences) sequences validate; a trace of one sequence is split at a token.
struct TokenSplit {
  uint64_t build_end = 0, n_tokens = 0;
  uint64_t validation_sequences = 0;  // 0: split inside the single sequence (or no split)
  bool split() const { return build_end < n_tokens; }
};
TokenSplit validation_split(const std::vector<int64_t>& sequence_starts, uint64_t n_tokens, double share);

// Tokens [begin, end) of m as a mask of end - begin tokens.
LayerMask mask_tokens(const LayerMask& m, uint64_t begin, uint64_t end);
// Cuts m down to tokens [0, end) in its own storage and returns tokens [end, n_tokens) as a new mask.
LayerMask split_mask_tokens(LayerMask& m, uint64_t end);

// Named durations in the order first met; adding to a name already there sums.
struct PhaseTimes {
  std::vector<std::pair<std::string, double>> list;
  void add(const std::string& name, double seconds);
  double operator[](const std::string& name) const;  // 0 when absent
};

// One candidate family's figures on the layer (I/O ms per token; 0 = not tried or refused by the weight guard):
// the best of its candidates on the validation tokens, and that candidate on the build tokens (0 when
// SolveOptions::family_build_figures is off).
struct FamilyFigure {
  std::string family;  // "paper", "search", "pinned", "ends-in"
  double validation_ms = 0, build_ms = 0;
  std::string best;  // label of its best candidate
  uint32_t candidates = 0, refused = 0;
};

// One candidate (an order under one cache policy) as the selection saw it.
struct CandidateFigure {
  std::string family, label;  // label: "<build>, <cache policy>"
  double validation_ms = 0;   // I/O ms per token on the validation tokens; < 0: refused by the weight guard
  uint64_t order_hash = 0;    // order_hash of the candidate's order
  // Its pass was stopped early (SolveOptions::early_stop): validation_ms is then the time of the tokens measured over
  // every token, a lower bound on its figure, and at least its family's best figure.
  bool stopped = false;
};

// FNV-1a of an order's slots (tests and reports tell candidates apart by it).
uint64_t order_hash(const Order& order);

struct LayerSolve {
  Order order;
  LayerCachePolicy cache;  // the cache policy the order was designed for (greedy+ls); empty = evaluator's
  uint64_t objective = 0;  // path weight on every profile token
  double upper_bound = 0;
  GreedyStats greedy;
  LsStats ls;
  PinRefineStats pins;  // greedy+ls: the pinned set refined for the searched order
  // greedy+ls: the validated selection
  TokenSplit split;
  std::vector<FamilyFigure> families;       // in the order tried; families[0] is the paper's pipeline
  std::vector<CandidateFigure> candidates;  // every candidate, in the order tried; [0] is the paper's pipeline
  std::string chosen_family, chosen;        // the winner: its family and label ("paper" = the paper's pipeline)
  double chosen_validation_ms = 0;
  bool rebuilt = false;           // the chosen recipe was rebuilt on all profile tokens
  uint32_t replicas = 0;          // flash replication: copies kept (order has n + replicas slots)
  std::string replicate_summary;  // validation I/O ms/tok per replica count tried
  bool kept_paper() const { return chosen_family == "paper" || chosen_family.empty(); }
  double seconds = 0;
  // Where the layer's time went: "read" (solve_trace), "split", "count", "greedy" (or "order" for identity, frequency
  // and rcm), "build <family>" and "select <family>" (the validation passes), "build figures", "bound", "rebuild",
  // "replicate", "objective"; "search: local search" and "search: pins" are parts of "build search". Thread-seconds of
  // the solving thread (nl-layout solve sums them over layers: docs/benchmarks.md "Offline: count + solve").
  PhaseTimes phases;
  // The coarse split the progress line prints, from the phases: counting (split, count, bound), greedy, and the
  // candidates (built, selected, rebuilt, replicated).
  double seconds_count() const { return phases["split"] + phases["count"] + phases["bound"]; }
  double seconds_greedy() const { return phases["greedy"]; }
  double seconds_ls() const;
};

// Where a layer's co-activation counts come from when they are not counted from its mask (nl-layout solve --graph,
// layout/solve_graph.h): given the counting options solve would use, the layer's graph (kept alive by the caller).
using LayerCountsFn = std::function<const LayerGraph&(uint32_t layer, const CoactivationOptions& co)>;

// sequence_starts (optional): the trace's /sequences; absent = one sequence. `counts` (optional): the layer's counts
// instead of counting `m` (which is then the token sample, maybe empty; no validation split is made).
LayerSolve solve_layer(const LayerMask& m, const SolveOptions& opt, uint32_t layer_index,
                       const std::vector<int64_t>* sequence_starts = nullptr, const LayerCountsFn& counts = {});
// The same result; m's storage is reused for the build tokens (m is left holding a part of the layer).
LayerSolve solve_layer(LayerMask&& m, const SolveOptions& opt, uint32_t layer_index,
                       const std::vector<int64_t>* sequence_starts = nullptr, const LayerCountsFn& counts = {});

// The layout's "parameters" object for these options, and one layer's entry from its result (one definition
// for solve_trace and solve_graph).
nlohmann::json solve_parameters(const SolveOptions& opt);
LayoutLayer layout_layer_of(const LayerSolve& s);

// Solves layers 0..n_layers-1 on OpenMP threads with `solve_one` (which serialises its own reads), stores each
// layer's entry in `out.layers`, calls `progress` serialised, and rethrows the first error once all are done (one
// loop for solve_trace and solve_graph).
void solve_layers(Layout& out, uint32_t n_layers, const std::function<void(uint32_t, const LayerSolve&)>& progress,
                  const std::function<LayerSolve(uint32_t)>& solve_one);

// Solves every layer of a trace file. `progress` (optional) is called after each layer (from any thread,
// serialised).
Layout solve_trace(const std::string& trace_path, const SolveOptions& opt,
                   const std::function<void(uint32_t layer, const LayerSolve&)>& progress = {});

}  // namespace nl
