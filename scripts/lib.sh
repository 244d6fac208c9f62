# Sourced by the other scripts: where siphon keeps downloaded assets and venvs.
# shellcheck shell=bash
SIPHON_CACHE="${SIPHON_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/siphon}"
export SIPHON_CACHE
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export REPO_ROOT

log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }

# ensure_rust: cargo must be on PATH (rustup installs it under ~/.cargo/bin).
ensure_rust() {
    if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
    command -v cargo >/dev/null 2>&1 || { log "cargo not found: install Rust (https://rustup.rs) first"; exit 1; }
}
