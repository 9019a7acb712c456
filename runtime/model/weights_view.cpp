// Typed weight views (runtime/model/weights_view.h).
#include "runtime/model/weights_view.h"

#include <utility>

#include "formats/core/error.h"

namespace nl {

void set_view_vector(ModelView& v, const DenseTensorSpec& t, const float* p) {
  using LW = LayerWeights;
  using LV = LayerView;
  static const std::pair<std::vector<float> LW::*, const float * LV::*> kLayer[] = {{&LW::rms_att, &LV::rms_att},
                                                                                    {&LW::rms_ffn, &LV::rms_ffn},
                                                                                    {&LW::att_norm_b, &LV::att_norm_b},
                                                                                    {&LW::ffn_norm_b, &LV::ffn_norm_b},
                                                                                    {&LW::bq, &LV::bq},
                                                                                    {&LW::bk, &LV::bk},
                                                                                    {&LW::bv, &LV::bv},
                                                                                    {&LW::bo, &LV::bo},
                                                                                    {&LW::b_up, &LV::b_up},
                                                                                    {&LW::b_down, &LV::b_down}};
  static const std::pair<std::vector<float> ModelWeights::*, const float * ModelView::*> kModel[] = {
      {&ModelWeights::rms_final, &ModelView::rms_final},
      {&ModelWeights::final_norm_b, &ModelView::final_norm_b},
      {&ModelWeights::cls_b, &ModelView::cls_b}};
  if (t.layer >= 0) {
    for (const auto& [weights, view] : kLayer)
      if (weights == t.layer_field) {
        v.layers[size_t(t.layer)].*view = p;
        return;
      }
  } else {
    for (const auto& [weights, view] : kModel)
      if (weights == t.model_field) {
        v.*view = p;
        return;
      }
  }
  throw InternalError("set_view_vector: no view field for dense vector " + t.name);
}

ModelView view_of(const ModelWeights& w) {
  const ModelConfig& c = w.config;
  const int dim = c.dim, kv = c.kv_dim();
  ModelView v;
  v.config = c;
  v.source = w.source;
  v.tok_embeddings = WeightView::f32(w.tok_embeddings.data(), c.vocab_size, dim);
  for (const LayerWeights& l : w.layers) {
    LayerView lv;
    lv.rms_att = l.rms_att.data();
    lv.wq = WeightView::f32(l.wq.data(), dim, dim);
    lv.wk = WeightView::f32(l.wk.data(), kv, dim);
    lv.wv = WeightView::f32(l.wv.data(), kv, dim);
    lv.wo = WeightView::f32(l.wo.data(), dim, dim);
    v.layers.push_back(lv);
  }
  for (const DenseTensorSpec& t : dense_tensor_specs(c))
    if (t.rows == 1) set_view_vector(v, t, t.in(w).data());
  v.classifier = WeightView::f32(w.classifier(), c.vocab_size, dim);
  if (c.learned_positions())
    v.pos_embeddings = WeightView::f32(w.pos_embeddings.data(), c.seq_len + kOptPositionOffset, dim);
  return v;
}

std::string model_view_problem(const ModelView& v) {
  const ModelConfig& c = v.config;
  if (std::string p = model_config_problem(c); !p.empty()) return p;
  auto bad = [](const WeightView& m, int rows, int cols) {
    return m.data == nullptr || m.rows != rows || m.cols != cols ||
           m.row_stride < image_row_bytes(m.dtype, size_t(cols));
  };
  auto shape = [](const char* name, const WeightView& m, int rows, int cols) {
    return std::string(name) + " is " + std::to_string(m.rows) + "x" + std::to_string(m.cols) + ", expected " +
           std::to_string(rows) + "x" + std::to_string(cols);
  };
  if (bad(v.tok_embeddings, c.vocab_size, c.dim))
    return shape("token embedding", v.tok_embeddings, c.vocab_size, c.dim);
  if (bad(v.classifier, c.vocab_size, c.dim)) return shape("classifier", v.classifier, c.vocab_size, c.dim);
  if (!v.rms_final) return "final norm missing";
  if (c.learned_positions() && bad(v.pos_embeddings, c.seq_len + kOptPositionOffset, c.dim))
    return shape("position embedding", v.pos_embeddings, c.seq_len + kOptPositionOffset, c.dim);
  if (c.has_biases() && !v.final_norm_b) return "final norm bias missing";
  if (c.classifier_bias() && !v.cls_b) return "classifier bias missing";
  if (v.layers.size() != size_t(c.n_layers))
    return "has " + std::to_string(v.layers.size()) + " layers, config says " + std::to_string(c.n_layers);
  for (const LayerView& l : v.layers) {
    if (!l.rms_att || (!c.parallel_block() && !l.rms_ffn)) return "a layer norm is missing";
    if (bad(l.wq, c.dim, c.dim)) return shape("wq", l.wq, c.dim, c.dim);
    if (bad(l.wk, c.kv_dim(), c.dim)) return shape("wk", l.wk, c.kv_dim(), c.dim);
    if (bad(l.wv, c.kv_dim(), c.dim)) return shape("wv", l.wv, c.kv_dim(), c.dim);
    if (bad(l.wo, c.dim, c.dim)) return shape("wo", l.wo, c.dim, c.dim);
    if (c.has_biases() &&
        (!l.att_norm_b || (!c.parallel_block() && !l.ffn_norm_b) || !l.bq || !l.bk || !l.bv || !l.bo || !l.b_down))
      return "a layer bias is missing";
  }
  return "";
}

}  // namespace nl
