// The C API (runtime/include/nl_run.h) over nl::Session: C types in, C types out; every exception caught here and
// turned into a status and a message.
#include <omp.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "formats/core/error.h"
#include "runtime/include/nl_run.h"
#include "runtime/memory.h"
#include "runtime/session.h"

struct nl_run_context {
  std::unique_ptr<nl::Session> session;
  std::string error;
  std::atomic<bool> stop{false};
  nl::Generation last;
  nl::FlashCounters totals_before;  // the FFN's totals before the last generation
  std::string piece;                // the callback's text
};

namespace {

thread_local std::string g_open_error;

// Runs `f`, turning every exception into a status and `*msg`.
template <class F>
nl_run_status guarded(std::string* msg, F&& f) {
  try {
    msg->clear();
    f();
    return NL_RUN_OK;
  } catch (const nl::Error& e) {
    *msg = e.what();
    return static_cast<nl_run_status>(e.exit_code());
  } catch (const std::bad_alloc&) {
    *msg = "out of memory";
    return NL_RUN_ERR_NOMEM;
  } catch (const std::exception& e) {
    *msg = std::string("internal error: ") + e.what();
    return NL_RUN_ERR_INTERNAL;
  } catch (...) {
    *msg = "internal error: unknown exception";
    return NL_RUN_ERR_INTERNAL;
  }
}

std::string str_or(const char* s, const char* dflt) { return s ? std::string(s) : std::string(dflt); }

nl::IoOptions io_options(const nl_run_params& p, const std::string& overlap) {
  nl::IoOptions io;
  const std::string kind = str_or(p.io, "auto");
  if (!nl::io_kind_choose(kind, &io.kind))
    throw nl::UsageError("io: unknown engine '" + kind + "' (auto, pread, preadv, uring, mmap)");
  io.direct = p.direct != 0;
  io.queue_depth = p.queue_depth ? p.queue_depth : nl::default_queue_depth(overlap);  // as nl-run generate
  return io;
}

nl::SessionOptions session_options(const nl_run_params& p) {
  nl::SessionOptions o;
  o.select = str_or(p.select, "gate");
  if (o.select.rfind("trace:", 0) == 0)
    throw nl::UsageError("select: trace:FILE reads HDF5 traces; only nl-run (a full build) has them");
  o.overlap = str_or(p.overlap, "auto");
  if (p.gap) o.planner.gap = p.gap;
  o.planner.cache_ratio = p.cache_ratio;
  if (p.cache_ratio > 1) throw nl::UsageError("cache_ratio must be at most 1");
  o.planner.seed = p.seed;
  o.memory_budget = p.memory_budget;
  if (p.prefill_block < 0) throw nl::UsageError("prefill_block must be at least 1 (0 = the default)");
  if (p.prefill_block > 0) o.prefill_block = p.prefill_block;
  o.verify_reads = p.verify_reads != 0;
  if (p.tokenizer) o.tokenizer = p.tokenizer;
  return o;
}

}  // namespace

extern "C" {

nl_run_params nl_run_default_params(void) {
  nl_run_params p;
  std::memset(&p, 0, sizeof p);
  p.direct = 1;
  p.cache_ratio = -1;
  p.seed = 1;
  return p;
}

nl_run_sampling nl_run_default_sampling(void) {
  nl_run_sampling s;
  std::memset(&s, 0, sizeof s);
  s.top_p = 1.0f;
  s.seed = 1;
  return s;
}

nl_run_status nl_run_open(const nl_run_params* params, nl_run_context** out) {
  if (out) *out = nullptr;
  auto ctx = std::unique_ptr<nl_run_context>(new (std::nothrow) nl_run_context);
  if (!ctx) return g_open_error = "out of memory", NL_RUN_ERR_NOMEM;
  const nl_run_status st = guarded(&g_open_error, [&] {
    if (!params || !out) throw nl::UsageError("nl_run_open: params and out must not be NULL");
    if (!params->image || !*params->image) throw nl::UsageError("image: no flash image named");
    if (params->n_threads < 0) throw nl::UsageError("n_threads must be at least 0");
    if (params->context < 0) throw nl::UsageError("context must be at least 0");
    if (params->n_threads > 0) omp_set_num_threads(params->n_threads);
    nl::SessionOptions so = session_options(*params);
    auto img = nl::open_flash_image(params->image, io_options(*params, so.overlap), params->verify != 0);
    ctx->session = std::make_unique<nl::Session>(std::move(img), so);
    const nl::ModelConfig& c = ctx->session->manifest().config;
    const int context = params->context ? params->context : c.seq_len;
    if (context > c.seq_len)
      throw nl::UsageError("context " + std::to_string(context) + " exceeds the model's " + std::to_string(c.seq_len));
    ctx->session->load(context);
    ctx->session->calibrate();  // lowrank: on the default calibration prompt
    ctx->session->start_selection();
  });
  if (st == NL_RUN_OK) *out = ctx.release();
  return st;
}

void nl_run_close(nl_run_context* ctx) { delete ctx; }

const char* nl_run_last_error(const nl_run_context* ctx) { return ctx ? ctx->error.c_str() : g_open_error.c_str(); }

int nl_run_n_vocab(const nl_run_context* ctx) { return ctx ? ctx->session->manifest().config.vocab_size : 0; }
int nl_run_context_size(const nl_run_context* ctx) { return ctx ? ctx->session->context() : 0; }
int nl_run_has_tokenizer(const nl_run_context* ctx) { return ctx && ctx->session->tokenizer() ? 1 : 0; }
int32_t nl_run_bos(const nl_run_context* ctx) {
  return ctx && ctx->session->tokenizer() ? ctx->session->tokenizer()->bos_id() : 1;
}

nl_run_status nl_run_tokenize(nl_run_context* ctx, const char* text, int add_bos, int32_t* tokens, int n_max,
                              int* n_tokens) {
  if (!ctx) return NL_RUN_ERR_USAGE;
  return guarded(&ctx->error, [&] {
    const nl::Tokenizer* tok = ctx->session->tokenizer();
    if (!tok) throw nl::UsageError("tokenize: this image has no tokenizer (nl_run_params.tokenizer)");
    if (!text || !n_tokens || n_max < 0 || (n_max > 0 && !tokens))
      throw nl::UsageError("tokenize: text, tokens and n_tokens must not be NULL");
    std::vector<int32_t> ids;
    if (add_bos) ids.push_back(tok->bos_id());
    for (int32_t t : tok->encode(text)) ids.push_back(t);
    *n_tokens = int(ids.size());
    if (int(ids.size()) > n_max)
      throw nl::UsageError("tokenize: " + std::to_string(ids.size()) + " tokens, room for " + std::to_string(n_max));
    std::copy(ids.begin(), ids.end(), tokens);
  });
}

nl_run_status nl_run_detokenize(nl_run_context* ctx, const int32_t* tokens, int n, char* buf, size_t cap, size_t* len) {
  if (!ctx) return NL_RUN_ERR_USAGE;
  return guarded(&ctx->error, [&] {
    const nl::Tokenizer* tok = ctx->session->tokenizer();
    if (!tok) throw nl::UsageError("detokenize: this image has no tokenizer (nl_run_params.tokenizer)");
    if (!len || n < 0 || (n > 0 && !tokens) || (cap > 0 && !buf))
      throw nl::UsageError("detokenize: tokens, buf and len must not be NULL");
    const int vocab = ctx->session->manifest().config.vocab_size;
    for (int i = 0; i < n; ++i)
      if (tokens[i] < 0 || tokens[i] >= vocab)
        throw nl::UsageError("detokenize: " + std::to_string(tokens[i]) + " is not a token id in [0, " +
                             std::to_string(vocab) + ")");
    const std::string text = tok->decode(std::vector<int32_t>(tokens, tokens + n));
    *len = text.size();
    if (text.size() + 1 > cap)
      throw nl::UsageError("detokenize: " + std::to_string(text.size() + 1) + " bytes with the NUL, room for " +
                           std::to_string(cap));
    std::memcpy(buf, text.c_str(), text.size() + 1);
  });
}

nl_run_status nl_run_generate(nl_run_context* ctx, const int32_t* prompt, int n_prompt, int max_tokens,
                              const nl_run_sampling* sampling, nl_run_token_callback callback, void* user_data,
                              int* n_generated) {
  if (n_generated) *n_generated = 0;
  if (!ctx) return NL_RUN_ERR_USAGE;
  const nl_run_status st = guarded(&ctx->error, [&] {
    if (!prompt || n_prompt < 1) throw nl::UsageError("generate: the prompt is empty (BOS alone is one token)");
    const nl_run_sampling s = sampling ? *sampling : nl_run_default_sampling();
    nl::SamplerConfig sc;
    sc.temperature = s.temperature;
    sc.top_k = s.top_k;
    sc.top_p = s.top_p;
    sc.seed = s.seed;
    if (std::string p = nl::sampler_config_problem(sc); !p.empty()) throw nl::UsageError("sampling: " + p);
    nl::Session& se = *ctx->session;
    std::unique_ptr<nl::TextStream> text;
    const std::vector<int> ids(prompt, prompt + n_prompt);
    if (se.tokenizer()) text = std::make_unique<nl::TextStream>(*se.tokenizer(), ids);
    nl::GenerateHooks hooks;
    hooks.stop = &ctx->stop;
    hooks.on_token = [&](int t) {
      ctx->piece = text ? text->push(t) : std::string();
      if (n_generated) ++*n_generated;
      return !callback || callback(t, ctx->piece.c_str(), ctx->piece.size(), user_data) == 0;
    };
    ctx->totals_before = se.ffn()->totals();
    ctx->last = se.generate(ids, max_tokens, sc, s.ignore_eos ? std::vector<int>{} : se.stop_tokens(), hooks);
  });
  ctx->stop.store(false);
  return st;
}

void nl_run_request_stop(nl_run_context* ctx) {
  if (ctx) ctx->stop.store(true);
}

nl_run_status nl_run_get_counters(const nl_run_context* ctx, nl_run_counters* out) {
  if (!ctx || !out) return NL_RUN_ERR_USAGE;
  std::memset(out, 0, sizeof *out);
  const nl::Generation& g = ctx->last;
  out->prompt_tokens = uint64_t(g.prompt_forwards);
  out->generated_tokens = g.tokens.size();
  out->prefill_seconds = g.prefill_seconds;
  out->first_token_seconds = g.first_token_seconds;
  out->decode_seconds = g.decode_seconds;
  const nl::FlashCounters& t = ctx->session->ffn()->totals();
  const nl::FlashCounters& b = ctx->totals_before;
  out->active_neurons = t.active - b.active;
  out->reads = t.reads - b.reads;
  out->bytes_read = t.bytes_read - b.bytes_read;
  out->bytes_needed = t.bytes_needed - b.bytes_needed;
  out->cache_hits = t.cache_hits - b.cache_hits;
  out->io_seconds = t.io_seconds - b.io_seconds;
  out->compute_seconds = t.compute_seconds - b.compute_seconds;
  out->peak_rss_bytes = nl::peak_rss_bytes();
  out->cache_bundles_per_layer = ctx->session->memory().plan.cache_bundles_per_layer;
  out->cache_ratio = ctx->session->memory().cache_ratio;
  out->context = ctx->session->context();
  return NL_RUN_OK;
}

}  // extern "C"
