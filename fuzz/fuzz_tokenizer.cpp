// libFuzzer harness: tokenizer files (profiler/tokenizer.h). The first input byte picks the reader: a
// tokenizer file (llama2.c tokenizer.bin or SentencePiece, by content) that then encodes and decodes a short
// text, or a token-id file.
#include "fuzz/fuzz_util.h"
#include "profiler/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const std::string path = nl::fuzz::scratch_path("tokenizer");
  const bool id_file = data[0] & 1;
  nl::fuzz::write_bytes(path, data + 1, size - 1);
  nl::fuzz::expect_clean(path, [&] {
    if (id_file) {
      auto docs = nl::read_token_id_file(path, 512);
      for (const auto& d : docs)
        for (int32_t t : d)
          if (t < 0 || t >= 512) std::abort();
      return;
    }
    auto tok = nl::open_tokenizer(path);
    if (tok->kind() != "llama2c") return;  // SentencePiece parsing is libsentencepiece's, not ours
    auto ids = tok->encode("Once upon a time, \xc3\xa9t\xc3\xa9 \xf0\x9f\x99\x82.");
    for (int32_t t : ids)
      if (t < 0 || t >= tok->vocab_size()) std::abort();
    (void)tok->decode(ids);
  });
  return 0;
}
