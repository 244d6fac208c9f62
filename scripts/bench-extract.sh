#!/usr/bin/env bash
# End-to-end extraction throughput against device-only compute, same run, on one host and the
# CPU plugin: the timing record's end-to-end tokens/s, the programs' own time, and each stage
# of the output path (copy to the host, hand-over, conversion, sealing, upload) with its GB/s.
#   scripts/bench-extract.sh [--model demo|qwen2] [extra siphon extract flags]
# demo: SmolLM2-135M (bundled GGUF) over the Shakespeare demo corpus, batch 8 x 256,
#   blocks 5 and 15 + ln_final.hook_normalized.
# qwen2: Qwen2.5-0.5B's shape with random weights (made by scripts/bench/bench_forward.py in
#   the torch venv of scripts/bench-forward.sh; SIPHON_BENCH_PYTHON overrides that python) and
#   a byte-level tokenizer, batch 4 x 256, blocks 6, 12, 18 + ln_final.hook_normalized.
# Both: bf16 shards to local disk, BENCH_TOKENS (default 65536) tokens. SIPHON_BIN runs another
# siphon binary (an earlier commit's build, for a before/after run) instead of this tree's.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
ensure_rust
which=demo
if [[ "${1:-}" == --model ]]; then
    which="$2"
    shift 2
fi
export SIPHON_PJRT_PLUGIN="$(bash scripts/install-plugin.sh | tail -n 1)"
export TF_CPP_MIN_LOG_LEVEL=2
corpus="$(bash scripts/setup-corpus.sh | tail -n 1)"
siphon="${SIPHON_BIN:-$REPO_ROOT/target/release/siphon}"
[[ -n "${SIPHON_BIN:-}" ]] || cargo build --release --quiet -p siphon
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
case "$which" in
demo)
    model="$(bash scripts/setup-model.sh | tail -n 1)"
    shape=(--layers 5,15 --seq-len 256 --batch-size 8)
    ;;
qwen2)
    python="${SIPHON_BENCH_PYTHON:-}"
    if [[ -z "$python" ]]; then
        ensure_venv torch .siphon-setup-v1 "torch, transformers, gguf, safetensors, numpy" \
            torch transformers gguf accelerate safetensors numpy sentencepiece protobuf
        python="$SIPHON_CACHE/venvs/torch/bin/python"
    fi
    model="$SIPHON_CACHE/bench/qwen2-extract"
    "$python" - "$model" <<'PY'
import sys
sys.path.insert(0, "scripts/bench")
import bench_forward
bench_forward.make_model(sys.argv[1], "qwen2", 4, 256)
PY
    cp fixtures/data/tokenizer.json "$model/"
    shape=(--layers 6,12,18 --seq-len 256 --batch-size 4)
    ;;
*) log "--model demo or qwen2, not $which"; exit 2 ;;
esac
"$siphon" extract --model "$model" --corpus "$corpus" "${shape[@]}" \
    --hooks ln_final.hook_normalized --max-tokens "${BENCH_TOKENS:-65536}" --dtype bf16 --cpu-devices 1 \
    --output "$out" --run bench "$@" >&2
python3 "$REPO_ROOT/scripts/bench/extract_timing.py" "$out/bench/timing"
