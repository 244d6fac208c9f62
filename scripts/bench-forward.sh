#!/usr/bin/env bash
# Forward benchmark (issue 3 item 7): Qwen2.5-0.5B shape with random weights, batch 4 x seq
# 256, f32, 2 threads; siphon (Rust + PJRT CPU plugin) interleaved with HF transformers on
# the same weights and input; medians. Not a test: results go to docs/BENCHMARKS.md.
#   scripts/bench-forward.sh [--family qwen2|gemma2|gemma4|gpt2|qwen3_moe|gpt_oss|qwen3_5] [--rounds N] [--batch B] [--seq S] [--hooks all|last]
# Needs the torch venv ($SIPHON_CACHE/venvs/torch, created here if missing) and ~6 GB RAM.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/lib.sh"
root="$REPO_ROOT"
cache="$SIPHON_CACHE"
venv="$SIPHON_CACHE/venvs/torch"
# The same venv as scripts/gen-fixtures.sh.
ensure_venv torch .siphon-setup-v1 "torch, transformers, gguf, safetensors, numpy" \
    torch transformers gguf accelerate safetensors numpy sentencepiece protobuf

export SIPHON_PJRT_PLUGIN="${SIPHON_PJRT_PLUGIN:-$("$root/scripts/install-plugin.sh" | tail -n1)}"
(cd "$root" && cargo build --release -p siphon-models --example bench_forward >&2)
family=qwen2
prev=""
for arg in "$@"; do [[ "$prev" == --family ]] && family="$arg"; prev="$arg"; done
"$venv/bin/python" "$here/bench/bench_forward.py" \
    --bench-bin "$root/target/release/examples/bench_forward" \
    --dir "$cache/bench/$family-random" "$@"
