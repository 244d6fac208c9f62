"""siphon's dashboards against SAEDashboard's own (PyPI sae-dashboard 0.8.0 in its venv,
scripts/setup-python-saedashboard.sh; skipped where there is none and SIPHON_SAEDASHBOARD_PYTHON
is unset, required where it is set, as scripts/test.sh sets it).

siphon extracts a SAELens JumpReLU dictionary's latents on the fixture model; `siphon dashboard`
writes its site; SAEDashboard's runner (saedashboard_features.py) runs the model in
TransformerLens over the very token rows the run stored, with the tokens the run excludes
ignored, for a sample of latents. Their feature data must agree: each latent's top activations,
its density, the counts of its activation histogram (SAEDashboard's bins), its top and bottom
logit effects (ids and values) and the histogram of its logits over the vocabulary.

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
from pathlib import Path

import numpy as np
import pytest

import siphon
from siphon.delphi import rebuild_sequences

from conftest import REPO, extract, siphon_binary

HOOK = "blocks.1.hook_resid_post"
NAME = f"{HOOK}.hook_sae_acts_post"
#: Latents SAEDashboard computes (its runner re-reads every token for each batch of them).
SAMPLE = 24


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


def test_siphon_dashboards_equal_saedashboards_feature_data(runs: Path, unit_sae: Path, tmp_path: Path) -> None:
    python = saedashboard_python()
    run = extract(runs, "tiny-saedashboard", dtype="f32", hooks=[HOOK], docs=200,
                  extra=["--sae", str(unit_sae), "--latent-cap", "96", "--keep-excluded"])
    site = tmp_path / "site"
    done = subprocess.run([siphon_binary(), "dashboard", str(run), "--out", str(site), "--no-progress", "--top", "20",
                           "--neighbours", "0", "--logits", "10", "--bins", "50", "--python", sys.executable],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ours = latent_objects(site)

    ds = siphon.open_dataset(str(run))
    rows = rebuild_sequences(ds, "exact")
    # The tokens the run excludes (BOS, EOS, padding) are ids SAEDashboard ignores wherever they are.
    ignored = np.unique(rows.tokens[~rows.included])
    assert not np.isin(rows.tokens[rows.included], ignored).any(), "an excluded id is also included elsewhere"
    np.save(tmp_path / "tokens.npy", rows.tokens)
    stats = ds.latent_stats(NAME)
    fired = [int(n) for n in np.flatnonzero(stats["firings"] > 0)]
    assert len(fired) >= SAMPLE, "the dictionary fired on enough latents"
    sample = fired[:: max(1, len(fired) // SAMPLE)][:SAMPLE]
    model = json.loads((run / "run.json").read_text())["model"]["path"]
    out = tmp_path / "saedashboard.json"
    done = subprocess.run([python, str(Path(__file__).with_name("saedashboard_features.py")), model, str(unit_sae),
                           str(tmp_path / "tokens.npy"), ",".join(map(str, ignored.tolist())),
                           ",".join(map(str, sample)), str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    theirs = {int(k): v for k, v in json.loads(out.read_text()).items()}

    for n in sample:
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
        assert sum(mine["hist"]) == sum(ref["acts_hist"]) == mine["firings"], n
        moved = sum(abs(a - b) for a, b in zip(mine["hist"], ref["acts_hist"]))
        assert moved <= 2, (n, mine["hist"], ref["acts_hist"])
        centres = np.asarray(ref["acts_hist_values"])
        lo, hi = mine["hist_range"]
        np.testing.assert_allclose(np.round(lo + (np.arange(50) + 0.5) * (hi - lo) / 50, 5), centres, rtol=1e-4, atol=1e-5)
        # Logit effects.
        assert [i for i, _ in mine["logits_top"]] == ref["logits_top_ids"], n
        assert [v for _, v in mine["logits_top"]] == pytest.approx(ref["logits_top"], rel=1e-4, abs=1e-5), n
        assert [i for i, _ in mine["logits_bottom"]] == ref["logits_bottom_ids"], n
        assert [v for _, v in mine["logits_bottom"]] == pytest.approx(ref["logits_bottom"], rel=1e-4, abs=1e-5), n
        heights = mine["logits_hist"]["heights"]
        assert sum(heights) == sum(ref["logits_hist"]), n
        assert sum(abs(a - b) for a, b in zip(heights, ref["logits_hist"])) <= 2, (n, heights, ref["logits_hist"])
