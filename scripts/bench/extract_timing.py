"""Prints each host's end-to-end and compute-only tokens/s from a `siphon extract` run's
timing records: `python3 scripts/bench/extract_timing.py OUTPUT/RUN/timing`."""

import json
import pathlib
import sys

for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    t = json.loads(f.read_text())
    e2e, comp = t["tokens"] / t["seconds"], t["tokens"] / t["compute_seconds"]
    print(f"{t['host']}: {t['tokens']} tokens, end to end {e2e:.0f} tok/s, compute only {comp:.0f} tok/s, "
          f"ratio {100 * e2e / comp:.1f}%")
