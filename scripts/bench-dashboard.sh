#!/usr/bin/env bash
# siphon's feature dashboards and Neuronpedia export against SAEDashboard's Neuronpedia runner
# (issue 56), interleaved on one machine, on a latents run of the latents benchmark (the demo
# model SmolLM2-135M-Instruct as an HF f32 directory and the random 16,384-latent TopK SAE on
# blocks.15.hook_resid_post that scripts/bench-latents.sh prepares, extracted with
# --keep-excluded): see scripts/bench/dashboard_vs_saedashboard.py.
#   scripts/bench-dashboard.sh RUN_DIR [--features 128] [--rounds 2]
# SIPHON_BIN=... uses that binary instead of building release; BENCH_WORK=DIR keeps the scratch
# files there (default: a temporary directory, removed).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
ensure_rust
[[ -x /usr/bin/time ]] || { log "needs GNU time at /usr/bin/time: apt-get install time"; exit 1; }
run="${1:?usage: scripts/bench-dashboard.sh RUN_DIR [flags]}"
shift
export SIPHON_PJRT_PLUGIN="$(bash scripts/install-plugin.sh | tail -n 1)"
python="$(bash scripts/setup-python-train.sh | tail -n 1)"
saedashboard_python="$(bash scripts/setup-python-saedashboard.sh | tail -n 1)"
assets="$SIPHON_CACHE/bench/latents"
siphon="${SIPHON_BIN:-}"
if [[ -z "$siphon" ]]; then
    cargo build --release --quiet -p siphon
    siphon="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/siphon"
fi
work="${BENCH_WORK:-$(mktemp -d)}"
[[ -n "${BENCH_WORK:-}" ]] || trap 'rm -rf "$work"' EXIT
"$python" scripts/bench/dashboard_vs_saedashboard.py --siphon "$siphon" --python "$python" \
    --saedashboard-python "$saedashboard_python" --run "$run" --model "$assets/smollm2-135m-instruct-f32" \
    --sae "$assets/saelens-topk-16k-k32-blocks.15" --work "$work" "$@"
