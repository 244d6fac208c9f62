"""A dictionary's latents as the batch files SAEDashboard's Neuronpedia runner writes
(``batch-N.json``, ``neuronpedia_runner.py`` with its converter ``neuronpedia_converter.py``),
field for field, from the stored run: no model forward.

    from siphon.dashboard.neuronpedia import export_neuronpedia
    export_neuronpedia("out/run", "out/np", effects="out/effects", sae_set="res-siphon")

or ``siphon export neuronpedia RUN OUT --sae-set NAME`` (which writes the effects directory
first: the tokenizer's pieces, the logit effects and the decoder's largest entries, see
`siphon.dashboard._effects`). Each file holds ``{model_id, layer, sae_set, sae_id_suffix,
features}`` for a batch of latents (``np.array_split`` of them into ``ceil(width /
batch_size)`` parts, as the runner splits its features), each feature what the runner's layout
computes (`NeuronpediaDashboardFeature.to_dict`): the decoder's three largest entries and
their share of its L1 norm; the three hook dimensions and the three latents of its batch whose
activations correlate most with its own (`siphon.dashboard._correlations`; the neurons only
where the run stores the dictionary's hook, else empty lists, said on stderr); its top and
bottom 10 logit effects; its density (``frac_nonzero``) and the two histograms as
SAEDashboard bins them (50 bins, bar values at the bins' centres); the run's prompts and
tokens; and its examples (``activations``): the top `top` activations (``bin_min`` -1), then
each of `quantiles` equal-width intervals from 0 to its largest value, highest first, with
the share of tokens in it (``bin_contains``, both ends inclusive, tokens where the latent is 0
counted in the intervals holding 0) and `per_quantile` examples drawn from its firings in it;
each example its whole sequence from the second token (``tokens`` as the runner's vocabulary
shows them: the tokenizer's pieces with its ``HTML_ANOMALIES`` replaced, ``values`` rounded to
4 then 3 decimals, ``qualifying_token_index``). Rounding as the converter rounds (3 decimals).

Where siphon's differs from a SAEDashboard run over the same tokens: the tokens are those the
run includes (SAEDashboard's densities, intervals and correlations count BOS and the other
ignored tokens as zeros); the top group lists only firings (SAEDashboard pads it with tokens
where the latent is 0), and the interval holding 0 draws its examples from firings (its draw
would mostly show tokens where the latent is 0); activations are the dictionary's own
(SAEDashboard's folded decoder norms scale them, equal for unit-norm decoders, as SAELens
trains them); examples are drawn by siphon's seeded sample (`siphon.examples`).

Reading: the dashboard's pass over the column's shards (`siphon.dashboard._pass`) plus the
intervals' shares and the correlations' sparse sums (`siphon.dashboard._correlations`), then
one more read of the shards for the examples' whole sequences (`siphon.dashboard._sequences`);
a run stored with its tokens shuffled is refused. ``python/tests/test_saedashboard.py``
compares the files with those of SAEDashboard's own runner and converter.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from .._output import check_count, check_new_or_empty
from ..dataset import Dataset, open_dataset
from ..errors import DatasetError
from ..examples import TOP, empty_examples
from ..latents import checked_latents
from ._correlations import Correlations, batch_bounds
from ._effects import ColumnEffects, read_effects
from ._pass import PART_ROWS, ColumnPass, Progress
from ._sequences import Sequences, gather_sequences

__all__ = ["export_neuronpedia", "HTML_ANOMALIES"]

#: The runner's replacements in its vocabulary's pieces (``neuronpedia_runner.py``), in order.
HTML_ANOMALIES = {
    "âĢĶ": "—",
    "âĢĵ": "–",
    "âĢľ": "“",
    "âĢĿ": "”",
    "âĢĺ": "‘",
    "âĢĻ": "’",
    "âĢĭ": " ",
    "Ġ": " ",
    "Ċ": "\n",
    "ĉ": "\t",
}
OUT_OF_RANGE_TOKEN = "<|outofrange|>"
#: The layout's histogram bins and feature table rows.
BINS, TABLE_ROWS = 50, 3
#: The most correlation sums of a column, width × latents per batch (8 GiB of float64).
MAX_CORRELATION_SUMS = 1 << 30


@dataclass
class Header:
    """A batch file's top level."""

    model_id: str
    layer: int
    sae_set: str
    sae_id_suffix: Optional[str]
    dataset: str
    prompts: int
    prompt_tokens: int


def export_neuronpedia(
    run: Union[str, "os.PathLike[str]", Dataset],
    out: Union[str, "os.PathLike[str]"],
    *,
    effects: Union[str, "os.PathLike[str]"],
    sae_set: str,
    name: Optional[str] = None,
    model_id: Optional[str] = None,
    layer: Optional[int] = None,
    sae_id_suffix: Optional[str] = None,
    dataset_name: Optional[str] = None,
    batch_size: int = 128,
    top: int = 20,
    quantiles: int = 5,
    per_quantile: int = 5,
    seed: int = 0,
    progress: bool = True,
    check: bool = True,
) -> List[Path]:
    """Writes the batch files of latents column `name` of `run` (default: its only one) into
    the new or empty folder `out` and returns their paths. `effects`: the effects directory
    with the tokenizer's pieces and the column's logit effects and alignment (``siphon export
    neuronpedia`` writes it). `model_id` (default: the run's model directory's name) and
    `layer` (default: N of the hook ``blocks.N.…``), `sae_set` and `sae_id_suffix` name the
    dictionary on Neuronpedia; `dataset_name` the examples' dataset (default: the run's
    corpus)."""
    ds = run if isinstance(run, Dataset) else open_dataset(os.fspath(run))
    name = _column(ds, name)
    info = checked_latents(name, ds.latents)
    # The batch's correlation sums hold width × (latents of a batch) float64.
    fits = MAX_CORRELATION_SUMS // info.width if info.width * info.width > MAX_CORRELATION_SUMS else sys.maxsize
    check_count("batch_size", batch_size, 1, fits,
                most_is=f"{MAX_CORRELATION_SUMS} correlation sums over the {info.width} latents of {name!r}")
    found = read_effects(os.fspath(effects), {name: info.width})
    column = found.columns.get(name)
    missing = [what for what, there in (("logit effects", column is not None and "logits_top" in column.sections),
                                        ("decoder alignment", column is not None and "alignment" in column.sections))
               if not there]
    if missing:
        raise DatasetError(f"{effects}: no {' or '.join(missing)} of {name!r} (its model must be on this machine, "
                           "and its dictionary write to the residual stream's basis: `siphon export neuronpedia` "
                           "says which in its log)")
    assert column is not None
    if found.pieces is None:
        raise DatasetError(f"{effects}: no pieces.json (the run's tokenizer was not found: give --tokenizer)")
    shuffle = ds.run.get("shard_format", {}).get("shuffle")
    if shuffle:
        raise DatasetError(f"{ds.url} stores its tokens shuffled (shard_format.shuffle {shuffle!r}): the rows its "
                           "examples come from cannot be shown; extract without token shuffling")
    header = _header(ds, info.hook, model_id=model_id, layer=layer, sae_set=sae_set, sae_id_suffix=sae_id_suffix,
                     dataset_name=dataset_name)
    root = Path(os.fspath(out))
    check_new_or_empty(root, "the batch files")
    vocab = vocab_strings(found.pieces, _vocab_size(ds, found.pieces))
    batches = batch_bounds(info.width, batch_size)
    hook_width = ds.hooks[info.hook].width if info.hook in ds.hooks else None
    if hook_width is None:
        print(f"siphon: the run does not store {info.hook}: correlated_neurons_* are left empty "
              "(extract with that hook too to have them)", file=sys.stderr)
    collected = _first_pass(ds, name, batches, hook_width, top=top, quantiles=quantiles, per_quantile=per_quantile,
                            seed=seed, progress=progress, check=check)
    header.prompts = collected.samples
    a = collected.column.examples.arrays
    parts = (part for shard in ds.latent_shards(name, check=check) for part in shard.parts(PART_ROWS))
    sequences = gather_sequences(parts, a["row"], a["latent"])
    writer = _Features(collected, column, sequences, vocab, header)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for number, (start, end) in enumerate(batches):
        batch = {
            "model_id": header.model_id,
            "layer": header.layer,
            "sae_set": header.sae_set,
            "sae_id_suffix": header.sae_id_suffix,
            "features": [writer.feature(latent) for latent in range(start, end)],
        }
        path = root / f"batch-{number}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(batch))
        tmp.replace(path)
        paths.append(path)
    return paths


def vocab_strings(pieces: Sequence[Optional[str]], size: int) -> List[str]:
    """The runner's vocabulary (``get_vocab_dict``): each piece with `HTML_ANOMALIES`
    replaced, padded to `size` with `OUT_OF_RANGE_TOKEN` (an id without a piece: ``""``)."""
    out = []
    for piece in pieces:
        text = piece or ""
        for anomaly, replacement in HTML_ANOMALIES.items():
            text = text.replace(anomaly, replacement)
        out.append(text)
    return out + [OUT_OF_RANGE_TOKEN] * max(0, size - len(out))


def linspace_f32(start: np.ndarray, end: np.ndarray, steps: int) -> np.ndarray:
    """``torch.linspace(start, end, steps)`` in float32 per row (``[rows, steps]``), as
    torch's CPU kernel computes it: ``step = (end − start) / (steps − 1)`` in float32, then
    ``start + i·step`` for the first half and ``end − (steps − 1 − i)·step`` for the rest, each
    a fused multiply-add (one rounding to float32; the float64 product of two float32 values is
    exact)."""
    start = np.asarray(start, np.float32)[:, None]
    end = np.asarray(end, np.float32)[:, None]
    step = ((end - start) / np.float32(max(1, steps - 1))).astype(np.float64)
    i = np.arange(steps, dtype=np.float64)[None, :]
    first = start.astype(np.float64) + step * i
    second = end.astype(np.float64) - step * (steps - 1 - i)
    out: np.ndarray = np.where(i < steps // 2, first, second).astype(np.float32)
    return out


def histogram_values(lo: np.ndarray, hi: np.ndarray, bins: int) -> np.ndarray:
    """SAEDashboard's bar values (``HistogramData.from_data``): the float32 bin edges
    ``linspace(min, max, bins + 1)`` less the last, plus half of ``(max − min) / bins`` (as
    float32), rounded to 5 decimals; ``[rows, bins]``."""
    edges = linspace_f32(lo, hi, bins + 1)[:, :-1]
    size = ((hi.astype(np.float64) - lo.astype(np.float64)) / bins / 2).astype(np.float32)[:, None]
    centres = (edges + size).astype(np.float32).astype(np.float64)
    return np.array([[round(v, 5) for v in row] for row in centres.tolist()]).reshape(centres.shape)


def rounded(values: Any) -> List[Any]:
    """The converter's ``round_list``: ``np.round(values, 3)`` as a list."""
    arr = np.asarray(values)
    if arr.dtype.kind in "iu":
        return [int(v) for v in arr.tolist()]
    return [float(v) for v in np.round(arr.astype(np.float64), 3).tolist()]


def percent(share: float) -> float:
    """A share as SAEDashboard's titles carry it (``f"{share:.3%}"``) and its converter parses
    it back (÷ 100)."""
    return float(f"{share:.3%}".rstrip("%")) / 100


@dataclass
class _Collected:
    """What the first pass collected."""

    column: ColumnPass
    edges: np.ndarray
    intervals: np.ndarray
    correlations: Correlations
    samples: int


def _first_pass(ds: Dataset, name: str, batches: List[Tuple[int, int]], hook_width: Optional[int], *, top: int,
                quantiles: int, per_quantile: int, seed: int, progress: bool, check: bool) -> _Collected:
    """One read of the column's shards (and of its hook's rows, where stored): the examples
    and histograms (`ColumnPass`), each interval's tokens, the correlations' sums."""
    examples = empty_examples(ds, name, top=top, quantiles=quantiles, per_quantile=per_quantile, window=0, seed=seed)
    width = examples.width
    stats = ds.latent_stats(name)
    column = ColumnPass(examples, np.zeros((width, BINS), np.int64), stats.get("min", np.zeros(width)))
    edges = linspace_f32(np.zeros(width, np.float32), examples.max, quantiles + 1)
    intervals = np.zeros((width, quantiles), np.int64)
    entries = np.zeros(width, np.int64)
    correlations = Correlations(width, batches, hook_width)
    hook = _HookRows(ds, ds.latents[name].hook) if hook_width is not None else None
    samples = 0
    meter = Progress(name, len(ds.shards), enabled=progress)
    for shard in ds.latent_shards(name, check=check):
        column.add(shard)
        samples += len(np.unique(shard.sample_index))
        for part in shard.parts(PART_ROWS):
            rows = part.local_rows()
            latents, values = part.indices.astype(np.int64), part.values.astype(np.float32)
            tokens = part.rows
            if part.mask is not None:
                kept = part.mask[rows]
                rows, latents, values = (np.cumsum(part.mask)[rows] - 1)[kept], latents[kept], values[kept]
                tokens = int(part.mask.sum())
            entries += np.bincount(latents, minlength=width)
            e = edges[latents]
            inside = (values[:, None] >= e[:, :-1]) & (values[:, None] <= e[:, 1:])
            at, q = np.nonzero(inside)
            intervals += np.bincount(latents[at] * quantiles + q, minlength=width * quantiles).reshape(width, quantiles)
            correlations.add(rows, latents, values, tokens, hook.take(tokens) if hook is not None else None)
        meter.step(shard.rows)
    meter.finish()
    # Tokens where a latent is 0: in each interval holding 0.
    zeros = correlations.n - entries
    intervals += np.where((edges[:, :-1] <= 0) & (edges[:, 1:] >= 0), zeros[:, None], 0)
    return _Collected(column, edges, intervals, correlations, samples)


class _HookRows:
    """The hook's rows the run includes, in stored order (the latent shards' order), taken a
    shard's worth at a time."""

    def __init__(self, ds: Dataset, hook: str) -> None:
        self.width = ds.hooks[hook].width
        self.hook = hook
        self.batches: Iterator[Any] = iter(ds.batches([hook], batch_size=1 << 16, shuffle=False, output="numpy",
                                                      dtype="float32", prefetch=0))
        self.held: List[np.ndarray] = []
        self.count = 0

    def take(self, n: int) -> np.ndarray:
        while self.count < n:
            batch = next(self.batches, None)
            if batch is None:
                raise DatasetError(f"{self.hook}: fewer rows than the latents' (the run's shards disagree)")
            rows = np.asarray(batch[self.hook], np.float32).reshape(-1, self.width)
            self.held.append(rows)
            self.count += len(rows)
        joined = np.concatenate(self.held) if len(self.held) != 1 else self.held[0]
        self.held = [joined[n:]] if len(joined) > n else []
        self.count = len(joined) - n
        return joined[:n]


class _Features:
    """Builds each latent's feature object."""

    def __init__(self, collected: _Collected, effects: ColumnEffects, sequences: Sequences, vocab: List[str],
                 header: Header) -> None:
        self.c, self.effects, self.sequences, self.vocab, self.header = collected, effects, sequences, vocab, header
        column = collected.column
        self.n = collected.correlations.n
        self.firings = column.histogram.sum(axis=1)
        self.stats_lo = np.asarray(column.lo, np.float32)
        self.max = np.asarray(column.max, np.float32)
        self.acts_values = histogram_values(self.stats_lo, self.max, BINS)
        assert effects.logits_hist is not None
        self.logits_heights, logits_range = effects.logits_hist
        self.logits_values = histogram_values(logits_range[:, 0], logits_range[:, 1], self.logits_heights.shape[1])
        self.feature_tables = collected.correlations.features(TABLE_ROWS)
        self.neuron_tables = (collected.correlations.neurons(TABLE_ROWS)
                              if collected.correlations.hook_width is not None else None)
        a = column.examples.arrays
        self.order = np.lexsort((a["row"], np.where(a["kind"] == TOP, -a["value"].astype(np.float64), 0.0), a["kind"],
                                 a["latent"]))
        self.starts = np.searchsorted(a["latent"][self.order], np.arange(column.width + 1))

    def strings(self, ids: Sequence[int]) -> List[str]:
        return [self.vocab[i] if 0 <= i < len(self.vocab) else OUT_OF_RANGE_TOKEN for i in ids]

    def feature(self, latent: int) -> Dict[str, Any]:
        l = latent  # noqa: E741
        sections = self.effects.sections
        al_ids, al_values = sections["alignment"]
        shares = self.effects.alignment_l1
        top_ids, top_values = sections["logits_top"]
        bottom_ids, bottom_values = sections["logits_bottom"]
        f_ids, f_pearson, f_cosine = self.feature_tables
        if self.neuron_tables is not None:
            n_ids, n_pearson, n_cosine = (t[l] for t in self.neuron_tables)
            neurons = ([int(i) for i in n_ids], rounded(n_cosine), rounded(n_pearson))
        else:
            neurons = ([], [], [])
        firings = int(self.firings[l])
        return {
            "feature_index": l,
            "neuron_alignment_indices": [int(i) for i in al_ids[l]],
            "neuron_alignment_values": rounded(al_values[l]),
            "neuron_alignment_l1": rounded(shares[l]) if shares is not None else [],
            "correlated_neurons_indices": neurons[0],
            "correlated_neurons_l1": neurons[1],
            "correlated_neurons_pearson": neurons[2],
            "correlated_features_indices": [int(i) for i in f_ids[l]],
            "correlated_features_l1": rounded(f_cosine[l]),
            "correlated_features_pearson": rounded(f_pearson[l]),
            "neg_str": self.strings(bottom_ids[l].tolist()),
            "neg_values": rounded(bottom_values[l]),
            "pos_str": self.strings(top_ids[l].tolist()),
            "pos_values": rounded(top_values[l]),
            "frac_nonzero": percent(firings / self.n) if self.n else 0,
            "freq_hist_data_bar_values": rounded(self.acts_values[l]) if firings else [],
            "freq_hist_data_bar_heights": rounded(self.c.column.histogram[l]) if firings else [],
            "logits_hist_data_bar_heights": rounded(self.logits_heights[l]),
            "logits_hist_data_bar_values": rounded(self.logits_values[l]),
            "n_prompts_total": self.header.prompts,
            "n_tokens_in_prompt": self.header.prompt_tokens,
            "dataset": self.header.dataset,
            "decoder_weights_dist": [],
            "activations": self.activations(l),
            "vector": [],
        }

    def activations(self, latent: int) -> List[Dict[str, Any]]:
        """The top group, then each interval from the highest."""
        a = self.c.column.examples.arrays
        mine = self.order[self.starts[latent]:self.starts[latent + 1]]
        kinds = a["kind"][mine]
        top = float(f"{float(self.max[latent]):.3f}")
        out = [self.example(i, -1, top, -1) for i in mine[kinds == TOP].tolist()]
        edges = self.c.edges[latent]
        quantiles = self.c.intervals.shape[1]
        for q in range(quantiles - 1, -1, -1):
            lower, upper = float(edges[q]), float(edges[q + 1])
            share = float(np.float32(self.c.intervals[latent, q]) / np.float32(self.n)) if self.n else 0.0
            for i in mine[kinds == q].tolist():
                out.append(self.example(i, float(f"{lower:.3f}"), float(f"{upper:.3f}"), percent(share)))
        return out

    def example(self, i: int, bin_min: Any, bin_max: float, bin_contains: Any) -> Dict[str, Any]:
        s = self.sequences
        tokens = s.tokens[int(s.sequence[i])].tolist()
        values = [round(v, 4) for v in s.values(i).astype(np.float64).tolist()]
        return {
            "bin_min": bin_min,
            "bin_max": bin_max,
            "bin_contains": bin_contains,
            "tokens": self.strings(tokens),
            "values": rounded(values),
            "qualifying_token_index": int(s.at[i]),
        }


def _column(ds: Dataset, name: Optional[str]) -> str:
    if name is not None:
        return name
    if len(ds.latents) != 1:
        raise DatasetError(f"{ds.url} has {len(ds.latents)} latents columns: name one ({', '.join(ds.latents) or 'none'})")
    return next(iter(ds.latents))


def _header(ds: Dataset, hook: str, *, model_id: Optional[str], layer: Optional[int], sae_set: str,
            sae_id_suffix: Optional[str], dataset_name: Optional[str]) -> Header:
    if layer is None:
        match = re.search(r"blocks\.(\d+)\.", hook)
        if match is None:
            raise DatasetError(f"{hook}: no layer in the hook's name (blocks.N.…): give the layer")
        layer = int(match.group(1))
    model = ds.run.get("model", {})
    if model_id is None:
        path = str(model.get("path") or model.get("name") or "")
        model_id = Path(path.rstrip("/")).name or "model"
    if dataset_name is None:
        corpus = (ds.run.get("config", {}).get("corpus") or {}).get("corpus")
        dataset_name = str(corpus) if corpus else ""
    seq_len = ds.seq_len
    return Header(model_id, layer, sae_set, sae_id_suffix, dataset_name, 0, int(seq_len) if seq_len else 0)


def _vocab_size(ds: Dataset, pieces: Sequence[Optional[str]]) -> int:
    """The model's vocabulary (``d_vocab``): run.json's, else the tokenizer's."""
    size = (ds.run.get("model", {}).get("config") or {}).get("vocab_size")
    return max(int(size), len(pieces)) if size else len(pieces)
