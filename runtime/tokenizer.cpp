// The llama2.c BPE tokenizer (runtime/tokenizer.h).
#include "runtime/tokenizer.h"

#include <cstdio>
#include <cstring>
#include <queue>
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
        throw InputError(
            path, std::string("ends inside ") + what + " of token " + std::to_string(vocab_.size()) + " (truncated)");
      std::memcpy(dst, data.data() + off, n);
      off += n;
    };
    int32_t max_len = 0;
    take(&max_len, 4, "the header");
    if (max_len <= 0 || max_len > 4096)
      throw InputError(path,
                       "max_token_length " + std::to_string(max_len) + " is out of range; not a llama2.c tokenizer?");
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
          if (id < 0)
            throw InputError(path_, "cannot encode byte " +
                                        std::to_string(int(static_cast<unsigned char>(text[i + k]))) +
                                        ": no <0xXX> token");
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
      if (t < 0 || size_t(t) >= vocab_.size())
        throw UsageError("token id " + std::to_string(t) + " outside the vocabulary");
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
      if (it != index_.end())
        pq.push({scores_[size_t(it->second)], left, tok[size_t(left)], tok[size_t(right)], it->second});
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

}  // namespace

std::unique_ptr<Tokenizer> open_llama2c_tokenizer(const std::string& path) {
  return std::make_unique<Llama2cTokenizer>(path);
}

bool is_sentencepiece_file(const std::string& path) {
  const std::string head = read_file(path, 256u << 20).substr(0, 4);
  if (head.size() < 4) throw InputError(path, "too small for a tokenizer");
  return head[0] == 0x0a;
}

}  // namespace nl
