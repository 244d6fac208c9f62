#!/usr/bin/env bash
# `pip install <checkout>` into a fresh venv, then `siphon --version` and `import siphon` from it.
# maturin builds the `siphon` binary with cargo; SIPHON_PIP_PROFILE=dev (what scripts/test.sh
# uses) builds the dev profile so that cargo reuses the test build's artifacts, the default is
# maturin's release build. The venv is removed afterwards.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
ensure_rust
venv="$(mktemp -d)/venv"
trap 'rm -rf "$(dirname "$venv")"' EXIT
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
if [[ -n "${SIPHON_PIP_PROFILE:-}" ]]; then
    export MATURIN_PEP517_ARGS="--profile $SIPHON_PIP_PROFILE"
fi
log "pip install $REPO_ROOT ${MATURIN_PEP517_ARGS:-}"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$REPO_ROOT" >&2
version="$("$venv/bin/siphon" --version)"
module="$(cd / && "$venv/bin/python" -c 'import siphon, siphon.dataset, siphon.dashboard; print(siphon.__version__, siphon.__file__)')"
[[ "$module" == *"$venv"* ]] || { log "import siphon did not load the installed package: $module"; exit 1; }
log "siphon --version: $version; import siphon: $module"
