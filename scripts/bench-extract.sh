#!/usr/bin/env bash
# End-to-end extraction throughput against compute-only throughput, same run: SmolLM2-135M
# (bundled GGUF) over the Shakespeare demo corpus on one host. "compute" is the time spent in
# the forward pass (device compute and device→host copies) as measured inside the loop;
# "end to end" is the whole loop (reading, tokenizing, compute, shard writing and upload).
# Usage: scripts/bench-extract.sh [extra siphon extract flags]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
ensure_rust
export SIPHON_PJRT_PLUGIN="$(bash scripts/install-plugin.sh | tail -n 1)"
export TF_CPP_MIN_LOG_LEVEL=2
model="$(bash scripts/setup-model.sh | tail -n 1)"
corpus="$(bash scripts/setup-corpus.sh | tail -n 1)"
cargo build --release --quiet -p siphon
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
"$REPO_ROOT/target/release/siphon" extract --model "$model" --corpus "$corpus" \
    --layers 5,15 --hooks ln_final.hook_normalized --seq-len 256 --batch-size 8 \
    --max-tokens "${BENCH_TOKENS:-65536}" --dtype bf16 --cpu-devices 1 \
    --output "$out" --run bench "$@" >&2
python3 "$REPO_ROOT/scripts/bench/extract_timing.py" "$out/bench/timing"
