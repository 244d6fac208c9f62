#!/usr/bin/env bash
# Idempotent: installs the pinned libtpu (PyPI libtpu==0.0.51; ~200 MB wheel, ~575 MB library)
# where siphon looks for it by default:
#   $SIPHON_CACHE/pjrt/libtpu-0.0.51/libtpu.so
# It is the TPU compiler `siphon plan --target tpu:SLICE` compiles with, on any x86-64 Linux
# machine (no TPU needed), and what the tests compile every fixture family with. The library is
# checked against its pinned sha256 (libtpu's wheels are built per Python version, cp311,
# cp312, ..., around the same library, so the wheel's own sum differs with the Python that
# downloads it); nothing is done when the installed file already has the right sum. Prints the
# installed path on the last line.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

version="0.0.51"
lib_sha="ad0b2a3bc5d4de96f653b3701aaed8769a691776ca0e14c791dcdca785d43e42"
dir="$SIPHON_CACHE/pjrt/libtpu-$version"
file="$dir/libtpu.so"
if [[ -f "$file" && "$(sha256_of "$file")" == "$lib_sha" ]]; then
    echo "$file"
    exit 0
fi

log "downloading libtpu==$version from PyPI (~200 MB)"
mkdir -p "$dir"
# Beside the destination, so that the final rename is atomic.
work="$(mktemp -d "$dir/.download.XXXXXX")"
trap 'rm -rf "$work"' EXIT
"${PYTHON:-python3}" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --dest "$work" "libtpu==$version" >&2
shopt -s nullglob
wheels=("$work"/*.whl)
if [[ ${#wheels[@]} -ne 1 ]]; then
    log "error: expected one libtpu wheel, found ${#wheels[@]} in $work"
    exit 1
fi
extract_wheel_member "${wheels[0]}" libtpu/libtpu.so "$work/libtpu.so"
got="$(sha256_of "$work/libtpu.so")"
if [[ "$got" != "$lib_sha" ]]; then
    log "error: libtpu.so of libtpu==$version has sha256 $got, expected $lib_sha"
    exit 1
fi
mv "$work/libtpu.so" "$file"
echo "$file"
