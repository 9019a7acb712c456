#include "formats/layout.h"

#include <algorithm>
#include <cstdint>

#include "formats/core/atomic_file.h"
#include "formats/core/error.h"
#include "formats/trace.h"

namespace nl {

using nlohmann::json;

const std::vector<std::string>& layout_methods() {
  static const std::vector<std::string> m = {"identity", "frequency", "greedy", "greedy+ls", "rcm"};
  return m;
}

std::string layout_to_json(const Layout& l) {
  // One layer per line keeps 16k-entry orders readable in a diff; keys in a fixed order for byte identity.
  std::string s = "{\n";
  s += "  \"format\": " + json(kLayoutFormat).dump() + ",\n";
  s += "  \"version\": " + std::to_string(kLayoutVersion) + ",\n";
  json tr = json::object();
  tr["sha256"] = l.trace_sha256;
  tr["model"] = l.trace_model;
  tr["n_tokens"] = l.trace_tokens;
  s += "  \"trace\": " + tr.dump() + ",\n";
  s += "  \"method\": " + json(l.method).dump() + ",\n";
  s += "  \"parameters\": " + l.parameters.dump() + ",\n";
  s += "  \"n_layers\": " + std::to_string(l.layers.size()) + ",\n";
  s += "  \"layers\": [\n";
  for (size_t i = 0; i < l.layers.size(); ++i) {
    const LayoutLayer& L = l.layers[i];
    s +=
        "    {\"layer\": " + std::to_string(i) + ", \"n_neurons\": " + std::to_string(L.order.size() - L.replicas) +
        (L.replicas ? ", \"replicas\": " + std::to_string(L.replicas) : std::string()) +
        ", \"objective\": " + json(L.objective).dump() + ", \"upper_bound\": " + json(L.upper_bound).dump() +
        ", \"gap\": " + json(L.gap()).dump() + ", \"order\": " + json(L.order).dump() +
        (L.admission == CacheAdmission::kUnset ? std::string()
                                               : ", \"admission\": " + json(cache_admission_name(L.admission)).dump()) +
        (L.pinned.empty() ? std::string() : ", \"pinned\": " + json(L.pinned).dump()) +
        (L.small_fraction == 0 ? std::string() : ", \"small_fraction\": " + json(L.small_fraction).dump()) +
        (L.hot.empty() ? std::string() : ", \"hot\": " + json(L.hot).dump()) + "}";
    s += i + 1 < l.layers.size() ? ",\n" : "\n";
  }
  s += "  ]\n}\n";
  return s;
}

void layout_write(const std::string& path, const Layout& l) { write_file_atomic(path, layout_to_json(l)); }

namespace {
double number_or(const json& j, const char* key, const std::string& path, const std::string& where) {
  if (!j.contains(key)) return 0.0;
  if (!j[key].is_number()) throw InputError(path, where + "'" + key + "' must be a number");
  return j[key].get<double>();
}
}  // namespace

namespace {
// A layer's `order` as parsed: 4 bytes per entry instead of a JSON DOM node (16 bytes plus the array's growth; a
// 60 MB layout took 1.9 GB as a DOM). The first entry that is not a neuron index is kept for the error message.
struct OrderCapture {
  std::vector<uint32_t> v;
  size_t bad = SIZE_MAX;  // index of the first entry that is not an integer in [0, 2^32)
  std::string bad_text;   // that entry as written (empty: not an integer at all)
};

// Parses the layout with every layers[i].order entry moved out of the DOM into `orders` as it is read.
json parse_capturing_orders(const std::string& text, std::vector<OrderCapture>& orders) {
  struct Level {
    bool array = false;
    std::string key;  // objects: the key being read
  };
  std::vector<Level> st;
  size_t layer = 0;
  OrderCapture* cur = nullptr;
  auto in_layers = [&] { return st.size() == 2 && st[1].array && st[0].key == "layers"; };
  auto in_order = [&] {
    return st.size() == 4 && st[3].array && !st[2].array && st[2].key == "order" && st[1].array &&
           st[0].key == "layers";
  };
  auto element = [&](const json* value) {  // an entry of the order array being read
    OrderCapture& c = *cur;
    const size_t i = c.v.size();
    uint64_t u = 0;
    const bool ok = value && value->is_number_unsigned() && (u = value->get<uint64_t>()) <= 0xffffffffu;
    c.v.push_back(ok ? uint32_t(u) : 0);
    if (!ok && c.bad == SIZE_MAX) {
      c.bad = i;
      if (value && value->is_number_integer()) c.bad_text = value->dump();
    }
  };
  json::parser_callback_t cb = [&](int, json::parse_event_t ev, json& parsed) -> bool {
    using E = json::parse_event_t;
    switch (ev) {
      case E::key:
        st.back().key = parsed.get<std::string>();
        return true;
      case E::object_start:
      case E::array_start:
        if (in_order()) element(nullptr);  // a container inside an order: not an integer (kept in the DOM)
        if (in_layers()) layer++;
        if (ev == E::array_start && st.size() == 1 && st[0].key == "layers") {
          orders.clear();  // a repeated "layers" key: the last one wins, as in the DOM
          layer = 0;
        }
        st.push_back({ev == E::array_start, ""});
        if (in_order()) {
          if (orders.size() < layer) orders.resize(layer);
          orders[layer - 1] = OrderCapture{};  // a repeated "order" key: the last one wins
          cur = &orders[layer - 1];
        }
        return true;
      case E::object_end:
      case E::array_end:
        if (in_order()) cur = nullptr;
        st.pop_back();
        return true;
      case E::value:
        if (in_layers()) layer++;
        if (in_order()) {
          element(&parsed);
          return false;  // not kept in the DOM
        }
        return true;
    }
    return true;
  };
  return json::parse(text, cb);
}
}  // namespace

Layout layout_parse(const std::string& text, const std::string& path, const TraceInfo* trace) {
  json j;
  std::vector<OrderCapture> orders;
  try {
    j = parse_capturing_orders(text, orders);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers that overflow
    throw InputError(path, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw InputError(path, "a layout must be a JSON object");
  if (!j.contains("format") || j["format"] != kLayoutFormat)
    throw InputError(path, "format must be \"" + std::string(kLayoutFormat) + "\"");
  if (!j.contains("version") || !j["version"].is_number_integer()) throw InputError(path, "missing integer 'version'");
  // Unsigned past INT64_MAX (2^63) would wrap negative in get<int64_t>: compare it as what it is.
  if (j["version"].is_number_unsigned() && j["version"].get<uint64_t>() > uint64_t(kLayoutVersion))
    throw InputError(path, "layout version " + j["version"].dump() + " is newer than supported (" +
                               std::to_string(kLayoutVersion) + ")");
  int64_t ver = j["version"].get<int64_t>();
  if (ver > kLayoutVersion)
    throw InputError(path, "layout version " + std::to_string(ver) + " is newer than supported (" +
                               std::to_string(kLayoutVersion) + ")");
  if (ver < 1) throw InputError(path, "layout version must be >= 1");
  Layout l;
  if (!j.contains("method") || !j["method"].is_string()) throw InputError(path, "missing string 'method'");
  l.method = j["method"].get<std::string>();
  const auto& ms = layout_methods();
  if (std::find(ms.begin(), ms.end(), l.method) == ms.end())
    throw InputError(path, "unknown method '" + l.method + "'");
  if (j.contains("parameters")) {
    if (!j["parameters"].is_object()) throw InputError(path, "'parameters' must be an object");
    l.parameters = j["parameters"];
  }
  if (j.contains("trace")) {
    const json& t = j["trace"];
    if (!t.is_object()) throw InputError(path, "'trace' must be an object");
    if (t.contains("sha256")) {
      if (!t["sha256"].is_string()) throw InputError(path, "trace.sha256 must be a string");
      l.trace_sha256 = t["sha256"].get<std::string>();
    }
    if (t.contains("model") && t["model"].is_string()) l.trace_model = t["model"].get<std::string>();
    if (t.contains("n_tokens") && t["n_tokens"].is_number_unsigned()) l.trace_tokens = t["n_tokens"].get<uint64_t>();
  }
  if (!j.contains("layers") || !j["layers"].is_array()) throw InputError(path, "missing array 'layers'");
  const json& layers = j["layers"];
  if (j.contains("n_layers") &&
      (!j["n_layers"].is_number_integer() || j["n_layers"].get<int64_t>() != int64_t(layers.size())))
    throw InputError(path, "n_layers does not match the number of entries in 'layers'");
  if (trace && layers.size() != trace->n_layers)
    throw InputError(path, "has " + std::to_string(layers.size()) + " layers but trace " + trace->path + " has " +
                               std::to_string(trace->n_layers));
  for (size_t li = 0; li < layers.size(); ++li) {
    const json& L = layers[li];
    std::string where = "layer " + std::to_string(li) + ": ";
    if (!L.is_object()) throw InputError(path, where + "must be an object");
    if (L.contains("layer") && (!L["layer"].is_number_integer() || L["layer"].get<int64_t>() != int64_t(li)))
      throw InputError(path, where + "'layer' must equal its position " + std::to_string(li));
    if (!L.contains("order") || !L["order"].is_array()) throw InputError(path, where + "missing array 'order'");
    if (li >= orders.size())
      throw InternalError("layout_parse: order of layer " + std::to_string(li) + " not captured");
    const OrderCapture& o = orders[li];
    // Flash replication: `replicas` neurons appear twice, so the order has n_neurons + replicas slots.
    uint32_t replicas = 0;
    if (L.contains("replicas")) {
      if (!L["replicas"].is_number_integer() || L["replicas"].get<int64_t>() < 0 ||
          L["replicas"].get<int64_t>() > int64_t(o.v.size() / 2))
        throw InputError(path, where + "'replicas' must be an integer in [0, half the length of 'order']");
      replicas = L["replicas"].get<uint32_t>();
    }
    const size_t n = o.v.size() - replicas;
    if (L.contains("n_neurons") && (!L["n_neurons"].is_number_integer() || L["n_neurons"].get<int64_t>() != int64_t(n)))
      throw InputError(
          path, where + "n_neurons does not match the length of 'order'" + (replicas ? " less its replicas" : ""));
    if (trace && n != trace->n_neurons[li])
      throw InputError(path, where + "order has " + std::to_string(n) + " neurons but the trace layer has " +
                                 std::to_string(trace->n_neurons[li]));
    LayoutLayer out;
    out.replicas = replicas;
    out.order.resize(o.v.size());
    std::vector<uint8_t> seen(n, 0);
    for (size_t s = 0; s < o.v.size(); ++s) {
      if (s == o.bad && o.bad_text.empty())
        throw InputError(path, where + "order[" + std::to_string(s) + "] is not an integer");
      // The number as written (2^64-1 is not -1), whatever its size.
      const uint32_t v = o.v[s];
      if (s == o.bad || v >= n)
        throw InputError(path, where + "order[" + std::to_string(s) +
                                   "] = " + (s == o.bad ? o.bad_text : std::to_string(v)) + " is out of range [0, " +
                                   std::to_string(n) + ")");
      if (seen[size_t(v)] > (replicas ? 1 : 0))
        throw InputError(
            path, where + (replicas ? "order holds neuron " + std::to_string(v) + " more than twice"
                                    : "order is not a permutation: neuron " + std::to_string(v) + " appears twice"));
      ++seen[size_t(v)];
      out.order[s] = uint32_t(v);
    }
    if (replicas)  // n + replicas slots, each neuron at most twice: every neuron is there exactly when none is missing
      for (size_t v = 0; v < n; ++v)
        if (!seen[v]) throw InputError(path, where + "order lacks neuron " + std::to_string(v));
    if (L.contains("admission")) {
      if (!L["admission"].is_string() || !cache_admission_parse(L["admission"].get<std::string>(), &out.admission))
        throw InputError(path, where + "'admission' must be " + kCacheAdmissions);
    }
    auto neuron_list = [&](const char* name, std::vector<uint32_t>& dst) {
      if (!L.contains(name)) return;
      const json& pj = L[name];
      if (!pj.is_array()) throw InputError(path, where + "'" + name + "' must be an array of neuron indices");
      std::vector<uint8_t> seen_v(n, 0);
      for (size_t k = 0; k < pj.size(); ++k) {
        if (!pj[k].is_number_integer() || pj[k].get<int64_t>() < 0 || pj[k].get<int64_t>() >= int64_t(n))
          throw InputError(path, where + name + "[" + std::to_string(k) + "] is not a neuron index in [0, " +
                                     std::to_string(n) + ")");
        uint32_t v = pj[k].get<uint32_t>();
        if (seen_v[v]) throw InputError(path, where + name + " lists neuron " + std::to_string(v) + " twice");
        seen_v[v] = 1;
        dst.push_back(v);
      }
    };
    neuron_list("pinned", out.pinned);
    neuron_list("hot", out.hot);
    if (L.contains("small_fraction")) {
      // 0 is how the struct says "not recorded", so a recorded 0 is refused with the other out-of-range values.
      const double f = L["small_fraction"].is_number() ? L["small_fraction"].get<double>() : 0.0;
      if (f == 0 || !cache_small_fraction_valid(f))
        throw InputError(path, where + "'small_fraction' must be a number strictly between 0 and 1");
      out.small_fraction = f;
    }
    out.objective = number_or(L, "objective", path, where);
    out.upper_bound = number_or(L, "upper_bound", path, where);
    l.layers.push_back(std::move(out));
  }
  return l;
}

Layout layout_load(const std::string& path, const TraceInfo* trace) {
  // A real layout (80 layers x 28,672 neurons) is ~16 MB; orders are parsed at 4 bytes per entry, the rest as a DOM.
  constexpr uint64_t kLayoutMaxBytes = 64ull << 20;
  return layout_parse(read_file(path, kLayoutMaxBytes), path, trace);
}

std::vector<ImageCachePolicy> layout_cache_policy_slots(const Layout& l) {
  bool any = false;
  for (const auto& L : l.layers)
    any = any || L.admission != CacheAdmission::kUnset || !L.pinned.empty() || L.small_fraction != 0 || !L.hot.empty();
  if (!any) return {};
  std::vector<ImageCachePolicy> out(l.layers.size());
  for (size_t i = 0; i < l.layers.size(); ++i) {
    const LayoutLayer& L = l.layers[i];
    std::vector<uint32_t> slot_of(L.order.size() - L.replicas, UINT32_MAX);  // a neuron's first copy
    for (uint32_t s = 0; s < L.order.size(); ++s)
      if (slot_of[L.order[s]] == UINT32_MAX) slot_of[L.order[s]] = s;
    out[i].admission = L.admission;
    out[i].small_fraction = L.small_fraction;
    for (uint32_t v : L.pinned) out[i].pinned.push_back(slot_of.at(v));
    for (uint32_t v : L.hot) out[i].hot.push_back(slot_of.at(v));
  }
  return out;
}

}  // namespace nl
