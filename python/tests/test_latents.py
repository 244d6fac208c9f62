"""Dictionary latents read back (Dataset.latents, latent_shards, read_latents) from runs
written by hand to the format (latent_runs.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import siphon
from latent_runs import RESID, SAE, TRANSCODER, write_run
from siphon import DatasetError


@pytest.fixture(scope="module", params=["bf16", "f32"])
def run(request, tmp_path_factory):
    return write_run(tmp_path_factory.mktemp(request.param) / "run", dtype=request.param,
                     names=(SAE, TRANSCODER), widths=(40, 24))


def test_latents_are_listed_and_the_run_verifies(run):
    ds = siphon.open_dataset(run.path)
    assert list(ds.latents) == [SAE, TRANSCODER]
    info = ds.latents[SAE]
    assert (info.name, info.hook, info.width, info.cap) == (SAE, RESID, 40, 5)
    assert info.dtype == ds.dtype and info.dtype in ("bfloat16", "float32")
    assert info.dictionary["path"] == "/dicts/0"
    assert ds.latents[TRANSCODER].hook == "blocks.1.ln2.hook_normalized"
    report = ds.verify()
    assert report.ok and report.shards == 6
    assert f"{SAE} [40]" in repr(ds)
    # The hooks read as before beside the latents.
    got = ds.read([RESID], dtype="float32")
    np.testing.assert_array_equal(got[RESID], run.hook[run.mask])
    np.testing.assert_array_equal(got["token_ids"], run.token_ids[run.mask])


@pytest.mark.parametrize("name", [SAE, TRANSCODER])
def test_csr_triples_and_dense_agree_with_what_was_written(run, name):
    ds = siphon.open_dataset(run.path)
    dense = run.dense[name]
    shards = list(ds.latent_shards(name))
    assert [s.rows for s in shards] == run.shard_rows
    assert [s.row_start for s in shards] == list(np.cumsum([0] + run.shard_rows[:-1]))
    np.testing.assert_array_equal(np.concatenate([s.dense() for s in shards]), dense)
    np.testing.assert_array_equal(np.concatenate([s.token_ids for s in shards]), run.token_ids)
    np.testing.assert_array_equal(np.concatenate([s.sample_index for s in shards]), run.sample_index)
    np.testing.assert_array_equal(np.concatenate([s.mask for s in shards]), run.mask)

    # Triples: global rows (earlier shards, then hosts, counted first).
    parts = list(ds.read_latents(name, format="triples"))
    token = np.concatenate([p["token"] for p in parts])
    latent = np.concatenate([p["latent"] for p in parts])
    value = np.concatenate([p["value"] for p in parts])
    assert value.dtype == np.float32 and token.dtype == np.int64
    rows, cols = np.nonzero(dense)
    np.testing.assert_array_equal(token, rows)
    np.testing.assert_array_equal(latent, cols)
    np.testing.assert_array_equal(value, dense[rows, cols])
    assert parts[-1]["row_start"] == len(dense) - run.shard_rows[-1]

    # CSR: torch's own dense equals the rows.
    csr = [p["latents"] for p in ds.read_latents(name, format="csr")]
    assert all(c.layout == torch.sparse_csr for c in csr)
    assert csr[0].shape == (run.shard_rows[0], dense.shape[1])
    np.testing.assert_array_equal(torch.cat([c.to_dense() for c in csr]).numpy(), dense)


def test_values_in_the_stored_dtype_or_another(run):
    ds = siphon.open_dataset(run.path)
    stored = next(ds.latent_shards(SAE, dtype=None)).values
    assert stored.dtype.name == ds.dtype
    f16 = next(ds.latent_shards(SAE, dtype="float16")).values
    assert f16.dtype == np.float16
    np.testing.assert_array_equal(f16, stored.astype(np.float32).astype(np.float16))
    csr = next(ds.read_latents(SAE, format="csr", dtype=None))["latents"]
    assert csr.dtype == (torch.bfloat16 if ds.dtype == "bfloat16" else torch.float32)


def test_latent_stats_are_stats_json(run):
    ds = siphon.open_dataset(run.path)
    stats = ds.latent_stats(SAE)
    included = run.dense[SAE][run.mask]
    assert stats["count"] == int(run.mask.sum())
    np.testing.assert_array_equal(stats["firings"], (included != 0).sum(0))
    np.testing.assert_allclose(stats["mean"][stats["firings"] > 0],
                               (included.sum(0) / np.maximum((included != 0).sum(0), 1))[stats["firings"] > 0], rtol=1e-6)


def test_unknown_latents_and_runs_without_latents_are_clear_errors(run, tmp_path):
    ds = siphon.open_dataset(run.path)
    with pytest.raises(DatasetError, match=r"unknown latents 'blocks.1.hook_resid_post.hook_sae_acts'.*did you mean"):
        next(ds.latent_shards("blocks.1.hook_resid_post.hook_sae_acts"))
    with pytest.raises(DatasetError, match="format must be 'csr' or 'triples'"):
        next(ds.read_latents(SAE, format="coo"))
    plain = write_run(tmp_path / "plain", hosts=1, shards_per_host=1, names=(), widths=())
    ds = siphon.open_dataset(plain.path)
    assert ds.latents == {}
    with pytest.raises(DatasetError, match="stores no dictionary latents"):
        next(ds.read_latents(SAE))


def test_a_run_of_latents_only(tmp_path):
    truth = write_run(tmp_path / "only", with_hook=False, hosts=1)
    ds = siphon.open_dataset(truth.path)
    assert ds.hooks == {} and list(ds.latents) == [SAE]
    assert ds.verify().ok
    np.testing.assert_array_equal(np.concatenate([s.dense() for s in ds.latent_shards(SAE)]), truth.dense[SAE])


def test_a_damaged_shard_is_named(tmp_path):
    truth = write_run(tmp_path / "bad", hosts=1, shards_per_host=2)
    shard = truth.path / "machine_000_host_00" / "shard_000001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF  # inside the last tensor's bytes
    shard.write_bytes(bytes(data))
    ds = siphon.open_dataset(truth.path)
    with pytest.raises(DatasetError, match=r"shard_000001.safetensors: crc32c [0-9a-f]{8}, the manifest says"):
        list(ds.latent_shards(SAE))
    assert len(list(ds.latent_shards(SAE, check=False))) == 2  # no checksum: the bytes are read as they are


def test_a_malformed_csr_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file
    import google_crc32c

    truth = write_run(tmp_path / "csr", hosts=1, shards_per_host=1)
    shard = truth.path / "machine_000_host_00" / "shard_000000.safetensors"
    tensors = load_file(str(shard))
    indptr = tensors[SAE + ".indptr"]
    row = int(np.flatnonzero(np.diff(indptr.numpy()) >= 2)[0])
    indices = tensors[SAE + ".indices"].clone()
    a, b = int(indptr[row]), int(indptr[row]) + 1
    indices[a], indices[b] = indices[b].clone(), indices[a].clone()
    tensors[SAE + ".indices"] = indices
    save_file(tensors, str(shard), metadata={"format": "siphon-activations/2"})
    data = shard.read_bytes()
    line = json.loads((shard.parent / "manifest.jsonl").read_text())
    line.update(bytes=len(data), crc32c=f"{google_crc32c.value(data):08x}")
    (shard.parent / "manifest.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(DatasetError, match="not strictly ascending"):
        list(siphon.open_dataset(truth.path).latent_shards(SAE))
