// Temperature / top-k / top-p sampling (runtime/sampler.h).
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "formats/core/error.h"

namespace nl {

std::string sampler_config_problem(const SamplerConfig& c) {
  if (!(c.temperature >= 0) || !std::isfinite(c.temperature)) return "--temperature must be >= 0";
  if (c.top_k < 0) return "--top-k must be >= 0 (0 = off)";
  if (!(c.top_p > 0 && c.top_p <= 1)) return "--top-p must be in (0, 1]";
  return "";
}

int argmax(const float* x, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

Sampler::Sampler(const SamplerConfig& c) : c_(c), rng_(c.seed) {
  if (std::string p = sampler_config_problem(c); !p.empty()) throw UsageError(p);
}

int Sampler::sample(const float* logits, int n) {
  cand_.clear();
  if (c_.temperature < kGreedyBelowTemperature || c_.top_k == 1) {
    const int t = argmax(logits, n);
    cand_.push_back({t, 1.0});
    return t;
  }
  // Descending by logit, ties by token id: a total order, so the candidate list never depends on the sort's
  // implementation.
  auto before = [](const std::pair<int, double>& a, const std::pair<int, double>& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  };
  cand_.reserve(size_t(n));
  // (logit - max) / T: never above 0, so no temperature can make an infinity or a NaN of it.
  const double top = logits[argmax(logits, n)];
  for (int i = 0; i < n; ++i) cand_.push_back({i, (double(logits[i]) - top) / c_.temperature});
  size_t keep = size_t(n);
  if (c_.top_k > 0 && size_t(c_.top_k) < keep) {
    keep = size_t(c_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + long(keep), cand_.end(), before);
    cand_.resize(keep);
  } else {
    std::sort(cand_.begin(), cand_.end(), before);
  }
  // Softmax in double over the kept candidates (the first is the largest).
  const double mx = cand_[0].second;
  double sum = 0;
  for (auto& c : cand_) sum += (c.second = std::exp(c.second - mx));
  for (auto& c : cand_) c.second /= sum;
  if (c_.top_p < 1) {
    double cum = 0;
    size_t k = 0;
    while (k < cand_.size()) {
      cum += cand_[k++].second;
      if (cum >= c_.top_p) break;
    }
    cand_.resize(k);
    for (auto& c : cand_) c.second /= cum;
  }
  const double u = rng_.uniform();
  double cum = 0;
  for (const auto& c : cand_) {
    cum += c.second;
    if (u < cum) return c.first;
  }
  return cand_.back().first;  // u within rounding of 1
}

}  // namespace nl
