"""``python -m siphon``: look at a run, verify it, export it for SAELens.

    python -m siphon info RUN
    python -m siphon verify RUN [--no-hashes]
    python -m siphon export-saelens RUN OUT [--hooks H,...] [--context-size N] [--dtype float32|float16]
    python -m siphon export-delphi RUN OUT [--latents NAME,...] [--splits 5] [--ctx-len N] [--sequences exact|stored]
    python -m siphon latent-examples RUN NAME OUT.json [--top 20] [--quantiles 10] [--per-quantile 5] [--window 16]
    python -m siphon dashboard RUN --out DIR [--latents NAME,...] [--effects DIR] [--top 20] [--quantiles 10]
        [--per-quantile 5] [--window 16] [--bins 50] [--seed 0] [--no-progress]
    python -m siphon export-neuronpedia RUN OUT --effects DIR --sae-set NAME [--latents NAME] [--model-id ID]
        [--layer N] [--sae-id-suffix S] [--dataset D] [--batch-size 128] [--top 20] [--quantiles 5]
        [--per-quantile 5] [--seed 0] [--no-progress]

(``siphon export saelens|delphi|neuronpedia ...`` on the command line run the same exports; the
binary writes Neuronpedia's effects directory first.)
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from .dataset import open_dataset as open_run
from .errors import DatasetError


def add_example_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of `siphon.examples.latent_examples` (latent-examples and dashboard)."""
    parser.add_argument("--top", type=int, default=20, help="largest activations kept per latent")
    parser.add_argument("--quantiles", type=int, default=10, help="equal-width activation ranges up to each max")
    parser.add_argument("--per-quantile", type=int, default=5, help="examples drawn per range")
    parser.add_argument("--window", type=int, default=16, help="tokens kept on each side of an example")
    parser.add_argument("--seed", type=int, default=0)


def token_ids(text: str) -> List[int]:
    """A flag's comma-separated token ids (``--exclude-token-ids 0,2``)."""
    try:
        ids = [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not comma-separated token ids") from None
    if any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"{text!r}: token ids are not negative")
    return ids


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m siphon", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="hooks, shapes, dtype, shards and tokens of a run")
    info.add_argument("run")
    verify = sub.add_parser("verify", help="check every committed shard against its manifest line")
    verify.add_argument("run")
    verify.add_argument("--no-hashes", action="store_true", help="skip the checksum (CRC32C) of every shard")
    export = sub.add_parser("export-saelens", help="write SAELens's cached-activation dataset")
    export.add_argument("run")
    export.add_argument("out")
    export.add_argument("--hooks", help="comma-separated hook names (default: every hook)")
    export.add_argument("--context-size", type=int, help="tokens per row (default: the run's seq_len)")
    export.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    export.add_argument("--no-shuffle", action="store_true", help="keep the stored token order")
    export.add_argument("--seed", type=int, default=0)
    export.add_argument("--exclude-token-ids", type=token_ids, help="comma-separated token ids to leave out")
    export.add_argument("--max-tokens", type=int)
    delphi = sub.add_parser("export-delphi", help="write delphi's latent cache of the run's dictionary latents")
    delphi.add_argument("run")
    delphi.add_argument("out", help="delphi's latents directory (one folder per hookpoint is added)")
    delphi.add_argument("--latents", help="comma-separated latents columns (default: every one)")
    delphi.add_argument("--splits", type=int, default=5, help="latent ranges per hookpoint, as delphi's n_splits (default 5)")
    delphi.add_argument("--ctx-len", type=int, help="tokens per row (default: the run's seq_len)")
    delphi.add_argument("--sequences", default="exact", choices=["exact", "stored"],
                        help="exact: the run's rows (needs --keep-excluded); stored: stored tokens cut into ctx-len rows")
    delphi.add_argument("--hookpoint", action="append", default=[], metavar="NAME=HOOKPOINT",
                        help="the folder (delphi hookpoint) of latents column NAME; repeatable")
    delphi.add_argument("--model-name", help="config.json's model_name (default: the run's model)")
    delphi.add_argument("--keep-excluded-latents", action="store_true",
                        help="keep the latents of excluded tokens (BOS, EOS, padding) in exact sequences")
    delphi.add_argument("--min-activation", type=float, default=1e-5, help="keep entries with |value| above this (delphi: 1e-5)")
    delphi.add_argument("--no-check", action="store_true", help="skip each shard's CRC32C check")
    np_export = sub.add_parser("export-neuronpedia", help="write Neuronpedia's batch files of a dictionary's latents")
    np_export.add_argument("run")
    np_export.add_argument("out", help="new or empty folder: batch-N.json")
    np_export.add_argument("--effects", required=True, help="effects directory: pieces.json, {column}.safetensors")
    np_export.add_argument("--sae-set", required=True, help="Neuronpedia's SAE set")
    np_export.add_argument("--latents", help="the latents column (default: the run's only one)")
    np_export.add_argument("--model-id", help="Neuronpedia's model id (default: the run's model directory's name)")
    np_export.add_argument("--layer", type=int, help="the layer (default: N of the hook blocks.N.…)")
    np_export.add_argument("--sae-id-suffix", help="Neuronpedia's suffix of the SAE id")
    np_export.add_argument("--dataset", help="the examples' dataset (default: the run's corpus)")
    np_export.add_argument("--batch-size", type=int, default=128, help="latents per batch file")
    np_export.add_argument("--top", type=int, default=20, help="largest activations per latent")
    np_export.add_argument("--quantiles", type=int, default=5, help="equal-width intervals up to each max")
    np_export.add_argument("--per-quantile", type=int, default=5, help="examples drawn per interval")
    np_export.add_argument("--seed", type=int, default=0)
    np_export.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    np_export.add_argument("--no-check", action="store_true", help="skip each shard's CRC32C check")
    examples = sub.add_parser("latent-examples", help="each latent's top and per-activation-range examples, as JSON")
    examples.add_argument("run")
    examples.add_argument("name", help="the latents column")
    examples.add_argument("out", help="JSON file: one entry per latent that fired")
    add_example_flags(examples)
    dashboard = sub.add_parser("dashboard", help="a static site of every latent's examples and histogram (opens from file://)")
    dashboard.add_argument("run")
    dashboard.add_argument("--out", required=True, help="the site's folder (index.html there)")
    dashboard.add_argument("--latents", help="comma-separated latents columns (default: every one)")
    dashboard.add_argument("--effects", help="effects directory: vocab.json and {column}.safetensors (logits, neighbours)")
    add_example_flags(dashboard)
    dashboard.add_argument("--bins", type=int, default=50, help="bins of each latent's activation histogram")
    dashboard.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    dashboard.add_argument("--no-check", action="store_true", help="skip each shard's CRC32C check")
    args = parser.parse_args(argv)
    try:
        if args.command == "info":
            ds = open_run(args.run)
            print(f"{ds.url}: {ds.format_tag}, run {ds.name!r}, {len(ds.shards)} committed shards, "
                  f"{ds.tokens} tokens, {ds.nbytes} bytes, {ds.dtype}")
            for hook in ds.hooks.values():
                print(f"  {hook.name} {list(hook.shape)}")
        elif args.command == "verify":
            report = open_run(args.run).verify(hashes=not args.no_hashes)
            print(f"ok: {report.shards} shards, {report.tokens} tokens, {report.bytes} bytes")
        elif args.command == "latent-examples":
            import json

            from .examples import latent_examples

            ds = open_run(args.run)
            ex = latent_examples(ds, args.name, top=args.top, quantiles=args.quantiles,
                                 per_quantile=args.per_quantile, window=args.window, seed=args.seed)
            fired = sorted(set(ex.arrays["latent"].tolist()))
            with open(args.out, "w") as f:
                json.dump({"name": args.name, "latents": [ex.latent(i) for i in fired]}, f)
            print(f"wrote the examples of {len(fired)} latents of {args.name} to {args.out}")
        elif args.command == "dashboard":
            from .dashboard import build_dashboard

            index = build_dashboard(
                args.run,
                args.out,
                names=args.latents.split(",") if args.latents else None,
                effects=args.effects,
                top=args.top,
                quantiles=args.quantiles,
                per_quantile=args.per_quantile,
                window=args.window,
                bins=args.bins,
                seed=args.seed,
                progress=not args.no_progress,
                check=not args.no_check,
            )
            print(index)
        elif args.command == "export-neuronpedia":
            from .dashboard.neuronpedia import export_neuronpedia

            paths = export_neuronpedia(
                args.run,
                args.out,
                effects=args.effects,
                sae_set=args.sae_set,
                name=args.latents,
                model_id=args.model_id,
                layer=args.layer,
                sae_id_suffix=args.sae_id_suffix,
                dataset_name=args.dataset,
                batch_size=args.batch_size,
                top=args.top,
                quantiles=args.quantiles,
                per_quantile=args.per_quantile,
                seed=args.seed,
                progress=not args.no_progress,
                check=not args.no_check,
            )
            print(f"wrote {len(paths)} batch files to {args.out}")
        elif args.command == "export-delphi":
            from .delphi import export as export_delphi

            hookpoints = {}
            for item in args.hookpoint:
                name, sep, folder = item.partition("=")
                if not sep or not name or not folder:
                    raise DatasetError(f"--hookpoint takes NAME=HOOKPOINT, got {item!r}")
                hookpoints[name] = folder
            done = export_delphi(
                args.run,
                args.out,
                latents=args.latents.split(",") if args.latents else None,
                n_splits=args.splits,
                ctx_len=args.ctx_len,
                sequences=args.sequences,
                hookpoints=hookpoints,
                model_name=args.model_name,
                excluded_latents="keep" if args.keep_excluded_latents else "drop",
                min_activation=args.min_activation,
                check=not args.no_check,
            )
            print(f"wrote {done.n_seq} sequences x {done.ctx_len} tokens ({done.sequences}) to {done.path}:")
            for name, folder in done.hookpoints.items():
                print(f"  {name} -> {folder}: {done.entries[name]} entries ({done.left_out[name]} left out)")
            print("delphi: LatentDataset(raw_dir=" + repr(done.path) + ", modules=" + repr(list(done.hookpoints.values())) + ", ...)")
        else:
            from .saelens import export as export_saelens

            summary = export_saelens(
                args.run,
                args.out,
                hooks=args.hooks.split(",") if args.hooks else None,
                context_size=args.context_size,
                dtype=args.dtype,
                shuffle=not args.no_shuffle,
                seed=args.seed,
                exclude_token_ids=args.exclude_token_ids,
                max_tokens=args.max_tokens,
            )
            print(f"wrote {summary.rows} rows x {summary.context_size} tokens ({summary.tokens} tokens, "
                  f"{summary.left_out_tokens} left out) of {', '.join(summary.hooks)} to {summary.path}")
            print("SAELens: " + ", ".join(f"{k}={v!r}" for k, v in summary.saelens_config().items()))
    except DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
