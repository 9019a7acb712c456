#include <doctest/doctest.h>
#include <hdf5.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "formats/trace.h"
#include "skip_util.h"

using namespace nl;

namespace {

std::vector<LayerMask> random_masks(std::vector<uint32_t> neurons, uint64_t tokens, double p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution on(p);
  std::vector<LayerMask> out;
  for (uint32_t n : neurons) {
    LayerMask m(n, tokens);
    for (uint32_t i = 0; i < n; ++i)
      for (uint64_t t = 0; t < tokens; ++t)
        if (on(rng)) m.set(i, t);
    out.push_back(std::move(m));
  }
  return out;
}

TraceWriterOptions opts_for(const std::vector<LayerMask>& m) {
  TraceWriterOptions o;
  o.model = "test-model";
  o.activation = "relu>0";
  for (const auto& x : m) o.n_neurons.push_back(x.n_neurons);
  o.block_tokens = 128;  // small blocks exercise the streaming path
  return o;
}

std::string expect_input_error(const std::string& path) {
  try {
    TraceReader r(path);
    for (uint32_t l = 0; l < r.info().n_layers; ++l) r.read_layer(l);
  } catch (const InputError& e) {
    std::string m = e.what();
    CHECK(m.rfind(path + ": ", 0) == 0);
    return m;
  }
  FAIL("reader accepted malformed " << path);
  return "";
}

// Opens a valid trace for in-place damage.
struct H5Edit {
  hid_t f;
  explicit H5Edit(const std::string& p) { f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT); }
  ~H5Edit() { H5Fclose(f); }
  void set_int(const char* obj, const char* name, int64_t v) {
    hid_t o = H5Oopen(f, obj, H5P_DEFAULT);
    H5Adelete(o, name);
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(o, name, H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    H5Sclose(s);
    H5Oclose(o);
  }
  void set_str(const char* obj, const char* name, const std::string& v) {
    hid_t o = H5Oopen(f, obj, H5P_DEFAULT);
    H5Adelete(o, name);
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, v.size() + 1);
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(o, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, t, v.c_str());
    H5Aclose(a);
    H5Sclose(s);
    H5Tclose(t);
    H5Oclose(o);
  }
  void del_attr(const char* obj, const char* name) { H5Adelete_by_name(f, obj, name, H5P_DEFAULT); }
  void del_link(const char* name) { H5Ldelete(f, name, H5P_DEFAULT); }
  void set_double_array(const char* obj, const char* name, size_t n) {
    hid_t o = H5Oopen(f, obj, H5P_DEFAULT);
    H5Adelete(o, name);
    hsize_t d[1] = {n};
    std::vector<double> v(n, 0.5);
    hid_t s = H5Screate_simple(1, d, nullptr);
    hid_t a = H5Acreate2(o, name, H5T_IEEE_F64LE, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_DOUBLE, v.data());
    H5Aclose(a);
    H5Sclose(s);
    H5Oclose(o);
  }
  // Replaces `name` with a chunked dataset of the given extent whose chunks are never written: the file stays
  // small while the extent claims anything.
  void replace_unwritten(const char* name, hid_t type, std::vector<hsize_t> dims) {
    H5Ldelete(f, name, H5P_DEFAULT);
    hid_t s = H5Screate_simple(int(dims.size()), dims.data(), nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    std::vector<hsize_t> chunk(dims.size(), 1);
    H5Pset_chunk(dcpl, int(chunk.size()), chunk.data());
    hid_t ds = H5Dcreate2(f, name, type, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(s);
  }
  void write_tokens(std::vector<int32_t> v) {
    H5Ldelete(f, "tokens", H5P_DEFAULT);
    hsize_t d[1] = {v.size()};
    hid_t s = H5Screate_simple(1, d, nullptr);
    hid_t ds = H5Dcreate2(f, "tokens", H5T_STD_I32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    H5Dclose(ds);
    H5Sclose(s);
  }
  void write_sequences(std::vector<int64_t> v) {
    H5Ldelete(f, "sequences", H5P_DEFAULT);
    hsize_t d[1] = {v.size()};
    hid_t s = H5Screate_simple(1, d, nullptr);
    hid_t ds = H5Dcreate2(f, "sequences", H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    H5Dclose(ds);
    H5Sclose(s);
  }
};

}  // namespace

TEST_CASE("trace round trip: masks, sequences, tokens, odd token counts") {
  for (uint64_t tokens : {0ull, 1ull, 63ull, 64ull, 65ull, 300ull}) {
    auto masks = random_masks({37, 5, 0}, tokens, 0.3, tokens + 1);
    std::vector<int64_t> seq = {0};
    if (tokens > 10) seq.push_back(10);
    if (tokens == 0) seq.clear();
    std::vector<int32_t> ids;
    for (uint64_t t = 0; t < tokens; ++t) ids.push_back(static_cast<int32_t>(t * 7 % 512));
    std::string p = "rt_" + std::to_string(tokens) + ".h5";
    trace_write(p, opts_for(masks), masks, seq, ids);
    TraceReader r(p);
    CHECK(r.info().n_tokens == tokens);
    CHECK(r.info().n_layers == 3);
    CHECK(r.info().model == "test-model");
    CHECK(r.info().activation == "relu>0");
    CHECK(r.info().sequences == seq);
    CHECK(r.info().tokens == ids);
    for (uint32_t l = 0; l < 3; ++l) {
      LayerMask m = r.read_layer(l);
      CHECK(m.n_neurons == masks[l].n_neurons);
      CHECK(m.bits == masks[l].bits);
    }
    std::remove(p.c_str());
  }
}

TEST_CASE("whole-layer reads equal the written masks: compressible chunks, stored-raw chunks, edge chunks") {
  // Density 0.5 barely deflates, 0.02 deflates well; 300 neurons = one full and one edge chunk of rows; 1000
  // tokens = a partial last word and column chunk. Then one chunk is rewritten as stored raw (filter mask bit
  // set: what HDF5 writes when an optional filter is skipped), which the reader must take as is.
  for (double p : {0.5, 0.02}) {
    auto masks = random_masks({300, 7}, 1000, p, 11);
    trace_write("whole.h5", opts_for(masks), masks, {0});
    if (p < 0.1) {
      H5Edit e("whole.h5");
      hid_t ds = H5Dopen2(e.f, "/layers/0/mask", H5P_DEFAULT);
      hid_t dcpl = H5Dget_create_plist(ds);
      hsize_t cd[2] = {};
      REQUIRE(H5Pget_chunk(dcpl, 2, cd) == 2);
      std::vector<uint64_t> raw(cd[0] * cd[1], 0);
      for (uint64_t r = 0; r < cd[0] && r < 300; ++r)
        for (uint64_t w = 0; w < cd[1] && w < masks[0].words; ++w) raw[r * cd[1] + w] = masks[0].row(uint32_t(r))[w];
      hsize_t off[2] = {0, 0};
      REQUIRE(H5Dwrite_chunk(ds, H5P_DEFAULT, 1u, off, raw.size() * 8, raw.data()) >= 0);
      H5Pclose(dcpl);
      H5Dclose(ds);
    }
    TraceReader r("whole.h5");
    for (uint32_t l = 0; l < 2; ++l) {
      CAPTURE(p);
      CAPTURE(l);
      LayerMask m = r.read_layer(l);
      CHECK(m.bits == masks[l].bits);
      // The partial-range path (plain H5Dread) agrees with the whole-layer path.
      auto part = r.read_layer_words(l, 0, m.words - 1);
      bool same = true;
      for (uint32_t n = 0; n < m.n_neurons; ++n)
        for (uint64_t w = 0; w + 1 < m.words; ++w) same &= part[n * (m.words - 1) + w] == m.row(n)[w];
      CHECK(same);
    }
  }
  std::remove("whole.h5");
}

TEST_CASE("chunked word reads equal the whole layer") {
  auto masks = random_masks({50}, 1000, 0.1, 7);
  trace_write("chunks.h5", opts_for(masks), masks, {0});
  TraceReader r("chunks.h5");
  LayerMask whole = r.read_layer(0);
  uint64_t W = whole.words;
  for (uint64_t b = 0; b < W; b += 3) {
    uint64_t c = std::min<uint64_t>(3, W - b);
    auto part = r.read_layer_words(0, b, c);
    for (uint32_t n = 0; n < 50; ++n)
      for (uint64_t w = 0; w < c; ++w) CHECK(part[n * c + w] == whole.row(n)[b + w]);
  }
}

TEST_CASE("the documented h5py snippet reads the same booleans" * nl::test::needs_python("h5py", "python3-h5py")) {
  auto masks = random_masks({9, 4}, 130, 0.4, 3);
  trace_write("py.h5", opts_for(masks), masks, {0, 70});
  // The snippet is extracted from docs/formats.md so the documentation cannot rot.
  std::string doc = read_file(std::string(NL_SOURCE_DIR) + "/docs/formats.md");
  auto a = doc.find("```python\n"), b = doc.find("```", a + 10);
  REQUIRE(a != std::string::npos);
  std::string snippet = doc.substr(a + 10, b - a - 10);
  write_file_atomic("snippet.py", snippet +
                                      "\nimport sys\nm = read_layer(sys.argv[1], int(sys.argv[2]))\n"
                                      "print(''.join('1' if x else '0' for x in m.ravel()))\n");
  for (uint32_t l = 0; l < 2; ++l) {
    std::string out = "snippet_out.txt";
    std::string run = std::string(NL_PYTHON) + " snippet.py py.h5 " + std::to_string(l) + " > " + out;
    REQUIRE(std::system(run.c_str()) == 0);
    std::string bits = read_file(out);
    std::string expect;
    for (uint64_t t = 0; t < 130; ++t)  // the snippet returns tokens x neurons
      for (uint32_t n = 0; n < masks[l].n_neurons; ++n) expect += masks[l].test(n, t) ? '1' : '0';
    expect += "\n";
    CHECK(bits == expect);
  }
}

TEST_CASE("malformed traces: one clear error naming the file") {
  auto masks = random_masks({8, 8}, 100, 0.5, 11);
  auto fresh = [&](const std::string& p) { trace_write(p, opts_for(masks), masks, {0, 50}); };
  struct Case {
    const char* name;
    std::function<void(H5Edit&)> damage;
    const char* needle;
  };
  std::vector<Case> cases = {
      {"wrong_format", [](H5Edit& e) { e.set_str("/", "format", "something-else"); }, "format is 'something-else'"},
      {"future_version", [](H5Edit& e) { e.set_int("/", "version", 2); }, "newer than this reader"},
      {"missing_model", [](H5Edit& e) { e.del_attr("/", "model"); }, "missing attribute 'model'"},
      {"missing_ntokens", [](H5Edit& e) { e.del_attr("/", "n_tokens"); }, "missing attribute 'n_tokens'"},
      {"mask_shape", [](H5Edit& e) { e.set_int("/", "n_tokens", 1000); }, "has shape"},
      {"missing_layer", [](H5Edit& e) { e.del_link("layers/1"); }, "missing layer group /layers/1"},
      {"more_layers", [](H5Edit& e) { e.set_int("/", "n_layers", 3); }, "missing layer group /layers/2"},
      {"neurons_mismatch", [](H5Edit& e) { e.set_int("/layers/0", "n_neurons", 9); }, "has shape"},
      {"seq_unsorted",
       [](H5Edit& e) {
         e.write_sequences({0, 60, 40});
       },
       "not strictly increasing"},
      {"seq_range",
       [](H5Edit& e) {
         e.write_sequences({0, 100});
       },
       "out of range"},
      {"seq_first", [](H5Edit& e) { e.write_sequences({5}); }, "must start with 0"},
      {"missing_sequences", [](H5Edit& e) { e.del_link("sequences"); }, "missing dataset /sequences"},
      {"negative_tokens", [](H5Edit& e) { e.set_int("/", "n_tokens", -5); }, "out of range"},
      {"missing_format", [](H5Edit& e) { e.del_attr("/", "format"); }, "missing attribute 'format'"},
      {"format_not_string", [](H5Edit& e) { e.set_int("/", "format", 1); }, "'format' is not a string"},
      {"version_not_int", [](H5Edit& e) { e.set_str("/", "version", "1"); }, "'version' is not a scalar integer"},
      {"missing_layers_group", [](H5Edit& e) { e.del_link("layers"); }, "missing layer group /layers/0"},
      {"missing_mask", [](H5Edit& e) { e.del_link("layers/0/mask"); }, "missing dataset /layers/0/mask"},
      {"tokens_short",
       [](H5Edit& e) {
         e.write_tokens({1, 2, 3});
       },
       "/tokens has 3 entries"},
      // Regression: an array 'threshold' made H5Aread write 100 doubles into one (stack overflow).
      {"threshold_array", [](H5Edit& e) { e.set_double_array("/layers/0", "threshold", 100); }, "not a scalar number"},
      // Allocation bound: a mask whose extent claims 2^26 x 2^34 words that the file does not store must be
      // refused before anything is allocated (it used to ask for 2^63 bytes).
      {"mask_unwritten_huge",
       [](H5Edit& e) {
         e.set_int("/", "n_tokens", int64_t(1) << 40);
         e.set_int("/layers/0", "n_neurons", int64_t(1) << 26);
         e.replace_unwritten("layers/0/mask", H5T_STD_U64LE, {hsize_t(1) << 26, hsize_t(1) << 34});
       },
       "declares"},
      {"sequences_unwritten_huge",
       [](H5Edit& e) {
         e.set_int("/", "n_tokens", int64_t(1) << 40);  // masks now mismatch: checked first, so give layer 0 none
         e.set_int("/", "n_layers", 0);
         e.replace_unwritten("sequences", H5T_STD_I64LE, {hsize_t(1) << 36});
       },
       "declares"},
  };
  for (auto& c : cases) {
    std::string p = std::string("bad_") + c.name + ".h5";
    fresh(p);
    {
      H5Edit e(p);
      c.damage(e);
    }
    std::string m = expect_input_error(p);
    CHECK_MESSAGE(m.find(c.needle) != std::string::npos, c.name << ": " << m);
  }
  // Truncated file: half of a valid file.
  fresh("trunc_src.h5");
  std::string bytes = read_file("trunc_src.h5");
  write_file_atomic("bad_truncated.h5", bytes.substr(0, bytes.size() / 2));
  expect_input_error("bad_truncated.h5");
  // Reproducers the fuzzer found (fuzz/regressions): each must be refused with an InputError, not crash.
  for (const auto& e : std::filesystem::directory_iterator(std::string(NL_SOURCE_DIR) + "/fuzz/regressions")) {
    if (e.path().filename().string().rfind("trace-", 0) != 0) continue;
    INFO(e.path().string());
    expect_input_error(e.path().string());
  }
  // Not HDF5 at all.
  write_file_atomic("bad_text.h5", "hello, I am not HDF5\n");
  CHECK(expect_input_error("bad_text.h5").find("not an HDF5 file") != std::string::npos);
}
