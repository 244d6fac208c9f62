#!/usr/bin/env bash
# A screenshot of a dashboard page `siphon dashboard` wrote, by headless Chromium
# (scripts/setup-chromium.sh): the column index, or latent N's page.
#   scripts/dashboard-screenshot.sh SITE/COLUMN/index.html index.png
#   scripts/dashboard-screenshot.sh SITE/COLUMN/latent.html latent.png 123
set -euo pipefail
source "$(dirname "$0")/lib.sh"
page="$(realpath "$1")"
png="$(realpath -m "$2")"
fragment="${3:+#$3}"
chromium="$(bash "$(dirname "$0")/setup-chromium.sh" | tail -n 1)"
"$chromium" --headless=new --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1000 \
    --virtual-time-budget=5000 --screenshot="$png" "file://$page$fragment" >&2 2> /dev/null
log "wrote $png"
