"""What `siphon extract --dtype fp8` costs in accuracy: the same tokens extracted as f32, bf16
and fp8, compared value by value and through a TopK SAE trained on each.

    python scripts/bench/fp8_error.py --siphon target/release/siphon --model GGUF --corpus DIR
    python scripts/bench/fp8_error.py --runs OUT/f32 OUT/bf16 OUT/fp8     # runs made before

(scripts/bench-fp8.sh sets up the plugin, model, corpus and venv and runs this.) Needs the
train venv (sae-lens 6.x, torch, numpy, ml_dtypes) and siphon's Python package on PYTHONPATH;
extracting needs SIPHON_PJRT_PLUGIN.

1. Extracts `--tokens` tokens of the demo shape (blocks 5 and 15 + ln_final.hook_normalized,
   batch 8 x 256, one CPU device) three times, --dtype f32, bf16 and fp8, with 1 MB shards
   (one batch a shard, so a run can be split at shard boundaries), and checks that the three
   runs hold the same tokens in the same order and shards.
2. Per hook and pair of dtypes (a against reference b): per token ||a - b|| / ||b|| (mean,
   median, p99, max) and max|a - b| / max|b| (mean, max); the shard bytes of each run.
3. Holds out the last ~10% of the tokens (whole shards), and trains a TopK SAE with SAELens's
   SAETrainer through `siphon.torch.data_provider` on the rest of `--sae-hook`: once from the
   bf16 run, once from the fp8 run (same seed, same data order, same hyperparameters), and
   once more from bf16 with another seed (how much two SAEs differ anyway). Each SAE's FVU is
   measured on the held-out tokens of every run. Tokens whose reference norm is more than
   `--outlier-factor` times the median (the model's attention-sink tokens, ~0.4% of them at
   norms ~100x the median, which would own the squared error) are left out of training and of
   the FVU; the FVU with them is reported too.
4. Prints markdown tables and writes everything as JSON (`--json`).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np

DTYPES = ("f32", "bf16", "fp8")
HOOKS = ("blocks.5.hook_resid_post", "blocks.15.hook_resid_post", "ln_final.hook_normalized")
# (a, reference b) pairs of the value comparison.
PAIRS = (("bf16", "f32"), ("fp8", "f32"), ("fp8", "bf16"))


def log(msg: str) -> None:
    print(f"[fp8_error] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------- extract


def extract(args: argparse.Namespace, out: str, dtype: str) -> Dict[str, Any]:
    cmd = [
        args.siphon, "extract", "--model", args.model, "--corpus", args.corpus,
        "--layers", "5,15", "--hooks", "ln_final.hook_normalized",
        "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size),
        "--max-tokens", str(args.tokens), "--dtype", dtype, "--cpu-devices", "1",
        "--shard-size-mb", "1", "--log-format", "plain", "--output", out, "--run", dtype,
    ]
    log(f"extracting {args.tokens} tokens as {dtype}: {' '.join(cmd)}")
    logfile = os.path.join(out, f"extract-{dtype}.log")
    start = time.monotonic()
    with open(logfile, "w") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        with open(logfile) as f:
            tail = f.read()[-4000:]
        raise SystemExit(f"siphon extract --dtype {dtype} failed (exit {done.returncode}); the end of its log:\n{tail}")
    log(f"  {dtype}: {seconds:.0f} s")
    return {"wall_s": seconds, "log": logfile}


def timing_of(run: str) -> Optional[Dict[str, Any]]:
    d = os.path.join(run, "timing")
    if not os.path.isdir(d):
        return None
    records = [json.load(open(os.path.join(d, f))) for f in sorted(os.listdir(d)) if f.endswith(".json")]
    tokens = sum(r["tokens"] for r in records)
    seconds = max(r["seconds"] for r in records)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds if seconds else None}


# ------------------------------------------------------------------------------------- compare


def row_stats(a: np.ndarray, b: np.ndarray) -> Dict[str, float]:
    """Per token ||a-b||/||b|| and max|a-b|/max|b| of float32 rows, summarised."""
    d = (a - b).astype(np.float64)
    bb = b.astype(np.float64)
    rel = np.linalg.norm(d, axis=1) / np.maximum(np.linalg.norm(bb, axis=1), 1e-30)
    amax = np.abs(d).max(axis=1) / np.maximum(np.abs(bb).max(axis=1), 1e-30)
    return {
        "rel_l2_mean": float(rel.mean()),
        "rel_l2_median": float(np.median(rel)),
        "rel_l2_p99": float(np.quantile(rel, 0.99)),
        "rel_l2_max": float(rel.max()),
        "maxabs_over_rowmax_mean": float(amax.mean()),
        "maxabs_over_rowmax_max": float(amax.max()),
    }


def sorted_shards(ds: Any) -> List[Any]:
    return sorted(ds.shards, key=lambda s: (s.host, s.index))


def compare(runs: Dict[str, Any]) -> Dict[str, Any]:
    import siphon

    ref = runs["f32"]
    # Same tokens, same order, same shard boundaries: else nothing below compares like with like.
    counts = {k: [s.tokens for s in sorted_shards(ds)] for k, ds in runs.items()}
    for k, c in counts.items():
        if c != counts["f32"]:
            raise SystemExit(f"the {k} run's shards hold {c} tokens, the f32 run's {counts['f32']}")
    stored: Dict[str, Dict[str, np.ndarray]] = {}
    for k, ds in runs.items():
        b = ds.read([HOOKS[0]])
        stored[k] = {"token_ids": b["token_ids"], "position": b["position"]}
        for h in HOOKS:
            if ds.hooks[h].shape != (576,):
                raise SystemExit(f"{k}: hook {h} has shape {ds.hooks[h].shape}")
    for k in runs:
        for col in ("token_ids", "position"):
            if not np.array_equal(stored[k][col], stored["f32"][col]):
                raise SystemExit(f"the {k} run's {col} differ from the f32 run's: not the same tokens")
    out: Dict[str, Any] = {"tokens": int(ref.tokens), "shards": len(ref.shards), "hooks": {}, "bytes": {}}
    for k, ds in runs.items():
        out["bytes"][k] = {
            "shard_bytes": int(ds.nbytes),
            "bytes_per_token": ds.nbytes / ds.tokens,
            "stored_dtype": ds.dtype,
        }
    for k in runs:
        out["bytes"][k]["vs_bf16"] = out["bytes"][k]["shard_bytes"] / out["bytes"]["bf16"]["shard_bytes"]
    for h in HOOKS:
        x = {k: ds.read([h], dtype="float32")[h] for k, ds in runs.items()}
        for k, v in x.items():
            if v.dtype != np.float32 or not np.isfinite(v).all():
                raise SystemExit(f"{k} {h}: read as {v.dtype}, finite: {bool(np.isfinite(v).all())}")
        norms = np.linalg.norm(x["f32"].astype(np.float64), axis=1)
        out["hooks"][h] = {
            "norm_median": float(np.median(norms)),
            "norm_max": float(norms.max()),
            "pairs": {f"{a} vs {b}": row_stats(x[a], x[b]) for a, b in PAIRS},
        }
        del x
    return out


# ------------------------------------------------------------------------------------- SAE


def subset(ds: Any, shards: Sequence[Any]) -> Any:
    """The same run, with only `shards` visible (a token range of it)."""
    part = copy.copy(ds)
    part.shards = list(shards)
    return part


class DropOutliers(Iterator[Any]):
    """The [batch, d] tensors of a provider without the rows whose norm exceeds `limit`,
    re-batched to `batch` rows."""

    def __init__(self, provider: Iterator[Any], limit: float, batch: int) -> None:
        import torch

        self.provider, self.limit, self.batch = provider, limit, batch
        self.pending = torch.zeros(0, 0)
        self.dropped = 0
        self.seen = 0

    def __iter__(self) -> "DropOutliers":
        return self

    def __next__(self) -> Any:
        import torch

        parts = [self.pending] if self.pending.numel() else []
        have = self.pending.shape[0] if self.pending.numel() else 0
        while have < self.batch:
            x = next(self.provider)
            keep = x.norm(dim=1) <= self.limit
            self.seen += x.shape[0]
            self.dropped += int((~keep).sum())
            parts.append(x[keep])
            have += int(keep.sum())
        allx = torch.cat(parts)
        self.pending = allx[self.batch :]
        return allx[: self.batch]


def evaluate(sae: Any, x: np.ndarray, chunk: int = 4096) -> Dict[str, float]:
    """FVU, the fraction of variance unexplained (sum ||x - sae(x)||^2 / sum ||x - mean(x)||^2),
    and the latents that never fire on `x`."""
    import torch

    xt = torch.from_numpy(x)
    err = 0.0
    fired = torch.zeros(sae.cfg.d_sae, dtype=torch.bool)
    with torch.no_grad():
        for i in range(0, xt.shape[0], chunk):
            xb = xt[i : i + chunk]
            acts = sae.encode(xb)
            fired |= (acts != 0).any(dim=0)
            err += float(((sae.decode(acts) - xb).double() ** 2).sum())
    var = float(((xt.double() - xt.double().mean(0)) ** 2).sum())
    return {"fvu": err / var, "dead": int((~fired).sum())}


def train_sae(args: argparse.Namespace, train_ds: Any, limit: float, seed: int) -> Dict[str, Any]:
    import torch
    import siphon.torch
    from sae_lens import TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.config import SAETrainerConfig
    from sae_lens.training.sae_trainer import SAETrainer

    torch.manual_seed(seed)
    sae = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=576, d_sae=args.d_sae, k=args.k,
                                                normalize_activations="expected_average_only_in"))
    raw = siphon.torch.data_provider(train_ds, args.sae_hook, batch_size=args.sae_batch, seed=seed,
                                     dtype="float32", num_workers=0)
    data = DropOutliers(raw, limit, args.sae_batch)
    steps = args.train_samples // args.sae_batch
    cfg = SAETrainerConfig(
        total_training_samples=steps * args.sae_batch,
        train_batch_size_samples=args.sae_batch,
        lr=args.lr,
        lr_end=args.lr / 10,
        lr_decay_steps=steps // 5,
        device="cpu",
        n_batches_for_norm_estimate=20,
    )
    trainer = SAETrainer(cfg, sae, data_provider=data)
    start = time.monotonic()
    trained = trainer.fit()
    seconds = time.monotonic() - start
    trained.eval()
    return {
        "sae": trained,
        "seconds": seconds,
        "steps": trainer.n_training_steps,
        "samples": trainer.n_training_samples,
        "l0": trained.cfg.metadata.l0,
        "rows_read": data.seen,
        "rows_dropped": data.dropped,
    }


def saes(args: argparse.Namespace, runs: Dict[str, Any]) -> Dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    h = args.sae_hook
    shards = {k: sorted_shards(ds) for k, ds in runs.items()}
    n = len(shards["f32"])
    hold = max(1, round(args.holdout * n))
    if n - hold < 2:
        raise SystemExit(f"{n} shards: too few to hold some out (the runs need ~1 MB shards)")
    train = {k: subset(ds, shards[k][: n - hold]) for k, ds in runs.items()}
    held = {k: subset(ds, shards[k][n - hold :]) for k, ds in runs.items()}
    x_held = {k: d.read([h], dtype="float32")[h] for k, d in held.items()}
    ref_train = train["f32"].read([h], dtype="float32")[h]
    median = float(np.median(np.linalg.norm(ref_train, axis=1)))
    limit = args.outlier_factor * median
    del ref_train
    keep = np.linalg.norm(x_held["f32"], axis=1) <= limit
    out: Dict[str, Any] = {
        "hook": h, "d_sae": args.d_sae, "k": args.k, "batch": args.sae_batch, "lr": args.lr,
        "train_tokens": int(train["f32"].tokens), "held_out_tokens": int(held["f32"].tokens),
        "held_out_shards": hold, "outlier_limit": limit, "held_out_outliers": int((~keep).sum()),
        "saes": {},
    }
    log(f"SAE on {h}: {out['train_tokens']} training tokens, {out['held_out_tokens']} held out "
        f"({hold} of {n} shards); norm limit {limit:.0f} ({args.outlier_factor:g} x median {median:.1f}), "
        f"{out['held_out_outliers']} held-out tokens above it")
    plan = [("bf16", args.seed), ("fp8", args.seed)]
    if args.seed_baseline:
        plan.append(("bf16", args.seed + 1))
    for source, seed in plan:
        name = f"{source} seed {seed}"
        log(f"training the SAE from the {source} run, seed {seed}, {args.train_samples} samples")
        r = train_sae(args, train[source], limit, seed)
        sae = r.pop("sae")
        r["source"], r["seed"] = source, seed
        evals = {k: evaluate(sae, x[keep]) for k, x in x_held.items()}
        r["fvu"] = {k: e["fvu"] for k, e in evals.items()}
        r["dead_on_held_out_f32"] = evals["f32"]["dead"]
        r["fvu_with_outliers"] = {k: evaluate(sae, x)["fvu"] for k, x in x_held.items()}
        log(f"  {name}: {r['seconds']:.0f} s, FVU " + ", ".join(f"{k} {v:.4f}" for k, v in r["fvu"].items()))
        out["saes"][name] = r
    return out


# ------------------------------------------------------------------------------------- report


def tables(res: Dict[str, Any]) -> str:
    lines: List[str] = []
    v = res["values"]
    lines.append(f"Value error, {v['tokens']} tokens per run (per token; rel = ||a-b||/||b||, "
                 "maxabs = max|a-b| / max|b| of the row)\n")
    lines.append("| hook | a vs b | rel mean | rel median | rel p99 | rel max | maxabs mean | maxabs max |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|")
    for h, hv in v["hooks"].items():
        for pair, s in hv["pairs"].items():
            lines.append(f"| {h} | {pair} | {s['rel_l2_mean']:.2e} | {s['rel_l2_median']:.2e} | {s['rel_l2_p99']:.2e} "
                         f"| {s['rel_l2_max']:.2e} | {s['maxabs_over_rowmax_mean']:.2e} | {s['maxabs_over_rowmax_max']:.2e} |")
    lines.append("")
    lines.append("| run | stored dtype | shard bytes | bytes/token | vs bf16 | extract tok/s |")
    lines.append("|---|---|---:|---:|---:|---:|")
    for k, b in v["bytes"].items():
        t = (res.get("extract") or {}).get(k, {}).get("timing") or {}
        rate = f"{t['tokens_per_s']:.0f}" if t.get("tokens_per_s") else "-"
        lines.append(f"| {k} | {b['stored_dtype']} | {b['shard_bytes']:,} | {b['bytes_per_token']:.0f} | {b['vs_bf16']:.3f} | {rate} |")
    s = res.get("sae")
    if s:
        lines.append("")
        lines.append(f"TopK SAE on {s['hook']} (d_sae {s['d_sae']}, k {s['k']}, batch {s['batch']}, lr {s['lr']:g}): "
                     f"{s['train_tokens']} training tokens, FVU on the {s['held_out_tokens']} held-out tokens of each run "
                     f"(without the {s['held_out_outliers']} above norm {s['outlier_limit']:.0f}; last column: with them). "
                     "Dead latents: never active on the f32 held-out tokens.\n")
        lines.append("| trained from | samples | steps | FVU f32 held-out | FVU bf16 held-out | FVU fp8 held-out "
                     "| dead latents | train s | FVU f32 incl. outliers |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name, r in s["saes"].items():
            f, fo = r["fvu"], r["fvu_with_outliers"]
            lines.append(f"| {name} | {r['samples']:,} | {r['steps']} | {f['f32']:.4f} | {f['bf16']:.4f} | {f['fp8']:.4f} "
                         f"| {r['dead_on_held_out_f32']} | {r['seconds']:.0f} | {fo['f32']:.4f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs=3, metavar=("F32", "BF16", "FP8"), help="run directories made before (skip extracting)")
    p.add_argument("--siphon", default="target/release/siphon")
    p.add_argument("--model")
    p.add_argument("--corpus")
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--out", help="where the runs go (default: a temporary directory, removed at the end)")
    p.add_argument("--json", default="out/fp8_error.json", help="where the results go (its directory is made)")
    p.add_argument("--sae-hook", default="blocks.15.hook_resid_post")
    p.add_argument("--no-sae", action="store_true", help="only the value comparison")
    p.add_argument("--d-sae", type=int, default=2304)
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--sae-batch", type=int, default=256)
    p.add_argument("--train-samples", type=int, default=100_000,
                   help="training samples per SAE (default: ~1.7 epochs of the ~59k training tokens of 65536)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-seed-baseline", dest="seed_baseline", action="store_false",
                   help="skip the second bf16 SAE (seed + 1)")
    p.add_argument("--holdout", type=float, default=0.1, help="fraction of the shards held out, the last ones")
    p.add_argument("--outlier-factor", type=float, default=10.0)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = p.parse_args()
    os.environ.setdefault("TQDM_DISABLE", "1")  # SAELens's progress bars

    import siphon

    start = time.monotonic()
    res: Dict[str, Any] = {"args": {k: v for k, v in vars(args).items()}}
    tmp = None
    if args.runs:
        paths = dict(zip(DTYPES, args.runs))
    else:
        if not (args.model and args.corpus):
            p.error("give --model and --corpus to extract, or --runs")
        out = args.out or tempfile.mkdtemp(prefix="siphon-fp8-")
        tmp = None if args.out else out
        os.makedirs(out, exist_ok=True)
        res["extract"] = {}
        try:
            for k in DTYPES:
                res["extract"][k] = extract(args, out, k)
        except BaseException:
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        paths = {k: os.path.join(out, k) for k in DTYPES}
    try:
        res.setdefault("extract", {})
        for k, path in paths.items():
            res["extract"].setdefault(k, {})["timing"] = timing_of(path)
        runs = {k: siphon.open_dataset(path) for k, path in paths.items()}
        want = {"f32": "float32", "bf16": "bfloat16", "fp8": "float8_e4m3fn"}
        for k, ds in runs.items():
            if ds.dtype != want[k]:
                raise SystemExit(f"{paths[k]} is stored as {ds.dtype}, expected {want[k]} for the {k} run")
            ds.verify(hashes=True)
        log(f"comparing values: {', '.join(f'{k} {ds!r}' for k, ds in runs.items())}")
        t = time.monotonic()
        res["values"] = compare(runs)
        res["compare_s"] = time.monotonic() - t
        if not args.no_sae:
            res["sae"] = saes(args, runs)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    res["total_s"] = time.monotonic() - start
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(res, f, indent=2)
    print(tables(res))
    print(f"\ntotal {res['total_s']:.0f} s; results in {args.json}")


if __name__ == "__main__":
    main()
