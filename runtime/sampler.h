// Next-token sampling for generation: greedy (temperature 0) or temperature + top-k + top-p over the logits, drawn
// with the project's seeded PRNG (SplitMix64, formats/core/rng.h), so the same seed gives the same tokens on every
// thread count and CPU. Order (as llama2.c and Hugging Face's logits warpers): divide by the temperature, keep the
// top-k logits, keep the smallest set of most likely tokens whose probability reaches top-p, renormalise, draw one.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "formats/core/rng.h"

namespace nl {

// Temperatures below this sample greedily (argmax): T -> 0 is greedy in the limit, and dividing logits by a tiny T
// overflows to infinities (a denormal T once sampled the last vocabulary id every step). docs/cli.md states it.
inline constexpr double kGreedyBelowTemperature = 1e-4;

struct SamplerConfig {
  double temperature = 0;  // 0 (and anything below kGreedyBelowTemperature) = greedy (argmax; ties to the lowest id)
  int top_k = 0;           // 0 = off (all tokens)
  double top_p = 1.0;      // 1 = off; in (0, 1]
  uint64_t seed = 1;
};

// "" or what is wrong with the settings (negative temperature, top-p outside (0, 1], negative top-k).
std::string sampler_config_problem(const SamplerConfig& c);

// Index of the largest value (the lowest index among equal maxima).
int argmax(const float* x, int n);

// Not thread-safe: one sampler per generation.
class Sampler {
 public:
  explicit Sampler(const SamplerConfig& c);  // throws UsageError on bad settings
  const SamplerConfig& config() const { return c_; }
  // One token from logits [n]. Greedy consumes no random numbers; otherwise exactly one draw per call.
  int sample(const float* logits, int n);
  // The renormalised distribution the last sample() drew from (token ids descending by probability; greedy: the
  // argmax with probability 1). For tests and diagnostics.
  const std::vector<std::pair<int, double>>& last_distribution() const { return cand_; }

 private:
  SamplerConfig c_;
  SplitMix64 rng_;
  std::vector<std::pair<int, double>> cand_;  // (token, scaled logit, then probability)
};

}  // namespace nl
