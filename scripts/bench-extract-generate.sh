#!/usr/bin/env bash
# What `extract --generate` costs against `generate` alone (issue 69): the demo model
# (SmolLM2-135M-Instruct, bundled GGUF) completing the first BENCH_PROMPTS records (default 32)
# of the Shakespeare demo corpus (~500 tokens each), 64 new tokens each (no end token), 32
# slots, one CPU device; B also extracts every block's hook_resid_post of the generated tokens
# (`--roles assistant`, bf16, rows of 768). Interleaved A B A B for BENCH_ROUNDS rounds
# (default 3), each run the whole command's wall seconds; medians and B/A in a markdown table.
#   scripts/bench-extract-generate.sh
# SIPHON_BIN=... uses that binary instead of building release.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
bench_prepare
bench_workdir
rounds="${BENCH_ROUNDS:-3}"
prompts="$(ls "$corpus"/*.parquet | head -n 1)"
flags="--max-prompts ${BENCH_PROMPTS:-32} --max-new-tokens 64 --ignore-eos --slots 32 --cpu-devices 1"

timed() {  # timed LOG COMMAND...: runs it, prints its wall seconds
    local log="$1"; shift
    local start end
    start="$(date +%s.%N)"
    "$@" > "$log" 2>&1 || { cat "$log" >&2; exit 1; }
    end="$(date +%s.%N)"
    python3 -c "print($end - $start)"
}

: > "$work/a"; : > "$work/b"
for round in $(seq 1 "$rounds"); do
    # shellcheck disable=SC2086
    timed "$work/a.log" "$siphon" generate --model "$model" --corpus "$prompts" $flags \
        --out "$work/a$round.jsonl" >> "$work/a"
    timed "$work/b.log" "$siphon" extract --model "$model" --corpus "$prompts" --generate "$flags" \
        --cpu-devices 1 --hooks 'blocks.*.hook_resid_post' --roles assistant --pad right --seq-len 768 \
        --batch-size 8 --dtype bf16 --output "$work/runs" --run "b$round" >> "$work/b"
    cmp <("$siphon" inspect --json "$work/runs/b$round" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])') \
        <(python3 -c "import json,sys; print(sum(len(json.loads(l)['completion_ids']) for l in open(sys.argv[1])))" "$work/a$round.jsonl") \
        || { log "the run does not hold every generated token"; exit 1; }
    log "round $round: generate $(tail -n 1 "$work/a") s, extract --generate $(tail -n 1 "$work/b") s"
    rm -rf "${work:?}/runs"
done
python3 - "$work/a" "$work/b" <<'PY'
import statistics, sys
a = [float(l) for l in open(sys.argv[1])]
b = [float(l) for l in open(sys.argv[2])]
ratios = [y / x for x, y in zip(a, b)]
print(f"| {len(a)} rounds | generate (wall s) | extract --generate (wall s) | B / A |")
print("|---|---|---|---|")
print(f"| median | {statistics.median(a):.2f} | {statistics.median(b):.2f} | {statistics.median(ratios):.2f}x "
      f"({min(ratios):.2f}-{max(ratios):.2f}) |")
PY
