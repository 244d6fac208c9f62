"""Reading units of shards, splitting them over consumers, and the windows rows are shuffled in.

A *unit* is a contiguous block of at most ``unit_tokens`` rows of one shard. One epoch:

1. every committed shard is cut into units, in manifest order (hosts, then shard index);
2. with ``shuffle``, the unit list is permuted by a generator seeded with ``(seed, epoch)`` —
   the same permutation on every rank and worker;
3. consumer ``c`` of ``C = world_size * num_workers`` (``c = rank * num_workers + worker``)
   takes the ``c``-th contiguous slice of that list, so consumers never share a unit and
   together cover every unit: each token is read exactly once per epoch;
4. a consumer groups its units into windows of at most ``buffer_rows`` rows (`windows_of`; one
   unit per window without shuffle) and reads a window's units (only the tensors asked for, as
   byte ranges) into a preallocated `Window`: on local disk straight into the window's rows
   (``os.preadv``, one copy out of the page cache), from an object store a few units ahead in
   threads (`read_ahead`); then it drops filtered rows, and
5. with ``shuffle``, permutes the window's rows (seeded by ``(seed, epoch, c, C, window)``);
   batches are consecutive rows of the windows in turn. The position after a batch, (epoch,
   window, rows of the window read), continues the stream exactly (`Batches.state_dict`,
   `Dataset.batches(resume=)`).

Memory per consumer: the window's arrays, ``max(buffer_rows, unit_tokens)`` rows of every
tensor read, plus the batch being built and ``prefetch`` units in flight: about ``(2 *
buffer_rows + (prefetch + 1) * unit_tokens) * row_bytes``.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ._format import STORED_DTYPES, ManifestLine, ShardHeader, decode, parse_header
from ._location import Location
from .errors import DatasetError

Arrays = Dict[str, np.ndarray]


@dataclass(frozen=True)
class Unit:
    """Rows ``[start, end)`` of one shard."""

    shard: ManifestLine
    start: int
    end: int


@dataclass(frozen=True)
class Filter:
    """Which rows to keep."""

    exclude_token_ids: Optional[np.ndarray] = None
    min_position: int = 0
    max_position: Optional[int] = None
    keep_masked: bool = False
    #: Role ids (indices into ``ROLES``) whose rows are kept; ``None`` keeps every role.
    roles: Optional[np.ndarray] = None

    def active(self) -> bool:
        return (
            self.exclude_token_ids is not None
            or self.min_position > 0
            or self.max_position is not None
            or self.roles is not None
        )


def make_units(shards: Sequence[ManifestLine], unit_tokens: int) -> List[Unit]:
    units = []
    for shard in shards:
        for start in range(0, shard.tokens, unit_tokens):
            units.append(Unit(shard, start, min(start + unit_tokens, shard.tokens)))
    return units


def split_units(units: List[Unit], shuffle: bool, seed: int, epoch: int, consumer: int, consumers: int) -> List[Unit]:
    """This consumer's units of one epoch (see the module docs)."""
    order = list(range(len(units)))
    if shuffle:
        order = np.random.default_rng([seed, epoch]).permutation(len(units)).tolist()
    n = len(order)
    lo, hi = consumer * n // consumers, (consumer + 1) * n // consumers
    return [units[i] for i in order[lo:hi]]


class UnitReader:
    """Loads units: the requested tensors' rows as byte ranges, then the filter."""

    def __init__(self, location: Location, tensors: Sequence[str], filt: Filter, has_mask: bool) -> None:
        self.location = location
        self.tensors = list(tensors)
        self.filter = filt
        self.read_mask = has_mask and not filt.keep_masked
        self._headers: Dict[str, ShardHeader] = {}
        self._lock = threading.Lock()

    def header(self, shard: ManifestLine) -> ShardHeader:
        with self._lock:
            header = self._headers.get(shard.rel)
        if header is None:
            header = parse_header(self.location, shard.rel, shard.bytes)
            rows = header.tensors.get("token_ids")
            if rows is None or rows.shape != (shard.tokens,):
                raise DatasetError(
                    f"{self.location.url}/{shard.rel}: token_ids has shape "
                    f"{None if rows is None else list(rows.shape)}, the manifest says {shard.tokens} tokens"
                )
            for name in self.tensors:
                if name not in header.tensors:
                    raise DatasetError(f"{self.location.url}/{shard.rel}: shard has no tensor {name!r}")
            with self._lock:
                self._headers[shard.rel] = header
        return header

    def load(self, unit: Unit) -> Arrays:
        """The unit's filtered rows as new arrays (remote runs: concurrent range reads)."""
        header = self.header(unit.shard)
        names = list(self.tensors)
        if self.read_mask and "mask" in header.tensors:
            names.append("mask")
        infos = [header.tensors[name] for name in names]
        ranges = [(i.start + unit.start * i.row_bytes, i.start + unit.end * i.row_bytes) for i in infos]
        raws = self.location.read_ranges(unit.shard.rel, ranges)
        rows = unit.end - unit.start
        arrays = {name: decode(info, raw, rows) for name, info, raw in zip(names, infos, raws)}
        keep = self._keep(arrays, arrays.pop("mask", None))
        if keep is not None:
            arrays = {name: a[keep] for name, a in arrays.items()}
        return arrays

    def load_into(self, unit: Unit, dest: Arrays) -> int:
        """Local runs: reads the unit's rows straight into `dest` (views of at least the unit's
        row count, one per tensor), with one copy from the page cache; drops filtered rows in
        place and returns how many rows remain."""
        header = self.header(unit.shard)
        rows = unit.end - unit.start
        fd = os.open(self.location.path(unit.shard.rel), os.O_RDONLY)
        try:
            for name in self.tensors:
                info = header.tensors[name]
                out = dest[name][:rows]
                want = rows * info.row_bytes
                got = os.preadv(fd, [memoryview(out).cast("B")], info.start + unit.start * info.row_bytes)  # type: ignore[arg-type]
                if got != want:
                    raise DatasetError(f"{self.location.url}/{unit.shard.rel}: short read of {name} ({got} of {want} bytes)")
            mask = None
            if self.read_mask and "mask" in header.tensors:
                info = header.tensors["mask"]
                raw = os.pread(fd, rows * info.row_bytes, info.start + unit.start * info.row_bytes)
                mask = decode(info, raw, rows)
        finally:
            os.close(fd)
        keep = self._keep({name: dest[name][:rows] for name in ("token_ids", "position", "role") if name in dest}, mask)
        if keep is None:
            return rows
        kept = int(keep.sum())
        for name in self.tensors:
            dest[name][:kept] = dest[name][:rows][keep]
        return kept

    def _keep(self, arrays: Arrays, mask: Optional[np.ndarray]) -> Optional[np.ndarray]:
        """Rows to keep, or ``None`` for all of them."""
        keep = None
        if mask is not None and not mask.all():
            keep = mask.copy()
        f = self.filter
        if f.active():
            if "token_ids" in arrays and f.exclude_token_ids is not None:
                k = ~np.isin(arrays["token_ids"], f.exclude_token_ids)
                keep = k if keep is None else keep & k
            if "role" in arrays and f.roles is not None:
                k = np.isin(arrays["role"], f.roles)
                keep = k if keep is None else keep & k
            if "position" in arrays and (f.min_position > 0 or f.max_position is not None):
                pos = arrays["position"]
                k = pos >= f.min_position
                if f.max_position is not None:
                    k &= pos < f.max_position
                keep = k if keep is None else keep & k
        if keep is not None and keep.all():
            return None
        return keep


def read_ahead(units: Iterable[Unit], load: Callable[[Unit], Arrays], depth: int) -> Iterator[Arrays]:
    """`load` over `units` in order, up to `depth` units ahead in threads."""
    if depth <= 0:
        for unit in units:
            yield load(unit)
        return
    it = iter(units)
    with ThreadPoolExecutor(max_workers=depth, thread_name_prefix="siphon-read") as pool:
        pending = deque(pool.submit(load, u) for _, u in zip(range(depth), it))
        try:
            while pending:
                arrays = pending.popleft().result()
                nxt = next(it, None)
                if nxt is not None:
                    pending.append(pool.submit(load, nxt))
                yield arrays
        finally:
            for f in pending:
                f.cancel()


def windows_of(units: List[Unit], capacity: int) -> List[List[Unit]]:
    """Consecutive groups of `units` of at most `capacity` rows (a larger unit alone): the
    windows a reader shuffles rows within."""
    windows: List[List[Unit]] = []
    rows = 0
    for unit in units:
        size = unit.end - unit.start
        if windows and rows + size <= capacity:
            windows[-1].append(unit)
            rows += size
        else:
            windows.append([unit])
            rows = size
    return windows


class Window:
    """A preallocated store of rows of several tensors (one row = one token in each), filled
    with one window's units at a time."""

    def __init__(self, templates: Dict[str, Tuple[np.dtype, Tuple[int, ...]]], rows: int) -> None:
        self.store = {name: np.empty((rows,) + shape, dtype=dtype) for name, (dtype, shape) in templates.items()}
        self.n = 0

    def fill(self, rows: int, fill: Callable[[Arrays], int]) -> None:
        """Lets `fill` write up to `rows` rows straight into the free space; it returns how
        many it kept."""
        self.n += fill({name: s[self.n : self.n + rows] for name, s in self.store.items()})

    def add(self, arrays: Arrays) -> None:
        rows = len(next(iter(arrays.values())))
        for name, a in arrays.items():
            self.store[name][self.n : self.n + rows] = a
        self.n += rows

    def rows(self, picked: Any) -> Arrays:
        """Copies of the rows `picked` (a slice or an index array) of every tensor."""
        return {name: s[picked].copy() if isinstance(picked, slice) else s.take(picked, axis=0) for name, s in self.store.items()}


def templates_for(reader: UnitReader, shard: ManifestLine) -> Dict[str, Tuple[np.dtype, Tuple[int, ...]]]:
    header = reader.header(shard)
    out = {}
    for name in reader.tensors:
        info = header.tensors[name]
        out[name] = (STORED_DTYPES[info.dtype][0], tuple(info.shape[1:]))
    return out
