#!/usr/bin/env bash
# Regenerates the committed golden fixtures under fixtures/models/ with HF transformers.
# Idempotent: creates (or completes) the venv $SIPHON_CACHE/venvs/torch (PyPI torch,
# transformers, gguf, accelerate, safetensors, numpy; several GB), fetches the SmolLM2 GGUF
# through scripts/setup-model.sh, then runs scripts/fixtures/gen_fixtures.py.
# CI never runs this: the fixtures it writes are committed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/lib.sh"
root="$REPO_ROOT"
venv="$SIPHON_CACHE/venvs/torch"
ensure_venv torch .siphon-setup-v1 "torch, transformers, gguf, safetensors, numpy" \
    torch transformers gguf accelerate safetensors numpy sentencepiece protobuf

gguf="$("$root/scripts/setup-model.sh" | tail -n1)"
"$venv/bin/python" "$here/fixtures/gen_fixtures.py" --out "$root/fixtures/models" --smollm2-gguf "$gguf" "$@"
# The next-token outputs (log-probabilities, entropy, top-k) of those models, from HF's logits.
"$venv/bin/python" "$here/fixtures/gen_next_token_fixtures.py" --models "$root/fixtures/models" --smollm2-gguf "$gguf"
# Greedy completions of three prompts per family with HF generate, and the logits of each step.
"$venv/bin/python" "$here/fixtures/gen_generate_fixtures.py" --models "$root/fixtures/models"
# fp8 activation rows against ml_dtypes (numpy only: the test venv).
"$("$root/scripts/setup-python.sh" | tail -n1)" "$here/fixtures/gen_fp8_fixtures.py" --out "$root/fixtures/models"
