// Dense gated FFN over re-laid-out bundles (runtime/model/dense_bundles.h).
#include "runtime/model/dense_bundles.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "formats/core/error.h"
#include "formats/core/image.h"
#include "runtime/parallel.h"

namespace nl::kernels {
namespace {

// Outputs per down chunk (a multiple of the 32-weight quantization block): small enough that 2-8 threads get
// balanced contiguous shares of a 1024-4096 dim, large enough that a neuron's slice is whole cache lines (f16: 256 B).
constexpr int kDownChunk = 128;
// A dim with fewer kDownChunk chunks than this per thread is cut into one chunk per thread instead (small-relu's 384
// outputs: 3 chunks of 128 left one of 2 threads idle for a third of the down projection).
constexpr int kMinChunksPerThread = 4;
int down_chunk(int dim) {
  const int threads = omp_get_max_threads();
  const int c128 = (dim + kDownChunk - 1) / kDownChunk;
  if (threads <= 1 || c128 >= kMinChunksPerThread * threads) return kDownChunk;
  const int blocks = (dim + 31) / 32;
  return 32 * ((blocks + threads - 1) / threads);
}
// Activations (one exp each for SiLU) below which the gating stays on the calling thread.
constexpr int kParallelAct = 4096;

}  // namespace

DenseBundles::DenseBundles(ImageDtype dt, int dim, int hidden, const uint8_t* bundles, size_t bundle_bytes,
                           uint8_t* storage, BundleKind kind, const float* bias)
    : dt_(dt), dim_(dim), hidden_(hidden), kind_(kind), rb_(image_row_bytes(dt, size_t(dim))) {
  if (bias) bias_.assign(bias, bias + hidden);
  const int rows = bundle_parts(kind) - 1;  // gate and up rows, or the plain bundle's one row
  if (!storage) {
    own_.resize_uninit(bytes());  // huge pages when large (streamed whole per token: fewer TLB misses)
    storage = own_.data();
  }
  data_ = storage;
  uint8_t* gate = data_;
  uint8_t* up = gate + size_t(hidden) * rb_;
  size_t off = size_t(rows) * size_t(hidden) * rb_;
  chunk_ = down_chunk(dim);
  for (int o0 = 0; o0 < dim; o0 += chunk_) {
    const int o1 = std::min(dim, o0 + chunk_);
    const size_t skip = image_row_bytes(dt, size_t(o0)), cb = image_row_bytes(dt, size_t(o1 - o0));
    chunk_off_.push_back(off);
    chunk_cb_.push_back(cb);
    for (int s = 0; s < hidden; ++s)
      std::memcpy(data_ + off + size_t(s) * cb, bundles + size_t(s) * bundle_bytes + size_t(rows) * rb_ + skip, cb);
    off += size_t(hidden) * cb;
  }
  if (off != bytes()) throw InternalError("DenseBundles: the down chunks do not fill the buffer");  // it is unzeroed
  for (int s = 0; s < hidden; ++s)
    for (int r = 0; r < rows; ++r)
      std::memcpy((r == 0 ? gate : up) + size_t(s) * rb_, bundles + size_t(s) * bundle_bytes + size_t(r) * rb_, rb_);
  WeightView g = this->gate(), u = this->up();
  if (q8_interleave_if_pays(&g)) {  // the copies are ours: the active path's fastest layout
    if (!u.empty()) q8_interleave(&u);
    x8_ = true;
  }
}

namespace {
// Scratch of a pass, one per calling thread and shared by every layer: a prefill touches megabytes of it per layer,
// and fresh pages per layer cost more (page faults, zeroing) than the products that fill them.
struct Scratch {
  PreparedX xq;
  std::vector<float> g, u, h;  // [n][hidden]; h = 0: the token does not sum the neuron
  DownCoeffs down;             // h prepared for the down projection (shared by every chunk)
};
// The calling thread's scratch. Used through a plain reference: a thread_local named inside a parallel region would
// be each worker's own.
Scratch& scratch() {
  thread_local Scratch sc;
  return sc;
}
}  // namespace

void DenseBundles::reserve(int n) const {
  Scratch& sc = scratch();
  const size_t total = size_t(n) * size_t(hidden_);
  if (n <= 0 || sc.h.size() >= total) return;
  sc.g.assign(total, 0.0f);
  sc.u.assign(total, 0.0f);
  sc.h.assign(total, 0.0f);
  const std::vector<float> x(size_t(n) * size_t(dim_), 0.0f);  // sizes only: zeros
  sc.xq.prepare(dt_, x.data(), n, dim_);
  sc.down.prepare(sc.h.data(), size_t(hidden_), hidden_, n);
}

void DenseBundles::ffn(const float* x, int n, const ModelConfig& c, float* out) {
  Scratch& sc = scratch();
  const size_t hid = size_t(hidden_), total = size_t(n) * hid;
  sc.g.resize(total);
  sc.u.resize(total);
  sc.h.resize(total);
  sc.xq.prepare(dt_, x, n, dim_);
  matmul(sc.g.data(), sc.xq, gate(), n);
  const bool sparse = ffn_act_sparse(c.act);
  if (plain()) {  // OPT: h = relu(up x + b), Phi: gelu(up x + b); the gated path's numbers for a plain bundle
    parallel_for(long(total), total >= size_t(kParallelAct), [&](long i) {
      sc.h[size_t(i)] = ffn_act_plain(c.act, sc.g[size_t(i)] + (bias_.empty() ? 0.0f : bias_[size_t(i) % hid]));
    });
  } else {
    matmul(sc.u.data(), sc.xq, up(), n);
    // The gated path's numbers: the sparse activations list neurons with gate > floor (ReLU / dReLU 0, FATReLU t); SiLU
    // lists every neuron with act = v / (1 + e^-v); h = g * u (0 when g is 0; dReLU: u through max(., 0)). A neuron
    // with h = 0 adds exactly nothing to a sum, so it is left out.
    const bool up_relu = c.act == FfnAct::kDRelu;
    const float floor = c.gate_floor();
    // Element-wise, so any split gives the same numbers; in parallel once there is enough of it (SiLU's exp per
    // neuron).
    parallel_for(long(total), total >= size_t(kParallelAct), [&](long i) {  // [n][hidden] flat: decode's token splits
      const float g = sc.g[size_t(i)], u = up_relu && !(sc.u[size_t(i)] > 0.0f) ? 0.0f : sc.u[size_t(i)];
      float a = 0.0f;
      if (sparse)
        a = g > floor ? g : 0.0f;
      else
        a = ffn_act_smooth(c.act, g);
      sc.h[size_t(i)] = a == 0.0f ? 0.0f : a * u;
    });
  }
  sc.down.prepare(sc.h.data(), hid, hidden_, n);
  // Down: chunks of outputs split over threads, each chunk's slices contiguous; every output summed by one call in
  // slot order over the neurons with h != 0, whatever the split (down_tokens: several tokens per weight load).
  const int chunks = int(chunk_off_.size());
  long bytes = 0;
  for (int t = 0; t < n; ++t) bytes += long(sc.down.count(t)) * long(image_row_bytes(dt_, size_t(dim_)));
  parallel_for(chunks, bytes > kParallelBytes, [&](long c) {
    const int o0 = int(c) * chunk_, o1 = std::min(dim_, o0 + chunk_);
    down_tokens(dt_, out + o0, size_t(dim_), o1 - o0, sc.down, data_ + chunk_off_[size_t(c)], chunk_cb_[size_t(c)]);
  });
}

}  // namespace nl::kernels
