#!/usr/bin/env bash
# Regenerates the committed golden fixtures under fixtures/models/ with HF transformers.
# Idempotent: creates (or completes) the venv $SIPHON_CACHE/venvs/torch (PyPI torch,
# transformers, gguf, accelerate, safetensors, numpy; several GB), fetches the SmolLM2 GGUF
# through scripts/setup-model.sh, then runs scripts/fixtures/gen_fixtures.py.
# CI never runs this: the fixtures it writes are committed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
cache="${SIPHON_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/siphon}"
venv="$cache/venvs/torch"
python="${PYTHON:-python3}"
packages=(torch transformers gguf accelerate safetensors numpy sentencepiece protobuf)
stamp="$venv/.siphon-setup-v1"

if [[ ! -f "$stamp" ]]; then
    mkdir -p "$cache/venvs"
    if [[ ! -x "$venv/bin/python" ]]; then
        "$python" -m venv "$venv" >&2
    fi
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${packages[@]}" >&2
    "$venv/bin/python" -c "import torch, transformers, gguf, safetensors, numpy" >&2
    touch "$stamp"
fi

gguf="$("$root/scripts/setup-model.sh" | tail -n1)"
"$venv/bin/python" "$here/fixtures/gen_fixtures.py" --out "$root/fixtures/models" --smollm2-gguf "$gguf" "$@"
