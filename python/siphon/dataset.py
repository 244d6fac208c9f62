"""A siphon run opened for reading: ``siphon.open_dataset(url)`` gives a `Dataset`.

A `Dataset` is run.json and the shards its hosts' manifests have committed (`refresh` reads
the manifests again): `hooks`, `dtype`, `tokens`; `verify` (every shard against its manifest
line); `batches` (one reader's `Batch`es, shuffled and resumable), `activations` (one hook as
bare arrays, for trainers) and `read` (every token, in memory); and the dictionaries' latents
(`latents`, `latent_shards`, `read_latents`, `latent_stats`; see `siphon.latents`). Every
argument of `batches`, `activations` and `read` after the hooks is keyword-only. The names
that shadowed builtins are kept as deprecated aliases: ``siphon.open`` (`open_dataset`),
``format=`` (``output=``) and ``Dataset.format`` (`format_tag`).

One reader's iteration over epochs is a frozen `_Iteration` (its units, unit reader,
conversion, shuffle and reader index: how `siphon._reader` orders its rows); `Batches` is the
iterator it gives, whose `state_dict` is the position after the last batch. Conversion to
numpy or torch and the dtype asked for is `siphon._convert`'s (`Batch`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import google_crc32c
import numpy as np

from . import _convert
from . import documents as _documents
from ._format import (
    FP8,
    RESERVED,
    ROLES,
    RUN_DTYPES,
    STORED_DTYPES,
    ManifestLine,
    fp8_scale_name,
    host_dirs,
    hook_tensors,
    parse_header,
    read_manifest,
    read_run_json,
)
from ._location import Location
from ._ranks import check_reader
from ._convert import Batch
from ._reader import (
    Arrays,
    Filter,
    Unit,
    UnitReader,
    Window,
    make_units,
    read_ahead,
    split_units,
    templates_for,
    windows_of,
)
from .errors import DatasetError
from .outputs import OutputInfo, checked_outputs, header_problems, output_stats, parse_outputs, splice_metrics
from .latents import (
    LatentShard,
    LatentsInfo,
    VALUE_DTYPES,
    checked_latents,
    csr_names,
    iter_latent_shard_groups,
    iter_latent_shards,
    latents_stats,
    parse_latents,
    resolve_value_dtype,
)

DEFAULT_SHUFFLE_BUFFER_BYTES = 512 << 20
DEFAULT_UNIT_TOKENS = 8192


@dataclass(frozen=True)
class HookInfo:
    """One hook of the run: its name, the shape of one token's activation, its stored dtype
    (``"float8_e4m3fn"`` in an fp8 run, whose rows each carry a float32 scale: the reader
    returns them dequantized, float32 unless another dtype is asked for)."""

    name: str
    shape: Tuple[int, ...]
    dtype: str

    @property
    def width(self) -> int:
        """Elements per token (the product of `shape`)."""
        return int(np.prod(self.shape))


@dataclass
class VerifyReport:
    """What `Dataset.verify` checked."""

    shards: int
    tokens: int
    bytes: int
    problems: List[str]

    @property
    def ok(self) -> bool:
        return not self.problems


class Dataset:
    """A siphon run: ``run.json`` plus the shards every host's manifest has committed.

    Only shards named in a ``manifest.jsonl`` are visible, and the manifests are read once, when
    the dataset is opened (`refresh` reads them again): a run that is still being written can be
    read, and shows the shards committed so far.

    `dtype` is the hooks' stored dtype: ``float32``, ``bfloat16``, ``float16``, or
    ``float8_e4m3fn`` for an fp8 run (``siphon extract --dtype fp8``: one byte a value and a
    float32 scale per token row, in ``{hook}.fp8_scale`` beside each hook; the reader reads the
    scales with the rows and returns the values dequantized).
    """

    def __init__(self, url: str, storage_options: Optional[Mapping[str, Any]] = None) -> None:
        self.url = url.rstrip("/")
        self._location = Location(url, storage_options)
        self.run = read_run_json(self._location)
        names = list(self.run.get("hooks", []))
        shapes = self.run.get("hook_shapes") or []
        dtype = RUN_DTYPES.get(str(self.run.get("shard_format", {}).get("dtype", "")).lower())
        self.shards: List[ManifestLine] = []
        self.refresh()
        if not shapes and self.shards:
            # Format 1 run.json files do not record shapes: take them from the first shard.
            header = parse_header(self._location, self.shards[0].rel, self.shards[0].bytes)
            shapes = [list(header.tensors[h].shape[1:]) if h in header.tensors else [] for h in names]
        if dtype is None and self.shards and names:
            header = parse_header(self._location, self.shards[0].rel, self.shards[0].bytes)
            dtype = STORED_DTYPES[header.tensors[names[0]].dtype][1]
        self.dtype: str = dtype or "unknown"
        self.hooks: Dict[str, HookInfo] = {
            name: HookInfo(name, tuple(int(d) for d in shape), self.dtype)
            for name, shape in zip(names, shapes or [[] for _ in names])
        }
        #: The dictionaries' latents columns (run.json's ``"latents"``; empty without), by name.
        self.latents: Dict[str, LatentsInfo] = parse_latents(self.run, self._latent_dtype(), self.url)
        #: The model's outputs stored per token (run.json's ``"outputs"``; empty without), by
        #: name: see `siphon.outputs`.
        self.outputs: Dict[str, OutputInfo] = parse_outputs(self.run, self.url)
        self._has_mask = bool(self.run.get("shard_format", {}).get("keep_excluded", False))
        #: Whether the shards carry each token's role (a run of conversations).
        self.has_roles = bool(self.run.get("shard_format", {}).get("roles", False))
        #: Whether each row pools several tokens (``--positions mean``): its first position and
        #: count are stored (`rows` returns them).
        self.has_pooled = bool(self.run.get("shard_format", {}).get("pooled", False))

    # ----------------------------------------------------------------------------- metadata

    @property
    def name(self) -> str:
        """The run name."""
        return str(self.run.get("run", ""))

    @property
    def format_tag(self) -> str:
        """The format tag, e.g. ``siphon-activations/2``."""
        return str(self.run["format"])

    @property
    def format(self) -> str:
        """Deprecated name of `format_tag`."""
        warnings.warn("Dataset.format is deprecated: use Dataset.format_tag", DeprecationWarning, stacklevel=2)
        return self.format_tag

    @property
    def tokens(self) -> int:
        """Token rows in the committed shards (without rows the mask excludes)."""
        return sum(s.included_tokens for s in self.shards)

    @property
    def seq_len(self) -> Optional[int]:
        """The extraction's sequence length, when run.json records it (``config.corpus.seq_len``;
        ``config.seq_len`` in older runs)."""
        config = self.run.get("config", {})
        value = (config.get("corpus") or {}).get("seq_len", config.get("seq_len"))
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DatasetError(f"{self.url}/run.json: seq_len is {value!r}, not a positive integer")
        return value

    @property
    def nbytes(self) -> int:
        """Bytes of the committed shards."""
        return sum(s.bytes for s in self.shards)

    def refresh(self) -> "Dataset":
        """Reads every host's manifest again (shards committed since `open` become visible)."""
        shards: List[ManifestLine] = []
        for host in host_dirs(self._location):
            shards.extend(read_manifest(self._location, host))
        self.shards = shards
        return self

    def __repr__(self) -> str:
        hooks = ", ".join(f"{h.name} {list(h.shape)}" for h in self.hooks.values())
        latents = ", ".join(f"{i.name} [{i.width}]" for i in self.latents.values())
        latents = f", latents: {latents}" if latents else ""
        outputs = ", ".join(f"{o.name} {list(o.shape)}" for o in self.outputs.values())
        outputs = f", outputs: {outputs}" if outputs else ""
        return (
            f"siphon.Dataset({self.url!r}, {self.format_tag}, {len(self.shards)} shards, {self.tokens} tokens, "
            f"{self.dtype}, hooks: {hooks}{latents}{outputs})"
        )

    def _latent_dtype(self) -> str:
        """The stored dtype of latent values: the run's, unless it is fp8 (or unknown), then
        the first shard's."""
        if self.dtype in ("float32", "bfloat16", "float16") or not self.run.get("latents") or not self.shards:
            return self.dtype
        header = parse_header(self._location, self.shards[0].rel, self.shards[0].bytes)
        values = header.tensors.get(csr_names(str(self.run["latents"][0].get("name", "")))[2])
        return STORED_DTYPES[values.dtype][1] if values is not None and values.dtype in VALUE_DTYPES else self.dtype

    # ----------------------------------------------------------------------------- checks

    def verify(self, hashes: bool = True, *, raise_on_problem: bool = True) -> VerifyReport:
        """Checks every committed shard: present with its manifest size, its checksum (with
        `hashes`; reads every byte: CRC32C, or sha256 for shards written before it), a readable
        header of this format with every hook at its run.json shape and the manifest's token
        count, and each dictionary's latents as a CSR matrix over the shard's tokens (its three
        tensors' dtypes and shapes; `latent_shards` checks their contents). Returns the report, whose `problems`
        name each problem found; with `raise_on_problem` (the default) a problem raises
        `DatasetError` listing them all instead."""
        problems: List[str] = []
        for shard in self.shards:
            where = f"{shard.rel}"
            size = self._location.size(shard.rel)
            if size is None:
                problems.append(f"{where}: committed shard is missing")
                continue
            if size != shard.bytes:
                problems.append(f"{where}: {size} bytes, the manifest says {shard.bytes}")
                continue
            try:
                header = parse_header(self._location, shard.rel, shard.bytes)
            except DatasetError as e:
                problems.append(str(e))
                continue
            tag = header.metadata.get("format")
            if tag != self.format_tag:
                problems.append(f"{where}: format {tag!r}, run.json says {self.format_tag!r}")
            ids = header.tensors.get("token_ids")
            if ids is None or ids.shape != (shard.tokens,):
                problems.append(f"{where}: token_ids {None if ids is None else list(ids.shape)}, manifest says {shard.tokens} tokens")
            for hook in self.hooks.values():
                t = header.tensors.get(hook.name)
                if t is None:
                    problems.append(f"{where}: no tensor for hook {hook.name}")
                    continue
                if t.shape != (shard.tokens,) + hook.shape:
                    problems.append(f"{where}: hook {hook.name} has shape {list(t.shape)}, expected {[shard.tokens, *hook.shape]}")
                stored = STORED_DTYPES.get(t.dtype, (None, t.dtype))[1]
                if stored != hook.dtype:
                    problems.append(f"{where}: hook {hook.name} is stored as {t.dtype}, run.json says {hook.dtype}")
                if hook.dtype == FP8:
                    name = fp8_scale_name(hook.name)
                    scale = header.tensors.get(name)
                    if scale is None or scale.dtype != "F32" or scale.shape != (shard.tokens,):
                        found = "missing" if scale is None else f"{scale.dtype} {list(scale.shape)}"
                        problems.append(f"{where}: fp8 hook {hook.name}'s scales {name}: {found}, expected F32 [{shard.tokens}]")
            for info in self.latents.values():
                problems.extend(_latents_header_problems(where, header.tensors, info, shard.tokens))
            for output in self.outputs.values():
                problems.extend(header_problems(where, header.tensors, output, shard.tokens))
            if hashes:
                problem = _check_checksum(self._location, shard)
                if problem:
                    problems.append(f"{where}: {problem}")
        report = VerifyReport(len(self.shards), self.tokens, self.nbytes, problems)
        if problems and raise_on_problem:
            raise DatasetError(f"{self.url}: {len(problems)} problem(s): " + "; ".join(problems))
        return report

    def _row_bytes(self, hooks: Sequence[str], outputs: Sequence[str] = ()) -> int:
        """Stored bytes of one token's rows of `hooks` (an fp8 row's float32 scale included)
        and `outputs`."""
        itemsize = np.dtype(STORED_DTYPES_BY_NAME[self.dtype]).itemsize
        hook_bytes = sum(self.hooks[h].width * itemsize + (4 if self.dtype == FP8 else 0) for h in hooks)
        return hook_bytes + sum(4 * int(np.prod(self.outputs[o].shape)) for o in outputs)

    def _check_hooks(self, hooks: Optional[Sequence[str]]) -> List[str]:
        return checked_hooks(hooks, list(self.hooks))

    def _check_columns(
        self, hooks: Optional[Sequence[str]], outputs: Optional[Sequence[str]]
    ) -> Tuple[List[str], List[str]]:
        """The hooks and outputs asked for: `hooks` ``None`` is every hook (none, in a run that
        stores only outputs), ``[]`` none where outputs are asked for; something must be."""
        names = checked_outputs(outputs, self.outputs)
        if names and not hooks and (hooks is not None or not self.hooks):
            return [], names
        return self._check_hooks(hooks), names

    # ----------------------------------------------------------------------------- reading

    def batches(
        self,
        hooks: Optional[Sequence[str]] = None,
        *,
        batch_size: int = 4096,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        output: str = "numpy",
        dtype: Any = None,
        epoch: int = 0,
        epochs: Optional[int] = 1,
        worker: int = 0,
        num_workers: int = 1,
        exclude_token_ids: Optional[Sequence[int]] = None,
        min_position: int = 0,
        max_position: Optional[int] = None,
        roles: Optional[Sequence[str]] = None,
        drop_last: bool = False,
        shuffle_buffer_tokens: Optional[int] = None,
        unit_tokens: int = DEFAULT_UNIT_TOKENS,
        prefetch: int = 2,
        device: Any = None,
        resume: Optional[Mapping[str, Any]] = None,
        outputs: Optional[Sequence[str]] = None,
        format: Optional[str] = None,  # noqa: A002 - the deprecated name of `output`
        _columns: Sequence[str] = (),
    ) -> Batches:
        """`Batch`es of ``{hook: [n, *shape], "token_ids": [n], "position": [n]}``, every hook
        for the same tokens.

        - `outputs`: the model's outputs to return beside the hooks (names of `outputs`, e.g.
          ``["output.nll", "output.topk_ids"]``), as stored (float32, ids int32; see
          `siphon.outputs`), whatever `dtype` asks of the hooks. With `outputs` and no hook
          of the run, `hooks` may be left ``None``.

        - `shuffle`: units of at most `unit_tokens` rows of a shard are visited in a seeded
          random order, and rows are permuted within windows of `shuffle_buffer_tokens` rows
          of consecutive units (default: 512 MiB of the requested hooks' rows, at least 4
          batches). Deterministic for (`seed`, `epoch`, `rank`, `world_size`, `worker`,
          `num_workers`). Peak memory per reader ≈ (2 × window + (prefetch + 1) × unit) × bytes
          per token.
        - `resume`: a state the returned iterator's ``state_dict()`` gave after some batch:
          the batches continue exactly from there (same arguments otherwise, checked).
        - `rank`/`world_size` and `worker`/`num_workers`: the units are split between the
          ``world_size * num_workers`` readers without overlap or gap, so each token is read
          exactly once per epoch over all of them. Readers may get a few batches more or fewer
          than each other.
        - `output`: ``"numpy"`` or ``"torch"`` (`format` is its deprecated name). `dtype`:
          ``None`` keeps the stored dtype (bf16 stays ``torch.bfloat16``; in numpy it needs
          ``ml_dtypes``), or e.g. ``"float32"``. An fp8 run's rows are read with their scales
          and dequantized (``float32(e4m3) * scale``): ``None`` gives float32, the exact stored
          value; ``"bfloat16"``/``"float16"`` round that (numpy needs ``ml_dtypes`` for fp8).
        - `exclude_token_ids` (e.g. BOS) and ``min_position <= position < max_position`` drop
          rows before batching; rows a ``--keep-excluded`` mask marks are always dropped.
        - `roles` (a run of conversations, ``has_roles``): keep only the tokens of these roles
          (``"system"``, ``"user"``, ``"assistant"``, ``"tool"``, ``"template"``); batches of
          such a run also hold each token's ``"role"`` (an index into ``siphon.ROLES``).
        - `epochs`: epochs to run (``None``: forever), epoch ``e`` reshuffled with
          ``(seed, epoch + e)``. The last batch of an epoch may be short unless `drop_last`.
        """
        output = _deprecated_output(format, output)
        hooks, outputs = self._check_columns(hooks, outputs)
        check_reader(batch_size, rank, world_size, worker, num_workers)
        if unit_tokens <= 0:
            raise DatasetError(f"unit_tokens must be positive, got {unit_tokens}")
        if output not in ("numpy", "torch"):
            raise DatasetError(f"output must be 'numpy' or 'torch', got {output!r}")
        if epochs is not None and epochs < 0:
            raise DatasetError(f"epochs must be >= 0 or None, got {epochs}")
        out_dtype = _convert.resolve_dtype(dtype, output)
        convert = _convert.Converter(output, out_dtype, self.dtype, hooks, device)
        row_bytes = self._row_bytes(hooks, outputs) + 8
        if shuffle_buffer_tokens is None:
            shuffle_buffer_tokens = max(DEFAULT_SHUFFLE_BUFFER_BYTES // row_bytes, 4 * batch_size)
        if shuffle and shuffle_buffer_tokens < 2 * batch_size:
            raise DatasetError(
                f"shuffle_buffer_tokens ({shuffle_buffer_tokens}) must be at least 2 * batch_size ({2 * batch_size})"
            )
        role_ids = None
        if roles is not None:
            if not self.has_roles:
                raise DatasetError("roles= filters a run of conversations; this run stores no roles")
            unknown = [r for r in roles if r not in ROLES]
            if unknown or not roles:
                raise DatasetError(f"roles must name some of {list(ROLES)}, got {list(roles)}")
            role_ids = np.asarray([ROLES.index(r) for r in roles], dtype=np.uint8)
        filt = Filter(
            exclude_token_ids=None if not exclude_token_ids else np.asarray(list(exclude_token_ids), dtype=np.int32),
            min_position=int(min_position),
            max_position=None if max_position is None else int(max_position),
            roles=role_ids,
        )
        # An fp8 hook's scales are read (and shuffled, filtered) with its rows.
        tensors = hook_tensors(hooks, self.dtype) + outputs + ["token_ids", "position"] + (["role"] if self.has_roles else [])
        tensors += list(_columns)
        plan = _Iteration(
            units=make_units(list(self.shards), unit_tokens),
            reader=UnitReader(self._location, tensors, filt, self._has_mask),
            convert=convert,
            shuffle=shuffle,
            seed=seed,
            epoch=epoch,
            epochs=epochs,
            consumer=rank * num_workers + worker,
            consumers=world_size * num_workers,
            batch_size=batch_size,
            capacity=shuffle_buffer_tokens,
            unit_tokens=unit_tokens,
            prefetch=prefetch,
            drop_last=drop_last,
        )
        return plan.run(_start_of(resume, plan))

    def activations(self, hook: str, *, batch_size: int = 4096, **kwargs: Any) -> Iterator[Any]:
        """Batches of one hook as bare ``[n, width]`` arrays or tensors (per-head hooks
        flattened): the iterator SAELens's ``SAETrainer(data_provider=...)`` and
        dictionary_learning's ``trainSAE(data=...)`` take. Keyword arguments as `batches`."""
        hook = self._check_hooks([hook])[0]
        width = self.hooks[hook].width
        for batch in self.batches([hook], batch_size=batch_size, **kwargs):
            x = batch[hook]
            yield x.reshape(x.shape[0], width)

    def read(
        self,
        hooks: Optional[Sequence[str]] = None,
        *,
        output: str = "numpy",
        dtype: Any = None,
        outputs: Optional[Sequence[str]] = None,
        format: Optional[str] = None,  # noqa: A002 - the deprecated name of `output`
    ) -> Batch:
        """Every committed token of `hooks` (and `outputs`, as `batches` takes them) in stored
        order, in memory: for small runs and tests."""
        output = _deprecated_output(format, output)
        hooks, outputs = self._check_columns(hooks, outputs)
        convert = _convert.Converter(output, _convert.resolve_dtype(dtype, output), self.dtype, hooks, None)
        parts = list(
            self.batches(
                hooks, batch_size=1 << 20, shuffle=False, output="numpy", dtype="raw", prefetch=0, outputs=outputs
            )
        )
        if not parts:
            templates = {h: np.zeros((0,) + self.hooks[h].shape, STORED_DTYPES_BY_NAME[self.dtype]) for h in hooks}
            templates.update({o: np.zeros((0,) + self.outputs[o].shape, self.outputs[o].dtype) for o in outputs})
            if self.dtype == FP8:
                templates.update({fp8_scale_name(h): np.zeros(0, np.float32) for h in hooks})
            templates.update(token_ids=np.zeros(0, np.int32), position=np.zeros(0, np.int32))
            if self.has_roles:
                templates.update(role=np.zeros(0, np.uint8))
            return convert(templates)
        return convert({k: np.concatenate([p[k] for p in parts]) for k in parts[0]})

    @property
    def positions(self) -> Any:
        """The rows of each document the run stores (``--positions``: ``"last"``, ``"mean"``,
        ``{"last_n": 4}``, ``{"after": "Answer:"}``, …), or ``None``: every kept token."""
        return self.run.get("config", {}).get("positions")

    def rows(
        self,
        hooks: Optional[Sequence[str]] = None,
        *,
        output: str = "numpy",
        dtype: Any = None,
    ) -> Tuple[Batch, Any]:
        """Every stored row of `hooks` with its document, in stored order: ``(X, table)``. `X`
        maps each hook to ``[n, *shape]`` (numpy or torch, `dtype` as `batches`); `table` is a
        pyarrow table (``.to_pandas()`` for pandas) holding, row for row, ``doc_index`` (the
        corpus document: ``unit << 32 | record``), ``position`` (in the document; a pooled
        row's last), ``token_ids``, a ``--positions mean`` run's ``position_first`` and
        ``count``, a run of conversations' ``role``, and the document's kept columns
        (``--keep-columns``). A ``--positions`` run holds one row per document (turn, or marker
        occurrence): what a probe is fit on. Needs pyarrow."""
        hooks = self._check_hooks(hooks)
        columns = ["doc_index"] + (["position_first", "count"] if self.has_pooled else [])
        parts = list(
            self.batches(hooks, batch_size=1 << 20, shuffle=False, output="numpy", dtype="raw", prefetch=0,
                         _columns=columns)
        )
        names = hooks + [fp8_scale_name(h) for h in hooks if self.dtype == FP8]
        table_names = ["doc_index", "position", "token_ids"] + columns[1:] + (["role"] if self.has_roles else [])
        if not parts:
            raise DatasetError(f"{self.url}: no committed rows")
        joined = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        convert = _convert.Converter(output, _convert.resolve_dtype(dtype, output), self.dtype, hooks, None)
        x = convert({k: joined[k] for k in names})
        kept = self.documents() if self.kept_columns else None
        return x, _documents.joined({k: joined[k] for k in table_names}, kept)

    @property
    def kept_columns(self) -> List[Tuple[str, str]]:
        """The documents' kept columns (``--keep-columns``) as ``(name, kind)``: ``int``,
        ``float``, ``bool``, ``string`` (a parquet column's type) or ``json`` (a jsonl field)."""
        return _documents.kept_columns(self.run)

    def documents(self) -> Any:
        """Every document the committed shards hold rows of, once, in document order: a pyarrow
        table of ``doc_index`` and its kept columns (``--keep-columns``), typed. Needs pyarrow."""
        if not self.kept_columns:
            raise DatasetError(f"{self.url}: the run keeps no columns of its documents (--keep-columns)")
        return _documents.read_documents(self._location, self.shards, self.kept_columns)

    def labeled(self, hook: str, label: str, *, dtype: Any = "float32") -> Any:
        """A torch Dataset of ``(x, y)`` pairs: each stored row of `hook` (flattened, in
        `dtype`) and its document's kept column `label`: what a probe trains on. Needs torch."""
        from .torch import LabeledRows

        if label not in dict(self.kept_columns):
            raise DatasetError(f"{label!r} is not a kept column of {self.url} (kept: {[c for c, _ in self.kept_columns]})")
        x, table = self.rows([hook], output="torch", dtype=dtype)
        return LabeledRows(x[hook].reshape(len(table), -1), table.column(label).to_pylist())

    def splice_metrics(self) -> Dict[str, Dict[str, float]]:
        """Each dictionary spliced in (``--splice``): its SAELens ``run_evals`` metrics over the
        run (``ce_loss_score``, ``kl_div_score``, the mean CEs and KLs, the reconstruction's mean
        squared error and, where the hook is stored, ``fvu``), by ``<hook>[.<dictionary>]``; see
        `siphon.outputs.splice_metrics`."""
        return splice_metrics(self._stats_json())

    def _stats_json(self) -> Dict[str, Any]:
        raw = self._location.read("stats.json")
        if raw is None:
            raise DatasetError(f"{self.url}: no stats.json (written when the run completes)")
        try:
            stats: Dict[str, Any] = json.loads(raw)
        except ValueError as e:
            raise DatasetError(f"{self.url}/stats.json: not valid JSON: {e}") from e
        return stats

    def output_stats(self, name: str) -> Dict[str, Any]:
        """stats.json's statistics of output `name` over the tokens the run counts
        (`siphon.outputs.output_stats`): ``count``; for a float output ``defined``, ``sum``,
        ``mean``, ``min``, ``max`` per element (``output_stats("output.nll")["mean"][0]`` is the
        cross-entropy over the tokens that have a next token)."""
        checked_outputs([name], self.outputs)
        return output_stats(self._stats_json(), name)

    # ----------------------------------------------------------------------------- latents

    def latent_shards(self, name: str, *, dtype: Any = "float32", check: bool = True) -> Iterator[LatentShard]:
        """One `LatentShard` per committed shard of latents column `name` (see `latents`),
        hosts in order, then shards: the CSR arrays, the values as `dtype` (``"float32"``,
        ``"float16"``, ``"bfloat16"`` or ``None`` for the stored dtype), and the shard's
        ``token_ids``, ``doc_index``, ``position``, ``sample_index`` (and ``mask``). Every row
        is there, those a ``keep_excluded`` mask excludes too; `LatentShard.row_start` numbers
        them in the run's global row order. With `check` (the default) each shard is read
        whole once and its CRC32C compared with its manifest line; without, only the tensors
        needed are read. The CSR structure is always checked."""
        info = checked_latents(name, self.latents)
        out = resolve_value_dtype(dtype)
        return iter_latent_shards(self._location, list(self.shards), info, has_mask=self._has_mask, dtype=out, check=check)

    def latent_shard_groups(
        self, names: Sequence[str], *, dtype: Any = "float32", check: bool = True
    ) -> Iterator[Dict[str, LatentShard]]:
        """Per committed shard, the `LatentShard` of each latents column of `names` by name
        (as `latent_shards` gives them), every column from one read of the shard: one pass
        over the run for several dictionaries."""
        infos = [checked_latents(name, self.latents) for name in names]
        out = resolve_value_dtype(dtype)
        return iter_latent_shard_groups(self._location, list(self.shards), infos, has_mask=self._has_mask, dtype=out,
                                        check=check)

    def read_latents(
        self,
        name: str,
        *,
        format: str = "csr",  # noqa: A002 - the name the formats go by
        dtype: Any = "float32",
        device: Any = None,
        check: bool = True,
    ) -> Iterator[Dict[str, Any]]:
        """Per committed shard (in `latent_shards` order) a dict of the shard's
        ``token_ids``, ``doc_index``, ``position``, ``sample_index`` (and ``mask`` in a
        ``keep_excluded`` run), ``row_start``, and its latents: ``format="csr"`` gives
        ``"latents"``, a ``torch.sparse_csr_tensor`` ``[rows, width]`` (on `device`);
        ``format="triples"`` gives numpy ``"token"`` (int64, the global row: rows of earlier
        shards counted first), ``"latent"`` (int32) and ``"value"``, rows ascending and latents
        ascending within a row. Values are float32 unless `dtype` says otherwise."""
        if format not in ("csr", "triples"):
            raise DatasetError(f"format must be 'csr' or 'triples', got {format!r}")
        if device is not None and format != "csr":
            raise DatasetError("device is only for format='csr' (torch)")
        for shard in self.latent_shards(name, dtype=dtype, check=check):
            item: Dict[str, Any] = {
                "token_ids": shard.token_ids, "doc_index": shard.doc_index, "position": shard.position,
                "sample_index": shard.sample_index, "row_start": shard.row_start,
            }
            if shard.mask is not None:
                item["mask"] = shard.mask
            if format == "csr":
                item["latents"] = shard.csr(device)
            else:
                item["token"], item["latent"], item["value"] = shard.triples()
            yield item

    def latent_stats(self, name: str) -> Dict[str, Any]:
        """stats.json's statistics of latents column `name` over the tokens the run counts
        (mask-included): ``count``, ``firings`` and ``sums`` per latent (numpy), ``frequency``
        (firings / count), ``mean`` (of the stored values where a latent fired) and ``max``
        (each latent's largest)."""
        checked_latents(name, self.latents)
        raw = self._location.read("stats.json")
        if raw is None:
            raise DatasetError(f"{self.url}: no stats.json (written when the run completes)")
        try:
            stats = json.loads(raw)
        except ValueError as e:
            raise DatasetError(f"{self.url}/stats.json: not valid JSON: {e}") from e
        return latents_stats(stats, name)


def _latents_header_problems(where: str, tensors: Mapping[str, Any], info: LatentsInfo, tokens: int) -> List[str]:
    """What is wrong with a shard header's CSR tensors of latents column `info`."""
    problems = []
    indptr, indices, values = (tensors.get(n) for n in csr_names(info.name))
    if indptr is None or indices is None or values is None:
        return [f"{where}: latents {info.name}: missing " + ", ".join(n for n, t in zip(csr_names(info.name), (indptr, indices, values)) if t is None)]
    if indptr.dtype != "I32" or indptr.shape != (tokens + 1,):
        problems.append(f"{where}: latents {info.name}: indptr is {indptr.dtype} {list(indptr.shape)}, expected I32 [{tokens + 1}]")
    if indices.dtype != "I32" or len(indices.shape) != 1 or values.shape != indices.shape:
        problems.append(f"{where}: latents {info.name}: indices {indices.dtype} {list(indices.shape)} and values {list(values.shape)}, expected I32 [nnz] and [nnz]")
    if values.dtype not in VALUE_DTYPES or STORED_DTYPES[values.dtype][1] != info.dtype:
        problems.append(f"{where}: latents {info.name}: values are {values.dtype}, the run stores {info.dtype}")
    return problems


def checked_hooks(hooks: Optional[Sequence[str]], available: Sequence[str]) -> List[str]:
    """`hooks` (a name, names, or ``None`` for all) as a list of some of `available`, each
    once; otherwise an error naming what is wrong."""
    if hooks is None:
        return list(available)
    if isinstance(hooks, str):
        hooks = [hooks]
    hooks = list(hooks)
    if not hooks:
        raise DatasetError("hooks is empty: name at least one of " + ", ".join(available))
    for hook in hooks:
        if hook not in available:
            import difflib

            near = difflib.get_close_matches(hook, list(available), n=3)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            raise DatasetError(f"unknown hook {hook!r}{hint}: this run has " + ", ".join(available))
    if len(set(hooks)) != len(hooks):
        raise DatasetError(f"hooks {hooks} name a hook twice")
    return hooks


#: Where a reader's iteration continues: (epoch, window, rows of the window already read).
Position = Tuple[int, int, int]


@dataclass(frozen=True, eq=False)
class _Iteration:
    """Everything one reader's iteration over epochs needs (`Dataset.batches` checks it).

    An epoch's units (`split_units`) are read in windows of at most `capacity` rows
    (`windows_of`); with `shuffle`, each window's rows are permuted by a generator seeded with
    (seed, epoch, reader, readers, window). Batches are consecutive `batch_size` rows of that
    stream, so the position after any batch, (epoch, window, offset), is all it takes to
    continue exactly: the window is read again and its first `offset` permuted rows skipped.
    """

    units: List[Unit]
    reader: UnitReader
    convert: _convert.Converter
    shuffle: bool
    seed: int
    epoch: int
    epochs: Optional[int]
    #: This reader's index among ``consumers`` (rank × worker).
    consumer: int
    consumers: int
    batch_size: int
    capacity: int
    unit_tokens: int
    prefetch: int
    drop_last: bool

    def fingerprint(self) -> str:
        """What decides the order of the rows, for checking that a saved position fits."""
        f = self.reader.filter
        key = [
            [(u.shard.rel, u.start, u.end) for u in self.units],
            self.shuffle, self.seed, self.consumer, self.consumers, self.batch_size, self.capacity, self.drop_last,
            None if f.exclude_token_ids is None else f.exclude_token_ids.tolist(), f.min_position, f.max_position,
            None if f.roles is None else f.roles.tolist(),
        ]
        return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]

    def run(self, start: Optional[Position] = None) -> "Batches":
        if self.epochs is None and not split_units(self.units, False, self.seed, self.epoch, self.consumer, self.consumers):
            raise DatasetError(
                f"reader {self.consumer} of {self.consumers} (rank x worker) gets no data: the run has only "
                f"{len(self.units)} unit(s); use fewer ranks/workers or a smaller unit_tokens"
            )
        start = start or (self.epoch, 0, 0)
        return Batches(self._epochs(start), self, start)

    def _epochs(self, start: Position) -> Iterator[Tuple[Batch, Position]]:
        e, window, offset = start
        while self.epochs is None or e < self.epoch + self.epochs:
            yield from self._one_epoch(e, window, offset)
            e, window, offset = e + 1, 0, 0

    def _one_epoch(self, e: int, first: int, offset: int) -> Iterator[Tuple[Batch, Position]]:
        mine = split_units(self.units, self.shuffle, self.seed, e, self.consumer, self.consumers)
        if not mine:
            return
        reader, b = self.reader, self.batch_size
        windows = windows_of(mine, self.capacity if self.shuffle else 1)
        window = Window(templates_for(reader, mine[0].shard), max(self.capacity, self.unit_tokens) if self.shuffle else self.unit_tokens)
        later = [u for w in windows[first:] for u in w]
        loaded = None if reader.location.local else read_ahead(later, reader.load, self.prefetch)
        pending: List[Arrays] = []
        have = 0
        for k in range(first, len(windows)):
            window.n = 0
            for unit in windows[k]:
                if loaded is None:
                    # Local disk: straight into the window (one copy from the page cache).
                    window.fill(unit.end - unit.start, functools.partial(reader.load_into, unit))
                else:
                    window.add(next(loaded))
            n = window.n
            order = np.random.default_rng([self.seed, e, self.consumer, self.consumers, k]).permutation(n) if self.shuffle else None
            i = offset if k == first else 0
            while i < n:
                take = min(b - have, n - i)
                pending.append(window.rows(slice(i, i + take) if order is None else order[i : i + take]))
                have += take
                i += take
                if have == b:
                    yield self.convert(_concat(pending)), ((e, k, i) if i < n else (e, k + 1, 0))
                    pending, have = [], 0
        if have and not self.drop_last:
            yield self.convert(_concat(pending)), (e + 1, 0, 0)


def _concat(parts: List[Arrays]) -> Dict[str, np.ndarray]:
    if len(parts) == 1:
        return dict(parts[0])
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}


class Batches(Iterator[Batch]):
    """The iterator `Dataset.batches` returns: `Batch`es, and `state_dict` — where it stands
    after the last batch it gave, to continue exactly from there with
    ``Dataset.batches(..., resume=state)`` (the same arguments otherwise)."""

    def __init__(self, items: Iterator[Tuple[Batch, Position]], plan: _Iteration, start: Position) -> None:
        self._items = items
        self._plan = plan
        self._position = start

    def __iter__(self) -> "Batches":
        return self

    def __next__(self) -> Batch:
        batch, self._position = next(self._items)
        return batch

    def state_dict(self) -> Dict[str, Any]:
        """A small JSON-serialisable state: the position after the last batch given."""
        e, window, offset = self._position
        plan = self._plan
        return {
            "version": 1, "epoch": e, "window": window, "offset": offset,
            "reader": plan.consumer, "readers": plan.consumers, "settings": plan.fingerprint(),
        }


def _start_of(resume: Optional[Mapping[str, Any]], plan: _Iteration) -> Optional[Position]:
    """The position a saved state continues from, checked against the iteration's settings."""
    if resume is None:
        return None
    if resume.get("version") != 1:
        raise DatasetError(f"unknown state {dict(resume)!r}: not one a siphon reader saved")
    if (resume.get("reader"), resume.get("readers")) != (plan.consumer, plan.consumers):
        raise DatasetError(
            f"the state is reader {resume.get('reader')} of {resume.get('readers')}; this is reader "
            f"{plan.consumer} of {plan.consumers} (rank x worker)"
        )
    if resume.get("settings") != plan.fingerprint():
        raise DatasetError(
            "the state was saved with other settings (shards, seed, batch size, shuffle buffer, filters "
            "or drop_last): restore it with the arguments it was saved with"
        )
    return int(resume["epoch"]), int(resume["window"]), int(resume["offset"])


def _deprecated_output(format: Optional[str], output: str) -> str:  # noqa: A002
    """`output`, or the deprecated `format` that named it before."""
    if format is None:
        return output
    warnings.warn("format= is deprecated: use output=", DeprecationWarning, stacklevel=3)
    return format


STORED_DTYPES_BY_NAME = {logical: np_dtype for np_dtype, logical in STORED_DTYPES.values()}


def _check_checksum(location: Location, shard: ManifestLine) -> Optional[str]:
    """What is wrong with the shard's bytes against its manifest checksum (CRC32C, or the
    sha256 of shards written before it), or None."""
    step = 64 << 20
    chunks = (location.read_range(shard.rel, start, min(shard.bytes, start + step)) for start in range(0, shard.bytes, step))
    if shard.crc32c is not None:
        crc = 0
        for chunk in chunks:
            crc = google_crc32c.extend(crc, chunk)
        found, expected = f"crc32c {crc:08x}", f"crc32c {shard.crc32c}"
    elif shard.sha256 is not None:
        sha = hashlib.sha256()
        for chunk in chunks:
            sha.update(chunk)
        found, expected = f"sha256 {sha.hexdigest()}", f"sha256 {shard.sha256}"
    else:
        return "the manifest line records no checksum (crc32c or sha256)"
    return None if found == expected else f"{found}, the manifest says {expected}"


def open_dataset(url: Union[str, "os.PathLike[str]"], storage_options: Optional[Mapping[str, Any]] = None) -> Dataset:
    """Opens a siphon run (the ``{output}/{run}`` directory): a local path, ``file://``,
    ``s3://`` (s3fs) or ``gs://`` (gcsfs). `storage_options` go to fsspec (e.g.
    ``{"endpoint_url": ...}``); ``AWS_ENDPOINT``, as siphon's extraction reads it, also works."""
    return Dataset(str(url), storage_options)


def open(url: Union[str, "os.PathLike[str]"], storage_options: Optional[Mapping[str, Any]] = None) -> Dataset:  # noqa: A001
    """Deprecated name of `open_dataset` (it shadows the builtin)."""
    warnings.warn("siphon.open is deprecated: use siphon.open_dataset", DeprecationWarning, stacklevel=2)
    return open_dataset(url, storage_options)
