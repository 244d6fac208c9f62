#!/usr/bin/env bash
# What the fp8 stored dtype costs in accuracy on the demo model (SmolLM2-135M, bundled GGUF,
# Shakespeare demo corpus, batch 8 x 256, blocks 5 and 15 + ln_final.hook_normalized): the same
# BENCH_TOKENS (default 65536) tokens extracted as f32, bf16 and fp8 on the CPU plugin, the
# per-token error of each against the others and the shard bytes, and a TopK SAE trained with
# SAELens on blocks.15.hook_resid_post from the bf16 run and from the fp8 run (same seed and
# data order; plus a second bf16 seed), each one's FVU on the held-out last ~10% of every run.
#   scripts/bench-fp8.sh [extra scripts/bench/fp8_error.py flags, e.g. --json out.json --no-sae]
# Markdown tables on stdout, the figures as JSON in out/fp8_error.json (--json). About 20 minutes on
# 2 cores: 3 extractions of ~3-5 minutes, 3 SAEs of ~2 minutes.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
ensure_rust
export SIPHON_PJRT_PLUGIN="$(bash scripts/install-plugin.sh | tail -n 1)"
export TF_CPP_MIN_LOG_LEVEL=2
corpus="$(bash scripts/setup-corpus.sh | tail -n 1)"
model="$(bash scripts/setup-model.sh | tail -n 1)"
python="$(bash scripts/setup-python-train.sh | tail -n 1)"
cargo build --release --quiet -p siphon
PYTHONPATH="$REPO_ROOT/python${PYTHONPATH:+:$PYTHONPATH}" "$python" scripts/bench/fp8_error.py \
    --siphon "$REPO_ROOT/target/release/siphon" --model "$model" --corpus "$corpus" \
    --tokens "${BENCH_TOKENS:-65536}" "$@"
