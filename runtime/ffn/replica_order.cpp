// FlashFfn, flash replication: the copy of each active neuron the cover picks, and the down projection in
// first-copy order (the layout without replicas) whichever copy was read.
#include <algorithm>
#include <cstring>

#include "formats/core/error.h"
#include "runtime/ffn/internal.h"

namespace nl {
using namespace ffn_detail;

void FlashFfn::choose_copies(int layer, const uint32_t* neurons, size_t n) {
  for (size_t k = 0; k < n; ++k)
    if (neurons[k] >= slot_of_[size_t(layer)].size()) throw InternalError("active neuron index out of range");
  // The cover sees the cache as the planner will (before this token's update), as nl-layout eval's does.
  cover_[size_t(layer)]->choose(neurons, n, caches_[size_t(layer)].get(), active_);
  const ReplicaMap& rm = *rep_[size_t(layer)];
  seconds_ = 0;
  for (uint32_t s : active_) seconds_ += rm.first_of(s) != s;
  token_.replica_reads += seconds_;
}

bool FlashFfn::begin_ordered(int layer) {
  const ReplicaMap* rm = rep_[size_t(layer)].get();
  if (!rm) return false;
  const size_t n = active_.size();
  if (seconds_ == 0) return false;  // every chosen copy is a first copy: slot order is first-copy order
  ord_.resize(n);
  for (size_t k = 0; k < n; ++k) ord_[k] = k;
  std::sort(ord_.begin(), ord_.end(),
            [&](size_t a, size_t b) { return rm->first_of(active_[a]) < rm->first_of(active_[b]); });
  ord_pos_.resize(n);
  for (size_t q = 0; q < n; ++q) ord_pos_[ord_[q]] = q;
  down_of_.resize(n);
  ord_q_ = 0;
  ord_started_ = false;
  if (stash_cap_ < n * row_bytes_) {  // grows only; its pages are touched only by what waits
    stash_cap_ = n * row_bytes_;
    stash_.reset(new uint8_t[stash_cap_]);
  }
  return true;
}

void FlashFfn::compute_ordered(int layer, size_t k0, size_t k1, GateFrom from, float* out, bool last,
                               bool coefficients) {
  for (size_t k = k0; k < k1; ++k) {
    if (coefficients) bundles_[k] = bundle(layer, active_[k]);
    down_of_[k] = bundles_[k] + down_off_;
  }
  if (coefficients) coefficients_parallel(k0, k1, from);
  // Every index landed so far (< k1) whose turn came, in first-copy order, kept as compute_range keeps them.
  hd_.clear();
  downs_.clear();
  const size_t n = active_.size();
  for (; ord_q_ < n && ord_[ord_q_] < k1; ++ord_q_) {
    const size_t k = ord_[ord_q_];
    if (from != GateFrom::kBundleSparse || h_[k] != 0.0f) {
      hd_.push_back(h_[k]);
      downs_.push_back(down_of_[k]);
    }
  }
  if (!hd_.empty() || !ord_started_) {
    kernels::down_project(m_.dtype, out, m_.config.dim, hd_.data(), downs_.data(), int(hd_.size()), ord_started_);
    ord_started_ = true;
  }
  if (last) return;
  for (size_t k = k0; k < k1; ++k)
    if (ord_pos_[k] >= ord_q_) {
      uint8_t* dst = stash_.get() + k * row_bytes_;
      std::memcpy(dst, down_of_[k], row_bytes_);
      down_of_[k] = dst;
    }
}

}  // namespace nl
