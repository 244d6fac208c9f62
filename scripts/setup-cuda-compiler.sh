#!/usr/bin/env bash
# Idempotent: installs XLA's CUDA compiler — what `siphon plan --target gpu:…` and the tests
# compile siphon's GPU programs with, on any x86-64 Linux machine, no GPU needed — into
#   $SIPHON_CACHE/pjrt/xla-cuda12-0.12.0.1/
#       jax_plugins/xla_cuda12/xla_cuda_plugin.so   PyPI jax-cuda12-pjrt==0.12.0.1 (the PJRT plugin)
#       nvidia/cuda_nvcc/bin/ptxas, nvidia/cuda_nvcc/nvvm/libdevice/libdevice.10.bc
#                                                   PyPI nvidia-cuda-nvcc-cu12==12.9.86 (PTX → GPU code)
#       nvidia/cudnn/lib/libcudnn*.so.9             PyPI nvidia-cudnn-cu12==9.23.2.1 (cuDNN builds and
#                                                   checks each fused attention's graph for the target)
#       nvidia/cublas/lib/libcublasLt.so.12         PyPI nvidia-cublas-cu12==12.9.3.13 (cuDNN's engines
#                                                   load it; without it they end the process)
#       libcuda/libcuda.so.1                        Debian bookworm non-free libcuda1 (the driver
#                                                   library cuDNN loads; no GPU or kernel module used)
# laid out as in site-packages, where the plugin's own search paths find cuDNN, ptxas and
# libdevice. Only the files a compile loads are kept (~2.0 GB on disk; the downloads are
# ~1.54 GB: the plugin's wheel 192 MB, cuDNN's 721 MB, cuBLAS's 581 MB, nvcc's 41 MB, the
# driver package 3 MB). The plugin and
# the wheels are checked against pinned sha256 sums, the driver package against Debian's
# index. Nothing is done when the install is complete. Prints the plugin's path on the last
# line.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

version="0.12.0.1"
pjrt_sha="5ec28e06198d094031c37590b4ea753ae8cde4879ab4b60baf40f0dffb673286"
plugin_sha="921aaa9c635255fb7b7a660d11c8f702c78a70e7f7d005d4f377c2dc5f0fede2"
cudnn="nvidia-cudnn-cu12==9.23.2.1"
cudnn_sha="a5e706320218dc7d661b0e13402f204eeccd07b18d061b4d60668f80e464dd1e"
cublas="nvidia-cublas-cu12==12.9.3.13"
cublas_sha="d7d51055f161b317c7105ddaae90e71eda059026074ffef93cf7cde2886bfe72"
nvcc="nvidia-cuda-nvcc-cu12==12.9.86"
nvcc_sha="5d6a0d32fdc7ea39917c20065614ae93add6f577d840233237ff08e9a38f58f0"
# cuDNN's libraries a compile without a GPU loads (measured from /proc/self/maps after building
# fused attentions' graphs for an H100; cuDNN's adv, cnn, ext and ops libraries stay unread).
cudnn_libs=(libcudnn.so.9 libcudnn_graph.so.9 libcudnn_heuristic.so.9 libcudnn_engines_precompiled.so.9
    libcudnn_engines_runtime_compiled.so.9 libcudnn_engines_tensor_ir.so.9)
root="$SIPHON_CACHE/pjrt/xla-cuda12-$version"
plugin="$root/jax_plugins/xla_cuda12/xla_cuda_plugin.so"
stamp="$root/.complete-2"
python="${PYTHON:-python3}"

if [[ -f "$stamp" && -f "$plugin" ]]; then
    echo "$plugin"
    exit 0
fi

mkdir -p "$SIPHON_CACHE/pjrt"
# Built beside the destination, then renamed into place whole.
work="$(mktemp -d "$SIPHON_CACHE/pjrt/.cuda-compiler.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/wheels" "$work/root"

log "downloading XLA's CUDA compiler: jax-cuda12-pjrt==$version, $cudnn, $cublas, $nvcc (~1.54 GB)"
"$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --dest "$work/wheels" "jax-cuda12-pjrt==$version" "$cudnn" "$cublas" "$nvcc" >&2

check_wheel() { # GLOB SHA
    local found=("$work"/wheels/$1)
    if [[ ${#found[@]} -ne 1 || ! -f "${found[0]}" ]]; then
        log "error: expected one wheel $1 in $work/wheels"
        exit 1
    fi
    local got
    got="$(sha256_of "${found[0]}")"
    if [[ "$got" != "$2" ]]; then
        log "error: ${found[0]##*/} has sha256 $got, expected $2"
        exit 1
    fi
    echo "${found[0]}"
}
pjrt_wheel="$(check_wheel 'jax_cuda12_pjrt-*.whl' "$pjrt_sha")"
cudnn_wheel="$(check_wheel 'nvidia_cudnn_cu12-*.whl' "$cudnn_sha")"
cublas_wheel="$(check_wheel 'nvidia_cublas_cu12-*.whl' "$cublas_sha")"
nvcc_wheel="$(check_wheel 'nvidia_cuda_nvcc_cu12-*.whl' "$nvcc_sha")"
"$python" - "$work/root" "$pjrt_wheel" "$cudnn_wheel" "$cublas_wheel" "$nvcc_wheel" "${cudnn_libs[@]}" <<'PY'
import os, shutil, stat, sys, zipfile
root, pjrt, cudnn, cublas, nvcc, *cudnn_libs = sys.argv[1:]
def take(wheel, members):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for member in members:
            if member not in names:
                sys.exit(f"error: {os.path.basename(wheel)} has no {member}")
            out = os.path.join(root, member)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with zf.open(member) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
take(pjrt, ["jax_plugins/xla_cuda12/xla_cuda_plugin.so"])
take(cudnn, [f"nvidia/cudnn/lib/{lib}" for lib in cudnn_libs])
take(cublas, ["nvidia/cublas/lib/libcublasLt.so.12"])
take(nvcc, ["nvidia/cuda_nvcc/bin/ptxas", "nvidia/cuda_nvcc/nvvm/libdevice/libdevice.10.bc"])
ptxas = os.path.join(root, "nvidia/cuda_nvcc/bin/ptxas")
os.chmod(ptxas, os.stat(ptxas).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
PY

got="$(sha256_of "$work/root/jax_plugins/xla_cuda12/xla_cuda_plugin.so")"
if [[ "$got" != "$plugin_sha" ]]; then
    log "error: xla_cuda_plugin.so of jax-cuda12-pjrt==$version has sha256 $got, expected $plugin_sha"
    exit 1
fi

# The driver library from Debian's archive: its current bookworm non-free libcuda1, checked
# against the sha256 the (HTTPS) index gives for it; only the library itself is kept.
log "downloading the CUDA driver library (Debian bookworm non-free libcuda1, ~3 MB)"
"$python" - "$work" <<'PY'
import hashlib, lzma, os, sys, urllib.request
work = sys.argv[1]
mirror = "https://deb.debian.org/debian"
best = None
for suite in ("bookworm", "bookworm-updates"):
    url = f"{mirror}/dists/{suite}/non-free/binary-amd64/Packages.xz"
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            index = lzma.decompress(r.read()).decode()
    except OSError as e:
        print(f"warning: {url}: {e}", file=sys.stderr)
        continue
    for stanza in index.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" "))
        if fields.get("Package") == "libcuda1" and fields.get("Architecture") == "amd64":
            best = (fields["Filename"], fields["SHA256"])
if best is None:
    sys.exit("error: no libcuda1 in Debian bookworm's non-free index")
filename, sha = best
deb = os.path.join(work, os.path.basename(filename))
with urllib.request.urlopen(f"{mirror}/{filename}", timeout=300) as r, open(deb, "wb") as out:
    out.write(r.read())
got = hashlib.sha256(open(deb, "rb").read()).hexdigest()
if got != sha:
    sys.exit(f"error: {filename} has sha256 {got}, Debian's index says {sha}")
print(deb)
PY
deb="$(ls "$work"/libcuda1_*.deb)"
mkdir -p "$work/deb" "$work/root/libcuda"
dpkg-deb -x "$deb" "$work/deb" 2>/dev/null || (cd "$work/deb" && ar p "$deb" data.tar.xz | tar -xJ)
lib="$(find "$work/deb" -name 'libcuda.so.*.*' -type f | head -n 1)"
[[ -n "$lib" ]] || { log "error: no libcuda.so in $deb"; exit 1; }
cp "$lib" "$work/root/libcuda/libcuda.so.1"

touch "$work/root/.complete-2"
rm -rf "$root"
mv "$work/root" "$root"
echo "$plugin"
