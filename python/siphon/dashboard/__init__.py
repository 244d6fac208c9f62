"""Static feature dashboards of a run's dictionary latents, from one pass over each latents
column's shards (as SAEDashboard and Neuronpedia show a feature: its top activations, examples
from equal-width activation ranges, its activation histogram, logit effects and nearest
latents when an effects directory is given).

    from siphon.dashboard import build_dashboard
    build_dashboard("out/run", "out/dashboard")   # -> out/dashboard/index.html

or ``python -m siphon dashboard out/run --out out/dashboard``. The site opens from ``file://``
(no server, no network): ``index.html`` (the run's columns and its hooks' statistics), per
column ``{folder}/index.html`` (a sortable, filterable table of every latent) and
``{folder}/latent.html#N`` (latent N), whose data lie in ``{folder}/data/chunk-NNNN.js`` (see
`siphon.dashboard._data`). Every column comes from one read of the shards (`columns_pass`);
parts of a run (a host's shards each) give `ColumnPass`es that merge (`ColumnPass.merge`).

``siphon dashboard`` (``crates/cli/src/cmd/dashboard/``) first writes what only the model and
its tokenizer know into an effects directory (`siphon.dashboard._effects`), then runs ``python
-m siphon dashboard``; ``siphon export neuronpedia`` does the same for
`siphon.dashboard.neuronpedia`. ``python/tests/test_saedashboard.py`` compares the site's
feature data and the Neuronpedia batch files with SAEDashboard's own (its runner and its
converter).

Modules: `_pass` the one pass (each latent's examples as `siphon.examples` takes them, and its
histogram); `_data`, `_site`, `_assets` the pages; `_hooks` the hooks' statistics; `_effects`
what the binary writes beside; `neuronpedia` Neuronpedia's batch files, with `_correlations`
(the correlations' sparse sums) and `_sequences` (the examples' whole sequences).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional, Sequence, Union

from .._output import check_new_or_empty
from ..dataset import Dataset, open_dataset
from ..errors import DatasetError
from ..latents import checked_latents
from ._data import ColumnData
from ._effects import Effects, read_effects
from ._hooks import hook_summaries, read_stats
from ._pass import ColumnPass, column_pass, columns_pass
from ._site import ColumnSummary, folder_names, write_column, write_index, write_vocab

__all__ = ["build_dashboard", "column_pass", "columns_pass", "ColumnPass", "read_effects", "Effects"]


def build_dashboard(
    run: Union[str, "os.PathLike[str]", Dataset],
    out: Union[str, "os.PathLike[str]"],
    *,
    names: Optional[Sequence[str]] = None,
    effects: Union[None, str, "os.PathLike[str]"] = None,
    top: int = 20,
    quantiles: int = 10,
    per_quantile: int = 5,
    window: int = 16,
    bins: int = 50,
    seed: int = 0,
    progress: bool = True,
    check: bool = True,
) -> Path:
    """Writes the dashboard of `run` (a path or URL, or an opened `siphon.Dataset`) to the
    new or empty folder `out` and returns the path of its ``index.html``. `names`: the latents
    columns (default: every one; a run without any gets only the index). `effects`: an effects
    directory (`siphon.dashboard._effects`; its ``vocab.json`` gives token strings, else tokens
    show as ``#id``), which may lie in `out` already. `top`, `quantiles`, `per_quantile`,
    `window`, `seed`: the examples, as `siphon.examples.latent_examples` takes them; `bins`: of
    each latent's histogram. `progress`: a progress line on stderr. `check`: each shard's
    CRC32C."""
    root = Path(os.fspath(out))
    check_new_or_empty(root, "the dashboard's pages", besides=effects)
    dataset = run if isinstance(run, Dataset) else open_dataset(os.fspath(run))
    columns: List[str] = list(dataset.latents) if names is None else list(names)
    for name in columns:
        checked_latents(name, dataset.latents)
    if len(set(columns)) != len(columns):
        raise DatasetError(f"latents columns asked for twice: {', '.join(columns)}")
    widths = {n: dataset.latents[n].width for n in columns}
    found = read_effects(os.fspath(effects), widths) if effects is not None else None
    vocab = found.vocab if found is not None else None
    root.mkdir(parents=True, exist_ok=True)
    folders = folder_names(columns)
    written: List[ColumnSummary] = []
    passes = columns_pass(dataset, columns, top=top, quantiles=quantiles, per_quantile=per_quantile, window=window,
                          bins=bins, seed=seed, check=check, progress=progress)
    for name in columns:
        result = passes.pop(name)
        data = ColumnData(result, dataset.latent_stats(name), found.columns.get(name) if found is not None else None)
        written.append(write_column(root, folders[name], data, run_name=dataset.name, vocab=vocab, window=window))
    if vocab is not None:
        write_vocab(root, vocab)
    stats = read_stats(dataset)
    return write_index(root, run_name=dataset.name, url=dataset.url, tokens=dataset.tokens, columns=written,
                       hooks=hook_summaries(stats, dataset.hooks), hook_names=list(dataset.hooks),
                       has_stats=stats is not None)
