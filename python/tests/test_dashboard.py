"""`siphon.dashboard` against hand-written runs (latent_runs.write_run) whose every value is
known: each latent's histogram, top examples and the latent's values over their windows, the
data files and tables the pages read, parts of a run merged, a run without dictionaries, and
token strings escaped. Where node is installed the pages' scripts run against a stub DOM."""

from __future__ import annotations

import html.parser
import io
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest
from safetensors.numpy import save_file

import siphon
from siphon.dashboard import build_dashboard, column_pass, columns_pass
from siphon.examples import TOP

from latent_runs import RESID, SAE, Truth, write_run

WIDTH = 12
NASTY = {10: '<script>alert("x")</script>', 11: "a&b", 12: "it's \"quoted\"", 13: "line\nbreak", 14: "\u0120space"}


def finish_stats(truth: Truth, hooks: Optional[Dict[str, Any]] = None) -> None:
    """Adds what write_run leaves out of stats.json: each latent's largest included value, and
    `hooks`' statistics."""
    path = truth.path / "stats.json"
    stats = json.loads(path.read_text())
    for name, dense in truth.dense.items():
        stats["latents"][name]["max"] = dense[truth.mask].max(axis=0, initial=0).astype(np.float64).tolist()
    stats["hooks"] = hooks or {}
    path.write_text(json.dumps(stats))


def crafted(root: Path, dtype: str = "f32", **kw: Any) -> Truth:
    """4 sequences of 8 tokens a host; latent 0 ties at 2.5 on many tokens, latent 1 fires
    most on the tokens of `NASTY` (in every sequence), the rest at random."""
    hosts, shards, seqs, seq_len = kw.pop("hosts", 2), 2, 2, 8
    n_seq = hosts * shards * seqs
    rng = np.random.default_rng(5)
    tokens = rng.integers(20, 250, size=(n_seq, seq_len))
    # Every sequence holds each of NASTY's tokens, at positions 1..5.
    tokens[:, 1:6] = np.stack([rng.permutation(list(NASTY)) for _ in range(n_seq)])
    dense = np.where(rng.random((n_seq * seq_len, WIDTH)) < 0.3, rng.uniform(0.05, 4.0, (n_seq * seq_len, WIDTH)), 0)
    dense[:, 0] = np.where(rng.random(n_seq * seq_len) < 0.5, 2.5, 0)
    dense[:, 1] = np.where(np.isin(tokens.reshape(-1), list(NASTY)), 6.0 + rng.random(n_seq * seq_len), 0.1)
    dense[:, WIDTH - 1] = 0  # never fires
    truth = write_run(root, dtype=dtype, hosts=hosts, shards_per_host=shards, seqs_per_shard=seqs, seq_len=seq_len,
                      widths=(WIDTH,), token_rows=tokens, latents={SAE: dense.astype(np.float32)}, **kw)
    finish_stats(truth)
    return truth


def groups(truth: Truth) -> np.ndarray:
    """Per row its (shard, sample): the rows of one sequence."""
    shard = np.repeat(np.arange(len(truth.shard_rows)), truth.shard_rows)
    return shard * 1_000_000 + truth.sample_index


def expected_window(truth: Truth, row: int, latent: int, window: int) -> Tuple[List[int], List[float]]:
    """The truth's token ids and values of `latent` around global `row` in its sequence."""
    group, rows = groups(truth), len(truth.token_ids)
    ids, values = [], []
    for k in range(-window, window + 1):
        j = row + k
        inside = 0 <= j < rows and group[j] == group[row]
        ids.append(int(truth.token_ids[j]) if inside else -1)
        values.append(float(truth.dense[SAE][j, latent]) if inside else 0.0)
    return ids, values


def truth_top(truth: Truth, latent: int, top: int) -> List[Tuple[float, int]]:
    """The latent's `top` largest included values with their rows, the earlier row first among equals."""
    v = truth.dense[SAE][:, latent]
    rows = np.flatnonzero(truth.mask & (v != 0))
    order = np.lexsort((rows, -v[rows]))[:top]
    return [(float(v[rows[k]]), int(rows[k])) for k in order]


def chunk(path: Path) -> Tuple[int, List[Dict[str, Any]]]:
    text = path.read_text()
    assert text.startswith("siphonChunk(") and text.endswith(");\n")
    start, latents = json.loads("[" + text[len("siphonChunk("):-3] + "]")
    return start, latents


def embedded(page: str, element_id: str) -> Any:
    m = re.search(rf'<script type="application/json" id="{element_id}">(.*?)</script>', page, re.S)
    assert m, element_id
    return json.loads(m.group(1))


def test_histograms_and_examples_are_the_truths(tmp_path: Path) -> None:
    truth = crafted(tmp_path / "run")
    ds = siphon.open_dataset(str(truth.path))
    top, window, bins = 4, 3, 7
    result = column_pass(ds, SAE, top=top, quantiles=3, per_quantile=2, window=window, bins=bins, progress=False)
    included = truth.dense[SAE][truth.mask]
    for latent in range(WIDTH):
        v = included[:, latent]
        v = v[v > 0]
        bound = float(v.max(initial=0))
        if bound > 0:
            counts, _ = np.histogram(v, bins=bins, range=(0, bound))
        else:
            counts = np.zeros(bins, np.int64)
        assert result.histogram[latent].tolist() == counts.tolist(), latent
        assert result.histogram[latent].sum() == (included[:, latent] != 0).sum()
        got = result.examples.latent(latent)
        assert [(e["value"], e["row"]) for e in got["top"]] == truth_top(truth, latent, top), latent
        for e in got["top"] + [e for g in got["quantiles"] for e in g["examples"]]:
            ids, values = expected_window(truth, e["row"], latent, window)
            assert e["tokens"] == ids and e["values"] == values, (latent, e["row"])
            assert e["values"][window] == e["value"]
    # Latent 0's ties: its top are the earliest rows at 2.5.
    assert [e["value"] for e in result.examples.latent(0)["top"]] == [2.5] * top
    assert result.examples.window_values.dtype == np.float32
    assert result.shards == len(truth.shard_rows) and result.tokens == len(truth.token_ids)


def test_parts_merge_into_the_whole(tmp_path: Path) -> None:
    truth = crafted(tmp_path / "run", dtype="bf16")
    ds = siphon.open_dataset(str(truth.path))
    shards = list(ds.latent_shards(SAE))
    kw: Dict[str, Any] = dict(top=3, quantiles=2, per_quantile=2, window=2, bins=5, progress=False)
    whole = column_pass(ds, SAE, shards=shards, **kw)
    first = column_pass(ds, SAE, shards=shards[1::2], **kw)
    merged = first.merge(column_pass(ds, SAE, shards=shards[0::2], **kw))
    assert np.array_equal(merged.histogram, whole.histogram)
    assert merged.shards == whole.shards and merged.tokens == whole.tokens
    for latent in range(WIDTH):
        assert merged.examples.latent(latent) == whole.examples.latent(latent), latent
    # Sizes are bounded before any shard is read (a latent's counts are width × bins int64).
    from siphon.errors import DatasetError

    for bins, message in ((0, r"bins \(--bins\) must be at least 1"), (10**9, r"bins \(--bins\) must be at most 10000")):
        with pytest.raises(DatasetError, match=message):
            column_pass(ds, SAE, shards=shards, **{**kw, "bins": bins})


def test_histograms_past_their_memory_are_refused_naming_bins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each latent holds its bins' counts: width × bins past the bound is refused before a
    shard is read, naming --bins and the column's width."""
    import siphon.dashboard._pass as pass_module
    from siphon.errors import DatasetError

    truth = crafted(tmp_path / "run", hosts=1)
    ds = siphon.open_dataset(str(truth.path))
    monkeypatch.setattr(pass_module, "MAX_HISTOGRAM_COUNTS", 10 * WIDTH)
    with pytest.raises(DatasetError, match=rf"bins \(--bins\) must be at most 10 \({10 * WIDTH} counts over the {WIDTH} "
                                           rf"latents of '{re.escape(SAE)}'\), got 11"):
        column_pass(ds, SAE, bins=11, progress=False)
    assert column_pass(ds, SAE, bins=10, progress=False).histogram.shape == (WIDTH, 10)


def test_the_site_goes_into_a_new_or_empty_folder(tmp_path: Path) -> None:
    """A folder holding anything (a user's own index.html) is refused before any work, naming
    it, and left as it was; a new one, an empty one, or one holding only the effects directory
    given (where `siphon dashboard` writes it) takes the site."""
    from siphon.__main__ import main
    from siphon.errors import DatasetError

    truth = crafted(tmp_path / "run", hosts=1)
    used = tmp_path / "used"
    used.mkdir()
    (used / "index.html").write_text("mine")
    with pytest.raises(DatasetError, match=rf"{re.escape(str(used))}: not empty \(the dashboard's pages go into a new "
                                           r"or empty folder\)"):
        build_dashboard(truth.path, used, progress=False)
    assert main(["dashboard", str(truth.path), "--out", str(used), "--no-progress"]) == 1
    assert [p.name for p in used.iterdir()] == ["index.html"] and (used / "index.html").read_text() == "mine"
    (tmp_path / "file").write_text("")
    with pytest.raises(DatasetError, match="not a folder"):
        build_dashboard(truth.path, tmp_path / "file", progress=False)
    # Its effects directory inside: taken; anything beside it: refused.
    site = tmp_path / "site"
    site.mkdir()
    write_effects(site / "effects", [f"t{i}" for i in range(256)])
    build_dashboard(truth.path, site, effects=site / "effects", progress=False)
    assert (site / "index.html").is_file()
    (site / "index.html").unlink()
    with pytest.raises(DatasetError, match="not empty"):
        build_dashboard(truth.path, site, effects=site / "effects", progress=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert build_dashboard(truth.path, empty, progress=False) == empty / "index.html"


def test_several_dictionaries_come_from_one_read_of_each_shard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(9)
    other = SAE + ".second"
    rows, widths = 2 * 2 * 2 * 8, (WIDTH, 7)
    dense = {name: np.where(rng.random((rows, w)) < 0.3, rng.uniform(0.05, 4.0, (rows, w)), 0).astype(np.float32)
             for name, w in zip((SAE, other), widths)}
    truth = write_run(tmp_path / "run", dtype="f32", hosts=2, shards_per_host=2, seqs_per_shard=2, seq_len=8,
                      widths=widths, names=(SAE, other), latents=dense)
    finish_stats(truth)
    ds = siphon.open_dataset(str(truth.path))
    kw: Dict[str, Any] = dict(top=3, quantiles=2, per_quantile=2, window=2, bins=5)
    alone = {name: column_pass(ds, name, progress=False, **kw) for name in (SAE, other)}
    from siphon.latents import ShardLoader

    reads: List[str] = []
    load = ShardLoader.load
    monkeypatch.setattr(ShardLoader, "load", lambda self, shard, names: reads.append(shard.rel) or load(self, shard, names))
    together = columns_pass(ds, [SAE, other], progress=False, **kw)
    assert sorted(reads) == sorted(s.rel for s in ds.shards), "each shard read once for both dictionaries"
    for name, width in zip((SAE, other), widths):
        assert np.array_equal(together[name].histogram, alone[name].histogram)
        for latent in range(width):
            assert together[name].examples.latent(latent) == alone[name].examples.latent(latent), (name, latent)


def test_a_shard_taken_in_parts_gives_the_same_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    truth = crafted(tmp_path / "run")
    ds = siphon.open_dataset(str(truth.path))
    kw: Dict[str, Any] = dict(top=3, quantiles=2, per_quantile=2, window=3, bins=5, progress=False)
    whole = column_pass(ds, SAE, **kw)
    shard = next(ds.latent_shards(SAE))
    parts = list(shard.parts(5))
    # Parts end where samples end (8 rows each here, longer than 5: one sample a part).
    assert [p.rows for p in parts] == [8] * (shard.rows // 8)
    assert all(len(set(p.sample_index.tolist())) == 1 for p in parts)
    assert np.array_equal(np.concatenate([p.indices for p in parts]), shard.indices)
    assert [p.row_start for p in parts] == [shard.row_start + 8 * i for i in range(len(parts))]
    assert list(shard.parts(shard.rows)) == [shard]
    import siphon.dashboard._pass as pass_module

    monkeypatch.setattr(pass_module, "PART_ROWS", 5)
    parted = column_pass(ds, SAE, **kw)
    assert np.array_equal(parted.histogram, whole.histogram)
    for latent in range(WIDTH):
        assert parted.examples.latent(latent) == whole.examples.latent(latent), latent


def test_the_site_holds_the_truths_numbers(tmp_path: Path) -> None:
    truth = crafted(tmp_path / "run")
    out = tmp_path / "site"
    index = build_dashboard(truth.path, out, top=3, quantiles=2, per_quantile=2, window=2, bins=6, progress=False)
    assert index == out / "index.html"
    folder = out / SAE
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == [f"{SAE}/data/chunk-0000.js", f"{SAE}/index.html", f"{SAE}/latent.html", "index.html"]
    start, latents = chunk(folder / "data/chunk-0000.js")
    assert start == 0 and [d["latent"] for d in latents] == list(range(WIDTH))
    included = truth.dense[SAE][truth.mask]
    count = int(truth.mask.sum())
    for d in latents:
        latent = d["latent"]
        firings = int((included[:, latent] != 0).sum())
        assert d["firings"] == firings and sum(d["hist"]) == firings
        assert d["frequency"] == pytest.approx(firings / count, rel=1e-4)
        assert d["max"] == pytest.approx(included[:, latent].max(initial=0), rel=1e-4)
        expected = truth_top(truth, latent, 3)
        assert [(e["value"], e["row"]) for e in d["top"]] == [(pytest.approx(v, rel=1e-4), r) for v, r in expected]
        for e in d["top"] + [e for r in d["ranges"] for e in r["examples"]]:
            ids, values = expected_window(truth, e["row"], latent, 2)
            assert e["tokens"] == ids
            assert e["values"] == pytest.approx(values, rel=1e-4)
        assert len(d["ranges"]) == 2 and d["ranges"][1]["hi"] == d["max"]
        assert "logits_top" not in d and "neighbours" not in d
    assert latents[WIDTH - 1]["top"] == [] and latents[WIDTH - 1]["hist"] == [0] * 6
    table = embedded((folder / "index.html").read_text(), "latents")
    assert table["latent"] == list(range(WIDTH)) and table["count"] == count
    for latent in range(WIDTH):
        firings = int((included[:, latent] != 0).sum())
        assert table["firings"][latent] == firings
        assert table["frequency"][latent] == pytest.approx(firings / count, rel=1e-4)
    # No vocabulary: top tokens by id; latent 1 fires most on the NASTY ids.
    assert table["top_tokens"][1][0][0] in {f"#{t}" for t in NASTY}
    assert "never fired" in (folder / "index.html").read_text()
    config = embedded((folder / "latent.html").read_text(), "column")
    assert config["chunk"] == 256 and config["width"] == WIDTH and config["vocab"] is False
    assert SAE in (out / "index.html").read_text()


def test_a_run_without_latents_gets_the_hook_statistics(tmp_path: Path) -> None:
    truth = write_run(tmp_path / "run", names=(), widths=())
    mean = [0.1, -0.2, 0.15, 5.0, 0.1, 0.12, -0.1, 0.3]
    low, high = [-1.0] * 8, [1.0] * 8
    high[6] = 400.0
    # stats.json writes a non-finite number as a string.
    hooks = {RESID: {"shape": [2, 4], "count": 96, "mean": mean, "variance": ["NaN"] + [1.5] * 7, "mean_norm": 2.0,
                     "min": low, "max": high, "m2": [144.0] * 8, "norm_sum": 192.0}}
    finish_stats(truth, hooks)
    out = tmp_path / "site"
    build_dashboard(truth.path, out, progress=False)
    assert [p.name for p in out.iterdir()] == ["index.html"]
    page = (out / "index.html").read_text()
    assert "no dictionary latents" in page and RESID in page
    scale = np.maximum(np.abs(low), np.abs(high))
    massive = sorted(set(np.flatnonzero(np.abs(mean) > 10 * np.median(np.abs(mean))))
                     | set(np.flatnonzero(scale > 10 * np.median(scale))))
    assert massive == [3, 6]
    table = re.search(r'<table class="massive">(.*?)</table>', page, re.S)
    assert table
    rows = re.findall(r'<tr data-dim="(\d+)">(.*?)</tr>', table.group(1))
    assert [int(d) for d, _ in rows] == massive
    assert "<td>5</td>" in rows[0][1] and "<td>400</td>" in rows[1][1] and "<td>[1, 2]</td>" in rows[1][1]
    assert '<tr data-dim="0"><td>0</td><td>[0, 0]</td><td>0.1</td><td>nan</td>' in page


def write_effects(root: Path, vocab: List[str]) -> Dict[str, np.ndarray]:
    root.mkdir()
    (root / "vocab.json").write_text(json.dumps(vocab))
    rng = np.random.default_rng(3)
    tensors = {
        "logits_top_ids": np.tile(np.array([10, 11, 12], np.int32), (WIDTH, 1)),
        "logits_top_values": np.sort(rng.uniform(0, 2, (WIDTH, 3)).astype(np.float32), axis=1)[:, ::-1].copy(),
        "logits_bottom_ids": np.tile(np.array([13, 14, 5], np.int32), (WIDTH, 1)),
        "logits_bottom_values": np.sort(rng.uniform(-2, 0, (WIDTH, 3)).astype(np.float32), axis=1),
        "neighbours_ids": np.stack([(np.arange(WIDTH) + k) % WIDTH for k in (1, 2)], axis=1).astype(np.int32),
        "neighbours_cosine": np.tile(np.array([0.75, 0.5], np.float32), (WIDTH, 1)),
    }
    save_file(tensors, str(root / f"{SAE}.safetensors"))
    return tensors


def test_effects_vocab_and_escaping(tmp_path: Path) -> None:
    truth = crafted(tmp_path / "run", hosts=1)
    vocab = [f"t{i}" for i in range(256)]
    for i, s in NASTY.items():
        vocab[i] = s
    tensors = write_effects(tmp_path / "effects", vocab)
    out = tmp_path / "site"
    from siphon.__main__ import main

    stdout = io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(stdout):
        assert main(["dashboard", str(truth.path), "--out", str(out), "--effects", str(tmp_path / "effects"),
                     "--latents", SAE, "--top", "3", "--quantiles", "2", "--window", "2", "--no-progress"]) == 0
    assert stdout.getvalue().strip() == str(out / "index.html")
    _, latents = chunk(out / SAE / "data/chunk-0000.js")
    for d in latents:
        i = d["latent"]
        for section in ("logits_top", "logits_bottom"):
            ids, values = tensors[section + "_ids"][i], tensors[section + "_values"][i]
            assert [p[0] for p in d[section]] == ids.tolist()
            assert [p[1] for p in d[section]] == pytest.approx(values.tolist(), rel=1e-4)
        assert d["neighbours"] == [[(i + 1) % WIDTH, 0.75], [(i + 2) % WIDTH, 0.5]]
    table = embedded((out / SAE / "index.html").read_text(), "latents")
    assert {s for s, _ in table["top_tokens"][1]} <= set(NASTY.values())
    for path in out.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert "<script>alert" not in text, path
            assert "a&b" not in text and "line\nbreak" not in text, path
    vocab_js = (out / "vocab.js").read_text()
    assert vocab_js.startswith("siphonVocab(") and json.loads(vocab_js[len("siphonVocab("):-3]) == vocab
    assert '<script src="../vocab.js">' not in (out / SAE / "latent.html").read_text()  # loaded by the script
    assert embedded((out / SAE / "latent.html").read_text(), "column")["vocab"] is True


def test_progress_lines(tmp_path: Path) -> None:
    truth = crafted(tmp_path / "run", hosts=1)
    ds = siphon.open_dataset(str(truth.path))
    stream = io.StringIO()
    column_pass(ds, SAE, window=1, progress=True, stream=stream)
    assert re.fullmatch(rf"{re.escape(SAE)}: 2/2 shards, {len(truth.token_ids)} tokens, .* elapsed, ETA .*\n",
                        stream.getvalue())
    quiet = io.StringIO()
    column_pass(ds, SAE, window=1, progress=False, stream=quiet)
    assert quiet.getvalue() == ""


# ----------------------------------------------------------------------------- the pages' scripts

HARNESS = r"""
const fs = require("fs"), path = require("path"), vm = require("vm");
const [file, hash] = process.argv.slice(2);
const text = fs.readFileSync(file, "utf8"), dir = path.dirname(file), json = {}, els = {}, loaded = [];
for (const m of text.matchAll(/<script type="application\/json" id="([^"]+)">([\s\S]*?)<\/script>/g)) json[m[1]] = m[2];
const code = [...text.matchAll(/<script>([\s\S]*?)<\/script>/g)].map(m => m[1]).join("\n");
function el(id) {
  return {id, textContent: json[id] || "", innerHTML: "", value: "", className: "",
          addEventListener() {}, getAttribute() { return null; }};
}
global.document = {
  title: "",
  getElementById(id) { return els[id] || (els[id] = el(id)); },
  querySelector(sel) { return els[sel] || (els[sel] = el(sel)); },
  querySelectorAll() { return []; },
  createElement() { return {}; },
  head: {appendChild(s) {
    loaded.push(s.src);
    const src = path.join(dir, s.src);
    if (!fs.existsSync(src)) { if (s.onerror) s.onerror(); return; }
    vm.runInThisContext(fs.readFileSync(src, "utf8"));
    if (s.onload) s.onload();
  }},
};
global.window = global; global.location = {hash: hash || ""};
global.addEventListener = () => {}; global.scrollTo = () => {};
vm.runInThisContext(code);
const out = {loaded, title: document.title};
for (const k in els) out[k] = {innerHTML: els[k].innerHTML, textContent: els[k].textContent};
process.stdout.write(JSON.stringify(out));
"""


class Elements(html.parser.HTMLParser):
    """Every element's tag, attributes and text (entities resolved)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.items: List[Dict[str, Any]] = []
        self.open: List[Dict[str, Any]] = []

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, Optional[str]]]) -> None:
        item = {"tag": tag, "attrs": dict(attrs), "text": ""}
        self.items.append(item)
        self.open.append(item)

    def handle_endtag(self, tag: str) -> None:
        while self.open and self.open.pop()["tag"] != tag:
            pass

    def handle_data(self, data: str) -> None:
        for item in self.open:
            item["text"] += data


def render(tmp_path: Path, page: Path, hash: str = "") -> Dict[str, Any]:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    harness = tmp_path / "harness.js"
    harness.write_text(HARNESS)
    done = subprocess.run([node, str(harness), str(page), hash], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    out: Dict[str, Any] = json.loads(done.stdout)
    return out


def elements(markup: str) -> List[Dict[str, Any]]:
    parser = Elements()
    parser.feed(markup)
    return parser.items


def test_the_pages_render_the_data(tmp_path: Path) -> None:
    truth = crafted(tmp_path / "run", hosts=1)
    vocab = [f"t{i}" for i in range(256)]
    for i, s in NASTY.items():
        vocab[i] = s
    write_effects(tmp_path / "effects", vocab)
    out = tmp_path / "site"
    build_dashboard(truth.path, out, effects=tmp_path / "effects", top=3, quantiles=2, per_quantile=2, window=4,
                    progress=False)
    _, latents = chunk(out / SAE / "data/chunk-0000.js")
    shown = render(tmp_path, out / SAE / "latent.html", "#1")
    assert shown["loaded"] == ["../vocab.js", "data/chunk-0000.js"] and shown["status"]["textContent"] == ""
    items = elements(shown["latent"]["innerHTML"])
    d = latents[1]
    examples = [i for i in items if i["attrs"].get("class") == "example"]
    assert len(examples) == len(d["top"]) + sum(len(r["examples"]) for r in d["ranges"])
    toks = [i for i in items if i["attrs"].get("class") in ("tok", "tok own")]
    own = [t for t in toks if t["attrs"]["class"] == "tok own"]
    assert len(own) == len(examples)
    # Escaped in the markup, shown as the strings (a newline as a return symbol, U+0120 as a space).
    display = {i: s.replace("\n", "\u23CE").replace("\u0120", " ") for i, s in enumerate(vocab)}
    every = [e for e in d["top"] + [e for r in d["ranges"] for e in r["examples"]]]
    assert [t["text"] for t in toks] == [display[i] for e in every for i in e["tokens"] if i >= 0]
    assert set(display[i] for i in NASTY) <= {t["text"] for t in toks}
    assert "<script>" not in shown["latent"]["innerHTML"] and "&lt;script&gt;" in shown["latent"]["innerHTML"]
    first = d["top"][0]
    first_toks = toks[: sum(1 for t in first["tokens"] if t >= 0)]
    values = [v for t, v in zip(first["tokens"], first["values"]) if t >= 0]
    assert [float(t["attrs"]["data-value"]) for t in first_toks] == pytest.approx(values, rel=1e-4)
    assert [t["attrs"]["title"] for t in first_toks] == [t["attrs"]["data-value"] for t in first_toks]
    ranges = [i for i in items if i["attrs"].get("class") == "range"]
    assert [r["attrs"]["data-range"] for r in ranges] == ["0", "1"]
    assert [i for i in items if i["tag"] == "h3" and i["text"].startswith("range 0: (0, ")]
    bars = [i for i in items if i["attrs"].get("class") == "bar"]
    assert [int(b["attrs"]["data-count"]) for b in bars] == d["hist"]
    logits = [i for i in items if i["tag"] == "tr" and "data-id" in i["attrs"]]
    assert [r["attrs"]["data-id"] for r in logits[:3]] == ["10", "11", "12"]
    links = [i["attrs"]["href"] for i in items if i["tag"] == "a"]
    assert "latent.html#0" in links and "latent.html#2" in links and "latent.html#3" in links
    table = render(tmp_path, out / SAE / "index.html")
    rows = [i for i in elements(table["#table tbody"]["innerHTML"]) if i["tag"] == "tr"]
    assert [int(r["attrs"]["data-latent"]) for r in rows] == list(range(WIDTH))
    assert table["shown"]["textContent"] == f"{WIDTH} of {WIDTH} latents"
    missing = render(tmp_path, out / SAE / "latent.html", f"#{WIDTH}")
    assert missing["status"]["textContent"] == f"no latent {WIDTH} (latents are 0..{WIDTH - 1})"
    # An address that is not a latent's number names no latent (not latent 0, nor its digits').
    for fragment in ("#abc", "#12abc", "#1e1", "#-1"):
        bad = render(tmp_path, out / SAE / "latent.html", fragment)
        assert bad["status"]["textContent"] == f"no latent {fragment[1:]} (latents are 0..{WIDTH - 1})"
        assert bad["latent"]["innerHTML"] == ""
    # A latent that never fired says so instead of empty data.
    never = render(tmp_path, out / SAE / "latent.html", f"#{WIDTH - 1}")["latent"]["innerHTML"]
    assert f"Latent {WIDTH - 1} never fired" in never
    assert 'id="histogram"' not in never and 'class="range"' not in never and 'data-key="mean"' not in never
    assert "<dt>mean over firings</dt>" in shown["latent"]["innerHTML"]
