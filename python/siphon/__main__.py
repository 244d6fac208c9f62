"""``python -m siphon``: look at a run, verify it, export it for SAELens.

    python -m siphon info RUN
    python -m siphon verify RUN [--no-hashes]
    python -m siphon export-saelens RUN OUT [--hooks H,...] [--context-size N] [--dtype float32|float16]

(``siphon export saelens ...`` on the command line runs the same export.)
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from .dataset import open_dataset as open_run
from .errors import DatasetError


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
    export.add_argument("--exclude-token-ids", help="comma-separated token ids to leave out")
    export.add_argument("--max-tokens", type=int)
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
                exclude_token_ids=[int(t) for t in args.exclude_token_ids.split(",")] if args.exclude_token_ids else None,
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
