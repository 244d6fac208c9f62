#!/usr/bin/env bash
# Weights kept stored on the device (issue 23): the demo model (SmolLM2-135M-Instruct, Q4_1
# GGUF) with its weights kept as Q4_1/Q8_0 blocks and dequantized inside the forward, against
# dequantized to f32 on load; device weight bytes, and tokens/s of interleaved rounds in one
# process on one CPU device; medians. Not a test: results go to docs/BENCHMARKS.md.
#   scripts/bench-stored.sh [--batch B] [--seq S] [--rounds N]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/lib.sh"
root="$REPO_ROOT"
ensure_rust
export SIPHON_PJRT_PLUGIN="${SIPHON_PJRT_PLUGIN:-$("$root/scripts/install-plugin.sh" | tail -n1)}"
gguf="$("$root/scripts/setup-model.sh" | tail -n1)"
(cd "$root" && cargo build --release -p siphon-engine --example bench_stored >&2)
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
"$root/target/release/examples/bench_stored" "$gguf" "$@"
