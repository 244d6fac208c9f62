"""Reading units of shards, splitting them over consumers, and the shuffle buffer.

A *unit* is a contiguous block of at most ``unit_tokens`` rows of one shard. One epoch:

1. every committed shard is cut into units, in manifest order (hosts, then shard index);
2. with ``shuffle``, the unit list is permuted by a generator seeded with ``(seed, epoch)`` —
   the same permutation on every rank and worker;
3. consumer ``c`` of ``C = world_size * num_workers`` (``c = rank * num_workers + worker``)
   takes the ``c``-th contiguous slice of that list, so consumers never share a unit and
   together cover every unit: each token is read exactly once per epoch;
4. a consumer reads its units (only the tensors asked for, as byte ranges): on local disk
   straight into the buffer's free rows (``os.preadv``, one copy out of the page cache), from
   an object store a few units ahead in threads; then it drops filtered rows, and
5. with ``shuffle``, passes them through a shuffle buffer of ``buffer_rows`` rows: once it
   holds at least that many, it is permuted (seeded by ``(seed, epoch, c, C)``) and all but
   half of it are handed out as batches; the rest wait for the next units. Without shuffle,
   rows come out in unit order.

Memory per consumer: the buffer's arrays, ``buffer_rows + unit_tokens`` rows of every tensor
read, plus a temporary of half the buffer when it is compacted, plus ``prefetch`` units in
flight and the batch being built: about ``(1.5 * buffer_rows + (prefetch + 2) * unit_tokens)
* row_bytes``.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

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


class RowBuffer:
    """A preallocated buffer of rows of several tensors (one row = one token in each).

    With ``shuffle``, rows leave in a random order once at least ``capacity`` rows are held
    (all but ``capacity // 2`` of them, in whole batches); without, they leave in arrival order
    in whole batches. `finish` hands out what is left.
    """

    def __init__(
        self,
        templates: Dict[str, Tuple[np.dtype, Tuple[int, ...]]],
        capacity: int,
        max_unit: int,
        batch_size: int,
        rng: Optional[np.random.Generator],
    ) -> None:
        self.capacity = capacity
        self.batch_size = batch_size
        self.rng = rng
        self.n = 0
        size = capacity + max_unit
        self.store = {name: np.empty((size,) + shape, dtype=dtype) for name, (dtype, shape) in templates.items()}

    def add(self, arrays: Arrays) -> Iterator[Arrays]:
        rows = len(next(iter(arrays.values())))
        pos = 0
        while pos < rows:
            take = min(rows - pos, len(next(iter(self.store.values()))) - self.n)
            for name, a in arrays.items():
                self.store[name][self.n : self.n + take] = a[pos : pos + take]
            self.n += take
            pos += take
            if self.n >= self.capacity:
                yield from self._emit(final=False)

    def fill(self, rows: int, fill: Callable[[Arrays], int]) -> Iterator[Arrays]:
        """Lets `fill` write up to `rows` rows straight into the buffer's free space (it returns
        how many it kept), then hands out batches as `add` does. `rows` <= ``max_unit``."""
        views = {name: s[self.n : self.n + rows] for name, s in self.store.items()}
        self.n += fill(views)
        if self.n >= self.capacity:
            yield from self._emit(final=False)

    def finish(self, drop_last: bool) -> Iterator[Arrays]:
        yield from self._emit(final=True, drop_last=drop_last)

    def _emit(self, final: bool, drop_last: bool = False) -> Iterator[Arrays]:
        n, b = self.n, self.batch_size
        if self.rng is None:
            emit = n if final else (n // b) * b
            for i in range(0, emit, b):
                if drop_last and i + b > emit:
                    break
                yield {name: s[i : min(i + b, emit)].copy() for name, s in self.store.items()}
            rest = n - emit
            if rest:
                for s in self.store.values():
                    s[:rest] = s[emit:n]
            self.n = rest
            return
        perm = self.rng.permutation(n)
        emit = n if final else max(b, ((n - self.capacity // 2) // b) * b)
        for i in range(0, emit, b):
            if drop_last and i + b > emit:
                break
            idx = perm[i : min(i + b, emit)]
            yield {name: s.take(idx, axis=0) for name, s in self.store.items()}
        left = perm[emit:]
        if len(left):
            for name, s in self.store.items():
                s[: len(left)] = s.take(left, axis=0)
        self.n = len(left)


def templates_for(reader: UnitReader, shard: ManifestLine) -> Dict[str, Tuple[np.dtype, Tuple[int, ...]]]:
    header = reader.header(shard)
    out = {}
    for name in reader.tensors:
        info = header.tensors[name]
        out[name] = (STORED_DTYPES[info.dtype][0], tuple(info.shape[1:]))
    return out
