/* What a phone app's JNI layer calls: open a flash image under a memory budget, tokenize a prompt, generate with a
 * per-token callback (streaming the text) and a stop flag, read the counters, close. Plain C against nl_run.h.
 *
 * Usage: nl_run_example IMAGE [--prompt TEXT | --prompt-tokens 1,2,3] [--steps N] [--select S] [--budget BYTES]
 *                             [--cache-ratio R] [--gap G] [--threads N] [--stop-after K]
 * Prints the streamed text (with a tokenizer), then "tokens: ..." (the ids, as nl-run generate prints them) and one
 * line of counters on stderr. Exit status: the nl_run_status of the first failure (0 when all went well). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nl_run.h"

struct stream {
  nl_run_context* ctx;
  int32_t ids[4096];
  int n;
  int stop_after; /* > 0: ask for a stop once this many tokens came (as a UI's stop button would) */
};

static int on_token(int32_t token, const char* piece, size_t piece_len, void* user) {
  struct stream* s = (struct stream*)user;
  if (s->n < 4096) s->ids[s->n++] = token;
  fwrite(piece, 1, piece_len, stdout);
  fflush(stdout);
  if (s->stop_after > 0 && s->n >= s->stop_after) nl_run_request_stop(s->ctx);
  return 0; /* nonzero would stop after this token, too */
}

static int fail(nl_run_context* ctx, nl_run_status st) {
  fprintf(stderr, "nl_run_example: error: %s\n", nl_run_last_error(ctx));
  nl_run_close(ctx);
  return (int)st;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s IMAGE [--prompt TEXT | --prompt-tokens IDS] [--steps N] [--select S] ...\n", argv[0]);
    return 2;
  }
  nl_run_params p = nl_run_default_params();
  p.image = argv[1];
  const char* prompt = NULL;
  const char* ids_arg = "1";
  int steps = 16, stop_after = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    const char* k = argv[i];
    const char* v = argv[i + 1];
    if (!strcmp(k, "--prompt"))
      prompt = v;
    else if (!strcmp(k, "--prompt-tokens"))
      ids_arg = v;
    else if (!strcmp(k, "--steps"))
      steps = atoi(v);
    else if (!strcmp(k, "--select"))
      p.select = v;
    else if (!strcmp(k, "--budget"))
      p.memory_budget = strtoull(v, NULL, 10);
    else if (!strcmp(k, "--cache-ratio"))
      p.cache_ratio = atof(v);
    else if (!strcmp(k, "--gap"))
      p.gap = v;
    else if (!strcmp(k, "--threads"))
      p.n_threads = atoi(v);
    else if (!strcmp(k, "--stop-after"))
      stop_after = atoi(v);
    else {
      fprintf(stderr, "nl_run_example: unknown option %s\n", k);
      return 2;
    }
  }
  nl_run_context* ctx = NULL;
  nl_run_status st = nl_run_open(&p, &ctx);
  if (st != NL_RUN_OK) return fail(NULL, st);

  int32_t prompt_ids[1024];
  int n_prompt = 0;
  if (prompt) {
    st = nl_run_tokenize(ctx, prompt, 1, prompt_ids, 1024, &n_prompt);
    if (st != NL_RUN_OK) return fail(ctx, st);
  } else {
    for (const char* c = ids_arg; *c && n_prompt < 1024;) {
      prompt_ids[n_prompt++] = (int32_t)strtol(c, (char**)&c, 10);
      if (*c == ',') ++c;
    }
  }
  struct stream s;
  memset(&s, 0, sizeof s);
  s.ctx = ctx;
  s.stop_after = stop_after;
  if (nl_run_has_tokenizer(ctx)) { /* the prompt's text, then each token's as it comes (as nl-run generate) */
    static char text[65536];
    size_t len = 0;
    st = nl_run_detokenize(ctx, prompt_ids, n_prompt, text, sizeof text, &len);
    if (st != NL_RUN_OK) return fail(ctx, st);
    printf("text: %s", text);
  }
  nl_run_sampling greedy = nl_run_default_sampling();
  int n_generated = 0;
  st = nl_run_generate(ctx, prompt_ids, n_prompt, steps, &greedy, on_token, &s, &n_generated);
  if (st != NL_RUN_OK) return fail(ctx, st);
  if (nl_run_has_tokenizer(ctx)) fputc('\n', stdout);
  printf("tokens:");
  for (int i = 0; i < s.n; ++i) printf(" %d", (int)s.ids[i]);
  printf("\n");

  nl_run_counters c;
  nl_run_get_counters(ctx, &c);
  fprintf(stderr,
          "nl_run_example: %d tokens (%llu prompt), first after %.3f s, decode %.3f s; %llu reads, %llu bytes read, "
          "%llu cache hits; cache %u bundles per layer (ratio %.3f), context %d, peak RSS %llu bytes\n",
          n_generated, (unsigned long long)c.prompt_tokens, c.first_token_seconds, c.decode_seconds,
          (unsigned long long)c.reads, (unsigned long long)c.bytes_read, (unsigned long long)c.cache_hits,
          c.cache_bundles_per_layer, c.cache_ratio, c.context, (unsigned long long)c.peak_rss_bytes);
  nl_run_close(ctx);
  return 0;
}
