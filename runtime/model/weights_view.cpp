// Typed weight views (runtime/model/weights_view.h).
#include "runtime/model/weights_view.h"

namespace nl {

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
    lv.rms_ffn = l.rms_ffn.empty() ? nullptr : l.rms_ffn.data();
    if (c.has_biases()) {
      lv.att_norm_b = l.att_norm_b.data();
      lv.ffn_norm_b = l.ffn_norm_b.empty() ? nullptr : l.ffn_norm_b.data();
      lv.bq = l.bq.data();
      lv.bk = l.bk.data();
      lv.bv = l.bv.data();
      lv.bo = l.bo.data();
      lv.b_up = l.b_up.empty() ? nullptr : l.b_up.data();
      lv.b_down = l.b_down.data();
    }
    v.layers.push_back(lv);
  }
  v.rms_final = w.rms_final.data();
  v.classifier = WeightView::f32(w.classifier(), c.vocab_size, dim);
  if (c.learned_positions())
    v.pos_embeddings = WeightView::f32(w.pos_embeddings.data(), c.seq_len + kOptPositionOffset, dim);
  if (c.has_biases()) v.final_norm_b = w.final_norm_b.data();
  if (c.classifier_bias()) v.cls_b = w.cls_b.data();
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
