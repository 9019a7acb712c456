// Graph file v1: round trip, shard merge equals one run, and one clear error per malformed-file kind.
#include <doctest/doctest.h>
#include <hdf5.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include "formats/core/error.h"
#include "formats/trace.h"
#include "graph/coactivation.h"
#include "graph/graph_file.h"

using namespace nl;

namespace {

LayerMask random_mask(uint32_t n, uint64_t tokens, double p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution on(p);
  LayerMask m(n, tokens);
  for (uint32_t i = 0; i < n; ++i)
    for (uint64_t t = 0; t < tokens; ++t)
      if (on(rng)) m.set(i, t);
  return m;
}

LayerMask slice(const LayerMask& m, uint64_t t0, uint64_t t1) {
  LayerMask s(m.n_neurons, t1 - t0);
  for (uint32_t i = 0; i < m.n_neurons; ++i)
    for (uint64_t t = t0; t < t1; ++t)
      if (m.test(i, t)) s.set(i, t - t0);
  return s;
}

void check_same(const LayerGraph& a, const LayerGraph& b) {
  CHECK(a.n_neurons == b.n_neurons);
  CHECK(a.n_tokens == b.n_tokens);
  CHECK(a.k == b.k);
  CHECK(a.freq == b.freq);
  CHECK(a.nbr == b.nbr);
  CHECK(a.nbr_cnt == b.nbr_cnt);
  CHECK(a.nbr_len == b.nbr_len);
  CHECK(a.upper == b.upper);
}

// Writes a graph file of `masks` (layers given) and returns the graphs written.
std::vector<LayerGraph> write_graph(const std::string& path, const std::vector<LayerMask>& masks,
                                    const std::vector<uint32_t>& ids, uint32_t k, bool full) {
  GraphFileWriter w(path, "test");
  std::vector<LayerGraph> out;
  CoactivationOptions o;
  o.top_k = k;
  o.full_matrix = full;
  for (size_t i = 0; i < masks.size(); ++i) {
    out.push_back(coactivation_count(masks[i], o));
    w.add_layer(ids[i], out.back());
  }
  w.close();
  return out;
}

std::string expect_input_error(const std::string& path) {
  try {
    GraphFileReader r(path);
    for (size_t i = 0; i < r.info().layers.size(); ++i) r.read_layer(i);
  } catch (const InputError& e) {
    std::string m = e.what();
    CHECK(m.rfind(path + ": ", 0) == 0);
    return m;
  }
  FAIL("reader accepted malformed " << path);
  return "";
}

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
  void del_attr(const char* obj, const char* name) {
    hid_t o = H5Oopen(f, obj, H5P_DEFAULT);
    H5Adelete(o, name);
    H5Oclose(o);
  }
  void unlink(const char* name) { H5Ldelete(f, name, H5P_DEFAULT); }
  // Overwrites element `i` of a 1-D or 2-D uint32 dataset (flattened index).
  void poke_u32(const char* name, hsize_t i, uint32_t v) {
    hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
    hid_t s = H5Dget_space(ds);
    int nd = H5Sget_simple_extent_ndims(s);
    hsize_t dims[2] = {0, 0};
    H5Sget_simple_extent_dims(s, dims, nullptr);
    hsize_t coord[2] = {nd == 2 ? i / dims[1] : i, nd == 2 ? i % dims[1] : 0};
    H5Sselect_elements(s, H5S_SELECT_SET, 1, coord);
    hsize_t one = 1;
    hid_t ms = H5Screate_simple(1, &one, nullptr);
    H5Dwrite(ds, H5T_NATIVE_UINT32, ms, s, H5P_DEFAULT, &v);
    H5Sclose(ms);
    H5Sclose(s);
    H5Dclose(ds);
  }
  void replace_u32_1d(const char* name, std::vector<uint32_t> v) {
    H5Ldelete(f, name, H5P_DEFAULT);
    hsize_t d = v.size();
    hid_t s = H5Screate_simple(1, &d, nullptr);
    hid_t ds = H5Dcreate2(f, name, H5T_STD_U32LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    H5Dclose(ds);
    H5Sclose(s);
  }
};

}  // namespace

TEST_CASE("graph file round trip, with and without the full matrix") {
  std::vector<LayerMask> masks = {random_mask(40, 300, 0.2, 1), random_mask(0, 300, 0.2, 2),
                                  random_mask(1, 300, 0.5, 3), random_mask(25, 300, 1.0, 4)};
  for (bool full : {false, true})
    for (uint32_t k : {0u, 6u}) {
      const std::string p = "test_graph_rt.h5";
      auto gs = write_graph(p, masks, {0, 2, 3, 7}, k, full);
      GraphFileReader r(p);
      CHECK(r.info().layers == std::vector<uint32_t>{0, 2, 3, 7});
      CHECK(r.info().n_neurons == std::vector<uint32_t>{40, 0, 1, 25});
      CHECK(r.info().top_k == k);
      CHECK(r.info().full == full);
      CHECK(r.info().n_tokens == 300);
      for (size_t i = 0; i < gs.size(); ++i) check_same(r.read_layer(i), gs[i]);
      std::remove(p.c_str());
    }
}

TEST_CASE("merging graph files of token shards equals counting the whole trace") {
  const uint64_t T = 1500;
  std::vector<LayerMask> whole = {random_mask(70, T, 0.15, 10), random_mask(9, T, 0.6, 11)};
  const uint64_t cuts[] = {0, 333, 700, 1500};
  std::vector<std::string> shard_paths;
  for (int s = 0; s < 3; ++s) {
    std::vector<LayerMask> part;
    for (auto& m : whole) part.push_back(slice(m, cuts[s], cuts[s + 1]));
    shard_paths.push_back("test_graph_shard" + std::to_string(s) + ".h5");
    write_graph(shard_paths.back(), part, {0, 1}, 8, true);
  }
  auto ref = write_graph("test_graph_whole.h5", whole, {0, 1}, 8, true);
  graph_file_merge(shard_paths, "test_graph_merged.h5", std::nullopt);
  {
    GraphFileReader r("test_graph_merged.h5");
    CHECK(r.info().full);
    CHECK(r.info().n_tokens == T);
    for (size_t i = 0; i < ref.size(); ++i) check_same(r.read_layer(i), ref[i]);
  }
  // A different k in the output is rebuilt from the summed matrix.
  graph_file_merge(shard_paths, "test_graph_merged3.h5", 3u);
  {
    GraphFileReader r("test_graph_merged3.h5");
    LayerGraph g = r.read_layer(0), h = ref[0];
    coactivation_build_topk(h, 3);
    check_same(g, h);
  }
  // Merging merged files again stays exact (the output keeps the full matrix).
  graph_file_merge({"test_graph_merged.h5"}, "test_graph_merged_again.h5", std::nullopt);
  {
    GraphFileReader r("test_graph_merged_again.h5");
    check_same(r.read_layer(1), ref[1]);
  }
  // Top-k-only inputs are refused: their sums would not be exact.
  write_graph("test_graph_topk_only.h5", whole, {0, 1}, 8, false);
  try {
    graph_file_merge({shard_paths[0], "test_graph_topk_only.h5"}, "test_graph_bad_merge.h5", std::nullopt);
    FAIL("merged a top-k-only file");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("top-k lists only") != std::string::npos);
  }
  // Different layer sets are refused.
  write_graph("test_graph_other.h5", {whole[0]}, {0}, 8, true);
  CHECK_THROWS_AS(graph_file_merge({shard_paths[0], "test_graph_other.h5"}, "test_graph_bad_merge.h5", std::nullopt),
                  InputError);
  // k must agree unless given.
  write_graph("test_graph_k5.h5", whole, {0, 1}, 5, true);
  CHECK_THROWS_AS(graph_file_merge({shard_paths[0], "test_graph_k5.h5"}, "test_graph_bad_merge.h5", std::nullopt),
                  InputError);
  CHECK_NOTHROW(graph_file_merge({shard_paths[0], "test_graph_k5.h5"}, "test_graph_ok_merge.h5", 4u));
  std::ifstream bad("test_graph_bad_merge.h5");
  CHECK(!bad.good());  // nothing half-written left behind
  for (auto p : {"test_graph_whole.h5", "test_graph_merged.h5", "test_graph_merged3.h5", "test_graph_merged_again.h5",
                 "test_graph_topk_only.h5", "test_graph_other.h5", "test_graph_k5.h5", "test_graph_ok_merge.h5"})
    std::remove(p);
  for (auto& p : shard_paths) std::remove(p.c_str());
}

TEST_CASE("malformed graph files: one clear error naming the file") {
  const std::string base = "test_graph_base.h5";
  write_graph(base, {random_mask(30, 200, 0.3, 5), random_mask(12, 200, 0.3, 6)}, {1, 4}, 5, true);
  auto damaged = [&](const std::string& name, const std::function<void(H5Edit&)>& edit) {
    std::ifstream src(base, std::ios::binary);
    std::ofstream dst(name, std::ios::binary);
    dst << src.rdbuf();
    dst.close();
    {
      H5Edit e(name);
      edit(e);
    }
    std::string m = expect_input_error(name);
    std::remove(name.c_str());
    return m;
  };
  CHECK(damaged("g_bad_format.h5", [](H5Edit& e) {
          e.set_str("/", "format", "neuralink-trace");
        }).find("expected 'neuralink-graph'") != std::string::npos);
  CHECK(damaged("g_future.h5", [](H5Edit& e) { e.set_int("/", "version", 2); }).find("newer than this reader") !=
        std::string::npos);
  CHECK(damaged("g_no_tokens.h5", [](H5Edit& e) {
          e.del_attr("/", "n_tokens");
        }).find("missing attribute 'n_tokens'") != std::string::npos);
  CHECK(damaged("g_more_layers.h5", [](H5Edit& e) { e.set_int("/", "n_layers", 3); }).find("missing layer group") !=
        std::string::npos);
  CHECK(damaged("g_bad_full.h5", [](H5Edit& e) { e.set_int("/", "full", 7); }).find("'full'") != std::string::npos);
  CHECK(damaged("g_unsorted_layers.h5", [](H5Edit& e) {
          e.set_int("/layers/1", "layer", 0);
        }).find("not strictly increasing") != std::string::npos);
  CHECK(damaged("g_neurons.h5", [](H5Edit& e) { e.set_int("/layers/0", "n_neurons", 31); }).find("has shape") !=
        std::string::npos);
  CHECK(damaged("g_no_upper.h5", [](H5Edit& e) {
          e.unlink("/layers/0/upper");
        }).find("missing dataset /layers/0/upper") != std::string::npos);
  CHECK(damaged("g_no_freq.h5", [](H5Edit& e) { e.unlink("/layers/1/freq"); }).find("missing dataset /layers/1/freq") !=
        std::string::npos);
  CHECK(damaged("g_short_len.h5", [](H5Edit& e) {
          e.replace_u32_1d("/layers/0/nbr_len", {1, 2, 3});
        }).find("/layers/0/nbr_len has shape [3]") != std::string::npos);
  CHECK(damaged("g_len.h5", [](H5Edit& e) { e.poke_u32("/layers/0/nbr_len", 3, 6); }).find("nbr_len exceeds top_k") !=
        std::string::npos);
  CHECK(damaged("g_self.h5", [](H5Edit& e) {
          e.poke_u32("/layers/0/nbr", 0, 0);
        }).find("neighbour index 0 is invalid") != std::string::npos);
  CHECK(damaged("g_range.h5", [](H5Edit& e) { e.poke_u32("/layers/1/nbr", 5, 999); }).find("is invalid") !=
        std::string::npos);
  CHECK(damaged("g_order.h5", [](H5Edit& e) { e.poke_u32("/layers/0/nbr_cnt", 1, 150); }).find("inconsistent") !=
        std::string::npos);
  CHECK(damaged("g_upper.h5", [](H5Edit& e) { e.poke_u32("/layers/0/upper", 10, 201); }).find("larger than n_tokens") !=
        std::string::npos);
  // Not HDF5 at all, and truncated.
  {
    std::ofstream("g_text.h5") << "hello";
    CHECK(expect_input_error("g_text.h5").find("not an HDF5 file") != std::string::npos);
    std::remove("g_text.h5");
    std::ifstream src(base, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(src)), std::istreambuf_iterator<char>());
    std::ofstream("g_trunc.h5", std::ios::binary) << all.substr(0, all.size() / 2);
    expect_input_error("g_trunc.h5");
    std::remove("g_trunc.h5");
  }
  // A trace is not a graph.
  {
    TraceWriterOptions wo;
    wo.model = "m";
    wo.activation = "x";
    wo.n_neurons = {3};
    trace_write("g_is_trace.h5", wo, {random_mask(3, 10, 0.5, 1)}, {0});
    CHECK(expect_input_error("g_is_trace.h5").find("format is 'neuralink-trace'") != std::string::npos);
    std::remove("g_is_trace.h5");
  }
  std::remove(base.c_str());
}
