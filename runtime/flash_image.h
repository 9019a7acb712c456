// An opened flash image: its manifest (validated), the image file behind an I/O engine (header checked against the
// manifest), region checksums, and the dense weights decoded into DRAM. What is verified when:
//   at open      the manifest on its own (formats/core/image.h), the image's size and header against it;
//   load_dense() the dense region's xxh64 (it is read in full anyway);
//   read_region() the region's xxh64, every time a region is read in full (--verify does so for all of them,
//                --select gate does so for every FFN region at start-up, to keep the gate rows in DRAM);
//   bundle reads  short reads, EIO and EOF are errors; partial region reads are not checksummed.
// Not thread-safe (one engine).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "formats/core/image.h"
#include "formats/core/model_weights.h"
#include "runtime/io/engine.h"
#include "runtime/io/file.h"
#include "runtime/model/weights_view.h"

namespace nl {

// The dense weights in DRAM in their stored dtype: the dense region's bytes as read (no f32 copy of any matrix; norm
// vectors stored as f16 / bf16 are widened, they are a few KiB). `view` points into it: keep the store alive while a
// Model uses the view. Not copyable (the view holds pointers into it).
struct DenseStore {
  AlignedBuffer bytes;
  std::vector<std::vector<float>> norms;
  ModelView view;
  DenseStore() = default;
  DenseStore(const DenseStore&) = delete;
  DenseStore& operator=(const DenseStore&) = delete;
};

class FlashImage {
 public:
  // `path` is the image (its manifest is `<path>.json`) or the manifest itself (`*.json`).
  FlashImage(const std::string& path, const IoOptions& io);

  const ImageManifest& manifest() const { return m_; }
  const std::string& image_path() const { return image_path_; }
  const std::string& manifest_path() const { return manifest_path_; }
  IoEngine& io() { return *io_; }
  const IoEngine& io() const { return *io_; }

  // Reads region `index` (0 = dense, 1 + l = FFN layer l) in full into `buf` (payload at buf->data()) and checks its
  // checksum: InputError naming the image on a mismatch. Returns the bytes read (the region padded to the I/O
  // alignment); `buf` grows to hold them and never shrinks, so it may be larger when reused.
  uint64_t read_region(size_t index, AlignedBuffer* buf);
  void verify_all();
  // --verify-reads: every FFN region read once (its xxh64 checked, as verify_all), and per layer the xxh3-64 of each
  // slot's bundle bytes, against which every later read of a bundle is checked (FlashFfn). Layer by layer: one
  // region in memory at a time; the table is 8 bytes a slot.
  std::vector<std::vector<uint64_t>> bundle_sums();
  bool region_verified(size_t index) const { return verified_[index] != 0; }

  // The dense weights decoded to fp32 (FFN matrices left empty; the profiler, tests). Verifies the dense region.
  ModelWeights load_dense();
  // The dense weights in their stored dtype (what nl-run computes from). Verifies the dense region.
  std::unique_ptr<DenseStore> load_dense_store();
  // Decodes a whole FFN layer back into original neuron order (tests, dense reference runs).
  void load_ffn_layer(int layer, LayerWeights* lw);

 private:
  std::string image_path_, manifest_path_;
  ImageManifest m_;
  std::unique_ptr<IoEngine> io_;
  std::vector<char> verified_;
};

}  // namespace nl
