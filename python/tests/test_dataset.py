"""siphon.open and Dataset.batches on runs written by the siphon binary, checked against the
shards as safetensors itself loads them."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import siphon
from conftest import D_MODEL, HOOKS

from siphon import DatasetError


def shards_in_order(run: Path):
    """Every committed shard's tensors, hosts in order, as safetensors loads them."""
    out = []
    for host in sorted(p for p in run.iterdir() if p.name.startswith("machine_")):
        for line in (host / "manifest.jsonl").read_text().splitlines():
            out.append(load_file(str(host / json.loads(line)["shard"])))
    return out


def rows(batch, hooks):
    """Each token of a batch as one hashable tuple of every field: pairing kept iff equal."""
    cols = [batch["token_ids"].tolist(), batch["position"].tolist()]
    for h in hooks:
        x = batch[h]
        x = x.view(torch.int16) if isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 else x
        x = x.numpy() if isinstance(x, torch.Tensor) else x
        cols.append([r.tobytes() for r in np.ascontiguousarray(x).reshape(len(x), -1)])
    return list(zip(*cols))


def test_open_reports_hooks_shapes_dtype_and_tokens(bf16_run):
    ds = siphon.open_dataset(bf16_run)
    run_json = json.loads((bf16_run / "run.json").read_text())
    assert ds.format_tag == "siphon-activations/2"
    assert list(ds.hooks) == HOOKS == run_json["hooks"]
    assert ds.hooks["blocks.0.hook_resid_post"].shape == (D_MODEL,)
    assert ds.hooks["blocks.0.attn.hook_z"].shape == (4, 16)
    assert ds.dtype == "bfloat16"
    shards = shards_in_order(bf16_run)
    assert len(ds.shards) == len(shards) > 4, "the fixture should have several shards per host"
    assert ds.tokens == sum(len(s["token_ids"]) for s in shards)
    assert len({s.host for s in ds.shards}) == 2
    report = ds.verify()
    assert report.ok and report.problems == [] and report.shards == len(shards)


def test_read_equals_the_shards_and_bf16_stays_bf16(bf16_run):
    ds = siphon.open_dataset(bf16_run)
    got = ds.read(output="torch")
    shards = shards_in_order(bf16_run)
    for name in HOOKS + ["token_ids", "position"]:
        want = torch.cat([s[name] for s in shards])
        assert got[name].dtype == want.dtype, name
        assert torch.equal(got[name], want), name
    assert got[HOOKS[0]].dtype == torch.bfloat16
    as_f32 = ds.read(hooks=HOOKS[:1], output="numpy", dtype="float32")[HOOKS[0]]
    assert as_f32.dtype == np.float32
    np.testing.assert_array_equal(as_f32, got[HOOKS[0]].float().numpy())


def test_shuffled_batches_pair_hooks_and_cover_every_token_once(bf16_run):
    ds = siphon.open_dataset(bf16_run)
    hooks = ["blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out"]
    full = Counter(rows(ds.read(hooks), hooks))
    batches = list(ds.batches(hooks, batch_size=100, shuffle=True, seed=3, unit_tokens=128, shuffle_buffer_tokens=400))
    assert all(len(b["token_ids"]) == 100 for b in batches[:-1])
    seen = Counter(r for b in batches for r in rows(b, hooks))
    assert seen == full
    in_order = [r for b in ds.batches(hooks, batch_size=100, shuffle=False) for r in rows(b, hooks)]
    shuffled = [r for b in batches for r in rows(b, hooks)]
    assert in_order != shuffled


def test_shuffle_is_deterministic_for_a_seed(bf16_run):
    ds = siphon.open_dataset(bf16_run)

    def ids(seed, epoch=0):
        return np.concatenate([b["token_ids"] for b in ds.batches(HOOKS[:1], batch_size=64, seed=seed, epoch=epoch, unit_tokens=64, shuffle_buffer_tokens=256)])

    assert np.array_equal(ids(1), ids(1))
    assert not np.array_equal(ids(1), ids(2))
    assert not np.array_equal(ids(1, epoch=0), ids(1, epoch=1))


def test_ranks_and_workers_split_without_overlap_or_gap(bf16_run):
    ds = siphon.open_dataset(bf16_run)
    hooks = HOOKS[:2]
    full = Counter(rows(ds.read(hooks), hooks))
    seen = Counter()
    for rank in range(2):
        for worker in range(3):
            for b in ds.batches(hooks, batch_size=50, seed=5, rank=rank, world_size=2, worker=worker, num_workers=3, unit_tokens=100):
                seen.update(rows(b, hooks))
    assert seen == full


def test_filters_by_token_id_and_position(bf16_run):
    ds = siphon.open_dataset(bf16_run)
    ids = ds.read(HOOKS[:1])
    common = int(np.bincount(ids["token_ids"]).argmax())
    out = ds.read(HOOKS[:1])  # unfiltered reference
    kept = list(ds.batches(HOOKS[:1], batch_size=128, exclude_token_ids=[common], min_position=2, max_position=20))
    got_ids = np.concatenate([b["token_ids"] for b in kept])
    got_pos = np.concatenate([b["position"] for b in kept])
    assert common not in got_ids
    assert got_pos.min() >= 2 and got_pos.max() < 20
    want = ((out["token_ids"] != common) & (out["position"] >= 2) & (out["position"] < 20)).sum()
    assert len(got_ids) == want > 0


def test_filters_by_role_like_by_token_id(chat_run, bf16_run):
    ds = siphon.open_dataset(chat_run)
    assert ds.has_roles and not siphon.open_dataset(bf16_run).has_roles
    everything = ds.read(HOOKS[:1])
    assert set(np.unique(everything["role"])) == {siphon.ROLES.index(r) for r in ("template", "system", "user", "assistant")}
    assistant = siphon.ROLES.index("assistant")
    kept = list(ds.batches(HOOKS[:1], batch_size=64, roles=["assistant"], seed=1))
    got = np.concatenate([b["role"] for b in kept])
    assert (got == assistant).all()
    assert len(got) == (everything["role"] == assistant).sum() > 0
    both = sum(len(b["role"]) for b in ds.batches(HOOKS[:1], batch_size=64, roles=["user", "assistant"], shuffle=False))
    assert both == np.isin(everything["role"], [assistant, siphon.ROLES.index("user")]).sum()
    with pytest.raises(siphon.DatasetError, match="roles must name"):
        next(iter(ds.batches(HOOKS[:1], batch_size=64, roles=["narrator"])))
    with pytest.raises(siphon.DatasetError, match="stores no roles"):
        next(iter(siphon.open_dataset(bf16_run).batches(HOOKS[:1], batch_size=64, roles=["assistant"])))


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_state_after_n_batches_resumes_the_rest_bit_for_bit(bf16_run, shuffle):
    ds = siphon.open_dataset(bf16_run)
    args = dict(batch_size=48, shuffle=shuffle, seed=7, unit_tokens=100, epochs=2, exclude_token_ids=[32])
    if shuffle:
        args["shuffle_buffer_tokens"] = 250
    for reader in [dict(), dict(rank=1, world_size=2, worker=1, num_workers=2)]:
        whole = list(ds.batches(HOOKS[:2], **args, **reader))
        assert len(whole) > 8
        it = ds.batches(HOOKS[:2], **args, **reader)
        states = []
        for _ in whole:
            next(it)
            states.append(json.loads(json.dumps(it.state_dict())))  # JSON-serialisable
        assert states[-1]["epoch"] == 2
        for n in [0, 1, len(whole) // 2, len(whole) - 1]:
            rest = list(ds.batches(HOOKS[:2], **args, **reader, resume=states[n]))
            assert len(rest) == len(whole) - n - 1
            for got, want in zip(rest, whole[n + 1 :]):
                assert got.keys() == want.keys()
                for k in want:
                    np.testing.assert_array_equal(got[k], want[k])
    with pytest.raises(DatasetError, match="other settings"):
        ds.batches(HOOKS[:2], **dict(args, seed=8), **reader, resume=states[1])
    with pytest.raises(DatasetError, match="reader 3 of 4"):
        ds.batches(HOOKS[:2], **args, resume=states[1])


def test_epochs_repeat_and_drop_last(bf16_run):
    ds = siphon.open_dataset(bf16_run)
    one = sum(len(b["token_ids"]) for b in ds.batches(HOOKS[:1], batch_size=64))
    assert one == ds.tokens
    two = list(ds.batches(HOOKS[:1], batch_size=64, epochs=2, drop_last=True))
    assert all(len(b["token_ids"]) == 64 for b in two)
    assert len(two) == 2 * (ds.tokens // 64) or len(two) >= 2 * (ds.tokens // 64) - 2


def test_only_manifest_committed_shards_are_visible(run_copy):
    host = sorted(p for p in run_copy.iterdir() if p.name.startswith("machine_"))[0]
    manifest = host / "manifest.jsonl"
    lines = manifest.read_text().splitlines()
    full = siphon.open_dataset(run_copy)
    # A writer that has uploaded its last shard but not yet committed it.
    manifest.write_text("\n".join(lines[:-1]) + "\n")
    partial = siphon.open_dataset(run_copy)
    last = json.loads(lines[-1])
    assert len(partial.shards) == len(full.shards) - 1
    assert partial.tokens == full.tokens - last["tokens"]
    assert sum(len(b["token_ids"]) for b in partial.batches(HOOKS[:1], batch_size=256)) == partial.tokens
    manifest.write_text("\n".join(lines) + "\n")
    assert partial.refresh().tokens == full.tokens


def test_verify_names_a_damaged_shard(run_copy):
    host = sorted(p for p in run_copy.iterdir() if p.name.startswith("machine_"))[1]
    shard = host / "shard_000001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=rf"{host.name}/shard_000001.safetensors: crc32c"):
        siphon.open_dataset(run_copy).verify()
    shard.unlink()
    with pytest.raises(DatasetError, match="committed shard is missing"):
        siphon.open_dataset(run_copy).verify()
    # Without raising, the report carries every problem.
    report = siphon.open_dataset(run_copy).verify(raise_on_problem=False)
    assert not report.ok and any("committed shard is missing" in p for p in report.problems)


def test_runs_checked_by_sha256_still_verify(run_copy):
    """Shards written before the CRC32C carry a sha256 in their manifest line: verified by it."""
    import hashlib

    host = sorted(p for p in run_copy.iterdir() if p.name.startswith("machine_"))[0]
    manifest = host / "manifest.jsonl"
    lines = [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]
    for line in lines:
        assert len(line.pop("crc32c")) == 8
        line["sha256"] = hashlib.sha256((host / line["shard"]).read_bytes()).hexdigest()
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert siphon.open_dataset(run_copy).verify().ok
    shard = host / lines[0]["shard"]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=rf"{host.name}/{lines[0]['shard']}: sha256 [0-9a-f]{{64}}, the manifest says"):
        siphon.open_dataset(run_copy).verify()


def test_the_api_takes_keywords_and_keeps_deprecated_names(bf16_run):
    ds = siphon.open_dataset(bf16_run)
    with pytest.raises(TypeError):
        ds.batches(HOOKS[:1], 64)  # batch_size is keyword-only
    batch = next(iter(ds.batches(HOOKS[:1], batch_size=64, shuffle=False)))
    assert isinstance(batch, siphon.Batch) and batch.token_ids is batch["token_ids"]
    with pytest.warns(DeprecationWarning, match="open_dataset"):
        old = siphon.open(bf16_run)
    with pytest.warns(DeprecationWarning, match="output="):
        same = next(iter(old.batches(HOOKS[:1], batch_size=64, shuffle=False, format="numpy")))
    np.testing.assert_array_equal(same.token_ids, batch.token_ids)
    with pytest.warns(DeprecationWarning, match="format_tag"):
        assert old.format == old.format_tag


def test_bad_input_is_a_clear_error(bf16_run, tmp_path):
    ds = siphon.open_dataset(bf16_run)
    with pytest.raises(DatasetError, match=r"unknown hook 'blocks.0.hook_resid_pre'.*did you mean"):
        ds.batches(["blocks.0.hook_resid_pre"])
    with pytest.raises(DatasetError, match="rank 2 is out of range for world_size 2"):
        ds.batches(HOOKS[:1], rank=2, world_size=2)
    with pytest.raises(DatasetError, match="output must be"):
        ds.batches(HOOKS[:1], output="jax")
    with pytest.raises(DatasetError, match="unsupported dtype"):
        ds.batches(HOOKS[:1], dtype="int8")
    with pytest.raises(DatasetError, match="no run.json"):
        siphon.open_dataset(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "run.json").write_text(json.dumps({"format": "siphon-activations/9"}))
    with pytest.raises(DatasetError, match="unsupported dataset format 'siphon-activations/9'"):
        siphon.open_dataset(bad)
    host = bad / "machine_000_host_00"
    host.mkdir()
    (bad / "run.json").write_text((bf16_run / "run.json").read_text())
    (host / "manifest.jsonl").write_text('{"shard": "x"}\n')
    with pytest.raises(DatasetError, match="manifest.jsonl: line 1"):
        siphon.open_dataset(bad)


def _assert_reads_like_local(ds: siphon.Dataset, local: siphon.Dataset) -> None:
    assert ds.tokens == local.tokens and list(ds.hooks) == list(local.hooks)
    ds.verify()
    a = list(ds.batches(HOOKS[1:3], batch_size=128, seed=9, output="torch"))
    b = list(local.batches(HOOKS[1:3], batch_size=128, seed=9, output="torch"))
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for k in x:
            assert torch.equal(x[k], y[k])


def test_s3_through_fsspec(bf16_run, moto_s3):
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": moto_s3})
    fs.mkdir("bucket")
    fs.put(str(bf16_run), "bucket/acts/", recursive=True)
    _assert_reads_like_local(siphon.open_dataset(f"s3://bucket/acts/{bf16_run.name}"), siphon.open_dataset(bf16_run))


def test_gs_through_gcsfs(bf16_run, fake_gcs):
    import gcsfs

    options = {"endpoint_url": fake_gcs, "token": "anon"}
    fs = gcsfs.GCSFileSystem(**options)
    fs.mkdir("bucket")
    fs.put(str(bf16_run), "bucket/acts/", recursive=True)
    ds = siphon.open_dataset(f"gs://bucket/acts/{bf16_run.name}", storage_options=options)
    _assert_reads_like_local(ds, siphon.open_dataset(bf16_run))


def test_gs_without_gcsfs_names_the_package(monkeypatch):
    import importlib
    import sys

    # As where gcsfs is not installed: importing it fails, and fsspec has not registered it.
    # (`fsspec.registry` is also the name of a read-only view in fsspec's namespace.)
    registry = importlib.import_module("fsspec.registry")
    monkeypatch.setitem(sys.modules, "gcsfs", None)
    for protocol in ("gs", "gcs"):
        monkeypatch.delitem(registry._registry, protocol, raising=False)
    with pytest.raises(DatasetError, match=r"no filesystem for gs:// \(pip install gcsfs\)"):
        siphon.open_dataset("gs://bucket/run")


@pytest.mark.parametrize("which", ["bf16_run", "fp8_run"])
def test_run_statistics_equal_numpy_over_the_stored_values(which, request):
    """stats.json (every host merged) against numpy in float64 over the stored values of every
    committed shard: count, mean and variance within 1e-5 of each element's scale, min and max
    exactly."""
    run = request.getfixturevalue(which)
    stats = json.loads((run / "stats.json").read_text())["hooks"]
    shards = shards_in_order(run)
    for hook, s in stats.items():
        if which == "fp8_run":
            values = [sh[hook].to(torch.float32) * sh[f"{hook}.fp8_scale"].reshape(-1, *[1] * (sh[hook].dim() - 1)) for sh in shards]
        else:
            values = [sh[hook].to(torch.float32) for sh in shards]
        x = torch.cat(values).reshape(sum(v.shape[0] for v in values), -1).double().numpy()
        assert s["count"] == x.shape[0]
        mean, var = x.mean(axis=0), x.var(axis=0)
        scale = np.maximum(np.sqrt(var), np.abs(mean)) + 1e-30
        assert np.all(np.abs(np.array(s["mean"]) - mean) <= 1e-5 * scale), hook
        assert np.all(np.abs(np.array(s["variance"]) - var) <= 1e-5 * scale**2), hook
        assert np.array_equal(np.array(s["min"]), x.min(axis=0)), hook
        assert np.array_equal(np.array(s["max"]), x.max(axis=0)), hook
        norms = np.linalg.norm(x, axis=1).mean()
        assert abs(s["mean_norm"] - norms) <= 1e-5 * norms, hook
