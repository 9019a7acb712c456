// Tokenizers the runtime needs without any dependency: the Tokenizer interface and the llama2.c `tokenizer.bin`
// (BPE by merge scores with byte fallback). SentencePiece (libsentencepiece) lives in profiler/tokenizer.h and
// reaches nl-run only in full builds.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace nl {

// Not thread-safe for concurrent encode() on one instance unless stated by the implementation.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids of `text`, without BOS/EOS (a leading-space "dummy prefix" as the tokenizer's convention wants).
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  // Text of a token sequence (BOS/EOS dropped).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int vocab_size() const = 0;
  virtual int bos_id() const { return 1; }
  virtual int eos_id() const { return 2; }
  virtual std::string kind() const = 0;  // "llama2c" or "sentencepiece"
};

// llama2.c tokenizer.bin: int32 max_token_length, then per token: float32 score, int32 length, bytes. Encoding
// follows llama2.c's run.c exactly (dummy prefix " ", UTF-8 code points, byte fallback to <0xXX>, then merge the
// adjacent pair with the highest score, leftmost on ties), in O(n log n) with a priority queue.
std::unique_ptr<Tokenizer> open_llama2c_tokenizer(const std::string& path);
// True when the file looks like a SentencePiece protobuf (field 1, byte 0x0a) rather than a llama2.c file, whose
// first int32 (max_token_length) is small.
bool is_sentencepiece_file(const std::string& path);

}  // namespace nl
