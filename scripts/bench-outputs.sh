#!/usr/bin/env bash
# What `extract --outputs nll,entropy,topk=20` costs (issue 68): the demo model (SmolLM2-135M,
# bundled GGUF, vocabulary 49,152) over the Shakespeare demo corpus, one host on the CPU plugin's
# one device, batch 8 x 128, hooks blocks.10.hook_resid_post and blocks.29.hook_resid_post (the
# last block: both runs compute every block, so the difference is the logits and the outputs),
# BENCH_TOKENS tokens (default 16384) — with the outputs (A) and without (B), interleaved A B A B
# for BENCH_ROUNDS rounds (default 3). Per run: the whole command's wall seconds and the job's
# own tokens/s (`siphon inspect --json`: the loop, weights and compile excluded); medians and
# A/B in a markdown table. ~5 minutes on 2 cores with the defaults (after the release build).
#   scripts/bench-outputs.sh [extra siphon extract flags for both]
# SIPHON_BIN=... uses that binary instead of building release.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
bench_prepare
bench_workdir
rounds="${BENCH_ROUNDS:-3}"
tokens="${BENCH_TOKENS:-16384}"

one() {  # one() NAME [flags]: runs the extraction, prints "wall tokens_per_second"
    local name="$1"; shift
    local start end
    start="$(date +%s.%N)"
    "$siphon" extract --model "$model" --corpus "$corpus" --cpu-devices 1 \
        --hooks blocks.10.hook_resid_post,blocks.29.hook_resid_post --seq-len 128 --batch-size 8 \
        --max-tokens "$tokens" --dtype bf16 --shard-size-mb 16 --output "$work" --run "$name" "$@" \
        > "$work/$name.log" 2>&1 || { cat "$work/$name.log" >&2; exit 1; }
    end="$(date +%s.%N)"
    local tps
    tps="$("$siphon" inspect --json "$work/$name" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_second"])')"
    echo "$(python3 -c "print($end - $start)") $tps"
    rm -rf "${work:?}/$name"
}

: > "$work/a" ; : > "$work/b"
for round in $(seq 1 "$rounds"); do
    one "a$round" --outputs nll,entropy,topk=20 "$@" >> "$work/a"
    one "b$round" "$@" >> "$work/b"
    log "round $round: with outputs $(tail -n 1 "$work/a"), without $(tail -n 1 "$work/b") (wall s, tokens/s)"
done
python3 - "$work/a" "$work/b" "$tokens" <<'PY'
import statistics, sys
a = [tuple(map(float, l.split())) for l in open(sys.argv[1])]
b = [tuple(map(float, l.split())) for l in open(sys.argv[2])]
med = lambda xs: statistics.median(xs)
wall_a, wall_b = med([x[0] for x in a]), med([x[0] for x in b])
tps_a, tps_b = med([x[1] for x in a]), med([x[1] for x in b])
ratios = [x[0] / y[0] for x, y in zip(a, b)]
tps_ratios = [y[1] / x[1] for x, y in zip(a, b)]
print(f"| {sys.argv[3]} tokens, {len(a)} rounds | wall s (median) | tokens/s in the loop (median) |")
print("|---|---|---|")
print(f"| with --outputs nll,entropy,topk=20 | {wall_a:.1f} | {tps_a:.0f} |")
print(f"| without | {wall_b:.1f} | {tps_b:.0f} |")
print(f"| cost (A/B, median of the pairs) | {med(ratios):.3f}x | {med(tps_ratios):.3f}x |")
PY
