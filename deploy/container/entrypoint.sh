#!/usr/bin/env bash
# The container's entrypoint: picks the PJRT plugin from SIPHON_FLAVOUR and runs siphon.
#   SIPHON_FLAVOUR=cpu|tpu|cuda  that plugin (installed under /opt/siphon/<flavour>)
#   SIPHON_FLAVOUR=auto          a TPU plugin if /dev/accel* or /dev/vfio/* exist, the CUDA
#                                plugin if /dev/nvidia0 does, else the CPU plugin; only among
#                                the plugins the image has
# SIPHON_PJRT_PLUGIN, when set, wins over all of this. `--print-plugin` prints the choice and
# exits (tests; install-plugins.sh). SIPHON_IMAGE_ROOT (default /) relocates /opt and /dev for
# tests.
set -euo pipefail
root="${SIPHON_IMAGE_ROOT:-}"
flavour="${SIPHON_FLAVOUR:-auto}"

plugin_of() {
    local pattern
    case "$1" in
        cpu) pattern="$root/opt/siphon/cpu/pjrt/xla-cpu-*/libpjrt_cpu.so" ;;
        tpu) pattern="$root/opt/siphon/tpu/venv/lib/python3*/site-packages/libtpu/libtpu.so" ;;
        cuda) pattern="$root/opt/siphon/cuda/venv/lib/python3*/site-packages/jax_plugins/xla_cuda12/xla_cuda_plugin.so" ;;
        *) echo "siphon-entrypoint: SIPHON_FLAVOUR='$1' is not cpu, tpu, cuda or auto" >&2; return 2 ;;
    esac
    compgen -G "$pattern" | head -n 1 || true
}

if [[ -z "${SIPHON_PJRT_PLUGIN:-}" ]]; then
    if [[ "$flavour" == auto ]]; then
        candidates=(cpu)
        if compgen -G "$root/dev/nvidia[0-9]*" >/dev/null; then candidates=(cuda cpu); fi
        if compgen -G "$root/dev/accel*" >/dev/null || compgen -G "$root/dev/vfio/[0-9]*" >/dev/null; then
            candidates=(tpu cpu)
        fi
        for candidate in "${candidates[@]}"; do
            if path="$(plugin_of "$candidate")" && [[ -n "$path" ]]; then
                flavour="$candidate"; SIPHON_PJRT_PLUGIN="$path"; break
            fi
        done
        [[ -n "${SIPHON_PJRT_PLUGIN:-}" ]] || { echo "siphon-entrypoint: no PJRT plugin in this image (looked for: ${candidates[*]})" >&2; exit 1; }
    else
        path="$(plugin_of "$flavour")" || exit 2
        [[ -n "$path" ]] || { echo "siphon-entrypoint: this image has no $flavour plugin under $root/opt/siphon/$flavour (build it with --target $flavour or all)" >&2; exit 1; }
        SIPHON_PJRT_PLUGIN="$path"
    fi
    export SIPHON_PJRT_PLUGIN
fi
if [[ "${1:-}" == --print-plugin ]]; then
    echo "$SIPHON_PJRT_PLUGIN"
    exit 0
fi
exec "${SIPHON_BIN:-siphon}" "$@"
