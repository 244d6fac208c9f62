#!/usr/bin/env bash
# Regenerates the committed dictionary fixtures (fixtures/dictionaries/<name>/: a dictionary as
# SAELens saves it, and golden.safetensors with the hook's values and the library's latents for
# them) from PyPI sae-lens 6.x on TransformerLens's values of tiny-llama's golden rows
# (scripts/fixtures/gen_sae_fixtures.py). Uses the venv of scripts/setup-python-train.sh (which
# it creates if missing). Offline apart from PyPI; CI never runs this.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/lib.sh"
python="$(bash "$here/setup-python-train.sh" | tail -n 1)"
"$python" "$here/fixtures/gen_sae_fixtures.py" --fixtures "$REPO_ROOT/fixtures" "$@"
