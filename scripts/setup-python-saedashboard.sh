#!/usr/bin/env bash
# Idempotent: creates (or completes) the venv in which SAEDashboard (PyPI sae-dashboard 0.8.0,
# jbloomAus/SAEDashboard) computes the feature data that python/tests/test_saedashboard.py
# compares with siphon's dashboards ($SIPHON_CACHE/venvs/saedashboard). SAEDashboard pins
# transformer-lens<3 and transformers<4.57; what its runner imports works on the torch, sae-lens
# 6.x, transformer-lens 3.x and transformers of scripts/setup-python-train.sh's venv (a .pth
# file names its site-packages), so it goes in without its pins, plus what it imports that the
# train venv lacks (~20 MB, seconds):
#   sae-dashboard==0.8.0 (--no-deps)   the runner, its feature data and Neuronpedia's batch files
#   dataclasses-json, eindex-callum, matplotlib, typer   the rest its modules import
# Prints the venv's python path on the last line.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

stamp=.siphon-setup-v1
venv="$SIPHON_CACHE/venvs/saedashboard"
if [[ ! -f "$venv/$stamp" ]]; then
    on_train_venv saedashboard
    pip() { "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" >&2; }
    pip --no-deps "sae-dashboard==0.8.0"
    pip dataclasses-json eindex-callum matplotlib typer
    "$venv/bin/python" -c "import sae_dashboard.sae_vis_runner, sae_dashboard.neuronpedia.neuronpedia_converter" >&2
    touch "$venv/$stamp"
fi
echo "$venv/bin/python"
