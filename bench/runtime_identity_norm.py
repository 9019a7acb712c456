#!/usr/bin/env python3
"""Prints an nl-run --metrics JSON without the fields that depend on timing or on the run's paths, one
`key.path = value` line per field (sorted), so that two builds' runs compare with diff. Used by
bench/runtime_identity.sh."""
import json
import sys

# Wall-clock figures, memory measured from the process, paths, and the --overlap counters whose values depend on
# when completions arrive (how many bundles were computed while reads were in flight; cross overlap reads ahead only
# as far as the measured attention window allows, so its read-ahead split moves with timing).
DROP_PARTS = ("seconds", "per_second", "_ms", "MBps", "share", "rss", "wall", "baseline_bytes", "fixed_bytes")
DROP_KEYS = {"image", "path", "logits_file", "tokenizer", "in_flight", "bundles_computed_in_flight",
             "batches_read_ahead", "predicted_bundles", "predicted_and_needed_bundles", "prefetch_bytes",
             "prefetch_used_bytes", "pieces_in_place", "pieces_copied", "extra_bytes", "late_bytes", "prefetches",
             "needed_bundles", "batches"}


def walk(v, path, out):
    if isinstance(v, dict):
        for k, x in v.items():
            if k in DROP_KEYS or any(p in k for p in DROP_PARTS):
                continue
            walk(x, f"{path}.{k}" if path else k, out)
    elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
        for i, x in enumerate(v):
            walk(x, f"{path}[{i}]", out)
    elif path == "select" and str(v).startswith("trace:"):
        out.append(f"{path} = \"trace:(the run's trace)\"")
    else:
        out.append(f"{path} = {json.dumps(v)}")


lines = []
walk(json.load(open(sys.argv[1])), "", lines)
print("\n".join(sorted(lines)))
