// nl-layout report: block co-activation sums against brute force, base64 and PNG encoding, the page's content
// (one image per layer and order, histograms, the eval table matching nl-layout eval --json), determinism, bad
// input, and a headless-Chromium screenshot of the page with non-trivial content.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "formats/core/atomic_file.h"
#include "formats/layout.h"
#include "formats/trace.h"
#include "layout/report.h"
#include "layout/synthetic.h"
#include "skip_util.h"

#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#include <stb/stb_image.h>

using namespace nl;

namespace {

int run(const std::string& args, std::string* out = nullptr) {
  std::string cmd = std::string(NL_BINARY_DIR) + "/cli/nl-layout " + args + " > rep_out.txt 2> rep_err.txt";
  int st = std::system(cmd.c_str());
  if (out) *out = read_file("rep_out.txt");
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void write_trace(const std::string& path, uint64_t token_offset) {
  std::vector<LayerMask> masks;
  for (uint32_t l = 0; l < 2; ++l) {
    ClusteredTraceSpec s;
    s.n_neurons = 256;
    s.n_tokens = 1200 + token_offset;
    s.cluster_size = 12;
    s.cluster_rate = 0.05;
    s.seed = 100 + l;
    LayerMask all = clustered_mask(s);
    LayerMask t(256, 1200);
    for (uint32_t n = 0; n < 256; ++n)
      for (uint64_t k = 0; k < 1200; ++k)
        if (all.test(n, token_offset + k)) t.set(n, k);
    masks.push_back(t);
  }
  TraceWriterOptions o;
  o.model = "clustered";
  o.activation = "synthetic:clustered";
  o.n_neurons = {256, 256};
  trace_write(path, o, masks, {0});
}

size_t count_of(const std::string& s, const std::string& what) {
  size_t c = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++c;
  return c;
}

std::string base64_decode(const std::string& s) {
  std::string out;
  uint32_t v = 0;
  int bits = 0;
  for (char c : s) {
    int d;
    if (c >= 'A' && c <= 'Z')
      d = c - 'A';
    else if (c >= 'a' && c <= 'z')
      d = c - 'a' + 26;
    else if (c >= '0' && c <= '9')
      d = c - '0' + 52;
    else if (c == '+')
      d = 62;
    else if (c == '/')
      d = 63;
    else
      break;
    v = (v << 6) | uint32_t(d);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += char((v >> bits) & 0xff);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("coactivation_blocks equals brute-force pair counts summed over blocks") {
  std::mt19937_64 rng(7);
  LayerMask m(40, 150);
  for (uint32_t n = 0; n < 40; ++n)
    for (uint64_t t = 0; t < 150; ++t)
      if (rng() % 5 == 0) m.set(n, t);
  std::vector<uint32_t> order(40);
  for (uint32_t i = 0; i < 40; ++i) order[i] = (i * 17) % 40;  // a permutation (17 is coprime with 40)
  for (uint32_t px : {40u, 8u, 7u, 1u}) {
    std::vector<double> h = coactivation_blocks(m, order, px);
    std::vector<double> ref(size_t(px) * px, 0.0);
    for (uint32_t si = 0; si < 40; ++si)
      for (uint32_t sj = 0; sj < 40; ++sj) {
        if (si == sj) continue;
        uint64_t c = 0;
        for (uint64_t t = 0; t < 150; ++t) c += m.test(order[si], t) && m.test(order[sj], t);
        ref[size_t(si * px / 40) * px + sj * px / 40] += double(c);
      }
    CHECK(h == ref);
  }
}

TEST_CASE("base64 and heatmap PNG") {
  CHECK(base64_encode("") == "");
  CHECK(base64_encode("f") == "Zg==");
  CHECK(base64_encode("fo") == "Zm8=");
  CHECK(base64_encode("foo") == "Zm9v");
  CHECK(base64_encode("foobar") == "Zm9vYmFy");
  std::vector<double> b = {0, 1, 10, 1000};
  std::string png = heatmap_png(b, 2);
  int w = 0, h = 0, ch = 0;
  unsigned char* px =
      stbi_load_from_memory(reinterpret_cast<const unsigned char*>(png.data()), int(png.size()), &w, &h, &ch, 3);
  REQUIRE(px);
  CHECK(w == 2);
  CHECK(h == 2);
  CHECK((px[0] == 255 && px[1] == 255 && px[2] == 255));   // zero -> white
  CHECK((px[9] == 253 && px[10] == 231 && px[11] == 37));  // maximum -> viridis yellow
  CHECK(px[3] + px[4] + px[5] < px[6] + px[7] + px[8]);    // log scale: darker below the maximum
  stbi_image_free(px);
  // On a given scale (the report's one scale per layer), 1000 is no longer the top colour; 2000 would be.
  png = heatmap_png(b, 2, 2000);
  px = stbi_load_from_memory(reinterpret_cast<const unsigned char*>(png.data()), int(png.size()), &w, &h, &ch, 3);
  REQUIRE(px);
  CHECK_FALSE((px[9] == 253 && px[10] == 231 && px[11] == 37));
  CHECK((px[0] == 255 && px[1] == 255 && px[2] == 255));
  stbi_image_free(px);
}

// Issue 57: the heatmaps had no colour scale. The legend shows white for 0, the same nine viridis stops the PNGs
// interpolate, and ticks at log1p(count) / log1p(max) of the bar, labelled up to the maximum.
TEST_CASE("heatmap colour scale") {
  const std::string svg = heatmap_scale_svg(12345, "g1");
  CHECK(svg.rfind("<svg class=\"colour-scale\"", 0) == 0);
  CHECK(count_of(svg, "<stop ") == 9);
  CHECK(svg.find("stop-color=\"rgb(68,1,84)\"") != std::string::npos);     // viridis at 0
  CHECK(svg.find("stop-color=\"rgb(253,231,37)\"") != std::string::npos);  // and at the maximum
  CHECK(svg.find("fill=\"url(#g1)\"") != std::string::npos);
  CHECK(svg.find("fill=\"#fff\"") != std::string::npos);  // the swatch for 0
  for (const char* label : {">0<", ">1<", ">10<", ">100<", ">1000<", ">12345<", "max 12345)"})
    CHECK_MESSAGE(svg.find(label) != std::string::npos, label);
  CHECK(svg.find(">10000<") == std::string::npos);  // too close to the maximum's label: left out
  // The tick of 100 sits where heatmap_png puts the colour of 100: log1p(100) / log1p(12345) along the 380 px bar.
  char x[32];
  std::snprintf(x, sizeof x, "x=\"%.1f\" y=", 60 + 380 * std::log1p(100.0) / std::log1p(12345.0));
  CHECK_MESSAGE(svg.find(x) != std::string::npos, x);
}

TEST_CASE("nl-layout report: page content, eval figures, determinism, bad input, Chromium screenshot") {
  write_trace("rep_prof.h5", 0);
  write_trace("rep_test.h5", 1200);
  REQUIRE(run("-q solve --trace rep_prof.h5 --method identity --out rep_identity.json") == 0);
  REQUIRE(run("-q solve --trace rep_prof.h5 --method greedy --out rep_greedy.json") == 0);
  const std::string lays = " --layout rep_identity.json --layout rep_greedy.json";
  std::string out;
  REQUIRE(run("-q report --trace rep_test.h5" + lays + " --layers 0,1 --out rep.html --json", &out) == 0);
  auto j = nlohmann::json::parse(out);
  CHECK(j["layers"] == nlohmann::json({0, 1}));
  std::string html = read_file("rep.html");
  CHECK(j["bytes"].get<size_t>() == html.size());
  // 2 layers x (original order = identity, greedy order) heatmaps, all decodable 256 x 256 PNGs
  CHECK(count_of(html, "data:image/png;base64,") == 4);
  CHECK(count_of(html, "<figcaption>original order = identity</figcaption>") == 2);
  CHECK(count_of(html, "<figcaption>greedy order</figcaption>") == 2);
  for (size_t p = html.find("base64,"); p != std::string::npos; p = html.find("base64,", p + 1)) {
    size_t e = html.find('"', p);
    std::string png = base64_decode(html.substr(p + 7, e - p - 7));
    int w = 0, h = 0, ch = 0;
    unsigned char* px =
        stbi_load_from_memory(reinterpret_cast<const unsigned char*>(png.data()), int(png.size()), &w, &h, &ch, 3);
    REQUIRE(px);
    CHECK(w == 256);
    CHECK(h == 256);
    stbi_image_free(px);
  }
  CHECK(count_of(html, "<svg") == 4);  // per layer: the heatmaps' colour scale and the read-length histogram
  CHECK(html.find("http://") == html.find("http://www.w3.org/2000/svg"));  // no external resources
  // One colour scale per layer, shared by its maps: its maximum is the largest block of any of the layer's orders.
  CHECK(count_of(html, "<svg class=\"colour-scale\"") == 2);
  {
    TraceReader tr("rep_test.h5");
    const Layout g = layout_load("rep_greedy.json", &tr.info());
    for (uint32_t l = 0; l < 2; ++l) {
      const LayerMask m = tr.read_layer(l);
      std::vector<uint32_t> ident(256);
      for (uint32_t n = 0; n < 256; ++n) ident[n] = n;
      double mx = 0;
      const std::vector<uint32_t>* orders[] = {&ident, &g.layers[l].order};
      for (const std::vector<uint32_t>* order : orders)
        for (double v : coactivation_blocks(m, *order, 256)) mx = std::max(mx, v);
      const std::string label = "max " + std::to_string(uint64_t(mx)) + ")";
      CHECK_MESSAGE(html.find(label) != std::string::npos, label);
    }
  }
  CHECK(count_of(html, "<th>rd/grd</th>") == 3);  // with greedy in the report: the total and each layer's table
  CHECK(html.find("model clustered,") != std::string::npos);
  CHECK(html.find("src=\"http") == std::string::npos);
  // The eval table shows nl-layout eval's figures (same code, same options).
  REQUIRE(run("-q eval --trace rep_test.h5" + lays + " --json", &out) == 0);
  auto ej = nlohmann::json::parse(out);
  for (const auto& row : ej["layouts"]) {
    char cell[128];
    std::snprintf(cell, sizeof cell, "<tr><td>%s</td><td>%.2f</td><td>%.2f</td>",
                  row["name"].get<std::string>().c_str(), row["reads"].get<double>(), row["avg_len"].get<double>());
    CHECK_MESSAGE(html.find(cell) != std::string::npos, cell);
  }
  // Byte-identical on a second run; --quiet prints nothing on stderr.
  REQUIRE(run("-q report --trace rep_test.h5" + lays + " --layers 0,1 --out rep2.html") == 0);
  CHECK(read_file("rep2.html") == html);
  CHECK(read_file("rep_err.txt").empty());
  // Bad input: a layer out of range (usage, 2), a malformed layout (3); no page is left behind.
  CHECK(run("report --trace rep_test.h5" + lays + " --layers 5 --out rep_bad.html") == 2);
  write_file_atomic("rep_broken.json", "{\"format\": \"neuralink-layout\", \"version\": 1, \"layers\": [");
  CHECK(run("report --trace rep_test.h5 --layout rep_broken.json --out rep_bad.html") == 3);
  CHECK(read_file("rep_err.txt").find("rep_broken.json") != std::string::npos);
  CHECK(::access("rep_bad.html", F_OK) != 0);
  // Issue 57: without a greedy layout the rd/grd and io/grd columns were all "-": they are left out (likewise
  // rd/idn and io/idn without identity), and every row has as many cells as the header.
  REQUIRE(run("-q report --trace rep_test.h5 --layout rep_identity.json --layers 0 --out rep_nogreedy.html") == 0);
  const std::string ng = read_file("rep_nogreedy.html");
  CHECK(ng.find("rd/grd") == std::string::npos);
  CHECK(ng.find("io/grd") == std::string::npos);
  CHECK(count_of(ng, "<th>rd/idn</th>") == 2);
  CHECK(count_of(ng, "<th>") == 2 * 10);  // 8 figures + 2 ratios, in the total and the layer table
  CHECK(count_of(ng, "<td>") == 2 * 10);  // one identity row in each
  REQUIRE(run("-q report --trace rep_test.h5 --layout rep_greedy.json --layers 0 --out rep_nogreedy.html") == 0);
  const std::string ni = read_file("rep_nogreedy.html");  // greedy alone: its ratios to itself, no identity ratios
  CHECK(ni.find("rd/idn") == std::string::npos);
  CHECK(count_of(ni, "<th>rd/grd</th>") == 2);

  const char* chromium = "/usr/bin/chromium";
  if (::access(chromium, X_OK) != 0) {
    nl::test::skip_part("screenshot check: /usr/bin/chromium is absent (scripts/bootstrap.sh report installs it)");
    return;
  }
  std::remove("rep_shot.png");
  char cwd[4096];
  REQUIRE(::getcwd(cwd, sizeof cwd));
  std::string cmd =
      std::string("dir=$(mktemp -d) && timeout 240 ") + chromium +
      " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking"
      " --disable-component-update --disable-sync --user-data-dir=$dir --screenshot=rep_shot.png"
      " --window-size=1200,2000 file://" +
      cwd + "/rep.html > rep_chromium.txt 2>&1; rc=$?; rm -rf $dir; exit $rc";
  int st = std::system(cmd.c_str());
  INFO(read_file("rep_chromium.txt"));
  REQUIRE((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  int w = 0, h = 0, ch = 0;
  unsigned char* px = stbi_load("rep_shot.png", &w, &h, &ch, 3);
  REQUIRE(px);
  CHECK(w == 1200);
  CHECK(h == 2000);
  // Non-trivial content: a good share of non-white pixels, and real colour (the viridis heatmaps), not just text.
  size_t non_white = 0, coloured = 0;
  double sum = 0, sum2 = 0;
  for (size_t i = 0; i < size_t(w) * h; ++i) {
    const unsigned char* p = px + 3 * i;
    if (p[0] < 240 || p[1] < 240 || p[2] < 240) ++non_white;
    if (std::abs(int(p[0]) - int(p[1])) > 40 || std::abs(int(p[1]) - int(p[2])) > 40) ++coloured;
    double g = (p[0] + p[1] + p[2]) / 3.0;
    sum += g;
    sum2 += g * g;
  }
  stbi_image_free(px);
  double n = double(w) * h, var = sum2 / n - (sum / n) * (sum / n);
  MESSAGE("screenshot: " << 100.0 * non_white / n << "% non-white, " << 100.0 * coloured / n
                         << "% coloured, grey variance " << var);
  CHECK(non_white > n * 0.05);
  CHECK(coloured > n * 0.03);
  CHECK(var > 500);
}
