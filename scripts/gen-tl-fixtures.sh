#!/usr/bin/env bash
# Regenerates the committed TransformerLens reference fixtures: fixtures/models/<tiny model>/
# golden-tl.safetensors and fixtures/models/tl-hooks.json, from PyPI transformer-lens 4.3
# (TransformerBridge) on the committed tiny models. Idempotent: creates (or completes) the venv
# $SIPHON_CACHE/venvs/tl (transformer-lens, torch, transformers, safetensors, numpy; several GB),
# then runs scripts/fixtures/gen_tl_fixtures.py. Offline apart from PyPI; CI never runs this.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/lib.sh"
root="$REPO_ROOT"
venv="$SIPHON_CACHE/venvs/tl"
ensure_venv tl .siphon-setup-v1 "torch, transformers, transformer_lens, safetensors, numpy" \
    "transformer-lens==4.3.0" torch transformers safetensors numpy

HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$venv/bin/python" "$here/fixtures/gen_tl_fixtures.py" \
    --models "$root/fixtures/models" --tokenizer "$root/fixtures/data/tokenizer.json" "$@"
