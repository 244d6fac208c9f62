"""The whole sequences of chosen examples, as SAEDashboard's Neuronpedia layout shows them (no
buffer: every token of the prompt from its second on): for each example (a latent at a global
token row) the token ids of its sequence (the rows of its sample in stored order, less the first in a
``keep_excluded`` run, which stores every row; a run without one does not store the excluded
first token, BOS, at all), the latent's values
there (0 where it did not fire, and at tokens a ``keep_excluded`` mask excludes, which
SAEDashboard zeroes as ignored tokens), and the example's index among them.

One more read of the column's shards, after the pass that chose the examples: a sequence's rows
lie in one shard, so each shard gives the sequences of the examples in it. What is held is the
token ids of the examples' sequences (each once) and the latents' firings in them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

import numpy as np

from ..errors import DatasetError


@dataclass
class Sequences:
    """Per example (in the order given): `sequence`, an index into `tokens` (the token ids of
    each sequence gathered), and `at`, its index there; the latents' firings in them as
    parallel arrays `fired_example`, `fired_at`, `fired_value`."""

    sequence: np.ndarray
    at: np.ndarray
    tokens: List[np.ndarray]
    fired_example: np.ndarray
    fired_at: np.ndarray
    fired_value: np.ndarray

    def values(self, example: int) -> np.ndarray:
        """Example `example`'s latent's values over its sequence (float32)."""
        out = np.zeros(len(self.tokens[int(self.sequence[example])]), np.float32)
        lo, hi = np.searchsorted(self.fired_example, [example, example + 1])
        out[self.fired_at[lo:hi]] = self.fired_value[lo:hi]
        return out


def gather_sequences(shards: Any, rows: np.ndarray, latents: np.ndarray) -> Sequences:
    """The sequences of examples (global `rows`, `latents`) from `shards` (the column's
    `LatentShard`s in order, every shard of the run, or their parts: whole samples each). An example at a sequence's first row is
    outside what is shown: its index is -1, as SAEDashboard's ``qualifying_token_index - 1``."""
    count = len(rows)
    sequence = np.full(count, -1, np.int64)
    at = np.full(count, -1, np.int64)
    tokens: List[np.ndarray] = []
    fired: List[Tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    order = np.argsort(rows, kind="stable")
    sorted_rows = rows[order]
    for shard in shards:
        lo, hi = np.searchsorted(sorted_rows, [shard.row_start, shard.row_start + shard.rows])
        if lo == hi:
            continue
        mine = order[lo:hi]
        local = rows[mine] - shard.row_start
        # The shard's rows by sample, in their stored order (a sample's rows are stored in
        # order; `position` counts within a document): each sample's sequence; in a run that
        # keeps every row (a mask) less its first, as SAEDashboard shows a prompt.
        shown = np.lexsort((np.arange(shard.rows), shard.sample_index))
        if shard.mask is not None:
            sample_of = shard.sample_index[shown]
            shown = shown[np.r_[False, sample_of[1:] == sample_of[:-1]]]
        samples = shard.sample_index[shown]
        starts = np.flatnonzero(np.r_[True, samples[1:] != samples[:-1]])
        ends = np.r_[starts[1:], len(shown)]
        # Each shown row's index in its sequence, and each example row's.
        index_in = np.empty(shard.rows, np.int64)
        index_in.fill(-1)
        index_in[shown] = np.arange(len(shown)) - np.repeat(starts, ends - starts)
        which = {int(s): i for i, s in enumerate(samples[starts].tolist())}
        wanted = np.unique(shard.sample_index[local])
        slot: Dict[int, int] = {}
        for s in wanted.tolist():
            i = which.get(int(s))
            slot[int(s)] = len(tokens)
            tokens.append(shard.token_ids[shown[starts[i]:ends[i]]].astype(np.int64) if i is not None
                          else np.zeros(0, np.int64))
        sequence[mine] = [slot[int(s)] for s in shard.sample_index[local].tolist()]
        at[mine] = index_in[local]
        # The examples' latents' firings in their sequences (included, shown rows only).
        entry_rows = shard.local_rows()
        keep = index_in[entry_rows] >= 0
        if shard.mask is not None:
            keep &= shard.mask[entry_rows]
        width = np.int64(shard.info.width)
        entry_key = shard.sample_index[entry_rows].astype(np.int64) * width + shard.indices.astype(np.int64)
        example_key = shard.sample_index[local].astype(np.int64) * width + latents[mine].astype(np.int64)
        key_order = np.argsort(example_key, kind="stable")
        sorted_keys = example_key[key_order]
        left = np.searchsorted(sorted_keys, entry_key, side="left")
        right = np.searchsorted(sorted_keys, entry_key, side="right")
        keep &= right > left
        # An entry belongs to every example of its (sample, latent): one copy each.
        idx = np.flatnonzero(keep)
        repeats = (right - left)[idx]
        entry = np.repeat(idx, repeats)
        nth = np.arange(len(entry)) - np.repeat(np.cumsum(repeats) - repeats, repeats)
        example = mine[key_order[np.repeat(left[idx], repeats) + nth]]
        fired.append((example, index_in[entry_rows[entry]], shard.values[entry].astype(np.float32)))
    if (sequence < 0).any():
        missing = int(rows[np.flatnonzero(sequence < 0)[0]])
        raise DatasetError(f"row {missing} of an example is in no shard read")
    ex = np.concatenate([f[0] for f in fired]) if fired else np.zeros(0, np.int64)
    fat = np.concatenate([f[1] for f in fired]) if fired else np.zeros(0, np.int64)
    fval = np.concatenate([f[2] for f in fired]) if fired else np.zeros(0, np.float32)
    by = np.lexsort((fat, ex))
    return Sequences(sequence, at, tokens, ex[by], fat[by], fval[by])
