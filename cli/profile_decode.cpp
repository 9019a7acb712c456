// nl-profile decode: token ids -> text with a tokenizer, e.g. to read what `nl-run generate` (which prints ids:
// the phone runtime carries no tokenizer) generated from a flash image.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "formats/core/error.h"
#include "profiler/tokenizer.h"

namespace nl::cli {
namespace {

struct DecodeArgs {
  std::string tokenizer, ids;
};

void decode_main(const DecodeArgs& a, const GlobalOptions& g) {
  apply_global_options(g);
  const auto tok = open_tokenizer(a.tokenizer);
  std::vector<int32_t> ids;
  std::istringstream in(a.ids);
  for (std::string item; in >> item;) {
    for (char& ch : item)
      if (ch == ',') ch = ' ';
    std::istringstream parts(item);
    for (std::string p; parts >> p;) {
      size_t used = 0;
      long v = -1;
      try {
        v = std::stol(p, &used);
      } catch (const std::exception&) {
      }
      if (used != p.size() || v < 0 || v >= tok->vocab_size())
        throw UsageError("--ids: '" + p + "' is not a token id in [0, " + std::to_string(tok->vocab_size()) + ")");
      ids.push_back(int32_t(v));
    }
  }
  const std::string text = tok->decode(ids);
  if (g.json)
    std::printf("%s\n", json_dump(nlohmann::json({{"tokens", ids}, {"text", text}}), 2).c_str());
  else
    std::printf("%s\n", text.c_str());
}

}  // namespace

void add_profile_decode(CLI::App& app, GlobalOptions& g) {
  static DecodeArgs a;
  CLI::App* c = app.add_subcommand("decode", "Token ids -> text (e.g. the ids nl-run generate prints)");
  c->add_option("--tokenizer", a.tokenizer, "llama2.c tokenizer.bin or SentencePiece .model")
      ->required()
      ->check(CLI::ExistingFile);
  c->add_option("--ids", a.ids, "Token ids separated by spaces or commas")->required();
  c->callback([&g] { decode_main(a, g); });
}

}  // namespace nl::cli
