#!/usr/bin/env bash
# `siphon generate` on completions of mixed lengths (issue 69): the demo model
# (SmolLM2-135M-Instruct, bundled GGUF) answering 256 short chat messages (12 questions drawn with
# a fixed seed), sampled at temperature 0.8, each ending at its own end token (at most 96 new
# tokens), 32 slots, one CPU device — slots free at different steps and take new prompts while
# the others decode. With SIPHON_BIN_B (another build), A B A B for BENCH_ROUNDS rounds (default
# 2): each run's decoding seconds and new tokens/s as siphon counts them, and whether the two
# builds' completions are byte for byte the same.
#   SIPHON_BIN_B=/path/to/other/siphon scripts/bench-generate-mixed.sh
# SIPHON_BIN=... uses that binary instead of building release.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"
bench_prepare
bench_workdir
mkdir "$work/prompts"
python3 - "$work/prompts/chat.jsonl" <<'EOF'
import json, random, sys
random.seed(1)
questions = ["Name a river.", "What is two plus two?", "Say hello.", "Write a haiku about rain.",
             "List three colors.", "What is the capital of France?", "Tell me a short joke.",
             "Describe the sea in one sentence.", "Count to five.", "What is a cat?",
             "Give me a word that rhymes with moon.", "Explain gravity briefly."]
with open(sys.argv[1], "w") as f:
    for _ in range(256):
        f.write(json.dumps({"text": random.choice(questions)}) + "\n")
EOF
flags=(--corpus "$work/prompts" --chat --max-new-tokens 96 --slots 32 --temperature 0.8 --seed 1 --cpu-devices 1)

run() {  # run NAME BIN ROUND: prints "SECONDS TOKENS_PER_SECOND"
    local out="$work/$1$3.jsonl"
    "$2" generate --model "$model" "${flags[@]}" --out "$out" 2> "$work/$1.log" > "$work/$1.out" \
        || { cat "$work/$1.log" >&2; exit 1; }
    python3 -c 'import re,sys; m=re.search(r"(\d+) new tokens in ([0-9.]+) s", open(sys.argv[1]).read()); print(m.group(2), round(int(m.group(1))/float(m.group(2)), 1))' "$work/$1.out"
}

for round in $(seq 1 "${BENCH_ROUNDS:-2}"); do
    log "round $round: A $(run a "$siphon" "$round") (s, tokens/s)"
    if [[ -n "${SIPHON_BIN_B:-}" ]]; then
        log "round $round: B $(run b "$SIPHON_BIN_B" "$round") (s, tokens/s)"
        if cmp -s "$work/a$round.jsonl" "$work/b$round.jsonl"; then
            log "round $round: the completions are the same bytes"
        else
            log "round $round: the completions differ"
        fi
    fi
done
