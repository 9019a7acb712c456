// Tokenizers for profiling and generation: SentencePiece `.model` files (libsentencepiece), either kind opened by
// content, and token-id files for tokenizers that live elsewhere. The Tokenizer interface and the llama2.c
// `tokenizer.bin` are in runtime/tokenizer.h (the thin runtime needs them without dependencies).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/tokenizer.h"

namespace nl {

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
