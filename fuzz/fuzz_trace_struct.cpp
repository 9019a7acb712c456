// libFuzzer harness: trace v1 reader (formats/trace.h) on well-formed HDF5 files whose *content* the fuzzer
// chooses: every attribute present or not, of any type, value or shape; layer groups, masks (type, rank, extent,
// chunked or not, written or not), /sequences and /tokens likewise. The file is written through libhdf5's API, so
// this explores our reader's checks without feeding libhdf5 corrupt metadata (fuzz_trace does that; libhdf5
// 1.10 crashes on some of it: docs/robustness.md).
#include <fuzzer/FuzzedDataProvider.h>
#include <hdf5.h>

#include <array>
#include <vector>

#include "formats/trace.h"
#include "fuzz/fuzz_util.h"

namespace {

// One attribute. Choice 0 (also what an exhausted input gives) is the valid one, so the fuzzer starts from
// files that pass and damages one thing at a time: absent, an integer near or far from the expected one, a
// double, a variable-length or fixed string (the expected one or anything), or an array where a scalar belongs.
void put_attr(FuzzedDataProvider& p, hid_t obj, const char* name, bool is_string, const std::string& good_str,
              int64_t good_int) {
  int kind = p.ConsumeIntegralInRange(0, 7);
  if (kind == 0) kind = is_string ? 5 : 2;
  if (kind == 1) return;
  hid_t space = H5Screate(H5S_SCALAR), type = -1, attr = -1;
  if (kind == 2 || kind == 3) {
    int64_t v = kind == 2 ? good_int + p.ConsumeIntegralInRange<int64_t>(0, 2) * (p.ConsumeBool() ? -1 : 1)
                          : p.ConsumeIntegral<int64_t>();
    attr = H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(attr, H5T_NATIVE_INT64, &v);
  } else if (kind == 4) {
    double v = p.ConsumeFloatingPoint<double>();
    attr = H5Acreate2(obj, name, H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(attr, H5T_NATIVE_DOUBLE, &v);
  } else if (kind == 5 || kind == 6) {
    std::string s = p.ConsumeBool() ? p.ConsumeRandomLengthString(64) : good_str;
    type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, kind == 5 ? H5T_VARIABLE : s.size() + 1);
    attr = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    const char* c = s.c_str();
    H5Awrite(attr, type, kind == 5 ? static_cast<const void*>(&c) : c);
  } else {
    H5Sclose(space);
    hsize_t n = p.ConsumeIntegralInRange<hsize_t>(0, 8);
    space = H5Screate_simple(1, &n, nullptr);
    std::vector<int64_t> v(n, good_int);
    attr = H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    if (n) H5Awrite(attr, H5T_NATIVE_INT64, v.data());
  }
  if (attr >= 0) H5Aclose(attr);
  if (type >= 0) H5Tclose(type);
  H5Sclose(space);
}

// A dataset; choice 0 everywhere gives the expected rank, type (`good`), extent `near` and written `values`.
// Otherwise: absent, another rank, type or extent (up to 2^40 per dimension, chunked and unwritten: no bytes),
// deflated or not, values the fuzzer picks.
void put_dataset(FuzzedDataProvider& p, hid_t loc, const char* name, hid_t good, std::vector<hsize_t> near,
                 const std::vector<uint64_t>& values) {
  if (p.ConsumeIntegralInRange(0, 7) == 7) return;
  const int rank = p.ConsumeIntegralInRange(0, 3) == 0 ? int(near.size()) : p.ConsumeIntegralInRange(1, 3);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  uint64_t elems = 1;
  for (int i = 0; i < rank; ++i) {
    const int how = p.ConsumeIntegralInRange(0, 5);
    const hsize_t base = i < int(near.size()) ? near[size_t(i)] : 1;
    dims[size_t(i)] = how < 3    ? base + hsize_t(how)
                      : how == 3 ? base - std::min<hsize_t>(base, 1)
                      : how == 4 ? p.ConsumeIntegralInRange<hsize_t>(0, 64)
                                 : p.ConsumeIntegralInRange<hsize_t>(0, hsize_t(1) << 40);
    elems = dims[size_t(i)] && elems > (uint64_t(1) << 62) / dims[size_t(i)] ? (uint64_t(1) << 62)
                                                                             : elems * dims[size_t(i)];
  }
  const hid_t types[] = {good, H5T_STD_U64LE, H5T_STD_I64LE, H5T_STD_I32LE, H5T_STD_U8LE, H5T_IEEE_F64LE};
  const hid_t type = types[p.ConsumeIntegralInRange(0, 5)];
  hid_t space = H5Screate_simple(rank, dims.data(), nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  const bool small = elems <= 4096;
  if (!small || p.ConsumeBool()) {  // huge extents only as chunked, unwritten datasets
    std::vector<hsize_t> chunk(static_cast<size_t>(rank));
    for (int i = 0; i < rank; ++i) chunk[size_t(i)] = std::max<hsize_t>(1, std::min<hsize_t>(dims[size_t(i)], 16));
    H5Pset_chunk(dcpl, rank, chunk.data());
    if (p.ConsumeBool()) H5Pset_deflate(dcpl, 1);
  }
  hid_t ds = H5Dcreate2(loc, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  if (ds >= 0 && small && elems > 0 && p.ConsumeIntegralInRange(0, 7) != 7) {
    std::vector<uint64_t> data(elems);
    for (size_t i = 0; i < data.size(); ++i)
      data[i] = p.ConsumeIntegralInRange(0, 15) == 15 ? p.ConsumeIntegral<uint64_t>()
                : i < values.size()                   ? values[i]
                                                      : 0;
    H5Dwrite(ds, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data());
  }
  if (ds >= 0) H5Dclose(ds);
  H5Pclose(dcpl);
  H5Sclose(space);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = nl::fuzz::scratch_path("trace_struct.h5");
  static const bool quiet = (H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr), true);
  (void)quiet;
  FuzzedDataProvider p(data, size);
  const int64_t n_layers = p.ConsumeIntegralInRange(1, 3), n_tokens = p.ConsumeIntegralInRange(70, 200);
  const hsize_t words = hsize_t(n_tokens + 63) / 64;
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) std::abort();
  put_attr(p, f, "format", true, nl::kTraceFormat, 0);
  put_attr(p, f, "version", false, "1", nl::kTraceVersion);
  put_attr(p, f, "model", true, "m", 0);
  put_attr(p, f, "activation", true, "relu>0", 0);
  put_attr(p, f, "n_layers", false, "", n_layers);
  put_attr(p, f, "n_tokens", false, "", n_tokens);
  if (p.ConsumeIntegralInRange(0, 15) != 15) {
    hid_t layers = H5Gcreate2(f, "layers", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    const int groups = int(n_layers) + std::array<int, 3>{0, -1, 1}[p.ConsumeIntegralInRange(0, 2)];
    for (int l = 0; l < groups; ++l) {
      if (p.ConsumeIntegralInRange(0, 15) == 15) continue;
      hid_t g = H5Gcreate2(layers, std::to_string(l).c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      const int64_t nn = p.ConsumeIntegralInRange(1, 40);
      put_attr(p, g, "n_neurons", false, "", nn);
      if (p.ConsumeBool()) put_attr(p, g, "threshold", false, "", 1);
      std::vector<uint64_t> bits(size_t(nn) * words);
      for (auto& b : bits) b = 0x9e3779b97f4a7c15ull * uint64_t(&b - bits.data() + 1);  // bits past n_tokens too
      put_dataset(p, g, "mask", H5T_STD_U64LE, {hsize_t(nn), words}, bits);
      H5Gclose(g);
    }
    H5Gclose(layers);
  }
  put_dataset(p, f, "sequences", H5T_STD_I64LE, {2}, {0, uint64_t(n_tokens / 2)});
  put_dataset(p, f, "tokens", H5T_STD_I32LE, {hsize_t(n_tokens)}, {});
  H5Fclose(f);
  nl::fuzz::expect_clean(path, [&] {
    nl::TraceReader r(path);
    const nl::TraceInfo& info = r.info();
    if (info.n_neurons.size() != info.n_layers || (info.n_tokens > 0 && info.sequences.empty())) std::abort();
    for (uint32_t l = 0; l < info.n_layers; ++l) {
      nl::LayerMask m = r.read_layer(l);
      if (m.bits.size() != uint64_t(m.n_neurons) * m.words) std::abort();
      // Bits past n_tokens are cleared by the reader whatever the file holds.
      if (m.n_tokens % 64 != 0)
        for (uint32_t n = 0; n < m.n_neurons; ++n)
          if (m.row(n)[m.words - 1] >> (m.n_tokens % 64)) std::abort();
    }
  });
  return 0;
}
