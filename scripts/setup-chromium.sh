#!/usr/bin/env bash
# Idempotent: a headless Chromium for the dashboard's browser test
# (python/tests/test_dashboard_browser.py) and scripts/dashboard-screenshot.sh: `chromium` on
# PATH, else Debian's package (apt-get, as root; ~100 MB). Prints its path on the last line.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

find_chromium() { command -v chromium || command -v chromium-browser || command -v google-chrome || true; }
found="$(find_chromium)"
if [[ -z "$found" ]]; then
    if [[ "$(id -u)" != 0 ]] || ! command -v apt-get > /dev/null; then
        log "no chromium on PATH and no apt-get as root to install Debian's: install chromium yourself"
        exit 1
    fi
    log "installing Debian's chromium (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >&2 \
        || { DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >&2; }
    found="$(find_chromium)"
fi
echo "$found"
