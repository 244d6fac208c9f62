"""Sparse dictionary (SAE, transcoder) latents stored in a run's shards.

A run extracted with dictionaries lists them in run.json's ``"latents"``: each entry names a
column (``<hook>.hook_sae_acts_post``, or ``<hook>.hook_sae_acts_post.<dictionary>`` when
several dictionaries read one hook), the hook the dictionary reads, its number of latents
(``width``), the most latents one token may fire (``cap``) and a description of the
dictionary. Every shard holds each column as a CSR matrix ``[tokens, width]`` over the
shard's token rows (the rows of ``token_ids``, ``doc_index``, ``position``, ``sample_index``
and, in a ``keep_excluded`` run, ``mask``: excluded tokens have rows too):

- ``{name}.indptr``  I32 ``[tokens + 1]``: row ``t``'s entries are ``indptr[t]:indptr[t + 1]``;
- ``{name}.indices`` I32 ``[nnz]``: the latents that fired, ascending within a row;
- ``{name}.values``  ``[nnz]`` in the run's stored dtype (F32, BF16 or F16).

`Dataset.latent_shards` yields one `LatentShard` per committed shard (hosts in order, then
shards), each able to give its rows as a ``torch.sparse_csr_tensor``, as ``(token, latent,
value)`` triples numbered in the run's global row order, or dense; `Dataset.read_latents`
gives the first two shard by shard, and `Dataset.latents` the `LatentsInfo` of each column.
With ``check=True`` (the default) a shard is read whole and checked against its manifest
line's CRC32C; its CSR structure is checked always.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from . import _convert
from ._format import STORED_DTYPES, ManifestLine, ShardHeader, TensorInfo, decode, header_of, parse_header
from ._location import Location
from .errors import DatasetError

#: The three tensors of a latents column, by suffix.
CSR_SUFFIXES = (".indptr", ".indices", ".values")
#: The per-row tensors a `LatentShard` carries beside the latents.
ROW_TENSORS = ("token_ids", "doc_index", "position", "sample_index")
#: Stored dtypes latent values may have.
VALUE_DTYPES = ("F32", "BF16", "F16")


def csr_names(name: str) -> Tuple[str, str, str]:
    """The ``indptr``, ``indices`` and ``values`` tensors of latents column `name`."""
    return (name + CSR_SUFFIXES[0], name + CSR_SUFFIXES[1], name + CSR_SUFFIXES[2])


@dataclass(frozen=True)
class LatentsInfo:
    """One latents column of the run: its name, the hook its dictionary reads, the number of
    latents (`width`), the most latents a token may fire (`cap`, ``None`` when unbounded), the
    stored dtype of its values, and run.json's description of the dictionary."""

    name: str
    hook: str
    width: int
    cap: Optional[int]
    dtype: str
    dictionary: Mapping[str, Any] = field(default_factory=dict, compare=False)


def parse_latents(run: Mapping[str, Any], dtype: str, where: str) -> Dict[str, LatentsInfo]:
    """run.json's ``"latents"`` (absent: none) as `LatentsInfo` by name. `dtype` is the run's
    stored dtype (the values' dtype unless it is fp8, whose latents are read from the shards)."""
    entries = run.get("latents") or []
    if not isinstance(entries, list):
        raise DatasetError(f"{where}/run.json: \"latents\" is not a list")
    out: Dict[str, LatentsInfo] = {}
    for i, entry in enumerate(entries):
        try:
            name = str(entry["name"])
            cap = entry.get("cap")
            info = LatentsInfo(
                name=name,
                hook=str(entry.get("hook", "")),
                width=int(entry["width"]),
                cap=None if cap is None else int(cap),
                dtype=dtype,
                dictionary=dict(entry.get("dictionary") or {}),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise DatasetError(f"{where}/run.json: latents entry {i} is malformed: {e!r}") from e
        if info.width <= 0:
            raise DatasetError(f"{where}/run.json: latents {name!r} has width {info.width}")
        if name in out:
            raise DatasetError(f"{where}/run.json: latents {name!r} is listed twice")
        out[name] = info
    return out


def checked_latents(name: str, available: Mapping[str, LatentsInfo]) -> LatentsInfo:
    """The latents column `name`, or an error naming the run's columns."""
    if name in available:
        return available[name]
    if not available:
        raise DatasetError(f"unknown latents {name!r}: this run stores no dictionary latents (run.json has no \"latents\")")
    import difflib

    near = difflib.get_close_matches(name, list(available), n=3)
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    raise DatasetError(f"unknown latents {name!r}{hint}: this run has " + ", ".join(available))


@dataclass
class LatentShard:
    """One shard's rows of a latents column: the CSR arrays as stored (values converted as
    asked) and the rows' ``token_ids``, ``doc_index``, ``position``, ``sample_index`` (and
    ``mask`` in a ``keep_excluded`` run; ``None`` otherwise). `row_start` is the global row of
    the shard's first row: the rows of the shards before it, hosts in order, then shards."""

    info: LatentsInfo
    shard: ManifestLine
    row_start: int
    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    token_ids: np.ndarray
    doc_index: np.ndarray
    position: np.ndarray
    sample_index: np.ndarray
    mask: Optional[np.ndarray]

    @property
    def rows(self) -> int:
        """Token rows of the shard."""
        return len(self.indptr) - 1

    @property
    def nnz(self) -> int:
        """Stored latent entries (firings) of the shard."""
        return len(self.indices)

    def local_rows(self) -> np.ndarray:
        """The shard row (0-based) of each entry, int64 ``[nnz]``."""
        counts: np.ndarray = np.diff(self.indptr.astype(np.int64))
        return np.repeat(np.arange(self.rows, dtype=np.int64), counts)

    def triples(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(token, latent, value)``: the global row (int64), latent index (int32) and value
        of each entry, rows ascending and latents ascending within a row."""
        return self.local_rows() + self.row_start, self.indices, self.values

    def parts(self, rows: int) -> Iterator["LatentShard"]:
        """The shard as consecutive parts of about `rows` token rows at most, each ending where
        a sample ends (a sample's rows stay in one part, so the tokens around a row are all in
        its part), for passes whose scratch memory grows with the rows taken at once: the
        shard itself when it is no larger. A sample longer than `rows` is one part."""
        if self.rows <= rows:
            yield self
            return
        starts = np.flatnonzero(np.r_[True, self.sample_index[1:] != self.sample_index[:-1]])
        cut = 0
        while cut < self.rows:
            limit = cut + rows
            if limit >= self.rows:
                end = self.rows
            else:
                at = int(np.searchsorted(starts, limit, side="right"))
                end = int(starts[at - 1]) if at > 0 and starts[at - 1] > cut else (
                    int(starts[at]) if at < len(starts) else self.rows)
            yield self._rows(cut, end)
            cut = end

    def _rows(self, start: int, end: int) -> "LatentShard":
        """Rows ``start..end`` as a shard of their own (its `row_start` theirs)."""
        lo, hi = int(self.indptr[start]), int(self.indptr[end])
        return LatentShard(
            info=self.info,
            shard=self.shard,
            row_start=self.row_start + start,
            indptr=self.indptr[start:end + 1] - self.indptr[start],
            indices=self.indices[lo:hi],
            values=self.values[lo:hi],
            token_ids=self.token_ids[start:end],
            doc_index=self.doc_index[start:end],
            position=self.position[start:end],
            sample_index=self.sample_index[start:end],
            mask=self.mask[start:end] if self.mask is not None else None,
        )

    def csr(self, device: Any = None) -> Any:
        """The rows as a ``torch.sparse_csr_tensor`` of size ``[rows, width]`` (int64 offsets
        and indices; values in the dtype read)."""
        import warnings

        import torch

        values = _torch_values(torch, self.values)
        with warnings.catch_warnings():
            # torch calls its sparse CSR support beta at every construction.
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
            # The structure was checked when the shard was read (`check_csr`).
            t = torch.sparse_csr_tensor(
                torch.from_numpy(self.indptr.astype(np.int64)),
                torch.from_numpy(self.indices.astype(np.int64)),
                values,
                size=(self.rows, self.info.width),
                check_invariants=False,
            )
        return t if device is None else t.to(device)

    def dense(self) -> np.ndarray:
        """The rows as a dense ``[rows, width]`` array (zeros where nothing fired)."""
        out = np.zeros((self.rows, self.info.width), dtype=self.values.dtype)
        out[self.local_rows(), self.indices] = self.values
        return out


def _torch_values(torch: Any, values: np.ndarray) -> Any:
    """numpy values as a torch tensor (ml_dtypes bfloat16 becomes torch.bfloat16)."""
    if values.dtype.name == "bfloat16":
        return torch.from_numpy(values.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(values)


def resolve_value_dtype(dtype: Any) -> Optional[str]:
    """The dtype latent values are read as: float32 (default), float16, bfloat16, or
    ``None`` for the stored dtype."""
    out = _convert.resolve_dtype(dtype, "numpy")
    if out == "raw":
        raise DatasetError("latent values are read as float32, float16, bfloat16 or None (the stored dtype)")
    if out == "bfloat16":
        _convert.require_ml_dtypes()
    return out


def convert_values(raw: np.ndarray, stored: str, out: Optional[str]) -> np.ndarray:
    """Stored values (bf16 as uint16 bits) as `out` (``None``: the stored dtype; bf16 then
    needs ml_dtypes)."""
    if stored == "BF16":
        if out is None or out == "bfloat16":
            return raw.view(_convert.require_ml_dtypes().bfloat16)
        f32 = _convert.bf16_bits_to_f32(raw)
        return f32 if out == "float32" else f32.astype(out)
    if out is None or np.dtype(raw.dtype).name == out:
        return raw
    if out == "bfloat16":
        return raw.astype(_convert.require_ml_dtypes().bfloat16)
    return raw.astype(out)


class ShardLoader:
    """Reads shards' latents columns and row tensors, checking each shard: with `check`, the
    whole shard is read once and its CRC32C (or sha256) compared with the manifest line;
    without, only the tensors wanted are read, as byte ranges."""

    def __init__(self, location: Location, has_mask: bool, check: bool) -> None:
        self.location = location
        self.has_mask = has_mask
        self.check = check

    def load(self, shard: ManifestLine, names: Sequence[str]) -> Dict[str, Tuple[TensorInfo, np.ndarray]]:
        """The tensors `names` (plus ``mask`` when the run has one) of `shard`, each with its
        header entry, decoded (bf16 as uint16 bits)."""
        where = f"{self.location.url}/{shard.rel}"
        wanted = list(names) + (["mask"] if self.has_mask else [])
        if self.check:
            data = self.location.read(shard.rel)
            if data is None:
                raise DatasetError(f"{where}: committed shard is missing")
            if len(data) != shard.bytes:
                raise DatasetError(f"{where}: {len(data)} bytes, the manifest says {shard.bytes}")
            problem = checksum_problem(data, shard)
            if problem:
                raise DatasetError(f"{where}: {problem}")
            header = header_of(data, where)
            _require(header, wanted, where)
            return {n: (header.tensors[n], _decode(header.tensors[n], data[header.tensors[n].start : header.tensors[n].end])) for n in wanted}
        header = parse_header(self.location, shard.rel, shard.bytes)
        _require(header, wanted, where)
        infos = [header.tensors[n] for n in wanted]
        raws = self.location.read_ranges(shard.rel, [(i.start, i.end) for i in infos])
        return {n: (i, _decode(i, raw)) for n, i, raw in zip(wanted, infos, raws)}


def _require(header: ShardHeader, names: Sequence[str], where: str) -> None:
    for name in names:
        if name not in header.tensors:
            raise DatasetError(f"{where}: shard has no tensor {name!r}")
        if header.tensors[name].dtype not in STORED_DTYPES:
            raise DatasetError(f"{where}: tensor {name!r} has unsupported dtype {header.tensors[name].dtype}")


def _decode(info: TensorInfo, raw: bytes) -> np.ndarray:
    rows = info.shape[0] if info.shape else 1
    # A copy: arrays over the read bytes would be read-only (torch warns on those).
    return decode(info, raw, rows).copy()


def checksum_problem(data: bytes, shard: ManifestLine) -> Optional[str]:
    """What is wrong with a whole shard's bytes against its manifest checksum, or None."""
    if shard.crc32c is not None:
        import google_crc32c

        found = f"{google_crc32c.value(data):08x}"
        return None if found == shard.crc32c else f"crc32c {found}, the manifest says crc32c {shard.crc32c}"
    if shard.sha256 is not None:
        import hashlib

        found = hashlib.sha256(data).hexdigest()
        return None if found == shard.sha256 else f"sha256 {found}, the manifest says sha256 {shard.sha256}"
    return "the manifest line records no checksum (crc32c or sha256)"


def check_csr(info: LatentsInfo, tensors: Mapping[str, Tuple[TensorInfo, np.ndarray]], tokens: int, where: str) -> None:
    """Checks a shard's CSR tensors of `info` against the format: dtypes, shapes, offsets from
    0 to nnz without going back, indices ascending within each row and below the width."""
    p_name, i_name, v_name = csr_names(info.name)
    (p_info, indptr), (i_info, indices), (v_info, values) = tensors[p_name], tensors[i_name], tensors[v_name]
    what = f"{where}: latents {info.name}"
    if p_info.dtype != "I32" or i_info.dtype != "I32":
        raise DatasetError(f"{what}: indptr is {p_info.dtype} and indices {i_info.dtype}, expected I32")
    if v_info.dtype not in VALUE_DTYPES:
        raise DatasetError(f"{what}: values are {v_info.dtype}, expected one of {', '.join(VALUE_DTYPES)}")
    if p_info.shape != (tokens + 1,):
        raise DatasetError(f"{what}: indptr has shape {list(p_info.shape)}, expected [{tokens + 1}] (tokens + 1)")
    nnz = len(indices)
    if i_info.shape != (nnz,) or v_info.shape != (nnz,):
        raise DatasetError(f"{what}: indices {list(i_info.shape)} and values {list(v_info.shape)} differ in length")
    if indptr[0] != 0 or indptr[-1] != nnz or (np.diff(indptr) < 0).any():
        raise DatasetError(f"{what}: indptr must run from 0 to {nnz} (the entries) without going back")
    if nnz:
        if indices.min() < 0 or indices.max() >= info.width:
            raise DatasetError(f"{what}: a latent index lies outside 0..{info.width - 1}")
        step = np.diff(indices.astype(np.int64))
        starts = np.zeros(nnz, dtype=bool)
        starts[indptr[1:-1][indptr[1:-1] < nnz]] = True
        if (step[~starts[1:]] <= 0).any():
            raise DatasetError(f"{what}: a token's latent indices are not strictly ascending")


def iter_latent_shards(
    location: Location,
    shards: Sequence[ManifestLine],
    info: LatentsInfo,
    *,
    has_mask: bool,
    dtype: Optional[str],
    check: bool,
) -> Iterator[LatentShard]:
    """`LatentShard`s of `info` for `shards` in order (see `Dataset.latent_shards`)."""
    for group in iter_latent_shard_groups(location, shards, [info], has_mask=has_mask, dtype=dtype, check=check):
        yield group[info.name]


def iter_latent_shard_groups(
    location: Location,
    shards: Sequence[ManifestLine],
    infos: Sequence[LatentsInfo],
    *,
    has_mask: bool,
    dtype: Optional[str],
    check: bool,
) -> Iterator[Dict[str, LatentShard]]:
    """Per shard in order, the `LatentShard` of each column of `infos` by name, from one read
    of the shard (see `Dataset.latent_shard_groups`)."""
    loader = ShardLoader(location, has_mask, check)
    names = [n for info in infos for n in csr_names(info.name)] + list(ROW_TENSORS)
    row_start = 0
    for shard in shards:
        where = f"{location.url}/{shard.rel}"
        tensors = loader.load(shard, names)
        ids = tensors["token_ids"][1]
        if ids.shape != (shard.tokens,):
            raise DatasetError(f"{where}: token_ids has shape {list(ids.shape)}, the manifest says {shard.tokens} tokens")
        mask = tensors["mask"][1] if has_mask else None
        group: Dict[str, LatentShard] = {}
        for info in infos:
            check_csr(info, tensors, shard.tokens, where)
            p_name, i_name, v_name = csr_names(info.name)
            v_info, raw_values = tensors[v_name]
            group[info.name] = LatentShard(
                info=info,
                shard=shard,
                row_start=row_start,
                indptr=tensors[p_name][1],
                indices=tensors[i_name][1],
                values=convert_values(raw_values, v_info.dtype, dtype),
                token_ids=ids,
                doc_index=tensors["doc_index"][1],
                position=tensors["position"][1],
                sample_index=tensors["sample_index"][1],
                mask=mask,
            )
        yield group
        row_start += shard.tokens


def latents_stats(stats: Mapping[str, Any], name: str) -> Dict[str, Any]:
    """stats.json's statistics of latents column `name`: ``count`` (tokens counted),
    ``firings`` (int64 per latent), ``sums`` (float64 per latent), ``frequency`` (firings /
    count), ``mean`` (sums / firings, 0 where a latent never fired) and, where the file has it,
    ``max`` (float64 per latent, each one's largest value) and ``min`` (each one's smallest value
    above 0, 0 where it never fired above 0)."""
    entry = (stats.get("latents") or {}).get(name)
    if entry is None:
        raise DatasetError(f"stats.json has no statistics of latents {name!r}")
    count = int(entry["count"])
    firings = np.asarray(entry["firings"], dtype=np.int64)
    sums = np.asarray(entry["sums"], dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        frequency = firings / count if count else np.zeros(len(firings))
        mean = np.where(firings > 0, sums / np.maximum(firings, 1), 0.0)
    out = {"count": count, "firings": firings, "sums": sums, "frequency": frequency, "mean": mean}
    for key in ("max", "min"):
        if key in entry:
            per_latent = np.asarray(entry[key], dtype=np.float64)
            if per_latent.shape != firings.shape:
                raise DatasetError(f"stats.json: latents {name!r}: {per_latent.size} entries in {key}, "
                                   f"{len(firings)} latents")
            out[key] = per_latent
    return out


def latent_tensor_names(latents: Mapping[str, LatentsInfo]) -> List[str]:
    """Every shard tensor the run's latents columns add."""
    return [n for info in latents.values() for n in csr_names(info.name)]
