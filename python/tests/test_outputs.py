"""The model's outputs in a run (``siphon extract --outputs``): the reader returns them as the
shards store them (parsed here by hand), beside the hooks for the same tokens, shuffled and
resumed like them; stats.json's means are numpy's over the stored values; verify checks their
tensors; unknown names are refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import siphon
from conftest import extract
from siphon import DatasetError
from test_fp8 import raw_tensors, shard_paths

OUTPUTS = ["output.nll", "output.entropy", "output.topk_logprobs", "output.topk_ids"]


@pytest.fixture(scope="module")
def outputs_run(runs) -> Path:
    return extract(runs, "tiny-outputs", hosts=1, launch=False, extra=("--outputs", "nll,entropy,topk=4"))


def stored(run: Path, name: str) -> np.ndarray:
    parts = []
    for path in shard_paths(run):
        tensors, _ = raw_tensors(path)
        dtype, shape, raw = tensors[name]
        parts.append(np.frombuffer(raw, {"F32": "<f4", "I32": "<i4"}[dtype]).reshape(shape))
    return np.concatenate(parts)


def test_the_reader_returns_the_stored_outputs_beside_the_hooks(outputs_run: Path) -> None:
    ds = siphon.open_dataset(str(outputs_run))
    assert list(ds.outputs) == OUTPUTS
    assert ds.outputs["output.topk_ids"].dtype == "int32" and ds.outputs["output.topk_ids"].shape == (4,)
    assert "outputs: output.nll []" in repr(ds)
    everything = ds.read(outputs=OUTPUTS, dtype="float32")
    for name in OUTPUTS:
        np.testing.assert_array_equal(everything[name], stored(outputs_run, name))
        assert everything[name].dtype == (np.int32 if name == "output.topk_ids" else np.float32)
    nll = everything["output.nll"]
    assert np.isnan(nll).any() and np.isfinite(nll).mean() > 0.9, "NaN only where a row ends"
    # The top-k: likeliest first, a distribution's log-probabilities.
    topk = everything["output.topk_logprobs"]
    assert (np.diff(topk, axis=1) <= 0).all() and (np.exp(topk).sum(axis=1) <= 1 + 1e-5).all()

    # Shuffled and resumed, the same tokens with the same outputs.
    kwargs = dict(outputs=["output.nll", "output.topk_ids"], batch_size=64, seed=3, shuffle_buffer_tokens=256,
                  output="torch")
    batches = ds.batches(**kwargs)
    first = next(batches)
    state = batches.state_dict()
    rest = list(ds.batches(**kwargs, resume=state))
    seen = [first, *rest]
    ids = np.concatenate([b["token_ids"].numpy() for b in seen])
    got = np.concatenate([b["output.topk_ids"].numpy() for b in seen])
    assert sorted(map(tuple, np.column_stack([ids, got]))) == sorted(
        map(tuple, np.column_stack([everything["token_ids"], everything["output.topk_ids"]])))
    assert str(first["output.nll"].dtype) == "torch.float32"
    # The outputs alone, without any hook.
    alone = ds.read([], outputs=["output.entropy"])
    assert set(alone) == {"output.entropy", "token_ids", "position"}
    np.testing.assert_array_equal(alone["output.entropy"], everything["output.entropy"])


def test_statistics_are_the_stored_values_means(outputs_run: Path) -> None:
    ds = siphon.open_dataset(str(outputs_run))
    everything = ds.read(outputs=OUTPUTS, dtype="float32")
    nll = ds.output_stats("output.nll")
    values = everything["output.nll"]
    assert nll["count"] == len(values) and nll["defined"][0] == np.isfinite(values).sum()
    np.testing.assert_allclose(nll["mean"][0], np.nanmean(values.astype(np.float64)), rtol=1e-12)
    topk = ds.output_stats("output.topk_logprobs")
    np.testing.assert_allclose(topk["max"], everything["output.topk_logprobs"].max(axis=0), rtol=0)
    assert ds.output_stats("output.topk_ids") == {"count": len(values)}
    assert ds.verify().ok


def test_unknown_outputs_and_a_run_without_them_are_named(outputs_run: Path, bf16_run: Path) -> None:
    ds = siphon.open_dataset(str(outputs_run))
    with pytest.raises(DatasetError, match="unknown output 'output.logits'"):
        ds.read(outputs=["output.logits"])
    with pytest.raises(DatasetError, match="name an output twice"):
        ds.read(outputs=["output.nll", "output.nll"])
    with pytest.raises(DatasetError, match=r"none \(extract with --outputs\)"):
        siphon.open_dataset(str(bf16_run)).read(outputs=["output.nll"])


def test_a_live_stream_carries_the_outputs_the_disk_run_stores(runs: Path, outputs_run: Path) -> None:
    pytest.importorskip("grpc")
    from collections import Counter

    from conftest import Producer

    def keyed(batches: list) -> Counter:
        out: Counter = Counter()
        for b in batches:
            values = [np.asarray(b[o]).reshape(len(b["token_ids"]), -1) for o in OUTPUTS]
            for i, (t, p) in enumerate(zip(b["token_ids"].tolist(), b["position"].tolist())):
                out[(t, p) + tuple(v[i].tobytes() for v in values)] += 1
        return out

    want = keyed(list(siphon.open_dataset(str(outputs_run)).batches(batch_size=64, shuffle=False, outputs=OUTPUTS)))
    extra = ("--outputs", "nll,entropy,topk=4")
    # The corpus `extract` made for the disk run (beside the runs' directory).
    corpus = runs.parent / "tiny-outputs-corpus"
    with Producer(runs, corpus, "tiny-outputs-live", launch=False, extra=extra) as producer:
        try:
            got = keyed(list(siphon.stream(producer.url, batch_size=32, connect_timeout=60, outputs=OUTPUTS)))
        finally:
            log = producer.log()
    assert producer.process.returncode == 0, log[-4000:]
    assert sum(want.values()) > 500 and got == want


def test_splice_metrics_are_saelens_formulas_over_the_stored_losses(runs: Path) -> None:
    from conftest import REPO

    sae = REPO / "fixtures/dictionaries/saelens-topk"
    hook = "blocks.1.hook_resid_post"
    run = extract(runs, "tiny-spliced", hosts=1, launch=False, dtype="f32", hooks=[hook],
                  extra=("--sae", str(sae), "--splice"))
    ds = siphon.open_dataset(str(run))
    names = [f"output.{w}.{k}.{hook}" for k, w in (("spliced", "nll"), ("spliced", "kl"), ("ablated", "nll"),
                                                     ("ablated", "kl"), ("spliced", "sq_error"))]
    assert set(names) | {"output.nll"} == set(ds.outputs)
    got = ds.read([hook], outputs=["output.nll", *names], dtype="float32")
    nll = lambda n: float(np.nanmean(got[n].astype(np.float64)))  # noqa: E731
    mean = lambda n: float(got[n].astype(np.float64).mean())  # noqa: E731
    ce = {"clean": nll("output.nll"), "spliced": nll(names[0]), "ablated": nll(names[2])}
    kl = {"spliced": mean(names[1]), "ablated": mean(names[3])}
    x = got[hook].astype(np.float64)
    fvu = got[names[4]].astype(np.float64).sum() / ((x - x.mean(0)) ** 2).sum()
    m = ds.splice_metrics()[hook]
    want = {
        "ce_clean": ce["clean"], "ce_spliced": ce["spliced"], "ce_ablated": ce["ablated"],
        "ce_loss_score": (ce["ablated"] - ce["spliced"]) / (ce["ablated"] - ce["clean"]),
        "kl_spliced": kl["spliced"], "kl_ablated": kl["ablated"],
        "kl_div_score": (kl["ablated"] - kl["spliced"]) / kl["ablated"], "fvu": fvu,
    }
    for key, value in want.items():
        assert m[key] == pytest.approx(value, rel=1e-6), key
    # The reconstruction's squared error is the stored hook's against SAELens's own
    # reconstruction of it.
    sae_lens = pytest.importorskip("sae_lens")
    import torch

    loaded = sae_lens.SAE.load_from_disk(str(sae), device="cpu")
    with torch.no_grad():
        recon = loaded.decode(loaded.encode(torch.from_numpy(x.astype(np.float32)))).double().numpy()
    np.testing.assert_allclose(got[names[4]], ((x - recon) ** 2).sum(1), rtol=1e-4, atol=1e-4)
