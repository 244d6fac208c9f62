#!/usr/bin/env bash
# Idempotent: creates (or completes) the venv in which delphi (EleutherAI's automated
# interpretability, PyPI eai-delphi) checks siphon's delphi export ($SIPHON_CACHE/venvs/delphi):
# scripts/delphi_compare.py, and the tests of python/tests/test_delphi_export.py that run it.
# delphi's own requirements include vllm, bitsandbytes and the like (serving an explainer
# model), which loading and building latent caches never import; so delphi goes in without
# them, on the torch, transformers, sae-lens and datasets of scripts/setup-python-train.sh's
# venv (a .pth file names its site-packages), plus what `delphi.latents` and
# `delphi.sparse_coders` import (~170 MB, seconds):
#   eai-delphi, eai-sparsify (--no-deps)   the cache, its loader, samplers; sparsify's loader
#   sentence-transformers, faiss-cpu (--no-deps), scikit-learn   imported by delphi.latents.constructors
#   asyncer, blobfile, orjson, lxml, pycryptodomex, natsort, schedulefree   the rest they import
# Prints the venv's python path on the last line.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

stamp=.siphon-setup-v1
venv="$SIPHON_CACHE/venvs/delphi"
if [[ ! -f "$venv/$stamp" ]]; then
    on_train_venv delphi
    pip() { "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" >&2; }
    pip --no-deps "eai-delphi==0.1.3" "eai-sparsify==1.3.3" sentence-transformers faiss-cpu asyncer blobfile orjson
    pip scikit-learn natsort schedulefree lxml pycryptodomex
    "$venv/bin/python" -c "import delphi.latents, delphi.sparse_coders, delphi.config, sparsify, sae_lens" >&2
    touch "$venv/$stamp"
fi
echo "$venv/bin/python"
