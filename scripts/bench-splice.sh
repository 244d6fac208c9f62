#!/usr/bin/env bash
# siphon's spliced evaluation of a dictionary (`extract --sae DIR --splice`: CE loss recovered,
# KL) against SAELens's run_evals loop on the same token rows (issue 68): the demo model
# (SmolLM2-135M-Instruct, its GGUF dequantized once into an HF f32 directory both read) with a
# random 16,384-latent TopK SAE (k = 32, saved by SAELens) on blocks.15.hook_resid_post, batch
# 8 x 128, BENCH_TOKENS tokens (default 65536), BENCH_ROUNDS rounds (default 2) of siphon then the
# peer (scripts/bench/splice_vs_saelens.py); medians in a markdown table.
#   scripts/bench-splice.sh [extra siphon extract flags]
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
sae="$hf_sae"
siphon="${SIPHON_BIN:-}"
if [[ -z "$siphon" ]]; then
    cargo build --release --quiet -p siphon --bin siphon
    siphon="$REPO_ROOT/target/release/siphon"
fi
bench_workdir
"$python" scripts/bench/splice_vs_saelens.py bench --siphon "$siphon" --model "$model" --sae "$sae" \
    --corpus "$corpus" --work "$work" --tokens "${BENCH_TOKENS:-65536}" --rounds "${BENCH_ROUNDS:-2}" -- "$@"
