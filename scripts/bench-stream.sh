#!/usr/bin/env bash
# A live stream's consumer-side tokens/s against the same extraction to local disk, interleaved
# (BENCH_ROUNDS rounds, default 2), and the producer's memory while its consumer pauses:
# SmolLM2-135M (bundled GGUF) over the Shakespeare demo corpus, batch 8 x 256, blocks 5 and 15
# + ln_final.hook_normalized, bf16, BENCH_TOKENS (default 65536) tokens, one host, the CPU
# plugin. The consumer is siphon.stream in a venv with numpy, ml_dtypes, grpcio and protobuf
# (SIPHON_BENCH_PYTHON overrides it).
#   scripts/bench-stream.sh [extra siphon extract flags]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
ensure_rust
export SIPHON_PJRT_PLUGIN="$(bash scripts/install-plugin.sh | tail -n 1)"
export TF_CPP_MIN_LOG_LEVEL=2
corpus="$(bash scripts/setup-corpus.sh | tail -n 1)"
model="$(bash scripts/setup-model.sh | tail -n 1)"
python="${SIPHON_BENCH_PYTHON:-}"
if [[ -z "$python" ]]; then
    ensure_venv stream .siphon-setup-v1 "numpy, ml_dtypes, grpc, google.protobuf" numpy ml_dtypes grpcio protobuf
    python="$SIPHON_CACHE/venvs/stream/bin/python"
fi
cargo build --release --quiet -p siphon
"$python" scripts/bench/stream_vs_disk.py "$REPO_ROOT/target/release/siphon" "${BENCH_ROUNDS:-2}" -- \
    --model "$model" --corpus "$corpus" --layers 5,15 --hooks ln_final.hook_normalized --seq-len 256 \
    --batch-size 8 --max-tokens "${BENCH_TOKENS:-65536}" --dtype bf16 --cpu-devices 1 "$@"
