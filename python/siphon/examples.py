"""Each latent's examples, as feature dashboards show them (SAEDashboard, Neuronpedia): its `top`
largest activations, and `per_quantile` examples drawn uniformly from each of `quantiles`
equal-width activation ranges up to its largest value; each with the tokens around it.

One pass over the shards: the ranges' bound is each latent's largest value, which the run's
statistics hold (``stats.json``), and the uniform draw is a bottom-k sample (each firing's
priority a hash of its row, latent and the seed), so an example set is the same whatever order
the shards come in, and the sets of disjoint parts of a run (a host's shards each) merge into
the set of the whole (`LatentExamples.merge`). Ties in value go to the earlier row. Excluded
tokens (masked in a ``keep_excluded`` run) are never examples, but stand in their windows. The
windows need the stored order of tokens: a run extracted with a token shuffle gives examples
without them (``window=0``).

    from siphon import open_dataset
    from siphon.examples import latent_examples
    ds = open_dataset("out/run")
    ex = latent_examples(ds, "blocks.6.hook_resid_post.hook_sae_acts_post", top=20, quantiles=10)
    ex.latent(123)  # {"latent": 123, "top": [...], "quantiles": [...]}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional

import numpy as np

from ._output import check_count
from .errors import DatasetError
from .latents import LatentShard, checked_latents

#: The example arrays of a `LatentExamples`, each with one entry per example.
FIELDS = ("latent", "kind", "value", "row", "priority", "doc_index", "position")
#: `kind` of a top example; quantile examples have their range's index (0 = lowest).
TOP = -1
#: The most activation ranges: a range's index is an example's `kind`, an int8.
MAX_QUANTILES = 128
#: The most tokens on each side of an example, and the most examples of a latent per kind.
MAX_WINDOW, MAX_EXAMPLES = 4096, 100_000


@dataclass
class LatentExamples:
    """The examples of one latents column. Per example (arrays of equal length): its `latent`,
    `kind` (`TOP`, or the activation range it was drawn from), `value`, global `row` (rows of
    earlier shards counted first, hosts in order), the sampling `priority`, the token's
    `doc_index` and `position`, `tokens` ``[examples, 2 * window + 1]``: the token ids of its
    sequence around it, the example's own in the middle, ``-1`` past the sequence's stored
    tokens, and `window_values` (float32, the same shape): the example's latent's value at each
    of those tokens (its stored value, 0 where it did not fire and past the sequence), looked up
    in the shard's CSR when the example is taken in."""

    name: str
    width: int
    top: int
    quantiles: int
    per_quantile: int
    window: int
    seed: int
    #: Each latent's largest value: the upper bound of its activation ranges.
    max: np.ndarray
    arrays: Dict[str, np.ndarray] = field(default_factory=dict)
    tokens: np.ndarray = field(default_factory=lambda: np.zeros((0, 1), np.int32))
    window_values: np.ndarray = field(default_factory=lambda: np.zeros((0, 1), np.float32))

    def __post_init__(self) -> None:
        if not self.arrays:
            dtypes = (np.int32, np.int8, np.float32, np.int64, np.uint64, np.int64, np.int32)
            self.arrays = {f: np.zeros(0, d) for f, d in zip(FIELDS, dtypes)}
            self.tokens = np.zeros((0, 2 * self.window + 1), np.int32)
            self.window_values = np.zeros((0, 2 * self.window + 1), np.float32)

    def add(self, shard: LatentShard) -> None:
        """Takes one shard's firings in."""
        rows, latents, values = shard.local_rows(), shard.indices.astype(np.int32), shard.values.astype(np.float32)
        if shard.mask is not None:
            kept = shard.mask[rows]
            rows, latents, values = rows[kept], latents[kept], values[kept]
        global_rows = rows + shard.row_start
        new = {
            "latent": latents,
            "value": values,
            "row": global_rows,
            "priority": _priority(global_rows, latents, self.seed),
            "doc_index": shard.doc_index[rows].astype(np.int64),
            "position": shard.position[rows].astype(np.int32),
        }
        # Top candidates, then each firing once more as a candidate of its range.
        top = {**new, "kind": np.full(len(rows), TOP, np.int8)}
        bound = self.max[latents]
        with np.errstate(divide="ignore", invalid="ignore"):
            ranges = np.where(bound > 0, np.floor(values / bound * self.quantiles), 0)
        ranged = {**new, "kind": np.clip(ranges, 0, self.quantiles - 1).astype(np.int8)}
        candidates = {f: np.concatenate([top[f], ranged[f]]) for f in FIELDS}
        local = np.concatenate([rows, rows])
        taken, new_taken = self._merged(candidates)
        neighbour, inside = _window_rows(shard, local[new_taken], self.window)
        windows = np.where(inside, shard.token_ids[neighbour], -1).astype(np.int32)
        values = np.where(inside, _values_at(shard, neighbour, candidates["latent"][new_taken][:, None]), 0)
        self.tokens = np.concatenate([self.tokens[taken], windows])
        self.window_values = np.concatenate([self.window_values[taken], values.astype(np.float32)])
        self.arrays = {f: np.concatenate([self.arrays[f][taken], candidates[f][new_taken]]) for f in FIELDS}

    def merge(self, other: "LatentExamples") -> None:
        """Takes in the examples of a disjoint part of the same run (the same column and
        settings): the result is the examples of both parts together."""
        same = ("name", "width", "top", "quantiles", "per_quantile", "window", "seed")
        if any(getattr(self, a) != getattr(other, a) for a in same) or not np.array_equal(self.max, other.max):
            raise DatasetError(f"cannot merge examples of {other.name!r} taken with other settings than {self.name!r}'s")
        taken, new_taken = self._merged(other.arrays)
        self.tokens = np.concatenate([self.tokens[taken], other.tokens[new_taken]])
        self.window_values = np.concatenate([self.window_values[taken], other.window_values[new_taken]])
        self.arrays = {f: np.concatenate([self.arrays[f][taken], other.arrays[f][new_taken]]) for f in FIELDS}

    def _merged(self, candidates: Dict[str, np.ndarray]) -> "tuple[np.ndarray, np.ndarray]":
        """Which of the kept examples stay and which candidates join them: per latent its
        `top` largest values (the earlier row first among equals), per latent and range the
        `per_quantile` lowest priorities."""
        both = {f: np.concatenate([self.arrays[f], candidates[f]]) for f in FIELDS}
        is_top = both["kind"] == TOP
        group = both["latent"].astype(np.int64) * (self.quantiles + 1) + (both["kind"].astype(np.int64) + 1)
        # The order within a group: value descending for tops, priority ascending for samples.
        first = np.where(is_top, -both["value"].astype(np.float64), 0.0)
        second = np.where(is_top, 0, both["priority"]).astype(np.uint64)
        order = np.lexsort((both["row"], second, first, group))
        sorted_groups = group[order]
        starts = np.r_[0, np.flatnonzero(sorted_groups[1:] != sorted_groups[:-1]) + 1]
        rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
        limit = np.where(is_top[order], self.top, self.per_quantile)
        keep = np.sort(order[rank < limit])
        held = len(self.arrays["latent"])
        return keep[keep < held], keep[keep >= held] - held

    def latent(self, latent: int) -> Dict[str, Any]:
        """One latent's examples: ``{"latent", "max", "top": [...], "quantiles": [{"range":
        [low, high], "examples": [...]}, ...]}``, each example ``{"value", "row",
        "doc_index", "position", "tokens", "values"}`` (`values`: the example's
        `window_values`), tops by value (largest first), samples by row."""
        if not 0 <= latent < self.width:
            raise DatasetError(f"latent {latent} is outside 0..{self.width} of {self.name!r}")
        mine = np.flatnonzero(self.arrays["latent"] == latent)

        def examples(picked: np.ndarray, by_value: bool) -> List[Dict[str, Any]]:
            a = self.arrays
            key = np.lexsort((a["row"][picked], -a["value"][picked])) if by_value else np.argsort(a["row"][picked])
            return [
                {"value": float(a["value"][i]), "row": int(a["row"][i]), "doc_index": int(a["doc_index"][i]),
                 "position": int(a["position"][i]), "tokens": self.tokens[i].tolist(),
                 "values": self.window_values[i].tolist()}
                for i in picked[key]
            ]

        kinds = self.arrays["kind"][mine]
        bound = float(self.max[latent])
        return {
            "latent": latent,
            "max": bound,
            "top": examples(mine[kinds == TOP], True),
            "quantiles": [
                {"range": [bound * q / self.quantiles, bound * (q + 1) / self.quantiles],
                 "examples": examples(mine[kinds == q], False)}
                for q in range(self.quantiles)
            ],
        }


def latent_examples(
    dataset: Any,
    name: str,
    *,
    top: int = 20,
    quantiles: int = 10,
    per_quantile: int = 5,
    window: int = 16,
    seed: int = 0,
    shards: Optional[Iterable[LatentShard]] = None,
    check: bool = True,
) -> LatentExamples:
    """The examples of latents column `name` of `dataset` (a `siphon.Dataset`), in one pass
    over `shards` (default: every committed shard; a part of them, e.g. one host's, gives that
    part's examples, which `LatentExamples.merge` combines). The activation ranges' bounds are
    the run's statistics (stats.json, the whole run's even for a part)."""
    out = empty_examples(dataset, name, top=top, quantiles=quantiles, per_quantile=per_quantile, window=window,
                         seed=seed)
    for shard in shards if shards is not None else dataset.latent_shards(name, check=check):
        out.add(shard)
    return out


def empty_examples(
    dataset: Any, name: str, *, top: int, quantiles: int, per_quantile: int, window: int, seed: int
) -> LatentExamples:
    """An empty example set of latents column `name` of `dataset` with these settings, its
    ranges bounded by the run's per-latent max; the settings, the column, its max and (for a
    window) the stored token order checked first."""
    for what, value, least, most in (("top", top, 0, MAX_EXAMPLES), ("quantiles", quantiles, 1, MAX_QUANTILES),
                                     ("per_quantile", per_quantile, 0, MAX_EXAMPLES), ("window", window, 0, MAX_WINDOW)):
        check_count(what, value, least, most)
    info = checked_latents(name, dataset.latents)
    shuffle = dataset.run.get("shard_format", {}).get("shuffle")
    if shuffle and window > 0:
        raise DatasetError(
            f"{dataset.url} stores its tokens shuffled (shard_format.shuffle {shuffle!r}): the tokens around an "
            "example are not known; ask for window=0 (--window 0), or extract without token shuffling"
        )
    stats = dataset.latent_stats(name)
    if "max" not in stats:
        raise DatasetError(f"{name!r}: the run's stats.json has no per-latent max (written before siphon kept it)")
    bound = np.asarray(stats["max"], dtype=np.float32)
    if bound.shape != (info.width,):
        raise DatasetError(f"{name!r}: stats.json's max has {bound.size} entries, the column {info.width} latents")
    return LatentExamples(name, info.width, top, quantiles, per_quantile, window, seed, bound)


def _priority(rows: np.ndarray, latents: np.ndarray, seed: int) -> np.ndarray:
    """A 64-bit hash of (row, latent, seed): splitmix64's finalizer."""
    x = rows.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    x ^= latents.astype(np.uint64) << np.uint64(40)
    x ^= np.uint64(seed & 0xFFFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _window_rows(shard: LatentShard, rows: np.ndarray, window: int) -> "tuple[np.ndarray, np.ndarray]":
    """The shard rows around each of the shard's `rows` in its sequence, ``[rows, 2 * window +
    1]``, and whether each lies in the sequence (where not, the row given is a stand-in): the
    shard's rows of the same sample, in their order (a sample's rows lie in one shard, in order
    unless shuffled)."""
    order = np.lexsort((np.arange(shard.rows), shard.sample_index))
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    offsets = np.arange(-window, window + 1)
    at = rank[rows][:, None] + offsets[None, :]
    inside = (at >= 0) & (at < len(order))
    neighbour = order[np.clip(at, 0, len(order) - 1)]
    same = inside & (shard.sample_index[neighbour] == shard.sample_index[rows][:, None])
    return neighbour, same


def _values_at(shard: LatentShard, rows: np.ndarray, latents: np.ndarray) -> np.ndarray:
    """The shard's value (float32) of latent `latents` at shard row `rows` (arrays that
    broadcast together), 0 where it did not fire: a binary search of the entries' (row,
    latent) keys, which the CSR stores ascending."""
    rows, latents = np.broadcast_arrays(rows, latents)
    if shard.nnz == 0 or rows.size == 0:
        return np.zeros(rows.shape, np.float32)
    width = np.int64(shard.info.width)
    keys = shard.local_rows() * width + shard.indices.astype(np.int64)
    wanted = rows.astype(np.int64) * width + latents.astype(np.int64)
    at = np.minimum(np.searchsorted(keys, wanted), shard.nnz - 1)
    found: np.ndarray = np.where(keys[at] == wanted, shard.values[at].astype(np.float32), np.float32(0))
    return found
