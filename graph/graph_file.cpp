// Graph file v1 (HDF5) writer, validating reader and shard merge. Schema in docs/formats.md.
#include "graph/graph_file.h"

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "formats/hdf5_util.h"

namespace nl {
namespace {

using h5::Hid;
using h5::silence_hdf5;

// dims: 1-D or 2-D. Small lists are deflated; the full matrix is stored raw (random counts barely compress
// and deflating 16 GiB of matrices would dominate the run).
template <class T>
void write_ds(const std::string& path, hid_t g, const char* name, hid_t ftype, hid_t mtype, const std::vector<T>& v,
              std::vector<hsize_t> dims, bool compress) {
  Hid space(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
  Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!v.empty()) {
    std::vector<hsize_t> chunk = dims;
    if (dims.size() == 1)
      chunk[0] = std::min<hsize_t>(dims[0], 1 << 20);
    else
      chunk[0] = std::max<hsize_t>(1, std::min<hsize_t>(dims[0], (1 << 18) / std::max<hsize_t>(1, dims[1])));
    H5Pset_chunk(dcpl, int(chunk.size()), chunk.data());
    if (compress) {
      H5Pset_shuffle(dcpl);
      H5Pset_deflate(dcpl, 4);
    }
  }
  Hid ds(H5Dcreate2(g, name, ftype, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
  if (!ds.ok()) throw IoError(path, std::string("cannot create dataset ") + name);
  if (!v.empty() && H5Dwrite(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    throw IoError(path, std::string("cannot write dataset ") + name + " (disk full?)");
}

// Opens an integer dataset and checks its shape.
Hid open_ds(const std::string& path, hid_t g, const std::string& gname, const char* name, std::vector<hsize_t> want,
            size_t elem_bytes) {
  const std::string full = "/" + gname + "/" + name;
  if (H5Lexists(g, name, H5P_DEFAULT) <= 0) throw InputError(path, "missing dataset " + full);
  Hid ds(H5Dopen2(g, name, H5P_DEFAULT), H5Dclose);
  if (!ds.ok()) throw InputError(path, "cannot open dataset " + full);
  Hid t(H5Dget_type(ds), H5Tclose);
  if (H5Tget_class(t) != H5T_INTEGER || H5Tget_size(t) != elem_bytes || H5Tget_sign(t) != H5T_SGN_NONE)
    throw InputError(path, full + " is not a uint" + std::to_string(elem_bytes * 8) + " dataset");
  Hid s(H5Dget_space(ds), H5Sclose);
  int nd = H5Sget_simple_extent_ndims(s);
  std::vector<hsize_t> dims(size_t(std::max(nd, 0)));
  if (nd > 0) H5Sget_simple_extent_dims(s, dims.data(), nullptr);
  if (dims != want) {
    auto fmt = [](const std::vector<hsize_t>& d) {
      std::string r;
      for (auto x : d) r += "[" + std::to_string(x) + "]";
      return r;
    };
    throw InputError(path, full + " has shape " + fmt(dims) + ", expected " + fmt(want));
  }
  uint64_t elems = 1;
  for (hsize_t d : want) elems *= d;
  h5::check_stored_bytes(path, ds, elems, elem_bytes, full);  // before the caller allocates what it declares
  return ds;
}

template <class T>
void read_ds(const std::string& path, hid_t ds, hid_t mtype, std::vector<T>& v, const std::string& what) {
  if (!v.empty() && H5Dread(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
    h5::read_failed(path, "cannot read " + what + " (truncated or corrupt file?)");  // EIO: exit 4
}

}  // namespace

// ------------------------------------------------------------------------------------------------- writer

struct GraphFileWriter::Impl {
  AtomicPath out;
  Hid file, layers;
  std::string source;
  bool any = false, closed = false;
  uint64_t n_tokens = 0;
  uint32_t k = 0;
  bool full = false;
  int64_t count = 0;
  int64_t last_layer = -1;
  GraphTraceRef trace;
  explicit Impl(const std::string& p) : out(p) {}
};

GraphFileWriter::GraphFileWriter(const std::string& path, const std::string& source)
    : impl_(std::make_unique<Impl>(path)) {
  silence_hdf5();
  auto& im = *impl_;
  im.source = source;
  im.file = Hid(H5Fcreate(im.out.temp_path().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (!im.file.ok()) throw IoError(path, "cannot create HDF5 file");
  h5::write_string_attr(im.file, "format", kGraphFormat);
  h5::write_int_attr(im.file, "version", kGraphVersion);
  h5::write_string_attr(im.file, "source", source);
  im.layers = Hid(H5Gcreate2(im.file, "layers", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
}

GraphFileWriter::~GraphFileWriter() = default;

void GraphFileWriter::add_layer(uint32_t layer, const LayerGraph& g) {
  auto& im = *impl_;
  const std::string& path = im.out.final_path();
  if (im.closed) throw InternalError("GraphFileWriter used after close");
  const bool full = !g.upper.empty() || g.n_neurons < 2;
  const bool has_upper = !g.upper.empty();
  if (im.any && (g.n_tokens != im.n_tokens || g.k != im.k))
    throw InternalError("GraphFileWriter: layers disagree on n_tokens or k");
  if (int64_t(layer) <= im.last_layer) throw InternalError("GraphFileWriter: layers must be added in ascending order");
  if (!im.any) {
    im.n_tokens = g.n_tokens;
    im.k = g.k;
    im.full = full;
  }
  im.full = im.full && full;
  im.any = true;
  im.last_layer = layer;
  const uint32_t n = g.n_neurons;
  const std::string gname = std::to_string(im.count++);
  Hid grp(H5Gcreate2(im.layers, gname.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (!grp.ok()) throw IoError(path, "cannot create layer group");
  h5::write_int_attr(grp, "layer", layer);
  h5::write_int_attr(grp, "n_neurons", n);
  write_ds(path, grp, "freq", H5T_STD_U64LE, H5T_NATIVE_UINT64, g.freq, {n}, true);
  write_ds(path, grp, "nbr_len", H5T_STD_U32LE, H5T_NATIVE_UINT32, g.nbr_len, {g.k ? n : 0}, true);
  write_ds(path, grp, "nbr", H5T_STD_U32LE, H5T_NATIVE_UINT32, g.nbr, {g.k ? n : 0, g.k}, true);
  write_ds(path, grp, "nbr_cnt", H5T_STD_U32LE, H5T_NATIVE_UINT32, g.nbr_cnt, {g.k ? n : 0, g.k}, true);
  if (has_upper)
    write_ds(path, grp, "upper", H5T_STD_U32LE, H5T_NATIVE_UINT32, g.upper, {hsize_t(uint64_t(n) * (n - 1) / 2)},
             false);
}

void GraphFileWriter::set_trace(const GraphTraceRef& t) { impl_->trace = t; }

void GraphFileWriter::close() {
  auto& im = *impl_;
  if (im.closed) return;
  // Optional provenance (readers accept files without it).
  if (!im.trace.sha256.empty()) h5::write_string_attr(im.file, "trace_sha256", im.trace.sha256);
  if (!im.trace.model.empty()) h5::write_string_attr(im.file, "trace_model", im.trace.model);
  if (im.trace.has_range) {
    h5::write_int_attr(im.file, "token_begin", static_cast<int64_t>(im.trace.token_begin));
    h5::write_int_attr(im.file, "token_end", static_cast<int64_t>(im.trace.token_end));
  }
  if (im.trace.n_layers) h5::write_int_attr(im.file, "trace_n_layers", im.trace.n_layers);
  h5::write_int_attr(im.file, "n_layers", im.count);
  h5::write_int_attr(im.file, "n_tokens", static_cast<int64_t>(im.n_tokens));
  h5::write_int_attr(im.file, "top_k", im.k);
  h5::write_int_attr(im.file, "full", im.any && im.full ? 1 : 0);
  im.layers.reset();
  if (H5Fflush(im.file, H5F_SCOPE_GLOBAL) < 0)
    throw IoError(im.out.final_path(), "cannot flush HDF5 file (disk full?)");
  if (im.file.release() < 0) throw IoError(im.out.final_path(), "cannot close HDF5 file (disk full?)");
  im.out.commit();
  im.closed = true;
}

// ------------------------------------------------------------------------------------------------- reader

struct GraphFileReader::Impl {
  Hid file;
  std::vector<Hid> groups;
};

// A function-try-block as the trace reader's: libhdf5 reports an EIO in its metadata as a failed open or attribute
// read, so a bad-input error is re-checked by reading the file through (an I/O error then wins, exit 4).
GraphFileReader::GraphFileReader(const std::string& path) try : impl_(std::make_unique<Impl>()) {
  silence_hdf5();
  info_.path = path;
  h5::check_hdf5_input(path, "neuralink-graph v1");
  impl_->file = Hid(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!impl_->file.ok()) throw InputError(path, "cannot open as HDF5 (truncated or corrupt file?)");
  hid_t f = impl_->file;
  const std::string format = h5::read_string_attr(path, f, "format", "");
  if (format != kGraphFormat) throw InputError(path, "format is '" + format + "', expected '" + kGraphFormat + "'");
  const int64_t version = h5::read_int_attr(path, f, "version", "");
  if (version > kGraphVersion)
    throw InputError(path, "graph version " + std::to_string(version) + " is newer than this reader (supports " +
                               std::to_string(kGraphVersion) + "); upgrade the toolkit");
  if (version < 1) throw InputError(path, "invalid graph version " + std::to_string(version));
  info_.source = h5::read_string_attr(path, f, "source", "");
  const int64_t n_layers = h5::read_int_attr(path, f, "n_layers", "");
  if (n_layers < 0 || n_layers > 100000)
    throw InputError(path, "n_layers " + std::to_string(n_layers) + " is out of range");
  const int64_t n_tokens = h5::read_int_attr(path, f, "n_tokens", "");
  if (n_tokens < 0 || n_tokens > int64_t(UINT32_MAX))
    throw InputError(path, "n_tokens " + std::to_string(n_tokens) + " is out of range (counts are uint32)");
  const int64_t k = h5::read_int_attr(path, f, "top_k", "");
  if (k < 0 || k > 65536) throw InputError(path, "top_k " + std::to_string(k) + " is out of range");
  const int64_t full = h5::read_int_attr(path, f, "full", "");
  if (full != 0 && full != 1) throw InputError(path, "attribute 'full' must be 0 or 1");
  if (h5::has_attr(f, "trace_sha256")) info_.trace.sha256 = h5::read_string_attr(path, f, "trace_sha256", "");
  if (h5::has_attr(f, "trace_model")) info_.trace.model = h5::read_string_attr(path, f, "trace_model", "");
  if (h5::has_attr(f, "trace_n_layers")) {
    const int64_t tl = h5::read_int_attr(path, f, "trace_n_layers", "");
    if (tl < 1 || tl > 100000) throw InputError(path, "trace_n_layers " + std::to_string(tl) + " is out of range");
    info_.trace.n_layers = uint32_t(tl);
  }
  if (h5::has_attr(f, "token_begin") || h5::has_attr(f, "token_end")) {
    const int64_t b = h5::read_int_attr(path, f, "token_begin", ""), e = h5::read_int_attr(path, f, "token_end", "");
    if (b < 0 || e < b || e - b != n_tokens)
      throw InputError(path, "token_begin/token_end (" + std::to_string(b) + ":" + std::to_string(e) +
                                 ") do not span n_tokens (" + std::to_string(n_tokens) + ")");
    info_.trace.has_range = true;
    info_.trace.token_begin = uint64_t(b);
    info_.trace.token_end = uint64_t(e);
  }
  info_.n_tokens = uint64_t(n_tokens);
  info_.top_k = uint32_t(k);
  info_.full = full == 1;
  for (int64_t i = 0; i < n_layers; ++i) {
    const std::string gname = "layers/" + std::to_string(i), where = " of /" + gname;
    if (H5Lexists(f, "layers", H5P_DEFAULT) <= 0 || H5Lexists(f, gname.c_str(), H5P_DEFAULT) <= 0)
      throw InputError(path, "missing layer group /" + gname + " (n_layers is " + std::to_string(n_layers) + ")");
    Hid g(H5Gopen2(f, gname.c_str(), H5P_DEFAULT), H5Gclose);
    if (!g.ok()) throw InputError(path, "/" + gname + " is not a group");
    const int64_t layer = h5::read_int_attr(path, g, "layer", where);
    if (layer < 0 || layer > 100000) throw InputError(path, "layer" + where + " is out of range");
    if (!info_.layers.empty() && layer <= int64_t(info_.layers.back()))
      throw InputError(path, "layer indices are not strictly increasing at /" + gname);
    const int64_t nn = h5::read_int_attr(path, g, "n_neurons", where);
    if (nn < 0 || nn > (int64_t(1) << 20)) throw InputError(path, "n_neurons" + where + " is out of range");
    const hsize_t n = hsize_t(nn), rows = info_.top_k ? n : 0;
    open_ds(path, g, gname, "freq", {n}, 8);
    open_ds(path, g, gname, "nbr_len", {rows}, 4);
    open_ds(path, g, gname, "nbr", {rows, info_.top_k}, 4);
    open_ds(path, g, gname, "nbr_cnt", {rows, info_.top_k}, 4);
    if (H5Lexists(g, "upper", H5P_DEFAULT) > 0)
      open_ds(path, g, gname, "upper", {n * (n > 0 ? n - 1 : 0) / 2}, 4);
    else if (info_.full && n >= 2)
      throw InputError(path, "missing dataset /" + gname + "/upper (file says full = 1)");
    info_.layers.push_back(uint32_t(layer));
    info_.n_neurons.push_back(uint32_t(nn));
    impl_->groups.push_back(std::move(g));
  }
} catch (const InputError&) {
  h5::throw_if_read_error(path);
  throw;
}

GraphFileReader::~GraphFileReader() = default;

LayerGraph GraphFileReader::read_layer(size_t i) const {
  if (i >= info_.layers.size()) throw UsageError("graph layer " + std::to_string(i) + " out of range");
  const std::string& path = info_.path;
  const std::string gname = "layers/" + std::to_string(i);
  hid_t g = impl_->groups[i];
  LayerGraph lg;
  const uint32_t n = info_.n_neurons[i], k = info_.top_k;
  const hsize_t rows = k ? n : 0;
  lg.n_neurons = n;
  lg.n_tokens = info_.n_tokens;
  lg.k = k;
  // Each dataset is opened (and its stored bytes checked) before the vector it fills is allocated.
  Hid freq_ds = open_ds(path, g, gname, "freq", {n}, 8);
  lg.freq.resize(n);
  read_ds(path, freq_ds, H5T_NATIVE_UINT64, lg.freq, "/" + gname + "/freq");
  for (uint32_t v = 0; v < n; ++v)
    if (lg.freq[v] > lg.n_tokens)
      throw InputError(path, "/" + gname + "/freq[" + std::to_string(v) + "] exceeds n_tokens");
  if (k) {
    Hid len_ds = open_ds(path, g, gname, "nbr_len", {rows}, 4);
    Hid nbr_ds = open_ds(path, g, gname, "nbr", {rows, k}, 4);
    Hid cnt_ds = open_ds(path, g, gname, "nbr_cnt", {rows, k}, 4);
    lg.nbr_len.resize(n);
    lg.nbr.resize(size_t(n) * k);
    lg.nbr_cnt.resize(size_t(n) * k);
    read_ds(path, len_ds, H5T_NATIVE_UINT32, lg.nbr_len, "/" + gname + "/nbr_len");
    read_ds(path, nbr_ds, H5T_NATIVE_UINT32, lg.nbr, "/" + gname + "/nbr");
    read_ds(path, cnt_ds, H5T_NATIVE_UINT32, lg.nbr_cnt, "/" + gname + "/nbr_cnt");
    // The lists are a contract for the solvers: check them here once.
    for (uint32_t v = 0; v < n; ++v) {
      const std::string at = "/" + gname + " neuron " + std::to_string(v);
      if (lg.nbr_len[v] > k) throw InputError(path, at + ": nbr_len exceeds top_k");
      for (uint32_t e = 0; e < lg.nbr_len[v]; ++e) {
        const uint32_t u = lg.nbr[size_t(v) * k + e], c = lg.nbr_cnt[size_t(v) * k + e];
        if (u >= n || u == v) throw InputError(path, at + ": neighbour index " + std::to_string(u) + " is invalid");
        if (c == 0 || c > lg.freq[v] || c > lg.freq[u])
          throw InputError(path, at + ": neighbour count " + std::to_string(c) + " is inconsistent with freq");
        if (e > 0) {
          const uint32_t pu = lg.nbr[size_t(v) * k + e - 1], pc = lg.nbr_cnt[size_t(v) * k + e - 1];
          if (pc < c || (pc == c && pu >= u))
            throw InputError(path, at + ": neighbours are not sorted by count desc, index asc");
        }
      }
    }
  }
  if (H5Lexists(g, "upper", H5P_DEFAULT) > 0 && n >= 2) {
    Hid upper_ds = open_ds(path, g, gname, "upper", {hsize_t(uint64_t(n) * (n - 1) / 2)}, 4);
    lg.upper.resize(uint64_t(n) * (n - 1) / 2);
    read_ds(path, upper_ds, H5T_NATIVE_UINT32, lg.upper, "/" + gname + "/upper");
    uint32_t mx = 0;
    for (uint32_t c : lg.upper) mx = std::max(mx, c);
    if (mx > lg.n_tokens) throw InputError(path, "/" + gname + "/upper has a count larger than n_tokens");
  }
  return lg;
}

// -------------------------------------------------------------------------------------------------- merge

void graph_file_merge(const std::vector<std::string>& inputs, const std::string& out, std::optional<uint32_t> top_k,
                      const std::function<void()>& on_layer) {
  if (inputs.empty()) throw UsageError("graph-merge needs at least one input");
  std::vector<std::unique_ptr<GraphFileReader>> rs;
  for (const auto& p : inputs) rs.push_back(std::make_unique<GraphFileReader>(p));
  const GraphFileInfo& first = rs[0]->info();
  uint64_t total = 0;
  for (const auto& r : rs) {
    const GraphFileInfo& ri = r->info();
    if (!ri.full)
      throw InputError(ri.path, "stores top-k lists only; merging needs the full matrix (count with --full)");
    if (ri.layers != first.layers || ri.n_neurons != first.n_neurons)
      throw InputError(ri.path, "has different layers or neuron counts than " + first.path);
    if (!top_k && ri.top_k != first.top_k)
      throw InputError(ri.path, "top_k " + std::to_string(ri.top_k) + " differs from " + first.path + " (" +
                                    std::to_string(first.top_k) + "); pass --top-k");
    if (!ri.trace.model.empty() && !first.trace.model.empty() && ri.trace.model != first.trace.model)
      throw InputError(
          ri.path, "counts model '" + ri.trace.model + "' but " + first.path + " counts '" + first.trace.model + "'");
    total += ri.n_tokens;
  }
  if (total > UINT32_MAX) throw UsageError("merged token count exceeds 2^32-1 (counts are uint32)");
  // Provenance: slices of one trace must be disjoint (an overlap would count its tokens twice); the merge keeps
  // the trace's sha256, and the slice when the inputs tile one contiguous range.
  GraphTraceRef tref;
  for (const auto& r : rs)
    if (!r->info().trace.model.empty()) tref.model = r->info().trace.model;
  tref.n_layers = first.trace.n_layers;  // kept when every input records the same count
  for (const auto& r : rs)
    if (r->info().trace.n_layers != tref.n_layers) tref.n_layers = 0;
  bool same_trace = !first.trace.sha256.empty();
  for (const auto& r : rs) same_trace = same_trace && r->info().trace.sha256 == first.trace.sha256;
  if (same_trace) {
    tref.sha256 = first.trace.sha256;
    std::vector<std::pair<std::pair<uint64_t, uint64_t>, const std::string*>> ranges;
    bool all_ranged = true;
    for (const auto& r : rs) {
      const GraphTraceRef& t = r->info().trace;
      all_ranged = all_ranged && t.has_range;
      if (t.has_range) ranges.push_back({{t.token_begin, t.token_end}, &r->info().path});
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
      if (ranges[i].first.first < ranges[i - 1].first.second)
        throw InputError(*ranges[i].second, "counts tokens " + std::to_string(ranges[i].first.first) + ":" +
                                                std::to_string(ranges[i].first.second) + " of the same trace as " +
                                                *ranges[i - 1].second + " (" +
                                                std::to_string(ranges[i - 1].first.first) + ":" +
                                                std::to_string(ranges[i - 1].first.second) + "): slices overlap");
    bool contiguous = all_ranged && !ranges.empty();
    for (size_t i = 1; contiguous && i < ranges.size(); ++i)
      contiguous = ranges[i].first.first == ranges[i - 1].first.second;
    if (contiguous) {
      tref.has_range = true;
      tref.token_begin = ranges.front().first.first;
      tref.token_end = ranges.back().first.second;
    }
  }
  const uint32_t k = top_k ? *top_k : first.top_k;
  std::string source = "merge of";
  for (const auto& r : rs) source += " " + r->info().path;
  GraphFileWriter w(out, source);
  for (size_t i = 0; i < first.layers.size(); ++i) {
    LayerGraph acc = rs[0]->read_layer(i);
    for (size_t s = 1; s < rs.size(); ++s) {
      LayerGraph part = rs[s]->read_layer(i);
      acc.n_tokens += part.n_tokens;
      for (size_t v = 0; v < acc.freq.size(); ++v) acc.freq[v] += part.freq[v];
      for (size_t e = 0; e < acc.upper.size(); ++e) acc.upper[e] += part.upper[e];
    }
    coactivation_build_topk(acc, k);
    w.add_layer(first.layers[i], acc);
    if (on_layer) on_layer();
  }
  w.set_trace(tref);
  w.close();
}

}  // namespace nl
