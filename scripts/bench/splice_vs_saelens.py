"""siphon's spliced evaluation (`extract --sae DIR --splice`) against SAELens's `run_evals` loop
on the same token rows (issue 68): the demo model as an HF f32 directory and a random TopK SAE
saved by SAELens (`latents_vs_delphi.py prepare`), at blocks.15.hook_resid_post.

The peer is SAELens's `run_evals` itself, on the demo model as a HookedTransformer (built
offline from the same directory, no weight processing): per batch its three forwards for CE and KL
(clean; the hook replaced by `sae.decode(sae.encode(x))`; zero-ablated) and a fourth to the
hook's layer for explained variance and L0, over every batch — on the rows siphon stored (read
back from its run, so both see the same tokens), its metrics checked against siphon's stats.json.
torch uses every CPU.

    python splice_vs_saelens.py bench --siphon BIN --model DIR --sae DIR --corpus DIR \
        --tokens 65536 --rounds 2 [-- extra siphon flags]
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


def stored_rows(run: pathlib.Path) -> Any:
    """The run's rows in order (token ids [n, SEQ]; every token is stored, `--keep-excluded`, no
    shuffle), read from its shards."""
    import numpy as np
    from safetensors import safe_open

    ids = []
    for host in sorted(p for p in run.iterdir() if p.name.startswith("machine_")):
        for line in (host / "manifest.jsonl").read_text().splitlines():
            with safe_open(str(host / json.loads(line)["shard"]), framework="np") as f:
                ids.append(f.get_tensor("token_ids"))
    return np.concatenate(ids).reshape(-1, SEQ)


def metric_differences(run: pathlib.Path, theirs: Dict[str, Dict[str, float]]) -> Dict[str, float]:
    """The relative difference of each metric siphon's stats.json gives (`siphon.outputs`) from
    run_evals' of the same name."""
    sys.path.insert(0, str(REPO / "python"))
    from siphon.outputs import splice_metrics

    (ours,) = splice_metrics(json.loads((run / "stats.json").read_text())).values()
    flat = {k: v for group in theirs.values() for k, v in group.items()}
    pairs = {"ce_clean": "ce_loss_without_sae", "ce_spliced": "ce_loss_with_sae", "ce_ablated": "ce_loss_with_ablation",
             "ce_loss_score": "ce_loss_score", "kl_spliced": "kl_div_with_sae", "kl_ablated": "kl_div_with_ablation",
             "kl_div_score": "kl_div_score"}
    return {k: abs(ours[k] - flat[v]) / max(abs(flat[v]), 1e-12) for k, v in pairs.items()}


class Rows:
    """SAELens's ActivationsStore as run_evals uses it, over given token rows: batches of them in
    order, from the first again after each `reset_input_dataset`."""

    def __init__(self, ids: Any) -> None:
        import torch

        self.rows = torch.from_numpy(ids).long()
        self.context_size = self.rows.shape[1]
        self.store_batch_size_prompts = BATCH
        self.next = 0

    def get_batch_tokens(self, n: int) -> Any:
        batch = self.rows[self.next:self.next + n]
        self.next += n
        return batch

    def reset_input_dataset(self) -> None:
        self.next = 0


def hooked_transformer(model_dir: str) -> Any:
    """The demo model (Llama architecture) as a HookedTransformer, built offline from its HF
    directory the way TransformerLens's `from_pretrained_no_processing` builds a Llama (its config
    fields, `convert_llama_weights`, no weight processing)."""
    import torch
    import transformers
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights

    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    c = hf.config
    d_head = c.hidden_size // c.num_attention_heads
    cfg = HookedTransformerConfig(
        d_model=c.hidden_size, d_head=d_head, n_heads=c.num_attention_heads, d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers, n_ctx=c.max_position_embeddings, eps=c.rms_norm_eps, d_vocab=c.vocab_size,
        act_fn=c.hidden_act, n_key_value_heads=c.num_key_value_heads, normalization_type="RMS",
        positional_embedding_type="rotary", rotary_adjacent_pairs=False, rotary_dim=d_head,
        rotary_base=c.rope_parameters["rope_theta"], final_rms=True, gated_mlp=True,
        original_architecture="LlamaForCausalLM", dtype=torch.float32, default_prepend_bos=False)
    model = HookedTransformer(cfg, tokenizer=transformers.AutoTokenizer.from_pretrained(model_dir))
    model.load_and_process_state_dict(convert_llama_weights(hf, cfg), fold_ln=False, center_writing_weights=False,
                                      center_unembed=False, fold_value_biases=False)
    model.eval()
    return model


def saelens_round(args: argparse.Namespace, ids: Any) -> Dict[str, Any]:
    """SAELens's `run_evals` itself on a HookedTransformer over the rows: the reconstruction
    metrics (CE, KL: three forwards a batch) and the variance and sparsity ones (a fourth forward
    to the hook's layer) over every batch, as siphon computes them over every token; the
    tokenizer's special tokens left out of the means, as siphon leaves them out."""
    import torch
    from sae_lens import SAE
    from sae_lens.evals import EvalConfig, run_evals
    from sae_lens.training.activation_scaler import ActivationScaler

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    model = hooked_transformer(args.model)
    sae = SAE.load_from_disk(args.sae, device="cpu")
    batches = len(ids) // BATCH
    config = EvalConfig(batch_size_prompts=BATCH, n_eval_reconstruction_batches=batches, compute_kl=True,
                        compute_ce_loss=True, n_eval_sparsity_variance_batches=batches,
                        compute_sparsity_metrics=True, compute_variance_metrics=True)
    start = time.perf_counter()
    with torch.no_grad():
        metrics, _ = run_evals(sae, Rows(ids[:batches * BATCH]), model, ActivationScaler(), config,
                               exclude_special_tokens=list(model.tokenizer.all_special_ids))
    seconds = time.perf_counter() - start
    return {"loop_s": seconds, "tokens": batches * BATCH * ids.shape[1], "metrics": metrics}


def bench(args: argparse.Namespace, extra: List[str]) -> None:
    import numpy as np

    work = pathlib.Path(args.work)
    runs: List[Tuple[Dict[str, Any], Dict[str, Any]]] = []
    for r in range(args.rounds):
        out = work / f"round{r}"
        shutil.rmtree(out, ignore_errors=True)
        ours = siphon_round(args, extra, out)
        ids = stored_rows(out / "splice")
        theirs = saelens_round(args, ids)
        diff = metric_differences(out / "splice", theirs["metrics"])
        print(f"round {r}: siphon {ours['tokens'] / ours['wall']:.0f} tokens/s ({ours['wall']:.1f} s whole, "
              f"{ours['tokens'] / ours['loop_s']:.0f} in its loop), SAELens run_evals "
              f"{theirs['tokens'] / theirs['loop_s']:.0f} tokens/s ({theirs['loop_s']:.1f} s); metrics' largest "
              f"relative difference {max(diff.values()):.1e} ({', '.join(f'{k} {v:.1e}' for k, v in diff.items())})",
              file=sys.stderr)
        runs.append((ours, theirs))
    whole = statistics.median(o["tokens"] / o["wall"] for o, _ in runs)
    loop = statistics.median(o["tokens"] / o["loop_s"] for o, _ in runs)
    peer = statistics.median(t["tokens"] / t["loop_s"] for _, t in runs)
    print(f"| {runs[0][0]['tokens']} tokens, {len(runs)} rounds | tokens/s (median) |")
    print("|---|---|")
    print(f"| siphon extract --splice, whole command (load, compile, write) | {whole:.0f} |")
    print(f"| siphon, its loop | {loop:.0f} |")
    print(f"| SAELens run_evals (HookedTransformer; CE, KL, variance, L0 over every batch) | {peer:.0f} |")
    print(f"| siphon whole / run_evals | {whole / peer:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench")
    for a in ("--siphon", "--model", "--sae", "--corpus", "--work"):
        b.add_argument(a, required=True)
    b.add_argument("--tokens", type=int, default=65536)
    b.add_argument("--rounds", type=int, default=2)
    args, extra = parser.parse_known_args()
    bench(args, [e for e in extra if e != "--"])


if __name__ == "__main__":
    main()
