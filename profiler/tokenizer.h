// Tokenizers for profiling and generation: llama2.c `tokenizer.bin` (BPE by merge scores with byte fallback),
// SentencePiece `.model` files (libsentencepiece), and token-id files for tokenizers that live elsewhere.
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
// SentencePiece model protobuf (`.model`).
std::unique_ptr<Tokenizer> open_sentencepiece_tokenizer(const std::string& path);
// By content: a SentencePiece protobuf starts with field 1 (byte 0x0a); a llama2.c file with a small int32.
std::unique_ptr<Tokenizer> open_tokenizer(const std::string& path);

// Token-id file (docs/formats.md): UTF-8 text, one document per line, token ids as decimal integers separated by
// spaces or tabs; empty lines and lines starting with '#' are skipped. Ids are checked against `vocab_size`.
// Errors name the file and line.
std::vector<std::vector<int32_t>> read_token_id_file(const std::string& path, int vocab_size);

// Plain text as documents: paragraphs separated by blank lines or lines holding only '%' (fortune files); line
// breaks inside a paragraph become spaces; paragraphs longer than `max_chars` are cut at a space.
std::vector<std::string> split_documents(const std::string& text, size_t max_chars = 8192);

}  // namespace nl
