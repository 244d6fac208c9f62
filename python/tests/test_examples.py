"""Each latent's examples (`siphon.examples`) from a run `siphon extract --sae` wrote, against
the same examples chosen from every firing of the run at once: the top values, uniform draws per
activation range, the tokens around each; a run split in two parts and merged gives the same."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import siphon
from siphon.examples import TOP, LatentExamples, _priority, latent_examples
from siphon.errors import DatasetError

from conftest import REPO, extract

NAME = "blocks.1.hook_resid_post.hook_sae_acts_post"


@pytest.fixture(scope="module")
def run(runs: Path) -> Path:
    # JumpReLU: a varying number of firings per token; BOS stored, masked.
    sae = REPO / "fixtures/dictionaries/saelens-jumprelu"
    return extract(runs, "tiny-examples", dtype="f32", hooks=[], extra=["--sae", str(sae), "--latent-cap", "96",
                                                                           "--keep-excluded"])


def firings(ds: siphon.Dataset):
    """Every included firing of the run: (latent, value, row), and each row's token window."""
    latent, value, row, windows = [], [], [], {}
    for shard in ds.latent_shards(NAME):
        rows = shard.local_rows()
        kept = shard.mask[rows]
        latent.append(shard.indices[kept])
        value.append(shard.values[kept])
        row.append(rows[kept] + shard.row_start)
        # Unshuffled: a sample's rows lie in order in one shard.
        for r in range(shard.rows):
            same = np.flatnonzero(shard.sample_index == shard.sample_index[r])
            at = int(np.searchsorted(same, r))
            windows[shard.row_start + r] = [int(shard.token_ids[same[at + k]]) if 0 <= at + k < len(same) else -1
                                            for k in range(-4, 5)]
    return np.concatenate(latent), np.concatenate(value), np.concatenate(row), windows


def test_examples_are_those_of_every_firing_at_once(run: Path) -> None:
    ds = siphon.open_dataset(str(run))
    ex = latent_examples(ds, NAME, top=5, quantiles=4, per_quantile=3, window=4, seed=11)
    latent, value, row, windows = firings(ds)
    bound = ds.latent_stats(NAME)["max"]
    assert np.array_equal(bound, [value[latent == i].max(initial=0) for i in range(ex.width)])
    fired = np.unique(latent)
    assert len(fired) > 20, "the test needs latents that fire"
    for i in fired:
        mine = latent == i
        v, r = value[mine], row[mine]
        got = ex.latent(int(i))
        order = np.lexsort((r, -v))[:5]
        assert [(e["value"], e["row"]) for e in got["top"]] == [(float(v[k]), int(r[k])) for k in order], i
        ranges = np.clip(np.floor(v / bound[i] * 4), 0, 3)
        for q, group in enumerate(got["quantiles"]):
            inside = np.flatnonzero(ranges == q)
            drawn = inside[np.argsort(_priority(r[inside], np.full(len(inside), i), 11))[:3]]
            assert sorted(e["row"] for e in group["examples"]) == sorted(int(r[k]) for k in drawn), (i, q)
            assert all(group["range"][0] <= e["value"] <= group["range"][1] for e in group["examples"])
        for e in got["top"] + [e for g in got["quantiles"] for e in g["examples"]]:
            assert e["tokens"] == windows[e["row"]], (i, e["row"])
            assert e["tokens"][4] != -1
    # No example of a token the mask excludes.
    masked = {shard.row_start + r for shard in ds.latent_shards(NAME) for r in np.flatnonzero(~shard.mask)}
    assert masked and not masked & set(ex.arrays["row"].tolist())


def test_parts_merge_into_the_whole(run: Path) -> None:
    ds = siphon.open_dataset(str(run))
    shards = list(ds.latent_shards(NAME))
    assert len(shards) >= 4
    whole = latent_examples(ds, NAME, top=3, quantiles=3, per_quantile=2, window=2, shards=shards)
    parts = [latent_examples(ds, NAME, top=3, quantiles=3, per_quantile=2, window=2, shards=shards[k::2])
             for k in (1, 0)]
    parts[0].merge(parts[1])
    for i in range(whole.width):
        assert parts[0].latent(i) == whole.latent(i), i
    other = latent_examples(ds, NAME, top=4, quantiles=3, per_quantile=2, window=2, shards=shards[:1])
    with pytest.raises(DatasetError, match="other settings"):
        parts[0].merge(other)
    with pytest.raises(DatasetError, match=r"quantiles \(--quantiles\) must be at least 1, got 0"):
        latent_examples(ds, NAME, quantiles=0)
    # A range's index is an int8: 129 ranges would wrap the last one to -128, a top example.
    with pytest.raises(DatasetError, match=r"quantiles \(--quantiles\) must be at most 128"):
        latent_examples(ds, NAME, quantiles=129)
    with pytest.raises(DatasetError, match=r"window \(--window\) must be at most 4096"):
        latent_examples(ds, NAME, window=2**31)
    with pytest.raises(DatasetError, match=r"per_quantile \(--per-quantile\) must be a whole number, got 2.5"):
        latent_examples(ds, NAME, per_quantile=2.5)
    latent_examples(ds, NAME, quantiles=128, window=0, shards=shards[:1])
    assert isinstance(whole, LatentExamples) and TOP == -1


def test_the_command_writes_every_fired_latents_examples(run: Path, tmp_path: Path) -> None:
    import json

    from siphon.__main__ import main

    out = tmp_path / "examples.json"
    assert main(["latent-examples", str(run), NAME, str(out), "--top", "2", "--quantiles", "2", "--window", "1"]) == 0
    written = json.loads(out.read_text())
    ds = siphon.open_dataset(str(run))
    fired = np.flatnonzero(ds.latent_stats(NAME)["firings"] > 0)
    assert [e["latent"] for e in written["latents"]] == fired.tolist()
    assert all(len(e["top"]) <= 2 and len(e["quantiles"]) == 2 and len(e["top"][0]["tokens"]) == 3
               for e in written["latents"])
