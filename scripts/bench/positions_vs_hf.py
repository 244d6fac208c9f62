"""One row per document (issue 70): `siphon extract --pack isolated --positions last` against
the loop probe users write with HF transformers (`output_hidden_states=True`, batches of 32
right-padded prompts, each prompt's last non-padding token taken at 8 layers, saved as one
array), on the same labeled short prompts and the demo model (an HF f32 directory both read,
`latents_vs_delphi.py prepare`). Rounds interleave siphon and HF, each timed as the whole
process a user runs (model load and, for siphon, compile included). Also: the stored bytes of
`--positions last` against storing every token (`--pack isolated` alone, once), and the two
tools' rows compared (max relative difference).

    python positions_vs_hf.py bench --siphon BIN --model DIR --docs FILE --rounds 3
    python positions_vs_hf.py hf --model DIR --docs FILE --out FILE.npy   (one HF loop)
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, List

LAYERS = (3, 6, 9, 12, 15, 18, 21, 24)
BATCH = 32


def hf_loop(args: argparse.Namespace) -> None:
    """What a probe user writes: the last real token's hidden state at each layer."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32).eval()
    texts = [json.loads(line)["text"] for line in open(args.docs)]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rows: List[Any] = []
    with torch.no_grad():
        for start in range(0, len(texts), BATCH):
            # The tokenizer's own special tokens, as a user's call adds them (SmolLM2's: none;
            # siphon detects no BOS for it either).
            ids = [tokenizer(t)["input_ids"] for t in texts[start : start + BATCH]]
            width = max(map(len, ids))
            input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in ids])
            mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in ids])
            out = model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
            last = mask.sum(1) - 1
            at = torch.arange(len(ids))
            rows.append(torch.stack([out.hidden_states[layer + 1][at, last] for layer in LAYERS], 1).numpy())
    np.save(args.out, np.concatenate(rows))


def siphon_rows(run: str, hooks: List[str], n: int) -> Any:
    """`[n, layers, d]` of a siphon run's stored rows, by document (record) order."""
    import numpy as np
    from safetensors.numpy import load_file

    out = None
    for path in sorted(glob.glob(f"{run}/**/*.safetensors", recursive=True)):
        shard = load_file(path)
        docs = shard["doc_index"] & 0xFFFFFFFF
        x = np.stack([shard[h].astype(np.float32) for h in hooks], 1)
        if out is None:
            out = np.full((n, len(hooks), x.shape[-1]), np.nan, dtype=np.float32)
        out[docs] = x
    return out


def stored_bytes(run: str) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(f"{run}/**/*.safetensors", recursive=True))


def bench(args: argparse.Namespace) -> None:
    import numpy as np

    hooks = [f"blocks.{layer}.hook_resid_post" for layer in LAYERS]
    n = sum(1 for _ in open(args.docs))
    work = tempfile.mkdtemp()

    def siphon(name: str, *flags: str) -> float:
        cmd = [args.siphon, "extract", "--model", args.model, "--corpus", args.docs, "--cpu-devices", "1",
               "--hooks", ",".join(hooks), "--batch-size", "8", "--seq-len", "128", "--pack", "isolated",
               "--dtype", "f32", "--output", work, "--run", name, *flags]
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"siphon failed:\n{done.stderr[-4000:]}")
        return time.perf_counter() - start

    def hf(out: str) -> float:
        start = time.perf_counter()
        subprocess.run([sys.executable, __file__, "hf", "--model", args.model, "--docs", args.docs, "--out", out],
                       check=True)
        return time.perf_counter() - start

    siphon("all")
    every = stored_bytes(f"{work}/all")
    times_s, times_h = [], []
    for r in range(args.rounds):
        times_s.append(siphon(f"last{r}", "--positions", "last"))
        times_h.append(hf(f"{work}/hf.npy"))
        print(f"round {r + 1}: siphon {times_s[-1]:.1f} s, HF loop {times_h[-1]:.1f} s", file=sys.stderr)
    last = stored_bytes(f"{work}/last0")
    ours, theirs = siphon_rows(f"{work}/last0", hooks, n), np.load(f"{work}/hf.npy")
    scale = np.abs(theirs).max(axis=-1, keepdims=True)
    worst = float(np.nanmax(np.abs(ours - theirs) / scale))
    assert not np.isnan(ours).any(), "a document has no stored row"
    med = statistics.median
    print(f"| {n} prompts, {len(LAYERS)} layers, {args.rounds} rounds | siphon --positions last | HF loop | |")
    print("|---|---|---|---|")
    print(f"| wall s (median) | {med(times_s):.1f} | {med(times_h):.1f} | "
          f"{med(h / s for s, h in zip(times_s, times_h)):.2f}x faster |")
    print(f"| stored bytes | {last:,} | (every token: {every:,}) | {every / last:.1f}x smaller than every token |")
    print(f"| rows vs HF's (max abs difference / row scale) | {worst:.1e} | | |")


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--siphon", required=True)
    b.add_argument("--model", required=True)
    b.add_argument("--docs", required=True)
    b.add_argument("--rounds", type=int, default=3)
    h = sub.add_parser("hf")
    h.add_argument("--model", required=True)
    h.add_argument("--docs", required=True)
    h.add_argument("--out", required=True)
    args = parser.parse_args()
    bench(args) if args.cmd == "bench" else hf_loop(args)


if __name__ == "__main__":
    main()
