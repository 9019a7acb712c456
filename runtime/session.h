// One generating model: a flash image opened, its tokenizer, its dense weights and flash FFN loaded for a context under
// a memory budget, the predictor calibrated; then any number of generations (each with a fresh KV cache). The C API
// (runtime/include/nl_run.h) and `nl-run generate` both run on it. Not thread-safe: one generation at a time (the
// stop flag of GenerateHooks may be set from any thread).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/flash_ffn.h"
#include "runtime/flash_image.h"
#include "runtime/generate.h"
#include "runtime/model/model.h"

namespace nl {

// Opens `path` (an image or its manifest) with `io`, after telling apart what it names (an HDF5 trace or graph is
// not an image: InputError; a missing manifest: UsageError), checks every region's xxh64 with `verify`, and refuses a
// manifest whose planner gap does not parse (InputError).
std::unique_ptr<FlashImage> open_flash_image(const std::string& path, const IoOptions& io, bool verify);

// io_uring reads in flight under --overlap cross|both (a layer's read-ahead; the ring itself is a few hundred KiB).
constexpr uint32_t kReadAheadQueueDepth = 4096;
// The queue depth a run gets when none is given: read-ahead runs while nobody collects completions (during
// attention), so only reads already in the kernel's hands progress then; --overlap cross|both (and auto, which is both
// on images without replicas) put a whole layer's reads in flight. Otherwise the engine's default.
uint32_t default_queue_depth(const std::string& overlap);
// An I/O engine by name: "auto" (uring where this kernel and build have it, else pread) or io_kind_parse's names.
bool io_kind_choose(const std::string& name, IoKind* out);

struct SessionOptions {
  std::string select = "gate";   // selection_parse's forms
  std::string overlap = "auto";  // auto (both; layer for an image with flash replicas) | none | layer | cross | both
  PlannerSettings planner;
  uint64_t memory_budget = 0;      // bytes for the whole process; 0 = none
  std::string memory_budget_text;  // as given (messages); "" = the byte count
  uint64_t read_batch = kFfnReadBatchBytes;
  uint64_t read_ahead = kFfnReadAheadBytes;  // overlap cross|both only
  int prefill_block = kPrefillBlockTokens;
  bool verify_reads = false;
  std::string tokenizer;  // "" = the manifest's tokenizer, when its file sits beside the manifest
  // Opens a tokenizer file; empty = llama2.c tokenizers only (the runtime has no SentencePiece).
  std::function<std::unique_ptr<Tokenizer>(const std::string& path)> open_tokenizer;
  std::function<void(const std::string&)> warn;  // one-line notices; may be empty
  // lowrank:R: the calibration prompt and steps (the exact model's greedy continuation is the calibration set) and
  // the share of firing neurons the threshold keeps on it.
  std::vector<int> calibrate_tokens{1};
  int calibrate_steps = 64;
  double target_recall = 0.99;
};

class Session {
 public:
  // Takes the opened image; opens the tokenizer (InputError when its vocabulary is not the model's) and checks the
  // selection against the manifest (UsageError / InputError). Nothing is loaded yet.
  Session(std::unique_ptr<FlashImage> image, SessionOptions o);

  FlashImage& image() { return *img_; }
  const FlashImage& image() const { return *img_; }
  const ImageManifest& manifest() const { return img_->manifest(); }
  const SessionOptions& options() const { return o_; }
  const Selection& selection() const { return sel_; }
  OverlapMode overlap() const { return overlap_; }  // as resolved from auto
  const Tokenizer* tokenizer() const { return tok_.get(); }
  const std::string& tokenizer_path() const { return tok_path_; }
  const std::vector<float>& thresholds() const { return thresholds_; }  // threshold: per layer
  // The tokenizer's EOS (and BOS for llama2.c models, as run.c); none without a tokenizer.
  std::vector<int> stop_tokens() const;

  // Sizes DRAM for `context` positions (size_memory: InputError when it does not fit, nothing loaded), then loads
  // the dense weights and the flash FFN (gate rows, pinned bundles, the cache).
  void load(int context);
  bool loaded() const { return dense_ != nullptr; }
  int context() const { return context_; }
  const MemorySizing& memory() const { return mem_; }
  FlashFfn* ffn() { return ffn_.get(); }
  const FlashFfn* ffn() const { return ffn_.get(); }

  // lowrank: the calibration run (then the exact phase, thresholds set). Other selections: nothing.
  void calibrate();
  // lowrank: the predict phase; threshold: the thresholds replace the exact (everything kept) setting.
  void start_selection();

  // A generation from `prompt` (ids below the vocabulary, at most context() with the steps) on a fresh KV cache.
  Generation generate(const std::vector<int>& prompt, int steps, const SamplerConfig& sampler,
                      const std::vector<int>& stop_tokens, const GenerateHooks& hooks = {});

 private:
  Generation generate_on(Model& model, const std::vector<int>& prompt, int steps, Sampler& sampler,
                         const std::vector<int>& stop_tokens, const GenerateHooks& hooks);
  std::unique_ptr<FlashImage> img_;
  SessionOptions o_;
  Selection sel_;
  OverlapMode overlap_ = OverlapMode::kNone;
  std::unique_ptr<Tokenizer> tok_;
  std::string tok_path_;
  std::vector<float> thresholds_;
  int context_ = 0;
  MemorySizing mem_;
  std::unique_ptr<DenseStore> dense_;
  std::unique_ptr<FlashFfn> ffn_;
};

}  // namespace nl
