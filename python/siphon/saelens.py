"""Export a siphon run as SAELens's cached-activation dataset.

SAELens's ``CacheActivationsRunner`` writes a Hugging Face ``datasets`` directory
(``save_to_disk``: Arrow files, ``state.json``, ``dataset_info.json``) with one column per hook,
``Array2D(shape=(context_size, d_in))`` of float16 or float32, and ``token_ids``
(``Sequence(int32, length=context_size)``); its training runner reads it with
``use_cached_activations=True, cached_activations_path=...``. `export` writes the same from a
siphon run, so SAELens's own runner trains from it::

    python -m siphon export-saelens out/demo/smollm2-shakespeare out/saelens-cache \\
        --hooks blocks.10.hook_resid_post --context-size 128

siphon drops BOS/padding tokens and stores tokens, not sequences: each exported row is
`context_size` consecutive (or, with `shuffle`, shuffled) tokens of the run, and the tokens
past the last whole row are left out. Arrow has no bfloat16: bf16 runs are exported as float32
(exact) unless ``dtype="float16"``. fp8 runs are exported dequantized (each value times its
row's scale): float32 (exact) unless ``dtype="float16"``.

``siphon export saelens`` (``crates/cli/src/cmd/export.rs``) runs the same export through
``python -m siphon export-saelens``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from ._output import check_count, check_new_or_empty
from .dataset import Dataset, open_dataset
from .errors import DatasetError


@dataclass
class ExportSummary:
    """What `export` wrote."""

    path: str
    hooks: Dict[str, int]
    context_size: int
    rows: int
    tokens: int
    left_out_tokens: int
    dtype: str

    def saelens_config(self, hook: Optional[str] = None) -> Dict[str, Any]:
        """The ``LanguageModelSAERunnerConfig`` fields that point SAELens at this cache."""
        hook = hook or next(iter(self.hooks))
        return {
            "use_cached_activations": True,
            "cached_activations_path": self.path,
            "hook_name": hook,
            "context_size": self.context_size,
            "d_in": self.hooks[hook],
            "dtype": self.dtype,
        }


def export(
    dataset: Union[Dataset, str, "os.PathLike[str]"],
    out_dir: Union[str, "os.PathLike[str]"],
    hooks: Optional[Sequence[str]] = None,
    context_size: Optional[int] = None,
    dtype: str = "float32",
    shuffle: bool = True,
    seed: int = 0,
    exclude_token_ids: Optional[Sequence[int]] = None,
    max_tokens: Optional[int] = None,
    max_shard_size: Union[str, int] = "500MB",
    storage_options: Optional[Mapping[str, Any]] = None,
) -> ExportSummary:
    """Writes `hooks` (default: every hook) of a siphon run to `out_dir` (new or empty) as
    SAELens's ``CacheActivationsRunner`` does; returns what was written. `context_size`
    defaults to the run's ``seq_len``. Per-head hooks are flattened to ``heads * d_head``."""
    try:
        import datasets  # type: ignore[import-untyped]
    except ImportError as e:
        raise DatasetError("exporting for SAELens needs Hugging Face datasets: pip install datasets") from e
    ds = dataset if isinstance(dataset, Dataset) else open_dataset(dataset, storage_options)
    hooks = ds._check_hooks(hooks)
    if dtype not in ("float32", "float16"):
        raise DatasetError(f"SAELens caches hold float32 or float16 (Arrow has no bfloat16), got dtype {dtype!r}")
    if context_size is None:
        context_size = ds.seq_len
        if context_size is None:
            raise DatasetError("run.json records no seq_len: give context_size (--context-size)")
    # A row is context_size tokens: more than the run (or max_tokens) holds leaves no row.
    context_size = check_count("context_size", context_size, 1, ds.tokens, most_is=f"the {ds.tokens} tokens of the run")
    if max_tokens is not None:
        check_count("max_tokens", max_tokens, context_size, sys.maxsize, least_is="one row of context_size")
    out = os.path.abspath(os.fspath(out_dir))
    check_new_or_empty(out, "the dataset's files")
    widths = {h: ds.hooks[h].width for h in hooks}
    features = datasets.Features(
        {h: datasets.Array2D(shape=(context_size, w), dtype=dtype) for h, w in widths.items()}
        | {"token_ids": datasets.Sequence(datasets.Value("int32"), length=context_size)}
    )
    counts = {"rows": 0}
    rows_per_batch = max(1, (64 << 20) // (context_size * sum(widths.values()) * np.dtype(dtype).itemsize))

    def rows() -> Iterator[Dict[str, Any]]:
        limit = max_tokens if max_tokens is not None else ds.tokens
        batch_tokens = rows_per_batch * context_size
        carry: Optional[Dict[str, np.ndarray]] = None
        emitted = 0
        for got in ds.batches(hooks, batch_size=batch_tokens, shuffle=shuffle, seed=seed, dtype=dtype,
                              exclude_token_ids=exclude_token_ids, prefetch=2):
            batch: Dict[str, np.ndarray] = dict(got)
            if carry is not None:
                batch = {k: np.concatenate([carry[k], batch[k]]) for k in batch}
            n = (len(batch["token_ids"]) // context_size) * context_size
            n = min(n, ((limit - emitted) // context_size) * context_size)
            for start in range(0, n, context_size):
                row = {h: batch[h][start : start + context_size].reshape(context_size, widths[h]) for h in hooks}
                row["token_ids"] = batch["token_ids"][start : start + context_size]
                yield row
            emitted += n
            counts["rows"] += n // context_size
            carry = {k: v[n:] for k, v in batch.items()}
            if limit - emitted < context_size:
                break

    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".siphon-export-", dir=out)
    try:
        fingerprint = f"siphon-{abs(hash((ds.url, tuple(hooks), context_size, dtype, shuffle, seed))):x}"
        built = datasets.Dataset.from_generator(rows, features=features, cache_dir=tmp, fingerprint=fingerprint)
        built.save_to_disk(out, max_shard_size=max_shard_size)
        del built
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tokens = counts["rows"] * context_size
    return ExportSummary(out, widths, context_size, counts["rows"], tokens, ds.tokens - tokens, dtype)
