#!/usr/bin/env bash
# `--pack isolated` against `--pad right` (issue 70): BENCH_DOCS short documents (default
# 2,000: the demo corpus's paragraphs of 40-300 characters, ~25 tokens at the median, each with
# a label field) through the demo model (SmolLM2-135M-Instruct, bundled GGUF), 8 blocks'
# hook_resid_post stored in bf16, batch 8, one CPU device — each document alone in a padded
# row of 128 (A: every document fits) and whole documents packed into isolated rows of
# BENCH_ISOLATED_SEQ (default 128; 256 and 512 were slower here) (B), interleaved A B A B
# for BENCH_ROUNDS rounds (default 3). Per run: the whole command's wall seconds and the job's
# own stored tokens a second (`siphon inspect --json`); medians and B/A in a markdown table.
# Both runs store the same tokens (checked; their values are held equal by
# crates/cli/tests/extract.rs).
#   scripts/bench-pack-isolated.sh
# SIPHON_BIN=... uses that binary instead of building release.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
bench_prepare
python="$(bash scripts/setup-python-train.sh | tail -n 1)"
bench_workdir
rounds="${BENCH_ROUNDS:-3}"
bench_short_docs "$python" "$corpus" "${BENCH_DOCS:-2000}" "$work/docs.jsonl"
hooks="$(python3 -c 'print(",".join(f"blocks.{l}.hook_resid_post" for l in (3, 7, 11, 15, 19, 23, 27, 29)))')"

one() {  # one() NAME [flags]: runs the extraction, prints "wall tokens_per_second tokens"
    local name="$1"; shift
    local start end
    start="$(date +%s.%N)"
    "$siphon" extract --model "$model" --corpus "$work/docs.jsonl" --cpu-devices 1 --hooks "$hooks" \
        --batch-size 8 --dtype bf16 --output "$work" --run "$name" "$@" \
        > "$work/$name.log" 2>&1 || { cat "$work/$name.log" >&2; exit 1; }
    end="$(date +%s.%N)"
    local stats
    stats="$("$siphon" inspect --json "$work/$name" | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["tokens_per_second"], r["tokens"])')"
    echo "$(python3 -c "print($end - $start)") $stats"
    rm -rf "${work:?}/$name"
}

: > "$work/a"; : > "$work/b"
for round in $(seq 1 "$rounds"); do
    one "a$round" --pad right --seq-len 128 >> "$work/a"
    one "b$round" --pack isolated --seq-len "${BENCH_ISOLATED_SEQ:-128}" >> "$work/b"
    log "round $round: --pad right $(tail -n 1 "$work/a"), --pack isolated $(tail -n 1 "$work/b") (wall s, tokens/s, tokens)"
done
python3 - "$work/a" "$work/b" <<'PY'
import statistics, sys
a = [tuple(map(float, l.split())) for l in open(sys.argv[1])]
b = [tuple(map(float, l.split())) for l in open(sys.argv[2])]
assert all(x[2] == y[2] for x, y in zip(a, b)), "the two runs store different token counts"
med = statistics.median
print(f"| {int(a[0][2])} tokens, {len(a)} rounds | --pad right | --pack isolated | B vs A |")
print("|---|---|---|---|")
print(f"| wall s (median) | {med(x[0] for x in a):.2f} | {med(x[0] for x in b):.2f} | "
      f"{med(x[0] / y[0] for x, y in zip(a, b)):.2f}x faster |")
print(f"| stored tokens/s in the loop (median) | {med(x[1] for x in a):.0f} | {med(x[1] for x in b):.0f} | "
      f"{med(y[1] / x[1] for x, y in zip(a, b)):.2f}x |")
PY
