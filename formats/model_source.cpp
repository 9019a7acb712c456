// Packing from a streaming model source (formats/model_source.h).
#include "formats/model_source.h"

namespace nl {

ImageManifest image_write_source(const std::string& out, ModelSource& src, const ModelWeights& dense, ImageSpec spec) {
  spec.config = src.config();
  ImageWriter iw(out, std::move(spec));
  auto put = [&](const std::string& name, const std::vector<float>& v) { iw.add_dense(name, v.data(), v.size()); };
  put("tok_embeddings", dense.tok_embeddings);
  for (size_t l = 0; l < dense.layers.size(); ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const LayerWeights& lw = dense.layers[l];
    put(p + "rms_att", lw.rms_att);
    put(p + "wq", lw.wq);
    put(p + "wk", lw.wk);
    put(p + "wv", lw.wv);
    put(p + "wo", lw.wo);
    put(p + "rms_ffn", lw.rms_ffn);
  }
  put("rms_final", dense.rms_final);
  if (!dense.config.shared_classifier) put("wcls", dense.wcls);
  LayerWeights f;
  for (int l = 0; l < src.config().n_layers; ++l) {
    src.read_ffn(l, &f);
    iw.add_layer(l, f.w_gate.data(), f.w_up.data(), f.w_down.data());
  }
  return iw.commit();
}

}  // namespace nl
