"""siphon's dictionary latents against delphi's own ``LatentCache`` (EleutherAI/delphi, PyPI
eai-delphi) on the same model, dictionary, token rows and machine (issue 47). Run by
scripts/bench-latents.sh in a venv with delphi, SAELens, transformers and gguf::

    # once: the demo GGUF as an HF f32 directory, and a random 16k-latent TopK SAE (SAELens)
    latents_vs_delphi.py prepare --gguf SmolLM2-135M-Instruct.Q4_1.gguf --model-out HF_DIR \
        --sae-out SAE_DIR --layer 15 --width 16384 --k 32
    # the benchmark: interleaved rounds (siphon, delphi, siphon, delphi, ...) per token count
    latents_vs_delphi.py bench --siphon BIN --model HF_DIR --sae SAE_DIR --corpus CORPUS \
        --layer 15 --tokens 16384,65536 --rounds 2 --batch-size 32 --work DIR [-- EXTRACT_FLAGS...]

A siphon run is `siphon extract --sae SAE_DIR --keep-excluded --max-tokens N` (the latents alone,
not the hook they read) as one host (one process, the CPU plugin, one device), then `python -m siphon
export-delphi RUN OUT --keep-excluded-latents` (delphi's layout). A delphi run is a fresh
Python process: `AutoModel.from_pretrained(HF_DIR, float32)`, the SAE's own encoder
(`SAE.load_from_disk(SAE_DIR).encode`, as delphi takes a SAELens dictionary),
`LatentCache(model, {"layers.L": encode}, batch_size).run(n_tokens, tokens)`, `save_splits`,
`save_config`, on exactly the token rows ``[n_seq, ctx]`` of the first siphon run of that
count (later siphon runs are checked to give the same rows). Per run: wall seconds from the
process's start to its exit (loading and compiling included), the loop's own seconds (siphon's
timing record; delphi's ``LatentCache.run``), peak RSS (GNU time's, `/usr/bin/time -f %M`), and
the bytes of the files written. After the first round of each count, siphon's export is compared
with delphi's cache (delphi_compare.compare_caches: the same (sequence, position, latent)
entries, values within bf16 rounding, at the positions the run includes). Prints every run,
then a markdown table of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

REPO = pathlib.Path(__file__).resolve().parents[2]
#: GNU time, which measures each run's peak RSS.
TIME = "/usr/bin/time"


# ------------------------------------------------------------------------------ prepare


def prepare(args: argparse.Namespace) -> None:
    """The demo GGUF dequantized to an HF f32 directory (both tools then read the same weights),
    and a random TopK SAE saved by SAELens itself. Each is skipped when already there."""
    import torch

    model_out = pathlib.Path(args.model_out)
    if not (model_out / "model.safetensors").exists():
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = pathlib.Path(args.gguf)
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        # transformers refuses to save a model it loaded from GGUF (it counts as quantized),
        # although its weights are dequantized: the same state in a plain model of its config.
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(loaded.state_dict(), strict=True)
        tmp = model_out.with_name(model_out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(model_out)
        print(f"model: {model_out} ({config.model_type}, {config.num_hidden_layers} layers, f32)")
    sae_out = pathlib.Path(args.sae_out)
    if not (sae_out / "sae_weights.safetensors").exists():
        from sae_lens import SAE, TopKSAE, TopKSAEConfig

        torch.manual_seed(args.seed)
        cfg = TopKSAEConfig(d_in=args.d_in, d_sae=args.width, k=args.k, dtype="float32", device="cpu")
        cfg.metadata.hook_name = f"blocks.{args.layer}.hook_resid_post"
        tmp = sae_out.with_name(sae_out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        TopKSAE(cfg).save_model(tmp)
        SAE.load_from_disk(str(tmp))  # SAELens reads back what it saved
        tmp.rename(sae_out)
        print(f"sae: {sae_out} (TopK, {args.width} latents, k={args.k}, {cfg.metadata.hook_name})")


# ------------------------------------------------------------------------------ delphi's side (child)


def rss_mb() -> float:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def delphi_run(args: argparse.Namespace) -> None:
    """One delphi cache, in this process (the parent measures its wall time and peak RSS);
    prints one JSON line with the phases' seconds."""
    t0 = time.monotonic()
    import numpy as np
    import torch
    from delphi.config import CacheConfig
    from delphi.latents import LatentCache
    from sae_lens import SAE
    from transformers import AutoModel

    torch.set_num_threads(args.threads)
    t_import = time.monotonic()
    tokens = torch.from_numpy(np.load(args.tokens).astype(np.int64))
    model = AutoModel.from_pretrained(args.model, dtype=torch.float32).eval()
    sae = SAE.load_from_disk(args.sae, device="cpu")

    def encode(x: Any) -> Any:
        return sae.encode(x.to(sae.W_enc.dtype))

    t_load = time.monotonic()
    rss_loaded = rss_mb()
    n_seq, ctx = tokens.shape
    cache = LatentCache(model, {args.hookpoint: encode}, batch_size=args.batch_size)
    cache.run(n_seq * ctx, tokens)
    t_run = time.monotonic()
    rss_run = rss_mb()
    # What the cache holds by design until it is saved (delphi #38): every batch's firings and
    # tokens, and their concatenation.
    mem = cache.cache
    held = sum(t.nbytes for lists in (mem.latent_locations_batches, mem.latent_activations_batches,
                                      mem.tokens_batches) for ts in lists.values() for t in ts)
    held += sum(t.nbytes for d in (mem.latent_locations, mem.latent_activations, mem.tokens) for t in d.values())
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache.save_splits(n_splits=args.splits, save_dir=out)
    cfg = CacheConfig(cache_ctx_len=ctx, batch_size=args.batch_size, n_tokens=n_seq * ctx, n_splits=args.splits)
    cache.save_config(save_dir=out, cfg=cfg, model_name=args.model)
    t_save = time.monotonic()
    print(json.dumps({
        "tokens": (n_seq // args.batch_size) * args.batch_size * ctx,
        "import_s": t_import - t0, "load_s": t_load - t_import, "run_s": t_run - t_load, "save_s": t_save - t_run,
        "rss_loaded_mb": rss_loaded, "rss_after_run_mb": rss_run,
        "held_mb": held / 2**20,
    }))


# ------------------------------------------------------------------------------ the benchmark


def tree_bytes(path: pathlib.Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def shard_bytes_by_kind(run: pathlib.Path) -> Dict[str, int]:
    """Bytes of the run's shards by tensor: the latents' CSR (indices, indptr, values), the
    hook's activations, the per-token columns (token ids, positions, mask, ...), headers."""
    kinds = {"latents": 0, "hook": 0, "tokens": 0, "header": 0}
    for shard in run.rglob("shard_*.safetensors"):
        with shard.open("rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        kinds["header"] += 8 + n
        for name, t in header.items():
            if name == "__metadata__":
                continue
            size = t["data_offsets"][1] - t["data_offsets"][0]
            if ".hook_sae_acts_post" in name:
                kinds["latents"] += size
            elif name.startswith("blocks.") or name.startswith("ln_final"):
                kinds["hook"] += size
            else:
                kinds["tokens"] += size
    return kinds


def timed(cmd: List[str], env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Runs `cmd` to its exit: wall seconds, peak RSS in MB and stdout. The peak is GNU time's
    (`/usr/bin/time -f %M`: the command's ru_maxrss, and its children's that it waited for).
    Not this process's own wait4: a child's ru_maxrss starts at the RSS of the process that
    forked it (Linux keeps the pre-exec memory's high-water mark), and this one grows to
    hundreds of MB once it has compared caches."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, \
            tempfile.NamedTemporaryFile("r") as peak:
        t0 = time.monotonic()
        p = subprocess.run([TIME, "-f", "%M", "-o", peak.name, *cmd], stdout=out, stderr=err, text=True, env=env)
        wall = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd[:3])} ... failed ({p.returncode}):\n{err.read()[-4000:]}")
        return {"wall": wall, "peak_mb": int(peak.read().split()[-1]) / 1024, "stdout": out.read()}


def export_tokens(export_hook_dir: pathlib.Path) -> Any:
    from safetensors.numpy import load_file

    first = sorted(export_hook_dir.glob("*.safetensors"), key=lambda p: int(p.stem.split("_")[0]))[0]
    return load_file(str(first))["tokens"]


def siphon_round(args: argparse.Namespace, extra: List[str], n: int, out: pathlib.Path) -> Dict[str, Any]:
    run = out / "run" / "bench"
    cmd = [args.siphon, "extract", "--model", args.model, "--corpus", args.corpus, "--sae", args.sae,
           "--seq-len", str(args.ctx),
           "--batch-size", str(args.batch_size), "--max-tokens", str(n), "--keep-excluded",
           "--cpu-devices", "1", "--output", str(out / "run"), "--run", "bench", "--log-format", "plain", *extra]
    m = timed(cmd)
    timing = [json.loads(f.read_text()) for f in (run / "timing").glob("*.json")]
    tokens = sum(t["tokens"] for t in timing)
    rec: Dict[str, Any] = {"tool": "siphon", "n": n, "tokens": tokens, "wall": m["wall"], "peak_mb": m["peak_mb"],
                           "loop_s": max(t["seconds"] for t in timing), "bytes": tree_bytes(run),
                           "kinds": shard_bytes_by_kind(run)}
    env = dict(os.environ, PYTHONPATH=str(REPO / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e = timed([sys.executable, "-m", "siphon", "export-delphi", str(run), str(out / "export"), "--splits",
               str(args.splits), "--keep-excluded-latents"], env=env)
    hook_dir = out / "export" / f"layers.{args.layer}"
    rec.update(export_wall=e["wall"], export_peak_mb=e["peak_mb"], export_bytes=tree_bytes(out / "export"),
               rows=export_tokens(hook_dir))
    return rec


def delphi_round(args: argparse.Namespace, tokens_npy: pathlib.Path, n: int, out: pathlib.Path) -> Dict[str, Any]:
    cmd = [sys.executable, __file__, "delphi-run", "--tokens", str(tokens_npy), "--model", args.model,
           "--sae", args.sae, "--hookpoint", f"layers.{args.layer}", "--batch-size", str(args.batch_size),
           "--splits", str(args.splits), "--threads", str(args.threads), "--out", str(out / "cache")]
    m = timed(cmd)
    phases = json.loads(m["stdout"].strip().splitlines()[-1])
    return {"tool": "delphi", "n": n, "tokens": phases["tokens"], "wall": m["wall"], "peak_mb": m["peak_mb"],
            "loop_s": phases["run_s"], "bytes": tree_bytes(out / "cache"), "phases": phases}


def kth_place_swaps(result: Any, siphon_dir: pathlib.Path, rtol: float = 2.0**-6) -> Optional[int]:
    """The entries only one cache has, when each is explained as a TopK tie: at that token,
    each side kept one latent the other did not, with values within `rtol` of each other and
    no larger than the token's smallest common value (the k-th place, decided by float rounding
    between XLA's and torch's sums). Their count, or None when they are not all such."""
    import numpy as np
    from delphi_compare import read_cache

    def by_token(entries: List[Any]) -> Dict[Any, List[float]]:
        out: Dict[Any, List[float]] = {}
        for seq, pos, _, value in entries:
            out.setdefault((seq, pos), []).append(value)
        return out

    ours, theirs = by_token(result.only_siphon), by_token(result.only_delphi)
    if ours.keys() != theirs.keys() or len(ours) > 1000:
        return None
    loc, act, _ = read_cache(siphon_dir)
    for (seq, pos), a in ours.items():
        b = theirs[(seq, pos)]
        if len(a) != len(b):
            return None
        at = (loc[:, 0] == seq) & (loc[:, 1] == pos)
        swapped = [lat for s, p, lat, _ in result.only_siphon if (s, p) == (seq, pos)]
        common = act[at][~np.isin(loc[at, 2], swapped)].astype(np.float32)
        floor = float(common.min()) if len(common) else float("inf")
        for x, y in zip(sorted(a), sorted(b)):
            if abs(x - y) > rtol * abs(y) or max(x, y) > floor * (1 + rtol):
                return None
    return len(result.only_siphon)


def compare(args: argparse.Namespace, siphon_out: pathlib.Path, delphi_out: pathlib.Path) -> str:
    """siphon's export against delphi's cache at the positions the run includes (padding is
    masked by siphon, not by delphi; BOS positions agree)."""
    sys.path.insert(0, str(REPO / "scripts"))
    sys.path.insert(0, str(REPO / "python"))
    import siphon
    from delphi_compare import compare_caches
    from siphon.delphi import rebuild_sequences

    seqs = rebuild_sequences(siphon.open_dataset(str(siphon_out / "run" / "bench")), "exact", args.ctx)
    hook = f"layers.{args.layer}"
    # Values: siphon stores bf16 (2^-8 relative), delphi float16.
    result = compare_caches(siphon_out / "export" / hook, delphi_out / "cache" / hook, included=seqs.included,
                            rtol=2.0**-7)
    excluded = int((~seqs.included).sum())
    if result.ok:
        verdict = "equal"
    else:
        swaps = kth_place_swaps(result, siphon_out / "export" / hook) if result.tokens_equal and not \
            result.value_mismatches else None
        verdict = "DIFFER" if swaps is None else \
            f"equal but for {swaps} TopK ties (the k-th place taken by another latent of nearly equal value)"
    return (f"{verdict}: " + "; ".join(result.lines()) + f" ({excluded} excluded positions not compared)")


def line(r: Dict[str, Any]) -> str:
    s = (f"{r['tool']:6s} {r['tokens']:>8d} tokens  wall {r['wall']:7.1f} s  {r['tokens'] / r['wall']:7.0f} tok/s  "
         f"loop {r['tokens'] / r['loop_s']:7.0f} tok/s  peak RSS {r['peak_mb']:6.0f} MB  disk {r['bytes'] / 1e6:7.1f} MB")
    if r["tool"] == "siphon":
        k = r["kinds"]
        s += (f" (latents {k['latents'] / 1e6:.1f}, hook {k['hook'] / 1e6:.1f}, tokens {k['tokens'] / 1e6:.1f}); "
              f"export-delphi {r['export_wall']:.1f} s, peak RSS {r['export_peak_mb']:.0f} MB, {r['export_bytes'] / 1e6:.1f} MB")
    else:
        p = r["phases"]
        s += (f" (import {p['import_s']:.1f} s, load {p['load_s']:.1f} s, run {p['run_s']:.1f} s, "
              f"save {p['save_s']:.1f} s; RSS {p['rss_loaded_mb']:.0f} MB after load, {p['rss_after_run_mb']:.0f} MB after "
              f"the loop, of which the cache's tensors {p['held_mb']:.0f} MB)")
    return s


def med(rs: List[Dict[str, Any]], f: Any) -> float:
    return statistics.median(f(r) for r in rs)


def table(runs: List[Dict[str, Any]], counts: List[int]) -> str:
    rows = ["| tokens | run | wall s | tokens/s (wall) | tokens/s (loop) | peak RSS | on disk | bytes/token |",
            "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for n in counts:
        s = [r for r in runs if r["tool"] == "siphon" and r["n"] == n]
        d = [r for r in runs if r["tool"] == "delphi" and r["n"] == n]
        if not s or not d:
            continue
        tok = s[0]["tokens"]
        lat = med(s, lambda r: r["kinds"]["latents"])
        rows.append(f"| {tok:,} | siphon extract --sae | {med(s, lambda r: r['wall']):.1f} | "
                    f"{med(s, lambda r: r['tokens'] / r['wall']):,.0f} | {med(s, lambda r: r['tokens'] / r['loop_s']):,.0f} | "
                    f"{med(s, lambda r: r['peak_mb']):,.0f} MB | {med(s, lambda r: r['bytes']) / 1e6:.1f} MB "
                    f"(latents {lat / 1e6:.1f} MB) | {med(s, lambda r: r['bytes']) / tok:.0f} (latents {lat / tok:.0f}) |")
        rows.append(f"| | siphon export-delphi | {med(s, lambda r: r['export_wall']):.1f} | — | — | "
                    f"{med(s, lambda r: r['export_peak_mb']):,.0f} MB | {med(s, lambda r: r['export_bytes']) / 1e6:.1f} MB | "
                    f"{med(s, lambda r: r['export_bytes']) / tok:.0f} |")
        rows.append(f"| | siphon extract + export | {med(s, lambda r: r['wall'] + r['export_wall']):.1f} | "
                    f"{med(s, lambda r: r['tokens'] / (r['wall'] + r['export_wall'])):,.0f} | — | — | — | — |")
        dtok = d[0]["tokens"]
        rows.append(f"| {dtok:,} | delphi LatentCache | {med(d, lambda r: r['wall']):.1f} | "
                    f"{med(d, lambda r: r['tokens'] / r['wall']):,.0f} | {med(d, lambda r: r['tokens'] / r['loop_s']):,.0f} | "
                    f"{med(d, lambda r: r['peak_mb']):,.0f} MB | {med(d, lambda r: r['bytes']) / 1e6:.1f} MB | "
                    f"{med(d, lambda r: r['bytes']) / dtok:.0f} |")
    return "\n".join(rows)


def bench(args: argparse.Namespace, extra: List[str]) -> None:
    import numpy as np

    counts = [int(x) for x in args.tokens.split(",")]
    step = args.batch_size * args.ctx
    for n in counts:
        if n % step:
            raise SystemExit(f"--tokens {n}: not a multiple of batch x ctx = {step} (delphi drops a partial batch)")
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {len(os.sched_getaffinity(0))} CPUs, load average {os.getloadavg()[0]:.2f} at the start; "
          f"torch threads {args.threads}; batch {args.batch_size} x {args.ctx}", flush=True)
    runs: List[Dict[str, Any]] = []
    rows: Dict[int, Any] = {}
    checks: List[str] = []
    for r in range(args.rounds):
        for n in counts:
            s_out = work / f"siphon-{n}-{r}"
            d_out = work / f"delphi-{n}-{r}"
            shutil.rmtree(s_out, ignore_errors=True)
            shutil.rmtree(d_out, ignore_errors=True)
            s = siphon_round(args, extra, n, s_out)
            tokens = s.pop("rows")
            if n not in rows:
                rows[n] = tokens
                np.save(work / f"tokens-{n}.npy", tokens)
            elif not np.array_equal(rows[n], tokens):
                raise SystemExit(f"siphon's round {r} at {n} tokens ran other token rows than its round 0")
            runs.append(s)
            print(f"round {r}: {line(s)}", flush=True)
            d = delphi_round(args, work / f"tokens-{n}.npy", n, d_out)
            runs.append(d)
            print(f"round {r}: {line(d)}", flush=True)
            if r == 0:
                checks.append(f"{n} tokens: siphon's export against delphi's cache: {compare(args, s_out, d_out)}")
                print(checks[-1], flush=True)
            if not args.keep:
                shutil.rmtree(s_out, ignore_errors=True)
                shutil.rmtree(d_out, ignore_errors=True)
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end\n")
    print(table(runs, counts))
    print()
    if len(counts) > 1:
        lo, hi = min(counts), max(counts)
        for tool in ("siphon", "delphi"):
            a = med([r for r in runs if r["tool"] == tool and r["n"] == lo], lambda r: r["peak_mb"])
            b = med([r for r in runs if r["tool"] == tool and r["n"] == hi], lambda r: r["peak_mb"])
            print(f"{tool}: peak RSS {a:,.0f} MB at {lo:,} tokens, {b:,.0f} MB at {hi:,}: "
                  f"{(b - a) * 2**20 / (hi - lo):+,.0f} bytes per further token")
    for n in counts:
        d = [r for r in runs if r["tool"] == "delphi" and r["n"] == n]
        grown = med(d, lambda r: r["phases"]["rss_after_run_mb"] - r["phases"]["rss_loaded_mb"])
        held = med(d, lambda r: r["phases"]["held_mb"])
        print(f"delphi at {n:,} tokens: RSS {grown:,.0f} MB higher after LatentCache.run than before it; the "
              f"cache's tensors (every firing, held until saved) {held:,.0f} MB = "
              f"{held * 2**20 / d[0]['tokens']:,.0f} bytes a token")
    for c in checks:
        print(c)


def main() -> None:
    argv = sys.argv[1:]
    extra: List[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--gguf", required=True)
    p.add_argument("--model-out", required=True)
    p.add_argument("--sae-out", required=True)
    p.add_argument("--layer", type=int, default=15)
    p.add_argument("--d-in", type=int, default=576)
    p.add_argument("--width", type=int, default=16384)
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    d = sub.add_parser("delphi-run")
    for a in ("--tokens", "--model", "--sae", "--hookpoint", "--out"):
        d.add_argument(a, required=True)
    d.add_argument("--batch-size", type=int, required=True)
    d.add_argument("--splits", type=int, default=5)
    d.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    b = sub.add_parser("bench")
    for a in ("--siphon", "--model", "--sae", "--corpus", "--work"):
        b.add_argument(a, required=True)
    b.add_argument("--layer", type=int, default=15)
    b.add_argument("--tokens", default="16384,65536", help="comma-separated token counts")
    b.add_argument("--rounds", type=int, default=2)
    b.add_argument("--batch-size", type=int, default=32)
    b.add_argument("--ctx", type=int, default=256)
    b.add_argument("--splits", type=int, default=5)
    b.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    b.add_argument("--keep", action="store_true", help="keep every round's outputs under --work")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args)
    elif args.command == "delphi-run":
        delphi_run(args)
    else:
        bench(args, extra)


if __name__ == "__main__":
    main()
