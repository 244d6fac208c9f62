#!/usr/bin/env bash
# Regenerates the committed dictionary fixtures (fixtures/dictionaries/<name>/: a dictionary as
# its library saves it, and golden.safetensors with the hook's values and the library's latents
# for them) on TransformerLens's values of tiny-llama's golden rows: PyPI sae-lens 6.x in the venv
# of scripts/setup-python-train.sh (scripts/fixtures/gen_sae_fixtures.py: SAELens's
# architectures, Gemma Scope through SAELens's loader; scripts/fixtures/gen_llama_scope_fixtures.py:
# Llama Scope's layout, its latents by lm-saes's encoder written out from lm-saes's source and
# checked against SAELens's loader where the two agree), PyPI eai-sparsify in its own venv
# $SIPHON_CACHE/venvs/sparsify (scripts/fixtures/gen_sparsify_fixtures.py); then the splice
# goldens, golden-splice*.safetensors (scripts/fixtures/gen_splice_fixtures.py: HF transformers
# with SAELens's reconstruction hooked in). Creates the venvs if missing (torch twice, several
# GB). Offline apart from PyPI; CI never runs this.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/lib.sh"
python="$(bash "$here/setup-python-train.sh" | tail -n 1)"
"$python" "$here/fixtures/gen_sae_fixtures.py" --fixtures "$REPO_ROOT/fixtures" "$@"
"$python" "$here/fixtures/gen_llama_scope_fixtures.py" --fixtures "$REPO_ROOT/fixtures"
ensure_venv sparsify .siphon-setup-v1 "torch, sparsify, safetensors, numpy" eai-sparsify safetensors numpy
"$SIPHON_CACHE/venvs/sparsify/bin/python" "$here/fixtures/gen_sparsify_fixtures.py" --fixtures "$REPO_ROOT/fixtures"
# The splice goldens (HF transformers with SAELens's reconstruction hooked in) over the
# dictionaries just written.
"$python" "$here/fixtures/gen_splice_fixtures.py" --fixtures "$REPO_ROOT/fixtures"
