"""The Neuronpedia export's numerics (siphon.dashboard.neuronpedia, _correlations) against
torch's and a dense computation: torch.linspace's float32 edges, np.array_split's batches, and
the correlations' sparse sums against the same coefficients over dense activations."""

from __future__ import annotations

import numpy as np
import pytest

from siphon.dashboard._correlations import Correlations, batch_bounds
from siphon.dashboard.neuronpedia import linspace_f32, percent, vocab_strings

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("steps", [2, 6, 11, 17, 51])
def test_linspace_is_torchs_to_the_bit(steps: int) -> None:
    rng = np.random.default_rng(steps)
    starts = np.r_[0.0, rng.uniform(-3, 3, 200)].astype(np.float32)
    ends = np.r_[0.0, rng.uniform(0, 90, 200)].astype(np.float32)
    ours = linspace_f32(starts, ends, steps)
    for s, e, row in zip(starts, ends, ours):
        theirs = torch.linspace(float(s), float(e), steps, dtype=torch.float32).numpy()
        assert row.tobytes() == theirs.tobytes(), (s, e)


@pytest.mark.parametrize("width,size", [(96, 32), (300, 128), (5, 128), (16384, 128), (129, 128)])
def test_batches_are_array_splits(width: int, size: int) -> None:
    parts = np.array_split(np.arange(width), -(-width // size))
    assert batch_bounds(width, size) == [(int(p[0]), int(p[-1]) + 1) for p in parts]


def test_percent_parses_back_the_title() -> None:
    # "DENSITY = 1.235%" -> 0.01235
    assert percent(0.0123456) == pytest.approx(0.01235, abs=1e-12)
    assert percent(0.0) == 0.0


def test_vocab_replaces_the_runners_anomalies_and_pads() -> None:
    assert vocab_strings(["Ġthe", "ĊâĢĶ", None], 5) == [" the", "\n—", "", "<|outofrange|>", "<|outofrange|>"]


def dense_coefficients(x: np.ndarray, y: np.ndarray) -> "tuple[np.ndarray, np.ndarray]":
    """RollingCorrCoef's coefficients of the columns of x [N, X] against those of y [N, Y]."""
    n = x.shape[0]
    xy = x.T @ y
    xs, ys, x2, y2 = x.sum(0), y.sum(0), (x * x).sum(0), (y * y).sum(0)
    cos = xy / (np.sqrt(np.outer(x2, y2)) + 1e-6)
    pearson = (n * xy - np.outer(xs, ys)) / (np.sqrt(np.outer(n * x2 - xs ** 2, n * y2 - ys ** 2)) + 1e-6)
    return pearson, cos


def test_sparse_sums_give_the_dense_coefficients() -> None:
    rng = np.random.default_rng(0)
    tokens, width, d = 400, 20, 6
    dense = np.where(rng.random((tokens, width)) < 0.2, rng.uniform(0.1, 3, (tokens, width)), 0.0).astype(np.float32)
    hook = rng.normal(size=(tokens, d)).astype(np.float32)
    batches = batch_bounds(width, 8)  # 7, 7, 6
    corr = Correlations(width, batches, d)
    for start in range(0, tokens, 150):  # shards of rows
        part = dense[start:start + 150]
        rows, latents = np.nonzero(part)
        corr.add(rows, latents, part[rows, latents], len(part), hook[start:start + 150])
    ids, pearson, cosine = corr.neurons(3)
    p_ref, c_ref = dense_coefficients(dense.astype(np.float64), hook.astype(np.float64))
    np.testing.assert_array_equal(ids, np.argsort(-p_ref, axis=1, kind="stable")[:, :3])
    np.testing.assert_allclose(pearson, np.take_along_axis(p_ref, ids, 1), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(cosine, np.take_along_axis(c_ref, ids, 1), rtol=1e-9, atol=1e-12)
    ids, pearson, cosine = corr.features(3)
    for start, end in batches:
        p_ref, c_ref = dense_coefficients(dense[:, start:end].astype(np.float64), dense[:, start:end].astype(np.float64))
        np.fill_diagonal(p_ref, 0.0)
        np.fill_diagonal(c_ref, 0.0)
        top = np.argsort(-p_ref, axis=1, kind="stable")[:, :3]
        np.testing.assert_array_equal(ids[start:end], top + start)
        np.testing.assert_allclose(pearson[start:end], np.take_along_axis(p_ref, top, 1), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(cosine[start:end], np.take_along_axis(c_ref, top, 1), rtol=1e-9, atol=1e-12)


def test_a_batch_size_past_the_correlations_memory_is_refused_before_any_work(tmp_path, monkeypatch) -> None:
    """Each latent's correlations with the others of its batch are summed (width × batch
    float64): a batch size past that bound, or below 1, is refused naming --batch-size before
    the effects or a shard are read."""
    import re

    import siphon.dashboard.neuronpedia as neuronpedia
    from siphon.errors import DatasetError

    from latent_runs import SAE, write_run

    truth = write_run(tmp_path / "run", hosts=1)  # 40 latents
    monkeypatch.setattr(neuronpedia, "MAX_CORRELATION_SUMS", 40 * 10)
    export = neuronpedia.export_neuronpedia
    no_effects = tmp_path / "no-effects"
    with pytest.raises(DatasetError, match=rf"batch_size \(--batch-size\) must be at most 10 \(400 correlation sums over "
                                           rf"the 40 latents of '{re.escape(SAE)}'\), got 11"):
        export(truth.path, tmp_path / "out", effects=no_effects, sae_set="s", batch_size=11)
    with pytest.raises(DatasetError, match=r"batch_size \(--batch-size\) must be at least 1, got 0"):
        export(truth.path, tmp_path / "out", effects=no_effects, sae_set="s", batch_size=0)
    # Within the bound the export goes on to its effects.
    with pytest.raises(DatasetError, match="no effects directory"):
        export(truth.path, tmp_path / "out", effects=no_effects, sae_set="s", batch_size=10)
    # A batch of every latent fits whatever the batch size where width² does.
    monkeypatch.setattr(neuronpedia, "MAX_CORRELATION_SUMS", 40 * 40)
    with pytest.raises(DatasetError, match="no effects directory"):
        export(truth.path, tmp_path / "out", effects=no_effects, sae_set="s", batch_size=4_000_000_000)
    assert not (tmp_path / "out").exists()
