#!/usr/bin/env bash
# One row per document (issue 70): `siphon extract --pack isolated --positions last` against
# the HF loop probe users write (output_hidden_states, last non-padding token, batch 32) on
# BENCH_DOCS labeled short prompts (default 2,000: the demo corpus's paragraphs of 40-300
# characters, ~25 tokens at the median), 8 layers' hook_resid_post, the demo model as an HF f32
# directory both read; interleaved siphon / HF for BENCH_ROUNDS rounds (default 3), whole
# processes timed; plus the stored bytes of every token against one row a document, and the two
# tools' rows compared (scripts/bench/positions_vs_hf.py).
#   scripts/bench-positions.sh
# SIPHON_BIN=... uses that binary instead of building release.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
bench_prepare
gguf="$model"
on_train_venv bench-splice
venv="$SIPHON_CACHE/venvs/bench-splice"
if [[ ! -f "$venv/.siphon-setup-v1" ]]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "gguf==0.19.0" >&2
    "$venv/bin/python" -c "import gguf, sae_lens, transformers" >&2
    touch "$venv/.siphon-setup-v1"
fi
python="$venv/bin/python"
assets="$SIPHON_CACHE/bench/latents"
hf_model="$assets/smollm2-135m-instruct-f32"
"$python" scripts/bench/latents_vs_delphi.py prepare --gguf "$gguf" --model-out "$hf_model" \
    --sae-out "$assets/saelens-topk-16k-k32-blocks.15" --layer 15 --width 16384 --k 32
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$python" - "$corpus" "${BENCH_DOCS:-2000}" "$work/docs.jsonl" <<'PY'
import glob, json, sys
import pyarrow.parquet as pq
corpus, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
docs = []
for path in sorted(glob.glob(f"{corpus}/*.parquet")):
    for text in pq.read_table(path).column("text").to_pylist():
        docs += [p.strip() for p in text.split("\n\n") if 40 <= len(p.strip()) <= 300]
with open(out, "w") as f:
    for i, text in enumerate(docs[:n]):
        f.write(json.dumps({"text": text, "label": i % 2}) + "\n")
PY
"$python" scripts/bench/positions_vs_hf.py bench --siphon "$siphon" --model "$hf_model" --docs "$work/docs.jsonl" \
    --rounds "${BENCH_ROUNDS:-3}"
