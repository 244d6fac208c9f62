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
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

qwen=(--config fixtures/configs/qwen2.5-7b.json --hooks 'blocks.{20..27}.hook_resid_post' --batch 64 --seq 1024)
llama=(--config fixtures/configs/llama-3.1-70b.json --hooks 'blocks.{40..79}.hook_resid_post' --batch 16 --seq 1024)
deepseek=(--config fixtures/configs/deepseek-v3.json --weights stored --hooks 'blocks.{30..60}.hook_resid_post'
    --batch 16 --seq 1024)
# name|slice|array of model flags|mesh flags
plans=(
    "Qwen2.5-7B|v5litepod-64|qwen|--mesh 1d"
    "Qwen2.5-7B|v5litepod-64|qwen|--mesh 3d --data 64 --fsdp 1 --model-parallel 1"
    "Qwen2.5-7B|v5litepod-64|qwen|--mesh 2d"
    "Qwen2.5-7B|v5litepod-64|qwen|--mesh 3d --data 8 --fsdp 2 --model-parallel 4"
    "Llama-3.1-70B|v5litepod-64|llama|--mesh 2d"
    "Llama-3.1-70B|v5litepod-64|llama|--mesh 3d --data 4 --fsdp 4 --model-parallel 4"
    "DeepSeek-V3 (FP8 kept)|v5p-128|deepseek|--mesh 2d"
    "DeepSeek-V3 (FP8 kept)|v5p-128|deepseek|${SIPHON_DEEPSEEK_MESH:---mesh 3d --data 8 --fsdp 2 --model-parallel 4}"
)
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
    "$SIPHON_BIN" bench memory --target tpu:v6e-16 --target-bytes 6012954624 $mesh --json > "$work/bench-$i.json"
    i=$((i + 1))
done

"${PYTHON:-python3}" - "$work" <<'PY'
import glob, json, os, re, sys
work = sys.argv[1]
gib = lambda b: f"{b / 2**30:.2f}"
print("| model | slice | mesh | arguments: compiler / planner (GiB) | outputs | temporaries | code | total of HBM | compile | GFLOP/token: compiler / analytic | roofline tokens/s |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
rows = sorted(glob.glob(os.path.join(work, "*.row")), key=lambda p: int(os.path.basename(p).split(".")[0]))
for row in rows:
    n = row[:-4]
    name, slice_, mesh = open(row).read().splitlines()
    text = open(n + ".json").read()
    if not text.strip():
        err = [l for l in open(n + ".err").read().splitlines() if l.startswith("error:")]
        print(f"| {name} | {slice_} | `{mesh}` | refused: {err[-1][7:] if err else 'failed'} |||||||||")
        continue
    r = json.loads(text)
    c, p = r["compiled"], r["planner"]
    loops = " (loops once)" if r["has_loops"] else ""
    print(
        f"| {name} | {slice_} | {r['mesh']}{' spans hosts' if r['plan']['spans_hosts'] else ''} "
        f"| {gib(c['argument_size_in_bytes'])} / {gib(p['argument_bytes'])} "
        f"| {gib(c['output_size_in_bytes'])} / {gib(p['output_bytes'])} "
        f"| {gib(c['temp_size_in_bytes'])} / {gib(p['temp_bytes'])} "
        f"| {gib(c['generated_code_size_in_bytes'])} "
        f"| {gib(c['total_bytes'])} of {gib(r['hbm_bytes'])} "
        f"| {r['compile_seconds']:.1f} s "
        f"| {r['flops_per_token'] / 1e9:.2f} / {r['analytic_flops_per_token'] / 1e9:.2f}{loops} "
        f"| {r['roofline_tokens_per_second']:,.0f} |"
    )
print()
print("| seed 003's bench on v6e-16 | weight | sharded: compiler / planner | all-gathered: compiler / planner | gather temp |")
print("|---|---|---|---|---|")
for path in sorted(glob.glob(os.path.join(work, "bench-*.json"))):
    b = json.load(open(path))
    print(
        f"| {b['mesh']} | {gib(b['total_bytes'])} GiB | {gib(b['sharded_program']['argument'])} / {gib(b['predicted_sharded_bytes'])} GiB "
        f"| {gib(b['gather_program']['output'])} / {gib(b['predicted_gathered_bytes'])} GiB | {gib(b['gather_program']['temp'])} GiB |"
    )
PY
