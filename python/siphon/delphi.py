"""Export a run's dictionary latents as delphi's latent cache (EleutherAI's automated
interpretability, PyPI ``eai-delphi``), so that delphi's own ``LatentDataset`` explains and
scores them without running the model again::

    python -m siphon export-delphi out/runs/tiny results/tiny/latents --splits 5

writes, per latents column, what delphi's ``LatentCache.save_splits`` and ``save_config``
write for one hookpoint::

    OUT/<hookpoint>/config.json                 delphi's CacheConfig fields + model_name
    OUT/<hookpoint>/<start>_<end>.safetensors   latents start..end (inclusive), delphi's split
        locations    [N, 3] (sequence, position, latent - start): uint16 when every column
                     fits in 16 bits, else uint32 (delphi's own rule)
        activations  [N] float16
        tokens       [n_seq, ctx_len] int64: every sequence, in every split

Every split file is written, those without a firing too (delphi's loader takes them; its own
``save_splits`` cannot write them). `<hookpoint>` is the module path delphi hooks for the dictionary's hook (``layers.3`` for
``blocks.3.hook_resid_post``, ``layers.3.mlp`` for a transcoder reading
``blocks.3.ln2.hook_normalized``; `delphi_hookpoint`), which is how ``LatentDataset(raw_dir,
modules=[...])`` and delphi's ``--hookpoints`` name it. Entries are what delphi's cache keeps:
``|value| > 1e-5``, in (sequence, position, latent) order.

Sequences. delphi's cache is token rows ``[n_seq, ctx_len]``; siphon stores token rows with
their ``sample_index`` (the host's sequence) and in-document ``position``. Two ways to rebuild
them (`sequences`):

- ``"exact"`` (default): the rows the model ran on, each whole: needs a run extracted with
  ``--keep-excluded`` (BOS, EOS and padding are stored too, masked) and without token
  shuffling; ``ctx_len`` is the run's ``seq_len``. Latents of excluded tokens (BOS, EOS,
  padding, ``--exclude-tokens``) are left out unless ``excluded_latents="keep"`` (which is
  what delphi's ``LatentCache`` computes on the same rows, padding aside); their tokens stay.
- ``"stored"``: the stored (mask-included) tokens in run order, concatenated and cut into
  rows of ``ctx_len`` (default ``seq_len``; the remainder left out), as delphi's
  ``filter_bos`` cuts its token stream. A token's latents are those the run computed in its
  own sequence; windows may cross documents, as delphi's do.

Other runs are refused with the reason. delphi's constructor cuts the rows into windows of
``example_ctx_len`` (32 by default), which must divide ``ctx_len``.

`export` reads the latents in one pass over the shards (each checked against its CRC32C with
`check`) and spills the entries to disk per split, so memory holds one split at a time.
``siphon export delphi`` (``crates/cli/src/cmd/export.rs``) runs it through ``python -m siphon
export-delphi``. ``scripts/delphi_compare.py`` (in the venv of
``scripts/setup-python-delphi.sh``) checks an export with delphi's own ``LatentDataset`` and
against delphi's own ``LatentCache``.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import IO, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ._format import write_safetensors
from ._output import check_count, check_new_or_empty
from .dataset import Dataset, open_dataset
from .errors import DatasetError
from .latents import LatentsInfo, ShardLoader, check_csr, checked_latents, convert_values, csr_names

#: delphi keeps a latent's entry when ``|activation| > 1e-5`` (``InMemoryCache.get_nonzeros``).
DELPHI_MIN_ACTIVATION = 1e-5
#: The modes of `export`'s ``sequences``.
SEQUENCE_MODES = ("exact", "stored")

_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")


@dataclass
class Sequences:
    """A run's token rows as delphi's ``[n_seq, ctx_len]`` token array, and where each stored
    row lies in it."""

    mode: str
    ctx_len: int
    #: ``[n_seq, ctx_len]`` int64 token ids.
    tokens: np.ndarray
    #: ``[n_seq, ctx_len]``: whether the token is one the run includes (its mask), all True
    #: in ``"stored"`` mode.
    included: np.ndarray
    #: Per stored row of the run (global row order): its sequence, or -1 when it is in none.
    row_seq: np.ndarray
    #: Per stored row: its position in the sequence (-1 when in none).
    row_pos: np.ndarray

    @property
    def n_seq(self) -> int:
        return int(self.tokens.shape[0])


def rebuild_sequences(ds: Dataset, mode: str = "exact", ctx_len: Optional[int] = None) -> Sequences:
    """The run's token rows (see the module docs for `mode`); an error naming what is wrong
    when the run cannot give them."""
    if mode not in SEQUENCE_MODES:
        raise DatasetError(f"sequences must be one of {', '.join(SEQUENCE_MODES)}, got {mode!r}")
    fmt = ds.run.get("shard_format", {})
    if fmt.get("shuffle"):
        raise DatasetError(
            f"{ds.url} stores its tokens shuffled (shard_format.shuffle {fmt.get('shuffle')!r}): their sequences "
            "cannot be rebuilt for delphi; extract without token shuffling"
        )
    if not ds.shards:
        raise DatasetError(f"{ds.url} has no committed shards")
    if mode == "exact":
        _check_exact(ds, ctx_len)
    stored_ctx = _stored_ctx_len(ds, ctx_len) if mode == "stored" else 0
    loader = ShardLoader(ds._location, ds._has_mask, check=False)
    cols: Dict[str, List[np.ndarray]] = {n: [] for n in ("token_ids", "sample_index", "doc_index", "position", "mask")}
    hosts: List[np.ndarray] = []
    for k, shard in enumerate(ds.shards):
        got = loader.load(shard, ["token_ids", "sample_index", "doc_index", "position"])
        for name, (_, a) in got.items():
            cols[name].append(a)
        hosts.append(np.full(shard.tokens, k, dtype=np.int64))
    joined = {n: np.concatenate(v) for n, v in cols.items() if v}
    if mode == "exact":
        host_of_shard = np.asarray([_host_number(s.host) for s in ds.shards], dtype=np.int64)
        return _exact(ds, joined, host_of_shard[np.concatenate(hosts)], ctx_len)
    return _stored(ds, joined, stored_ctx)


def _host_number(host: str) -> int:
    m = re.match(r"^machine_(\d+)_host_(\d+)$", host)
    return int(m.group(1)) * 1000 + int(m.group(2)) if m else 0


def _check_exact(ds: Dataset, ctx_len: Optional[int]) -> None:
    """Whether the run can give its rows exactly (before any shard is read)."""
    seq_len = ds.seq_len
    if not ds._has_mask:
        raise DatasetError(
            f"{ds.url} dropped its excluded tokens (BOS, EOS, padding; extracted without --keep-excluded), so its "
            "sequences cannot be rebuilt exactly: extract with --keep-excluded, or export with "
            "sequences='stored' (--sequences stored: the stored tokens cut into ctx_len rows, as delphi's filter_bos)"
        )
    if seq_len is None:
        raise DatasetError(f"{ds.url}/run.json records no seq_len: exact sequences need it")
    if ctx_len is not None and ctx_len != seq_len:
        raise DatasetError(
            f"exact sequences are the run's rows of seq_len {seq_len} tokens; ctx_len {ctx_len} needs sequences='stored'"
        )


def _stored_ctx_len(ds: Dataset, ctx_len: Optional[int]) -> int:
    """The row length of stored sequences (before any shard is read): `ctx_len`, else the
    run's seq_len; at most the run's tokens (more would leave no row)."""
    ctx = ctx_len if ctx_len is not None else ds.seq_len
    if ctx is None:
        raise DatasetError(f"{ds.url}/run.json records no seq_len: give ctx_len (--ctx-len)")
    return check_count("ctx_len", ctx, 1, ds.tokens, most_is=f"the {ds.tokens} tokens {ds.url} stores")


def _exact(ds: Dataset, cols: Dict[str, np.ndarray], host: np.ndarray, ctx_len: Optional[int]) -> Sequences:
    seq_len = int(ds.seq_len or 0)
    sample = cols["sample_index"]
    n = len(sample)
    # A sequence is a run of rows of one host with one sample_index.
    change = np.flatnonzero((np.diff(sample) != 0) | (np.diff(host) != 0)) + 1
    starts = np.concatenate([[0], change]).astype(np.int64)
    lengths = np.diff(np.concatenate([starts, [n]]))
    bad = np.flatnonzero(lengths != seq_len)
    if len(bad):
        i = int(bad[0])
        raise DatasetError(
            f"{ds.url}: sequence {int(sample[starts[i]])} of host {_host_name(ds, host[starts[i]])} has "
            f"{int(lengths[i])} stored tokens, expected seq_len {seq_len} (a sequence's rows must be stored whole and "
            "together, as --keep-excluded without shuffling stores them)"
        )
    keys = host[starts] * (1 << 40) + sample[starts]
    if len(np.unique(keys)) != len(keys):
        raise DatasetError(f"{ds.url}: a sequence's rows are stored in more than one place (not in stored order)")
    doc, pos = cols["doc_index"], cols["position"]
    same_doc = (doc[1:] == doc[:-1]) & (doc[1:] >= 0)
    same_doc[change - 1] = False
    if (pos[1:][same_doc] != pos[:-1][same_doc] + 1).any():
        raise DatasetError(f"{ds.url}: tokens of a document are out of order within a sequence (rows not in stored order)")
    n_seq = len(starts)
    row_seq = np.repeat(np.arange(n_seq, dtype=np.int64), lengths)
    row_pos = np.arange(n, dtype=np.int64) - np.repeat(starts, lengths)
    return Sequences(
        mode="exact",
        ctx_len=seq_len,
        tokens=cols["token_ids"].astype(np.int64).reshape(n_seq, seq_len),
        included=cols["mask"].astype(bool).reshape(n_seq, seq_len),
        row_seq=row_seq,
        row_pos=row_pos,
    )


def _host_name(ds: Dataset, number: Any) -> str:
    for s in ds.shards:
        if _host_number(s.host) == int(number):
            return s.host
    return str(number)


def _stored(ds: Dataset, cols: Dict[str, np.ndarray], ctx: int) -> Sequences:
    ids = cols["token_ids"]
    keep = cols["mask"].astype(bool) if "mask" in cols else np.ones(len(ids), dtype=bool)
    order = np.flatnonzero(keep)
    n_seq = len(order) // ctx
    if n_seq == 0:
        raise DatasetError(f"{ds.url} stores {len(order)} included tokens, fewer than one row of ctx_len {ctx}")
    used = order[: n_seq * ctx]
    row_seq = np.full(len(ids), -1, dtype=np.int64)
    row_pos = np.full(len(ids), -1, dtype=np.int64)
    row_seq[used] = np.arange(len(used), dtype=np.int64) // ctx
    row_pos[used] = np.arange(len(used), dtype=np.int64) % ctx
    return Sequences(
        mode="stored",
        ctx_len=ctx,
        tokens=ids[used].astype(np.int64).reshape(n_seq, ctx),
        included=np.ones((n_seq, ctx), dtype=bool),
        row_seq=row_seq,
        row_pos=row_pos,
    )


def split_bounds(width: int, n_splits: int) -> List[Tuple[int, int]]:
    """delphi's latent ranges ``(start, end)``, end inclusive: ``torch.linspace(0, width,
    n_splits + 1).long()`` (float32, computed as torch computes it on the CPU: from the start
    for the first half of the steps, from the end for the rest), ends less one."""
    if n_splits <= 0:
        raise DatasetError(f"splits must be positive, got {n_splits}")
    steps = n_splits + 1
    start, end = np.float32(0), np.float32(width)
    step = (end - start) / np.float32(steps - 1)
    halfway = steps // 2
    points = [
        start + step * np.float32(i) if i < halfway else end - step * np.float32(steps - i - 1) for i in range(steps)
    ]
    bounds = [int(np.float32(p)) for p in points]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(n_splits)]


def is_transcoder(info: LatentsInfo) -> bool:
    """Whether the dictionary is a transcoder (it reads one hook and predicts another), by
    run.json's description or, when that names a local folder (``source``), its cfg.json."""
    d = info.dictionary
    for key in ("transcoder", "transcode"):
        if bool(d.get(key)):
            return True
    for key in ("architecture", "kind", "type", "format"):
        if "transcoder" in str(d.get(key, "")).lower():
            return True
    out = d.get("hook_out") or d.get("output_hook") or d.get("hook_name_out")
    if out and out != info.hook:
        return True
    # The dictionary's own cfg.json, when its source is a local folder (SAELens: "architecture"
    # names transcoders; sparsify: "transcode").
    source = d.get("source") or d.get("path")
    cfg = os.path.join(str(source), "cfg.json") if source else ""
    if cfg and os.path.isfile(cfg):
        try:
            with open(cfg) as f:
                raw = json.load(f)
        except (OSError, ValueError):
            return False
        return "transcoder" in str(raw.get("architecture", "")).lower() or bool(raw.get("transcode"))
    return False


def delphi_hookpoint(hook: str, model_type: str, transcoder: bool = False) -> Optional[str]:
    """The module path delphi hooks (on ``AutoModel``, the model without its LM head) for a
    dictionary on siphon hook `hook`, or ``None`` when there is no known one. A transcoder
    reads its module's input (delphi's ``transcode``), an SAE its output."""
    m = _BLOCK.match(hook)
    if not m:
        return None
    layer, rest = int(m.group(1)), m.group(2)
    layers = "h" if model_type == "gpt2" else "layers"
    attn = {"gpt2": "attn", "gpt_neox": "attention"}.get(model_type, "self_attn")
    # Gemma 2 and later norm each sublayer's output before the residual add (TransformerLens's
    # hook_mlp_out / hook_attn_out are those norms' outputs).
    post_norms = model_type.startswith("gemma") and model_type != "gemma"
    block = f"{layers}.{layer}"
    if rest == "hook_resid_post":
        return None if transcoder else block
    if rest == "hook_resid_pre":
        if transcoder:
            return block
        return f"{layers}.{layer - 1}" if layer > 0 else None
    if rest in ("ln2.hook_normalized", "hook_mlp_in"):
        # The MLP's input: delphi hooks it as the input of the MLP module (transcode), as
        # sparsify's and delphi's transcoders name it. (siphon's ln2.hook_normalized is the
        # norm's output before its gain, the MLP module's input after it.)
        return f"{block}.mlp"
    if rest == "hook_mlp_out" and not transcoder:
        return f"{block}.post_feedforward_layernorm" if post_norms else f"{block}.mlp"
    if rest == "hook_attn_out" and not transcoder:
        return f"{block}.post_attention_layernorm" if post_norms else f"{block}.{attn}"
    return None


def model_name_of(run: Mapping[str, Any]) -> str:
    """The name delphi loads the tokenizer by (``AutoTokenizer.from_pretrained``): a Hub
    model's ``OWNER/NAME``, else the model path the run was extracted from."""
    model = str(run.get("config", {}).get("model") or run.get("model", {}).get("path") or "")
    if model.startswith("hf://"):
        return model[len("hf://"):].split("@", 1)[0]
    return model


@dataclass
class DelphiExportSummary:
    """What `export` wrote."""

    path: str
    #: latents column -> the hookpoint folder it was written to.
    hookpoints: Dict[str, str]
    sequences: str
    n_seq: int
    ctx_len: int
    #: latents column -> its latent ranges ``(start, end)``, end inclusive (one file each).
    splits: Dict[str, List[Tuple[int, int]]] = field(default_factory=dict)
    #: latents column -> entries written.
    entries: Dict[str, int] = field(default_factory=dict)
    #: latents column -> stored entries left out (|value| <= min_activation, excluded tokens,
    #: rows in no sequence).
    left_out: Dict[str, int] = field(default_factory=dict)


def export(
    dataset: Union[Dataset, str, "os.PathLike[str]"],
    out_dir: Union[str, "os.PathLike[str]"],
    latents: Optional[Sequence[str]] = None,
    *,
    n_splits: int = 5,
    ctx_len: Optional[int] = None,
    sequences: str = "exact",
    hookpoints: Optional[Mapping[str, str]] = None,
    model_name: Optional[str] = None,
    excluded_latents: str = "drop",
    min_activation: float = DELPHI_MIN_ACTIVATION,
    check: bool = True,
    storage_options: Optional[Mapping[str, Any]] = None,
) -> DelphiExportSummary:
    """Writes latents columns `latents` (default: all) of a run to `out_dir` as delphi's
    latent cache (see the module docs); returns what was written. `hookpoints` maps a column
    to its folder name (default `delphi_hookpoint` of its hook and the run's model type);
    each folder must not exist yet or be empty (other folders of `out_dir` are left alone).
    `model_name` goes to config.json (default `model_name_of` the run). One pass over the
    shards (each checked against its CRC32C with `check`); entries are spilled to disk per
    split, so memory holds one split at a time."""
    ds = dataset if isinstance(dataset, Dataset) else open_dataset(dataset, storage_options)
    if excluded_latents not in ("drop", "keep"):
        raise DatasetError(f"excluded_latents must be 'drop' or 'keep', got {excluded_latents!r}")
    if not 0 <= min_activation < math.inf:
        raise DatasetError(f"min_activation (--min-activation) must be a finite number >= 0, got {min_activation}")
    if latents is None:
        if not ds.latents:
            raise DatasetError(f"{ds.url} stores no dictionary latents (run.json has no \"latents\"): nothing to export")
        latents = list(ds.latents)
    infos = [checked_latents(name, ds.latents) for name in latents]
    if len({i.name for i in infos}) != len(infos):
        raise DatasetError(f"latents {list(latents)} name a column twice")
    for info in infos:
        # torch's ranges past the latents would be empty (and 4e9 of them fill the memory).
        check_count("n_splits", n_splits, 1, info.width, flag="--splits", most_is=f"the latents of {info.name!r}")
    splits = {i.name: split_bounds(i.width, n_splits) for i in infos}
    folders = _folders(ds, infos, hookpoints or {})
    out = os.path.abspath(os.fspath(out_dir))
    for folder in folders.values():
        check_new_or_empty(os.path.join(out, folder), "a hookpoint's split files")
    seqs = rebuild_sequences(ds, sequences, ctx_len)
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".siphon-delphi-", dir=out)
    try:
        spills = {i.name: _Spill(os.path.join(tmp, f"{k}"), splits[i.name]) for k, i in enumerate(infos)}
        left_out = _fill(ds, infos, seqs, spills, excluded_latents == "keep", min_activation, check)
        config = _cache_config(ds, seqs, n_splits, model_name)
        entries = {}
        for info in infos:
            folder = os.path.join(tmp, "out", folders[info.name])
            os.makedirs(folder)
            entries[info.name] = spills[info.name].write(folder, seqs.tokens)
            meta = dict(config, siphon={
                "run": ds.url, "latents": info.name, "hook": info.hook, "width": info.width,
                "dictionary": dict(info.dictionary), "sequences": seqs.mode, "excluded_latents": excluded_latents,
                "min_activation": min_activation,
            })
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(meta, f, indent=4)
        for info in infos:
            target = os.path.join(out, folders[info.name])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.isdir(target):
                os.rmdir(target)
            os.replace(os.path.join(tmp, "out", folders[info.name]), target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return DelphiExportSummary(
        path=out, hookpoints=folders, sequences=seqs.mode, n_seq=seqs.n_seq, ctx_len=seqs.ctx_len,
        splits=splits, entries=entries, left_out=left_out,
    )


def _folders(ds: Dataset, infos: Sequence[LatentsInfo], given: Mapping[str, str]) -> Dict[str, str]:
    unknown = [n for n in given if n not in {i.name for i in infos}]
    if unknown:
        raise DatasetError(f"hookpoints name latents that are not exported: {', '.join(unknown)}")
    model_type = str(ds.run.get("model", {}).get("config", {}).get("arch", ""))
    folders: Dict[str, str] = {}
    for info in infos:
        folder = given.get(info.name) or delphi_hookpoint(info.hook, model_type, is_transcoder(info))
        if not folder:
            raise DatasetError(
                f"no delphi hookpoint known for latents {info.name} (hook {info.hook!r}, model type {model_type!r}"
                f"{', a transcoder' if is_transcoder(info) else ''}): name it, e.g. --hookpoint {info.name}=layers.3 "
                "(the module path delphi hooks on AutoModel)"
            )
        if folder in ("", ".", "..") or folder.startswith("/") or ".." in folder.split("/"):
            raise DatasetError(f"hookpoint {folder!r} is not a folder name")
        folders[info.name] = folder
    clash = [f for f in set(folders.values()) if list(folders.values()).count(f) > 1]
    if clash:
        raise DatasetError(
            f"several latents columns map to hookpoint {clash[0]!r} (several dictionaries on one hook): name each "
            "one's folder with --hookpoint NAME=FOLDER"
        )
    return folders


def _cache_config(ds: Dataset, seqs: Sequences, n_splits: int, model_name: Optional[str]) -> Dict[str, Any]:
    """delphi's CacheConfig fields (``CacheConfig.to_dict()``) and ``model_name``, as
    ``LatentCache.save_config`` writes them, filled in from the run."""
    config = ds.run.get("config", {})
    corpus = config.get("corpus", {})
    return {
        "dataset_repo": str(corpus.get("corpus", "")),
        "dataset_split": str(corpus.get("hf_split") or "train"),
        "dataset_name": str(corpus.get("hf_config") or ""),
        "dataset_column": str(corpus.get("text_column") or "text"),
        "batch_size": int(corpus.get("batch_size") or 1),
        "cache_ctx_len": seqs.ctx_len,
        "n_tokens": seqs.n_seq * seqs.ctx_len,
        "n_splits": n_splits,
        "model_name": model_name if model_name is not None else model_name_of(ds.run),
    }


class _Spill:
    """One latents column's entries, appended per split to files on disk as they are read:
    locations as uint32 triples, activations as float16."""

    def __init__(self, prefix: str, splits: List[Tuple[int, int]]) -> None:
        self.prefix = prefix
        self.splits = splits
        # The first latent of each split after the first: a latent's split is the number of
        # these it is at or above.
        self.edges = np.asarray([s for s, _ in splits[1:]], dtype=np.int64)
        self.files: List[Tuple[IO[bytes], IO[bytes]]] = [
            (open(f"{prefix}.{k}.loc", "wb"), open(f"{prefix}.{k}.act", "wb")) for k in range(len(splits))
        ]
        self.maxima = np.zeros((len(splits), 3), dtype=np.int64)
        self.counts = np.zeros(len(splits), dtype=np.int64)

    def add(self, seq: np.ndarray, pos: np.ndarray, latent: np.ndarray, act: np.ndarray) -> None:
        which = np.searchsorted(self.edges, latent, side="right")
        order = np.argsort(which, kind="stable")
        bounds = np.searchsorted(which[order], np.arange(len(self.splits) + 1))
        for k in range(len(self.splits)):
            pick = order[bounds[k] : bounds[k + 1]]
            if not len(pick):
                continue
            loc = np.stack([seq[pick], pos[pick], latent[pick].astype(np.int64) - self.splits[k][0]], axis=1)
            self.maxima[k] = np.maximum(self.maxima[k], loc.max(axis=0))
            self.counts[k] += len(pick)
            loc.astype(np.uint32).tofile(self.files[k][0])
            act[pick].astype(np.float16).tofile(self.files[k][1])

    def write(self, folder: str, tokens: np.ndarray) -> int:
        """Writes each split's file; returns the entries written."""
        for loc_f, act_f in self.files:
            loc_f.close()
            act_f.close()
        for k, (start, end) in enumerate(self.splits):
            loc = np.fromfile(f"{self.prefix}.{k}.loc", dtype=np.uint32).reshape(-1, 3)
            act = np.fromfile(f"{self.prefix}.{k}.act", dtype=np.float16)
            # delphi's rule: uint16 when the values fit, else uint32.
            small = bool((self.maxima[k] < (1 << 16)).all())
            locations = loc.astype(np.uint16) if small else loc
            write_safetensors(
                os.path.join(folder, f"{start}_{end}.safetensors"),
                {"locations": locations, "activations": act, "tokens": tokens},
            )
            os.remove(f"{self.prefix}.{k}.loc")
            os.remove(f"{self.prefix}.{k}.act")
        return int(self.counts.sum())


def _fill(
    ds: Dataset,
    infos: Sequence[LatentsInfo],
    seqs: Sequences,
    spills: Mapping[str, _Spill],
    keep_excluded: bool,
    min_activation: float,
    check: bool,
) -> Dict[str, int]:
    """One pass over the shards: each column's kept entries into its spill; returns the
    entries left out per column."""
    if seqs.n_seq >= (1 << 32):
        raise DatasetError(f"{seqs.n_seq} sequences do not fit delphi's uint32 locations")
    loader = ShardLoader(ds._location, ds._has_mask, check)
    names = [n for i in infos for n in csr_names(i.name)] + ["token_ids"]
    left_out = {i.name: 0 for i in infos}
    row_start = 0
    for shard in ds.shards:
        where = f"{ds.url}/{shard.rel}"
        tensors = loader.load(shard, names)
        if tensors["token_ids"][1].shape != (shard.tokens,):
            raise DatasetError(f"{where}: token_ids has {len(tensors['token_ids'][1])} rows, the manifest says {shard.tokens}")
        mask = tensors["mask"][1].astype(bool) if "mask" in tensors else None
        for info in infos:
            check_csr(info, tensors, shard.tokens, where)
            p_name, i_name, v_name = csr_names(info.name)
            indptr, indices = tensors[p_name][1], tensors[i_name][1]
            v_info, raw = tensors[v_name]
            values = convert_values(raw, v_info.dtype, "float32")
            counts: np.ndarray = np.diff(indptr.astype(np.int64))
            local = np.repeat(np.arange(shard.tokens, dtype=np.int64), counts)
            rows = local + row_start
            seq, pos = seqs.row_seq[rows], seqs.row_pos[rows]
            keep = (seq >= 0) & (np.abs(values) > min_activation)
            if mask is not None and not keep_excluded:
                keep &= mask[local]
            left_out[info.name] += int(len(keep) - keep.sum())
            spills[info.name].add(seq[keep], pos[keep], indices[keep], values[keep])
        row_start += shard.tokens
    return left_out
