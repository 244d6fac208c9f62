#!/usr/bin/env bash
# The standing GPU checklist (docs/BENCHMARKS.md, "On a GPU") as one script for a lent GPU
# machine, which has python3 with torch, transformers and the CUDA PJRT plugin
# (jax-cuda13-pjrt) but no Rust toolchain: build the binaries here first, then run this there.
#
#   scripts/bench-gpu.sh --prepare     # here: release binaries, stripped and xz'd into .gpu/
#   scripts/bench-gpu.sh [STEP...]     # there: compile doctor fixtures qwen2 gemma2 extract host llama (default: all)
#                                      #   compile (first, always): `siphon plan --target gpu:…` for this very
#                                      #   device, compiled deviceless from the plugin's own description of it
#                                      #   (Llama-3-8B with cuDNN's attention, Qwen3-30B-A3B with the grouped
#                                      #   products): compile errors in seconds, before any run
#                                      #   also: long (Llama-3-8B shape, 4 x 8192), moe (Qwen3-30B-A3B's
#                                      #   shape, 2 layers; GPT-OSS-20B's): the checklist's items 4 and 5
#                                      #   kernels: issue 46's GPU steps in one go: fixtures (f32 goldens in
#                                      #   XLA's form; bf16 right-padded goldens with cuDNN's attention against
#                                      #   XLA's bf16; mixtures on cuBLAS's grouped products), attention (cuDNN's
#                                      #   call alone against torch SDPA), long with cuDNN's attention, moe
#                                      #   (≤ ~8 min); long-xla, llama-xla and moe-xla run those shapes in
#                                      #   XLA's form, to compare
#                                      #   host: the shard writer alone on the host's cores (1, 2, 8, 16
#                                      #   sealing threads) into a discarding store and local disk
#
# bench_forward reports each run's device time and to-host time (bf16 out of a bf16 program,
# into reused host buffers, pinned where the plugin allows: `pinned=` on its ready line).
# Each step has its own time limit and writes its log to $OUT (or /tmp/gpu-out); a step that
# fails or runs out of time does not stop the next. Not a test: figures go to
# docs/BENCHMARKS.md with the device and date.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if [[ "${1:-}" == --prepare ]]; then
    set -e
    cargo build --release -p siphon --bin siphon -p siphon-models --example bench_forward --example bench_attention \
        -p siphon-store --bin siphon-store-bench
    test_bin=$(cargo test --release -p siphon-engine --test fixtures --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "fixtures" and m.get("executable"):
        print(m["executable"])')
    mkdir -p .gpu
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >> .git/info/exclude
    strip -o .gpu/siphon target/release/siphon
    strip -o .gpu/bench_forward target/release/examples/bench_forward
    strip -o .gpu/bench_attention target/release/examples/bench_attention
    strip -o .gpu/fixtures "$test_bin"
    strip -o .gpu/siphon-store-bench target/release/siphon-store-bench
    (cd .gpu && xz -T0 -6 -f siphon bench_forward bench_attention fixtures siphon-store-bench)
    ls -la .gpu
    exit 0
fi

out="${OUT:-/tmp/gpu-out}"
mkdir -p "$out"
note() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.txt"; }
for f in .gpu/*.xz; do xz -dkf "$f"; done
chmod +x .gpu/siphon .gpu/bench_forward .gpu/bench_attention .gpu/fixtures .gpu/siphon-store-bench
plugin=$(python3 -c 'import os, jax_plugins.xla_cuda13 as p; print(os.path.join(os.path.dirname(p.__file__), "xla_cuda_plugin.so"))')
export SIPHON_PJRT_PLUGIN="$plugin" TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$out/summary.txt"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' |
    tee -a "$out/summary.txt"
# The fixtures test binary finds fixtures/ through the path it was built at.
built_at=/work/main
[[ -e "$built_at/fixtures" ]] || { mkdir -p "$(dirname "$built_at")" && ln -sfn "$root" "$built_at"; }

bench() { # LIMIT NAME bench_forward.py flags...
    local limit=$1 name=$2
    shift 2
    note "bench $name: $*"
    SIPHON_BENCH_MEMORY_FRACTION=0.45 timeout "$limit" python3 scripts/bench/bench_forward.py \
        --bench-bin .gpu/bench_forward --device cuda --dtype bf16 --batch 32 --seq 1024 --hooks last \
        --rounds 5 --threads 16 --dir "/tmp/gpu-bench/$name" "$@" > "$out/bench-$name.txt" 2>&1
    note "bench $name rc=$?: $(tail -n 1 "$out/bench-$name.txt")"
}

steps=("$@")
[[ ${#steps[@]} -gt 0 ]] || steps=(doctor fixtures qwen2 gemma2 extract host llama)
# kernels: the steps issue 46 needs on its first device, in order. The deviceless compile for
# this device comes first whatever the steps.
expanded=(compile)
for step in "${steps[@]}"; do
    if [[ $step == kernels ]]; then
        expanded+=(fixtures attention long moe)
    elif [[ $step != compile ]]; then
        expanded+=("$step")
    fi
done
steps=("${expanded[@]}")
for step in "${steps[@]}"; do
    case "$step" in
    compile)
        # The program extract would run, compiled for this device's own description (no run).
        name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
        case "$name" in
        *H100*PCIe*) target=h100-pcie ;;
        *H100*) target=h100 ;;
        *H200*) target=h200 ;;
        *A100*40GB*) target=a100-40 ;;
        *A100*) target=a100-80 ;;
        *B200*) target=b200 ;;
        *) target="" ;;
        esac
        if [[ -z $target ]]; then
            note "compile skipped: siphon has no gpu: target for $name"
        else
            for plan in "llama-3-8b.json|blocks.{0..7}.hook_resid_post" "qwen3-30b-a3b.json|blocks.1.hook_resid_post"; do
                IFS='|' read -r config hooks <<< "$plan"
                timeout 120 .gpu/siphon plan --target "gpu:$target" --plugin "$plugin" --config "fixtures/configs/$config" \
                    --hooks "$hooks" --batch 32 --seq 1024 > "$out/compile-${config%.json}.txt" 2>&1
                note "compile $config for gpu:$target rc=$?: $(grep -E '^attention|^experts|total' "$out/compile-${config%.json}.txt" | tr '\n' ' ')"
            done
        fi
        ;;
    doctor)
        timeout 45 .gpu/siphon doctor > "$out/doctor.txt" 2>&1
        note "doctor rc=$?"
        ;;
    fixtures)
        # Every single-device golden (HF transformers f32 on a CPU, committed) on the GPU, and
        # the bf16 test; the 2x4 mesh tests need 8 devices.
        timeout 120 .gpu/fixtures --test-threads=1 --skip mesh --skip smollm2 > "$out/fixtures.txt" 2>&1
        note "fixtures rc=$?: $(grep -E '^test result|FAILED' "$out/fixtures.txt" | tr '\n' ' ')"
        ;;
    host)
        # The writer alone (bf16, 4 hooks x 4096, 32 x 1024 a batch): core-seconds per GB by stage.
        mkdir -p /tmp/gpu-host-bench
        timeout 150 .gpu/siphon-store-bench host --gb 4 --repeats 2 --threads 1,2,8,16 \
            --store discard,/tmp/gpu-host-bench > "$out/host.txt" 2>&1
        note "host rc=$?"
        tee -a "$out/summary.txt" < "$out/host.txt"
        rm -rf /tmp/gpu-host-bench
        ;;
    qwen2) bench 90 qwen2 --family qwen2 ;;
    gemma2) bench 110 gemma2 --family gemma2 --layers 26 ;;
    llama) bench 110 llama3_8b --family llama3_8b --layers 8 ;;
    long) bench 130 llama3_8b_8k --family llama3_8b --layers 8 --batch 4 --seq 8192 ;;
    llama-xla) SIPHON_BENCH_XLA_ATTENTION=1 bench 110 llama3_8b_xla --family llama3_8b --layers 8 ;;
    long-xla) SIPHON_BENCH_XLA_ATTENTION=1 bench 150 llama3_8b_8k_xla --family llama3_8b --layers 8 --batch 4 --seq 8192 ;;
    attention)
        # cuDNN's call alone against torch SDPA, Llama-3-8B's widths, 32 x 1024 then 4 x 8192.
        for shape in "32 1024" "4 8192"; do
            read -r batch seq <<< "$shape"
            timeout 35 python3 scripts/bench/bench_attention.py --bench-bin .gpu/bench_attention \
                --batch "$batch" --seq "$seq" > "$out/attention-$seq.txt" 2>&1
            note "attention $batch x $seq rc=$?"
            tail -n 5 "$out/attention-$seq.txt" | tee -a "$out/summary.txt"
        done
        ;;
    moe)
        # The experts on cuBLAS's grouped products (siphon-kernels' CUDA handler).
        bench 90 qwen3_moe --family qwen3_moe --layers 2
        bench 90 gpt_oss --family gpt_oss --layers 2
        ;;
    moe-xla)
        SIPHON_CUDA_KERNELS=0 bench 120 qwen3_moe_xla --family qwen3_moe --layers 2
        SIPHON_CUDA_KERNELS=0 bench 120 gpt_oss_xla --family gpt_oss --layers 2
        ;;
    extract)
        # End to end on the qwen2 bench model (random weights) with a byte-level tokenizer.
        model=/tmp/gpu-bench/qwen2-bf16
        if [[ -f $model/model.safetensors ]]; then
            cp fixtures/data/tokenizer.json "$model/"
            python3 - /tmp/gpu-corpus.jsonl <<'PY'
import json, random, sys
words = open("README.md").read().split()
rng = random.Random(0)
with open(sys.argv[1], "w") as f:
    for _ in range(3000):
        f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(400))}) + "\n")
PY
            # 4 hooks to local disk, bf16 then fp8 (stored dtype quantized on the device); each
            # prints end to end ÷ device-only compute and the GB/s of every stage.
            for dtype in bf16 fp8; do
                rm -rf /tmp/gpu-extract
                timeout 60 .gpu/siphon extract --model "$model" --corpus /tmp/gpu-corpus.jsonl --seq-len 1024 \
                    --batch-size 32 --max-tokens 1048576 --compute-dtype bf16 --dtype $dtype --layers 6,12,18 \
                    --hooks ln_final.hook_normalized --output /tmp/gpu-extract --run e2e \
                    --log-format plain > "$out/extract-$dtype.txt" 2>&1
                note "extract $dtype rc=$?: $(grep -o 'host buffers ready.*' "$out/extract-$dtype.txt")"
                python3 scripts/bench/extract_timing.py /tmp/gpu-extract/e2e/timing 2>&1 | tee -a "$out/summary.txt"
            done
        else
            note "extract skipped: no qwen2 bench model"
        fi
        ;;
    *) note "unknown step $step" ;;
    esac
done
note done
