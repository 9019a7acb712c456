// The flash image (`model.nlw`) and its manifest (`model.nlw.json`), format version 1 (docs/formats.md).
// The image is a 4096-byte header block, a dense region (embeddings, attention, norms, classifier) and one region
// per FFN layer, each 4096-aligned; an FFN region holds that layer's neuron bundles in layout order. The manifest
// says where everything is, its checksum, and which original neuron each bundle slot holds. This file owns the
// manifest structure, its JSON form, the header, and every consistency check made when a pair is opened; the
// writer is formats/core/image_writer.h, the runtime reads through runtime/io.
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/core/cache_admission.h"
#include "formats/core/model_weights.h"

namespace nl {

inline constexpr uint32_t kImageVersionMajor = 1;
// Minor 1: per-tensor dtypes, q8_0 / q4_0, the image id covers every manifest field that changes the computation
// (image_id_of below). Minor-0 manifests still open (their id covers the region table only).
inline constexpr uint32_t kImageVersionMinor = 1;
// Minor 2: flash replication (an FFN region holds n_neurons + replicas bundles, `replicas` per layer). Written only
// when a layer holds replicas, so unreplicated images keep their 1.1 bytes; a 1.1 reader refuses a 1.2 order (its
// length is not the layer's neuron count) rather than misreading it.
inline constexpr uint32_t kImageVersionMinorReplicas = 2;
// Minor 3: the id also covers `act_threshold` (the CATS thresholds change which neurons --select threshold computes).
// Written only when the manifest records thresholds, so other images keep their 1.1 / 1.2 bytes; 1.1 / 1.2 images
// with thresholds still open, and nl-run warns that their thresholds are not covered (re-pack to cover them).
inline constexpr uint32_t kImageVersionMinorThresholds = 3;
// Minor 4: `model.sliding_window` (Mistral's attention window), covered by the id. Written only for models with a
// window, so other images keep their bytes; a reader that predates it computes another id and refuses the image
// instead of attending over every position.
inline constexpr uint32_t kImageVersionMinorSlidingWindow = 4;
// Minor 5: `model.ffn_act` fatrelu (with `model.fatrelu_threshold`, covered by the id) and drelu. Written only for
// those activations; a reader that predates them refuses the activation's name.
inline constexpr uint32_t kImageVersionMinorActivations = 5;
// Minor 6: a stored activation predictor (`predictor`, nl-run --select predictor): one more region, "predictor",
// after the FFN regions, holding per layer fc1 [rank][dim] then fc2 [hidden][rank] (rows in the predictor's dtype,
// fc2 rows in slot order); its rank and dtype covered by the id. Written only with a predictor.
inline constexpr uint32_t kImageVersionMinorPredictor = 6;
// Minor 7: `model.arch` opt or phi (formats/core/model_weights.h: LayerNorm and attention biases, a plain FFN with
// fc1's bias among the dense tensors; OPT's learned positions; Phi's parallel block, GeLU (ffn_act gelu), partial
// rotary `model.rope_dims` and classifier bias), covered by the id. Written only for them; Llama images keep their
// bytes.
inline constexpr uint32_t kImageVersionMinorArch = 7;
// Minor 8: `predictor.input` residual: the stored predictor reads the residual stream before the FFN's norm (the
// vector PowerInfer's sparse models and TurboSparse feed their predictors), covered by the id. Written only for such
// predictors; predictors of the FFN's normalised input keep their 1.6 / 1.7 bytes, and a reader that predates the
// key computes another id and refuses the image instead of feeding the predictor the wrong vector.
inline constexpr uint32_t kImageVersionMinorPredictorInput = 8;
inline constexpr uint64_t kImageAlign = 4096;      // region alignment and the image's total size granularity
inline constexpr uint32_t kImageHeaderBytes = 64;  // meaningful header bytes; the header block is kImageAlign
inline constexpr char kImageMagic[8] = {'N', 'L', 'W', 'I', 'M', 'G', '\r', '\n'};

// What a stored predictor reads: the FFN's input after its norm (ffn_norm), or the residual stream entering the
// FFN before that norm (residual: PowerInfer's and TurboSparse's predictors).
enum class PredictorInput : int { kFfnNorm = 0, kResidual = 1 };
const char* predictor_input_name(PredictorInput p);
// "ffn_norm" | "residual"; false for anything else.
bool predictor_input_parse(const std::string& s, PredictorInput* out);

// Element types of the image. q8_0 / q4_0 are GGUF's Q8_0 / Q4_0 blocks (formats/core/quant.h): a row of n weights
// (n a multiple of 32) is n / 32 blocks of 34 / 18 bytes.
enum class ImageDtype : int { kF32 = 0, kF16 = 1, kBF16 = 2, kQ8_0 = 3, kQ4_0 = 4 };
const char* image_dtype_name(ImageDtype d);
// "f32" | "f16" | "bf16" | "q8_0" | "q4_0"; returns false for anything else.
bool image_dtype_parse(const std::string& s, ImageDtype* out);
inline bool image_dtype_quantized(ImageDtype d) { return d == ImageDtype::kQ8_0 || d == ImageDtype::kQ4_0; }
// Bytes per element of the plain dtypes (f32 4, f16/bf16 2); quantized dtypes have no per-element size: use
// image_row_bytes.
inline size_t image_dtype_bytes(ImageDtype d) { return d == ImageDtype::kF32 ? 4 : 2; }
// Bytes of a row of n elements (quantized: n must be a multiple of 32, checked by the callers).
inline size_t image_row_bytes(ImageDtype d, size_t n) {
  if (d == ImageDtype::kQ8_0) return n / 32 * 34;
  if (d == ImageDtype::kQ4_0) return n / 32 * 18;
  return n * image_dtype_bytes(d);
}
// Quantized rows are whole blocks: a quantized tensor's row length (its `in` dimension) must be a multiple of this.
inline constexpr size_t kImageQuantBlock = 32;
inline bool image_row_len_ok(ImageDtype d, size_t n) { return !image_dtype_quantized(d) || n % kImageQuantBlock == 0; }

// What one neuron's bundle holds, in this order, each `dim` elements long.
enum class BundleKind : int {
  kGated = 0,  // gate row, up row, down column (SwiGLU / ReLU-gated FFNs)
  kPlain = 1,  // up row, down column (plain ReLU FFNs: h = relu(up x))
};
const char* bundle_kind_name(BundleKind k);
inline int bundle_parts(BundleKind k) { return k == BundleKind::kGated ? 3 : 2; }
// A real model's bundles: gated for the Llama family, plain for OPT.
inline BundleKind bundle_kind_of(const ModelConfig& c) {
  return c.ffn_gated() ? BundleKind::kGated : BundleKind::kPlain;
}
// Bytes of one neuron bundle of a model of width `dim` stored in `d`: what a flash read of one neuron costs. The one
// formula (pack writes it into the manifest, the manifest check and nl-layout --bundle-for use it).
inline uint64_t image_bundle_bytes(ImageDtype d, BundleKind k, size_t dim) {
  return uint64_t(bundle_parts(k)) * image_row_bytes(d, dim);
}

// On-disk header, little endian, at offset 0 (the rest of the first 4096 bytes is zero).
struct ImageHeader {
  char magic[8];
  uint32_t version_major;
  uint32_t version_minor;
  uint32_t header_bytes;  // kImageHeaderBytes: readers skip fields they do not know
  uint32_t alignment;     // kImageAlign
  uint64_t image_bytes;   // total file size
  uint64_t image_id;      // xxh64 over the region table; the manifest repeats it, so a mismatched pair is caught
  uint32_t n_regions;
  uint32_t reserved0;
  uint64_t reserved1[2];
};
static_assert(sizeof(ImageHeader) == kImageHeaderBytes, "header layout");
static_assert(std::endian::native == std::endian::little, "images are little endian; add byte swapping first");

struct ImageRegion {
  std::string name;     // "dense" or "ffn.<layer>"
  int layer = -1;       // FFN layer, -1 for the dense region
  uint64_t offset = 0;  // from the start of the image, multiple of kImageAlign
  uint64_t bytes = 0;   // payload bytes (the region is zero-padded to the next alignment boundary)
  uint64_t xxh64 = 0;   // of the payload bytes
};

// A tensor inside the dense region: row-major [rows][cols], each row of `cols` elements stored in `dtype`
// (quantized: cols / 32 blocks per row). dtype = image_dense_dtype(image dtype, rows).
struct DenseTensor {
  std::string name;     // "tok_embeddings", "rms_final", "wcls", "layers.<l>.{rms_att,wq,wk,wv,wo,rms_ffn}"
  uint64_t offset = 0;  // relative to the dense region, a multiple of kImageTensorAlign
  uint64_t rows = 0, cols = 0;
  ImageDtype dtype = ImageDtype::kF32;
  uint64_t elems() const { return rows * cols; }
  uint64_t bytes() const { return rows * image_row_bytes(dtype, cols); }
};
// Dense tensors start on 64-byte boundaries inside the dense region (cache lines, SIMD loads).
inline constexpr uint64_t kImageTensorAlign = 64;
// The dense region's 1-D tensors (the norm weights, and OPT's / Phi's biases): the rule image_dense_dtype stores them
// by and runtime/memory.cpp counts their f32 copies by.
inline bool image_dense_is_norm(uint64_t rows) { return rows == 1; }
// The dtype a dense tensor is stored in: the image dtype, except the norm weights of quantized images, which stay
// f32 as GGUF keeps them.
inline ImageDtype image_dense_dtype(ImageDtype image, uint64_t rows) {
  return image_dtype_quantized(image) && image_dense_is_norm(rows) ? ImageDtype::kF32 : image;
}

// A recorded small-FIFO share: 0 (none recorded) or strictly between 0 and 1.
inline bool cache_small_fraction_valid(double f) { return f == 0 || (f > 0 && f < 1); }

// The cache policy one FFN layer's order was designed for (the layout's `admission` and `pinned`, docs/formats.md),
// in slot terms so the runtime needs no inverse permutation. Empty = none recorded (the runtime's own setting).
struct ImageCachePolicy {
  CacheAdmission admission = CacheAdmission::kUnset;  // kUnset: none recorded
  std::vector<uint32_t> pinned;  // slots (bundle positions in the layer's region) always resident, hottest first
  double small_fraction = 0;     // share of the S3-FIFO part given to its small FIFO; 0 = none recorded, else in (0, 1)
  std::vector<uint32_t> hot = {};  // admission "value": slots hottest first (its order within a class)
  bool empty() const {
    return admission == CacheAdmission::kUnset && pinned.empty() && small_fraction == 0 && hot.empty();
  }
};

// The planner settings the image's layout was solved and evaluated for (issue 18 item 8), recorded by pack when it
// packs a layout: from the layout's own parameters where it records them (greedy+ls), else nl-layout eval's
// defaults. nl-run uses them for every option the user does not pass. Advisory: not covered by the image id.
struct ImagePlanner {
  std::string gap;             // as --gap takes it: "off", "auto", "auto-keep-runs" or a bundle count; "" = none
  std::string device;          // device profile name
  double read_latency_us = 0;  // the profile's fit at its queue depth: a
  double bandwidth_MBps = 0;   // B
  double cache_ratio = 0;      // of each layer's FFN bytes, in [0, 1]
  CacheAdmission cache_admission = CacheAdmission::kUnset;
  std::string from;  // "layout" or "nl-layout eval defaults"
  bool empty() const { return gap.empty(); }
};

// Said wherever an image of a whole synthetic model is described (pack, nl-run, its manifest's source field).
inline constexpr const char* kSyntheticWeightsNote = "synthetic random weights: meaningless text, real timing";

struct ImageManifest {
  uint32_t version_major = kImageVersionMajor, version_minor = kImageVersionMinor;
  std::string image_file;  // the image's file name, relative to the manifest's folder
  uint64_t image_bytes = 0;
  uint64_t image_id = 0;
  ModelConfig config;
  ImageDtype dtype = ImageDtype::kF32;
  BundleKind bundle_kind = BundleKind::kGated;
  uint64_t bundle_bytes = 0;  // bundle_parts * image_row_bytes(dtype, dim), no padding between bundles
  std::string tokenizer;      // reference to the tokenizer file (as given to pack; may be empty)
  std::string source;         // the model file the image was packed from (free text)
  std::string source_format;  // "llama2c" | "safetensors" | "" (what --export-permuted writes)
  std::string layout;         // the layout file the order came from (free text; empty = identity)
  std::string layout_method;
  std::vector<ImageRegion> regions;  // regions[0] = dense, regions[1 + l] = ffn layer l
  std::vector<DenseTensor> dense_tensors;
  // per layer: slot -> original neuron index; with flash replication hidden_dim + replicas[l] slots, a neuron at most
  // twice (the copy's bundle is the same bytes; runtime/plan/replica_cover.h picks which copy a token reads)
  std::vector<std::vector<uint32_t>> order;
  // Per layer (n_layers entries) the number of slots holding a neuron's second copy, when any layer has replicas
  // (format 1.2), else empty. Always order[l].size() - hidden_dim.
  std::vector<uint32_t> replicas;
  // Per layer (n_layers entries) when any layer records one, else empty (manifests from before the key, layouts
  // without a policy).
  std::vector<ImageCachePolicy> cache_policy;
  ImagePlanner planner;  // empty when the manifest has no "planner" key (identity images, older manifests)
  // Optional `act_threshold`: per layer (n_layers entries) the CATS threshold t (|act(gate x)| > t fires) recorded
  // by pack from a calibrated trace (`nl-layout pack --act-threshold-from`); empty when absent.
  std::vector<double> act_threshold;
  // A stored activation predictor (format 1.6), PowerInfer's form: per layer score = fc2 relu(fc1 x), fc1 [rank][dim],
  // fc2 [hidden][rank]; rank 0 = none. Stored as f32 in f32 images, f16 otherwise (predictor_dtype()).
  int predictor_rank = 0;
  std::string predictor_source;                               // the file it was imported from (free text)
  PredictorInput predictor_input = PredictorInput::kFfnNorm;  // format 1.8 `predictor.input` (absent: ffn_norm)

  const ImageRegion& dense() const { return regions[0]; }
  const ImageRegion& ffn(int layer) const { return regions[size_t(1 + layer)]; }
  bool has_predictor() const { return predictor_rank > 0; }
  size_t predictor_region_index() const { return size_t(config.n_layers) + 1; }
  ImageDtype predictor_dtype() const { return dtype == ImageDtype::kF32 ? ImageDtype::kF32 : ImageDtype::kF16; }
  // Bytes of one layer's predictor (fc1 then fc2) in the predictor region.
  uint64_t predictor_layer_bytes() const {
    return uint64_t(predictor_rank) * image_row_bytes(predictor_dtype(), size_t(config.dim)) +
           uint64_t(config.hidden_dim) * image_row_bytes(predictor_dtype(), size_t(predictor_rank));
  }
  uint64_t bundle_elems() const { return uint64_t(bundle_parts(bundle_kind)) * uint64_t(config.dim); }
  // Bytes of one part (gate row, up row or down column) of a bundle: image_row_bytes(dtype, dim).
  uint64_t bundle_part_bytes() const { return image_row_bytes(dtype, size_t(config.dim)); }
  const DenseTensor* find_tensor(const std::string& name) const;
  // Bundle slots of FFN layer `layer`'s region: hidden_dim plus its replicas.
  uint32_t n_slots(int layer) const { return uint32_t(order[size_t(layer)].size()); }
  bool replicated() const { return !replicas.empty(); }
  uint64_t total_replicas() const {  // second copies over all layers
    uint64_t t = 0;
    for (uint32_t r : replicas) t += r;
    return t;
  }
};

// The dense tensors a model with this config stores in an image of dtype `d`, in image order (names as in
// DenseTensor::name, dtypes by image_dense_dtype; offsets 0, the writer assigns them).
std::vector<DenseTensor> image_dense_tensor_list(const ModelConfig& c, ImageDtype d = ImageDtype::kF32);

// Format 1.0's image id: xxh64 over the region table (name, offset, bytes, checksum of every region).
uint64_t image_id_of(const std::vector<ImageRegion>& regions);
// The image id of a manifest: for version 1.1 and later, xxh64 over the region table and a canonical encoding of
// every field that changes what the runtime computes (model config incl. ffn_act, norm_eps, rope_theta, heads;
// dtype; bundle kind and bytes; each dense tensor's name, offset, shape and dtype; the neuron order, replicas
// included, the per-layer replica counts of 1.2 manifests, and from 1.3 the act_threshold values). The header
// repeats it, so editing any of these in the manifest is refused at open. Version 1.0: image_id_of(regions).
// Not covered (advisory): tokenizer, source, layout, cache_policy, planner.
uint64_t image_id_of(const ImageManifest& m);

// JSON text of a manifest: sorted keys, fixed number formatting, so equal manifests are equal bytes.
std::string manifest_to_json(const ImageManifest& m);
// Why `order` is not a slot order of a layer with `hidden` neurons and `replicas` second copies (hidden + replicas
// entries, every neuron once, or at most twice with replicas, none missing), or "" when it is: the one check for pack
// and for a manifest read. The text continues a subject such as "order of layer 3".
std::string image_order_problem(const std::vector<uint32_t>& order, uint32_t hidden, uint64_t replicas);
// Why `p` is not a cache policy for a layer of slot order `order` (`hidden` neurons; the order passed
// image_order_problem): small_fraction in (0, 1), pinned and hot slots in range, each listed once, each a neuron's
// first copy (the cache is keyed by it). "" when it is; the text continues a subject such as "cache_policy[3]". The
// one check for pack and for a manifest read.
std::string image_cache_policy_problem(const ImageCachePolicy& p, const std::vector<uint32_t>& order, uint32_t hidden);
// Parses and checks a manifest on its own (structure, version, config, sizes, alignment, overlaps, permutations).
// Throws InputError naming `path` with the first problem found. Unknown keys are ignored.
ImageManifest manifest_parse(const std::string& text, const std::string& path);
ImageManifest manifest_load(const std::string& path);

// "<image>.json": where pack writes the manifest of an image.
inline std::string manifest_path_for(const std::string& image_path) { return image_path + ".json"; }
// The image path a manifest points to (its image_file, resolved against the manifest's folder).
std::string image_path_from_manifest(const std::string& manifest_path, const ImageManifest& m);

// Checks an image file's size and header against its manifest (no region payloads are read).
// Throws InputError naming `image_path` (truncated, wrong size, bad magic, future version, id mismatch).
void image_check_header(const std::string& image_path, const ImageManifest& m, const ImageHeader& h,
                        uint64_t file_bytes);

// Incremental xxh64 (libxxhash), so writers and verifiers hash regions as they stream.
class Xxh64 {
 public:
  Xxh64();
  ~Xxh64();
  Xxh64(const Xxh64&) = delete;
  Xxh64& operator=(const Xxh64&) = delete;
  void update(const void* p, size_t n);
  uint64_t digest() const;

 private:
  void* state_;
};
uint64_t xxh64_of(const void* p, size_t n);
// xxh3-64 (seed 0): the per-bundle checks of nl-run --verify-reads (several times xxh64's speed on short inputs).
uint64_t xxh3_of(const void* p, size_t n);
std::string hex64(uint64_t v);

// Element conversion between fp32 and the image dtype (round to nearest even, formats/core/half.h).
void image_encode(ImageDtype d, const float* src, size_t n, void* dst);
void image_decode(ImageDtype d, const void* src, size_t n, float* dst);

}  // namespace nl
