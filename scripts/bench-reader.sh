#!/usr/bin/env bash
# Shuffled batches from local disk: siphon's Python reader against SAELens's cached-activation
# loader on the same activations (scripts/bench/bench_reader.py: interleaved rounds, medians).
# Extracts SmolLM2-135M's blocks.1.hook_resid_post (f32) over the Shakespeare demo corpus once
# (only two blocks are computed), exports it as SAELens's cache, both cached under
# $SIPHON_CACHE/bench/reader. Usage: scripts/bench-reader.sh [--rounds N] [--batch N]
# Environment: BENCH_TOKENS (default 262144 tokens ≈ 0.6 GB of f32 activations).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
ensure_rust
export SIPHON_PJRT_PLUGIN="$(bash scripts/install-plugin.sh | tail -n 1)"
export TF_CPP_MIN_LOG_LEVEL=2
model="$(bash scripts/setup-model.sh | tail -n 1)"
corpus="$(bash scripts/setup-corpus.sh | tail -n 1)"
python="$(bash scripts/setup-python-train.sh | tail -n 1)"
target="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
cargo build --release --quiet -p siphon
tokens="${BENCH_TOKENS:-262144}"
hook=blocks.1.hook_resid_post
ctx=128
dir="$SIPHON_CACHE/bench/reader/smollm2-$tokens"
if [[ ! -f "$dir/extracted" ]]; then
    rm -rf "$dir"
    log "extracting $tokens tokens of $hook into $dir"
    "$target/release/siphon" extract --model "$model" --corpus "$corpus" --hooks "$hook" \
        --seq-len "$ctx" --batch-size 16 --max-tokens "$tokens" --dtype f32 --cpu-devices 1 \
        --output "$dir" --run run >&2
    touch "$dir/extracted"
fi
if [[ ! -f "$dir/exported" ]]; then
    rm -rf "$dir/saelens"
    log "exporting as SAELens's cache"
    PYTHONPATH="$REPO_ROOT/python" "$python" -m siphon export-saelens "$dir/run" "$dir/saelens" \
        --hooks "$hook" --context-size "$ctx" >&2
    touch "$dir/exported"
fi
PYTHONPATH="$REPO_ROOT/python" "$python" scripts/bench/bench_reader.py "$dir/run" "$dir/saelens" \
    --hook "$hook" --context-size "$ctx" "$@"
