"""siphon's dashboards and Neuronpedia export against SAEDashboard's own (PyPI sae-dashboard
0.8.0 in its venv, scripts/setup-python-saedashboard.sh; skipped where there is none and
SIPHON_SAEDASHBOARD_PYTHON is unset, required where it is set, as scripts/test.sh sets it).

siphon extracts a SAELens JumpReLU dictionary's latents and its hook on the fixture model;
`siphon dashboard` writes its site and `siphon export neuronpedia` its batch files;
SAEDashboard's runner (saedashboard_features.py) runs the model in TransformerLens over the very
token rows the run stored, with the tokens the run excludes ignored, for one batch of latents,
and converts them to a Neuronpedia batch with its own converter. Their feature data must agree:
each latent's top activations, its density, the counts of its activation histogram
(SAEDashboard's bins), its top and bottom logit effects (ids and values) and the histogram of
its logits over the vocabulary; and the Neuronpedia batch field for field (see
`test_neuronpedia_batches_equal_saedashboards`).

SAEDashboard folds the decoder norms into the encoder first (`fold_W_dec_norm`), which scales a
latent by its decoder row's norm; the dictionary here has unit rows (SAELens trains them so),
so that siphon's stored latents are the dictionary's own and SAEDashboard's alike.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import siphon
from siphon.delphi import rebuild_sequences

from conftest import REPO, extract, siphon_binary

HOOK = "blocks.1.hook_resid_post"
NAME = f"{HOOK}.hook_sae_acts_post"
#: The batch of latents SAEDashboard computes (its runner re-reads every token for each
#: batch): siphon's second batch file of 3 (96 latents, --batch-size 32).
BATCH, BATCH_SIZE = 1, 32
FEATURES = list(range(BATCH * BATCH_SIZE, (BATCH + 1) * BATCH_SIZE))


def saedashboard_python() -> str:
    given = os.environ.get("SIPHON_SAEDASHBOARD_PYTHON")
    default = Path.home() / ".cache/siphon/venvs/saedashboard/bin/python"
    if given:
        return given
    if default.exists():
        return str(default)
    pytest.skip("no Python with sae-dashboard (bash scripts/setup-python-saedashboard.sh)")


@pytest.fixture(scope="module")
def unit_sae(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture JumpReLU dictionary with each decoder row scaled to unit norm."""
    from safetensors.numpy import load_file, save_file

    src = REPO / "fixtures/dictionaries/saelens-jumprelu"
    dest = tmp_path_factory.mktemp("sae") / "saelens-jumprelu-unit"
    dest.mkdir()
    shutil.copy(src / "cfg.json", dest / "cfg.json")
    tensors = load_file(str(src / "sae_weights.safetensors"))
    w = tensors["W_dec"].astype(np.float64)
    tensors["W_dec"] = (w / np.linalg.norm(w, axis=1, keepdims=True)).astype(np.float32)
    save_file(tensors, str(dest / "sae_weights.safetensors"))
    return dest


def latent_objects(site: Path) -> dict:
    folder = next(p for p in site.iterdir() if (p / "latent.html").is_file())
    out = {}
    for path in sorted((folder / "data").glob("chunk-*.js")):
        text = path.read_text()
        _, rest = text[len("siphonChunk("):].split(",", 1)
        for latent in json.loads(rest.rstrip().rstrip(";").rstrip(")")):
            out[latent["latent"]] = latent
    return out


@dataclass
class Compared:
    """siphon's outputs and SAEDashboard's on the same run."""

    site: dict
    batch: dict
    reference: dict
    rows: Any
    ignored: np.ndarray
    #: Per latent, its stored values at each inner edge of its histogram ([`_edge_ties`]).
    ties: dict[int, np.ndarray]


@pytest.fixture(scope="module")
def compared(runs: Path, unit_sae: Path, tmp_path_factory: pytest.TempPathFactory) -> Compared:
    python = saedashboard_python()
    tmp = tmp_path_factory.mktemp("saedashboard")
    run = extract(runs, "tiny-saedashboard", dtype="f32", hooks=[HOOK], docs=200,
                  extra=["--sae", str(unit_sae), "--latent-cap", "96", "--keep-excluded"])
    site = tmp / "site"
    done = subprocess.run([siphon_binary(), "dashboard", str(run), "--out", str(site), "--no-progress", "--top", "20",
                           "--neighbours", "0", "--logits", "10", "--bins", "50", "--python", sys.executable],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    exported = tmp / "neuronpedia"
    done = subprocess.run([siphon_binary(), "export", "neuronpedia", str(run), str(exported), "--sae-set", "res-test",
                           "--model-id", "tiny-llama", "--dataset", "fixture-corpus", "--batch-size", str(BATCH_SIZE),
                           "--no-progress", "--python", sys.executable], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in exported.iterdir()) == ["batch-0.json", "batch-1.json", "batch-2.json"]

    ds = siphon.open_dataset(str(run))
    rows = rebuild_sequences(ds, "exact")
    # The tokens the run excludes (BOS, EOS, padding) are ids SAEDashboard ignores wherever they are.
    ignored = np.unique(rows.tokens[~rows.included])
    assert not np.isin(rows.tokens[rows.included], ignored).any(), "an excluded id is also included elsewhere"
    np.save(tmp / "tokens.npy", rows.tokens)
    stats = ds.latent_stats(NAME)
    assert (stats["firings"][FEATURES] > 0).sum() >= 24, "the dictionary fired on enough latents of the batch"
    model = json.loads((run / "run.json").read_text())["model"]["path"]
    out = tmp / "saedashboard.json"
    done = subprocess.run([python, str(Path(__file__).with_name("saedashboard_features.py")), model, str(unit_sae),
                           str(tmp / "tokens.npy"), ",".join(map(str, ignored.tolist())),
                           ",".join(map(str, FEATURES)), str(REPO / "fixtures/data/tokenizer.json"), str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    reference = json.loads(out.read_text())
    batch = json.loads((exported / f"batch-{BATCH}.json").read_text())
    site_data = latent_objects(site)
    return Compared(site_data, batch, reference, rows, ignored, _edge_ties(ds, site_data))


#: How close to a bin's edge (in bin widths) a value may fall on either side of it in another
#: computation of the same activation: the last bits of a sum differ between CPUs and libraries
#: (a value 1.5e-5 widths above an edge, stored four times, crossed it on an AVX-512 machine).
EDGE = 1e-3


def _edge_ties(ds: Any, site: dict) -> dict[int, np.ndarray]:
    """Per latent of FEATURES that fired, how many of its stored values (of the included tokens,
    those its histogram counts) lie within EDGE of each inner edge of its histogram (the site's
    range and bins)."""
    values: dict[int, list] = {n: [] for n in FEATURES}
    for part in ds.read_latents(NAME):
        dense = part["latents"].to_dense().numpy()
        if "mask" in part:
            dense = dense[np.asarray(part["mask"], dtype=bool)]
        for n in FEATURES:
            values[n].append(dense[:, n][dense[:, n] > 0])
    ties = {}
    for n in (n for n in FEATURES if site[n]["firings"]):
        lo, hi = site[n]["hist_range"]
        bins = len(site[n]["hist"])
        at = (np.concatenate(values[n]).astype(np.float64) - lo) * bins / (hi - lo)
        ties[n] = np.array([(np.abs(at - edge) <= EDGE).sum() for edge in range(1, bins)])
    return ties


def _same_bins(mine: list, ref: list, ties: np.ndarray, what: Any) -> None:
    """The same counts in the same bins, but for values at an edge (`ties`, per inner edge), which
    may count on either side of it: the running counts differ at no edge by more than the values
    on it. No count at all: nothing to place."""
    assert sum(mine) == sum(ref), what
    if not sum(mine):
        return
    apart = np.abs(np.cumsum(mine)[:-1] - np.cumsum(ref)[:-1])
    assert (apart <= ties).all(), (what, mine, ref, ties.tolist())


def test_siphon_dashboards_equal_saedashboards_feature_data(compared: Compared) -> None:
    ours, rows = compared.site, compared.rows
    theirs = {int(k): v for k, v in compared.reference["features"].items()}
    for n in FEATURES:
        mine, ref = ours[n], theirs[n]
        # Top activations: SAEDashboard pads its 20 with zeros where fewer tokens fired, and
        # rounds them to 4 decimals.
        ref_top = [v for v in ref["top"] if v > 0]
        assert [e["value"] for e in mine["top"]] == pytest.approx(ref_top, rel=1e-4, abs=6e-5), n
        # Density: the title reads "DENSITY = x.xxx%" of every token of the rows, the ignored
        # ones too (siphon's frequency is of the tokens the run includes): the same firings.
        density = float(ref["acts_title"].split("=")[1].strip().rstrip("%")) / 100
        assert abs(mine["firings"] - density * rows.tokens.size) <= 5e-6 * rows.tokens.size + 0.5, n
        # The activation histogram: the same counts in the same bins.
        assert sum(mine["hist"]) == mine["firings"], n
        _same_bins(mine["hist"], ref["acts_hist"], compared.ties.get(n, np.zeros(0)), n)
        if mine["firings"]:
            centres = np.asarray(ref["acts_hist_values"])
            lo, hi = mine["hist_range"]
            np.testing.assert_allclose(np.round(lo + (np.arange(50) + 0.5) * (hi - lo) / 50, 5), centres, rtol=1e-4,
                                       atol=1e-5)
        # Logit effects.
        assert [i for i, _ in mine["logits_top"]] == ref["logits_top_ids"], n
        assert [v for _, v in mine["logits_top"]] == pytest.approx(ref["logits_top"], rel=1e-4, abs=1e-5), n
        assert [i for i, _ in mine["logits_bottom"]] == ref["logits_bottom_ids"], n
        assert [v for _, v in mine["logits_bottom"]] == pytest.approx(ref["logits_bottom"], rel=1e-4, abs=1e-5), n
        heights = mine["logits_hist"]["heights"]
        assert sum(heights) == sum(ref["logits_hist"]), n
        assert sum(abs(a - b) for a, b in zip(heights, ref["logits_hist"])) <= 2, (n, heights, ref["logits_hist"])


#: Values the converter rounds to 3 decimals: siphon's may round the other way at a 5th digit.
ROUNDED = 1.5e-3


def test_neuronpedia_batches_equal_saedashboards(compared: Compared) -> None:
    """siphon's batch file against the batch SAEDashboard's converter makes of its runner's
    data for the same latents and tokens: the same fields in the same order with the same JSON
    types, and the same values — where siphon counts the tokens the run includes and
    SAEDashboard every token of its rows (the ignored ones as zeros), the counts behind each
    share agree once that is allowed for."""
    ours, theirs = compared.batch, compared.reference["neuronpedia"]
    assert list(ours) == list(theirs)
    assert {k: ours[k] for k in ("model_id", "layer", "sae_set", "sae_id_suffix")} == \
        {k: theirs[k] for k in ("model_id", "layer", "sae_set", "sae_id_suffix")}
    assert [f["feature_index"] for f in ours["features"]] == [f["feature_index"] for f in theirs["features"]] == FEATURES
    tokens = compared.rows.tokens
    everything, included = tokens.size, int(compared.rows.included.sum())
    ignored_count = everything - included
    included_tables = compared.reference["included"]
    checked = {"neurons": 0, "features": 0}
    intervals = 0
    for i, (mine, ref) in enumerate(zip(ours["features"], theirs["features"])):
        n = mine["feature_index"]
        assert list(mine) == list(ref), n
        for key in mine:
            if key != "activations":
                assert _json_types(mine[key]) == _json_types(ref[key]) or not mine[key] or not ref[key], (n, key)
        for key in ("n_prompts_total", "n_tokens_in_prompt", "dataset", "decoder_weights_dist", "vector",
                    "neuron_alignment_indices", "pos_str", "neg_str"):
            assert mine[key] == ref[key], (n, key, mine[key], ref[key])
        for key in ("neuron_alignment_values", "neuron_alignment_l1", "pos_values", "neg_values",
                    "logits_hist_data_bar_values", "freq_hist_data_bar_values"):
            assert mine[key] == pytest.approx(ref[key], abs=ROUNDED), (n, key)
        ties = compared.ties.get(n, np.zeros(0))
        _same_bins(mine["freq_hist_data_bar_heights"], ref["freq_hist_data_bar_heights"], ties, n)
        mine_hist, ref_hist = mine["logits_hist_data_bar_heights"], ref["logits_hist_data_bar_heights"]
        assert sum(mine_hist) == sum(ref_hist), n
        assert sum(abs(a - b) for a, b in zip(mine_hist, ref_hist)) <= 2, n
        # Density: of the included tokens here, of every token there.
        assert abs(mine["frac_nonzero"] * included - ref["frac_nonzero"] * everything) <= 1e-5 * everything + 0.5, n
        # Correlations over the included tokens, by SAEDashboard's RollingCorrCoef.
        for kind in ("neurons", "features"):
            table = included_tables[kind][i]
            pearson = mine[f"correlated_{kind}_pearson"]
            assert pearson == pytest.approx(table["pearson"], abs=ROUNDED), (n, kind)
            # The same indices where a value stands alone (equal ones may come in any order).
            for at, (p, index) in enumerate(zip(table["pearson"], table["indices"])):
                if p != 0 and sum(abs(p - q) <= ROUNDED for q in table["pearson"]) == 1:
                    assert mine[f"correlated_{kind}_indices"][at] == index, (n, kind, at)
                    assert mine[f"correlated_{kind}_l1"][at] == pytest.approx(table["l1"][at], abs=ROUNDED), (n, kind)
                    checked[kind] += 1
        intervals += _same_activations(n, mine["activations"], ref["activations"], included, everything,
                                       ignored_count)
    # Most rows of the tables had a value of their own to compare, and most latents intervals.
    assert min(checked.values()) >= len(FEATURES), checked
    assert intervals >= 2 * len(FEATURES), intervals


def _same_activations(n: int, mine: list, ref: list, included: int, everything: int, ignored: int) -> int:
    """The top group equal (SAEDashboard's less its zero padding) and each interval's bounds,
    share and examples consistent (SAEDashboard draws other examples); the intervals compared."""
    def key(a: dict) -> tuple:
        return a["qualifying_token_index"], tuple(a["tokens"])

    def value(a: dict) -> float:
        return float(a["values"][a["qualifying_token_index"]])

    top_mine = [a for a in mine if a["bin_min"] == -1]
    top_ref = [a for a in ref if a["bin_min"] == -1 and value(a) > 0]
    assert sorted(map(value, top_mine)) == pytest.approx(sorted(map(value, top_ref)), abs=ROUNDED), n
    # The same examples above the smallest value kept (equal values at the cut may be others).
    cut = min(map(value, top_ref), default=0.0) + ROUNDED
    assert sorted(key(a) for a in top_mine if value(a) > cut) == sorted(key(a) for a in top_ref if value(a) > cut), n
    by_key = {key(a): a for a in top_ref}
    for a in top_mine:
        b = by_key.get(key(a))
        if b is None:
            continue
        assert (a["bin_max"], a["bin_contains"]) == pytest.approx((b["bin_max"], b["bin_contains"]), abs=ROUNDED), n
        assert a["values"] == pytest.approx(b["values"], abs=ROUNDED), n
    intervals_ref = {(a["bin_min"], a["bin_max"]): a["bin_contains"] for a in ref if a["bin_min"] != -1}
    intervals_mine = {(a["bin_min"], a["bin_max"]): a["bin_contains"] for a in mine if a["bin_min"] != -1}
    for (lo, hi), share in intervals_mine.items():
        match = [k for k in intervals_ref if abs(k[0] - lo) <= ROUNDED and abs(k[1] - hi) <= ROUNDED]
        assert len(match) == 1, (n, lo, hi, list(intervals_ref))
        theirs = intervals_ref[match[0]] * everything - (ignored if lo == 0 else 0)
        assert abs(share * included - theirs) <= 1e-5 * everything + 0.5, (n, lo, hi)
    for a in mine:
        if a["bin_min"] != -1:
            value = a["values"][a["qualifying_token_index"]]
            assert a["bin_min"] - ROUNDED <= value <= a["bin_max"] + ROUNDED and value > 0, n
    order = [a["bin_min"] for a in mine]
    assert order == sorted(order, key=lambda v: (v != -1, -v)), "the top group, then the intervals from the highest"
    return len(intervals_mine)


def _json_types(value: Any) -> Any:
    if isinstance(value, list):
        return sorted({type(v).__name__ for v in value})
    return type(value).__name__
