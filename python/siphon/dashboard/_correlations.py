"""SAEDashboard's feature tables of correlations (its ``RollingCorrCoef``), from a run's sparse
latents in one pass: per latent the Pearson correlation and cosine similarity of its
activations over the tokens with

- the other latents of its batch (``correlated_features_*``: SAEDashboard correlates the
  features it computes together, a batch of ``n_features_at_a_time``; the latent itself left
  out by a zero on the diagonal, as it does), and
- each dimension of the hook its dictionary reads (``correlated_neurons_*``), where the run
  stores that hook.

Both are sums over tokens — ``n``, ``Σx``, ``Σx²``, ``Σxy`` — which the latents' CSR gives
without densifying: products of two latents only where both fired in one token, the hook's
rows only where the latent fired. The tokens are those the run includes (a ``keep_excluded``
mask's rows left out); SAEDashboard's are every token of its prompts, BOS too. Sums in float64
(SAEDashboard's in float32), the formulas its own, ``+ 1e-6`` in each denominator.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

#: Hook rows times latent entries multiplied at once (bounds the pass's scratch memory).
PRODUCT_ENTRIES = 1 << 15


def batch_bounds(width: int, batch_size: int) -> List[Tuple[int, int]]:
    """The latents of each batch file, ``[(start, end), ...]``: ``np.array_split`` of
    ``range(width)`` into ``ceil(width / batch_size)`` parts, as SAEDashboard's Neuronpedia
    runner batches its features (parts of near-equal size, the larger first)."""
    if width == 0:
        return []
    parts = -(-width // batch_size)
    sizes = [width // parts + (1 if i < width % parts else 0) for i in range(parts)]
    starts = np.cumsum([0] + sizes)
    return [(int(starts[i]), int(starts[i + 1])) for i in range(parts)]


class Correlations:
    """The sums of one latents column (`width` latents in `batches`) and, where `hook_width`
    is given, of its hook's dimensions."""

    def __init__(self, width: int, batches: List[Tuple[int, int]], hook_width: Optional[int]) -> None:
        self.width = width
        self.batches = batches
        self.block = np.zeros(width, np.int64)
        self.block_start = np.zeros(width, np.int64)
        for b, (start, end) in enumerate(batches):
            self.block[start:end] = b
            self.block_start[start:end] = start
        self.span = max((end - start for start, end in batches), default=1)
        self.n = 0
        self.x_sum = np.zeros(width)
        self.x2_sum = np.zeros(width)
        #: ``[latent, offset in its batch]``: Σ x_latent · x_other.
        self.xy_features = np.zeros(width * self.span)
        self.hook_width = hook_width
        if hook_width is not None:
            self.y_sum = np.zeros(hook_width)
            self.y2_sum = np.zeros(hook_width)
            self.xy_neurons = np.zeros((width, hook_width))

    def add(self, rows: np.ndarray, latents: np.ndarray, values: np.ndarray, tokens: int,
            hook: Optional[np.ndarray] = None) -> None:
        """Takes in `tokens` token rows: their latent entries (`rows` 0-based among them,
        ascending, latents ascending within a row) and, with a hook, its rows ``[tokens,
        hook_width]``."""
        self.n += tokens
        latents = latents.astype(np.int64)
        v = values.astype(np.float64)
        self.x_sum += np.bincount(latents, weights=v, minlength=self.width)
        self.x2_sum += np.bincount(latents, weights=v * v, minlength=self.width)
        self._add_pairs(rows.astype(np.int64), latents, v)
        if self.hook_width is not None and hook is not None:
            h = hook.astype(np.float64)
            self.y_sum += h.sum(axis=0)
            self.y2_sum += (h * h).sum(axis=0)
            self._add_neurons(rows, latents, v, hook)

    def _add_pairs(self, rows: np.ndarray, latents: np.ndarray, v: np.ndarray) -> None:
        """Σ x_i · x_j over every pair of entries of one token in one batch (each with itself
        too: the diagonal, zeroed later as SAEDashboard zeroes it)."""
        if not len(latents):
            return
        group = rows * len(self.batches) + self.block[latents]
        starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
        sizes = np.diff(np.r_[starts, len(group)])
        size_of = np.repeat(sizes, sizes)
        first = np.repeat(np.arange(len(group)), size_of)
        offset = np.arange(len(first)) - np.repeat(np.cumsum(size_of) - size_of, size_of)
        second = np.repeat(np.repeat(starts, sizes), size_of) + offset
        a, b = latents[first], latents[second]
        key = a * self.span + (b - self.block_start[b])
        self.xy_features += np.bincount(key, weights=v[first] * v[second], minlength=self.width * self.span)

    def _add_neurons(self, rows: np.ndarray, latents: np.ndarray, v: np.ndarray, hook: np.ndarray) -> None:
        """Σ x_latent · h_dim: each entry's value times its row of the hook, summed per latent
        (entries sorted by latent, in slices of `PRODUCT_ENTRIES` / hook width)."""
        order = np.argsort(latents, kind="stable")
        latents, rows, v = latents[order], rows[order], v[order]
        step = max(1, PRODUCT_ENTRIES * 32 // max(1, hook.shape[1]))
        for start in range(0, len(latents), step):
            lat, at, val = latents[start:start + step], rows[start:start + step], v[start:start + step]
            products = hook[at].astype(np.float64) * val[:, None]
            heads = np.flatnonzero(np.r_[True, lat[1:] != lat[:-1]])
            self.xy_neurons[lat[heads]] += np.add.reduceat(products, heads, axis=0)

    def features(self, k: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per latent the `k` latents of its batch of largest Pearson correlation (ids
        ``[width, k]``), their Pearson and cosine values."""
        ids = np.zeros((self.width, k), np.int64)
        pearson_out = np.zeros((self.width, k))
        cosine_out = np.zeros((self.width, k))
        xy = self.xy_features.reshape(self.width, self.span)
        for start, end in self.batches:
            span = end - start
            block = xy[start:end, :span]
            pearson, cosine = _coefficients(self.n, block, self.x_sum[start:end], self.x2_sum[start:end],
                                            self.x_sum[start:end], self.x2_sum[start:end])
            np.fill_diagonal(pearson, 0.0)
            np.fill_diagonal(cosine, 0.0)
            taken = min(k, span)
            top = _top(pearson, taken)
            ids[start:end, :taken] = top + start
            pearson_out[start:end, :taken] = np.take_along_axis(pearson, top, axis=1)
            cosine_out[start:end, :taken] = np.take_along_axis(cosine, top, axis=1)
        return ids, pearson_out, cosine_out

    def neurons(self, k: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per latent the `k` hook dimensions of largest Pearson correlation, their Pearson
        and cosine values (the hook must have been given)."""
        assert self.hook_width is not None
        pearson, cosine = _coefficients(self.n, self.xy_neurons, self.x_sum, self.x2_sum, self.y_sum, self.y2_sum)
        top = _top(pearson, min(k, self.hook_width))
        return top, np.take_along_axis(pearson, top, axis=1), np.take_along_axis(cosine, top, axis=1)


def _coefficients(n: int, xy: np.ndarray, x_sum: np.ndarray, x2_sum: np.ndarray, y_sum: np.ndarray,
                  y2_sum: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``RollingCorrCoef.corrcoef``: Pearson ``(n Σxy − Σx Σy) / (√(n Σx² − (Σx)²) √(n Σy² −
    (Σy)²) + 1e-6)`` and cosine ``Σxy / (√(Σx² Σy²) + 1e-6)``."""
    cosine = xy / (np.sqrt(np.outer(x2_sum, y2_sum)) + 1e-6)
    spread = np.sqrt(np.maximum(np.outer(n * x2_sum - x_sum ** 2, n * y2_sum - y_sum ** 2), 0.0))
    pearson = (n * xy - np.outer(x_sum, y_sum)) / (spread + 1e-6)
    return pearson, cosine


def _top(values: np.ndarray, k: int) -> np.ndarray:
    """Per row the columns of the `k` largest values, largest first (ties: lower column)."""
    if k == 0:
        return np.zeros((values.shape[0], 0), np.int64)
    order: np.ndarray = np.argsort(-values, axis=1, kind="stable")[:, :k]
    return order
