"""The data a column's pages read: per latent an object of its statistics, histogram, examples
and effects (written in chunks of `CHUNK` latents, ``data/chunk-NNNN.js``), and the table of
every latent the column's index embeds. Values carry 5 significant digits.

A latent object::

    {"latent": 123, "firings": 40, "frequency": 0.0012, "max": 5.25, "mean": 1.5,
     "hist": [counts of the `bins` bins], "hist_range": [lo, hi],  # SAEDashboard's bins (_pass)
     "top": [example, ...],                       # largest value first (the earlier row first)
     "ranges": [{"range": 0, "lo": 0.0, "hi": 0.525, "examples": [example, ...]}, ...],
     "logits_top": [[token id, value], ...],      # with effects: largest first
     "logits_bottom": [[token id, value], ...],   #   most negative first
     "logits_hist": {"heights": [...], "range": [lo, hi]},  # over the whole vocabulary
     "neighbours": [[latent, cosine], ...]}       #   largest first

an example ``{"value", "row", "doc", "position", "tokens": [ids], "values": [this latent's
value at each token]}``, its own token in the middle of `tokens` (index `window`); ids ``-1``
lie outside the sequence (value 0). Range examples are in row order.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..examples import TOP
from ._effects import ColumnEffects
from ._pass import ColumnPass

#: Latents per data file.
CHUNK = 256
#: Significant digits of the values written.
DIGITS = 5
#: Token strings in a latent's one-line summary (the table's "top tokens").
SUMMARY_TOKENS = 3


def significant(values: Any, digits: int = DIGITS) -> np.ndarray:
    """`values` (float64) rounded to `digits` significant digits, non-finite ones as NaN:
    ``round(v * 10**k) / 10**k``, whose shortest repr is the rounded decimal."""
    v = np.asarray(values, dtype=np.float64)
    out = np.full(v.shape, np.nan)
    ok = np.isfinite(v) & (v != 0)
    exponent = np.floor(np.log10(np.abs(v[ok])))
    k = (digits - 1 - exponent).astype(np.int64)
    up = k >= 0
    scaled = np.empty(len(k))
    kk = k[up].astype(np.float64)
    scaled[up] = np.rint(v[ok][up] * 10.0 ** kk) / 10.0 ** kk
    kk = -k[~up].astype(np.float64)
    scaled[~up] = np.rint(v[ok][~up] / 10.0 ** kk) * 10.0 ** kk
    out[ok] = scaled
    out[np.isfinite(v) & (v == 0)] = 0.0
    return out


def number(value: float) -> Optional[float]:
    """One value as written (``None`` when not finite)."""
    v = float(significant(value))
    return None if v != v else v


def numbers(values: Any) -> List[Optional[float]]:
    """Values as written, a list (``None`` where not finite)."""
    return [None if v != v else v for v in significant(values).tolist()]


def dumps(obj: Any) -> str:
    """Compact JSON, ``<``, ``>`` and ``&`` escaped so that the text may stand inside a
    ``<script>`` element."""
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def token_string(token: int, vocab: Optional[Sequence[str]]) -> str:
    """A token id as its string (``#id`` without a vocabulary, or outside it)."""
    return vocab[token] if vocab is not None and 0 <= token < len(vocab) else f"#{token}"


class ColumnData:
    """The latent objects of a column's pass, with the run's `stats` (`Dataset.latent_stats`)
    and its `effects` (``None``: none)."""

    def __init__(self, result: ColumnPass, stats: Mapping[str, Any], effects: Optional[ColumnEffects]) -> None:
        self.result, self.stats, self.effects = result, stats, effects
        ex = result.examples
        a = ex.arrays
        is_top = a["kind"] == TOP
        # Per latent: tops by value descending (the earlier row first), then each range by row.
        order = np.lexsort((a["row"], np.where(is_top, -a["value"].astype(np.float64), 0.0), a["kind"], a["latent"]))
        self.order = order
        self.latent_of = a["latent"][order]
        self.kind_of = a["kind"][order]
        self.starts = np.searchsorted(self.latent_of, np.arange(ex.width + 1))
        # Every per-latent number as written, at once.
        self.firings: List[int] = np.asarray(stats["firings"], dtype=np.int64).tolist()
        self.frequency = numbers(stats["frequency"])
        self.max = numbers(ex.max)
        self.mean = numbers(stats["mean"])
        bound = ex.max.astype(np.float64)[:, None]
        self.edges = [numbers(row) for row in bound * np.arange(ex.quantiles + 1) / ex.quantiles]
        self.sections: Dict[str, Tuple[List[List[int]], List[List[Optional[float]]]]] = {}
        for section, (ids, values) in (effects.sections.items() if effects is not None else ()):
            self.sections[section] = (ids.tolist(), [numbers(row) for row in values])
        self.logits_hist: Optional[Tuple[List[List[int]], List[List[Optional[float]]]]] = None
        if effects is not None and effects.logits_hist is not None:
            heights, ranges = effects.logits_hist
            self.logits_hist = (heights.tolist(), [numbers(row) for row in ranges])

    def examples(self, latent: int) -> Tuple[List[Dict[str, Any]], List[List[Dict[str, Any]]]]:
        """Latent `latent`'s top examples and its examples per range."""
        ex = self.result.examples
        a = ex.arrays
        lo, hi = int(self.starts[latent]), int(self.starts[latent + 1])
        top: List[Dict[str, Any]] = []
        ranges: List[List[Dict[str, Any]]] = [[] for _ in range(ex.quantiles)]
        mine = self.order[lo:hi]
        windows = significant(ex.window_values[mine])
        # Zeros (most of a window) written as 0, not 0.0; non-finite values as null.
        objects = windows.astype(object)
        objects[windows == 0] = 0
        objects[~np.isfinite(windows)] = None
        window_lists = objects.tolist()
        columns = zip(self.kind_of[lo:hi].tolist(), numbers(a["value"][mine]), a["row"][mine].tolist(),
                      a["doc_index"][mine].tolist(), a["position"][mine].tolist(), ex.tokens[mine].tolist(), window_lists)
        for kind, value, row, doc, position, tokens, values in columns:
            item = {"value": value, "row": row, "doc": doc, "position": position, "tokens": tokens, "values": values}
            (top if kind == TOP else ranges[kind]).append(item)
        return top, ranges

    def latent(self, latent: int) -> Dict[str, Any]:
        """The object of latent `latent` (see the module)."""
        top, ranges = self.examples(latent)
        edges = self.edges[latent]
        out: Dict[str, Any] = {
            "latent": latent,
            "firings": self.firings[latent],
            "frequency": self.frequency[latent],
            "max": self.max[latent],
            "mean": self.mean[latent],
            "hist": self.result.histogram[latent].tolist(),
            "hist_range": numbers(self.result.range(latent)),
            "top": top,
            "ranges": [{"range": q, "lo": edges[q], "hi": edges[q + 1], "examples": group}
                       for q, group in enumerate(ranges)],
        }
        for section, (ids, values) in self.sections.items():
            out[section] = [[i, v] for i, v in zip(ids[latent], values[latent]) if i >= 0]
        if self.logits_hist is not None:
            heights, bounds = self.logits_hist
            out["logits_hist"] = {"heights": heights[latent], "range": bounds[latent]}
        return out

    def chunks(self) -> Iterator[Tuple[int, List[Dict[str, Any]]]]:
        """``(start, latent objects)`` per chunk of `CHUNK` latents."""
        width = self.result.width
        for start in range(0, width, CHUNK):
            yield start, [self.latent(i) for i in range(start, min(start + CHUNK, width))]

    def top_tokens(self, latent: int, vocab: Optional[Sequence[str]]) -> List[List[Any]]:
        """The most common token strings at latent `latent`'s top examples' own positions:
        ``[[string, count], ...]``, most common first (ties: the string seen first)."""
        ex = self.result.examples
        lo, hi = int(self.starts[latent]), int(self.starts[latent + 1])
        mine = self.order[lo:hi][self.kind_of[lo:hi] == TOP]
        centre = ex.tokens[mine, ex.window] if len(mine) else np.zeros(0, np.int32)
        counts = Counter(token_string(int(t), vocab) for t in centre.tolist())
        return [[s, c] for s, c in counts.most_common(SUMMARY_TOKENS)]

    def table(self, vocab: Optional[Sequence[str]]) -> Dict[str, Any]:
        """The column index's table, one entry per latent in each list."""
        width = self.result.width
        return {
            "name": self.result.name,
            "width": width,
            "count": int(self.stats["count"]),
            "latent": list(range(width)),
            "firings": [int(f) for f in self.stats["firings"]],
            "frequency": numbers(self.stats["frequency"]),
            "max": numbers(self.result.max),
            "mean": numbers(self.stats["mean"]),
            "top_tokens": [self.top_tokens(i, vocab) for i in range(width)],
        }


def chunk_text(start: int, latents: List[Dict[str, Any]]) -> str:
    """A data file: ``siphonChunk(start, [latent objects]);``."""
    return f"siphonChunk({start},{dumps(latents)});\n"


def chunk_name(start: int) -> str:
    """The data file of the chunk starting at latent `start`, relative to the column's folder."""
    return f"data/chunk-{start // CHUNK:04d}.js"
