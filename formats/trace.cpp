#include "formats/trace.h"

#include <hdf5.h>
#ifdef NL_HAVE_LIBDEFLATE
#include <libdeflate.h>
#endif

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "formats/core/huge_pages.h"
#include "formats/hdf5_util.h"

namespace nl {
namespace {

using h5::check_stored_bytes;
using h5::has_attr;
using h5::Hid;
using h5::read_int_attr;
using h5::read_number_attr;
using h5::read_string_attr;
using h5::silence_hdf5;
using h5::write_double_attr;
using h5::write_int_attr;
using h5::write_string_attr;

template <class T>
void write_1d(hid_t file, const char* name, hid_t file_type, hid_t mem_type, const std::vector<T>& v) {
  hsize_t dims[1] = {v.size()};
  Hid space(H5Screate_simple(1, dims, nullptr), H5Sclose);
  Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_obj_track_times(dcpl, 0);  // no timestamps: same content -> byte-identical file
  if (!v.empty()) {
    hsize_t chunk[1] = {std::min<hsize_t>(v.size(), 65536)};
    H5Pset_chunk(dcpl, 1, chunk);
    H5Pset_deflate(dcpl, 4);
  }
  Hid ds(H5Dcreate2(file, name, file_type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
  if (!ds.ok()) throw InternalError(std::string("cannot create dataset ") + name);
  if (!v.empty() && H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    throw InternalError(std::string("cannot write dataset ") + name);
}

}  // namespace

// ---------------------------------------------------------------------------------------------- writer

struct TraceWriter::Impl {
  TraceWriterOptions opts;
  AtomicPath out;
  Hid file;
  std::vector<Hid> masks;                  // per layer dataset
  std::vector<std::vector<uint64_t>> buf;  // per layer: n_neurons * block_words
  uint64_t block_words = 0;
  uint64_t pos = 0;  // tokens in the current block
  uint64_t words_written = 0;
  std::vector<int64_t> sequences;
  std::vector<int32_t> tokens;
  bool pending_sequence = true;
  bool closed = false;

  Impl(const std::string& path, TraceWriterOptions o) : opts(std::move(o)), out(path) {}

  void flush() {
    if (pos == 0) return;
    uint64_t wcount = words_for_tokens(pos);
    for (size_t l = 0; l < masks.size(); ++l) {
      uint64_t n = opts.n_neurons[l];
      hsize_t new_dims[2] = {n, words_written + wcount};
      if (H5Dset_extent(masks[l], new_dims) < 0) throw IoError(out.final_path(), "cannot extend mask dataset");
      if (n == 0) continue;
      Hid fspace(H5Dget_space(masks[l]), H5Sclose);
      hsize_t start[2] = {0, words_written}, count[2] = {n, wcount};
      H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr);
      // Memory layout is n x block_words; select the first wcount columns.
      hsize_t mdims[2] = {n, block_words};
      Hid mspace(H5Screate_simple(2, mdims, nullptr), H5Sclose);
      hsize_t mstart[2] = {0, 0};
      H5Sselect_hyperslab(mspace, H5S_SELECT_SET, mstart, nullptr, count, nullptr);
      if (H5Dwrite(masks[l], H5T_NATIVE_UINT64, mspace, fspace, H5P_DEFAULT, buf[l].data()) < 0)
        throw IoError(out.final_path(), "cannot write mask block (disk full?)");
      std::fill(buf[l].begin(), buf[l].end(), 0);
    }
    words_written += wcount;
    pos = 0;
  }
};

TraceWriter::TraceWriter(const std::string& path, TraceWriterOptions opts) {
  silence_hdf5();
  if (opts.block_tokens == 0 || opts.block_tokens % 64 != 0) throw UsageError("block_tokens must be a multiple of 64");
  if (!opts.thresholds.empty() && opts.thresholds.size() != opts.n_neurons.size())
    throw UsageError("thresholds must be given for every layer or none");
  impl_ = std::make_unique<Impl>(path, std::move(opts));
  auto& im = *impl_;
  im.file = Hid(H5Fcreate(im.out.temp_path().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (!im.file.ok()) throw IoError(path, "cannot create HDF5 file");
  write_string_attr(im.file, "format", kTraceFormat);
  write_int_attr(im.file, "version", kTraceVersion);
  write_string_attr(im.file, "model", im.opts.model);
  write_string_attr(im.file, "activation", im.opts.activation);
  write_int_attr(im.file, "n_layers", static_cast<int64_t>(im.opts.n_neurons.size()));
  // No timestamps in object headers: the same content gives a byte-identical file.
  Hid gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
  H5Pset_obj_track_times(gcpl, 0);
  Hid layers(H5Gcreate2(im.file, "layers", H5P_DEFAULT, gcpl, H5P_DEFAULT), H5Gclose);
  im.block_words = im.opts.block_tokens / 64;
  for (size_t l = 0; l < im.opts.n_neurons.size(); ++l) {
    uint64_t n = im.opts.n_neurons[l];
    Hid g(H5Gcreate2(layers, std::to_string(l).c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT), H5Gclose);
    write_int_attr(g, "n_neurons", static_cast<int64_t>(n));
    if (!im.opts.thresholds.empty()) write_double_attr(g, "threshold", im.opts.thresholds[l]);
    hsize_t dims[2] = {n, 0}, maxdims[2] = {n, H5S_UNLIMITED};
    Hid space(H5Screate_simple(2, dims, maxdims), H5Sclose);
    Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_obj_track_times(dcpl, 0);
    hsize_t chunk[2] = {std::max<hsize_t>(1, std::min<hsize_t>(n, 256)), im.block_words};
    H5Pset_chunk(dcpl, 2, chunk);
    if (im.opts.deflate_level > 0) H5Pset_deflate(dcpl, static_cast<unsigned>(im.opts.deflate_level));
    Hid ds(H5Dcreate2(g, "mask", H5T_STD_U64LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
    if (!ds.ok()) throw IoError(path, "cannot create mask dataset for layer " + std::to_string(l));
    im.masks.push_back(std::move(ds));
    im.buf.emplace_back(n * im.block_words, 0);
  }
}

TraceWriter::~TraceWriter() = default;

void TraceWriter::begin_sequence() { impl_->pending_sequence = true; }

void TraceWriter::add_token(const std::vector<std::vector<uint32_t>>& active, int32_t token_id) {
  auto& im = *impl_;
  if (im.closed) throw InternalError("TraceWriter used after close");
  if (active.size() != im.opts.n_neurons.size())
    throw InternalError("add_token: expected " + std::to_string(im.opts.n_neurons.size()) + " layers");
  if (im.pending_sequence) {
    im.sequences.push_back(static_cast<int64_t>(n_tokens_));
    im.pending_sequence = false;
  }
  uint64_t w = im.pos >> 6, bit = uint64_t(1) << (im.pos & 63);
  for (size_t l = 0; l < active.size(); ++l) {
    uint32_t n = im.opts.n_neurons[l];
    for (uint32_t a : active[l]) {
      if (a >= n) throw InternalError("add_token: neuron index out of range");
      im.buf[l][size_t(a) * im.block_words + w] |= bit;
    }
  }
  im.tokens.push_back(token_id);
  ++n_tokens_;
  if (++im.pos == im.opts.block_tokens) im.flush();
}

void TraceWriter::add_masks(const std::vector<LayerMask>& masks, const std::vector<int32_t>& token_ids) {
  auto& im = *impl_;
  if (masks.size() != im.opts.n_neurons.size()) throw InternalError("add_masks: wrong layer count");
  uint64_t nt = masks.empty() ? 0 : masks[0].n_tokens;
  std::vector<std::vector<uint32_t>> active(masks.size());
  for (uint64_t t = 0; t < nt; ++t) {
    for (size_t l = 0; l < masks.size(); ++l) {
      active[l].clear();
      const LayerMask& m = masks[l];
      for (uint32_t n = 0; n < m.n_neurons; ++n)
        if (m.test(n, t)) active[l].push_back(n);
    }
    add_token(active, token_ids.empty() ? -1 : token_ids[t]);
  }
}

void TraceWriter::close() {
  auto& im = *impl_;
  if (im.closed) return;
  im.flush();
  write_int_attr(im.file, "n_tokens", static_cast<int64_t>(n_tokens_));
  if (im.sequences.empty() && n_tokens_ == 0) im.sequences.clear();
  write_1d(im.file, "sequences", H5T_STD_I64LE, H5T_NATIVE_INT64, im.sequences);
  if (im.opts.store_tokens) write_1d(im.file, "tokens", H5T_STD_I32LE, H5T_NATIVE_INT32, im.tokens);
  im.masks.clear();
  if (H5Fflush(im.file, H5F_SCOPE_GLOBAL) < 0)
    throw IoError(im.out.final_path(), "cannot flush HDF5 file (disk full?)");
  if (im.file.release() < 0) throw IoError(im.out.final_path(), "cannot close HDF5 file (disk full?)");
  im.out.commit();
  im.closed = true;
}

void trace_write(const std::string& path, const TraceWriterOptions& opts, const std::vector<LayerMask>& masks,
                 const std::vector<int64_t>& sequences, const std::vector<int32_t>& tokens) {
  TraceWriter w(path, opts);
  uint64_t nt = masks.empty() ? 0 : masks[0].n_tokens;
  for (const auto& m : masks)
    if (m.n_tokens != nt) throw InternalError("trace_write: layers disagree on n_tokens");
  // Write token blocks directly, splitting at sequence starts.
  size_t si = 0;
  std::vector<std::vector<uint32_t>> active(masks.size());
  for (uint64_t t = 0; t < nt; ++t) {
    while (si < sequences.size() && static_cast<uint64_t>(sequences[si]) == t) {
      w.begin_sequence();
      ++si;
    }
    for (size_t l = 0; l < masks.size(); ++l) {
      active[l].clear();
      const LayerMask& m = masks[l];
      uint64_t word = t >> 6, bit = uint64_t(1) << (t & 63);
      for (uint32_t n = 0; n < m.n_neurons; ++n)
        if (m.row(n)[word] & bit) active[l].push_back(n);
    }
    w.add_token(active, tokens.empty() ? -1 : tokens[t]);
  }
  w.close();
}

// ---------------------------------------------------------------------------------------------- reader

struct TraceReader::Impl {
  Hid file;
  std::vector<Hid> masks;
};

namespace {

template <class T>
std::vector<T> read_1d(const std::string& path, hid_t file, const char* name, hid_t mem_type, uint64_t max_len) {
  Hid ds(H5Dopen2(file, name, H5P_DEFAULT), H5Dclose);
  if (!ds.ok()) throw InputError(path, std::string("cannot open dataset '") + name + "'");
  Hid type(H5Dget_type(ds), H5Tclose);
  if (H5Tget_class(type) != H5T_INTEGER) throw InputError(path, std::string("dataset '") + name + "' is not integer");
  Hid space(H5Dget_space(ds), H5Sclose);
  if (H5Sget_simple_extent_ndims(space) != 1) throw InputError(path, std::string("dataset '") + name + "' is not 1-D");
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  if (n > max_len)
    throw InputError(path, std::string("dataset '") + name + "' has " + std::to_string(n) +
                               " entries, expected at most " + std::to_string(max_len));
  check_stored_bytes(path, ds, n, sizeof(T), std::string("dataset '") + name + "'");
  std::vector<T> v(n);
  if (n > 0 && H5Dread(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    throw InputError(path, std::string("cannot read dataset '") + name + "' (truncated or corrupt file?)");
  return v;
}

}  // namespace

// A function-try-block: whatever libhdf5 failed to read (an open, an attribute, an object header, a dataset) is
// reported as an I/O error (exit 4) when the file cannot be read through, as bad input (exit 3) otherwise.
TraceReader::TraceReader(const std::string& path) try : impl_(std::make_unique<Impl>()) {
  silence_hdf5();
  info_.path = path;
  h5::check_hdf5_input(path, "neuralink-trace v1");
  impl_->file = Hid(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!impl_->file.ok()) throw InputError(path, "cannot open as HDF5 (truncated or corrupt file?)");
  hid_t f = impl_->file;
  std::string format = read_string_attr(path, f, "format", "");
  if (format != kTraceFormat)
    throw InputError(path, "format is '" + format + "', expected '" + std::string(kTraceFormat) + "'");
  int64_t version = read_int_attr(path, f, "version", "");
  if (version > kTraceVersion)
    throw InputError(path, "trace version " + std::to_string(version) + " is newer than this reader (supports " +
                               std::to_string(kTraceVersion) + "); upgrade the toolkit");
  if (version < 1) throw InputError(path, "invalid trace version " + std::to_string(version));
  info_.model = read_string_attr(path, f, "model", "");
  info_.activation = read_string_attr(path, f, "activation", "");
  int64_t n_layers = read_int_attr(path, f, "n_layers", "");
  if (n_layers < 0 || n_layers > 100000)
    throw InputError(path, "n_layers " + std::to_string(n_layers) + " is out of range");
  int64_t n_tokens = read_int_attr(path, f, "n_tokens", "");
  if (n_tokens < 0 || n_tokens > (int64_t(1) << 40))
    throw InputError(path, "n_tokens " + std::to_string(n_tokens) + " is out of range");
  info_.n_layers = static_cast<uint32_t>(n_layers);
  info_.n_tokens = static_cast<uint64_t>(n_tokens);
  const uint64_t words = words_for_tokens(info_.n_tokens);
  // Neurons cost the readers memory even when the masks are empty (n_tokens = 0 stores nothing): count at least one
  // word per neuron against the bytes the file stores, over all layers together (check_stored_bytes' rule).
  uint64_t neurons_total = 0, mask_stored = 0;
  bool all_thresholds = true;
  for (uint32_t l = 0; l < info_.n_layers; ++l) {
    std::string gname = "layers/" + std::to_string(l);
    std::string where = " of /" + gname;
    if (H5Lexists(f, "layers", H5P_DEFAULT) <= 0 || H5Lexists(f, gname.c_str(), H5P_DEFAULT) <= 0)
      throw InputError(path, "missing layer group /" + gname + " (n_layers is " + std::to_string(n_layers) + ")");
    Hid g(H5Gopen2(f, gname.c_str(), H5P_DEFAULT), H5Gclose);
    if (!g.ok()) throw InputError(path, "/" + gname + " is not a group");
    int64_t nn = read_int_attr(path, g, "n_neurons", where);
    if (nn < 0 || nn > (int64_t(1) << 26)) throw InputError(path, "n_neurons" + where + " is out of range");
    info_.n_neurons.push_back(static_cast<uint32_t>(nn));
    if (has_attr(g, "threshold")) {
      const double th = read_number_attr(path, g, "threshold", where);
      info_.thresholds.push_back(th);
    } else {
      all_thresholds = false;
    }
    if (H5Lexists(g, "mask", H5P_DEFAULT) <= 0) throw InputError(path, "missing dataset /" + gname + "/mask");
    Hid ds(H5Dopen2(g, "mask", H5P_DEFAULT), H5Dclose);
    if (!ds.ok()) throw InputError(path, "cannot open /" + gname + "/mask");
    Hid type(H5Dget_type(ds), H5Tclose);
    if (H5Tget_class(type) != H5T_INTEGER || H5Tget_size(type) != 8)
      throw InputError(path, "/" + gname + "/mask is not a 64-bit integer dataset");
    Hid space(H5Dget_space(ds), H5Sclose);
    if (H5Sget_simple_extent_ndims(space) != 2) throw InputError(path, "/" + gname + "/mask is not 2-D");
    hsize_t dims[2];
    H5Sget_simple_extent_dims(space, dims, nullptr);
    if (dims[0] != static_cast<hsize_t>(nn) || dims[1] != words)
      throw InputError(path, "/" + gname + "/mask has shape [" + std::to_string(dims[0]) + "][" +
                                 std::to_string(dims[1]) + "], expected [" + std::to_string(nn) + "][" +
                                 std::to_string(words) + "] for n_tokens " + std::to_string(n_tokens));
    check_stored_bytes(path, ds, dims[0] * dims[1], 8, "/" + gname + "/mask");
    neurons_total += uint64_t(nn);
    mask_stored += H5Dget_storage_size(ds);
    if (neurons_total > (mask_stored * h5::kMaxStoredRatio + h5::kStoredSlack) / (std::max<uint64_t>(words, 1) * 8))
      throw InputError(path, "layers 0.." + std::to_string(l) + " declare " + std::to_string(neurons_total) +
                                 " neurons (n_tokens " + std::to_string(n_tokens) + ") but the file stores only " +
                                 std::to_string(mask_stored) + " bytes of their masks (truncated or corrupt file?)");
    impl_->masks.push_back(std::move(ds));
  }
  if (!all_thresholds) info_.thresholds.clear();
  if (H5Lexists(f, "sequences", H5P_DEFAULT) <= 0) throw InputError(path, "missing dataset /sequences");
  info_.sequences = read_1d<int64_t>(path, f, "sequences", H5T_NATIVE_INT64, std::max<uint64_t>(1, info_.n_tokens));
  if (info_.n_tokens > 0) {
    if (info_.sequences.empty() || info_.sequences[0] != 0) throw InputError(path, "/sequences must start with 0");
    for (size_t i = 0; i < info_.sequences.size(); ++i) {
      if (info_.sequences[i] < 0 || static_cast<uint64_t>(info_.sequences[i]) >= info_.n_tokens)
        throw InputError(path, "/sequences[" + std::to_string(i) + "] = " + std::to_string(info_.sequences[i]) +
                                   " is out of range [0, " + std::to_string(info_.n_tokens) + ")");
      if (i > 0 && info_.sequences[i] <= info_.sequences[i - 1])
        throw InputError(path, "/sequences is not strictly increasing at index " + std::to_string(i));
    }
  }
  if (H5Lexists(f, "tokens", H5P_DEFAULT) > 0) {
    info_.tokens = read_1d<int32_t>(path, f, "tokens", H5T_NATIVE_INT32, info_.n_tokens);
    if (info_.tokens.size() != info_.n_tokens)
      throw InputError(path, "/tokens has " + std::to_string(info_.tokens.size()) +
                                 " entries, expected n_tokens = " + std::to_string(info_.n_tokens));
  }
} catch (const InputError&) {
  h5::throw_if_read_error(path);
  throw;
}

TraceReader::~TraceReader() = default;

#ifdef NL_HAVE_LIBDEFLATE
namespace {
// Whole-layer reads of a deflate-only chunked mask: the chunks' stored bytes (H5Dread_chunk) are inflated by
// libdeflate (about twice as fast as the zlib HDF5 calls, checksum included) and copied into place. Anything
// unusual (another filter or type, a missing chunk, a chunk that does not inflate to exactly its size) makes it
// return false, and the caller's H5Dread path runs instead, with its own checks and error messages.
bool read_mask_deflate(hid_t ds, uint64_t n, uint64_t words, uint64_t* out) {
  Hid dcpl(H5Dget_create_plist(ds), H5Pclose);
  Hid type(H5Dget_type(ds), H5Tclose);
  Hid space(H5Dget_space(ds), H5Sclose);
  if (!dcpl.ok() || !type.ok() || !space.ok() || H5Pget_layout(dcpl) != H5D_CHUNKED || H5Pget_nfilters(dcpl) != 1 ||
      H5Tequal(type, H5T_STD_U64LE) <= 0)
    return false;
  unsigned flags = 0, cd[8] = {}, fconf = 0;
  size_t ncd = 8;
  char fname[32];
  if (H5Pget_filter2(dcpl, 0, &flags, &ncd, cd, sizeof fname, fname, &fconf) != H5Z_FILTER_DEFLATE) return false;
  hsize_t cdims[2] = {}, dims[2] = {};
  if (H5Pget_chunk(dcpl, 2, cdims) != 2 || H5Sget_simple_extent_dims(space, dims, nullptr) != 2) return false;
  if (dims[0] != n || dims[1] != words || cdims[0] == 0 || cdims[1] == 0) return false;
  const uint64_t cr = cdims[0], cw = cdims[1];
  if (cr > (uint64_t(1) << 26) / cw) return false;  // chunks over 512 MiB: leave them to HDF5
  const size_t chunk_bytes = size_t(cr * cw * 8);
  struct Dec {
    libdeflate_decompressor* d = libdeflate_alloc_decompressor();
    ~Dec() {
      if (d) libdeflate_free_decompressor(d);
    }
  } dec;
  if (!dec.d) return false;
  std::vector<uint8_t> raw, plain(chunk_bytes);
  for (uint64_t r0 = 0; r0 < n; r0 += cr) {
    for (uint64_t w0 = 0; w0 < words; w0 += cw) {
      hsize_t off[2] = {r0, w0}, stored = 0;
      if (H5Dget_chunk_storage_size(ds, off, &stored) < 0 || stored == 0 ||
          stored > chunk_bytes + chunk_bytes / 8 + 1024)
        return false;
      raw.resize(size_t(stored));
      uint32_t mask = 0;
      if (H5Dread_chunk(ds, H5P_DEFAULT, off, &mask, raw.data()) < 0) return false;
      const uint8_t* src = raw.data();
      if (mask & 1) {  // the filter was skipped for this chunk (deflate did not shrink it): stored as is
        if (stored != chunk_bytes) return false;
      } else {
        size_t got = 0;
        if (libdeflate_zlib_decompress(dec.d, raw.data(), raw.size(), plain.data(), chunk_bytes, &got) !=
                LIBDEFLATE_SUCCESS ||
            got != chunk_bytes)
          return false;
        src = plain.data();
      }
      const uint64_t rows = std::min(cr, n - r0), cols = std::min(cw, words - w0);
      for (uint64_t r = 0; r < rows; ++r) std::memcpy(out + (r0 + r) * words + w0, src + r * cw * 8, cols * 8);
    }
  }
  return true;
}
}  // namespace
#endif

std::vector<uint64_t> TraceReader::read_layer_words(uint32_t layer, uint64_t word_begin, uint64_t word_count) const {
  if (layer >= info_.n_layers) throw UsageError("layer " + std::to_string(layer) + " out of range");
  uint64_t words = words_for_tokens(info_.n_tokens);
  if (word_begin > words || word_count > words - word_begin)
    throw InternalError("read_layer_words: range out of bounds");
  uint64_t n = info_.n_neurons[layer];
  std::vector<uint64_t> out;
  resize_huge(out, size_t(n * word_count));
  if (out.empty()) return out;
  hid_t ds = impl_->masks[layer];
  bool done = false;
#ifdef NL_HAVE_LIBDEFLATE
  if (word_begin == 0 && word_count == words) {
    silence_hdf5();
    done = read_mask_deflate(ds, n, words, out.data());
  }
#endif
  if (!done) {
    Hid fspace(H5Dget_space(ds), H5Sclose);
    hsize_t start[2] = {0, word_begin}, count[2] = {n, word_count};
    H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr);
    Hid mspace(H5Screate_simple(2, count, nullptr), H5Sclose);
    if (H5Dread(ds, H5T_NATIVE_UINT64, mspace, fspace, H5P_DEFAULT, out.data()) < 0)
      h5::read_failed(info_.path,
                      "cannot read /layers/" + std::to_string(layer) + "/mask (truncated or corrupt file?)");
  }
  // Bits past n_tokens must be zero; clear them so a sloppy writer cannot inject phantom tokens.
  if (word_begin + word_count == words && (info_.n_tokens & 63) != 0) {
    uint64_t keep = (uint64_t(1) << (info_.n_tokens & 63)) - 1;
    for (uint64_t i = 0; i < n; ++i) out[i * word_count + word_count - 1] &= keep;
  }
  return out;
}

LayerMask TraceReader::read_layer(uint32_t layer) const {
  if (layer >= info_.n_layers) throw UsageError("layer " + std::to_string(layer) + " out of range");
  LayerMask m;
  m.n_neurons = info_.n_neurons[layer];
  m.n_tokens = info_.n_tokens;
  m.words = words_for_tokens(info_.n_tokens);
  m.bits = read_layer_words(layer, 0, m.words);
  return m;
}

}  // namespace nl
