// nl-run probe: measure this machine's disk and write a device profile (configs/devices schema).
#include <cstdio>

#include "cli/commands.h"
#include "formats/core/atomic_file.h"
#include "runtime/io/probe.h"

namespace nl::cli {
namespace {

struct ProbeArgs {
  ProbeOptions probe;
  std::string out;
  std::string name = "probed";
  uint64_t file_mib = 1024;
};

void add_probe_target_options(CLI::App* c, ProbeArgs& a) {
  c->add_option("--file", a.probe.file,
                "Probe file on the disk to measure: created (must not exist) and removed afterwards")
      ->required()
      ->group("Target");
  c->add_flag("--read-only", a.probe.read_only,
              "Measure the existing regular file --file by reading it only (a model file, at least 64 MiB)")
      ->group("Target");
  c->add_option("--file-mib", a.file_mib, "Size of the probe file when it is created, MiB")
      ->check(CLI::Range(64, 1 << 20))
      ->group("Target");
}

void add_probe_measure_options(CLI::App* c, ProbeArgs& a) {
  c->add_option("--queue-depth", a.probe.queue_depth, "Reads in flight for the parallel fit")
      ->check(CLI::Range(2, 256))
      ->group("Measurement");
  c->add_option("--seconds-per-point", a.probe.seconds_per_point, "Time budget per (size, depth) point")
      ->check(CLI::Range(0.01, 60.0))
      ->group("Measurement");
  c->add_option("--seed", a.probe.seed, "Seed for the random offsets")->group("Measurement");
}

void add_probe_output_options(CLI::App* c, ProbeArgs& a) {
  c->add_option("--out", a.out, "Write the fitted device profile here (JSON)")->group("Output");
  c->add_option("--name", a.name, "Name recorded in the profile")->group("Output");
}

void probe_main(const ProbeArgs& a_in, const GlobalOptions& g) {
  apply_global_options(g);
  ProbeArgs a = a_in;
  a.probe.file_bytes = a.file_mib << 20;
  check_paths({{"--file", a.probe.read_only ? a.probe.file : ""}},
              {{"--out", a.out}, {"--file", a.probe.read_only ? "" : a.probe.file}});
  ProbeResult r = probe_run(a.probe, [&](const std::string& s) { info(g, s); });
  r.model.name = a.name;
  std::string js = r.model.to_json();
  if (!a.out.empty()) write_file_atomic(a.out, js);
  if (g.json) {
    std::fputs(js.c_str(), stdout);
  } else {
    std::printf("one read in flight:   a = %.1f us, B = %.0f MB/s\n", r.model.qd1.read_latency_us,
                r.model.qd1.bandwidth_MBps);
    std::printf("%u reads in flight (%s): a = %.2f us per read (amortised), B = %.0f MB/s\n", r.model.queue_depth,
                r.engine.c_str(), r.model.cost.read_latency_us, r.model.cost.bandwidth_MBps);
    std::printf("break-even gap: %.0f bytes at depth %u, %.0f bytes at depth 1\n", r.model.cost.break_even_bytes(),
                r.model.queue_depth, r.model.qd1.break_even_bytes());
    if (!r.direct) std::printf("warning: O_DIRECT was refused; these are buffered reads\n");
    if (!a.out.empty()) std::printf("wrote %s\n", a.out.c_str());
  }
}

}  // namespace

void add_run_probe(CLI::App& app, GlobalOptions& g) {
  static ProbeArgs a;
  CLI::App* c = app.add_subcommand("probe", "Measure the disk with O_DIRECT reads and fit t(s) = a + s/B");
  add_probe_target_options(c, a);
  add_probe_measure_options(c, a);
  add_probe_output_options(c, a);
  c->callback([&g] { probe_main(a, g); });
}

}  // namespace nl::cli
