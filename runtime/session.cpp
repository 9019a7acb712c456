// One generating model (runtime/session.h).
#include "runtime/session.h"

#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <limits>

#include "formats/core/error.h"

namespace nl {
namespace {

// What `given` names, told apart before the image is opened (the reader would only say that IMAGE.json cannot be
// opened, exit 4, naming a file the user never typed): an HDF5 file (a trace or graph given by mistake) is bad input
// (exit 3); an image whose manifest is missing is a usage error (exit 2), as every missing input file is.
void check_image_pair(const std::string& given, const std::string& image) {
  if (std::FILE* f = std::fopen(image.c_str(), "rb")) {
    unsigned char head[8] = {};
    const size_t n = std::fread(head, 1, sizeof head, f);
    std::fclose(f);
    static const unsigned char kHdf5[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    if (n == sizeof head && std::memcmp(head, kHdf5, sizeof head) == 0)
      throw InputError(image,
                       "is an HDF5 file (a trace or a graph?), not a flash image: nl-layout pack writes an "
                       "image (MODEL.nlw) and its manifest (MODEL.nlw.json)");
  }
  const std::string manifest = manifest_path_for(image);
  if (::access(manifest.c_str(), F_OK) != 0)
    throw UsageError("--image " + given + ": its manifest " + manifest +
                     " does not exist (nl-layout pack writes the image and its manifest together)");
}

std::unique_ptr<Tokenizer> open_llama2c_only(const std::string& path) {
  if (is_sentencepiece_file(path))
    throw InputError(path, "is a SentencePiece model; this runtime-only build reads llama2.c tokenizers only");
  return open_llama2c_tokenizer(path);
}

}  // namespace

uint32_t default_queue_depth(const std::string& overlap) {
  return overlap == "cross" || overlap == "both" || overlap == "auto" ? kReadAheadQueueDepth : IoOptions{}.queue_depth;
}

bool io_kind_choose(const std::string& name, IoKind* out) {
  if (name != "auto") return io_kind_parse(name, out);
  *out = io_uring_available() ? IoKind::kUring : IoKind::kPread;
  return true;
}

std::unique_ptr<FlashImage> open_flash_image(const std::string& path, const IoOptions& io, bool verify) {
  const std::string suffix = ".json";
  const bool is_manifest =
      path.size() > suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
  check_image_pair(path, is_manifest ? path.substr(0, path.size() - suffix.size()) : path);
  auto img = std::make_unique<FlashImage>(path, io);
  if (verify) img->verify_all();
  const ImagePlanner& p = img->manifest().planner;
  if (!p.empty()) {
    try {
      GapPolicy::parse(p.gap);
    } catch (const UsageError&) {
      throw InputError(img->manifest_path(),
                       "planner.gap '" + p.gap + "' is not off, auto, auto-keep-runs or a bundle count");
    }
  }
  return img;
}

Session::Session(std::unique_ptr<FlashImage> image, SessionOptions o) : img_(std::move(image)), o_(std::move(o)) {
  const ImageManifest& man = img_->manifest();
  const ModelConfig& c = man.config;
  if (std::string p = selection_parse(o_.select, &sel_); !p.empty())
    throw UsageError("--select " + o_.select + ": " + p);
  if (sel_.stored) {
    if (!man.has_predictor())
      throw UsageError("--select predictor: " + img_->manifest_path() +
                       " has no stored predictor (nl-layout pack --predictor FILE stores one)");
    sel_.rank = man.predictor_rank;
  }
  const std::string overlap = o_.overlap != "auto" ? o_.overlap : man.replicated() ? "layer" : "both";
  if (!overlap_mode_parse(overlap, &overlap_)) throw UsageError("unknown --overlap " + overlap);
  // The tokenizer: the option, else the manifest's reference (relative to the manifest's folder; manifest_load
  // accepts only a file name there) when that file exists.
  tok_path_ = o_.tokenizer;
  if (tok_path_.empty() && !man.tokenizer.empty()) {
    const std::string& mp = img_->manifest_path();
    const auto slash = mp.rfind('/');
    const std::string p = (slash == std::string::npos ? std::string() : mp.substr(0, slash + 1)) + man.tokenizer;
    struct stat st {};  // exists: then the reader opens it (without blocking: a FIFO there is refused, not waited on)
    if (::lstat(p.c_str(), &st) == 0) tok_path_ = p;
  }
  if (!tok_path_.empty()) {
    tok_ = o_.open_tokenizer ? o_.open_tokenizer(tok_path_) : open_llama2c_only(tok_path_);
    if (tok_->vocab_size() != c.vocab_size)
      throw InputError(tok_path_, "has " + std::to_string(tok_->vocab_size()) + " tokens, the model " +
                                      std::to_string(c.vocab_size));
  }
  if (sel_.mode == SelectMode::kThreshold && sel_.threshold >= 0)  // topk:F: every neuron passes the threshold
    thresholds_.assign(size_t(c.n_layers),
                       sel_.topk > 0 ? -std::numeric_limits<float>::infinity() : float(sel_.threshold));
  if (sel_.mode == SelectMode::kThreshold && sel_.threshold < 0) {
    if (man.act_threshold.empty())
      throw InputError(img_->manifest_path(),
                       "records no act_threshold: pack with --act-threshold-from TRACE.h5 (a "
                       "calibrated trace), or give --select threshold:T");
    for (double t : man.act_threshold) thresholds_.push_back(float(t));
    if (man.version_major == 1 && man.version_minor < kImageVersionMinorThresholds && o_.warn)
      o_.warn(img_->manifest_path() + " is format 1." + std::to_string(man.version_minor) +
              ", whose image id does not cover act_threshold (an edit would go unnoticed); re-pack to get a 1." +
              std::to_string(kImageVersionMinorThresholds) + " image that covers it");
  }
}

std::vector<int> Session::stop_tokens() const {
  std::vector<int> stop;
  if (tok_) {
    stop.push_back(tok_->eos_id());
    if (tok_->kind() == "llama2c") stop.push_back(tok_->bos_id());
  }
  return stop;
}

void Session::load(int context) {
  const ImageManifest& man = img_->manifest();
  const ModelConfig& c = man.config;
  const bool ahead = overlap_ == OverlapMode::kCross || overlap_ == OverlapMode::kBoth;
  MemoryRequest r;
  r.budget = o_.memory_budget;
  r.budget_text = o_.memory_budget_text.empty() ? std::to_string(o_.memory_budget) : o_.memory_budget_text;
  r.context = context;
  r.residency = sel_.mode == SelectMode::kDense                  ? FfnResidency::kAll
                : sel_.mode == SelectMode::kTrace || sel_.deploy ? FfnResidency::kNone
                : selection_keeps_up_rows(sel_.mode, c.act)      ? FfnResidency::kGateUpRows
                                                                 : FfnResidency::kGateRows;
  r.threads = omp_get_max_threads();
  r.baseline = current_rss_bytes();
  r.read_batch = o_.read_batch;
  r.read_ahead = ahead ? o_.read_ahead : 0;
  r.prefill_block = o_.prefill_block;
  r.read_buffers = overlap_ == OverlapMode::kNone ? 1 : kFfnOverlapReadBuffers;
  r.lowrank_rank = sel_.rank;
  r.stored_predictor = sel_.stored;
  r.verify_reads = o_.verify_reads;
  r.cache_ratio = o_.planner.effective_cache_ratio(man.planner);
  r.cache_ratio_given = o_.planner.cache_ratio >= 0;
  mem_ = size_memory(man, img_->image_path(), r);
  context_ = context;
  // The dense weights in DRAM as stored (no f32 copy); --select dense holds the whole FFN in DRAM the same way.
  dense_ = img_->load_dense_store();
  PlannerSettings ps = o_.planner;
  ps.cache_ratio = mem_.cache_ratio;
  FlashFfnOptions fo = flash_ffn_options(ps, man.planner, sel_.mode);
  fo.verify_reads = o_.verify_reads;
  if (c.has_biases())  // OPT's and Phi's fc1 bias
    for (const LayerView& lv : dense_->view.layers) fo.neuron_bias.push_back(lv.b_up);
  if (sel_.mode != SelectMode::kDense) {
    fo.lowrank_rank = sel_.rank;
    fo.stored_predictor = sel_.stored;
    fo.predictor_only = sel_.deploy;
    fo.trace_pays_predictor = sel_.trace_pays_predictor;
    fo.predictor_threshold = float(sel_.predictor_threshold);
    fo.overlap = overlap_;
    fo.read_batch_bytes = o_.read_batch;
    fo.read_ahead_bytes = r.read_ahead;
    if (sel_.mode == SelectMode::kThreshold)
      fo.act_threshold.assign(size_t(c.n_layers), -std::numeric_limits<float>::infinity());
  }
  ffn_ = std::make_unique<FlashFfn>(*img_, fo);
}

void Session::calibrate() {
  if (sel_.mode != SelectMode::kLowRank || sel_.deploy) return;  // predictor:T: nothing to calibrate
  // Calibration on the exact model's own continuation of the calibration prompt.
  const ModelConfig& c = img_->manifest().config;
  const std::vector<int>& cal = o_.calibrate_tokens;
  for (int t : cal)
    if (t < 0 || t >= c.vocab_size)
      throw UsageError("--calibrate-prompt-tokens: '" + std::to_string(t) + "' is not a token id in [0, " +
                       std::to_string(c.vocab_size) + ")");
  if (cal.empty()) throw UsageError("--calibrate-prompt-tokens is empty");
  const int cal_total = int(cal.size()) + o_.calibrate_steps;
  if (cal_total > c.seq_len)
    throw UsageError("calibration prompt + steps = " + std::to_string(cal_total) + " exceeds the model's context " +
                     std::to_string(c.seq_len));
  ffn_->set_phase(LowRankPhase::kCalibrate);
  Model cm(dense_->view, cal_total);
  cm.set_ffn(ffn_.get());
  Sampler greedy(SamplerConfig{});
  generate_on(cm, cal, o_.calibrate_steps, greedy, {}, {});
  ffn_->set_phase(LowRankPhase::kExact, o_.target_recall);
}

void Session::start_selection() {
  if (sel_.mode == SelectMode::kLowRank) ffn_->set_phase(LowRankPhase::kPredict);
  if (sel_.mode == SelectMode::kThreshold) ffn_->set_thresholds(thresholds_, sel_.topk);
}

Generation Session::generate_on(Model& model, const std::vector<int>& prompt, int steps, Sampler& sampler,
                                const std::vector<int>& stop_tokens, const GenerateHooks& hooks) {
  return nl::generate(model, ffn_.get(), prompt, steps, sampler, stop_tokens, o_.prefill_block, hooks);
}

Generation Session::generate(const std::vector<int>& prompt, int steps, const SamplerConfig& sampler,
                             const std::vector<int>& stop_tokens, const GenerateHooks& hooks) {
  if (!loaded()) throw UsageError("generate before load");
  const ModelConfig& c = img_->manifest().config;
  if (prompt.empty()) throw UsageError("the prompt is empty (BOS alone is one token)");
  for (int t : prompt)
    if (t < 0 || t >= c.vocab_size)
      throw UsageError("prompt token " + std::to_string(t) + " is not a token id in [0, " +
                       std::to_string(c.vocab_size) + ")");
  if (steps < 1) throw UsageError("steps must be at least 1");
  const int total = int(prompt.size()) + steps;
  if (total > context_)
    throw UsageError("prompt + steps = " + std::to_string(total) + " exceeds the context " + std::to_string(context_));
  Model model(dense_->view, context_);
  model.set_ffn(ffn_.get());
  Sampler s(sampler);
  return generate_on(model, prompt, steps, s, stop_tokens, hooks);
}

}  // namespace nl
