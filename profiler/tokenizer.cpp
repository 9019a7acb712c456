// Tokenizers: llama2.c BPE, SentencePiece, token-id files, and text splitting into documents.
#include "profiler/tokenizer.h"

#include <sentencepiece_processor.h>

#include <cstring>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"

namespace nl {
namespace {

class Llama2cTokenizer : public Tokenizer {
 public:
  explicit Llama2cTokenizer(const std::string& path) {
    const std::string data = read_file(path, 256u << 20);
    size_t off = 0;
    auto take = [&](void* dst, size_t n, const char* what) {
      if (off + n > data.size())
        throw InputError(path, std::string("ends inside ") + what + " of token " + std::to_string(vocab_.size()) + " (truncated)");
      std::memcpy(dst, data.data() + off, n);
      off += n;
    };
    int32_t max_len = 0;
    take(&max_len, 4, "the header");
    if (max_len <= 0 || max_len > 4096) throw InputError(path, "max_token_length " + std::to_string(max_len) + " is out of range; not a llama2.c tokenizer?");
    while (off < data.size()) {
      float score;
      int32_t len;
      take(&score, 4, "the score");
      take(&len, 4, "the length");
      if (len < 0 || len > max_len)
        throw InputError(path, "token " + std::to_string(vocab_.size()) + " has length " + std::to_string(len) +
                                   " (max_token_length " + std::to_string(max_len) + ")");
      std::string s(size_t(len), '\0');
      take(s.data(), size_t(len), "the text");
      scores_.push_back(score);
      vocab_.push_back(std::move(s));
    }
    if (vocab_.size() < 3) throw InputError(path, "holds fewer than 3 tokens");
    for (size_t i = 0; i < vocab_.size(); ++i) index_.emplace(vocab_[i], int32_t(i));  // first id wins on duplicates
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      auto it = index_.find(name);
      byte_id_[b] = it == index_.end() ? -1 : it->second;
    }
    path_ = path;
  }

  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    if (text.empty()) return ids;
    if (auto it = index_.find(" "); it != index_.end()) ids.push_back(it->second);
    // UTF-8 code points; unknown ones fall back to their bytes.
    for (size_t i = 0; i < text.size();) {
      size_t n = 1;
      const unsigned char c = static_cast<unsigned char>(text[i]);
      if (c >= 0xc0) {
        while (i + n < text.size() && n < 4 && (static_cast<unsigned char>(text[i + n]) & 0xc0) == 0x80) ++n;
      }
      auto it = index_.find(text.substr(i, n));
      if (it != index_.end()) {
        ids.push_back(it->second);
      } else {
        for (size_t k = 0; k < n; ++k) {
          const int id = byte_id_[static_cast<unsigned char>(text[i + k])];
          if (id < 0) throw InputError(path_, "cannot encode byte " + std::to_string(int(static_cast<unsigned char>(text[i + k]))) + ": no <0xXX> token");
          ids.push_back(id);
        }
      }
      i += n;
    }
    return merge(ids);
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    int32_t prev = -1;
    for (int32_t t : ids) {
      if (t < 0 || size_t(t) >= vocab_.size()) throw UsageError("token id " + std::to_string(t) + " outside the vocabulary");
      if (t == bos_id() || t == eos_id()) {
        prev = t;
        continue;
      }
      const std::string& piece = vocab_[size_t(t)];
      unsigned int byte;
      if (piece.size() == 6 && std::sscanf(piece.c_str(), "<0x%02X>", &byte) == 1) {
        out += char(byte);
      } else {
        out += (prev == bos_id() || prev == -1) && !piece.empty() && piece[0] == ' ' ? piece.substr(1) : piece;
      }
      prev = t;
    }
    return out;
  }

  int vocab_size() const override { return int(vocab_.size()); }
  std::string kind() const override { return "llama2c"; }

 private:
  std::string path_;
  std::vector<std::string> vocab_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int32_t> index_;
  int byte_id_[256];

  // Highest-score adjacent merge first, leftmost on ties (as run.c's linear scan), with lazy invalidation.
  std::vector<int32_t> merge(std::vector<int32_t> tok) const {
    const int n = int(tok.size());
    std::vector<int> next(static_cast<size_t>(n)), prev(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) next[size_t(i)] = i + 1, prev[size_t(i)] = i - 1;
    struct Cand {
      float score;
      int left;
      int32_t a, b, merged;
    };
    auto worse = [](const Cand& x, const Cand& y) { return x.score != y.score ? x.score < y.score : x.left > y.left; };
    std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> pq(worse);
    auto consider = [&](int left) {
      const int right = next[size_t(left)];
      if (left < 0 || right >= n) return;
      auto it = index_.find(vocab_[size_t(tok[size_t(left)])] + vocab_[size_t(tok[size_t(right)])]);
      if (it != index_.end()) pq.push({scores_[size_t(it->second)], left, tok[size_t(left)], tok[size_t(right)], it->second});
    };
    for (int i = 0; i + 1 < n; ++i) consider(i);
    std::vector<char> alive(size_t(n), 1);
    while (!pq.empty()) {
      const Cand c = pq.top();
      pq.pop();
      const int right = next[size_t(c.left)];
      if (!alive[size_t(c.left)] || right >= n || tok[size_t(c.left)] != c.a || tok[size_t(right)] != c.b) continue;
      tok[size_t(c.left)] = c.merged;
      alive[size_t(right)] = 0;
      next[size_t(c.left)] = next[size_t(right)];
      if (next[size_t(right)] < n) prev[size_t(next[size_t(right)])] = c.left;
      if (prev[size_t(c.left)] >= 0) consider(prev[size_t(c.left)]);
      consider(c.left);
    }
    std::vector<int32_t> out;
    for (int i = 0; i < n; i = next[size_t(i)]) out.push_back(tok[size_t(i)]);
    return out;
  }
};

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

std::unique_ptr<Tokenizer> open_llama2c_tokenizer(const std::string& path) { return std::make_unique<Llama2cTokenizer>(path); }

std::unique_ptr<Tokenizer> open_sentencepiece_tokenizer(const std::string& path) {
  return std::make_unique<SentencePieceTokenizer>(path);
}

std::unique_ptr<Tokenizer> open_tokenizer(const std::string& path) {
  const std::string head = read_file(path, 256u << 20).substr(0, 4);
  if (head.size() < 4) throw InputError(path, "too small for a tokenizer");
  if (head[0] == 0x0a) return open_sentencepiece_tokenizer(path);
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
      while (j < line.size() && line[j] >= '0' && line[j] <= '9' && v <= int64_t(1) << 31) v = v * 10 + (line[j++] - '0');
      if (j == i || (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r'))
        throw InputError(path, "line " + std::to_string(lineno) + ": '" + line.substr(i, line.find_first_of(" \t", i) - i) +
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
