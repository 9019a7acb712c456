// nl-layout: offline layout work. Subcommands are registered here; each lives in cli/layout_<name>.cpp.
#include <cstdlib>  // defines __GLIBC__ on glibc
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "cli/commands.h"
#include "cli/common.h"

int main(int argc, char** argv) {
#if defined(__GLIBC__)
  // Per-layer buffers of hundreds of MiB (the layer's mask, its pair-count matrix) come and go once per layer.
  // glibc would mmap and munmap each one, so every layer page-faults (and the kernel zeroes) them afresh: about
  // 12 % of a 32-layer solve's CPU time went to that. Keeping big blocks in the heap lets the next layer reuse
  // them; peak memory is unchanged (those buffers were live at the peak anyway). No trimming at all (-1, mallopt(3)):
  // with a 1 GiB threshold, freeing one OPT-6.7B layer's buffers still crossed it, and the next layer faulted them in
  // again (4 layers of the OPT-6.7B shape, 2 threads: 15.25 s wall, 4.49 s sys; untrimmed 12.7 s, 0.6 s sys).
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);
#endif
  return nl::cli::run_main("nl-layout", "Neuralink layout: co-activation graphs, neuron orders, evaluation, packing",
                           argc, argv, [](CLI::App& app) {
                             static nl::cli::GlobalOptions g;
                             nl::cli::add_global_options(app, g);
                             nl::cli::add_layout_graph(app, g);
                             nl::cli::add_layout_graph_merge(app, g);
                             nl::cli::add_layout_solve(app, g);
                             nl::cli::add_layout_eval(app, g);
                             nl::cli::add_layout_report(app, g);
                             nl::cli::add_layout_pack(app, g);
                           });
}
