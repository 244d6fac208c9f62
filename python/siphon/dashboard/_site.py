"""The static site: ``OUT/index.html`` (the run, its latents columns, its hooks' statistics),
per column ``OUT/{folder}/index.html`` (every latent in a table) and ``OUT/{folder}/latent.html``
(one page for every latent, the latent in ``location.hash``) with its data files
``OUT/{folder}/data/chunk-NNNN.js``, and ``OUT/vocab.js`` when there is a vocabulary. Every page
opens from ``file://``: no network, no server (data in ``<script>`` elements; fetch() of local
files is blocked there)."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ._assets import COLUMN_JS, CSS, LATENT_JS
from ._data import CHUNK, ColumnData, chunk_name, chunk_text, dumps
from ._hooks import HookSummary

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
#: Bins of the column index's histogram of log10 firing frequency.
FREQUENCY_BINS = 40


def e(text: Any) -> str:
    """`text` escaped for HTML text and attribute values."""
    return html.escape(str(text), quote=True)


def g(value: Any) -> str:
    """A number with 5 significant digits (``–`` for none)."""
    if value is None:
        return "\u2013"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return f"{float(value):.5g}"


def folder_names(names: Sequence[str]) -> Dict[str, str]:
    """A distinct, file-name-safe folder per latents column."""
    out: Dict[str, str] = {}
    for name in names:
        base = _UNSAFE.sub("_", name).strip(".") or "latents"
        folder, n = base, 1
        while folder in out.values() or folder in ("data", "effects", "vocab.js", "index.html"):
            n += 1
            folder = f"{base}-{n}"
        out[name] = folder
    return out


def page(title: str, body: str, *, script: str = "", head: str = "") -> str:
    """One HTML page with the inline CSS and `script`."""
    js = f"<script>{script}</script>\n" if script else ""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>{e(title)}</title>\n'
            f"<style>{CSS}</style>\n{head}</head>\n<body>\n{body}\n{js}</body></html>\n")


def json_script(element_id: str, obj: Any) -> str:
    """`obj` as JSON in a ``<script type="application/json">`` element (``<``, ``>``, ``&``
    escaped, so no string can close it)."""
    return f'<script type="application/json" id="{e(element_id)}">{dumps(obj)}</script>'


@dataclass
class ColumnSummary:
    """What the run's index says of a written column."""

    name: str
    folder: str
    width: int
    fired: int
    count: int


def frequency_svg(frequency: np.ndarray, firings: np.ndarray) -> str:
    """The histogram of log10 firing frequency over the latents that fired, as inline SVG, and
    its caption (the latents that never fired counted there)."""
    fired = (firings > 0) & (frequency > 0)
    never = int((~fired).sum())
    caption = (f'<p class="caption" id="frequency-caption" data-fired="{int(fired.sum())}" data-never="{never}">'
               f"log<sub>10</sub> firing frequency of the {int(fired.sum())} latents that fired; "
               f"{never} latents never fired (not shown)</p>")
    if not fired.any():
        return '<svg id="frequency-histogram" width="0" height="0"></svg>' + caption
    logs = np.log10(frequency[fired])
    lo = float(np.floor(logs.min()))
    hi = max(float(np.ceil(logs.max())), lo + 1)
    counts, edges = np.histogram(logs, bins=FREQUENCY_BINS, range=(lo, hi))
    width, height, left, bottom = 640, 160, 40, 26
    bw = (width - left - 10) / FREQUENCY_BINS
    top = max(int(counts.max()), 1)
    parts = [f'<svg id="frequency-histogram" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             f'role="img"><title>log10 firing frequency</title>']
    for i, c in enumerate(counts.tolist()):
        h = (height - bottom - 8) * c / top
        parts.append(f'<rect class="bar" data-count="{c}" data-lo="{edges[i]:.5g}" data-hi="{edges[i + 1]:.5g}" '
                     f'x="{left + i * bw:.1f}" y="{height - bottom - h:.1f}" width="{max(bw - 1, 1):.1f}" '
                     f'height="{h:.1f}"><title>10^[{edges[i]:.3g}, {edges[i + 1]:.3g}): {c}</title></rect>')
    for power in range(int(lo), int(hi) + 1):
        x = left + (power - lo) / (hi - lo) * (width - left - 10)
        parts.append(f'<text class="axis" x="{x:.1f}" y="{height - bottom + 14}" text-anchor="middle">1e{power}</text>')
    parts.append(f'<text class="axis" x="{left - 4}" y="12" text-anchor="end">{top}</text>'
                 f'<text class="axis" x="{left - 4}" y="{height - bottom}" text-anchor="end">0</text></svg>')
    return "".join(parts) + caption


def write_column(out: Path, folder: str, data: ColumnData, *, run_name: str, vocab: Optional[Sequence[str]],
                 window: int) -> ColumnSummary:
    """Writes column `data`'s index, latent page and data files to ``out/folder``."""
    result = data.result
    root = out / folder
    (root / "data").mkdir(parents=True, exist_ok=True)
    for start, latents in data.chunks():
        (root / chunk_name(start)).write_text(chunk_text(start, latents), encoding="utf-8")
    table = data.table(vocab)
    frequency = np.asarray(data.stats["frequency"], dtype=np.float64)
    firings = np.asarray(data.stats["firings"], dtype=np.int64)
    title = f"{result.name} \u2014 {run_name}"
    body = (f'<nav><a href="../index.html">run {e(run_name)}</a></nav>\n<h1 id="column">{e(result.name)}</h1>\n'
            f'<p class="muted">{result.width} latents over {int(data.stats["count"])} tokens; click a header to '
            f"sort, type a latent number or token to filter.</p>\n"
            f"{frequency_svg(frequency, firings)}\n"
            f'<p><input id="filter" type="search" placeholder="filter: latent number or token" autocomplete="off"> '
            f'<span class="muted" id="shown"></span></p>\n'
            '<table id="table"><thead><tr><th data-key="latent">latent</th><th data-key="frequency">frequency</th>'
            '<th data-key="max">max</th><th data-key="mean" title="the mean of its activations where it fired">mean over firings</th><th data-key="firings">firings</th>'
            '<th class="tokens" data-key="top_tokens">top tokens</th></tr></thead><tbody></tbody></table>\n'
            + json_script("latents", table))
    (root / "index.html").write_text(page(title, body, script=COLUMN_JS), encoding="utf-8")
    config = {
        "name": result.name, "width": result.width, "chunk": CHUNK, "window": window,
        "quantiles": result.examples.quantiles, "bins": result.bins, "count": int(data.stats["count"]),
        "vocab": vocab is not None, "effects": sorted(data.effects.sections) if data.effects is not None else [],
    }
    body = (f'<p class="muted"><a href="../index.html">run {e(run_name)}</a> \u00B7 '
            f'<a href="index.html">{e(result.name)}</a></p>\n<p id="status"></p>\n<main id="latent"></main>\n'
            + json_script("column", config))
    (root / "latent.html").write_text(page(title, body, script=LATENT_JS), encoding="utf-8")
    return ColumnSummary(result.name, folder, result.width, int((firings > 0).sum()), int(data.stats["count"]))


def write_vocab(out: Path, vocab: Sequence[str]) -> None:
    """``out/vocab.js``: ``siphonVocab([...strings]);``."""
    (out / "vocab.js").write_text(f"siphonVocab({dumps(list(vocab))});\n", encoding="utf-8")


def _hook_section(hook: HookSummary) -> str:
    dims = len(hook.mean)
    known = hook.min is not None and hook.max is not None
    head = ("<tr><th>dim</th><th>index</th><th>mean</th><th>variance</th>"
            + ("<th>min</th><th>max</th>" if known else "") + "</tr>")

    def rows(indices: Sequence[int]) -> str:
        out = []
        for d in indices:
            x = hook.dimension(int(d))
            cells = f"<td>{d}</td><td>{e(x['index'])}</td><td>{g(x['mean'])}</td><td>{g(x['variance'])}</td>"
            if known:
                cells += f"<td>{g(x['min'])}</td><td>{g(x['max'])}</td>"
            out.append(f'<tr data-dim="{d}">{cells}</tr>')
        return "".join(out)

    median_mean = float(np.median(np.abs(hook.mean))) if dims else float("nan")
    summary = (f'<p>shape {e(hook.shape)}, {hook.count} tokens, mean norm {g(hook.mean_norm)}, '
               f"median |mean| {g(median_mean)}, median variance {g(np.median(hook.variance) if dims else None)}"
               + (f", min {g(np.nanmin(hook.min))}, max {g(np.nanmax(hook.max))}"
                  if known and dims and hook.min is not None and hook.max is not None else "") + "</p>")
    if len(hook.massive):
        massive = (f'<p>{len(hook.massive)} dimensions stand out (|mean| or max(|min|, |max|) above 10\u00D7 '
                   f'the median over dimensions, or not finite):</p><table class="massive">{head}{rows(hook.massive.tolist())}</table>')
    else:
        massive = '<p class="muted massive-none">no dimension stands out (10\u00D7 the median)</p>'
    every = (f'<details><summary>every dimension ({dims})</summary><table class="dimensions">{head}'
             f"{rows(range(dims))}</table></details>")
    return f'<section class="hook" data-hook="{e(hook.name)}"><h3>{e(hook.name)}</h3>{summary}{massive}{every}</section>'


def write_index(out: Path, *, run_name: str, url: str, tokens: int, columns: List[ColumnSummary],
                hooks: List[HookSummary], hook_names: Sequence[str], has_stats: bool) -> Path:
    """``out/index.html``: the run, links to its columns, its hooks' statistics."""
    items = "".join(
        f'<li data-column="{e(c.name)}"><a href="{e(c.folder)}/index.html">{e(c.name)}</a> '
        f'<span class="muted">{c.width} latents over {c.count} tokens: {c.fired} fired, '
        f"{c.width - c.fired} never</span></li>"
        for c in columns
    )
    latents = (f'<h2>Latents</h2><ul id="columns">{items}</ul>' if columns
               else '<h2>Latents</h2><p class="muted" id="columns">no dictionary latents in this run</p>')
    if not has_stats:
        hook_html = '<p class="muted">no stats.json (written when the run completes)</p>'
    elif not hooks:
        hook_html = '<p class="muted">no hook statistics</p>'
    else:
        hook_html = "".join(_hook_section(h) for h in hooks)
    missing = [h for h in hook_names if h not in {x.name for x in hooks}]
    if has_stats and missing:
        hook_html += f'<p class="muted">no statistics of {e(", ".join(missing))}</p>'
    body = (f'<h1 id="run">{e(run_name)}</h1>\n<p class="muted">{e(url)} \u00B7 {tokens} tokens</p>\n{latents}\n'
            f'<h2>Hooks</h2><div id="hooks">{hook_html}</div>')
    path = out / "index.html"
    path.write_text(page(f"siphon run {run_name}", body), encoding="utf-8")
    return path
