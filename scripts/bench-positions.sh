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
bench_hf_prepare "$model"
bench_workdir
bench_short_docs "$python" "$corpus" "${BENCH_DOCS:-2000}" "$work/docs.jsonl"
"$python" scripts/bench/positions_vs_hf.py bench --siphon "$siphon" --model "$hf_model" --docs "$work/docs.jsonl" \
    --rounds "${BENCH_ROUNDS:-3}"
