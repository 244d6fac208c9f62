"""siphon's greedy decoding (`siphon generate`) against HF transformers' `generate` on the same
prompts (issue 69): the demo model as an HF f32 directory both read
(`latents_vs_delphi.py prepare`), 32 prompts (the first 100 characters of the first 32 long
records of the demo corpus, tokenized once by HF's tokenizer), 128 new tokens each, no end
token, batch 32 (HF: left-padded, as its docs ask; siphon: 32 slots). Each round runs siphon
then HF, each timing its decoding only (siphon's own count of its decoding loop, compiles
included; HF's `generate` call): new tokens per second. torch uses every CPU.

    python generate_vs_hf.py bench --siphon BIN --model DIR --corpus DIR --rounds 2 \
        [--new-tokens 128] [-- extra siphon flags]
"""

import argparse
import json
import pathlib
import re
import statistics
import subprocess
import tempfile
import time
from typing import Any, Dict, List

BATCH = 32


def prompts(corpus: str, tokenizer: Any) -> List[List[int]]:
    import pyarrow.parquet as pq

    first = sorted(pathlib.Path(corpus).glob("*.parquet"))[0]
    texts = [t for t in pq.read_table(first).column("text").to_pylist() if t and len(t) > 80][:BATCH]
    return [tokenizer(t[:100])["input_ids"] for t in texts]


def siphon_round(args: argparse.Namespace, ids_file: pathlib.Path, work: pathlib.Path, extra: List[str]) -> Dict[str, Any]:
    out = work / "siphon.jsonl"
    out.unlink(missing_ok=True)  # generate refuses to write over an earlier round's file
    cmd = [args.siphon, "generate", "--model", args.model, "--ids", str(ids_file), "--max-new-tokens",
           str(args.new_tokens), "--ignore-eos", "--slots", str(BATCH), "--cpu-devices", "1", "--out", str(out), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"siphon failed:\n{done.stderr[-4000:]}")
    m = re.search(r"(\d+) new tokens in ([0-9.]+) s", done.stdout)
    assert m, done.stdout
    completions = [json.loads(line)["completion_ids"] for line in out.read_text().splitlines()]
    return {"tokens": int(m.group(1)), "seconds": float(m.group(2)), "completions": completions}


def hf_round(args: argparse.Namespace, model: Any, ids: List[List[int]], pad: int) -> Dict[str, Any]:
    import torch

    width = max(map(len, ids))
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in ids])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids])
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=mask, do_sample=False,
                             max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                             eos_token_id=None, pad_token_id=pad)
    seconds = time.perf_counter() - start
    completions = out[:, width:].tolist()
    return {"tokens": sum(map(len, completions)), "seconds": seconds, "completions": completions}


def bench(args: argparse.Namespace, extra: List[str]) -> None:
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.eval()
    ids = prompts(args.corpus, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        ids_file = work / "prompts.json"
        ids_file.write_text(json.dumps(ids))
        rows: Dict[str, List[float]] = {"siphon": [], "hf": []}
        agree = []
        for r in range(args.rounds):
            s = siphon_round(args, ids_file, work, extra)
            h = hf_round(args, model, ids, pad)
            for name, got in (("siphon", s), ("hf", h)):
                rows[name].append(got["tokens"] / got["seconds"])
                print(f"round {r} {name}: {got['tokens']} tokens in {got['seconds']:.2f} s", flush=True)
            # Greedy completions token for token (up to a first difference, which near ties
            # of a real model at f32 may cause).
            agree.append(sum(a == b for a, b in zip(s["completions"], h["completions"])))
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"\n| prompts × new tokens | siphon tokens/s | HF generate tokens/s | ratio | completions equal |")
    print(f"|---|---|---|---|---|")
    print(f"| {BATCH} × {args.new_tokens} | {med['siphon']:.1f} | {med['hf']:.1f} | "
          f"{med['siphon'] / med['hf']:.2f}× | {min(agree)} of {BATCH} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--siphon", required=True)
    b.add_argument("--model", required=True)
    b.add_argument("--corpus", required=True)
    b.add_argument("--rounds", type=int, default=2)
    b.add_argument("--new-tokens", type=int, default=128)
    args, extra = ap.parse_known_args()
    extra = [e for e in extra if e != "--"]
    bench(args, extra)


if __name__ == "__main__":
    main()
