#!/usr/bin/env bash
# siphon's dictionary latents (`extract --sae`, stored sparse, then `export-delphi`) against
# delphi's own LatentCache (issue 47), interleaved on one machine: the demo model
# (SmolLM2-135M-Instruct, its Q4_1 GGUF dequantized once into an HF f32 directory that both
# read) with a random 16,384-latent TopK SAE (k = 32, saved by SAELens) on
# blocks.15.hook_resid_post (delphi's `layers.15`), over the same token rows of the Shakespeare
# demo corpus (ctx 256, batch 32, every position: --keep-excluded), on the CPU: siphon one host,
# the CPU plugin with one device; delphi torch with as many threads as CPUs. Tokens/s, peak
# RSS and bytes on disk for each token count in BENCH_TOKENS (default 16384,65536; multiples of
# 8192), BENCH_ROUNDS rounds (default 2) of siphon then delphi; medians in a markdown table.
# siphon's shards are 16 MB (--shard-size-mb 16) so that both counts span several: its memory
# is bounded by a few shards, not by the tokens. ~9 minutes on 2 cores with the defaults.
#   scripts/bench-latents.sh [extra siphon extract flags]
# SIPHON_BIN=... uses that binary instead of building release; BENCH_WORK=DIR keeps the runs
# there (default: a temporary directory, removed).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
ensure_rust
[[ -x /usr/bin/time ]] || { log "needs GNU time at /usr/bin/time (it measures each run's peak RSS): apt-get install time"; exit 1; }
export SIPHON_PJRT_PLUGIN="$(bash scripts/install-plugin.sh | tail -n 1)"
export TF_CPP_MIN_LOG_LEVEL=2
corpus="$(bash scripts/setup-corpus.sh | tail -n 1)"
gguf="$(bash scripts/setup-model.sh | tail -n 1)"
delphi_python="$(bash scripts/setup-python-delphi.sh | tail -n 1)"

# delphi's venv plus PyPI gguf (transformers reads the GGUF with it): a venv on the delphi
# venv's packages and the train venv's it builds on (.pth files), so delphi's stays as it is.
venv="$SIPHON_CACHE/venvs/bench-latents"
stamp=.siphon-setup-v1
if [[ ! -f "$venv/$stamp" ]]; then
    base="$("$delphi_python" -c 'import sys; print(sys._base_executable)')"
    [[ -x "$venv/bin/python" ]] || "$base" -m venv "$venv" >&2
    own_site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    delphi_site="$("$delphi_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    cat "$delphi_site"/_siphon_train.pth > "$own_site/_siphon_delphi.pth"
    echo "$delphi_site" >> "$own_site/_siphon_delphi.pth"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "gguf==0.19.0" >&2
    "$venv/bin/python" -c "import gguf, delphi.latents, sae_lens, transformers" >&2
    touch "$venv/$stamp"
fi
python="$venv/bin/python"

bench_hf_assets "$python" "$gguf"
model="$hf_model"
sae="$hf_sae"

siphon="${SIPHON_BIN:-}"
if [[ -z "$siphon" ]]; then
    cargo build --release --quiet -p siphon
    siphon="$REPO_ROOT/target/release/siphon"
fi
work="${BENCH_WORK:-}"
if [[ -z "$work" ]]; then
    bench_workdir
fi
"$python" scripts/bench/latents_vs_delphi.py bench --siphon "$siphon" --model "$model" --sae "$sae" \
    --corpus "$corpus" --layer 15 --tokens "${BENCH_TOKENS:-16384,65536}" --rounds "${BENCH_ROUNDS:-2}" \
    --batch-size 32 --work "$work" -- --shard-size-mb 16 "$@"
