#!/usr/bin/env bash
# Installs one PJRT plugin flavour under ROOT/opt/siphon/FLAVOUR, where
# deploy/container/entrypoint.sh looks for it. The Dockerfile's plugin stages run this with
# ROOT=/; tests run it with a temporary ROOT.
#   cpu   the pinned XLA CPU plugin (scripts/install-plugin.sh: PyPI wheel, sha256-checked)
#         → cpu/pjrt/xla-cpu-<version>/libpjrt_cpu.so
#   tpu   PyPI libtpu in a venv → tpu/venv/lib/python3.*/site-packages/libtpu/libtpu.so
#   cuda  PyPI jax-cuda12-pjrt and jax-cuda12-plugin[with-cuda] (the CUDA libraries) in a venv
#         → cuda/venv/lib/python3.*/site-packages/jax_plugins/xla_cuda12/xla_cuda_plugin.so
# Versions: LIBTPU_VERSION, JAX_CUDA_VERSION (pinned below; the CPU plugin's pin lives in
# scripts/install-plugin.sh).
set -euo pipefail
LIBTPU_VERSION="${LIBTPU_VERSION:-0.0.51}"
JAX_CUDA_VERSION="${JAX_CUDA_VERSION:-0.12.0.1}"
flavour="${1:?usage: install-plugins.sh cpu|tpu|cuda ROOT}"
root="${2:?usage: install-plugins.sh cpu|tpu|cuda ROOT}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="$root/opt/siphon/$flavour"
mkdir -p "$dir"

venv_install() {
    "${PYTHON:-python3}" -m venv "$dir/venv"
    "$dir/venv/bin/python" -m pip install --no-cache-dir --quiet --disable-pip-version-check "$@"
}

case "$flavour" in
cpu)
    # install-plugin.sh sits beside this script in the image, in scripts/ in a checkout.
    installer="$here/install-plugin.sh"
    [[ -f "$installer" ]] || installer="$here/../../scripts/install-plugin.sh"
    SIPHON_CACHE_DIR="$dir" bash "$installer" >/dev/null
    ;;
tpu) venv_install "libtpu==$LIBTPU_VERSION" ;;
cuda) venv_install "jax-cuda12-pjrt==$JAX_CUDA_VERSION" "jax-cuda12-plugin[with-cuda]==$JAX_CUDA_VERSION" ;;
*) echo "install-plugins.sh: unknown flavour '$flavour' (cpu, tpu or cuda)" >&2; exit 2 ;;
esac
# The entrypoint must find what was installed.
SIPHON_IMAGE_ROOT="$root" SIPHON_FLAVOUR="$flavour" "$here/entrypoint.sh" --print-plugin >/dev/null
echo "installed the $flavour plugin under $dir" >&2
