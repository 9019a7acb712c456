// Tokenizers: llama2.c BPE (against a direct transcription of run.c's O(n^2) merge loop and the reference text),
// SentencePiece, token-id files and document splitting, with malformed-input errors.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "model_test_util.h"
#include "profiler/tokenizer.h"
#include "skip_util.h"

using namespace nl;

namespace {

// run.c's encode, transcribed literally: dummy prefix, code points with byte fallback (+3), then repeatedly merge
// the best-scoring adjacent pair (first on ties).
std::vector<int32_t> naive_encode(const std::string& tok_path, const std::string& text) {
  const std::string d = read_file(tok_path);
  std::vector<std::string> vocab;
  std::vector<float> scores;
  size_t off = 4;
  while (off < d.size()) {
    float s;
    int32_t len;
    std::memcpy(&s, d.data() + off, 4);
    std::memcpy(&len, d.data() + off + 4, 4);
    vocab.push_back(d.substr(off + 8, size_t(len)));
    scores.push_back(s);
    off += 8 + size_t(len);
  }
  std::map<std::string, int> idx;
  for (size_t i = 0; i < vocab.size(); ++i) idx.emplace(vocab[i], int(i));
  std::vector<int32_t> t;
  if (!text.empty()) t.push_back(idx.at(" "));
  for (size_t i = 0; i < text.size();) {
    size_t n = 1;
    if ((unsigned char)text[i] >= 0xc0)
      while (i + n < text.size() && n < 4 && ((unsigned char)text[i + n] & 0xc0) == 0x80) ++n;
    auto it = idx.find(text.substr(i, n));
    if (it != idx.end())
      t.push_back(it->second);
    else
      for (size_t k = 0; k < n; ++k) t.push_back((unsigned char)text[i + k] + 3);
    i += n;
  }
  while (true) {
    float best = -1e10f;
    int best_id = -1, best_i = -1;
    for (size_t i = 0; i + 1 < t.size(); ++i) {
      auto it = idx.find(vocab[size_t(t[i])] + vocab[size_t(t[i + 1])]);
      if (it != idx.end() && scores[size_t(it->second)] > best)
        best = scores[size_t(it->second)], best_id = it->second, best_i = int(i);
    }
    if (best_i < 0) break;
    t[size_t(best_i)] = best_id;
    t.erase(t.begin() + best_i + 1);
  }
  return t;
}

std::string tmp(const std::string& name) {
  std::filesystem::create_directories("tokenizer_tmp");
  return std::filesystem::absolute("tokenizer_tmp/" + name).string();
}

void spit(const std::string& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

}  // namespace

TEST_CASE("llama2.c tokenizer: run.c's merges, the reference text, byte fallback" *
          test::needs_models({"llama2c-stories260K/tok512.bin", "llama2c-stories260K/reference-greedy.json"})) {
  const std::string path = std::string(NL_MODELS_DIR) + "/llama2c-stories260K/tok512.bin";
  const auto tok = open_tokenizer(path);
  CHECK(tok->kind() == "llama2c");
  CHECK(tok->vocab_size() == 512);
  const auto ref =
      nlohmann::json::parse(read_file(std::string(NL_MODELS_DIR) + "/llama2c-stories260K/reference-greedy.json"));
  const auto ids = ref["tokens"].get<std::vector<int32_t>>();
  const std::string text = ref["text"].get<std::string>();
  CHECK(tok->decode(ids) == text);
  // The model's own story re-encodes to the tokens it generated (first sentence).
  const std::string first = "Once upon a time, there was a little girl named Lily.";
  const auto enc = tok->encode(first);
  CHECK(std::vector<int32_t>(ids.begin() + 1, ids.begin() + 1 + long(enc.size())) == enc);
  for (const std::string& s : {first, text.substr(0, 600), std::string("Ünïcödé → bytes ✓ and tabs\tand\nnewlines"),
                               std::string("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa  bbbb   "), std::string("x"),
                               std::string("\xff\xfe broken utf-8 \xc3")}) {
    INFO(s);
    CHECK(tok->encode(s) == naive_encode(path, s));
  }
  CHECK(tok->encode("").empty());
  CHECK(tok->decode(tok->encode("Hello, world! Ünï")) == "Hello, world! Ünï");
}

TEST_CASE("SentencePiece tokenizer (babyllama tok105)" *
          test::needs_models({"babyllama-tok105/tok105.model", "babyllama-tok105/reference-greedy.json"})) {
  const std::string path = std::string(NL_MODELS_DIR) + "/babyllama-tok105/tok105.model";
  const auto tok = open_tokenizer(path);
  CHECK(tok->kind() == "sentencepiece");
  CHECK(tok->vocab_size() == 105);
  CHECK(tok->bos_id() == 1);
  const std::string s = "Once upon a time, there was a little girl.";
  const auto ids = tok->encode(s);
  CHECK(ids.size() > 5);
  CHECK(tok->decode(ids) == s);
  const auto ref =
      nlohmann::json::parse(read_file(std::string(NL_MODELS_DIR) + "/babyllama-tok105/reference-greedy.json"));
  const std::string story = tok->decode(ref["tokens"].get<std::vector<int32_t>>());
  MESSAGE("babyllama reference decodes to: " << story.substr(0, 80));
  CHECK(story.rfind("Once upon a time", 0) == 0);
}

TEST_CASE("malformed tokenizer files" * test::needs_models({"llama2c-stories260K/tok512.bin"})) {
  const std::string p = std::string(NL_MODELS_DIR) + "/llama2c-stories260K/tok512.bin";
  const std::string all = read_file(p);
  const std::string cut = tmp("cut.bin");
  spit(cut, all.substr(0, all.size() - 3));
  try {
    open_tokenizer(cut);
    FAIL("accepted a truncated tokenizer");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).rfind(cut + ": ", 0) == 0);
    CHECK(std::string(e.what()).find("truncated") != std::string::npos);
  }
  const std::string junk = tmp("junk.model");
  spit(junk, std::string("\x0a\x05garbage-protobuf", 18));
  CHECK_THROWS_AS(open_tokenizer(junk), InputError);
  const std::string neg = tmp("neg.bin");
  spit(neg, std::string("\xff\xff\xff\xff", 4) + all.substr(4));
  CHECK_THROWS_AS(open_tokenizer(neg), InputError);
}

TEST_CASE("token-id files: documents per line, comments, clear errors") {
  const std::string p = tmp("ids.txt");
  spit(p, "# a comment\n1 5 9\n\n  3\t4 7  \r\n");
  const auto docs = read_token_id_file(p, 10);
  REQUIRE(docs.size() == 2);
  CHECK(docs[0] == std::vector<int32_t>{1, 5, 9});
  CHECK(docs[1] == std::vector<int32_t>{3, 4, 7});
  spit(p, "1 2\n3 x4\n");
  try {
    read_token_id_file(p, 10);
    FAIL("accepted a bad id");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()) == p + ": line 2: 'x4' is not a token id (non-negative integer)");
  }
  spit(p, "1 2\n3 -4\n");
  CHECK_THROWS_AS(read_token_id_file(p, 10), InputError);
  spit(p, "1 2 10\n");
  try {
    read_token_id_file(p, 10);
    FAIL("accepted an id outside the vocabulary");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("line 1: token id 10 is outside") != std::string::npos);
  }
}

TEST_CASE("plain text splits into documents at blank lines and fortune separators") {
  const auto d = split_documents("First line\nsame paragraph.\n\nSecond.\n%\nThird  \n\n\n", 8192);
  REQUIRE(d.size() == 3);
  CHECK(d[0] == "First line same paragraph.");
  CHECK(d[1] == "Second.");
  CHECK(d[2] == "Third");
  const auto long_docs = split_documents(std::string(100, 'a') + " " + std::string(100, 'b'), 150);
  REQUIRE(long_docs.size() == 2);
  CHECK(long_docs[0] == std::string(100, 'a'));
}
