"""Shuffled training batches from local disk: siphon's reader against SAELens's own
cached-activation loader, on the same activations, interleaved rounds in one process.

    bench_reader.py RUN SAELENS_CACHE --hook H --context-size N [--batch 4096] [--rounds 5]

RUN is a siphon run (f32), SAELENS_CACHE the same activations exported with
`python -m siphon export-saelens` (f32 too, so both read the same bytes). Each round reads
one epoch of the hook with each reader, in alternating order: siphon `Dataset.batches(...,
shuffle=True, output="torch")` in this process, siphon through a torch DataLoader with 2
workers, and SAELens's `ActivationsStore` built on the cache (`use_cached_activations`: HF
datasets `load_from_disk`, torch format, its mixing buffer) iterated for the same number of
tokens. Prints the medians: batches/s and GB/s of activation bytes handed to the trainer.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.data import DataLoader

import siphon
import siphon.torch


def siphon_epoch(ds, hook, batch, seed):
    tokens = n = 0
    for b in ds.batches([hook], batch_size=batch, shuffle=True, seed=seed, output="torch"):
        tokens += b[hook].shape[0]
        n += 1
    return n, tokens


def siphon_loader_epoch(ds, hook, batch, seed, workers):
    loader = DataLoader(siphon.torch.ActivationDataset(ds, [hook], batch_size=batch, seed=seed), batch_size=None, num_workers=workers)
    tokens = n = 0
    for b in loader:
        tokens += b[hook].shape[0]
        n += 1
    return n, tokens


def saelens_store(cache, hook, ctx, d_in, batch, buffer_batches):
    from sae_lens.training.activations_store import ActivationsStore

    return ActivationsStore(
        model=None,
        dataset=None,
        streaming=False,
        hook_name=hook,
        hook_head_index=None,
        context_size=ctx,
        d_in=d_in,
        n_batches_in_buffer=buffer_batches,
        total_training_tokens=10**12,
        store_batch_size_prompts=max(1, batch // ctx),
        train_batch_size_tokens=batch,
        prepend_bos=False,
        normalize_activations="none",
        device=torch.device("cpu"),
        dtype="float32",
        cached_activations_path=cache,
    )


def saelens_epoch(cache, hook, ctx, d_in, batch, tokens_per_epoch, buffer_batches):
    store = saelens_store(cache, hook, ctx, d_in, batch, buffer_batches)
    tokens = n = 0
    while tokens + batch <= tokens_per_epoch:
        x = next(store)
        tokens += x.shape[0]
        n += 1
    return n, tokens


def main():
    p = argparse.ArgumentParser()
    p.add_argument("run")
    p.add_argument("cache")
    p.add_argument("--hook", required=True)
    p.add_argument("--context-size", type=int, required=True)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--saelens-buffer-batches", type=int, default=0,
                   help="SAELens n_batches_in_buffer (default: a buffer of as many tokens as siphon's)")
    args = p.parse_args()
    torch.set_num_threads(2)
    ds = siphon.open_dataset(args.run)
    d_in = ds.hooks[args.hook].width
    bytes_per_token = d_in * 4
    # siphon's default buffer: 512 MiB of the hook's rows. SAELens's mixing buffer holds
    # n_batches_in_buffer * context_size tokens: give it the same number.
    sib_tokens = (512 << 20) // (bytes_per_token + 8)
    buffer_batches = args.saelens_buffer_batches or max(1, sib_tokens // args.context_size)
    epoch_tokens = (ds.tokens // args.context_size) * args.context_size
    print(f"{ds}\nepoch: {ds.tokens} tokens, {ds.tokens * bytes_per_token / 1e9:.2f} GB of {args.hook}; "
          f"batch {args.batch}; shuffle buffers: siphon {sib_tokens} tokens, SAELens "
          f"{buffer_batches * args.context_size} tokens (n_batches_in_buffer={buffer_batches})", flush=True)
    readers = {
        "siphon": lambda r: siphon_epoch(ds, args.hook, args.batch, r),
        f"siphon DataLoader {args.workers} workers": lambda r: siphon_loader_epoch(ds, args.hook, args.batch, r, args.workers),
        "SAELens ActivationsStore (cached)": lambda r: saelens_epoch(
            args.cache, args.hook, args.context_size, d_in, args.batch, epoch_tokens, buffer_batches),
    }
    times = {k: [] for k in readers}
    counts = {}
    names = list(readers)
    for r in range(args.rounds + 1):  # round 0 warms the page cache and imports
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            t0 = time.perf_counter()
            n, tokens = readers[name](r)
            dt = time.perf_counter() - t0
            if r > 0:
                times[name].append(dt)
                counts[name] = (n, tokens)
            print(f"round {r} {name}: {n} batches, {tokens} tokens, {dt:.2f} s", flush=True)
    print()
    print("| reader | batches/s (median) | GB/s (median) | s per epoch (median) |")
    print("|---|---|---|---|")
    base = None
    for name in names:
        n, tokens = counts[name]
        med = statistics.median(times[name])
        rate = n / med
        gbs = tokens * bytes_per_token / med / 1e9
        print(f"| {name} | {rate:.1f} | {gbs:.2f} | {med:.2f} |")
        if name.startswith("SAELens"):
            base = rate
    for name in names[:2]:
        n, _ = counts[name]
        print(f"{name} / SAELens: {n / statistics.median(times[name]) / base:.2f}x")


if __name__ == "__main__":
    main()
