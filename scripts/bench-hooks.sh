#!/usr/bin/env bash
# Hook cost benchmark (issue 11): every hook of one layer (`blocks.L.*`) against that layer's
# hook_resid_post alone, on SmolLM2-135M (the demo GGUF), one CPU device, interleaved rounds in
# one process; medians. Not a test: results go to docs/BENCHMARKS.md.
#   scripts/bench-hooks.sh [--layer L] [--batch B] [--seq S] [--rounds N]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/lib.sh"
root="$REPO_ROOT"
ensure_rust
export SIPHON_PJRT_PLUGIN="${SIPHON_PJRT_PLUGIN:-$("$root/scripts/install-plugin.sh" | tail -n1)}"
gguf="$("$root/scripts/setup-model.sh" | tail -n1)"
(cd "$root" && cargo build --release -p siphon-engine --example bench_hooks >&2)
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
"$root/target/release/examples/bench_hooks" "$gguf" "$@"
