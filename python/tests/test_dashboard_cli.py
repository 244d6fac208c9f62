"""`siphon dashboard` end to end: a run `siphon extract --sae` wrote on the fixture model, its
site written by the binary (the vocabulary from the run's own tokenizer, then the Python pass):
the pages exist, the tokens are the tokenizer's strings, and every latent's data are the run's
latents (its firings, its largest values at the top), its nearest latents those of the
dictionary's decoder rows by cosine (numpy's, from SAELens's file)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import siphon

from conftest import REPO, extract, siphon_binary

NAME = "blocks.1.hook_resid_post.hook_sae_acts_post"
SAE_DIR = REPO / "fixtures/dictionaries/saelens-topk"


@pytest.fixture(scope="module")
def run(runs: Path) -> Path:
    return extract(runs, "tiny-dashboard", dtype="f32", hooks=["blocks.1.hook_resid_post"],
                   extra=["--sae", str(SAE_DIR), "--keep-excluded"])


def chunks(folder: Path) -> dict:
    """Every latent of the chunk files, by number."""
    out = {}
    for path in sorted((folder / "data").glob("chunk-*.js")):
        text = path.read_text()
        assert text.startswith("siphonChunk(") and text.rstrip().endswith(");")
        start, rest = text[len("siphonChunk("):].split(",", 1)
        for latent in json.loads(rest.rstrip().rstrip(";").rstrip(")")):
            out[latent["latent"]] = latent
    return out


def test_the_binary_writes_the_site_of_a_latents_run(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "site"
    done = subprocess.run([siphon_binary(), "dashboard", str(run), "--out", str(out), "--no-progress",
                           "--top", "5", "--window", "3", "--python", sys.executable],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "index.html").is_file()
    vocab = json.loads((out / "effects" / "vocab.json").read_text())
    # The run's tokenizer (run.json names it): each id decoded alone.
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(REPO / "fixtures/data/tokenizer.json"))
    assert len(vocab) == reference.get_vocab_size(with_added_tokens=True)
    assert vocab == [reference.decode([i], skip_special_tokens=False) for i in range(len(vocab))]
    assert (out / "vocab.js").read_text().startswith("siphonVocab(")
    folders = [p for p in out.iterdir() if (p / "latent.html").is_file()]
    assert len(folders) == 1
    latents = chunks(folders[0])
    ds = siphon.open_dataset(str(run))
    stats = ds.latent_stats(NAME)
    assert sorted(latents) == list(range(len(stats["firings"])))
    values: dict = {}
    for shard in ds.latent_shards(NAME):
        rows, idx, vals = shard.local_rows(), shard.indices, shard.values.astype(np.float32)
        keep = shard.mask[rows] if shard.mask is not None else np.ones(len(rows), bool)
        for latent, value in zip(idx[keep], vals[keep]):
            values.setdefault(int(latent), []).append(float(value))
    fired = [n for n, f in enumerate(stats["firings"]) if f > 0]
    assert fired, "the dictionary fired on the run"
    for n in fired:
        got = [e["value"] for e in latents[n]["top"]]
        want = sorted(values[n], reverse=True)[:5]
        np.testing.assert_allclose(got, want, rtol=1e-4)
        assert latents[n]["firings"] == stats["firings"][n] == len(values[n])
        assert sum(latents[n]["hist"]) == len([v for v in values[n] if v > 0])
        for example in latents[n]["top"]:
            assert len(example["tokens"]) == 7 and example["values"][3] == pytest.approx(example["value"], rel=1e-4)


def test_the_nearest_latents_are_the_decoders(run: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    out = tmp_path / "site"
    done = subprocess.run([siphon_binary(), "dashboard", str(run), "--out", str(out), "--no-progress",
                           "--neighbours", "4", "--python", sys.executable], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    w = load_file(str(SAE_DIR / "sae_weights.safetensors"))["W_dec"].astype(np.float64)
    unit = w / np.linalg.norm(w, axis=1, keepdims=True)
    cosine = unit @ unit.T
    np.fill_diagonal(cosine, -np.inf)
    folder = next(p for p in out.iterdir() if (p / "latent.html").is_file())
    latents = chunks(folder)
    assert sorted(latents) == list(range(len(w)))
    for n, latent in latents.items():
        got = latent["neighbours"]
        want = np.sort(cosine[n])[::-1][:4]
        assert [c for _, c in got] == pytest.approx(want.tolist(), abs=1e-4), n
        assert all(abs(cosine[n][j] - c) <= 1e-4 and j != n for j, c in got), n


def test_the_logit_effects_are_the_folded_unembeddings(run: Path, tmp_path: Path) -> None:
    """SAEDashboard's convention, computed here with torch from the model's own files: each
    unit decoder row times TransformerLens's W_U (the final norm's gain folded in, centred over
    the vocabulary); the top and bottom tokens and the histogram of all of them (torch.histc)."""
    import torch
    from safetensors.numpy import load_file

    out = tmp_path / "site"
    done = subprocess.run([siphon_binary(), "dashboard", str(run), "--out", str(out), "--no-progress", "--neighbours", "0",
                           "--logits", "5", "--bins", "20", "--python", sys.executable],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    model = Path(json.loads((run / "run.json").read_text())["model"]["path"])
    weights = load_file(str(model / "model.safetensors"))
    w_u = torch.from_numpy(weights["model.embed_tokens.weight"] * weights["model.norm.weight"]).double()  # tied
    w_u = w_u - w_u.mean(0, keepdim=True)
    w_dec = torch.from_numpy(load_file(str(SAE_DIR / "sae_weights.safetensors"))["W_dec"]).double()
    logits = (w_dec / w_dec.norm(dim=1, keepdim=True)) @ w_u.T
    folder = next(p for p in out.iterdir() if (p / "latent.html").is_file())
    latents = chunks(folder)
    assert sorted(latents) == list(range(len(w_dec)))
    for n, latent in latents.items():
        top, bottom = logits[n].topk(5), logits[n].topk(5, largest=False)
        assert [i for i, _ in latent["logits_top"]] == top.indices.tolist(), n
        assert [v for _, v in latent["logits_top"]] == pytest.approx(top.values.tolist(), rel=1e-4, abs=1e-6)
        assert [i for i, _ in latent["logits_bottom"]] == bottom.indices.tolist(), n
        assert [v for _, v in latent["logits_bottom"]] == pytest.approx(bottom.values.tolist(), rel=1e-4, abs=1e-6)
        row = logits[n].float()
        heights = torch.histc(row, bins=20).int().tolist()
        got = latent["logits_hist"]
        # Float rounding may move a value lying on a bin edge into its neighbour.
        assert sum(got["heights"]) == len(row) and sum(abs(a - b) for a, b in zip(got["heights"], heights)) <= 2, n
        assert got["range"] == pytest.approx([row.min().item(), row.max().item()], rel=1e-4)


def test_the_neuronpedia_batches_show_the_runs_sequences_and_latents(run: Path, tmp_path: Path) -> None:
    """`siphon export neuronpedia` on the run: every latent in a batch file, each example a
    whole row of the run (less its first token) in the runner's vocabulary (the tokenizer's
    pieces, its HTML anomalies replaced), with the run's stored values of that latent on it."""
    from tokenizers import Tokenizer

    from siphon.dashboard.neuronpedia import HTML_ANOMALIES
    from siphon.delphi import rebuild_sequences

    out = tmp_path / "np"
    done = subprocess.run([siphon_binary(), "export", "neuronpedia", str(run), str(out), "--sae-set", "res-test",
                           "--batch-size", "50", "--no-progress", "--python", sys.executable],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ds = siphon.open_dataset(str(run))
    width = ds.latents[NAME].width
    files = sorted(out.glob("batch-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    assert len(files) == -(-width // 50)
    batches = [json.loads(p.read_text()) for p in files]
    assert [f["feature_index"] for b in batches for f in b["features"]] == list(range(width))
    assert {(b["model_id"], b["layer"], b["sae_set"]) for b in batches} == {(ds.run["model"]["path"].rstrip("/").split("/")[-1], 1, "res-test")}

    tokenizer = Tokenizer.from_file(str(REPO / "fixtures/data/tokenizer.json"))

    def piece(i: int) -> str:
        text = tokenizer.id_to_token(i)
        for anomaly, replacement in HTML_ANOMALIES.items():
            text = text.replace(anomaly, replacement)
        return text

    rows = rebuild_sequences(ds, "exact")
    dense = np.concatenate([s.dense() * (s.mask[:, None] if s.mask is not None else 1) for s in ds.latent_shards(NAME)])
    by_row = np.zeros(rows.tokens.shape + (width,), np.float32)
    by_row[rows.row_seq, rows.row_pos] = dense
    shown = {}
    for s, ids in enumerate(rows.tokens):
        shown.setdefault(tuple(piece(int(i)) for i in ids[1:]), []).append(s)
    stats = ds.latent_stats(NAME)
    examples = 0
    for feature in (f for b in batches for f in b["features"]):
        n = feature["feature_index"]
        assert feature["n_prompts_total"] == rows.tokens.shape[0] and feature["n_tokens_in_prompt"] == rows.tokens.shape[1]
        assert feature["frac_nonzero"] == pytest.approx(stats["firings"][n] / ds.tokens, abs=1e-5)
        top = [a for a in feature["activations"] if a["bin_min"] == -1]
        assert len(top) == min(20, int(stats["firings"][n]))
        for a in feature["activations"]:
            candidates = shown[tuple(a["tokens"])]
            values = [np.round([round(float(v), 4) for v in by_row[s, 1:, n]], 3).tolist() for s in candidates]
            assert a["values"] in values, n
            assert a["values"][a["qualifying_token_index"]] > 0
            examples += 1
        tops = [a["values"][a["qualifying_token_index"]] for a in top]
        assert tops == sorted(tops, reverse=True)
        if top:
            assert top[0]["bin_max"] == pytest.approx(float(np.max(by_row[..., n])), abs=1e-3)
    assert examples > width


def test_the_neuronpedia_export_refuses_a_folder_in_use_and_an_unknown_column(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "np"
    out.mkdir()
    (out / "other.txt").write_text("mine")
    done = subprocess.run([siphon_binary(), "export", "neuronpedia", str(run), str(out), "--sae-set", "s",
                           "--no-progress", "--python", sys.executable], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "not empty" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["other.txt"]
    done = subprocess.run([siphon_binary(), "export", "neuronpedia", str(run), str(tmp_path / "np2"), "--sae-set", "s",
                           "--latents", "nope", "--no-progress", "--python", sys.executable],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "nope" in done.stderr


@pytest.mark.parametrize("command", ["dashboard", "neuronpedia"])
def test_the_binary_bounds_the_flags_as_the_package_does(tmp_path: Path, command: str) -> None:
    """The binary computes the decoder's effects before the Python pass, so it checks the
    pass's count flags itself where clap reads them: with the package's bounds, one past each
    refused at once naming the flag and the package's range."""
    import time

    from siphon.dashboard._pass import MAX_BINS
    from siphon.examples import MAX_EXAMPLES, MAX_QUANTILES, MAX_WINDOW

    out = str(tmp_path / "out")
    args = {"dashboard": ["dashboard", "no-run", "--out", out],
            "neuronpedia": ["export", "neuronpedia", "no-run", out, "--sae-set", "s"]}[command]
    bounds = [("--top", 0, MAX_EXAMPLES), ("--per-quantile", 0, MAX_EXAMPLES), ("--quantiles", 1, MAX_QUANTILES)]
    if command == "dashboard":
        bounds += [("--window", 0, MAX_WINDOW), ("--bins", 1, MAX_BINS)]
    for flag, least, most in bounds:
        start = time.monotonic()
        done = subprocess.run([siphon_binary(), *args, flag, str(most + 1), "--python", sys.executable],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and f"'{flag} <" in done.stderr and f"{least}..={most}" in done.stderr, done.stderr
        assert time.monotonic() - start < 5
    assert not (tmp_path / "out").exists()
