"""One pass over a latents column's shards: every latent's examples (`siphon.examples`, with
the latent's values over each example's window) and the histogram of its activations.

The histogram of latent ``l`` has `bins` equal-width bins over ``(0, max[l]]``, ``max`` the
run's per-latent largest value (stats.json): bin ``i`` holds the values ``v`` with
``edge[i] <= v < edge[i + 1]``, ``edge[i] = max * i / bins``, the last bin also the value equal
to ``max`` (as ``np.histogram(v, bins, range=(0, max))`` counts them). Values ``<= 0`` are not
counted, nor are the tokens a ``keep_excluded`` mask excludes (as stats.json's firings). What
the pass holds is per-latent arrays and the bounded example sets: its memory does not grow
with the run.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence, TextIO

import numpy as np

from ..errors import DatasetError
from ..examples import LatentExamples, empty_examples
from ..latents import LatentShard

#: The most bins of a latent's histogram (each latent holds its counts: width × bins int64).
MAX_BINS = 10_000


@dataclass
class ColumnPass:
    """What one pass over (a part of) a latents column's shards collected: `examples` and
    `histogram` (int64 ``[width, bins]``), with the shards, token rows and firings counted
    (`firings`: the histogram's, per latent)."""

    examples: LatentExamples
    histogram: np.ndarray
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
        """Each latent's largest value (the run's): the upper bound of its histogram."""
        return self.examples.max

    def edges(self, latent: int) -> np.ndarray:
        """The `bins` + 1 bin edges of `latent`'s histogram."""
        return float(self.max[latent]) * np.arange(self.bins + 1) / self.bins

    def add(self, shard: LatentShard) -> None:
        """Takes one shard in: its firings' examples and histogram."""
        self.examples.add(shard)
        add_histogram(self.histogram, shard, self.max)
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


def add_histogram(histogram: np.ndarray, shard: LatentShard, bound: np.ndarray) -> None:
    """Adds the shard's included firings with a value above 0 to `histogram` (``[width,
    bins]``), bins over ``(0, bound[latent]]`` as the module says."""
    width, bins = histogram.shape
    rows = shard.local_rows()
    latents = shard.indices.astype(np.int64)
    values = shard.values.astype(np.float64)
    keep = values > 0
    if shard.mask is not None:
        keep &= shard.mask[rows]
    latents, values = latents[keep], values[keep]
    top = bound[latents].astype(np.float64)
    latents, values, top = latents[top > 0], values[top > 0], top[top > 0]
    if not len(values):
        return
    with np.errstate(over="ignore", invalid="ignore"):
        at = np.floor(values / top * bins)
    at = np.clip(np.nan_to_num(at, nan=0.0), 0, bins - 1).astype(np.int64)
    # Exact against the edges max * i / bins: a value below its bin's lower edge goes down one,
    # one at or past its upper edge up one (the last bin is closed).
    at -= (values < top * at / bins) & (at > 0)
    at += (values >= top * (at + 1) / bins) & (at < bins - 1)
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
    if bins < 1:
        raise DatasetError(f"bins must be at least 1, got {bins}")
    if bins > MAX_BINS:
        raise DatasetError(f"bins must be at most {MAX_BINS}, got {bins}")
    examples = empty_examples(dataset, name, top=top, quantiles=quantiles, per_quantile=per_quantile, window=window,
                              seed=seed)
    out = ColumnPass(examples, np.zeros((examples.width, bins), np.int64))
    if total is None:
        total = len(shards) if isinstance(shards, Sequence) else len(dataset.shards)
    meter = Progress(name, total, enabled=progress, stream=stream)
    for shard in shards if shards is not None else dataset.latent_shards(name, check=check):
        out.add(shard)
        meter.step(shard.rows)
    meter.finish()
    return out
