// FlashFfn, selection: which neurons each token needs (gate rows in DRAM: exact ReLU, CATS threshold, low-rank
// predictor with calibration; or the sets a trace names), and the phase switches that start a run afresh.
#include <algorithm>
#include <cmath>
#include <limits>

#include "formats/core/error.h"
#include "runtime/ffn/internal.h"

namespace nl {
using namespace ffn_detail;

void FlashFfn::set_phase(LowRankPhase p, double target_recall) {
  if (opt_.select != SelectMode::kLowRank) throw InternalError("set_phase outside --select lowrank");
  if (phase_ == LowRankPhase::kCalibrate) {
    // Per layer: at most floor((1 - target) * n) of the n recorded firing neurons may score below the threshold.
    for (size_t l = 0; l < calib_.size(); ++l) {
      auto& v = calib_[l];
      if (v.empty()) {
        threshold_[l] = std::numeric_limits<float>::infinity();
        continue;
      }
      std::sort(v.begin(), v.end());
      const size_t miss = size_t(std::floor((1.0 - target_recall) * double(v.size())));
      threshold_[l] = v[std::min(miss, v.size() - 1)];
      v.clear();
    }
  }
  phase_ = p;
  pred_ = PredictorCounters{};
  start_afresh();
}

void FlashFfn::load_stored_predictor() {
  const ImageManifest& m = img_.manifest();
  const ModelConfig& c = m_.config;
  if (!m.has_predictor()) throw InternalError("load_stored_predictor: the image has no predictor");
  img_.read_region(m.predictor_region_index(), &pred_buf_);  // checksummed here, once; kept as stored
  const ImageDtype d = m.predictor_dtype();
  const int rank = m.predictor_rank;
  pred_residual_ = m.predictor_input == PredictorInput::kResidual;  // (Phi's parallel block never gets here: GeLU)
  const size_t rb1 = image_row_bytes(d, size_t(c.dim)), rb2 = image_row_bytes(d, size_t(rank));
  pred_fc1_.clear();
  pred_fc2_.clear();
  for (int l = 0; l < c.n_layers; ++l) {
    const uint8_t* p = pred_buf_.data() + size_t(l) * m.predictor_layer_bytes();
    pred_fc1_.push_back({d, p, rank, c.dim, rb1});
    pred_fc2_.push_back({d, p + size_t(rank) * rb1, c.hidden_dim, rank, rb2});
  }
}

void FlashFfn::predict_scores(int layer, int t, const float* x) {
  score_.resize(size_t(m_.config.hidden_dim));
  if (pred_fc1_.empty()) {
    const LowRankFactors& f = lowrank_[size_t(layer)];
    tmp_.resize(size_t(f.rank));
    f.predict(x, score_.data(), tmp_.data());
    add_gate_bias(layer, score_.data(), 1);  // the fit is of the gate rows (slot order: lowrank is unreplicated)
    return;
  }
  const WeightView& fc1 = pred_fc1_[size_t(layer)];
  const WeightView& fc2 = pred_fc2_[size_t(layer)];
  if (pred_residual_) {
    if (!resid_) throw InternalError("predict_scores: no residual stream set");
    x = resid_ + size_t(t) * size_t(m_.config.dim);
  }
  tmp_.resize(size_t(fc1.rows));
  pred_xq_.prepare(fc1.dtype, x, 1, fc1.cols);
  kernels::matmul(tmp_.data(), pred_xq_, fc1, 1);
  for (float& v : tmp_) v = v > 0.0f ? v : 0.0f;  // relu
  pred_hq_.prepare(fc2.dtype, tmp_.data(), 1, fc2.cols);
  kernels::matmul(score_.data(), pred_hq_, fc2, 1);
}

void FlashFfn::set_trace_active(int layer, const std::vector<uint32_t>& neurons, int token) {
  if (opt_.select != SelectMode::kTrace) throw InternalError("set_trace_active outside --select trace");
  if (token < 0) throw InternalError("set_trace_active: negative token");
  auto& per_token = trace_active_[size_t(layer)];
  if (per_token.size() <= size_t(token)) per_token.resize(size_t(token) + 1);
  auto& a = per_token[size_t(token)];
  a.clear();
  for (uint32_t n : neurons) {
    if (n >= slot_of_[size_t(layer)].size()) throw InternalError("trace: neuron index out of range");
    // A replicated layer keeps the neurons: the copies are chosen when the layer runs, under the cache then.
    a.push_back(rep_[size_t(layer)] ? n : slot_of_[size_t(layer)][n]);
  }
  std::sort(a.begin(), a.end());
}

void FlashFfn::set_thresholds(const std::vector<float>& t, double topk) {
  if (opt_.select != SelectMode::kThreshold || t.size() != opt_.act_threshold.size() || !(topk >= 0 && topk <= 1))
    throw InternalError("set_thresholds outside --select threshold, with the wrong layer count or top-k share");
  opt_.act_threshold = t;
  topk_ = topk;
  thr_ = ThresholdCounters{};
  start_afresh();
}

void FlashFfn::start_afresh() {
  make_caches();
  total_ = token_ = FlashCounters{};
  per_token_.clear();
  ov_ = OverlapCounters{};
  prev_needed_.assign(prev_needed_.size(), {});
  pf_window_.assign(pf_window_.size(), 0.0);
  pf_precision_.assign(pf_precision_.size(), 0.0);
  pred_layer_ = -1;
}

FlashFfn::GateFrom FlashFfn::select_token(int layer, int t, const float* xt, float* g) {
  const ModelConfig& c = m_.config;
  const int hidden = c.hidden_dim;
  g_by_slot_ = g;
  if (opt_.select == SelectMode::kLowRank && phase_ == LowRankPhase::kPredict) {
    auto t0 = Clock::now();
    predict_scores(layer, t, xt);
    const float thr = threshold_[size_t(layer)];
    active_.clear();
    for (int s = 0; s < hidden; ++s)
      if (score_[size_t(s)] >= thr) active_.push_back(uint32_t(s));
    token_.compute_seconds += since(t0);
    // Measurement only (untimed): the exact gate `g`, to count which predicted neurons really fire (none to count
    // under predictor:T, which keeps no gate rows).
    for (int s = 0; g && s < hidden; ++s) {
      const bool fires = g[s] > c.gate_floor(), chosen = score_[size_t(s)] >= thr;
      pred_.truly_active += fires;
      pred_.true_positive += fires && chosen;
    }
    pred_.predicted += active_.size();
    prev_needed_[size_t(layer)] = active_;
    return GateFrom::kBundleSparse;
  }
  if (opt_.select == SelectMode::kTrace) {
    // The given neurons' bundles; each gate from the bundle's own row (no gate rows in DRAM), in the stored dtype.
    // ReLU / FATReLU / dReLU: ffn_bundles applies the activation itself (zeros add nothing); SiLU: the gates first,
    // then the same sum.
    const auto& per_token = trace_active_[size_t(layer)];
    if (size_t(t) >= per_token.size())
      throw InternalError("trace: no active set for token " + std::to_string(t) + " of layer " + std::to_string(layer));
    const auto& given = per_token[size_t(t)];
    if (opt_.trace_pays_predictor) {  // the predictor's cost, paid: predictor:0's products and scan, then discarded
      auto t0 = Clock::now();
      predict_scores(layer, t, xt);
      size_t chosen = 0;
      for (int s = 0; s < c.hidden_dim; ++s) chosen += score_[size_t(s)] > 0.0f;
      token_.compute_seconds += since(t0);
      pred_.predicted += chosen;
    }
    if (rep_[size_t(layer)])
      choose_copies(layer, given.data(), given.size());
    else
      active_ = given;
    prev_needed_[size_t(layer)] = active_;
    return ffn_act_sparse(c.act) ? GateFrom::kBundleSparse : GateFrom::kBundleSmooth;
  }
  auto t0 = Clock::now();
  active_.clear();
  const bool sparse = ffn_act_sparse(c.act);
  const float floor = c.gate_floor();
  // Sparse activations: the gate decides, and for dReLU the up rows in DRAM too (selection_keeps_up_rows; without
  // them, as in lowrank's exact phases, every gate-positive neuron is read and those with up x <= 0 add nothing).
  const float* u = u_by_slot_;
  for (int s = 0; s < hidden; ++s) {
    if (sparse) {
      if (g[s] > floor && (!u || u[s] > 0.0f)) active_.push_back(uint32_t(s));
    } else {
      g[s] = ffn_act_smooth(c.act, g[s]);
      active_.push_back(uint32_t(s));
    }
  }
  if (opt_.select == SelectMode::kThreshold) {
    // CATS: keep |act| > t (sparse activations: act > max(floor, t)); the mass kept is measured on the same
    // activations.
    const float thr = opt_.act_threshold[size_t(layer)];
    size_t k = 0;
    for (int s = 0; s < hidden; ++s) thr_.mass_total += std::fabs(double(!sparse ? g[s] : g[s] > floor ? g[s] : 0.0f));
    if (topk_ > 0) {  // top-k: the ceil(share x hidden) largest |act| (ties: the lower slot), in slot order
      const size_t keep = std::min(active_.size(), size_t(std::ceil(topk_ * double(hidden))));
      const auto larger = [g](uint32_t a, uint32_t b) {
        const float x = std::fabs(g[a]), y = std::fabs(g[b]);
        return x > y || (x == y && a < b);
      };
      std::nth_element(active_.begin(), active_.begin() + std::ptrdiff_t(keep), active_.end(), larger);
      active_.resize(keep);
      std::sort(active_.begin(), active_.end());
    }
    for (uint32_t s : active_) {
      const float a = std::fabs(g[s]);
      if (a > thr) {
        active_[k++] = s;
        thr_.mass_kept += double(a);
      }
    }
    active_.resize(k);
    thr_.kept += k;
    thr_.total += uint64_t(hidden);
  }
  token_.compute_seconds += since(t0);
  if (opt_.select == SelectMode::kLowRank && phase_ == LowRankPhase::kCalibrate) {
    predict_scores(layer, t, xt);
    for (uint32_t s : active_) calib_[size_t(layer)].push_back(score_[s]);
    calib_samples_ += active_.size();
  }
  if (const ReplicaMap* rm = rep_[size_t(layer)].get()) {
    // active_ holds ranks of first copies (the gate rows' order): to neurons, the gates by slot, then the copies.
    const auto& firsts = first_slots_[size_t(layer)];
    neurons_.clear();
    g_slot_.resize(rm->n_slots());
    for (uint32_t r : active_) {
      const uint32_t v = rm->neuron_of[firsts[r]];
      neurons_.push_back(v);
      g_slot_[rm->first[v]] = g[r];
      if (rm->second[v] != kNoSlot) g_slot_[rm->second[v]] = g[r];
    }
    g_by_slot_ = g_slot_.data();
    choose_copies(layer, neurons_.data(), neurons_.size());
  }
  prev_needed_[size_t(layer)] = active_;
  return GateFrom::kGiven;
}

}  // namespace nl
