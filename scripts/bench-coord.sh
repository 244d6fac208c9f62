#!/usr/bin/env bash
# Control-plane benchmark: barrier p50/p99 for 2, 8 and 32 processes on 127.0.0.1 and the
# key-value broadcast latency, as a Markdown table (docs/BENCHMARKS.md, "Control plane").
# Builds only the coord crate's worker binary in release (the same check `siphon cluster
# bench` runs, without building the whole CLI). Extra arguments go to the worker, e.g.
#   scripts/bench-coord.sh --processes 2,8,32 --rounds 2000
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p siphon-coord --bin siphon-coord-worker
exec target/release/siphon-coord-worker bench --rounds 1000 --processes 2,8,32 "$@"
