// Tokenizers: SentencePiece, opening either kind by content, token-id files, and text splitting into documents
// (the llama2.c BPE tokenizer is runtime/tokenizer.cpp).
#include "profiler/tokenizer.h"

#include <sentencepiece_processor.h>

#include <sstream>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"

namespace nl {
namespace {

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) {
    const auto st = sp_.Load(path);
    if (!st.ok()) throw InputError(path, "not a SentencePiece model: " + st.ToString());
  }
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int> ids;
    const auto st = sp_.Encode(text, &ids);
    if (!st.ok()) throw InternalError("SentencePiece encode failed: " + st.ToString());
    return std::vector<int32_t>(ids.begin(), ids.end());
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::vector<int> v;
    for (int32_t t : ids)
      if (t != bos_id() && t != eos_id()) v.push_back(t);
    std::string out;
    const auto st = sp_.Decode(v, &out);
    if (!st.ok()) throw UsageError("SentencePiece decode failed: " + st.ToString());
    return out;
  }
  int vocab_size() const override { return sp_.GetPieceSize(); }
  int bos_id() const override { return sp_.bos_id() >= 0 ? sp_.bos_id() : 1; }
  int eos_id() const override { return sp_.eos_id() >= 0 ? sp_.eos_id() : 2; }
  std::string kind() const override { return "sentencepiece"; }

 private:
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

std::unique_ptr<Tokenizer> open_sentencepiece_tokenizer(const std::string& path) {
  return std::make_unique<SentencePieceTokenizer>(path);
}

std::unique_ptr<Tokenizer> open_tokenizer(const std::string& path) {
  if (is_sentencepiece_file(path)) return open_sentencepiece_tokenizer(path);
  return open_llama2c_tokenizer(path);
}

std::vector<std::vector<int32_t>> read_token_id_file(const std::string& path, int vocab_size) {
  const std::string data = read_file(path, 4ull << 30);
  std::vector<std::vector<int32_t>> docs;
  std::istringstream in(data);
  std::string line;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    size_t i = 0;
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    if (i == line.size() || line[i] == '#') continue;
    std::vector<int32_t> doc;
    while (i < line.size()) {
      if (line[i] == ' ' || line[i] == '\t' || line[i] == '\r') {
        ++i;
        continue;
      }
      int64_t v = 0;
      size_t j = i;
      while (j < line.size() && line[j] >= '0' && line[j] <= '9' && v <= int64_t(1) << 31)
        v = v * 10 + (line[j++] - '0');
      if (j == i || (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r'))
        throw InputError(path, "line " + std::to_string(lineno) + ": '" +
                                   line.substr(i, line.find_first_of(" \t", i) - i) +
                                   "' is not a token id (non-negative integer)");
      if (v >= vocab_size)
        throw InputError(path, "line " + std::to_string(lineno) + ": token id " + std::to_string(v) +
                                   " is outside the model's vocabulary (0.." + std::to_string(vocab_size - 1) + ")");
      doc.push_back(int32_t(v));
      i = j;
    }
    docs.push_back(std::move(doc));
  }
  return docs;
}

std::vector<std::string> split_documents(const std::string& text, size_t max_chars) {
  std::vector<std::string> docs;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty()) docs.push_back(std::move(cur));
    cur.clear();
  };
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t a = line.find_first_not_of(" \t");
    if (a == std::string::npos || (line.substr(a) == "%")) {
      flush();
      continue;
    }
    size_t b = line.find_last_not_of(" \t");
    std::string part = line.substr(a, b - a + 1);
    if (!cur.empty()) cur += ' ';
    cur += part;
    while (cur.size() > max_chars) {
      size_t cut = cur.rfind(' ', max_chars);
      if (cut == std::string::npos || cut == 0) cut = max_chars;
      docs.push_back(cur.substr(0, cut));
      cur.erase(0, cut + (cut < cur.size() && cur[cut] == ' ' ? 1 : 0));
    }
  }
  flush();
  return docs;
}

}  // namespace nl
