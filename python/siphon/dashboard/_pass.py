"""One pass over a latents column's shards: every latent's examples (`siphon.examples`, with
the latent's values over each example's window) and the histogram of its activations.

The histogram of latent ``l`` is SAEDashboard's (``torch.histc`` of the latent's values above
0): `bins` equal-width bins from ``lo = min[l]`` to ``hi = max[l]``, the run's per-latent
smallest value above 0 and largest (stats.json; both widened by 1 when they are equal, as
torch does; ``lo`` 0 for a run written before minima were counted); a value's bin is
``floor((v - lo) * bins / (hi - lo))`` in f32 as torch's kernel computes it, the largest in the
last. Values ``<= 0`` are not counted, nor are the tokens a ``keep_excluded`` mask excludes (as
stats.json's firings). What the pass holds is per-latent arrays and the bounded example sets:
its memory does not grow with the run.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Optional, Sequence, TextIO, Tuple

import numpy as np

from .._output import check_count
from ..errors import DatasetError
from ..examples import LatentExamples, empty_examples
from ..latents import LatentShard

#: The most bins of a latent's histogram (each latent holds its counts: width × bins int64).
MAX_BINS = 10_000
#: The most counts of a column's histograms, width × bins (8 GiB of int64: 64 bins of 16M
#: latents).
MAX_HISTOGRAM_COUNTS = 1 << 30
#: Token rows a pass takes in at once (`LatentShard.parts`): its scratch memory (the candidate
#: examples of each firing, their sort) grows with them, whatever the shards' size.
PART_ROWS = 1 << 15


@dataclass
class ColumnPass:
    """What one pass over (a part of) a latents column's shards collected: `examples` and
    `histogram` (int64 ``[width, bins]``), with the shards, token rows and firings counted
    (`firings`: the histogram's, per latent)."""

    examples: LatentExamples
    histogram: np.ndarray
    lo: np.ndarray
    shards: int = 0
    tokens: int = 0

    @property
    def name(self) -> str:
        return self.examples.name

    @property
    def width(self) -> int:
        return self.examples.width

    @property
    def bins(self) -> int:
        return int(self.histogram.shape[1])

    @property
    def max(self) -> np.ndarray:
        """Each latent's largest value (the run's)."""
        return self.examples.max

    def range(self, latent: int) -> Tuple[float, float]:
        """The ends of `latent`'s histogram, as the module says (f32 values as floats)."""
        lo, hi = histogram_range(self.lo[latent:latent + 1], self.max[latent:latent + 1])
        return float(lo[0]), float(hi[0])

    def add(self, shard: LatentShard) -> None:
        """Takes one shard in: its firings' examples and histogram, `PART_ROWS` rows at a time."""
        for part in shard.parts(PART_ROWS):
            self.examples.add(part)
            add_histogram(self.histogram, part, self.lo, self.max)
        self.shards += 1
        self.tokens += shard.rows

    def merge(self, other: "ColumnPass") -> "ColumnPass":
        """Takes in the pass of a disjoint part of the same run (the same column and
        settings); returns self, now the pass of both parts."""
        if other.histogram.shape != self.histogram.shape:
            raise DatasetError(
                f"cannot merge histograms of {other.name!r} of shape {list(other.histogram.shape)} "
                f"into {list(self.histogram.shape)}"
            )
        self.examples.merge(other.examples)
        self.histogram += other.histogram
        self.shards += other.shards
        self.tokens += other.tokens
        return self


def histogram_range(lo: np.ndarray, hi: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The histograms' ends (f32) from the latents' smallest values above 0 and largest, equal
    ones widened by 1 each side as ``torch.histc`` widens them."""
    lo, hi = lo.astype(np.float32), hi.astype(np.float32)
    same = lo == hi
    return np.where(same, lo - np.float32(1), lo), np.where(same, hi + np.float32(1), hi)


def add_histogram(histogram: np.ndarray, shard: LatentShard, lo: np.ndarray, hi: np.ndarray) -> None:
    """Adds the shard's included firings with a value above 0 to `histogram` (``[width,
    bins]``), latent ``l``'s bins from ``lo[l]`` to ``hi[l]`` as the module says (values
    outside them are not counted)."""
    width, bins = histogram.shape
    rows = shard.local_rows()
    latents = shard.indices.astype(np.int64)
    values = shard.values.astype(np.float32)
    keep = values > 0
    if shard.mask is not None:
        keep &= shard.mask[rows]
    latents, values = latents[keep], values[keep]
    start, end = histogram_range(lo, hi)
    start, end = start[latents], end[latents]
    inside = (values >= start) & (values <= end) & (end > start)
    latents, values, start, end = latents[inside], values[inside], start[inside], end[inside]
    if not len(values):
        return
    # torch's CPU histc: pos = (elt - leftmost) * bins / (rightmost - leftmost), in the data's
    # f32, truncated; the rightmost value into the last bin.
    at = ((values - start) * np.float32(bins) / (end - start)).astype(np.int64)
    at = np.minimum(at, bins - 1)
    histogram += np.bincount(latents * bins + at, minlength=width * bins).reshape(width, bins)


class Progress:
    """Shards done of `total`, tokens, elapsed and ETA on `stream` (stderr): one line rewritten
    with ``\\r`` on a terminal, else a line every `every` seconds; nothing when disabled."""

    def __init__(self, label: str, total: int, *, enabled: bool = True, stream: Optional[TextIO] = None,
                 every: float = 5.0) -> None:
        self.label, self.total, self.enabled, self.every = label, total, enabled, every
        self.stream: TextIO = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = self.last = time.monotonic()
        self.done = self.tokens = 0

    def line(self) -> str:
        elapsed = time.monotonic() - self.start
        left = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
        eta = _seconds(left) if self.done and self.total >= self.done else "?"
        return (f"{self.label}: {self.done}/{self.total} shards, {self.tokens} tokens, "
                f"{_seconds(elapsed)} elapsed, ETA {eta}")

    def step(self, tokens: int) -> None:
        self.done += 1
        self.tokens += tokens
        if not self.enabled:
            return
        now = time.monotonic()
        if self.tty:
            self.stream.write("\r" + self.line() + "\x1b[K")
            self.stream.flush()
        elif now - self.last >= self.every:
            self.stream.write(self.line() + "\n")
            self.stream.flush()
            self.last = now

    def finish(self) -> None:
        if self.enabled:
            self.stream.write(("\r" + self.line() + "\x1b[K\n") if self.tty else self.line() + "\n")
            self.stream.flush()


def _seconds(s: float) -> str:
    s = max(0.0, s)
    if s < 60:
        return f"{s:.1f}s"
    m, sec = divmod(int(s), 60)
    return f"{m}m{sec:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


def new_column_pass(dataset: Any, name: str, *, top: int = 20, quantiles: int = 10, per_quantile: int = 5,
                    window: int = 16, bins: int = 50, seed: int = 0) -> ColumnPass:
    """An empty pass of latents column `name` of `dataset` with these settings (checked)."""
    examples = empty_examples(dataset, name, top=top, quantiles=quantiles, per_quantile=per_quantile, window=window,
                              seed=seed)
    fits = MAX_HISTOGRAM_COUNTS // max(examples.width, 1)
    check_count("bins", bins, 1, min(MAX_BINS, fits), most_is=None if fits >= MAX_BINS else
                f"{MAX_HISTOGRAM_COUNTS} counts over the {examples.width} latents of {name!r}")
    stats = dataset.latent_stats(name)
    lo = stats.get("min", np.zeros(examples.width))
    return ColumnPass(examples, np.zeros((examples.width, bins), np.int64), lo)


def column_pass(
    dataset: Any,
    name: str,
    *,
    top: int = 20,
    quantiles: int = 10,
    per_quantile: int = 5,
    window: int = 16,
    bins: int = 50,
    seed: int = 0,
    shards: Optional[Iterable[LatentShard]] = None,
    total: Optional[int] = None,
    check: bool = True,
    progress: bool = True,
    stream: Optional[TextIO] = None,
) -> ColumnPass:
    """One read of latents column `name` of `dataset` (a `siphon.Dataset`): every latent's
    examples as `siphon.examples.latent_examples` takes them (plus `window_values`) and its
    histogram of `bins` bins. `shards` (default: every committed shard) may be a part of the
    run (a host's), whose passes `ColumnPass.merge` combines; `total` is their number for the
    progress line (default: ``len(shards)`` where it has one, else the run's shards)."""
    out = new_column_pass(dataset, name, top=top, quantiles=quantiles, per_quantile=per_quantile, window=window,
                          bins=bins, seed=seed)
    if total is None:
        total = len(shards) if isinstance(shards, Sequence) else len(dataset.shards)
    meter = Progress(name, total, enabled=progress, stream=stream)
    for shard in shards if shards is not None else dataset.latent_shards(name, check=check):
        out.add(shard)
        meter.step(shard.rows)
    meter.finish()
    return out


def columns_pass(dataset: Any, names: Sequence[str], *, check: bool = True, progress: bool = True,
                 stream: Optional[TextIO] = None, **settings: Any) -> Dict[str, ColumnPass]:
    """The passes of several latents columns of `dataset` from one read of its shards (each
    shard read once for all of them), by name; `settings` as `column_pass` takes them."""
    passes = {name: new_column_pass(dataset, name, **settings) for name in names}
    if not passes:
        return passes
    meter = Progress(", ".join(names) if len(names) == 1 else f"{len(names)} dictionaries", len(dataset.shards),
                     enabled=progress, stream=stream)
    for group in dataset.latent_shard_groups(list(names), check=check):
        for name, shard in group.items():
            passes[name].add(shard)
        meter.step(next(iter(group.values())).rows)
    meter.finish()
    return passes
