#!/usr/bin/env bash
# Idempotent: installs the pinned XLA CPU PJRT plugin where siphon looks by default:
#   $SIPHON_CACHE/pjrt/xla-cpu-2026.6.23/libpjrt_cpu.so
# with SIPHON_CACHE=${SIPHON_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/siphon}.
# The plugin is an unmodified XLA CPU PJRT build shipped in the PyPI wheel
# fastatomstruct-xla-cpu==2026.6.23; both the wheel and the library are checked against
# pinned sha256 sums. Does nothing when the installed file already has the right sum.
# Downloads with `pip download` (or, without pip, from PyPI's simple index with urllib);
# SIPHON_PJRT_WHEEL=path uses an already-downloaded wheel instead (checked the same way).
# Prints the installed path on the last line, e.g. for
#   export SIPHON_PJRT_PLUGIN="$(scripts/install-plugin.sh | tail -n1)"
set -euo pipefail
source "$(dirname "$0")/lib.sh"

version="2026.6.23"
package="fastatomstruct-xla-cpu"
wheel_sha="88b1c430b341b4bea40a37420311c9c75db6e22b46d2ff95b6986577bee6afe9"
member="fastatomstruct_xla_cpu/libpjrt_cpu.so"
lib_sha="0a0fe56ca17be9efc7b942e89e534e5e0ad4a0f1e369b66d27b62184509015b9"

cache="$SIPHON_CACHE"
dest_dir="$cache/pjrt/xla-cpu-$version"
dest="$dest_dir/libpjrt_cpu.so"
python="${PYTHON:-python3}"

if [[ -f "$dest" && "$(sha256_of "$dest")" == "$lib_sha" ]]; then
    echo "$dest"
    exit 0
fi

mkdir -p "$dest_dir"
work="$(mktemp -d "$dest_dir/.install.XXXXXX")"
# The temp dir sits beside the destination so the final rename is atomic (same filesystem).
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/wheel"
if [[ -n "${SIPHON_PJRT_WHEEL:-}" ]]; then
    # An already-downloaded wheel (offline machines); its sha256 is still checked below.
    cp "$SIPHON_PJRT_WHEEL" "$work/wheel/"
elif "$python" -m pip --version >/dev/null 2>&1; then
    echo "downloading the PJRT CPU plugin: $package==$version with pip (63 MB)" >&2
    "$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --dest "$work/wheel" "$package==$version" >&2
else
    # No pip (e.g. a bare Debian python3): read PyPI's simple index with urllib.
    echo "pip not available; downloading $package==$version from PyPI with urllib" >&2
    "$python" - "$package" "$version" "$work/wheel" <<'PY'
import os, re, sys, urllib.parse, urllib.request
package, version, dest = sys.argv[1:]
index = f"https://pypi.org/simple/{package}/"
with urllib.request.urlopen(index, timeout=60) as r:
    page = r.read().decode()
prefix = package.replace("-", "_") + "-" + version + "-"
links = [urllib.parse.urljoin(index, href.split("#")[0]) for href in re.findall(r'href="([^"]+)"', page)]
wheels = [u for u in links if os.path.basename(u).startswith(prefix) and u.endswith(".whl")]
if len(wheels) != 1:
    sys.exit(f"error: expected one wheel for {package}=={version} in {index}, found {len(wheels)}")
with urllib.request.urlopen(wheels[0], timeout=600) as r, \
        open(os.path.join(dest, os.path.basename(wheels[0])), "wb") as out:
    while chunk := r.read(1 << 20):
        out.write(chunk)
PY
fi
shopt -s nullglob
wheels=("$work"/wheel/*.whl)
if [[ ${#wheels[@]} -ne 1 ]]; then
    echo "error: expected one wheel, found ${#wheels[@]} in $work/wheel" >&2
    exit 1
fi
wheel="${wheels[0]}"
got="$(sha256_of "$wheel")"
if [[ "$got" != "$wheel_sha" ]]; then
    echo "error: $wheel has sha256 $got, expected $wheel_sha" >&2
    exit 1
fi

echo "extracting $member" >&2
extract_wheel_member "$wheel" "$member" "$work/libpjrt_cpu.so"
got="$(sha256_of "$work/libpjrt_cpu.so")"
if [[ "$got" != "$lib_sha" ]]; then
    echo "error: extracted $member has sha256 $got, expected $lib_sha" >&2
    exit 1
fi
chmod 0755 "$work/libpjrt_cpu.so"
mv -f "$work/libpjrt_cpu.so" "$dest"
echo "installed $dest" >&2
echo "$dest"
