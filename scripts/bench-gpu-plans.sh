#!/usr/bin/env bash
# The GPU plans users ask for before renting, compiled by XLA's CUDA plugin on this machine, no
# GPU needed (`siphon plan --target gpu:GPUS --json`): one markdown table row per plan for
# docs/BENCHMARKS.md — the compiler's per-GPU bytes beside the planner's, whether it fits a
# GPU's share, each block's attention as compiled, the grouped expert products, compile time;
# then JAX's own attention (jax.nn.dot_product_attention, cuDNN's and XLA's implementations)
# compiled for the same H100 at Llama-3-8B's attention shape, the reference for the
# temporaries. A plan refused is a row with siphon's message.
#
# Installs the CUDA compiler (scripts/setup-cuda-compiler.sh) and builds siphon in release
# unless SIPHON_BIN names a binary; JAX (jax, jaxlib, jax-cuda12-pjrt and jax-cuda12-plugin
# 0.12.0.1: the same plugin, compiling with the cuDNN and ptxas of siphon's set-up) in its own venv, with Python 3.12 or later (SIPHON_JAX_PYTHON, default python3.12).
# Compiles run one after another; DeepSeek-V3 takes minutes.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
ensure_rust
export SIPHON_PJRT_PLUGIN="$(bash scripts/setup-cuda-compiler.sh | tail -n 1)"
if [[ -z "${SIPHON_BIN:-}" ]]; then
    cargo build --release --quiet -p siphon --bin siphon
    SIPHON_BIN="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/siphon"
fi
bench_workdir

every_hook_but_scores='blocks.{0..7}.hook_resid_pre,blocks.{0..7}.ln1.hook_normalized,blocks.{0..7}.attn.hook_q,'
every_hook_but_scores+='blocks.{0..7}.attn.hook_k,blocks.{0..7}.attn.hook_v,blocks.{0..7}.attn.hook_z,'
every_hook_but_scores+='blocks.{0..7}.hook_attn_out,blocks.{0..7}.hook_resid_mid,blocks.{0..7}.ln2.hook_normalized,'
every_hook_but_scores+='blocks.{0..7}.mlp.hook_pre,blocks.{0..7}.mlp.hook_post,blocks.{0..7}.hook_mlp_out,'
every_hook_but_scores+='blocks.{0..7}.hook_resid_post'
llama8=(--config fixtures/configs/llama-3-8b.json --hooks 'blocks.{0..7}.hook_resid_post' --batch 32 --seq 1024)
llama8all=(--config fixtures/configs/llama-3-8b.json --hooks "$every_hook_but_scores" --batch 32 --seq 1024)
qwen3moe=(--config fixtures/configs/qwen3-30b-a3b.json --hooks blocks.24.hook_resid_post --batch 32 --seq 1024)
qwen=(--config fixtures/configs/qwen2.5-7b.json --hooks 'blocks.{20..27}.hook_resid_post' --batch 64 --seq 1024)
llama70=(--config fixtures/configs/llama-3.1-70b.json --hooks 'blocks.{40..79}.hook_resid_post' --batch 16 --seq 1024)
deepseek=(--config fixtures/configs/deepseek-v3.json --weights stored --hooks 'blocks.{30..60}.hook_resid_post'
    --batch 16 --seq 1024)
# name|target|array of model flags|other flags
plans=(
    "Llama-3-8B, resid_post of 8 layers|h100|llama8|"
    "Llama-3-8B, resid_post of 8 layers|h100|llama8|--pad left"
    "Llama-3-8B, every hook of 8 layers but scores and pattern|h100|llama8all|"
    "Llama-3-8B, every hook of 8 layers but scores and pattern|h100|llama8all|--pad left"
    "Qwen3-30B-A3B, layer 24|h100x8|qwen3moe|"
    "Qwen2.5-7B (the seeds' job)|h200x8|qwen|"
    "Llama-3.1-70B|h100x8|llama70|"
    "DeepSeek-V3 (FP8 kept)|h200x8|deepseek|--hosts 2 ${SIPHON_DEEPSEEK_MESH:---mesh 3d --data 1 --fsdp 2 --model-parallel 8}"
)
i=0
for plan in "${plans[@]}"; do
    IFS='|' read -r name target flags other <<< "$plan"
    declare -n model="$flags"
    log "$name on $target $other"
    # shellcheck disable=SC2086 # the other flags are words
    if "$SIPHON_BIN" plan --target "gpu:$target" "${model[@]}" $other --json > "$work/$i.json" 2> "$work/$i.err"; then
        :
    fi
    printf '%s\n%s\n%s\n' "$name" "$target" "$other" > "$work/$i.row"
    unset -n model
    i=$((i + 1))
done

# JAX 0.12 needs Python 3.12 or later: SIPHON_JAX_PYTHON names one (default python3.12).
jax_python="${SIPHON_JAX_PYTHON:-python3.12}"
log "JAX's own attention for the same H100 (its venv: jax, jaxlib, jax-cuda12-pjrt 0.12.0.1)"
# JAX's plugin compiles with the cuDNN, ptxas and libdevice siphon's set-up installed.
cuda_root="$(cd "$(dirname "$SIPHON_PJRT_PLUGIN")/../.." && pwd)"
if ! (
    PYTHON="$jax_python" ensure_venv jax-cuda jax-cuda-0.12.0.1-2 "jax, jax_plugins.xla_cuda12, jax_cuda12_plugin" \
        jax==0.12.0.1 jaxlib==0.12.0.1 jax-cuda12-pjrt==0.12.0.1 jax-cuda12-plugin==0.12.0.1 &&
        XLA_FLAGS="--xla_gpu_cuda_data_dir=$cuda_root/nvidia/cuda_nvcc" LD_LIBRARY_PATH="$cuda_root/nvidia/cudnn/lib" \
            "$SIPHON_CACHE/venvs/jax-cuda/bin/python" scripts/bench/jax_gpu_attention.py > "$work/jax.json" 2> "$work/jax.err"
); then
    log "JAX's reference failed (JAX 0.12 needs Python 3.12 or later: SIPHON_JAX_PYTHON names one)"
    tail -n 5 "$work/jax.err" >&2 2>/dev/null || true
fi

"${PYTHON:-python3}" - "$work" <<'PY'
import glob, json, os, sys
work = sys.argv[1]
gib = lambda b: f"{b / 2**30:.2f}"
print("| plan | GPUs | mesh | attention as compiled | experts | arguments: compiler / planner (GiB) | outputs | temporaries | total of a GPU's share | compile |")
print("|---|---|---|---|---|---|---|---|---|---|")
rows = sorted(glob.glob(os.path.join(work, "*.row")), key=lambda p: int(os.path.basename(p).split(".")[0]))
for row in rows:
    n = row[:-4]
    name, target, other = (open(row).read().splitlines() + [""])[:3]
    label = f"{name}{' `' + other + '`' if other else ''}"
    text = open(n + ".json").read()
    if not text.strip():
        err = [l for l in open(n + ".err").read().splitlines() if l.startswith("error:")]
        print(f"| {label} | {target} | refused: {err[-1][7:] if err else 'failed'} ||||||||")
        continue
    r = json.loads(text)
    c, p = r["compiled"], r["planner"]
    blocks = r.get("attention") or []
    fused = [b for b in blocks if b["form"] == "cudnn"]
    kept = sum(b["compiled_fused_calls"] == 1 for b in fused)
    if fused:
        attention = f"cuDNN fused in {kept} of {len(blocks)} blocks"
    else:
        reasons = sorted({b.get("reason", "") for b in blocks})
        attention = f"XLA's ({'; '.join(reasons)})"
    experts = f"{r['grouped_calls']} grouped products" if r.get("grouped_calls") else "—"
    spans = " spans hosts" if r["plan"]["spans_hosts"] else ""
    print(
        f"| {label} | {r['hosts']} × {r['devices_per_host']} {target.split('x')[0].upper()} | {r['mesh']}{spans} "
        f"| {attention} | {experts} "
        f"| {gib(c['argument_size_in_bytes'])} / {gib(p['argument_bytes'])} "
        f"| {gib(c['output_size_in_bytes'])} / {gib(p['output_bytes'])} "
        f"| {gib(c['temp_size_in_bytes'])} / {gib(p['temp_bytes'])} "
        f"| {gib(c['total_bytes'])} of {gib(r['usable_bytes'])}{'' if r['fits'] else ' DOES NOT FIT'} "
        f"| {r['compile_seconds']:.1f} s |"
    )
print()
try:
    jax = json.load(open(os.path.join(work, "jax.json")))
except (OSError, ValueError):
    jax = None
if jax:
    print(f"JAX {jax['jax']} on the same plugin, `jax.nn.dot_product_attention(q, k, v, is_causal=True)` alone, "
          f"q {jax['q']}, k and v {jax['kv']} (bf16), compiled for the {jax['device']}:")
    print()
    print("| implementation | temporaries (GiB) | cuDNN's call in the compiled program | compile |")
    print("|---|---|---|---|")
    for impl in jax["implementations"]:
        print(f"| {impl['name']} | {gib(impl['temp_size_in_bytes'])} | {impl['fused_calls']} | {impl['compile_seconds']:.1f} s |")
PY
