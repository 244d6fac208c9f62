#!/usr/bin/env bash
# Opt-in (SIPHON_TEST_LIBTPU=1 scripts/test.sh): fetches PyPI libtpu (pinned; ~200 MB wheel,
# ~575 MB library) and extracts its libtpu.so to
#   $SIPHON_CACHE/pjrt/libtpu-<version>/libtpu.so
# for the test that checks siphon's error when libtpu runs on a machine without a TPU.
# Prints that path on the last line.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

version="${SIPHON_LIBTPU_VERSION:-0.0.51}"
dir="$SIPHON_CACHE/pjrt/libtpu-$version"
file="$dir/libtpu.so"
if [[ ! -f "$file" ]]; then
    log "downloading libtpu==$version from PyPI (~200 MB)"
    mkdir -p "$dir"
    dl="$(mktemp -d "$dir/.download.XXXXXX")"
    trap 'rm -rf "$dl"' EXIT
    "${PYTHON:-python3}" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --dest "$dl" "libtpu==$version" >&2
    wheel="$(ls "$dl"/*.whl)"
    extract_wheel_member "$wheel" libtpu/libtpu.so "$dl/libtpu.so"
    mv "$dl/libtpu.so" "$file"
fi
echo "$file"
