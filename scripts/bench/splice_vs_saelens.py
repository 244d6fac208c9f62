"""siphon's spliced evaluation (`extract --sae DIR --splice`) against SAELens's `run_evals` loop
on the same token rows (issue 68): the demo model as an HF f32 directory and a random TopK SAE
saved by SAELens (`latents_vs_delphi.py prepare`), at blocks.15.hook_resid_post.

The peer is what SAELens's `get_recons_loss` does per batch, on HF transformers: three forwards
(clean; the hook's output replaced by `sae.decode(sae.encode(x))`; replaced by zeros), each
token's CE from `log_softmax` and the KL from the clean distribution — on the rows siphon stored
(read back from its run, so both see the same tokens). torch uses every CPU.

    python splice_vs_saelens.py bench --siphon BIN --model DIR --sae DIR --corpus DIR \
        --tokens 16384 --rounds 2 [-- extra siphon flags]
"""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Tuple

REPO = pathlib.Path(__file__).resolve().parents[2]
SEQ, BATCH = 128, 8


def siphon_round(args: argparse.Namespace, extra: List[str], out: pathlib.Path) -> Dict[str, Any]:
    cmd = [args.siphon, "extract", "--model", args.model, "--corpus", args.corpus, "--sae", args.sae, "--splice",
           "--seq-len", str(SEQ), "--batch-size", str(BATCH), "--max-tokens", str(args.tokens), "--keep-excluded",
           "--cpu-devices", "1", "--output", str(out), "--run", "splice", *extra]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"siphon failed:\n{done.stderr[-4000:]}")
    timing = [json.loads(f.read_text()) for f in (out / "splice" / "timing").glob("*.json")]
    return {"wall": wall, "loop_s": max(t["seconds"] for t in timing), "tokens": sum(t["tokens"] for t in timing)}


def stored_rows(run: pathlib.Path, hook: str) -> Tuple[Any, Any]:
    """The run's rows in order (token ids [n, SEQ]; every token is stored, `--keep-excluded`, no
    shuffle) and each token's spliced NLL, read from its shards."""
    import numpy as np
    from safetensors import safe_open

    ids, nll = [], []
    for host in sorted(p for p in run.iterdir() if p.name.startswith("machine_")):
        for line in (host / "manifest.jsonl").read_text().splitlines():
            with safe_open(str(host / json.loads(line)["shard"]), framework="np") as f:
                ids.append(f.get_tensor("token_ids"))
                nll.append(f.get_tensor(f"output.nll.spliced.{hook}"))
    return np.concatenate(ids).reshape(-1, SEQ), np.concatenate(nll).reshape(-1, SEQ)


def saelens_round(args: argparse.Namespace, ids: Any) -> Dict[str, Any]:
    import torch
    import transformers
    from sae_lens import SAE

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.eval()
    sae = SAE.load_from_disk(args.sae, device="cpu")
    layer = model.model.layers[args.layer]
    replace: Dict[str, Any] = {"f": None}

    def hook(_module: Any, _args: Any, out: Any) -> Any:
        if replace["f"] is None:
            return out
        h = out[0] if isinstance(out, tuple) else out
        h = replace["f"](h)
        return (h, *out[1:]) if isinstance(out, tuple) else h

    handle = layer.register_forward_hook(hook)
    rows = torch.from_numpy(ids).long()
    nll_spliced = []
    start = time.perf_counter()
    with torch.no_grad():
        for b in range(0, len(rows), BATCH):
            batch = rows[b:b + BATCH]
            logp = {}
            for name, f in (("clean", None), ("spliced", lambda x: sae.decode(sae.encode(x))),
                            ("ablated", torch.zeros_like)):
                replace["f"] = f
                logp[name] = torch.log_softmax(model(input_ids=batch).logits.float(), dim=-1)
            nxt = batch[:, 1:]
            ce = {k: -v[:, :-1].gather(-1, nxt.unsqueeze(-1)).squeeze(-1) for k, v in logp.items()}
            _kl = {k: (logp["clean"].exp() * (logp["clean"] - logp[k])).sum(-1) for k in ("spliced", "ablated")}
            nll_spliced.append(ce["spliced"])
    seconds = time.perf_counter() - start
    handle.remove()
    return {"loop_s": seconds, "tokens": int(rows.numel()), "nll_spliced": torch.cat(nll_spliced).numpy()}


def bench(args: argparse.Namespace, extra: List[str]) -> None:
    import numpy as np

    work = pathlib.Path(args.work)
    hook = f"blocks.{args.layer}.hook_resid_post"
    runs: List[Tuple[Dict[str, Any], Dict[str, Any]]] = []
    for r in range(args.rounds):
        out = work / f"round{r}"
        shutil.rmtree(out, ignore_errors=True)
        ours = siphon_round(args, extra, out)
        ids, spliced = stored_rows(out / "splice", hook)
        theirs = saelens_round(args, ids)
        # The same rows: each token's spliced NLL (siphon's has a NaN at each row's end).
        diff = float(np.nanmax(np.abs(spliced[:, :-1] - theirs["nll_spliced"])))
        print(f"round {r}: siphon {ours['tokens'] / ours['wall']:.0f} tokens/s ({ours['wall']:.1f} s whole, "
              f"{ours['tokens'] / ours['loop_s']:.0f} in its loop), SAELens loop {theirs['tokens'] / theirs['loop_s']:.0f} "
              f"tokens/s ({theirs['loop_s']:.1f} s); spliced NLLs differ by at most {diff:.2e}", file=sys.stderr)
        runs.append((ours, theirs))
    whole = statistics.median(o["tokens"] / o["wall"] for o, _ in runs)
    loop = statistics.median(o["tokens"] / o["loop_s"] for o, _ in runs)
    peer = statistics.median(t["tokens"] / t["loop_s"] for _, t in runs)
    print(f"| {runs[0][0]['tokens']} tokens, {len(runs)} rounds | tokens/s (median) |")
    print("|---|---|")
    print(f"| siphon extract --splice, whole command (load, compile, write) | {whole:.0f} |")
    print(f"| siphon, its loop | {loop:.0f} |")
    print(f"| SAELens run_evals' loop (3 HF forwards a batch) | {peer:.0f} |")
    print(f"| siphon whole / SAELens loop | {whole / peer:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench")
    for a in ("--siphon", "--model", "--sae", "--corpus", "--work"):
        b.add_argument(a, required=True)
    b.add_argument("--layer", type=int, default=15)
    b.add_argument("--tokens", type=int, default=16384)
    b.add_argument("--rounds", type=int, default=2)
    args, extra = parser.parse_known_args()
    bench(args, [e for e in extra if e != "--"])


if __name__ == "__main__":
    main()
