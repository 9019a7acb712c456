// Layout JSON: round trip, byte-identical writes, and one clear InputError per kind of malformed file; sha256.
#include <doctest/doctest.h>

#include <string>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "formats/layout.h"
#include "formats/sha256.h"
#include "formats/trace.h"

using namespace nl;

namespace {

Layout sample() {
  Layout l;
  l.method = "greedy";
  l.parameters = {{"seed", 1}, {"top_k", 32}};
  l.trace_sha256 = std::string(64, 'a');
  l.trace_model = std::string("m");  // not a char* assignment: GCC 12 -O3 warns falsely (-Wrestrict) on that
  l.trace_tokens = 100;
  l.layers.resize(2);
  l.layers[0].order = {2, 0, 1};
  l.layers[0].objective = 10;
  l.layers[0].upper_bound = 12.5;
  l.layers[1].order = {1, 0};
  l.layers[1].admission = CacheAdmission::kAll;
  l.layers[1].pinned = {1};
  return l;
}

std::string expect_error(const std::string& text, const std::string& needle, const TraceInfo* ti = nullptr) {
  try {
    layout_parse(text, "lay.json", ti);
  } catch (const InputError& e) {
    std::string m = e.what();
    CHECK(m.rfind("lay.json: ", 0) == 0);
    CHECK_MESSAGE(m.find(needle) != std::string::npos, m);
    return m;
  }
  FAIL("accepted: " << text);
  return "";
}

std::string replace(std::string s, const std::string& a, const std::string& b) {
  size_t p = s.find(a);
  REQUIRE(p != std::string::npos);
  return s.replace(p, a.size(), b);
}

}  // namespace

TEST_CASE("sha256 test vectors") {
  for (bool portable : {false, true}) {
    CAPTURE(portable);
    detail::sha256_portable = portable;  // SHA-NI (where present) and the portable rounds
    CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    std::string big(1000000, 'a');
    CHECK(sha256_hex(big) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    write_file_atomic("sha_test.bin", "abc");
    CHECK(sha256_file("sha_test.bin") == sha256_hex("abc"));
    // Split updates across the block buffer and whole-block runs.
    Sha256 s;
    std::string msg(1000, 'q');
    for (size_t i = 0; i < msg.size(); ++i) msg[i] = char('a' + (i * 7) % 26);
    s.update(msg.data(), 3);
    s.update(msg.data() + 3, 700);
    s.update(msg.data() + 703, 297);
    CHECK(s.hex_digest() == sha256_hex(msg));
  }
  detail::sha256_portable = false;
}

TEST_CASE("layout JSON round trip; writes are byte-identical") {
  Layout l = sample();
  std::string a = layout_to_json(l), b = layout_to_json(l);
  CHECK(a == b);
  Layout r = layout_parse(a, "x");
  CHECK(r.method == "greedy");
  CHECK(r.layers.size() == 2);
  CHECK(r.layers[0].order == std::vector<uint32_t>{2, 0, 1});
  CHECK(r.layers[0].upper_bound == 12.5);
  CHECK(r.layers[0].gap() == doctest::Approx(0.2));
  CHECK(r.trace_sha256 == l.trace_sha256);
  CHECK(r.layers[0].admission == CacheAdmission::kUnset);
  CHECK(r.layers[0].pinned.empty());
  CHECK(r.layers[1].admission == CacheAdmission::kAll);
  CHECK(r.layers[1].pinned == std::vector<uint32_t>{1});
  CHECK(layout_to_json(r) == a);
  r.layers[1].admission = CacheAdmission::kIsolated;
  CHECK(layout_parse(layout_to_json(r), "x").layers[1].admission == CacheAdmission::kIsolated);
  CHECK(a.find("small_fraction") == std::string::npos);  // not written when not recorded
  r.layers[1].small_fraction = 0.5;
  CHECK(layout_to_json(r).find("\"small_fraction\": 0.5") != std::string::npos);
  CHECK(layout_parse(layout_to_json(r), "x").layers[1].small_fraction == 0.5);
  CHECK(layout_parse(layout_to_json(r), "x").layers[0].small_fraction == 0.0);
  CHECK(layout_cache_policy_slots(layout_parse(layout_to_json(r), "x"))[1].small_fraction == 0.5);
  // The value cache's hotness order: written when recorded, read back, turned into slots by the layer's order.
  CHECK(a.find("\"hot\"") == std::string::npos);
  r.layers[0].admission = CacheAdmission::kValue;
  r.layers[0].hot = {1, 2, 0};
  const Layout rv = layout_parse(layout_to_json(r), "x");
  CHECK(rv.layers[0].admission == CacheAdmission::kValue);
  CHECK(rv.layers[0].hot == std::vector<uint32_t>{1, 2, 0});
  CHECK(rv.layers[1].hot.empty());
  CHECK(layout_cache_policy_slots(rv)[0].hot == std::vector<uint32_t>{2, 0, 1});  // order {2, 0, 1}: slot of 1 is 2
  layout_write("lay_rt.json", l);
  CHECK(read_file("lay_rt.json") == a);
}

TEST_CASE("malformed layouts: one clear error each") {
  std::string ok = layout_to_json(sample());
  expect_error("{", "not valid JSON");
  expect_error("{\"version\": 1e999999}", "not valid JSON");  // out_of_range from the parser, not parse_error
  expect_error("[1]", "JSON object");
  expect_error(replace(ok, "\"neuralink-layout\"", "\"other\""), "format must be");
  expect_error(replace(ok, "\"version\": 1", "\"version\": 2"), "newer than supported");
  expect_error(replace(ok, "\"method\": \"greedy\"", "\"method\": \"magic\""), "unknown method 'magic'");
  expect_error(replace(ok, "[2,0,1]", "[2,0,0]"), "not a permutation: neuron 0 appears twice");
  expect_error(replace(ok, "[2,0,1]", "[2,0,3]"), "out of range");
  expect_error(replace(ok, "[2,0,1]", "[2,0,-1]"), "out of range");
  expect_error(replace(ok, "[2,0,1]", "[2,0,\"x\"]"), "not an integer");
  expect_error(replace(ok, "\"n_neurons\": 3", "\"n_neurons\": 4"), "n_neurons does not match");
  expect_error(replace(ok, "\"n_layers\": 2", "\"n_layers\": 3"), "n_layers does not match");
  expect_error(replace(ok, "\"layers\": [", "\"layerz\": ["), "missing array 'layers'");
  expect_error(replace(ok, "\"admission\": \"all\"", "\"admission\": \"lru\""), "layer 1: 'admission' must be");
  expect_error(replace(ok, "\"pinned\": [1]", "\"pinned\": [2]"), "layer 1: pinned[0] is not a neuron index in [0, 2)");
  expect_error(replace(ok, "\"pinned\": [1]", "\"pinned\": [1,1]"), "pinned lists neuron 1 twice");
  expect_error(replace(ok, "\"pinned\": [1]", "\"pinned\": 1"), "'pinned' must be an array");
  expect_error(replace(ok, "\"pinned\": [1]", "\"pinned\": [1], \"hot\": [0, 2]"),
               "layer 1: hot[1] is not a neuron index in [0, 2)");
  expect_error(replace(ok, "\"pinned\": [1]", "\"pinned\": [1], \"hot\": [0, 0]"), "hot lists neuron 0 twice");
  expect_error(replace(ok, "\"pinned\": [1]", "\"pinned\": [1], \"hot\": {}"), "'hot' must be an array");
  for (const char* bad : {"0", "1", "1.5", "-0.2", "\"x\""})
    expect_error(replace(ok, "\"pinned\": [1]", std::string("\"pinned\": [1], \"small_fraction\": ") + bad),
                 "layer 1: 'small_fraction' must be a number strictly between 0 and 1");
  TraceInfo ti;
  ti.path = "t.h5";
  ti.n_layers = 2;
  ti.n_neurons = {3, 2};
  CHECK_NOTHROW(layout_parse(ok, "lay.json", &ti));
  ti.n_neurons = {3, 5};
  expect_error(ok, "layer 1: order has 2 neurons but the trace layer has 5", &ti);
  ti.n_layers = 3;
  ti.n_neurons = {3, 2, 2};
  expect_error(ok, "has 2 layers but trace t.h5 has 3", &ti);
}
