#!/usr/bin/env bash
# The seeds' own configurations compiled for their TPU slices by libtpu on this machine, no TPU
# needed (`siphon plan --target tpu:SLICE --json`, `siphon bench memory --target`): one markdown
# table row per plan for docs/BENCHMARKS.md, the compiler's per-device bytes beside the
# planner's, compile time, flops per token against the analytic forward, the roofline. A plan
# refused (by the planner, or by libtpu for a chip's memory) is a row with siphon's message.
#
# Installs libtpu (scripts/setup-libtpu.sh) and builds siphon in release unless SIPHON_BIN
# names a binary. Compiles run one after another (libtpu uses the cores itself); the largest,
# DeepSeek-V3 on v5p-128, takes minutes and several GB of memory.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
ensure_rust
export SIPHON_PJRT_PLUGIN="$(bash scripts/setup-libtpu.sh | tail -n 1)"
if [[ -z "${SIPHON_BIN:-}" ]]; then
    cargo build --release --quiet -p siphon --bin siphon
    SIPHON_BIN="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/siphon"
fi
bench_workdir

qwen=(--config fixtures/configs/qwen2.5-7b.json --hooks 'blocks.{20..27}.hook_resid_post' --batch 64 --seq 1024)
llama=(--config fixtures/configs/llama-3.1-70b.json --hooks 'blocks.{40..79}.hook_resid_post' --batch 16 --seq 1024)
deepseek=(--config fixtures/configs/deepseek-v3.json --weights stored --hooks 'blocks.{30..60}.hook_resid_post'
    --batch 16 --seq 1024)
qwen3moe=(--config fixtures/configs/qwen3-30b-a3b.json --hooks blocks.24.hook_resid_post --batch 16 --seq 1024)
qwen3big=(--config fixtures/configs/qwen3-235b-a22b.json --hooks blocks.47.hook_resid_post --batch 16 --seq 1024)
gptoss=(--config fixtures/configs/gpt-oss-120b.json --hooks blocks.18.hook_resid_post --batch 16 --seq 1024)
# name|slice|array of model flags|mesh flags (and --tpu-forms off: the CPU's forms, the
# mixtures' rounds loop and FP8 by table, beside a TPU's own)
plans=(
    "Qwen2.5-7B|v5litepod-64|qwen|--mesh 1d"
    "Qwen2.5-7B|v5litepod-64|qwen|--mesh 3d --data 64 --fsdp 1 --model-parallel 1"
    "Qwen2.5-7B|v5litepod-64|qwen|--mesh 2d"
    "Qwen2.5-7B|v5litepod-64|qwen|--mesh 3d --data 8 --fsdp 2 --model-parallel 4"
    "Llama-3.1-70B|v5litepod-64|llama|--mesh 2d"
    "Llama-3.1-70B|v5litepod-64|llama|--mesh 3d --data 4 --fsdp 4 --model-parallel 4"
    "DeepSeek-V3 (FP8 kept)|v5p-128|deepseek|--mesh 2d"
    "DeepSeek-V3 (FP8 kept)|v5p-128|deepseek|${SIPHON_DEEPSEEK_MESH:---mesh 3d --data 8 --fsdp 2 --model-parallel 4}"
    "DeepSeek-V3 (FP8 kept)|v5p-128|deepseek|${SIPHON_DEEPSEEK_MESH:---mesh 3d --data 8 --fsdp 2 --model-parallel 4} --tpu-forms off"
    "Qwen3-30B-A3B|v5litepod-16|qwen3moe|--mesh 3d --data 4 --fsdp 1 --model-parallel 4"
    "Qwen3-30B-A3B|v5litepod-16|qwen3moe|--mesh 3d --data 4 --fsdp 1 --model-parallel 4 --tpu-forms off"
    "Qwen3-235B-A22B|v5p-128|qwen3big|--mesh 3d --data 8 --fsdp 2 --model-parallel 4"
    "Qwen3-235B-A22B|v5p-128|qwen3big|--mesh 3d --data 8 --fsdp 2 --model-parallel 4 --tpu-forms off"
    "GPT-OSS-120B|v5p-128|gptoss|--mesh 3d --data 8 --fsdp 2 --model-parallel 4"
    "GPT-OSS-120B|v5p-128|gptoss|--mesh 3d --data 8 --fsdp 2 --model-parallel 4 --tpu-forms off"
    "GPT-OSS-120B (MXFP4 kept)|v5p-128|gptoss|--weights stored --mesh 3d --data 8 --fsdp 2 --model-parallel 4"
    "GPT-OSS-120B (MXFP4 kept)|v5p-128|gptoss|--weights stored --mesh 3d --data 8 --fsdp 2 --model-parallel 4 --tpu-forms off"
)
if [[ -n "${SIPHON_TPU_PLANS:-}" ]]; then
    # Only the rows whose name contains this text (e.g. "Qwen3").
    keep=()
    for plan in "${plans[@]}"; do [[ "$plan" == *"$SIPHON_TPU_PLANS"* ]] && keep+=("$plan"); done
    plans=("${keep[@]}")
fi
i=0
for plan in "${plans[@]}"; do
    IFS='|' read -r name slice flags mesh <<< "$plan"
    declare -n model="$flags"
    log "$name on $slice, $mesh"
    # shellcheck disable=SC2086 # the mesh flags are words
    if "$SIPHON_BIN" plan --target "tpu:$slice" "${model[@]}" $mesh --json > "$work/$i.json" 2> "$work/$i.err"; then
        :
    fi
    printf '%s\n%s\n%s\n' "$name" "$slice" "$mesh" > "$work/$i.row"
    unset -n model
    i=$((i + 1))
done
for mesh in "--fsdp 16" "--data 4 --fsdp 4"; do
    log "seed 003's memory bench on v6e-16, $mesh"
    # shellcheck disable=SC2086
    "$SIPHON_BIN" bench memory --target tpu:v6e-16 --target-bytes 6012954624 $mesh --json > "$work/bench-$i.json" \
        || log "the memory bench with $mesh failed: its row is left out"
    i=$((i + 1))
done

# The reference: one mixture layer written in plain JAX (scripts/bench/jax_tpu_mixture.py,
# jax.lax.ragged_dot over each expert's width), compiled by the same libtpu; JAX 0.12 needs
# Python 3.12 or later (SIPHON_JAX_PYTHON, default python3.12), in the venv bench-gpu-plans.sh
# uses.
jax_python="${SIPHON_JAX_PYTHON:-python3.12}"
# name|topology|chips per host|chip config|wrap|data|model|tokens|hidden|width|experts|top-k
layers=(
    "Qwen3-30B-A3B layer|v5e:4x4|2,2,1|default|false,false,false|4|4|16384|2048|768|128|8"
    "Qwen3-235B-A22B layer|v5:4x4x4|2,2,1|megacore|true,true,true|16|4|16384|4096|1536|128|8"
    "DeepSeek-V3 layer (routed experts)|v5:4x4x4|2,2,1|megacore|true,true,true|16|4|16384|7168|2048|256|8"
    "GPT-OSS-120B layer|v5:4x4x4|2,2,1|megacore|true,true,true|16|4|16384|2880|2880|128|4"
)
if PYTHON="$jax_python" ensure_venv jax-cuda jax-cuda-0.12.0.1-2 "jax, jax_plugins.xla_cuda12, jax_cuda12_plugin" \
    jax==0.12.0.1 jaxlib==0.12.0.1 jax-cuda12-pjrt==0.12.0.1 jax-cuda12-plugin==0.12.0.1; then
    for layer in "${layers[@]}"; do
        IFS='|' read -r name topo hosts chip wrap data model tokens hidden width experts topk <<< "$layer"
        log "JAX's $name on $topo"
        TPU_LIBRARY_PATH="$SIPHON_PJRT_PLUGIN" TPU_SKIP_MDS_QUERY=1 JAX_PLATFORMS=cpu \
            "$SIPHON_CACHE/venvs/jax-cuda/bin/python" scripts/bench/jax_tpu_mixture.py --topology "$topo" \
            --hosts "$hosts" --chip-config "$chip" --wrap "$wrap" --data "$data" --model "$model" --tokens "$tokens" \
            --hidden "$hidden" --width "$width" --experts "$experts" --top-k "$topk" \
            > "$work/jax-$i.json" 2> "$work/jax-$i.err" || tail -n 3 "$work/jax-$i.err" >&2
        printf '%s\n%s\n%s\n' "$name" "$topo" "data=$data, model=$model, $tokens tokens" > "$work/jax-$i.row"
        i=$((i + 1))
    done
else
    log "JAX's reference skipped (JAX 0.12 needs Python 3.12 or later: SIPHON_JAX_PYTHON names one)"
fi

"${PYTHON:-python3}" - "$work" <<'PY'
import glob, json, os, re, sys
work = sys.argv[1]
gib = lambda b: f"{b / 2**30:.2f}"
print("| model | slice | mesh | experts | arguments: compiler / planner (GiB) | outputs | temporaries | code | total of HBM | compile | GFLOP/token: compiler / analytic | TB accessed a chip a step | roofline tokens/s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
rows = sorted(glob.glob(os.path.join(work, "[0-9]*.row")), key=lambda p: int(os.path.basename(p).split(".")[0]))
for row in rows:
    n = row[:-4]
    name, slice_, mesh = open(row).read().splitlines()
    text = open(n + ".json").read()
    if not text.strip():
        err = [l for l in open(n + ".err").read().splitlines() if l.startswith("error:")]
        print(f"| {name} | {slice_} | `{mesh}` | refused: {err[-1][7:] if err else 'failed'} |||||||||||")
        continue
    r = json.loads(text)
    c, p = r["compiled"], r["planner"]
    loops = " (loops once)" if r["has_loops"] else ""
    experts = "—"
    if r.get("experts"):
        experts = "rounds loop" if r["has_loops"] else f"ragged dots ({r.get('grouped_calls')})"
    print(
        f"| {name} | {slice_} | {r['mesh']}{' spans hosts' if r['plan']['spans_hosts'] else ''} "
        f"| {experts} "
        f"| {gib(c['argument_size_in_bytes'])} / {gib(p['argument_bytes'])} "
        f"| {gib(c['output_size_in_bytes'])} / {gib(p['output_bytes'])} "
        f"| {gib(c['temp_size_in_bytes'])} / {gib(p['temp_bytes'])} "
        f"| {gib(c['generated_code_size_in_bytes'])} "
        f"| {gib(c['total_bytes'])} of {gib(r['hbm_bytes'])} "
        f"| {r['compile_seconds']:.1f} s "
        f"| {r['flops_per_token'] / 1e9:.2f} / {r['analytic_flops_per_token'] / 1e9:.2f}{loops} "
        f"| {c['bytes_accessed'] / 1e12:.3f} "
        f"| {r['roofline_tokens_per_second']:,.0f} |"
    )
print()
jax_rows = sorted(glob.glob(os.path.join(work, "jax-*.row")), key=lambda p: int(p.rsplit("-", 1)[1].split(".")[0]))
if jax_rows:
    print("| JAX reference (jax.lax.ragged_dot, shard_map) | topology | mesh | has loops | GFLOP a chip: compiler / the experts' analytic | GB accessed a chip | temporaries (GiB) | compile |")
    print("|---|---|---|---|---|---|---|---|")
    for row in jax_rows:
        name, topo, mesh = open(row).read().splitlines()
        text = open(row[:-4] + ".json").read().strip()
        if not text:
            print(f"| {name} | {topo} | {mesh} | failed |||||")
            continue
        j = json.loads(text.splitlines()[-1])
        print(
            f"| {name} | {topo} | {mesh} | {j['has_loops']} | {j['flops'] / 1e9:.1f} / {j['analytic_expert_flops'] / 1e9:.1f} "
            f"| {j['bytes_accessed'] / 1e9:.2f} | {j['temp_bytes'] / 2**30:.2f} | {j['compile_seconds']:.1f} s |"
        )
    print()
print("| seed 003's bench on v6e-16 | weight | sharded: compiler / planner | all-gathered: compiler / planner | gather temp |")
print("|---|---|---|---|---|")
for path in sorted(glob.glob(os.path.join(work, "bench-*.json"))):
    text = open(path).read()
    if not text.strip():
        continue
    b = json.loads(text)
    print(
        f"| {b['mesh']} | {gib(b['total_bytes'])} GiB | {gib(b['sharded_program']['argument'])} / {gib(b['predicted_sharded_bytes'])} GiB "
        f"| {gib(b['gather_program']['output'])} / {gib(b['predicted_gathered_bytes'])} GiB | {gib(b['gather_program']['temp'])} GiB |"
    )
PY
