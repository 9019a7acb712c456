/* nl_run.h: the Neuralink runtime as a C library (in the style of llama.h), for phone apps and their JNI layer.
 *
 * Open a flash image (nl-layout pack writes model.nlw and its manifest model.nlw.json), tokenize, generate with a
 * per-token callback and a stop flag, read the counters, close. The dense weights live in DRAM; each token reads only
 * the FFN neurons it needs from the image (O_DIRECT), through the layout's read plan and neuron cache, exactly as
 * `nl-run generate`, which runs on the same engine (runtime/session.h): the same image, options and prompt give the
 * same tokens.
 *
 * Errors: every function that can fail returns an nl_run_status (0 = NL_RUN_OK); the message of the last failure is
 * nl_run_last_error(ctx) (one line, naming the file and what is wrong), or nl_run_last_error(NULL) for a failed
 * nl_run_open on the calling thread. No C++ type or exception crosses this interface. Messages name settings as
 * nl-run's options do (image: --image, select: --select, memory_budget: --memory-budget, cache_ratio: --cache-ratio,
 * gap: --gap, overlap: --overlap): the runtime reports both the same way.
 *
 * Threads: one generation at a time per context; nl_run_request_stop may be called from any thread. `n_threads`
 * sets OpenMP's worker count for the whole process.
 *
 * Link: libnl_runtime.a and libnl_formats_core.a (a C++ runtime and OpenMP; liburing where the build found it), as
 * examples/CMakeLists.txt does. docs/runtime.md "The C API".
 */
#ifndef NL_RUN_H
#define NL_RUN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NL_RUN_API_VERSION 1

/* The same numbers as the nl-run exit codes (docs/cli.md "Exit codes"). */
typedef enum nl_run_status {
  NL_RUN_OK = 0,
  NL_RUN_ERR_INTERNAL = 1, /* a bug: an invariant did not hold */
  NL_RUN_ERR_USAGE = 2,    /* a bad parameter (unknown --select, a prompt longer than the context, ...) */
  NL_RUN_ERR_INPUT = 3,    /* a malformed or inconsistent image, manifest or tokenizer; or the memory budget is
                              too small for the fixed part (nothing was loaded) */
  NL_RUN_ERR_IO = 4,       /* the operating system refused a read */
  NL_RUN_ERR_NOMEM = 6     /* an allocation failed */
} nl_run_status;

typedef struct nl_run_context nl_run_context;

/* Options of nl_run_open; start from nl_run_default_params(). Strings are copied; NULL means the default. */
typedef struct nl_run_params {
  const char* image;      /* model.nlw or its manifest model.nlw.json (required) */
  const char* tokenizer;  /* llama2.c tokenizer.bin; NULL = the manifest's, when its file sits beside it */
  const char* select;     /* "gate" (default: exact), "dense", "lowrank:R", "threshold", "threshold:T",
                             "topk:F", "predictor" (calibrated), "predictor:T" (deployed: no gate rows) */
  const char* overlap;    /* "auto" (default), "none", "layer", "cross", "both" */
  const char* io;         /* "auto" (default: io_uring where available, else pread), "pread", "preadv", "uring",
                             "mmap" */
  int direct;             /* 1 (default): O_DIRECT reads; 0: buffered */
  uint32_t queue_depth;   /* io_uring reads in flight at most; 0 = the default (4096 under overlap cross/both/auto,
                             else 32) */
  const char* gap;        /* read merging: "off", "N" bundles, "auto", "auto-keep-runs"; NULL = the manifest's */
  double cache_ratio;     /* neuron cache, share of each layer's FFN; < 0 (default) = sized by memory_budget, else the
                             manifest's */
  uint64_t memory_budget; /* bytes of DRAM for the whole process; 0 (default) = no budget */
  int context;            /* KV cache positions; 0 (default) = the model's seq_len */
  int n_threads;          /* OpenMP workers (process-wide); 0 (default) = leave as is */
  int verify;             /* 1: check every region's xxh64 at open (reads the whole image once) */
  int verify_reads;       /* 1: check every bundle read against start-up checksums */
  uint64_t seed;          /* the cache's admission draws (default 1) */
  int prefill_block;      /* prompt tokens per prefill pass; 0 (default) = 64 */
} nl_run_params;

/* Sampling of one generation; temperature 0 = greedy (argmax). */
typedef struct nl_run_sampling {
  float temperature; /* default 0 */
  int top_k;         /* 0 (default) = all tokens */
  float top_p;       /* 1 (default) = off */
  uint64_t seed;     /* default 1 */
  int ignore_eos;    /* 1: do not stop at the tokenizer's EOS */
} nl_run_sampling;

/* Figures of the last generation (and the context's settings). */
typedef struct nl_run_counters {
  uint64_t prompt_tokens, generated_tokens;
  double prefill_seconds, first_token_seconds, decode_seconds;
  uint64_t active_neurons; /* layer-tokens summed */
  uint64_t reads;          /* read operations issued */
  uint64_t bytes_read;     /* bytes read from the image (aligned) */
  uint64_t bytes_needed;   /* bundle bytes of active neurons not served by the cache */
  uint64_t cache_hits;     /* active neurons served from DRAM */
  double io_seconds, compute_seconds;
  uint64_t peak_rss_bytes;
  uint32_t cache_bundles_per_layer;
  double cache_ratio;
  int context;
} nl_run_counters;

/* Called with each generated token; `piece` is the text the token adds (piece_len bytes, NUL-terminated; may be an
 * incomplete UTF-8 sequence, empty without a tokenizer). Return nonzero to stop generating after this token. */
typedef int (*nl_run_token_callback)(int32_t token, const char* piece, size_t piece_len, void* user_data);

nl_run_params nl_run_default_params(void);
nl_run_sampling nl_run_default_sampling(void);

/* Opens the image, its tokenizer and loads the model under the budget; *out = NULL on failure. */
nl_run_status nl_run_open(const nl_run_params* params, nl_run_context** out);
void nl_run_close(nl_run_context* ctx);

/* The last failure's message ("" when none); ctx NULL: the calling thread's last failed nl_run_open. Valid until the
 * next call on the same context (or thread). */
const char* nl_run_last_error(const nl_run_context* ctx);

int nl_run_n_vocab(const nl_run_context* ctx);
int nl_run_context_size(const nl_run_context* ctx);
int nl_run_has_tokenizer(const nl_run_context* ctx);
int32_t nl_run_bos(const nl_run_context* ctx); /* 1 without a tokenizer (llama2.c's) */

/* Token ids of `text` (BOS first when add_bos) into tokens[0 .. n_max); *n_tokens = how many. When n_max is too small
 * nothing is written, *n_tokens = the count needed and NL_RUN_ERR_USAGE is returned. Needs a tokenizer. */
nl_run_status nl_run_tokenize(nl_run_context* ctx, const char* text, int add_bos, int32_t* tokens, int n_max,
                              int* n_tokens);

/* The text of tokens[0 .. n) (BOS/EOS dropped) into buf (NUL-terminated, at most cap bytes with the NUL); *len = its
 * length. When cap is too small nothing is written, *len = the length needed and NL_RUN_ERR_USAGE is returned. */
nl_run_status nl_run_detokenize(nl_run_context* ctx, const int32_t* tokens, int n, char* buf, size_t cap, size_t* len);

/* Generates up to max_tokens after the prompt on a fresh KV cache (prompt + max_tokens <= the context), calling
 * `callback` (may be NULL) per token; stops at EOS (unless ignore_eos), when the callback returns nonzero, or when
 * nl_run_request_stop was called. `sampling` NULL = greedy. *n_generated (may be NULL) = tokens generated. */
nl_run_status nl_run_generate(nl_run_context* ctx, const int32_t* prompt, int n_prompt, int max_tokens,
                              const nl_run_sampling* sampling, nl_run_token_callback callback, void* user_data,
                              int* n_generated);

/* From any thread: the running (or next) generation stops before its next token; cleared when a generation returns. */
void nl_run_request_stop(nl_run_context* ctx);

nl_run_status nl_run_get_counters(const nl_run_context* ctx, nl_run_counters* out);

#ifdef __cplusplus
}
#endif

#endif /* NL_RUN_H */
