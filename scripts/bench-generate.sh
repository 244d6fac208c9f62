#!/usr/bin/env bash
# siphon's greedy decoding (`siphon generate`, 32 slots) against HF transformers' `generate`
# (batch 32, left-padded) on the same 32 prompts of the demo corpus, 128 new tokens each, the
# demo model (SmolLM2-135M-Instruct, its GGUF dequantized once into an HF f32 directory both
# read), BENCH_ROUNDS rounds (default 2) of siphon then HF (scripts/bench/generate_vs_hf.py);
# medians of new tokens/s in a markdown table (issue 69).
#   scripts/bench-generate.sh [extra siphon generate flags]
# SIPHON_BIN=... uses that binary instead of building release.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
ensure_rust
export SIPHON_PJRT_PLUGIN="$(bash scripts/install-plugin.sh | tail -n 1)"
export TF_CPP_MIN_LOG_LEVEL=2
corpus="$(bash scripts/setup-corpus.sh | tail -n 1)"
gguf="$(bash scripts/setup-model.sh | tail -n 1)"
bench_hf_prepare "$gguf"
model="$hf_model"
siphon="${SIPHON_BIN:-}"
if [[ -z "$siphon" ]]; then
    cargo build --release --quiet -p siphon --bin siphon
    siphon="$REPO_ROOT/target/release/siphon"
fi
"$python" scripts/bench/generate_vs_hf.py bench --siphon "$siphon" --model "$model" --corpus "$corpus" \
    --rounds "${BENCH_ROUNDS:-2}" -- "$@"
